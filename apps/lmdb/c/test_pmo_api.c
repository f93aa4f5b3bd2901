/*
 * test_pmo_api.c - host tests of the patch's PMO mode (mdb_env_set_pmo) and of
 * the PMO name scheme, on the file test backend.
 *
 *   test_pmo_api DIR      (DIR: an empty scratch directory)
 *
 * The backend is wrapped so that the object of data file P is the file
 * "P.pmo": LMDB itself must never create P. The wrapper counts syncs and can
 * make one fail. Prints one line per check and "N passed, N failed".
 */
#define _XOPEN_SOURCE 700

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmdb.h"
#include "lmdb_digest.h"
#include "pmo_file.h"
#include "pmo_name.h"

#define MAPSIZE (256u << 10)

static int passed, failed;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (cond) {                                                \
			passed++;                                          \
		} else {                                                   \
			failed++;                                          \
			printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
		}                                                          \
	} while (0)

/* The wrapping backend. */
struct tctx {
	MDB_pmo_ops inner;
	unsigned long syncs;
	int fail_sync;	/* errno the next sync returns instead of syncing */
};

static void *t_attach(void *ctx, const char *name, size_t *size, int writable)
{
	struct tctx *t = ctx;
	char obj[PATH_MAX];

	snprintf(obj, sizeof(obj), "%s.pmo", name);
	return t->inner.attach(t->inner.ctx, obj, size, writable);
}

static int t_sync(void *ctx, void *addr)
{
	struct tctx *t = ctx;

	if (t->fail_sync) {
		int rc = t->fail_sync;

		t->fail_sync = 0;
		return rc;
	}
	t->syncs++;
	return t->inner.sync(t->inner.ctx, addr);
}

static int t_detach(void *ctx, void *addr)
{
	struct tctx *t = ctx;

	return t->inner.detach(t->inner.ctx, addr);
}

static struct tctx tc;
static const MDB_pmo_ops tops = { t_attach, t_sync, t_detach, &tc };

/* Open @dir in PMO mode (mapsize @mapsize unless 0). */
static int open_pmo(MDB_env **env, const char *dir, unsigned int flags, size_t mapsize)
{
	int rc = mdb_env_create(env);

	if (!rc && mapsize)
		rc = mdb_env_set_mapsize(*env, mapsize);
	if (!rc)
		rc = mdb_env_set_maxdbs(*env, 4);
	if (!rc)
		rc = mdb_env_set_pmo(*env, &tops);
	if (!rc)
		rc = mdb_env_open(*env, dir, flags, 0664);
	return rc;
}

static int put(MDB_env *env, int i, size_t vsize)
{
	char kbuf[32], *v = calloc(1, vsize);
	MDB_val key = { 0, kbuf }, data = { vsize, v };
	MDB_txn *txn;
	MDB_dbi dbi;
	int rc;

	if (!v)
		return ENOMEM;
	snprintf(kbuf, sizeof(kbuf), "key%06d", i);
	key.mv_size = strlen(kbuf);
	memset(v, 'a' + i % 26, vsize);
	rc = mdb_txn_begin(env, NULL, 0, &txn);
	if (!rc) {
		rc = mdb_dbi_open(txn, NULL, 0, &dbi);
		if (!rc)
			rc = mdb_put(txn, dbi, &key, &data, 0);
		if (!rc)
			rc = mdb_txn_commit(txn);
		else
			mdb_txn_abort(txn);
	}
	free(v);
	return rc;
}

static uint64_t digest_of(MDB_env *env, size_t *entries)
{
	struct lmdb_digest d;
	int rc = lmdb_digest(env, &d);

	CHECK(rc == 0, "lmdb_digest: %s", mdb_strerror(rc));
	*entries = rc ? 0 : d.entries;
	return rc ? 0 : d.hash;
}

static int exists(const char *dir, const char *name)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%.2000s/%.64s", dir, name);
	return access(p, F_OK) == 0;
}

