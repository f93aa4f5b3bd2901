/*
 * test_fb - unit tests of the engine on the file backend.
 *
 *   test_fb DIR      (DIR is created; each test uses and empties a subdirectory)
 *
 * Every check compares real values (counts, bytes, file contents); none
 * depends on wall-clock time.  Exit status 0 when all pass.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fb_data.h"
#include "fb_files.h"
#include "fb_internal.h"
#include "test_util.h"

int failures, checks;
static char base_dir[1024];

const char *fresh_dir(const char *name)
{
	static char path[1200];
	DIR *d;
	struct dirent *de;

	snprintf(path, sizeof(path), "%s/%s", base_dir, name);
	mkdir(path, 0700);
	d = opendir(path);
	if (d) {
		while ((de = readdir(d))) {
			char f[1500];

			if (de->d_name[0] == '.')
				continue;
			snprintf(f, sizeof(f), "%s/%s", path, de->d_name);
			unlink(f);
		}
		closedir(d);
	}
	return path;
}

/* Number of files in @dir whose names start with @prefix. */
static unsigned count_files(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	unsigned n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)))
		n += strncmp(de->d_name, prefix, strlen(prefix)) == 0;
	closedir(d);
	return n;
}

/* A small configuration of @p for tests. */
static void small_cfg(struct fb_config *cfg, uint32_t p, uint32_t nfiles, uint32_t threads,
		      uint64_t ops)
{
	fb_config_init(cfg, p, FB_SCALE_SMALL);
	cfg->nfiles = nfiles;
	cfg->nthreads = threads;
	cfg->ops = ops;
	cfg->meanfilesize = 4096;
	cfg->appendsize = 2048;
	cfg->iosize = 1024;
	cfg->file_cap = fb_default_file_cap(cfg->meanfilesize, cfg->appendsize);
	cfg->log_cap = 1024 * 1024;
	cfg->verify_reads = 1;
}

static void test_write_shares(void)
{
	static const uint32_t want[FB_NPERSONALITIES][3] = {
		/* writes, read+write flowops, flowops per loop */
		[FB_FILESERVER] = { 2, 3, 11 },
		[FB_VARMAIL] = { 2, 4, 13 },
		[FB_WEBPROXY] = { 1, 6, 19 },
		[FB_WEBSERVER] = { 1, 11, 31 },
	};
	uint32_t w, io;

	for (uint32_t p = 0; p < FB_NPERSONALITIES; p++) {
		CHECK_EQ(fb_write_share(p, &w, &io), 0);
		CHECK_EQ(w, want[p][0]);
		CHECK_EQ(io, want[p][1]);
		CHECK_EQ(fb_loop_len(p), want[p][2]);
	}
	CHECK_EQ(fb_write_share(FB_NPERSONALITIES, &w, &io), EINVAL);
	/* The percentages LPMO quotes: 67, 50, 16 (1/6 truncated), 9. */
	fb_write_share(FB_FILESERVER, &w, &io);
	CHECK_EQ(100 * w / io, 66);
	CHECK_EQ((100 * w + io / 2) / io, 67);
	fb_write_share(FB_VARMAIL, &w, &io);
	CHECK_EQ(100 * w / io, 50);
	fb_write_share(FB_WEBPROXY, &w, &io);
	CHECK_EQ(100 * w / io, 16);
	fb_write_share(FB_WEBSERVER, &w, &io);
	CHECK_EQ(100 * w / io, 9);
}

