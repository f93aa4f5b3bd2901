/*
 * fb_cli.c - the drivers' command line (fb_cli.h).
 *
 *   PROG --personality P [--full] [--files N] [--threads N] [--ops N]
 *        [--seconds S] [--seed S] [--mean-size SIZE] [--file-cap SIZE]
 *        [--log-cap SIZE] [--prefix NAME] [--csv FILE] [--check]
 *        [--check-only] [--list] [--log-psyncs] [--keep] [--verify-reads]
 *        BACKEND-OPTIONS
 *
 * Without --check-only: prepare the fileset (prealloc), run, print the
 * report, optionally check every file against what the run did, and destroy
 * the files unless --keep.  --check-only verifies the files a previous run
 * left (e.g. one a VMM restart interrupted) without expectations.
 * --log-psyncs prints "creating NAME", "syncing NAME LEN" and "destroying NAME"
 * before each create, psync and destroy, and "create NAME", "psync NAME LEN"
 * and "destroy NAME" after it succeeded, flushed line by line (the crash rule
 * in ../README.md says what a log cut by a crash promises).
 */
#define _POSIX_C_SOURCE 200809L
#include "fb_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cli {
	struct fb_config cfg;
	const char *personality;
	int full;
	/* Overrides; 0 / NULL: the scale's default. */
	uint64_t files, threads, ops, seconds, seed, mean, file_cap, log_cap;
	int have_seed, have_ops, have_seconds;
	const char *prefix;
	const char *csv;
	int check, check_only, list, log_psyncs, keep, verify_reads;
};

static const char *prog = "fb";

static void usage(const struct fb_cli_backend *b)
{
	fprintf(stderr,
		"usage: %s --personality fileserver|varmail|webproxy|webserver [options]\n"
		"  --full             Filebench's sizes (nfiles, 16..100 threads, 60 s) instead of\n"
		"                     the small default (nfiles/10, 4 threads, 5000 flowops)\n"
		"  --files N          entries of the fileset\n"
		"  --threads N        worker threads\n"
		"  --ops N            flowops to run (rounded up to whole loops)\n"
		"  --seconds S        run time instead of --ops\n"
		"  --seed S           seed of every random choice (default 1)\n"
		"  --mean-size SIZE   mean file size (K, M, G suffixes)\n"
		"  --file-cap SIZE    bytes of each file's PMO (multiple of 4096)\n"
		"  --log-cap SIZE     bytes of the webserver log's PMO\n"
		"  --prefix NAME      PMO names NAME.<index> (default fb.<personality>)\n"
		"  --csv FILE         also write the result as CSV\n"
		"  --check            after the run verify every file against the run\n"
		"  --check-only       only verify the files an earlier run left\n"
		"  --list             with a check: one line per file\n"
		"  --log-psyncs       print creating/create, syncing/psync, destroying/destroy\n"
		"                     lines before and after each such call\n"
		"  --keep             leave the files (default: destroy them at the end)\n"
		"  --verify-reads     check the data of every read\n"
		"%s",
		prog, b->usage ? b->usage : "");
}

static void die_msg(const char *fmt, const char *a, const char *c)
{
	fprintf(stderr, "%s: ", prog);
	fprintf(stderr, fmt, a, c);
	fputc('\n', stderr);
}

int fb_cli_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (!s || !*s || *s == '-')
		return EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return EINVAL;
	if (*end == 'K' || *end == 'k')
		mul = 1024ull;
	else if (*end == 'M' || *end == 'm')
		mul = 1024ull * 1024;
	else if (*end == 'G' || *end == 'g')
		mul = 1024ull * 1024 * 1024;
	else if (*end)
		return EINVAL;
	if (mul > 1 && end[1])
		return EINVAL;
	if (v > UINT64_MAX / mul)
		return EINVAL;
	*out = v * mul;
	return 0;
}