static void test_names(void)
{
	char out[MDB_PMO_NAME_MAX + 1], small[8], path[PATH_MAX], want[128];
	char cwd[PATH_MAX], scratch[] = "/tmp/pn.XXXXXX";

	CHECK(mdb_pmo_name_encode("/tmp/lmdb/testdb/data.mdb", out, sizeof(out)) == 0 &&
		      !strcmp(out, "lmdb._tmp_lmdb_testdb_data.mdb"), "%s", out);
	CHECK(mdb_pmo_name_encode("/a-b/c_d/e f/data.mdb", out, sizeof(out)) == 0 &&
		      !strcmp(out, "lmdb._a-2db_c-5fd_e-20f_data.mdb"), "%s", out);
	/* '/' and '_' never meet: "/x_" and "_x/" style paths stay apart */
	CHECK(mdb_pmo_name_encode("/a_/b", out, sizeof(out)) == 0 &&
		      !strcmp(out, "lmdb._a-5f_b"), "%s", out);
	CHECK(mdb_pmo_name_encode("/a/_b", out, sizeof(out)) == 0 &&
		      !strcmp(out, "lmdb._a_-5fb"), "%s", out);
	CHECK(mdb_pmo_name_encode("relative/data.mdb", out, sizeof(out)) == EINVAL, "relative");
	CHECK(mdb_pmo_name_encode("/dir/", out, sizeof(out)) == EINVAL, "empty base");
	CHECK(mdb_pmo_name_encode("/dir/..", out, sizeof(out)) == EINVAL, "dotdot");
	/* exactly 63 bytes pass, 64 do not */
	memset(path, 'x', 58);
	path[0] = '/';
	path[58] = '\0';
	CHECK(mdb_pmo_name_encode(path, out, sizeof(out)) == 0 && strlen(out) == 63, "%zu",
	      strlen(out));
	strcpy(path + 58, "x");
	CHECK(mdb_pmo_name_encode(path, out, sizeof(out)) == ENAMETOOLONG, "64 bytes");
	CHECK(mdb_pmo_name_encode("/data.mdb", small, sizeof(small)) == ENAMETOOLONG, "small");
	/*
	 * A relative path resolves against the working directory. The
	 * scratch directory is short and under /tmp so that the encoded name
	 * fits in 63 bytes wherever the checkout lives.
	 */
	if (getcwd(cwd, sizeof(cwd)) && mkdtemp(scratch) && chdir(scratch) == 0) {
		char real[PATH_MAX], abs[PATH_MAX + 16];

		CHECK(mkdir("sub", 0755) == 0, "mkdir");
		CHECK(mdb_pmo_name("./sub/../sub/data.mdb", out, sizeof(out)) == 0, "name");
		CHECK(realpath("sub", real) != NULL, "realpath");
		snprintf(abs, sizeof(abs), "%s/data.mdb", real);
		CHECK(mdb_pmo_name_encode(abs, want, sizeof(want)) == 0 && !strcmp(out, want),
		      "%s != %s", out, want);
		CHECK(mdb_pmo_name("./missing/data.mdb", out, sizeof(out)) == ENOENT, "missing dir");
		CHECK(chdir(cwd) == 0, "chdir back");
		CHECK(rmdir(real) == 0 && rmdir(scratch) == 0, "rmdir %s", scratch);
	} else {
		CHECK(0, "scratch dir %s: %s", scratch, strerror(errno));
	}
}

