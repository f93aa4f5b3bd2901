/*
 * pmo_name.c - the PMO name of an LMDB data file; the scheme is in pmo_name.h.
 */
#define _XOPEN_SOURCE 700

#include "pmo_name.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char prefix[] = "lmdb.";

/* Bytes kept as they are: the allowed PMO name characters except the two
 * that the encoding uses ('_' for '/', '-' to escape). */
static int plain(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '.';
}

int mdb_pmo_name_encode(const char *abs, char *out, size_t outsz)
{
	static const char hex[] = "0123456789abcdef";
	const char *base;
	size_t n, cap;

	if (!abs || abs[0] != '/' || !out || outsz == 0)
		return EINVAL;
	base = strrchr(abs, '/') + 1;
	if (!*base || !strcmp(base, ".") || !strcmp(base, ".."))
		return EINVAL;
	cap = outsz - 1 < MDB_PMO_NAME_MAX ? outsz - 1 : MDB_PMO_NAME_MAX;

	n = strlen(prefix);
	if (n > cap)
		return ENAMETOOLONG;
	memcpy(out, prefix, n);
	for (const unsigned char *p = (const unsigned char *)abs; *p; p++) {
		if (*p == '/' || plain(*p)) {
			if (n + 1 > cap)
				return ENAMETOOLONG;
			out[n++] = *p == '/' ? '_' : (char)*p;
		} else {
			if (n + 3 > cap)
				return ENAMETOOLONG;
			out[n++] = '-';
			out[n++] = hex[*p >> 4];
			out[n++] = hex[*p & 15];
		}
	}
	out[n] = '\0';
	return 0;
}

int mdb_pmo_name(const char *path, char *out, size_t outsz)
{
	char dir[PATH_MAX], full[PATH_MAX];
	const char *slash, *base;
	size_t dlen;

	if (!path || !*path)
		return EINVAL;
	slash = strrchr(path, '/');
	if (!slash) {
		strcpy(dir, ".");
		base = path;
	} else {
		dlen = slash == path ? 1 : (size_t)(slash - path);
		if (dlen >= sizeof(dir))
			return ENAMETOOLONG;
		memcpy(dir, path, dlen);
		dir[dlen] = '\0';
		base = slash + 1;
	}
	if (!realpath(dir, full))
		return errno;
	dlen = strlen(full);
	if (dlen + 1 + strlen(base) >= sizeof(full))
		return ENAMETOOLONG;
	if (full[dlen - 1] != '/')	/* realpath("/") is "/" */
		full[dlen++] = '/';
	strcpy(full + dlen, base);
	return mdb_pmo_name_encode(full, out, outsz);
}
