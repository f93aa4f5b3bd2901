/*
 * pmo_name.h - the PMO name of an LMDB data file (used by the libpmo backend).
 *
 * A PMO name is 1..63 bytes of [A-Za-z0-9._-] not starting with '.' (pmo.h), so
 * a path cannot be used as it is. The name of data file PATH is
 *
 *   "lmdb." + ENCODE(absolute path of PATH)
 *
 * where the absolute path is realpath() of PATH's directory (which must exist,
 * as for LMDB's lock file) + "/" + PATH's last component, and ENCODE writes
 *   '/'                      as '_'
 *   [A-Za-z0-9.]             as itself
 *   every other byte         as '-' and two lowercase hex digits ("-" is "-2d",
 *                            "_" is "-5f", " " is "-20")
 * so different paths never share a PMO, and the same directory reached by
 * another relative path (./db, ../x/db) gets the same one. Example:
 * "/tmp/lmdb/testdb/data.mdb" -> "lmdb._tmp_lmdb_testdb_data.mdb".
 * A name longer than PMO_NAME_MAX (63) is refused with ENAMETOOLONG.
 */
#ifndef LMDB_PMO_NAME_H
#define LMDB_PMO_NAME_H

#include <stddef.h>

/* Longest PMO name (pmo.h's PMO_NAME_MAX, without the NUL). */
#define MDB_PMO_NAME_MAX 63

/*
 * Encode absolute path @abs (starting with '/') into @out (@outsz bytes, NUL
 * included) as described above. 0, EINVAL (not absolute, NULL, or a last
 * component that is empty, "." or "..") or ENAMETOOLONG (more than 63 bytes or
 * more than @outsz - 1).
 */
int mdb_pmo_name_encode(const char *abs, char *out, size_t outsz);

/*
 * The PMO name of data file @path (relative or absolute) into @out: resolves
 * the directory with realpath(), then mdb_pmo_name_encode(). 0 or an errno
 * (realpath's, e.g. ENOENT for a missing directory, or the encoder's).
 */
int mdb_pmo_name(const char *path, char *out, size_t outsz);

#endif /* LMDB_PMO_NAME_H */
