/*
 * fb_pmo - the Filebench personalities on PMOs in the guest (libpmo).
 *
 *   fb_pmo --personality varmail [--files N] [--threads N] [--ops N] [--seed S]
 *          [--key-file F] [--design D] [--csv F] [--check] [--check-only]
 *          [--log-psyncs] [--keep] ...      (fb_cli.c lists every option)
 *
 * One PMO per file, named "<prefix>.<index>" (default prefix
 * fb.<personality>), all under one key: the first line of --key-file, or
 * $PMO_KEY.  The key is never printed and is wiped before exit.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb_cli.h"
#include "fb_libpmo.h"

struct guest {
	const char *key_file;
	const char *design;
	struct fb_libpmo lp;
};

static int guest_option(void *ctx, int argc, char **argv, int i)
{
	struct guest *g = ctx;

	if (strcmp(argv[i], "--key-file") && strcmp(argv[i], "--design"))
		return 0;
	if (i + 1 >= argc) {
		fprintf(stderr, "fb_pmo: %s needs a value\n", argv[i]);
		return -1;
	}
	if (argv[i][2] == 'k')
		g->key_file = argv[i + 1];
	else
		g->design = argv[i + 1];
	return 2;
}

/* The first line of @path into @key (PMO_KEY_MAX + 1 bytes). */
static int read_key(const char *path, char *key)
{
	char line[PMO_KEY_MAX + 3];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return errno;
	if (!fgets(line, sizeof(line), f)) {
		fclose(f);
		return EINVAL;
	}
	fclose(f);
	n = strcspn(line, "\r\n");
	line[n] = '\0';
	if (n == 0 || n > PMO_KEY_MAX) {
		memset(line, 0, sizeof(line));
		return EINVAL;
	}
	memcpy(key, line, n + 1);
	memset(line, 0, sizeof(line));
	return 0;
}

static int guest_open(void *ctx, struct fb_pmo_ops *ops)
{
	struct guest *g = ctx;
	char key[PMO_KEY_MAX + 1];
	const char *env = getenv("PMO_KEY");
	int err;

	if (g->key_file) {
		err = read_key(g->key_file, key);
		if (err) {
			fprintf(stderr, "fb_pmo: key file %s: %s\n", g->key_file,
				err == EINVAL ? "need 1..64 bytes on its first line" :
				strerror(err));
			return err;
		}
	} else if (env && *env && strlen(env) <= PMO_KEY_MAX) {
		strcpy(key, env);
	} else {
		fputs("fb_pmo: need a key of 1..64 bytes (--key-file or $PMO_KEY)\n", stderr);
		return EINVAL;
	}
	err = fb_libpmo_init(&g->lp, key, ops);
	memset(key, 0, sizeof(key));
	if (err)
		return err;
	if (g->design && pmo_set_design(g->design) < 0) {
		err = errno;
		fprintf(stderr, "fb_pmo: design %s: %s\n", g->design, strerror(err));
		fb_libpmo_wipe(&g->lp);
		return err;
	}
	return 0;
}

static void guest_close(void *ctx)
{
	struct guest *g = ctx;

	fb_libpmo_wipe(&g->lp);
}

int main(int argc, char **argv)
{
	static struct guest g;
	const struct fb_cli_backend b = {
		.prog = "fb_pmo",
		.usage = "  --key-file F       the PMOs' key: first line of F (default $PMO_KEY)\n"
			 "  --design D         select the host's PMO design first (wedi, sp-id, d, ...)\n",
		.option = guest_option,
		.open = guest_open,
		.close = guest_close,
		.ctx = &g,
	};

	return fb_cli_main(argc, argv, &b);
}