static void test_open_modes(void)
{
	const struct fb_personality_def *d;

	d = fb_personality_def(FB_FILESERVER);
	CHECK_EQ(fb_open_writable(d, 3), 1);	/* openfile1 -> appendfilerand1 */
	CHECK_EQ(fb_open_writable(d, 6), 0);	/* openfile2 -> readfile1 */
	d = fb_personality_def(FB_VARMAIL);
	CHECK_EQ(fb_open_writable(d, 5), 1);	/* openfile3 -> read, append, fsync */
	CHECK_EQ(fb_open_writable(d, 10), 0);	/* openfile4 -> read */
	d = fb_personality_def(FB_WEBPROXY);
	for (uint32_t i = 0; i < d->nflowops; i++)
		if (d->flowops[i].op == FB_OP_OPEN)
			CHECK_EQ(fb_open_writable(d, i), 0);
	d = fb_personality_def(FB_WEBSERVER);
	for (uint32_t i = 0; i < d->nflowops; i++)
		if (d->flowops[i].op == FB_OP_OPEN)
			CHECK_EQ(fb_open_writable(d, i), 0);
}

static void test_gamma(void)
{
	struct fb_rng r;
	const int n = 40000;
	const double mean = 16384.0;
	double sum = 0, sq = 0, m, var;

	fb_rng_seed(&r, 42, 0);
	for (int i = 0; i < n; i++) {
		double x = (double)fb_gamma_size(&r, 16384, 1500);

		sum += x;
		sq += x * x;
	}
	m = sum / n;
	var = sq / n - m * m;
	/* Mean within 2% (its standard error is 0.4%); variance mean^2/1.5 within 10%. */
	CHECK(fabs(m - mean) / mean < 0.02);
	CHECK(fabs(var - mean * mean / 1.5) / (mean * mean / 1.5) < 0.10);
	/* Shape 1 is exponential: variance mean^2. */
	sum = sq = 0;
	for (int i = 0; i < n; i++) {
		double x = (double)fb_gamma_size(&r, 16384, 1000);

		sum += x;
		sq += x * x;
	}
	m = sum / n;
	var = sq / n - m * m;
	CHECK(fabs(m - mean) / mean < 0.02);
	CHECK(fabs(var - mean * mean) / (mean * mean) < 0.10);
	/* Shape 0: Filebench's fixed size. */
	CHECK_EQ(fb_gamma_size(&r, 16384, 0), 16384);
	/* Uniform picks stay in range and hit both ends. */
	{
		int lo = 0, hi = 0;

		for (int i = 0; i < 10000; i++) {
			uint64_t v = fb_rng_below(&r, 7);

			CHECK(v < 7);
			lo += v == 0;
			hi += v == 6;
		}
		CHECK(lo > 1000 && hi > 1000);
	}
}

static void test_header_and_pattern(void)
{
	uint8_t buf[8192], d[300];
	uint64_t len;

	memset(buf, 0, sizeof(buf));
	CHECK_EQ(fb_header_read(buf, sizeof(buf), 0, 5, &len), FB_HDR_EMPTY);
	fb_header_write(buf, 0, 5, 100, sizeof(buf) - FB_HDR_SIZE);
	CHECK_EQ(fb_header_read(buf, sizeof(buf), 0, 5, &len), FB_HDR_VALID);
	CHECK_EQ(len, 100);
	CHECK_EQ(fb_header_read(buf, sizeof(buf), 0, 6, &len), FB_HDR_BAD);	/* other index */
	CHECK_EQ(fb_header_read(buf, sizeof(buf), 1, 5, &len), FB_HDR_BAD);	/* other set */
	CHECK_EQ(fb_header_read(buf, 4096, 0, 5, &len), FB_HDR_BAD);	/* other capacity */
	buf[24] ^= 1;	/* the length: checksum no longer matches */
	CHECK_EQ(fb_header_read(buf, sizeof(buf), 0, 5, &len), FB_HDR_BAD);
	fb_header_write(buf, 0, 5, sizeof(buf), sizeof(buf) - FB_HDR_SIZE);	/* len > cap */
	CHECK_EQ(fb_header_read(buf, sizeof(buf), 0, 5, &len), FB_HDR_BAD);

	/* The pattern is a function of (set, index, offset), whatever the pieces. */
	fb_pattern_fill(d, 0, 3, 0, sizeof(d));
	CHECK(fb_pattern_check(d, 0, 3, 0, sizeof(d)) < 0);
	CHECK(fb_pattern_check(d + 13, 0, 3, 13, 200) < 0);
	{
		uint8_t e[300];

		fb_pattern_fill(e, 0, 3, 0, 5);
		fb_pattern_fill(e + 5, 0, 3, 5, 123);
		fb_pattern_fill(e + 128, 0, 3, 128, 172);
		CHECK(memcmp(d, e, sizeof(d)) == 0);
	}
	CHECK(fb_pattern_check(d, 0, 4, 0, sizeof(d)) == 0);	/* another file */
	d[77] ^= 0x10;
	CHECK_EQ(fb_pattern_check(d, 0, 3, 0, sizeof(d)), 77);
}

