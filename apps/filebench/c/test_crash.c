/*
 * test_crash.c - simulated crashes: what the event log promises holds.
 *
 * A wrapper around the file backend behaves like a PMO store that crashes
 * at the N-th psync: it keeps, per object, the contents of its last
 * completed psync (zeros after create), fails every call after the crash
 * with EIO, and afterwards the directory is rewound to those contents, as
 * recovery would leave a PMO store.  Then each file is judged by the last
 * event the engine reported for it (README.md, "Crash rule"), and
 * fb_check() must find every present file consistent.  A run without a
 * crash, rewound the same way, must equal what the engine left: every close
 * of a written file psynced it.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fb_data.h"
#include "fb_files.h"
#include "fb_internal.h"
#include "test_util.h"

#define MAX_OBJ 256

/* The last psync'ed contents of one object. */
struct shadow {
	char name[64];
	uint8_t *data;
	size_t size;
};

/* One live attachment: where to snapshot from. */
struct att {
	void *addr;
	size_t size;
	char name[64];
};

struct crashy {
	struct fb_pmo_ops inner;
	pthread_mutex_t lock;	/* serializes every call: the crash is one instant */
	struct shadow sh[MAX_OBJ];
	struct att at[64];
	uint64_t syncs, crash_at;
	int complete_last;	/* the crashing psync persisted (its caller still sees EIO) */
	int crashed;
};

static struct shadow *shadow_of(struct crashy *c, const char *name, int add)
{
	for (int i = 0; i < MAX_OBJ; i++)
		if (c->sh[i].data && strcmp(c->sh[i].name, name) == 0)
			return &c->sh[i];
	if (!add)
		return NULL;
	for (int i = 0; i < MAX_OBJ; i++)
		if (!c->sh[i].data) {
			snprintf(c->sh[i].name, sizeof(c->sh[i].name), "%s", name);
			return &c->sh[i];
		}
	return NULL;
}

