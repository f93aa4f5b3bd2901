/*
 * lmdb_digest.c - digest and consistency walk of an LMDB environment (lmdb_digest.h).
 */
#include "lmdb_digest.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static void fnv(uint64_t *h, const void *p, size_t n)
{
	const unsigned char *b = p;

	while (n--) {
		*h ^= *b++;
		*h *= FNV_PRIME;
	}
}

static void fnv_val(uint64_t *h, const MDB_val *v)
{
	uint64_t len = v->mv_size;

	fnv(h, &len, sizeof(len));
	fnv(h, v->mv_data, v->mv_size);
}

/* Walk DB @dbi named @name ("" for the main DB) into @d. */
static int walk(MDB_txn *txn, MDB_dbi dbi, const char *name, struct lmdb_digest *d)
{
	MDB_cursor *cur;
	MDB_val key, data, pkey = { 0, NULL }, pdata = { 0, NULL };
	unsigned int flags;
	MDB_stat st;
	size_t n = 0;
	int rc;

	if ((rc = mdb_dbi_flags(txn, dbi, &flags)) || (rc = mdb_stat(txn, dbi, &st)) ||
	    (rc = mdb_cursor_open(txn, dbi, &cur)))
		return rc;
	fnv(&d->hash, name, strlen(name) + 1);
	while ((rc = mdb_cursor_get(cur, &key, &data, MDB_NEXT)) == 0) {
		if (n > 0) {
			int c = mdb_cmp(txn, dbi, &pkey, &key);

			if (c > 0 || (c == 0 && !(flags & MDB_DUPSORT)) ||
			    (c == 0 && mdb_dcmp(txn, dbi, &pdata, &data) >= 0)) {
				fprintf(stderr, "lmdb_digest: DB \"%s\" out of order at item %zu\n",
					name, n);
				rc = MDB_CORRUPTED;
				break;
			}
		}
		fnv_val(&d->hash, &key);
		fnv_val(&d->hash, &data);
		pkey = key;	/* valid until the read txn ends */
		pdata = data;
		n++;
	}
	mdb_cursor_close(cur);
	if (rc != MDB_NOTFOUND)
		return rc;
	if (n != st.ms_entries) {
		fprintf(stderr, "lmdb_digest: DB \"%s\" walked %zu items, its count is %zu\n",
			name, n, st.ms_entries);
		return MDB_CORRUPTED;
	}
	d->dbs++;
	d->entries += n;
	return 0;
}

/* Walk the named DB whose name is main DB key @k, if it is one. */
static int walk_named(MDB_txn *txn, const MDB_val *k, struct lmdb_digest *d)
{
	MDB_dbi dbi;
	char *name;
	int rc;

	if (k->mv_size == 0 || memchr(k->mv_data, '\0', k->mv_size))
		return 0;	/* not a name mdb_dbi_open() could have made */
	name = malloc(k->mv_size + 1);
	if (!name)
		return ENOMEM;
	memcpy(name, k->mv_data, k->mv_size);
	name[k->mv_size] = '\0';
	rc = mdb_dbi_open(txn, name, 0, &dbi);
	if (rc == 0)
		rc = walk(txn, dbi, name, d);
	else if (rc == MDB_INCOMPATIBLE || rc == MDB_DBS_FULL)
		rc = 0;	/* a plain record (or no slot to tell): hashed as such */
	free(name);
	return rc;
}

int lmdb_digest(MDB_env *env, struct lmdb_digest *d)
{
	MDB_txn *txn;
	MDB_cursor *cur;
	MDB_val key, data;
	MDB_dbi main_dbi;
	int rc;

	d->dbs = 0;
	d->entries = 0;
	d->hash = FNV_OFFSET;
	if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn)))
		return rc;
	if ((rc = mdb_dbi_open(txn, NULL, 0, &main_dbi)) || (rc = walk(txn, main_dbi, "", d)) ||
	    (rc = mdb_cursor_open(txn, main_dbi, &cur)))
		goto out;
	while ((rc = mdb_cursor_get(cur, &key, &data, MDB_NEXT)) == 0) {
		if ((rc = walk_named(txn, &key, d)))
			break;
	}
	mdb_cursor_close(cur);
	if (rc == MDB_NOTFOUND)
		rc = 0;
out:
	mdb_txn_abort(txn);
	return rc;
}

void lmdb_digest_format(const struct lmdb_digest *d, char *buf, size_t n)
{
	snprintf(buf, n, "dbs=%u entries=%zu fnv=%016" PRIx64, d->dbs, d->entries, d->hash);
}
