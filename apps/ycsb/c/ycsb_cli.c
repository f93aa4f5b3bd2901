/*
 * ycsb_cli - ycsb_lmdb's command line (see ycsb_cli.h; the options are
 * described at the top of ycsb_lmdb.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ycsb.h"
#include "ycsb_cli.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: ycsb_lmdb --workload a..f --dir DIR [--file | --pmo KEYFILE]\n"
		"         [--records N] [--ops N] [--threads N] [--seed S] [--batch N]\n"
		"         [--load-batch N] [--phase load|run|both] [--write-all-fields]\n"
		"         [--verify] [--nosync] [--map-size SIZE] [--csv FILE] [--log-commits]\n"
		"       ycsb_lmdb --check [--dump] --dir DIR [--file | --pmo KEYFILE]\n");
	exit(2);
}

/* A decimal number with an optional K/M/G/T (binary) suffix, > 0. */
static uint64_t parse_num(const char *opt, const char *s, int suffix)
{
	char *end;
	unsigned long long v;
	unsigned int shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (suffix && *end) {
		switch (*end) {
		case 'K': case 'k': shift = 10; break;
		case 'M': case 'm': shift = 20; break;
		case 'G': case 'g': shift = 30; break;
		case 'T': case 't': shift = 40; break;
		default: shift = 64; break;
		}
		end++;
	}
	if (errno || end == s || *end || *s == '-' || shift >= 64 || v == 0 ||
	    v > (UINT64_MAX >> shift)) {
		fprintf(stderr, "ycsb_lmdb: bad number for %s: '%s'\n", opt, s);
		exit(2);
	}
	return (uint64_t)v << shift;
}

void parse_args(int argc, char **argv, struct config *cfg)
{
	enum { O_RECORDS = 256, O_OPS, O_THREADS, O_SEED, O_CSV, O_LOG, O_DIR, O_PMO, O_FILE,
	       O_BATCH, O_LBATCH, O_PHASE, O_WALL, O_VERIFY, O_NOSYNC, O_MAP, O_CHECK, O_DUMP };
	static const struct option opts[] = {
		{ "workload", required_argument, NULL, 'w' },
		{ "records", required_argument, NULL, O_RECORDS },
		{ "ops", required_argument, NULL, O_OPS },
		{ "threads", required_argument, NULL, O_THREADS },
		{ "seed", required_argument, NULL, O_SEED },
		{ "csv", required_argument, NULL, O_CSV },
		{ "log-commits", no_argument, NULL, O_LOG },
		{ "dir", required_argument, NULL, O_DIR },
		{ "pmo", required_argument, NULL, O_PMO },
		{ "file", no_argument, NULL, O_FILE },
		{ "batch", required_argument, NULL, O_BATCH },
		{ "load-batch", required_argument, NULL, O_LBATCH },
		{ "phase", required_argument, NULL, O_PHASE },
		{ "write-all-fields", no_argument, NULL, O_WALL },
		{ "verify", no_argument, NULL, O_VERIFY },
		{ "nosync", no_argument, NULL, O_NOSYNC },
		{ "map-size", required_argument, NULL, O_MAP },
		{ "check", no_argument, NULL, O_CHECK },
		{ "dump", no_argument, NULL, O_DUMP },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c, have_workload = 0, have_file = 0;

	memset(cfg, 0, sizeof(*cfg));
	cfg->records = 1000;
	cfg->ops = 1000;
	cfg->threads = 1;
	cfg->seed = 1;
	cfg->batch = 1;
	cfg->load_batch = 1000;
	cfg->load = cfg->run = 1;

	while ((c = getopt_long(argc, argv, "w:h", opts, NULL)) != -1) {
		switch (c) {
		case 'w':
			if (ycsb_workload_parse(optarg, &cfg->w)) {
				fprintf(stderr, "ycsb_lmdb: unknown workload '%s' (a..f)\n", optarg);
				exit(2);
			}
			have_workload = 1;
			break;
		case O_RECORDS: cfg->records = parse_num("--records", optarg, 0); break;
		case O_OPS: cfg->ops = parse_num("--ops", optarg, 0); break;
		case O_THREADS:
			cfg->threads = (uint32_t)parse_num("--threads", optarg, 0);
			if (cfg->threads > YCSB_MAX_THREADS) {
				fprintf(stderr, "ycsb_lmdb: at most %u threads\n", YCSB_MAX_THREADS);
				exit(2);
			}
			break;
		case O_SEED:
			/* 0 is a fine seed: parse it by hand. */
			cfg->seed = strcmp(optarg, "0") ? parse_num("--seed", optarg, 0) : 0;
			break;
		case O_CSV: cfg->csv = optarg; break;
		case O_LOG: cfg->log_commits = 1; break;
		case O_DIR: cfg->dir = optarg; break;
		case O_PMO: cfg->pmo_keyfile = optarg; break;
		case O_FILE: have_file = 1; break;
		case O_BATCH: cfg->batch = parse_num("--batch", optarg, 0); break;
		case O_LBATCH: cfg->load_batch = parse_num("--load-batch", optarg, 0); break;
		case O_PHASE:
			if (!strcmp(optarg, "load")) {
				cfg->load = 1;
				cfg->run = 0;
			} else if (!strcmp(optarg, "run")) {
				cfg->load = 0;
				cfg->run = 1;
			} else if (!strcmp(optarg, "both")) {
				cfg->load = cfg->run = 1;
			} else {
				usage();
			}
			break;
		case O_WALL: cfg->write_all = 1; break;
		case O_VERIFY: cfg->verify = 1; break;
		case O_NOSYNC: cfg->nosync = 1; break;
		case O_MAP: cfg->map_size = parse_num("--map-size", optarg, 1); break;
		case O_CHECK: cfg->check = 1; break;
		case O_DUMP: cfg->dump = 1; break;
		default: usage();
		}
	}
	if (optind != argc || !cfg->dir || (have_file && cfg->pmo_keyfile) ||
	    (!cfg->check && !have_workload) || (cfg->dump && !cfg->check) ||
	    cfg->batch > (1ULL << 24) || cfg->load_batch > (1ULL << 24) ||
	    cfg->records > YCSB_MAX_RECORDS || cfg->ops > YCSB_MAX_RECORDS)
		usage();
	if (cfg->w.dist == YCSB_DIST_LATEST && cfg->records < 2 && !cfg->check) {
		fprintf(stderr, "ycsb_lmdb: workload d needs at least 2 records\n");
		exit(2);
	}
	if (!cfg->map_size) {
		/* Room for the records, the run's inserts and LMDB's copy-on-write pages. */
		cfg->map_size = (64ULL << 20) + (cfg->records + cfg->ops) * 4096ULL;
	}
}

int read_key(const char *path, char key[KEY_FILE_MAX + 1])
{
	char buf[KEY_FILE_MAX + 3];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f) {
		fprintf(stderr, "ycsb_lmdb: key file %s: %s\n", path, strerror(errno));
		return -1;
	}
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	if (n && buf[n - 1] == '\n')
		n--;
	if (n && buf[n - 1] == '\r')
		n--;
	if (n == 0 || n > KEY_FILE_MAX || memchr(buf, '\0', n)) {
		fprintf(stderr, "ycsb_lmdb: key file %s: the key must be 1..%d bytes\n", path,
			KEY_FILE_MAX);
		return -1;
	}
	memcpy(key, buf, n);
	key[n] = '\0';
	return 0;
}