static void test_config_check(void)
{
	struct fb_config c;
	char err[128];

	CHECK_EQ(fb_config_init(&c, FB_VARMAIL, FB_SCALE_FULL), 0);
	CHECK_EQ(c.nfiles, 1000);
	CHECK_EQ(c.nthreads, 16);
	CHECK_EQ(c.prealloc_pct, 80);
	CHECK_EQ(c.meanfilesize, 16384);
	CHECK_EQ(c.file_cap % 4096, 0);
	CHECK_EQ(fb_config_check(&c, err, sizeof(err)), 0);
	CHECK_EQ(fb_config_init(&c, FB_FILESERVER, FB_SCALE_SMALL), 0);
	CHECK_EQ(c.nfiles, 1000);
	CHECK_EQ(c.nthreads, 4);
	CHECK_EQ(c.ops, 5000);
	CHECK_EQ(c.meanfilesize, 128 * 1024);
	CHECK(strcmp(c.prefix, "fb.fileserver") == 0);
	c.nthreads = 0;
	CHECK_EQ(fb_config_check(&c, err, sizeof(err)), EINVAL);
	CHECK(strstr(err, "nthreads") != NULL);
	fb_config_init(&c, FB_FILESERVER, FB_SCALE_SMALL);
	strcpy(c.prefix, ".hidden");
	CHECK_EQ(fb_config_check(&c, err, sizeof(err)), EINVAL);
	strcpy(c.prefix, "a/b");
	CHECK_EQ(fb_config_check(&c, err, sizeof(err)), EINVAL);
	fb_config_init(&c, FB_FILESERVER, FB_SCALE_SMALL);
	c.file_cap = 5000;
	CHECK_EQ(fb_config_check(&c, err, sizeof(err)), EINVAL);
	CHECK_EQ(fb_config_init(&c, 9, FB_SCALE_SMALL), EINVAL);
	CHECK_EQ(fb_personality_by_name("webproxy"), FB_WEBPROXY);
	CHECK_EQ(fb_personality_by_name("nope"), -1);
}

/* Run @cfg on a fresh directory @name; the fileset and backend stay for inspection. */
struct bench {
	struct fb_files *files;
	struct fb_pmo_ops ops;
	struct fb_fileset *fs;
	struct fb_result res;
	const char *dir;
	int prep_err, run_err;
};

static void bench_run(struct bench *b, const char *name, const struct fb_config *cfg)
{
	memset(b, 0, sizeof(*b));
	b->dir = fresh_dir(name);
	b->files = fb_files_open(b->dir);
	CHECK(b->files != NULL);
	fb_files_ops(b->files, &b->ops);
	b->fs = fb_fileset_new(cfg, &b->ops);
	CHECK(b->fs != NULL);
	if (!b->fs)
		return;
	b->prep_err = fb_prepare(b->fs, &b->res);
	CHECK_EQ(b->prep_err, 0);
	if (b->prep_err)
		return;
	b->run_err = fb_run_fileset(b->fs, &b->res);
}

static void bench_free(struct bench *b)
{
	fb_fileset_free(b->fs);
	fb_files_close(b->files);
}

