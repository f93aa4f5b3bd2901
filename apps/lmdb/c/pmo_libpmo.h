/*
 * pmo_libpmo.h - LMDB's data file in a real PMO, through libpmo (guest programs).
 *
 *   MDB_pmo_ops ops;
 *   mdb_pmo_libpmo(&ops, key);          // key: 1..64 bytes, copied
 *   mdb_env_set_pmo(env, &ops);
 *   mdb_env_open(env, "./db", 0, 0664); // data: PMO "lmdb._<cwd>_db_data.mdb"
 *   ...
 *   mdb_env_close(env);                  // detaches
 *   mdb_pmo_libpmo_free(&ops);           // wipes the key copy
 *
 * attach: the PMO named after the data file path (pmo_name.h), attached
 * PMO_WRITE (exclusive) or PMO_READ; a writable attach of a missing PMO first
 * pcreate()s it with the requested size rounded up to whole pages (zero-filled).
 * sync: psync(), atomic. detach: detach(), which drops anything not psynced.
 * Errors are libpmo's errno values (pmo.h), e.g. EACCES for a wrong key, EBUSY
 * while another process has the PMO attached for writing, ENAMETOOLONG for a
 * path whose PMO name would pass 63 bytes.
 *
 * The key stays in memory owned by ops->ctx (never printed) for every open that
 * uses these ops, until mdb_pmo_libpmo_free() overwrites and frees it; call
 * that after the last mdb_env_close() of an env using them.
 */
#ifndef LMDB_PMO_LIBPMO_H
#define LMDB_PMO_LIBPMO_H

#include "lmdb.h"

/* Fill @ops for libpmo with a copy of @key. 0, EINVAL (NULL, or a key not of
 * 1..64 bytes) or ENOMEM. */
int mdb_pmo_libpmo(MDB_pmo_ops *ops, const char *key);

/* Wipe the key copy, free ops->ctx and clear @ops (NULL or cleared: no-op). */
void mdb_pmo_libpmo_free(MDB_pmo_ops *ops);

#endif /* LMDB_PMO_LIBPMO_H */
