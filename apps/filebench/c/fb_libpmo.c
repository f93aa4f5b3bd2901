/*
 * fb_libpmo.c - the libpmo backend (fb_libpmo.h).  libpmo reports errors as
 * -1/NULL and errno; the engine wants 0 or an errno value.
 */
#define _GNU_SOURCE
#include "fb_libpmo.h"

#include <errno.h>
#include <string.h>

static int errno_or_eio(void)
{
	return errno ? errno : EIO;
}

static int lp_create(void *ctx, const char *name, size_t size)
{
	struct fb_libpmo *b = ctx;

	errno = 0;
	return pcreate(name, size, b->key) < 0 ? errno_or_eio() : 0;
}

static int lp_destroy(void *ctx, const char *name)
{
	struct fb_libpmo *b = ctx;

	errno = 0;
	return pdestroy(name, b->key) < 0 ? errno_or_eio() : 0;
}

static void *lp_attach(void *ctx, const char *name, int writable, size_t *size)
{
	struct fb_libpmo *b = ctx;
	void *p = attach(name, writable ? PMO_WRITE : PMO_READ, b->key);

	if (!p)
		return NULL;
	*size = pmo_size(p);
	if (*size == 0) {
		int err = errno_or_eio();

		detach(p);
		errno = err;
		return NULL;
	}
	return p;
}

static int lp_sync(void *ctx, void *addr)
{
	(void)ctx;
	errno = 0;
	return psync(addr) < 0 ? errno_or_eio() : 0;
}

static int lp_detach(void *ctx, void *addr)
{
	(void)ctx;
	errno = 0;
	return detach(addr) < 0 ? errno_or_eio() : 0;
}

int fb_libpmo_init(struct fb_libpmo *b, const char *key, struct fb_pmo_ops *ops)
{
	size_t n = key ? strlen(key) : 0;

	if (n == 0 || n > PMO_KEY_MAX)
		return EINVAL;
	memcpy(b->key, key, n + 1);
	ops->create = lp_create;
	ops->destroy = lp_destroy;
	ops->attach = lp_attach;
	ops->sync = lp_sync;
	ops->detach = lp_detach;
	ops->ctx = b;
	return 0;
}

void fb_libpmo_wipe(struct fb_libpmo *b)
{
	explicit_bzero(b->key, sizeof(b->key));
}