/* Each personality: measured write share, loops, counters, bookkeeping, check. */
static void test_personality_runs(void)
{
	for (uint32_t p = 0; p < FB_NPERSONALITIES; p++) {
		struct fb_config cfg;
		struct bench b;
		struct fb_check_result chk;
		uint32_t w, io, loop = fb_loop_len(p);
		uint64_t rd = 0, wr = 0, prealloc;
		char name[32], prefix[64];

		small_cfg(&cfg, p, 60, 3, 1000);
		cfg.file_cap = 128 * 1024;	/* 32x the mean: no write is cut here */
		snprintf(name, sizeof(name), "run-%s", fb_personality_name(p));
		bench_run(&b, name, &cfg);
		CHECK_EQ(b.run_err, 0);
		if (b.run_err)
			fprintf(stderr, "%s: %s\n", name, b.res.error);
		/* Whole loops: ceil(1000 / loop), every flowop as many times. */
		CHECK_EQ(b.res.loops, (1000 + loop - 1) / loop);
		CHECK_EQ(b.res.nflowops, loop);
		for (uint32_t i = 0; i < loop; i++) {
			CHECK_EQ(b.res.flowops[i].ops, b.res.loops);
			rd += b.res.flowops[i].kind == FB_KIND_READ ? b.res.flowops[i].ops : 0;
			wr += b.res.flowops[i].kind == FB_KIND_WRITE ? b.res.flowops[i].ops : 0;
		}
		/* The measured write share is exactly the personality's. */
		fb_write_share(p, &w, &io);
		CHECK_EQ(wr * io, (rd + wr) * w);
		/* Prealloc: exactly round(60 * pct / 100) files (webserver: + its log). */
		prealloc = (60ull * cfg.prealloc_pct + 50) / 100;
		CHECK_EQ(b.res.prepare.creates, prealloc + (p == FB_WEBSERVER));
		/* Bookkeeping: what exists = prealloc + creates - deletes = files on disk. */
		CHECK_EQ(b.res.files_at_end, prealloc + b.res.run.creates - b.res.run.destroys);
		snprintf(prefix, sizeof(prefix), "%s.", cfg.prefix);
		CHECK_EQ(count_files(b.dir, prefix), b.res.files_at_end + (p == FB_WEBSERVER));
		/* Every attach detached; a psync per write-dirty close, per fsync. */
		CHECK_EQ(b.res.run.attaches, b.res.run.detaches);
		CHECK_EQ(b.res.run.verify_errors, 0);
		CHECK_EQ(b.res.run.truncated_writes, 0);
		switch (p) {
		case FB_FILESERVER:
			/* close after writewholefile, close after append; stat attaches. */
			CHECK_EQ(b.res.run.psyncs, 2 * b.res.loops);
			CHECK_EQ(b.res.run.attaches, 4 * b.res.loops);
			CHECK_EQ(b.res.run.creates, b.res.loops);
			CHECK_EQ(b.res.run.destroys, b.res.loops);
			break;
		case FB_VARMAIL:
			/* Two fsyncs; the closes after them find nothing dirty. */
			CHECK_EQ(b.res.run.psyncs, 2 * b.res.loops);
			CHECK_EQ(b.res.run.attaches, 3 * b.res.loops);
			break;
		case FB_WEBPROXY:
			CHECK_EQ(b.res.run.psyncs, b.res.loops);
			CHECK_EQ(b.res.run.attaches, 6 * b.res.loops);
			break;
		case FB_WEBSERVER:
			/* The log: attached once, psynced once at the end. */
			CHECK_EQ(b.res.run.psyncs, 1);
			CHECK_EQ(b.res.run.attaches, 10 * b.res.loops + 1);
			CHECK_EQ(b.res.run.creates, 0);
			break;
		}
		/* Bytes: what the write flowops report is what the counters saw. */
		{
			uint64_t fw = 0, fr = 0;

			for (uint32_t i = 0; i < loop; i++) {
				if (b.res.flowops[i].kind == FB_KIND_WRITE)
					fw += b.res.flowops[i].bytes;
				if (b.res.flowops[i].kind == FB_KIND_READ)
					fr += b.res.flowops[i].bytes;
			}
			CHECK_EQ(fw, b.res.run.bytes_written);
			CHECK_EQ(fr, b.res.run.bytes_read);
			CHECK(fr > 0 && fw > 0);
		}
		/* Every file is as the engine left it. */
		CHECK_EQ(fb_check(b.fs, FB_CHECK_EXPECT, &chk, NULL, NULL), 0);
		CHECK(fb_check_ok(&chk));
		CHECK_EQ(chk.present, b.res.files_at_end + (p == FB_WEBSERVER));
		CHECK_EQ(chk.bytes, b.res.bytes_at_end +
			 (p == FB_WEBSERVER ? b.fs->log.e.len : 0));
		/* A new fileset object discovers the same files. */
		{
			struct fb_fileset *fs2 = fb_fileset_new(&cfg, &b.ops);
			struct fb_check_result c2;

			CHECK_EQ(fb_check(fs2, FB_CHECK_DISCOVER, &c2, NULL, NULL), 0);
			CHECK(fb_check_ok(&c2));
			CHECK_EQ(c2.present, chk.present);
			CHECK_EQ(c2.bytes, chk.bytes);
			fb_fileset_free(fs2);
		}
		CHECK_EQ(fb_cleanup(b.fs), 0);
		CHECK_EQ(count_files(b.dir, prefix), 0);
		bench_free(&b);
	}
}