/* Print event lines: one locked, flushed line each. */
static void print_event(void *ctx, uint32_t kind, const char *name, uint64_t len)
{
	(void)ctx;
	static const char *const words[] = { "?", "create", "psync", "destroy",
					     "creating", "syncing", "destroying" };
	const char *w = kind < sizeof(words) / sizeof(words[0]) ? words[kind] : "?";

	flockfile(stdout);
	if (kind == FB_EV_PSYNC || kind == FB_EV_PSYNC_BEGIN)
		printf("%s %s %llu\n", w, name, (unsigned long long)len);
	else
		printf("%s %s\n", w, name);
	fflush(stdout);
	funlockfile(stdout);
}

static const char *status_name(uint32_t s)
{
	static const char *const names[] = { "ok", "absent", "bad-header", "bad-data",
					     "bad-tail", "wrong-length", "wrong-presence", "error" };

	return s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

static void print_check_line(void *ctx, const char *name, int present, uint64_t len,
			     uint32_t status)
{
	(void)ctx;
	printf("check %s %s %llu %s\n", name, present ? "present" : "absent",
	       (unsigned long long)len, status_name(status));
}

static int print_check(const char *what, const struct fb_check_result *r)
{
	int ok = fb_check_ok(r);

	printf("Check (%s): %s: %llu entries, %llu present (%llu empty), %llu B verified; "
	       "%llu bad headers, %llu bad data, %llu bad tails, %llu wrong lengths, "
	       "%llu wrong presence, %llu errors\n",
	       what, ok ? "OK" : "FAILED", (unsigned long long)r->entries,
	       (unsigned long long)r->present, (unsigned long long)r->empty,
	       (unsigned long long)r->bytes, (unsigned long long)r->bad_header,
	       (unsigned long long)r->bad_data, (unsigned long long)r->bad_tail,
	       (unsigned long long)r->wrong_length, (unsigned long long)r->wrong_presence,
	       (unsigned long long)r->errors);
	fflush(stdout);
	return ok;
}

/* Parse the common options; 0, or 2 for a usage error. */
static int parse(struct cli *c, int argc, char **argv, const struct fb_cli_backend *b)
{
	static const struct {
		const char *flag;
		size_t field;	/* offsetof the uint64_t in struct cli */
		int size;	/* accepts K/M/G */
	} nums[] = {
		{ "--files", offsetof(struct cli, files), 0 },
		{ "--threads", offsetof(struct cli, threads), 0 },
		{ "--ops", offsetof(struct cli, ops), 0 },
		{ "--seconds", offsetof(struct cli, seconds), 0 },
		{ "--seed", offsetof(struct cli, seed), 0 },
		{ "--mean-size", offsetof(struct cli, mean), 1 },
		{ "--file-cap", offsetof(struct cli, file_cap), 1 },
		{ "--log-cap", offsetof(struct cli, log_cap), 1 },
	};
	static const struct {
		const char *flag;
		size_t field;	/* offsetof the int in struct cli */
	} flags[] = {
		{ "--full", offsetof(struct cli, full) },
		{ "--check", offsetof(struct cli, check) },
		{ "--check-only", offsetof(struct cli, check_only) },
		{ "--list", offsetof(struct cli, list) },
		{ "--log-psyncs", offsetof(struct cli, log_psyncs) },
		{ "--keep", offsetof(struct cli, keep) },
		{ "--verify-reads", offsetof(struct cli, verify_reads) },
	};

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int used = 0;

		for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]) && !used; k++)
			if (strcmp(a, flags[k].flag) == 0) {
				*(int *)((char *)c + flags[k].field) = 1;
				used = 1;
			}
		for (size_t k = 0; k < sizeof(nums) / sizeof(nums[0]) && !used; k++) {
			uint64_t v;
			char *end;

			if (strcmp(a, nums[k].flag))
				continue;
			if (i + 1 >= argc) {
				die_msg("%s needs a value%s", a, "");
				return 2;
			}
			if (nums[k].size) {
				if (fb_cli_size(argv[i + 1], &v)) {
					die_msg("bad size for %s: %s", a, argv[i + 1]);
					return 2;
				}
			} else {
				errno = 0;
				v = strtoull(argv[i + 1], &end, 10);
				if (errno || end == argv[i + 1] || *end || argv[i + 1][0] == '-') {
					die_msg("bad number for %s: %s", a, argv[i + 1]);
					return 2;
				}
			}
			*(uint64_t *)((char *)c + nums[k].field) = v;
			c->have_seed |= strcmp(a, "--seed") == 0;
			c->have_ops |= strcmp(a, "--ops") == 0;
			c->have_seconds |= strcmp(a, "--seconds") == 0;
			used = 2;
		}
		if (!used && (strcmp(a, "--personality") == 0 || strcmp(a, "--prefix") == 0 ||
			      strcmp(a, "--csv") == 0)) {
			if (i + 1 >= argc) {
				die_msg("%s needs a value%s", a, "");
				return 2;
			}
			if (a[2] == 'p' && a[3] == 'e')
				c->personality = argv[i + 1];
			else if (a[2] == 'p')
				c->prefix = argv[i + 1];
			else
				c->csv = argv[i + 1];
			used = 2;
		}
		if (!used && b->option) {
			used = b->option(b->ctx, argc, argv, i);
			if (used < 0)
				return 2;
		}
		if (!used) {
			if (strcmp(a, "--help") && strcmp(a, "-h"))
				die_msg("unknown option %s%s", a, "");
			usage(b);
			return 2;
		}
		i += used - 1;
	}
	if (!c->personality) {
		usage(b);
		return 2;
	}
	return 0;
}

