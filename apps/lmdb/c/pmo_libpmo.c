/*
 * pmo_libpmo.c - MDB_pmo_ops on libpmo: LMDB's data file in a PMO (pmo_libpmo.h).
 */
#include "pmo_libpmo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pmo.h"
#include "pmo_name.h"

#define PMO_PAGE 4096

/* ops->ctx: the key copy. */
struct libpmo_ctx {
	char key[PMO_KEY_MAX + 1];
};

/* Overwrite @n bytes at @p in a way the compiler may not drop. */
static void wipe(void *p, size_t n)
{
	volatile unsigned char *v = p;

	while (n--)
		*v++ = 0;
}

static void *libpmo_attach(void *ctx, const char *path, size_t *size, int writable)
{
	struct libpmo_ctx *c = ctx;
	char name[MDB_PMO_NAME_MAX + 1];
	int perm = writable ? PMO_WRITE : PMO_READ;
	size_t want;
	void *addr;
	int rc;

	rc = mdb_pmo_name(path, name, sizeof(name));
	if (rc) {
		errno = rc;
		return NULL;
	}
	addr = attach(name, perm, c->key);
	if (!addr && errno == ENOENT && writable) {
		want = (*size + PMO_PAGE - 1) / PMO_PAGE * PMO_PAGE;
		if (want < *size) {	/* wrapped */
			errno = EINVAL;
			return NULL;
		}
		/* EEXIST: another process created it meanwhile; attach that one. */
		if (pcreate(name, want, c->key) != 0 && errno != EEXIST)
			return NULL;
		addr = attach(name, perm, c->key);
	}
	if (!addr)
		return NULL;
	*size = pmo_size(addr);
	if (*size == 0) {
		rc = errno ? errno : EIO;
		detach(addr);
		errno = rc;
		return NULL;
	}
	return addr;
}

static int libpmo_sync(void *ctx, void *addr)
{
	(void)ctx;
	return psync(addr) ? errno : 0;
}

static int libpmo_detach(void *ctx, void *addr)
{
	(void)ctx;
	return detach(addr) ? errno : 0;
}

int mdb_pmo_libpmo(MDB_pmo_ops *ops, const char *key)
{
	struct libpmo_ctx *c;
	size_t n;

	if (!ops || !key)
		return EINVAL;
	n = strlen(key);
	if (n < 1 || n > PMO_KEY_MAX)
		return EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return ENOMEM;
	memcpy(c->key, key, n);
	ops->attach = libpmo_attach;
	ops->sync = libpmo_sync;
	ops->detach = libpmo_detach;
	ops->ctx = c;
	return 0;
}

void mdb_pmo_libpmo_free(MDB_pmo_ops *ops)
{
	if (!ops)
		return;
	if (ops->ctx) {
		wipe(ops->ctx, sizeof(struct libpmo_ctx));
		free(ops->ctx);
	}
	memset(ops, 0, sizeof(*ops));
}