static int c_create(void *ctx, const char *name, size_t size)
{
	struct crashy *c = ctx;
	int err = EIO;

	pthread_mutex_lock(&c->lock);
	if (!c->crashed) {
		err = c->inner.create(c->inner.ctx, name, size);
		if (!err) {
			struct shadow *s = shadow_of(c, name, 1);

			CHECK(s != NULL);
			if (s) {
				s->data = calloc(1, size);
				s->size = size;
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}

static int c_destroy(void *ctx, const char *name)
{
	struct crashy *c = ctx;
	int err = EIO;

	pthread_mutex_lock(&c->lock);
	if (!c->crashed) {
		err = c->inner.destroy(c->inner.ctx, name);
		if (!err) {
			struct shadow *s = shadow_of(c, name, 0);

			if (s) {
				free(s->data);
				s->data = NULL;
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}

static void *c_attach(void *ctx, const char *name, int writable, size_t *size)
{
	struct crashy *c = ctx;
	void *p = NULL;
	int err = EIO;

	pthread_mutex_lock(&c->lock);
	if (!c->crashed) {
		p = c->inner.attach(c->inner.ctx, name, writable, size);
		err = errno;
		if (p) {
			int i = 0;

			while (i < 64 && c->at[i].addr)
				i++;
			CHECK(i < 64);
			if (i < 64) {
				c->at[i].addr = p;
				c->at[i].size = *size;
				snprintf(c->at[i].name, sizeof(c->at[i].name), "%s", name);
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (!p)
		errno = err;
	return p;
}

/* Copy the attachment at @addr into its object's shadow; lock held. */
static void snapshot(struct crashy *c, void *addr)
{
	for (int i = 0; i < 64; i++)
		if (c->at[i].addr == addr) {
			struct shadow *s = shadow_of(c, c->at[i].name, 0);

			CHECK(s != NULL && s->size == c->at[i].size);
			if (s && s->size == c->at[i].size)
				memcpy(s->data, addr, s->size);
			return;
		}
	CHECK(!"sync of an unknown address");
}

static int c_sync(void *ctx, void *addr)
{
	struct crashy *c = ctx;
	int err = EIO;

	pthread_mutex_lock(&c->lock);
	if (!c->crashed) {
		if (++c->syncs == c->crash_at) {
			c->crashed = 1;
			if (c->complete_last)
				snapshot(c, addr);
		} else {
			err = c->inner.sync(c->inner.ctx, addr);
			if (!err)
				snapshot(c, addr);
		}
	}
	pthread_mutex_unlock(&c->lock);
	return err;
}

static int c_detach(void *ctx, void *addr)
{
	struct crashy *c = ctx;

	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < 64; i++)
		if (c->at[i].addr == addr)
			c->at[i].addr = NULL;
	pthread_mutex_unlock(&c->lock);
	/* Detach always works: the crash ends the sessions anyway. */
	return c->inner.detach(c->inner.ctx, addr);
}

/* Rewind every file of @dir to its shadow (the state recovery would give). */
static void rewind_files(struct crashy *c, const char *dir)
{
	for (int i = 0; i < MAX_OBJ; i++) {
		char path[1500];
		int fd;

		if (!c->sh[i].data)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, c->sh[i].name);
		fd = open(path, O_WRONLY);
		CHECK(fd >= 0);
		if (fd < 0)
			continue;
		CHECK_EQ(pwrite(fd, c->sh[i].data, c->sh[i].size, 0), c->sh[i].size);
		close(fd);
		free(c->sh[i].data);
		c->sh[i].data = NULL;
	}
}

/* What the event log says about one file. */
struct logged {
	uint32_t last;		/* last event, 0: none */
	uint64_t pending;	/* length of a psync announced, not confirmed */
	uint64_t synced;	/* length of the last confirmed psync since the create */
};

struct evlog {
	pthread_mutex_t lock;
	uint32_t nfiles;
	struct logged e[MAX_OBJ];	/* main fileset, then the log at nfiles */
	uint64_t events;
};

static struct logged *logged_of(struct evlog *l, const char *name)
{
	const char *dot = strrchr(name, '.');
	unsigned long i;

	if (strcmp(dot, ".log") == 0)
		return &l->e[l->nfiles];
	i = strtoul(dot + 1, NULL, 10);
	return i < l->nfiles ? &l->e[i] : NULL;
}

static void on_event(void *ctx, uint32_t kind, const char *name, uint64_t len)
{
	struct evlog *l = ctx;
	struct logged *e;

	pthread_mutex_lock(&l->lock);
	e = logged_of(l, name);
	CHECK(e != NULL);
	if (e) {
		e->last = kind;
		if (kind == FB_EV_CREATE)
			e->synced = 0;
		else if (kind == FB_EV_PSYNC_BEGIN)
			e->pending = len;
		else if (kind == FB_EV_PSYNC)
			e->synced = len;
	}
	l->events++;
	pthread_mutex_unlock(&l->lock);
}

struct judge {
	struct evlog *log;
	uint64_t judged, violations;
};

/* The crash rule for one file, given what the rewound store holds. */
static void judge_one(void *ctx, const char *name, int present, uint64_t len, uint32_t status)
{
	struct judge *j = ctx;
	struct logged *e = logged_of(j->log, name);
	int ok;

	if (!e)
		return;
	switch (e->last) {
	case 0:
	case FB_EV_DESTROY:
		ok = !present;
		break;
	case FB_EV_CREATE_BEGIN:
		ok = !present || len == 0;
		break;
	case FB_EV_CREATE:
		ok = present && len == 0;
		break;
	case FB_EV_PSYNC_BEGIN:
		ok = present && (len == e->pending || len == e->synced);
		break;
	case FB_EV_PSYNC:
		ok = present && len == e->synced;
		break;
	case FB_EV_DESTROY_BEGIN:
		ok = !present || len == e->synced;
		break;
	default:
		ok = 0;
	}
	ok = ok && (status == FB_CHECK_OK || status == FB_CHECK_MISSING);
	j->judged++;
	if (!ok) {
		j->violations++;
		fprintf(stderr, "crash rule: %s last event %u (pending %llu, synced %llu): "
			"present %d len %llu status %u\n", name, e->last,
			(unsigned long long)e->pending, (unsigned long long)e->synced, present,
			(unsigned long long)len, status);
	}
}

/* Run @p, crash at psync @crash_at (0: never), rewind, judge; the psyncs issued. */
static uint64_t crash_case(uint32_t p, uint64_t crash_at, int complete_last)
{
	static struct crashy c;
	static struct evlog log;
	struct fb_config cfg;
	struct fb_pmo_ops ops;
	struct fb_files *files;
	struct fb_fileset *fs, *after;
	struct fb_result *res = calloc(1, sizeof(*res));
	struct fb_check_result chk;
	struct judge j = { &log, 0, 0 };
	const char *dir;
	char name[64];
	int err;

	snprintf(name, sizeof(name), "crash-%s-%llu-%d", fb_personality_name(p),
		 (unsigned long long)crash_at, complete_last);
	dir = fresh_dir(name);
	files = fb_files_open(dir);
	CHECK(files != NULL && res != NULL);
	if (!files || !res)
		return 0;
	memset(&c, 0, sizeof(c));
	memset(&log, 0, sizeof(log));
	pthread_mutex_init(&c.lock, NULL);
	pthread_mutex_init(&log.lock, NULL);
	fb_files_ops(files, &c.inner);
	c.crash_at = crash_at;
	c.complete_last = complete_last;
	ops = (struct fb_pmo_ops){ c_create, c_destroy, c_attach, c_sync, c_detach, &c };

	fb_config_init(&cfg, p, FB_SCALE_SMALL);
	cfg.nfiles = 40;
	cfg.nthreads = 3;
	cfg.ops = 600;
	cfg.meanfilesize = 4096;
	cfg.appendsize = 2048;
	cfg.iosize = 1024;
	cfg.file_cap = 64 * 1024;
	cfg.log_cap = 256 * 1024;
	cfg.event = on_event;
	cfg.event_ctx = &log;
	log.nfiles = cfg.nfiles;

	fs = fb_fileset_new(&cfg, &ops);
	CHECK(fs != NULL);
	if (!fs)
		goto out;
	err = fb_prepare(fs, res);
	if (!err)
		err = fb_run_fileset(fs, res);
	/* The crash happened and failed the run, or there was none and the run passed. */
	CHECK_EQ(c.crashed, crash_at != 0);
	CHECK_EQ(err, crash_at ? EIO : 0);
	CHECK(log.events > 0);
	rewind_files(&c, dir);
	if (!crash_at) {
		/* Every close of a written file psynced: psync'ed state == final state. */
		CHECK_EQ(fb_check(fs, FB_CHECK_EXPECT, &chk, NULL, NULL), 0);
		CHECK(fb_check_ok(&chk));
		CHECK_EQ(chk.bytes, res->bytes_at_end + (p == FB_WEBSERVER ? fs->log.e.len : 0));
	}
	/* After the "restart": a new fileset on the plain backend learns what is there. */
	cfg.event = NULL;
	after = fb_fileset_new(&cfg, &c.inner);
	CHECK(after != NULL);
	if (after) {
		CHECK_EQ(fb_check(after, FB_CHECK_DISCOVER, &chk, judge_one, &j), 0);
		CHECK_EQ(j.judged, cfg.nfiles + (p == FB_WEBSERVER));
		CHECK_EQ(j.violations, 0);
		CHECK(fb_check_ok(&chk));
		fb_fileset_free(after);
	}
	fb_fileset_free(fs);
out:
	for (int i = 0; i < MAX_OBJ; i++)
		free(c.sh[i].data);
	fb_files_close(files);
	pthread_mutex_destroy(&c.lock);
	pthread_mutex_destroy(&log.lock);
	free(res);
	return c.syncs;
}

void test_crashes(void)
{
	for (uint32_t p = 0; p < FB_NPERSONALITIES; p++) {
		/* A run without a crash counts the psyncs (32 of them prepare 40 files at 80%). */
		uint64_t total = crash_case(p, 0, 0);
		/* In the preparation, at the run's first psync, half way, at the very last. */
		uint64_t at[4] = { 7, 33, (33 + total) / 2, total };

		CHECK(total > 33);
		for (int i = 0; i < 4; i++) {
			crash_case(p, at[i], 0);
			crash_case(p, at[i], 1);
		}
	}
}