/* Build the configuration from the options; 0 or 2. */
static int configure(struct cli *c)
{
	int p = fb_personality_by_name(c->personality);
	char err[128];

	if (p < 0) {
		die_msg("unknown personality %s%s", c->personality, "");
		return 2;
	}
	fb_config_init(&c->cfg, (uint32_t)p, c->full ? FB_SCALE_FULL : FB_SCALE_SMALL);
	if (c->files)
		c->cfg.nfiles = c->files > UINT32_MAX ? UINT32_MAX : (uint32_t)c->files;
	if (c->threads)
		c->cfg.nthreads = c->threads > UINT32_MAX ? UINT32_MAX : (uint32_t)c->threads;
	if (c->have_ops)
		c->cfg.ops = c->ops;
	if (c->have_seconds) {
		c->cfg.seconds = c->seconds;
		if (!c->have_ops)
			c->cfg.ops = 0;
	}
	if (c->have_seed)
		c->cfg.seed = c->seed;
	if (c->mean) {
		c->cfg.meanfilesize = c->mean;
		c->cfg.file_cap = fb_default_file_cap(c->mean, c->cfg.appendsize);
	}
	if (c->file_cap)
		c->cfg.file_cap = c->file_cap;
	if (c->log_cap)
		c->cfg.log_cap = c->log_cap;
	if (c->prefix) {
		if (strlen(c->prefix) > FB_PREFIX_MAX) {
			die_msg("prefix %s is longer than 47 bytes%s", c->prefix, "");
			return 2;
		}
		snprintf(c->cfg.prefix, sizeof(c->cfg.prefix), "%s", c->prefix);
	}
	c->cfg.verify_reads = (uint32_t)c->verify_reads;
	if (c->log_psyncs)
		c->cfg.event = print_event;
	if (fb_config_check(&c->cfg, err, sizeof(err))) {
		die_msg("%s%s", err, "");
		return 2;
	}
	return 0;
}

static int write_csv(const char *path, const struct fb_result *res)
{
	size_t n = fb_format(res, 1, NULL, 0);
	char *buf = malloc(n + 1);
	FILE *f;
	int err = 0;

	if (!buf)
		return ENOMEM;
	fb_format(res, 1, buf, n + 1);
	f = fopen(path, "w");
	if (!f) {
		err = errno;
	} else {
		if (fputs(buf, f) == EOF)
			err = errno ? errno : EIO;
		if (fclose(f) && !err)
			err = errno;
	}
	free(buf);
	return err;
}

