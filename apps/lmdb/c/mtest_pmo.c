/*
 * mtest_pmo.c - the mdb_env_open()/mdb_env_close() wrappers of mtest_pmo.h.
 *
 * Built with exactly one of MTEST_PMO_LIBPMO (guest) or MTEST_PMO_FILE (host).
 * A test shim: it keeps a small table of open environments (MAX_ENVS).
 */
#define _XOPEN_SOURCE 700
#define MTEST_PMO_IMPL

#include "mtest_pmo.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lmdb_digest.h"

#if defined(MTEST_PMO_LIBPMO) == defined(MTEST_PMO_FILE)
#error "build with exactly one of -DMTEST_PMO_LIBPMO or -DMTEST_PMO_FILE"
#endif

#ifdef MTEST_PMO_LIBPMO
#include "pmo.h"
#include "pmo_libpmo.h"
#include "pmo_name.h"
#define BACKEND "libpmo"
#else
#include "pmo_file.h"
#define BACKEND "file"
#endif

#define MAX_ENVS 8

/* One open environment: the backend's ops and the counting ops LMDB gets. */
struct shim {
	MDB_env *env;
	MDB_pmo_ops inner;
	unsigned long syncs;
	int opened;	/* mdb_env_open() succeeded */
};

static struct shim shims[MAX_ENVS];
static unsigned long process_syncs;	/* for LMDB_PMO_CRASH_AT_SYNC */

static struct shim *find(MDB_env *env)
{
	for (int i = 0; i < MAX_ENVS; i++)
		if (shims[i].env == env)
			return &shims[i];
	return NULL;
}

static void *shim_attach(void *ctx, const char *path, size_t *size, int writable)
{
	struct shim *s = ctx;
	void *addr = s->inner.attach(s->inner.ctx, path, size, writable);
	int rc = errno;

	if (!addr) {
		fprintf(stderr, "mtest_pmo: attach %s backend=" BACKEND ": %s\n", path,
			strerror(rc));
		errno = rc;
		return NULL;
	}
#ifdef MTEST_PMO_LIBPMO
	{
		char name[MDB_PMO_NAME_MAX + 1];

		if (mdb_pmo_name(path, name, sizeof(name)) != 0)
			strcpy(name, "?");
		fprintf(stderr, "mtest_pmo: open %s backend=libpmo pmo=%s size=%zu %s\n", path,
			name, *size, writable ? "rw" : "ro");
	}
#else
	fprintf(stderr, "mtest_pmo: open %s backend=file file=%s size=%zu %s\n", path, path,
		*size, writable ? "rw" : "ro");
#endif
	return addr;
}

static int shim_sync(void *ctx, void *addr)
{
	struct shim *s = ctx;
	const char *crash = getenv("LMDB_PMO_CRASH_AT_SYNC");

	process_syncs++;
	if (crash && strtoul(crash, NULL, 10) == process_syncs) {
		fprintf(stderr, "mtest_pmo: crash at sync %lu (LMDB_PMO_CRASH_AT_SYNC)\n",
			process_syncs);
		fflush(NULL);
		_exit(75);
	}
	s->syncs++;
	return s->inner.sync(s->inner.ctx, addr);
}

static int shim_detach(void *ctx, void *addr)
{
	struct shim *s = ctx;

#ifdef MTEST_PMO_LIBPMO
	struct pmo_stat st;

	if (pmo_stat(addr, &st) == 0)
		fprintf(stderr, "mtest_pmo: detach syncs=%lu psyncs=%llu\n", s->syncs,
			(unsigned long long)st.host.psyncs);
	else
		fprintf(stderr, "mtest_pmo: detach syncs=%lu psyncs=? (%s)\n", s->syncs,
			strerror(errno));
#else
	fprintf(stderr, "mtest_pmo: detach syncs=%lu\n", s->syncs);
#endif
	return s->inner.detach(s->inner.ctx, addr);
}

static void release(struct shim *s)
{
#ifdef MTEST_PMO_LIBPMO
	mdb_pmo_libpmo_free(&s->inner);
#else
	mdb_pmo_file_free(&s->inner);
#endif
	memset(s, 0, sizeof(*s));
}

int mtest_pmo_env_open(MDB_env *env, const char *path, unsigned int flags, mdb_mode_t mode)
{
	struct shim *s;
	MDB_pmo_ops ops;
	int rc;

	if (!env)
		return EINVAL;
	if (find(env))
		return EBUSY;
	s = find(NULL);
	if (!s)
		return ENOMEM;
#ifdef MTEST_PMO_LIBPMO
	{
		const char *key = getenv("LMDB_PMO_KEY");

		if (!key || !*key) {
			fprintf(stderr, "mtest_pmo: set LMDB_PMO_KEY to the PMO key\n");
			return EINVAL;
		}
		rc = mdb_pmo_libpmo(&s->inner, key);
	}
#else
	rc = mdb_pmo_file(&s->inner);
#endif
	if (rc)
		return rc;
	s->env = env;
	ops.attach = shim_attach;
	ops.sync = shim_sync;
	ops.detach = shim_detach;
	ops.ctx = s;
	rc = mdb_env_set_pmo(env, &ops);
	if (rc == 0)
		rc = mdb_env_open(env, path, flags, mode);
	s->opened = rc == 0;
	return rc;
}

void mtest_pmo_env_close(MDB_env *env)
{
	struct shim *s = env ? find(env) : NULL;
	struct lmdb_digest d;
	char line[96];
	int rc;

	if (s && s->opened) {
		rc = lmdb_digest(env, &d);
		if (rc == 0) {
			lmdb_digest_format(&d, line, sizeof(line));
			fprintf(stderr, "mtest_pmo: close LMDBDIGEST %s\n", line);
		} else {
			fprintf(stderr, "mtest_pmo: close LMDBDIGEST error %s\n", mdb_strerror(rc));
		}
	}
	mdb_env_close(env);
	if (s)
		release(s);
}

unsigned long mtest_pmo_syncs(MDB_env *env)
{
	struct shim *s = env ? find(env) : NULL;

	return s ? s->syncs : 0;
}

char *mdb_dkey(MDB_val *key, char *buf)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *c;
	size_t i;

	if (!key)
		return "";
	if (key->mv_size > 511)
		return "MDB_MAXKEYSIZE";
	c = key->mv_data;
	for (i = 0; i < key->mv_size; i++) {
		buf[2 * i] = hex[c[i] >> 4];
		buf[2 * i + 1] = hex[c[i] & 15];
	}
	buf[2 * i] = '\0';
	return buf;
}
