/*
 * fb_host - the Filebench personalities on the TEST file backend (fb_files.h):
 * one ordinary file per "PMO" in --dir, msync as psync (not atomic, not
 * encrypted).  Same options as fb_pmo (fb_cli.c), plus --dir DIR.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fb_cli.h"
#include "fb_files.h"

struct host {
	const char *dir;
	struct fb_files *files;
};

static int host_option(void *ctx, int argc, char **argv, int i)
{
	struct host *h = ctx;

	if (strcmp(argv[i], "--dir"))
		return 0;
	if (i + 1 >= argc) {
		fputs("fb_host: --dir needs a value\n", stderr);
		return -1;
	}
	h->dir = argv[i + 1];
	return 2;
}

static int host_open(void *ctx, struct fb_pmo_ops *ops)
{
	struct host *h = ctx;

	if (!h->dir) {
		fputs("fb_host: need --dir DIR\n", stderr);
		return EINVAL;
	}
	h->files = fb_files_open(h->dir);
	if (!h->files)
		return errno;
	fb_files_ops(h->files, ops);
	return 0;
}

static void host_close(void *ctx)
{
	struct host *h = ctx;

	fb_files_close(h->files);
	h->files = NULL;
}

int main(int argc, char **argv)
{
	static struct host h;
	const struct fb_cli_backend b = {
		.prog = "fb_host",
		.usage = "  --dir DIR          directory of the test backend's files (required)\n",
		.option = host_option,
		.open = host_open,
		.close = host_close,
		.ctx = &h,
	};

	return fb_cli_main(argc, argv, &b);
}
