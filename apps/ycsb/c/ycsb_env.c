/*
 * ycsb_env - opening ycsb_lmdb's LMDB environment (ycsb_env.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "ycsb_env.h"

#ifdef YCSB_WITH_PMO
#include "pmo_libpmo.h"
#endif

#ifdef YCSB_WITH_PMO
/* The libpmo backend; it holds a copy of the key until env_release(). */
static MDB_pmo_ops pmo_ops;
static int pmo_ready;
#endif

/* After the last mdb_env_close(): wipe the backend's key copy. */
void env_release(void)
{
#ifdef YCSB_WITH_PMO
	if (pmo_ready)
		mdb_pmo_libpmo_free(&pmo_ops);
	pmo_ready = 0;
#endif
}

int env_open(const struct config *cfg, MDB_env **envp, MDB_dbi *dbi, char key[KEY_FILE_MAX + 1])
{
	MDB_env *env;
	MDB_txn *txn;
	unsigned int flags = MDB_NOTLS | (cfg->nosync ? MDB_NOSYNC : 0);
	int rc;

	(void)key;
	rc = mdb_env_create(&env);
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: mdb_env_create: %s\n", mdb_strerror(rc));
		return 1;
	}
	rc = mdb_env_set_mapsize(env, (size_t)cfg->map_size);
	if (!rc)
		rc = mdb_env_set_maxreaders(env, cfg->threads + 2);
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: mdb_env_set: %s\n", mdb_strerror(rc));
		mdb_env_close(env);
		return 1;
	}
	if (cfg->pmo_keyfile) {
#ifdef YCSB_WITH_PMO
		if (read_key(cfg->pmo_keyfile, key)) {
			mdb_env_close(env);
			return 1;
		}
		rc = mdb_pmo_libpmo(&pmo_ops, key);
		memset(key, 0, KEY_FILE_MAX + 1);
		if (!rc) {
			pmo_ready = 1;
			rc = mdb_env_set_pmo(env, &pmo_ops);
		}
		if (rc) {
			fprintf(stderr, "ycsb_lmdb: PMO backend: %s\n", mdb_strerror(rc));
			mdb_env_close(env);
			return 1;
		}
#else
		fprintf(stderr, "ycsb_lmdb: built without PMO support (make host): use --file\n");
		mdb_env_close(env);
		return 1;
#endif
	}
	if (mkdir(cfg->dir, 0755) && errno != EEXIST) {
		fprintf(stderr, "ycsb_lmdb: mkdir %s: %s\n", cfg->dir, strerror(errno));
		mdb_env_close(env);
		return 1;
	}
	rc = mdb_env_open(env, cfg->dir, flags, 0644);
	if (!rc) {
		rc = mdb_txn_begin(env, NULL, 0, &txn);
		if (!rc) {
			rc = mdb_dbi_open(txn, NULL, 0, dbi);
			if (rc)
				mdb_txn_abort(txn);
			else
				rc = mdb_txn_commit(txn);
		}
	}
	if (rc) {
		fprintf(stderr, "ycsb_lmdb: open %s: %s\n", cfg->dir, mdb_strerror(rc));
		mdb_env_close(env);
		return 1;
	}
	*envp = env;
	return 0;
}