/* appendfilerand draws 1..appendsize: varmail's bytes per append average (1+n)/2. */
static void test_append_sizes(void)
{
	struct fb_config cfg;
	struct bench b;
	double mean;

	small_cfg(&cfg, FB_VARMAIL, 100, 1, 13 * 2000);
	cfg.appendsize = 1000;
	cfg.file_cap = 1024 * 1024;
	bench_run(&b, "appends", &cfg);
	CHECK_EQ(b.run_err, 0);
	/* 4000 appends; mean 500.5, standard error about 4.6. */
	mean = (double)b.res.run.bytes_written / (double)(2 * b.res.loops);
	CHECK(fabs(mean - 500.5) < 25);
	CHECK_EQ(b.res.run.truncated_writes, 0);
	bench_free(&b);
}

/* Mean of the prealloc'ed sizes follows meanfilesize. */
static void test_prealloc_sizes(void)
{
	struct fb_config cfg;
	struct bench b;
	double mean;

	small_cfg(&cfg, FB_WEBSERVER, 2000, 1, 31);
	cfg.meanfilesize = 8192;
	cfg.file_cap = 256 * 1024;
	bench_run(&b, "sizes", &cfg);
	CHECK_EQ(b.res.prepare.creates, 2001);
	CHECK_EQ(b.res.prepare.truncated_writes, 0);
	/* 2001 gamma(1.5) sizes: standard error of the mean 1.8%. */
	mean = (double)b.res.prepare.bytes_written / 2001.0;
	CHECK(fabs(mean - 8192) / 8192 < 0.08);
	bench_free(&b);
}

/* One thread, one seed: the same files with the same contents. */
static void test_determinism(void)
{
	struct fb_config cfg;
	struct bench a, b;
	struct fb_result r1;

	small_cfg(&cfg, FB_FILESERVER, 40, 1, 11 * 50);
	bench_run(&a, "det-a", &cfg);
	r1 = a.res;
	bench_run(&b, "det-b", &cfg);
	CHECK_EQ(a.run_err, 0);
	CHECK_EQ(b.run_err, 0);
	CHECK_EQ(r1.run.bytes_written, b.res.run.bytes_written);
	CHECK_EQ(r1.run.bytes_read, b.res.run.bytes_read);
	CHECK_EQ(r1.bytes_at_end, b.res.bytes_at_end);
	for (uint32_t i = 0; i < cfg.nfiles; i++) {
		CHECK_EQ(a.fs->e[i].exists, b.fs->e[i].exists);
		CHECK_EQ(a.fs->e[i].len, b.fs->e[i].len);
	}
	bench_free(&a);
	bench_free(&b);
	cfg.seed = 2;
	bench_run(&b, "det-c", &cfg);
	CHECK(b.res.run.bytes_written != r1.run.bytes_written);
	bench_free(&b);
}

