/*
 * fb_cli.h - the command line of the drivers (fb_pmo in the guest, fb_host
 * on the file backend): options, prepare, run, report, check, cleanup.
 */
#ifndef FB_CLI_H
#define FB_CLI_H

#include "fb.h"

/* What a driver adds: its own options and its backend. */
struct fb_cli_backend {
	const char *prog;	/* program name for messages */
	const char *usage;	/* its options, for the usage text */
	/*
	 * Consume the option at argv[i] (and its value): the number of
	 * arguments used, 0 when it is not the backend's, -1 on a bad value.
	 */
	int (*option)(void *ctx, int argc, char **argv, int i);
	/* Set the backend up after the options: 0 or an errno value. */
	int (*open)(void *ctx, struct fb_pmo_ops *ops);
	void (*close)(void *ctx);
	void *ctx;
};

/*
 * Run the command line.  Exit status: 0 ok, 1 error (one "PROG: ..." line on
 * stderr), 2 usage, 3 the check found damage.
 */
int fb_cli_main(int argc, char **argv, const struct fb_cli_backend *b);

/* Parse a size: digits with an optional K, M or G (binary); 0 or EINVAL. */
int fb_cli_size(const char *s, uint64_t *out);

#endif /* FB_CLI_H */
