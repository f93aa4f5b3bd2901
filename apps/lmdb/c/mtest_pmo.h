/*
 * mtest_pmo.h - runs LMDB programs unmodified on a PMO backend.
 *
 * Compile a program with `-include mtest_pmo.h` (and link mtest_pmo.o and
 * lmdb_digest.o): its mdb_env_open() then first calls mdb_env_set_pmo() with
 * the backend chosen when mtest_pmo.c was built (MTEST_PMO_LIBPMO: libpmo with
 * the key from the environment variable LMDB_PMO_KEY; MTEST_PMO_FILE: the host
 * file test backend), and its mdb_env_close() first prints the environment's
 * digest (lmdb_digest.h), then closes and frees the backend. Each sync the
 * backend does is counted; at detach the count is printed (with the device's
 * own psync count on libpmo). On stderr, one line each, prefix "mtest_pmo:":
 *
 *   mtest_pmo: open PATH backend=libpmo pmo=NAME      (backend=file file=PATH)
 *   mtest_pmo: close LMDBDIGEST dbs=.. entries=.. fnv=..
 *   mtest_pmo: detach syncs=N [psyncs=N]
 *
 * Test hook: LMDB_PMO_CRASH_AT_SYNC=N makes the process _exit(75) at its Nth
 * sync, before the backend syncs (the new meta page is already in the
 * mapping): a crash at the worst moment of a commit.
 */
#ifndef MTEST_PMO_H
#define MTEST_PMO_H

#include "lmdb.h"

/* mdb_env_open() on the build's backend; LMDB's error codes. */
int mtest_pmo_env_open(MDB_env *env, const char *path, unsigned int flags, mdb_mode_t mode);

/* Digest line, then mdb_env_close() and the backend freed. */
void mtest_pmo_env_close(MDB_env *env);

/* Syncs the backend did for @env so far (since its open); 0 if unknown. */
unsigned long mtest_pmo_syncs(MDB_env *env);

/* mtest6.c prints keys with mdb_dkey(), which only LMDB's debug build
 * (MDB_DEBUG) exports: the shim has it (hex of the key into @buf, which holds
 * at least 1023 bytes; longer keys give "MDB_MAXKEYSIZE"). */
char *mdb_dkey(MDB_val *key, char *buf);

#ifndef MTEST_PMO_IMPL
#define mdb_env_open mtest_pmo_env_open
#define mdb_env_close mtest_pmo_env_close
#endif

#endif /* MTEST_PMO_H */