/* Overwrite @n bytes at @off of file @dir/@name. */
static void poke(const char *dir, const char *name, off_t off, const void *p, size_t n)
{
	char path[1500];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK_EQ(pwrite(fd, p, n, off), n);
	close(fd);
}

struct seen {
	uint32_t status[64];
};

static void record(void *ctx, const char *name, int present, uint64_t len, uint32_t status)
{
	struct seen *s = ctx;
	const char *dot = strrchr(name, '.');
	unsigned long i = strtoul(dot + 1, NULL, 10);

	(void)present;
	(void)len;
	if (i < 64)
		s->status[i] = status;
}

/* fb_check finds a flipped data byte, a bad header, a dirty tail, a lost file. */
static void test_check_detects_damage(void)
{
	struct fb_config cfg;
	struct bench b;
	struct fb_check_result chk;
	struct seen seen;
	int with_data[4], k = 0;
	uint8_t one = 0xff;
	char n[PATH_MAX];	/* a PMO name, or the test directory plus one */

	small_cfg(&cfg, FB_VARMAIL, 40, 2, 13 * 20);
	bench_run(&b, "damage", &cfg);
	CHECK_EQ(b.run_err, 0);
	CHECK_EQ(fb_check(b.fs, FB_CHECK_EXPECT, &chk, NULL, NULL), 0);
	CHECK(fb_check_ok(&chk));
	for (uint32_t i = 0; i < cfg.nfiles && k < 4; i++)
		if (b.fs->e[i].exists && b.fs->e[i].len > 100)
			with_data[k++] = (int)i;
	CHECK_EQ(k, 4);
	if (k < 4)
		return;
	snprintf(n, sizeof(n), "%s.%d", cfg.prefix, with_data[0]);
	poke(b.dir, n, FB_HDR_SIZE + 50, &one, 1);	/* data */
	snprintf(n, sizeof(n), "%s.%d", cfg.prefix, with_data[1]);
	poke(b.dir, n, 2, &one, 1);			/* header magic */
	snprintf(n, sizeof(n), "%s.%d", cfg.prefix, with_data[2]);
	poke(b.dir, n, (off_t)(FB_HDR_SIZE + b.fs->e[with_data[2]].len + 10), &one, 1); /* tail */
	snprintf(n, sizeof(n), "%s/%s.%d", b.dir, cfg.prefix, with_data[3]);
	CHECK_EQ(unlink(n), 0);			/* a file the run left is gone */
	memset(&seen, 0, sizeof(seen));
	CHECK_EQ(fb_check(b.fs, FB_CHECK_EXPECT, &chk, record, &seen), 0);
	CHECK(!fb_check_ok(&chk));
	CHECK_EQ(chk.bad_data, 1);
	CHECK_EQ(chk.bad_header, 1);
	CHECK_EQ(chk.bad_tail, 1);
	CHECK_EQ(chk.wrong_presence, 1);
	CHECK_EQ(seen.status[with_data[0]], FB_CHECK_BAD_DATA);
	CHECK_EQ(seen.status[with_data[1]], FB_CHECK_BAD_HEADER);
	CHECK_EQ(seen.status[with_data[2]], FB_CHECK_BAD_TAIL);
	CHECK_EQ(seen.status[with_data[3]], FB_CHECK_WRONG_PRESENCE);
	/* A shorter length in a valid header (a rollback) is a wrong length. */
	{
		uint32_t i = 0;

		while (i < cfg.nfiles && (!b.fs->e[i].exists || b.fs->e[i].len < 10 ||
					  (int)i == with_data[0] || (int)i == with_data[1] ||
					  (int)i == with_data[2] || (int)i == with_data[3]))
			i++;
		CHECK(i < cfg.nfiles);
		if (i < cfg.nfiles) {
			uint8_t hdr[FB_HDR_SIZE];

			fb_header_write(hdr, 0, i, b.fs->e[i].len - 5, cfg.file_cap - FB_HDR_SIZE);
			snprintf(n, sizeof(n), "%s.%u", cfg.prefix, i);
			poke(b.dir, n, 0, hdr, sizeof(hdr));
			CHECK_EQ(fb_check(b.fs, FB_CHECK_EXPECT, &chk, record, &seen), 0);
			CHECK_EQ(chk.wrong_length, 1);
			CHECK_EQ(seen.status[i], FB_CHECK_WRONG_LENGTH);
			/* Without expectations the shorter file is consistent, except its
			 * tail, which holds the 5 cut bytes. */
			CHECK_EQ(fb_check(b.fs, FB_CHECK_DISCOVER, &chk, record, &seen), 0);
			CHECK_EQ(seen.status[i], FB_CHECK_BAD_TAIL);
		}
	}
	bench_free(&b);
}