static void print_report(const struct fb_result *res)
{
	size_t n = fb_format(res, 0, NULL, 0);
	char *buf = malloc(n + 1);

	if (!buf)
		return;
	fb_format(res, 0, buf, n + 1);
	fputs(buf, stdout);
	fflush(stdout);
	free(buf);
}

int fb_cli_main(int argc, char **argv, const struct fb_cli_backend *b)
{
	struct cli c;
	struct fb_pmo_ops ops;
	struct fb_fileset *fs = NULL;
	struct fb_result *res = NULL;
	struct fb_check_result chk;
	int rc, err;

	prog = b->prog;
	memset(&c, 0, sizeof(c));
	rc = parse(&c, argc, argv, b);
	if (!rc)
		rc = configure(&c);
	if (rc)
		return rc;
	err = b->open(b->ctx, &ops);
	if (err) {
		fprintf(stderr, "%s: backend: %s\n", prog, strerror(err));
		return 1;
	}
	rc = 1;
	res = calloc(1, sizeof(*res));
	fs = res ? fb_fileset_new(&c.cfg, &ops) : NULL;
	if (!fs) {
		fprintf(stderr, "%s: fileset: %s\n", prog, strerror(errno ? errno : ENOMEM));
		goto out;
	}
	printf("Filebench %s on PMOs: %u files (mean %llu B, gamma %.1f, PMO %llu B), "
	       "%u threads, %s %llu, seed %llu, prefix %s\n",
	       c.personality, c.cfg.nfiles, (unsigned long long)c.cfg.meanfilesize,
	       c.cfg.sizegamma_milli / 1000.0, (unsigned long long)c.cfg.file_cap,
	       c.cfg.nthreads, c.cfg.ops ? "ops" : "seconds",
	       (unsigned long long)(c.cfg.ops ? c.cfg.ops : c.cfg.seconds),
	       (unsigned long long)c.cfg.seed, c.cfg.prefix);
	fflush(stdout);
	if (c.check_only) {
		err = fb_check(fs, FB_CHECK_DISCOVER, &chk, c.list ? print_check_line : NULL, NULL);
		if (err) {
			fprintf(stderr, "%s: check: %s\n", prog, strerror(err));
			goto out;
		}
		rc = print_check("discover", &chk) ? 0 : 3;
		goto out;
	}
	err = fb_prepare(fs, res);
	if (err) {
		fprintf(stderr, "%s: %s\n", prog, fb_fileset_error(fs));
		goto out;
	}
	printf("Prepared %llu files (%llu B)\n", (unsigned long long)res->prepare.creates,
	       (unsigned long long)res->prepare.bytes_written);
	fflush(stdout);
	err = fb_run_fileset(fs, res);
	print_report(res);
	if (err) {
		fprintf(stderr, "%s: run: %s\n", prog, res->error);
		goto out;
	}
	if (c.csv) {
		err = write_csv(c.csv, res);
		if (err) {
			fprintf(stderr, "%s: %s: %s\n", prog, c.csv, strerror(err));
			goto out;
		}
	}
	rc = 0;
	if (c.check) {
		err = fb_check(fs, FB_CHECK_EXPECT, &chk, c.list ? print_check_line : NULL, NULL);
		if (err) {
			fprintf(stderr, "%s: check: %s\n", prog, strerror(err));
			rc = 1;
			goto out;
		}
		if (!print_check("expect", &chk))
			rc = 3;
	}
	if (!c.keep) {
		err = fb_cleanup(fs);
		if (err) {
			fprintf(stderr, "%s: cleanup: %s\n", prog, fb_fileset_error(fs));
			rc = rc ? rc : 1;
		}
	}
out:
	fb_fileset_free(fs);
	free(res);
	if (b->close)
		b->close(b->ctx);
	return rc;
}
