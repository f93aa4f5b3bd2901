/*
 * lmdb_check.c - reopen an LMDB environment in a new process and check it.
 *
 *   lmdb_check [-w N] DIR
 *
 * Opens the environment in directory DIR (read-only, unless -w), walks it with
 * lmdb_digest() (order and counts checked) and prints
 *
 *   LMDBCHECK dbs=N entries=N fnv=HEX16
 *
 * -w N first commits N write transactions, each putting one new key into the
 * main DB. Built with mtest_pmo.h (-include), it also checks the PMO mode:
 * exactly one backend sync per commit, none for an empty commit, a read
 * transaction or mdb_env_sync(); mdb_env_get_fd() is ENOTSUP and growing the
 * map is EINVAL; and prints
 *
 *   LMDBCHECK-PMO commits=N syncs=N
 *
 * Exit status: 0 ok, 1 usage, 2 an LMDB call failed, 3 a check failed.
 */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lmdb.h"
#include "lmdb_digest.h"

static const char *dir;

static int fail_lmdb(const char *what, int rc)
{
	fprintf(stderr, "lmdb_check: %s: %s: %s\n", dir, what, mdb_strerror(rc));
	return 2;
}

static int fail_check(const char *what)
{
	fprintf(stderr, "lmdb_check: %s: %s\n", dir, what);
	return 3;
}

/* Commit @n transactions, each with one new main DB key. */
static int write_txns(MDB_env *env, unsigned long n)
{
	for (unsigned long i = 0; i < n; i++) {
		char kbuf[64], vbuf[64];
		MDB_val key, data;
		MDB_txn *txn;
		MDB_dbi dbi;
		int rc;

		snprintf(kbuf, sizeof(kbuf), "lmdb_check.%ld.%lu", (long)getpid(), i);
		snprintf(vbuf, sizeof(vbuf), "value of commit %lu", i);
		key.mv_data = kbuf;
		key.mv_size = strlen(kbuf);
		data.mv_data = vbuf;
		data.mv_size = strlen(vbuf);
		if ((rc = mdb_txn_begin(env, NULL, 0, &txn)))
			return fail_lmdb("mdb_txn_begin", rc);
		if ((rc = mdb_dbi_open(txn, NULL, 0, &dbi)) ||
		    (rc = mdb_put(txn, dbi, &key, &data, MDB_NOOVERWRITE))) {
			mdb_txn_abort(txn);
			return fail_lmdb("mdb_put", rc);
		}
		if ((rc = mdb_txn_commit(txn)))
			return fail_lmdb("mdb_txn_commit", rc);
	}
	return 0;
}

#ifdef MTEST_PMO_H
/* The PMO mode's promises about syncs and refused calls; then @n commits. */
static int pmo_checks(MDB_env *env, unsigned long n)
{
	unsigned long before = mtest_pmo_syncs(env), now;
	mdb_filehandle_t fd;
	MDB_envinfo info;
	MDB_txn *txn;
	int rc;

	if ((rc = mdb_txn_begin(env, NULL, 0, &txn)) || (rc = mdb_txn_commit(txn)))
		return fail_lmdb("empty commit", rc);
	if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn)))
		return fail_lmdb("read txn", rc);
	mdb_txn_abort(txn);
	if ((rc = mdb_env_sync(env, 1)))
		return fail_lmdb("mdb_env_sync", rc);
	if (mtest_pmo_syncs(env) != before)
		return fail_check("an empty commit, a read txn or mdb_env_sync() synced");
	if (mdb_env_get_fd(env, &fd) != ENOTSUP)
		return fail_check("mdb_env_get_fd() is not ENOTSUP");
	if ((rc = mdb_env_info(env, &info)))
		return fail_lmdb("mdb_env_info", rc);
	if (mdb_env_set_mapsize(env, info.me_mapsize * 2) != EINVAL)
		return fail_check("growing the map is not EINVAL");
	if ((rc = mdb_env_set_mapsize(env, 0)))
		return fail_lmdb("mdb_env_set_mapsize(0)", rc);
	if ((rc = write_txns(env, n)))
		return rc;
	now = mtest_pmo_syncs(env);
	printf("LMDBCHECK-PMO commits=%lu syncs=%lu\n", n, now - before);
	if (now - before != n)
		return fail_check("not exactly one sync per commit");
	return 0;
}
#endif

int main(int argc, char **argv)
{
	unsigned long writes = 0;
	struct lmdb_digest d;
	char line[96];
	MDB_env *env;
	int opt, rc, st = 0;

	while ((opt = getopt(argc, argv, "w:")) != -1) {
		char *end;

		switch (opt) {
		case 'w':
			errno = 0;
			writes = strtoul(optarg, &end, 10);
			if (errno || *end || !*optarg)
				goto usage;
			break;
		default:
			goto usage;
		}
	}
	if (optind + 1 != argc)
		goto usage;
	dir = argv[optind];

	if ((rc = mdb_env_create(&env)))
		return fail_lmdb("mdb_env_create", rc);
	if ((rc = mdb_env_set_maxdbs(env, 64)) ||
	    (rc = mdb_env_open(env, dir, writes ? 0 : MDB_RDONLY, 0664))) {
		mdb_env_close(env);
		return fail_lmdb("mdb_env_open", rc);
	}
#ifdef MTEST_PMO_H
	if (writes)
		st = pmo_checks(env, writes);
#else
	st = write_txns(env, writes);
#endif
	if (st == 0) {
		rc = lmdb_digest(env, &d);
		if (rc == MDB_CORRUPTED) {
			st = fail_check("inconsistent (see above)");
		} else if (rc) {
			st = fail_lmdb("walk", rc);
		} else {
			lmdb_digest_format(&d, line, sizeof(line));
			printf("LMDBCHECK %s\n", line);
		}
	}
	fflush(stdout);
	mdb_env_close(env);
	return st;
usage:
	fprintf(stderr, "usage: lmdb_check [-w N] DIR\n");
	return 1;
}
