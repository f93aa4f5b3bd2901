/*
 * lmdb_digest.h - a digest of everything an LMDB environment holds, to compare
 * an environment before a close with what a new process finds after reopening.
 *
 * One read-only transaction walks the main DB and every named DB found in it
 * (a main DB key that mdb_dbi_open() accepts; one it cannot open for lack of
 * DB slots, MDB_DBS_FULL, is hashed as a plain record), each with a cursor in
 * order, and checks on the way that
 *   - keys are strictly increasing by the DB's comparator (and, in a DUPSORT
 *     DB, the data items of one key by its data comparator), and
 *   - the items walked equal the DB's own count (mdb_stat ms_entries);
 * a violation is MDB_CORRUPTED. The hash is 64-bit FNV-1a over, per DB in walk
 * order, its name and each item as (key length, key, data length, data).
 */
#ifndef LMDB_DIGEST_H
#define LMDB_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "lmdb.h"

struct lmdb_digest {
	unsigned int dbs;	/* main DB + named DBs walked */
	size_t entries;		/* items in all of them */
	uint64_t hash;
};

/* Digest of @env (open, no write transaction of this thread running): 0 or an
 * LMDB error code (MDB_CORRUPTED when a check fails). */
int lmdb_digest(MDB_env *env, struct lmdb_digest *d);

/* "dbs=N entries=N fnv=HEX16" into @buf. */
void lmdb_digest_format(const struct lmdb_digest *d, char *buf, size_t n);

#endif /* LMDB_DIGEST_H */