/* Writes past the capacity are cut and counted; files stay consistent. */
static void test_truncation(void)
{
	struct fb_config cfg;
	struct bench b;
	struct fb_check_result chk;

	small_cfg(&cfg, FB_FILESERVER, 30, 2, 11 * 30);
	cfg.meanfilesize = 16384;
	cfg.file_cap = 8192;	/* 8128 data bytes: most writes are cut */
	bench_run(&b, "trunc", &cfg);
	CHECK_EQ(b.run_err, 0);
	CHECK(b.res.prepare.truncated_writes > 0);
	CHECK(b.res.run.truncated_writes > 0);
	CHECK(b.res.run.truncated_bytes > 0);
	CHECK_EQ(fb_check(b.fs, FB_CHECK_EXPECT, &chk, NULL, NULL), 0);
	CHECK(fb_check_ok(&chk));
	for (uint32_t i = 0; i < cfg.nfiles; i++)
		CHECK(b.fs->e[i].len <= 8192 - FB_HDR_SIZE);
	bench_free(&b);
}

/* A pick that can never succeed fails the run instead of hanging. */
static void test_impossible_pick(void)
{
	struct fb_config cfg;
	struct bench b;

	small_cfg(&cfg, FB_FILESERVER, 10, 3, 110);
	cfg.prealloc_pct = 100;	/* createfile has no absent entry, nobody deletes first */
	bench_run(&b, "full", &cfg);
	CHECK_EQ(b.run_err, ENOSPC);
	CHECK(strstr(b.res.error, "createfile") != NULL);
	CHECK_EQ(b.res.run.attaches, b.res.run.detaches);
	bench_free(&b);
	small_cfg(&cfg, FB_WEBPROXY, 10, 2, 190);
	cfg.prealloc_pct = 0;	/* deletefile first: nothing exists */
	bench_run(&b, "empty", &cfg);
	CHECK_EQ(b.run_err, ENOENT);
	bench_free(&b);
}

/* A prepare over leftovers of an earlier run starts from the prealloc state. */
static void test_prepare_over_leftovers(void)
{
	struct fb_config cfg;
	struct bench b;
	struct fb_result r;
	struct fb_check_result chk;

	small_cfg(&cfg, FB_WEBPROXY, 30, 2, 19 * 10);
	bench_run(&b, "leftover", &cfg);
	CHECK_EQ(b.run_err, 0);
	CHECK_EQ(fb_prepare(b.fs, &r), 0);
	CHECK_EQ(r.prepare.creates, 24);
	CHECK(r.prepare.destroys > 0);
	CHECK_EQ(count_files(b.dir, "fb.webproxy."), 24);
	CHECK_EQ(fb_check(b.fs, FB_CHECK_EXPECT, &chk, NULL, NULL), 0);
	CHECK(fb_check_ok(&chk));
	bench_free(&b);
}

