/*
 * fb_check.c - verify the files of a fileset: each present file's header,
 * its data (the pattern of (fileset, index, offset)) and the zero bytes after
 * its length.  In expect mode presence and length must also match what the
 * engine did; in discover mode (after a crash) they are learned.
 *
 * Why the zero tail matters: the engine writes data and the new length
 * together and never writes past the length, so at every psync the bytes
 * after the length are zero.  A PMO restored to anything but one psync'ed
 * state (a mix of two) shows data past its length or a length past its data.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <string.h>

#include "fb_data.h"
#include "fb_internal.h"

/* Non-zero when @n bytes at @p are all zero. */
static int all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

/* Check one entry; returns its enum fb_check_status and updates @e in discover mode. */
static uint32_t check_one(struct fb_fileset *fs, uint32_t set, uint32_t index,
			  struct fb_entry *e, uint32_t mode, struct fb_check_result *r,
			  const char *name, int *present, uint64_t *len)
{
	const struct fb_pmo_ops *o = &fs->ops;
	uint32_t status = FB_CHECK_OK;
	size_t size = 0;
	uint8_t *base;
	int h;

	*present = 0;
	*len = 0;
	r->entries++;
	errno = 0;
	base = o->attach(o->ctx, name, 0, &size);
	if (!base) {
		int err = errno ? errno : EIO;

		if (err != ENOENT) {
			r->errors++;
			return FB_CHECK_ERROR;
		}
		if (mode == FB_CHECK_DISCOVER) {
			e->exists = 0;
			e->len = 0;
		} else if (e->exists) {
			r->wrong_presence++;
			return FB_CHECK_WRONG_PRESENCE;
		}
		return FB_CHECK_MISSING;
	}
	*present = 1;
	r->present++;
	h = fb_header_read(base, size, set, index, len);
	if (h == FB_HDR_BAD) {
		r->bad_header++;
		status = FB_CHECK_BAD_HEADER;
	} else if (mode == FB_CHECK_EXPECT && !e->exists) {
		r->wrong_presence++;
		status = FB_CHECK_WRONG_PRESENCE;
	} else if (mode == FB_CHECK_EXPECT && *len != e->len) {
		r->wrong_length++;
		status = FB_CHECK_WRONG_LENGTH;
	} else if (fb_pattern_check(base + FB_HDR_SIZE, set, index, 0, *len) >= 0) {
		r->bad_data++;
		status = FB_CHECK_BAD_DATA;
	} else if (!all_zero(base + FB_HDR_SIZE + *len, size - FB_HDR_SIZE - *len)) {
		r->bad_tail++;
		status = FB_CHECK_BAD_TAIL;
	} else {
		r->bytes += *len;
		r->empty += h == FB_HDR_EMPTY;
	}
	if (mode == FB_CHECK_DISCOVER) {
		e->exists = 1;
		e->len = *len;
	}
	if (o->detach(o->ctx, base)) {
		r->errors++;
		if (status == FB_CHECK_OK)
			status = FB_CHECK_ERROR;
	}
	return status;
}

int fb_check(struct fb_fileset *fs, uint32_t mode, struct fb_check_result *out,
	     void (*each)(void *ctx, const char *name, int present, uint64_t len, uint32_t status),
	     void *ctx)
{
	uint32_t n = fs->cfg.nfiles + (fs->def->has_log ? 1 : 0);

	if (mode != FB_CHECK_EXPECT && mode != FB_CHECK_DISCOVER)
		return EINVAL;
	memset(out, 0, sizeof(*out));
	for (uint32_t i = 0; i < n; i++) {
		int log = i == fs->cfg.nfiles, present;
		uint32_t set = log ? FB_SET_LOG : FB_SET_MAIN, index = log ? 0 : i, status;
		struct fb_entry *e = log ? &fs->log.e : &fs->e[i];
		char name[64];
		uint64_t len;

		fb_entry_name(fs, set, index, name);
		status = check_one(fs, set, index, e, mode, out, name, &present, &len);
		if (each)
			each(ctx, name, present, len, status);
	}
	return 0;
}

int fb_check_ok(const struct fb_check_result *r)
{
	return !r->bad_header && !r->bad_data && !r->bad_tail && !r->wrong_length &&
	       !r->wrong_presence && !r->errors;
}
