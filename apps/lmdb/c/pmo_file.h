/*
 * pmo_file.h - a TEST backend for MDB_pmo_ops on an ordinary file (host only).
 *
 * NOT a PMO and NOT atomic: it exists to run the PMO code path of the patched
 * LMDB on the host quickly. attach opens (or creates, with ftruncate to the
 * requested size) the data file itself at its path and maps it MAP_SHARED;
 * sync is msync(MS_SYNC) of the whole mapping, which writes dirty pages one by
 * one, so a crash in the middle can leave some of a transaction's pages (even
 * its meta page) on disk and not others; detach is munmap. The file it leaves
 * is an ordinary LMDB data file that unpatched LMDB can open.
 *
 * A read-only attach (writable == 0) of a missing or empty file fails with
 * ENOENT. ops->ctx counts syncs (mdb_pmo_file_syncs()) and keeps the list of
 * its mappings; it is thread-safe.
 */
#ifndef LMDB_PMO_FILE_H
#define LMDB_PMO_FILE_H

#include "lmdb.h"

/* Fill @ops with the file backend. 0, EINVAL (NULL ops) or ENOMEM. */
int mdb_pmo_file(MDB_pmo_ops *ops);

/* Syncs done so far through @ops (0 for NULL or cleared ops). */
unsigned long mdb_pmo_file_syncs(const MDB_pmo_ops *ops);

/* Free ops->ctx and clear @ops; mappings still attached stay mapped. */
void mdb_pmo_file_free(MDB_pmo_ops *ops);

#endif /* LMDB_PMO_FILE_H */