static void test_format(void)
{
	struct fb_config cfg;
	struct bench b;
	char buf[8192];
	size_t n;
	int lines = 0;

	small_cfg(&cfg, FB_VARMAIL, 20, 1, 13 * 5);
	bench_run(&b, "format", &cfg);
	n = fb_format(&b.res, 0, buf, sizeof(buf));
	CHECK(n < sizeof(buf));
	CHECK(strstr(buf, "IO Summary: 65 ops") != NULL);
	CHECK(strstr(buf, "appendfilerand3") != NULL);
	CHECK(strstr(buf, "fsyncfile2") != NULL);
	n = fb_format(&b.res, 1, buf, sizeof(buf));
	CHECK(n < sizeof(buf));
	for (size_t i = 0; i < n; i++)
		lines += buf[i] == '\n';
	CHECK_EQ(lines, 13 + 3);	/* header, 13 flowops, summary, prepare */
	CHECK(strstr(buf, "varmail,IO Summary,all,65,") != NULL);
	/* A short buffer gets a terminated prefix and the needed length. */
	CHECK_EQ(fb_format(&b.res, 1, buf, 10), n);
	CHECK_EQ(strlen(buf), 9);
	bench_free(&b);
}

/* The file backend keeps PMO exclusivity rules. */
static void test_files_backend(void)
{
	const char *dir = fresh_dir("backend");
	struct fb_files *f = fb_files_open(dir);
	struct fb_pmo_ops o;
	size_t size = 0, s2 = 0;
	void *w, *r;

	fb_files_ops(f, &o);
	CHECK_EQ(o.create(o.ctx, "a", 8192), 0);
	CHECK_EQ(o.create(o.ctx, "a", 8192), EEXIST);
	CHECK_EQ(o.create(o.ctx, "b", 100), EINVAL);
	CHECK_EQ(o.create(o.ctx, ".x", 4096), EINVAL);
	CHECK_EQ(o.destroy(o.ctx, "nope"), ENOENT);
	w = o.attach(o.ctx, "a", 1, &size);
	CHECK(w != NULL);
	CHECK_EQ(size, 8192);
	CHECK(o.attach(o.ctx, "a", 0, &s2) == NULL && errno == EBUSY);
	CHECK_EQ(o.destroy(o.ctx, "a"), EBUSY);
	memcpy(w, "hello", 5);
	CHECK_EQ(o.sync(o.ctx, (char *)w + 100), 0);
	CHECK_EQ(o.detach(o.ctx, w), 0);
	r = o.attach(o.ctx, "a", 0, &size);
	CHECK(r != NULL);
	CHECK(memcmp(r, "hello", 5) == 0);
	CHECK(o.attach(o.ctx, "a", 1, &s2) == NULL && errno == EBUSY);
	w = o.attach(o.ctx, "a", 0, &s2);	/* a second reader is fine */
	CHECK(w != NULL);
	CHECK_EQ(o.detach(o.ctx, w), 0);
	CHECK_EQ(o.detach(o.ctx, r), 0);
	CHECK_EQ(o.detach(o.ctx, r), EINVAL);
	CHECK_EQ(o.destroy(o.ctx, "a"), 0);
	CHECK(o.attach(o.ctx, "a", 0, &s2) == NULL && errno == ENOENT);
	fb_files_close(f);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_fb DIR\n");
		return 2;
	}
	snprintf(base_dir, sizeof(base_dir), "%s", argv[1]);
	mkdir(base_dir, 0700);
	test_write_shares();
	test_open_modes();
	test_gamma();
	test_header_and_pattern();
	test_config_check();
	test_files_backend();
	test_personality_runs();
	test_append_sizes();
	test_prealloc_sizes();
	test_determinism();
	test_check_detects_damage();
	test_truncation();
	test_impossible_pick();
	test_prepare_over_leftovers();
	test_format();
	test_crashes();
	printf("test_fb: %d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