int main(int argc, char **argv)
{
	char db[PATH_MAX], obj[PATH_MAX], cp[PATH_MAX];
	MDB_env *env, *plain;
	MDB_envinfo info;
	MDB_txn *txn, *child;
	mdb_filehandle_t fd;
	uint64_t h1, h2;
	size_t n1, n2;
	struct stat st;
	int rc, i, full = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: test_pmo_api SCRATCH_DIR\n");
		return 1;
	}
	test_names();
	if (strlen(argv[1]) > 2000) {
		fprintf(stderr, "test_pmo_api: scratch path too long\n");
		return 1;
	}
	snprintf(db, sizeof(db), "%.2000s/db", argv[1]);
	snprintf(obj, sizeof(obj), "%.2000s/data.mdb.pmo", db);
	snprintf(cp, sizeof(cp), "%.2000s/copy", argv[1]);
	if ((mkdir(db, 0755) && errno != EEXIST) || (mkdir(cp, 0755) && errno != EEXIST) ||
	    mdb_pmo_file(&tc.inner)) {
		perror("setup");
		return 1;
	}

	/* Argument checks. */
	CHECK(mdb_env_create(&env) == 0, "create");
	{
		MDB_pmo_ops bad = tops;

		bad.sync = NULL;
		CHECK(mdb_env_set_pmo(env, NULL) == EINVAL, "NULL ops");
		CHECK(mdb_env_set_pmo(env, &bad) == EINVAL, "NULL callback");
		CHECK(mdb_env_set_pmo(NULL, &tops) == EINVAL, "NULL env");
	}
	mdb_env_close(env);

	/* Read-only open of a missing object, then of an empty one: ENOENT. */
	rc = open_pmo(&env, db, MDB_RDONLY, 0);
	CHECK(rc == ENOENT, "%s", mdb_strerror(rc));
	mdb_env_close(env);
	close(open(obj, O_CREAT | O_WRONLY, 0644));
	CHECK(truncate(obj, MAPSIZE) == 0, "truncate");
	rc = open_pmo(&env, db, MDB_RDONLY, 0);
	CHECK(rc == ENOENT, "zero-filled object read-only: %s", mdb_strerror(rc));
	mdb_env_close(env);
	unlink(obj);

	/* A new environment: created with the map size, one sync for its meta pages;
	 * FIXEDMAP accepted and ignored. */
	tc.syncs = 0;
	rc = open_pmo(&env, db, MDB_FIXEDMAP | MDB_NOSYNC, MAPSIZE);
	CHECK(rc == 0, "open: %s", mdb_strerror(rc));
	if (rc)
		return 1;
	CHECK(tc.syncs == 1, "new env synced %lu times", tc.syncs);
	CHECK(stat(obj, &st) == 0 && st.st_size == MAPSIZE, "object size %lld",
	      (long long)st.st_size);
	CHECK(mdb_env_info(env, &info) == 0 && info.me_mapsize == MAPSIZE, "mapsize %zu",
	      info.me_mapsize);
	CHECK(mdb_env_set_pmo(env, &tops) == EBUSY, "set_pmo once open");

	/* One sync per commit; none for empty commits, read txns, aborts, env_sync. */
	tc.syncs = 0;
	for (i = 0; i < 5; i++)
		CHECK(put(env, i, 100) == 0, "put %d", i);
	CHECK(tc.syncs == 5, "5 commits, %lu syncs", tc.syncs);
	CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0 && mdb_txn_commit(txn) == 0, "empty");
	CHECK(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0, "read txn");
	mdb_txn_abort(txn);
	CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0, "write txn");
	mdb_txn_abort(txn);
	CHECK(mdb_env_sync(env, 1) == 0, "env_sync");
	CHECK(tc.syncs == 5, "extra syncs: %lu", tc.syncs);

	/* What PMO mode refuses. */
	CHECK(mdb_env_get_fd(env, &fd) == ENOTSUP, "get_fd");
	CHECK(mdb_env_set_mapsize(env, MAPSIZE * 2) == EINVAL, "grow");
	CHECK(mdb_env_set_mapsize(env, MAPSIZE / 2) == EINVAL, "shrink");
	CHECK(mdb_env_set_mapsize(env, 0) == 0 && mdb_env_set_mapsize(env, MAPSIZE) == 0, "same");
	CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0, "parent");
	CHECK(mdb_txn_begin(env, txn, 0, &child) == MDB_BAD_TXN, "nested txn (WRITEMAP)");
	mdb_txn_abort(txn);

	/* Fill it: MDB_MAP_FULL, and everything committed before stays. */
	for (i = 5; i < 1000; i++) {
		rc = put(env, i, 1500);
		if (rc) {
			full = rc == MDB_MAP_FULL;
			break;
		}
	}
	CHECK(full, "filling ended with %s after %d keys", mdb_strerror(rc), i);
	h1 = digest_of(env, &n1);
	CHECK(n1 == (size_t)i, "%zu entries, %d committed", n1, i);
	mdb_env_close(env);
	CHECK(!exists(db, "data.mdb"), "LMDB created the data file itself");
	CHECK(exists(db, "lock.mdb"), "no lock file");

	/* Reopen: the object's size wins over a configured one; same contents. */
	tc.syncs = 0;
	rc = open_pmo(&env, db, MDB_RDONLY, 4 * MAPSIZE);
	CHECK(rc == 0, "reopen: %s", mdb_strerror(rc));
	if (rc == 0) {
		CHECK(mdb_env_info(env, &info) == 0 && info.me_mapsize == MAPSIZE, "mapsize %zu",
		      info.me_mapsize);
		h2 = digest_of(env, &n2);
		CHECK(h1 == h2 && n1 == n2, "digest changed over close/reopen");
		CHECK(mdb_env_copy(env, cp) == 0, "copy");
		mdb_env_close(env);
	}
	CHECK(tc.syncs == 0, "read-only env synced");

	/* Unpatched behaviour (no PMO) reads the object file and the copy alike. */
	CHECK(mdb_env_create(&plain) == 0 && mdb_env_set_maxdbs(plain, 4) == 0, "plain");
	rc = mdb_env_open(plain, obj, MDB_RDONLY | MDB_NOSUBDIR, 0664);
	CHECK(rc == 0, "plain open: %s", mdb_strerror(rc));
	if (rc == 0) {
		h2 = digest_of(plain, &n2);
		CHECK(h1 == h2 && n1 == n2, "plain LMDB sees other contents");
	}
	mdb_env_close(plain);
	CHECK(mdb_env_create(&plain) == 0, "plain");
	rc = mdb_env_open(plain, cp, MDB_RDONLY, 0664);
	CHECK(rc == 0, "copy open: %s", mdb_strerror(rc));
	if (rc == 0) {
		h2 = digest_of(plain, &n2);
		CHECK(h1 == h2 && n1 == n2, "mdb_env_copy() of a PMO env differs");
	}
	mdb_env_close(plain);

	/* A failed sync fails the commit and the env: MDB_PANIC afterwards. */
	rc = open_pmo(&env, db, 0, 0);
	CHECK(rc == 0, "open rw: %s", mdb_strerror(rc));
	if (rc == 0) {
		CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0, "begin");
		{
			MDB_dbi dbi;
			MDB_val k = { 3, "abc" };

			CHECK(mdb_dbi_open(txn, NULL, 0, &dbi) == 0 &&
				      mdb_del(txn, dbi, &k, NULL) == MDB_NOTFOUND,
			      "del of a missing key");
			k.mv_data = "key000001";
			k.mv_size = 9;
			CHECK(mdb_del(txn, dbi, &k, NULL) == 0, "del");
		}
		tc.fail_sync = EIO;
		rc = mdb_txn_commit(txn);
		CHECK(rc == EIO, "commit with a failing sync: %s", mdb_strerror(rc));
		rc = mdb_txn_begin(env, NULL, 0, &txn);
		CHECK(rc == MDB_PANIC, "after a failed sync: %s", mdb_strerror(rc));
		CHECK(mdb_env_sync(env, 1) == MDB_PANIC, "env_sync after a failed sync");
		mdb_env_close(env);
	}

	/* An object smaller than the data it holds: MDB_INVALID. */
	CHECK(truncate(obj, 3 * 4096) == 0, "truncate");
	rc = open_pmo(&env, db, MDB_RDONLY, 0);
	CHECK(rc == MDB_INVALID, "shrunk object: %s", mdb_strerror(rc));
	mdb_env_close(env);

	mdb_pmo_file_free(&tc.inner);
	printf("%d passed, %d failed\n", passed, failed);
	return failed != 0;
}
