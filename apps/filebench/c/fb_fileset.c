/*
 * fb_fileset.c - the fileset: its table, preparation (prealloc), cleanup,
 * names, errors and events; fb_run() and the ABI sizes.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb_data.h"
#include "fb_internal.h"

/* RNG streams of a fileset (threads use FB_STREAM_THREAD + their number). */
#define STREAM_SIZES	0
#define STREAM_PREALLOC	1

void fb_entry_name(const struct fb_fileset *fs, uint32_t set, uint32_t index, char name[64])
{
	if (set == FB_SET_LOG)
		snprintf(name, 64, "%s.log", fs->cfg.prefix);
	else
		snprintf(name, 64, "%s.%u", fs->cfg.prefix, index);
}

/* Record @err and its message unless an error is recorded already; lock held. */
static void fail_locked(struct fb_fileset *fs, int err, const char *fmt, va_list ap)
{
	if (fs->failed)
		return;
	/* Stored atomically: threads poll it without the lock between loops. */
	__atomic_store_n(&fs->failed, err, __ATOMIC_RELAXED);
	vsnprintf(fs->error, sizeof(fs->error), fmt, ap);
	pthread_cond_broadcast(&fs->cond);
}

int fb_fail(struct fb_fileset *fs, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	pthread_mutex_lock(&fs->lock);
	fail_locked(fs, err, fmt, ap);
	pthread_mutex_unlock(&fs->lock);
	va_end(ap);
	return err;
}

void fb_event(const struct fb_fileset *fs, uint32_t kind, const char *name, uint64_t len)
{
	if (fs->cfg.event)
		fs->cfg.event(fs->cfg.event_ctx, kind, name, len);
}

int fb_call_create(const struct fb_fileset *fs, const char *name, uint64_t size)
{
	int err;

	fb_event(fs, FB_EV_CREATE_BEGIN, name, 0);
	err = fs->ops.create(fs->ops.ctx, name, (size_t)size);
	if (!err)
		fb_event(fs, FB_EV_CREATE, name, 0);
	return err;
}

int fb_call_destroy(const struct fb_fileset *fs, const char *name)
{
	int err;

	fb_event(fs, FB_EV_DESTROY_BEGIN, name, 0);
	err = fs->ops.destroy(fs->ops.ctx, name);
	if (!err)
		fb_event(fs, FB_EV_DESTROY, name, 0);
	return err;
}

int fb_call_sync(const struct fb_fileset *fs, void *base, const char *name, uint64_t len)
{
	int err;

	fb_event(fs, FB_EV_PSYNC_BEGIN, name, len);
	err = fs->ops.sync(fs->ops.ctx, base);
	if (!err)
		fb_event(fs, FB_EV_PSYNC, name, len);
	return err;
}

struct fb_fileset *fb_fileset_new(const struct fb_config *cfg, const struct fb_pmo_ops *ops)
{
	struct fb_fileset *fs;
	struct fb_rng rng;

	if (!cfg || !ops || !ops->create || !ops->destroy || !ops->attach || !ops->sync ||
	    !ops->detach || fb_config_check(cfg, NULL, 0)) {
		errno = EINVAL;
		return NULL;
	}
	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return NULL;
	fs->e = calloc(cfg->nfiles, sizeof(*fs->e));
	if (!fs->e) {
		free(fs);
		errno = ENOMEM;
		return NULL;
	}
	fs->cfg = *cfg;
	fs->cfg.prefix[FB_PREFIX_MAX] = '\0';
	fs->ops = *ops;
	fs->def = fb_personality_def(cfg->personality);
	pthread_mutex_init(&fs->lock, NULL);
	pthread_cond_init(&fs->cond, NULL);
	pthread_mutex_init(&fs->log.lock, NULL);
	/* Each entry's size, as Filebench draws it once when it populates the fileset. */
	fb_rng_seed(&rng, cfg->seed, STREAM_SIZES);
	for (uint32_t i = 0; i < cfg->nfiles; i++)
		fs->e[i].target = fb_gamma_size(&rng, cfg->meanfilesize, cfg->sizegamma_milli);
	if (fs->def->has_log)
		fs->log.e.target = fb_gamma_size(&rng, cfg->meanfilesize, cfg->sizegamma_milli);
	for (uint32_t i = 0; i < fs->def->nflowops; i++)
		fs->writable[i] = fs->def->flowops[i].op == FB_OP_OPEN && fb_open_writable(fs->def, i);
	return fs;
}

void fb_fileset_free(struct fb_fileset *fs)
{
	if (!fs)
		return;
	pthread_mutex_destroy(&fs->log.lock);
	pthread_cond_destroy(&fs->cond);
	pthread_mutex_destroy(&fs->lock);
	free(fs->e);
	free(fs);
}

const char *fb_fileset_error(const struct fb_fileset *fs)
{
	return fs->error;
}

/*
 * Create @name, write @target bytes of its pattern, psync, detach.  An
 * object left under the name by an earlier run is destroyed first.  *len is
 * the length written (cut at the capacity).
 */
static int create_written(struct fb_fileset *fs, struct fb_counters *c, uint32_t set,
			  uint32_t index, uint64_t target, uint64_t cap, uint64_t *len)
{
	const struct fb_pmo_ops *o = &fs->ops;
	char name[64];
	uint8_t *base;
	size_t size = 0;
	uint64_t room, w;
	int err;

	fb_entry_name(fs, set, index, name);
	err = fb_call_create(fs, name, cap);
	if (err == EEXIST) {
		err = fb_call_destroy(fs, name);
		if (err)
			return fb_fail(fs, err, "prepare: destroy leftover %s: %s", name,
				       strerror(err));
		c->destroys++;
		err = fb_call_create(fs, name, cap);
	}
	if (err)
		return fb_fail(fs, err, "prepare: create %s: %s", name, strerror(err));
	c->creates++;
	errno = 0;
	base = o->attach(o->ctx, name, 1, &size);
	if (!base) {
		err = errno ? errno : EIO;
		return fb_fail(fs, err, "prepare: attach %s: %s", name, strerror(err));
	}
	c->attaches++;
	if (size < cap) {
		o->detach(o->ctx, base);
		return fb_fail(fs, EIO, "prepare: %s has %zu bytes, not %llu", name, size,
			       (unsigned long long)cap);
	}
	room = size - FB_HDR_SIZE;
	w = target < room ? target : room;
	if (w < target) {
		c->truncated_writes++;
		c->truncated_bytes += target - w;
	}
	for (uint64_t off = 0; off < w; off += fs->cfg.iosize) {
		uint64_t n = w - off < fs->cfg.iosize ? w - off : fs->cfg.iosize;

		fb_pattern_fill(base + FB_HDR_SIZE + off, set, index, off, n);
	}
	fb_header_write(base, set, index, w, room);
	c->bytes_written += w;
	err = fb_call_sync(fs, base, name, w);
	if (err) {
		o->detach(o->ctx, base);
		return fb_fail(fs, err, "prepare: psync %s: %s", name, strerror(err));
	}
	c->psyncs++;
	err = o->detach(o->ctx, base);
	if (err)
		return fb_fail(fs, err, "prepare: detach %s: %s", name, strerror(err));
	c->detaches++;
	*len = w;
	return 0;
}

/* Destroy @name if it exists; *gone tells whether it did. */
static int destroy_any(struct fb_fileset *fs, uint32_t set, uint32_t index, int *gone)
{
	char name[64];
	int err;

	fb_entry_name(fs, set, index, name);
	err = fb_call_destroy(fs, name);
	*gone = err == 0;
	if (err == ENOENT)
		return 0;
	if (err)
		return fb_fail(fs, err, "destroy %s: %s", name, strerror(err));
	return 0;
}

int fb_prepare(struct fb_fileset *fs, struct fb_result *res)
{
	uint32_t n = fs->cfg.nfiles, k, *perm;
	uint8_t *chosen;
	struct fb_rng rng;
	int err = 0, gone;

	memset(&res->prepare, 0, sizeof(res->prepare));
	fs->failed = 0;
	fs->error[0] = '\0';
	perm = malloc((size_t)n * sizeof(*perm));
	chosen = calloc(n, 1);
	if (!perm || !chosen) {
		free(perm);
		free(chosen);
		return fb_fail(fs, ENOMEM, "prepare: out of memory");
	}
	/* Exactly round(n * prealloc%) entries, a uniformly random subset. */
	k = (uint32_t)(((uint64_t)n * fs->cfg.prealloc_pct + 50) / 100);
	fb_rng_seed(&rng, fs->cfg.seed, STREAM_PREALLOC);
	for (uint32_t i = 0; i < n; i++)
		perm[i] = i;
	for (uint32_t i = 0; i < k; i++) {
		uint32_t j = i + (uint32_t)fb_rng_below(&rng, n - i), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
		chosen[perm[i]] = 1;
	}
	free(perm);
	for (uint32_t i = 0; i < n && !err; i++) {
		struct fb_entry *e = &fs->e[i];

		e->readers = 0;
		e->writer = 0;
		e->busy = 0;
		e->len = 0;
		e->exists = 0;
		if (chosen[i]) {
			err = create_written(fs, &res->prepare, FB_SET_MAIN, i, e->target,
					     fs->cfg.file_cap, &e->len);
			e->exists = !err;
		} else {
			err = destroy_any(fs, FB_SET_MAIN, i, &gone);
			res->prepare.destroys += (uint64_t)gone;
		}
	}
	free(chosen);
	if (!err && fs->def->has_log) {
		fs->log.e.len = 0;
		err = create_written(fs, &res->prepare, FB_SET_LOG, 0, fs->log.e.target,
				     fs->cfg.log_cap, &fs->log.e.len);
		fs->log.e.exists = !err;
	}
	if (err)
		snprintf(res->error, sizeof(res->error), "%s", fs->error);
	return err;
}

int fb_cleanup(struct fb_fileset *fs)
{
	int err = 0, gone;

	fs->failed = 0;
	fs->error[0] = '\0';
	for (uint32_t i = 0; i < fs->cfg.nfiles && !err; i++) {
		err = destroy_any(fs, FB_SET_MAIN, i, &gone);
		if (!err) {
			fs->e[i].exists = 0;
			fs->e[i].len = 0;
		}
	}
	if (!err && fs->def->has_log) {
		err = destroy_any(fs, FB_SET_LOG, 0, &gone);
		if (!err) {
			fs->log.e.exists = 0;
			fs->log.e.len = 0;
		}
	}
	return err;
}

int fb_run(const struct fb_config *cfg, const struct fb_pmo_ops *ops, struct fb_result *res)
{
	struct fb_fileset *fs;
	int err;

	memset(res, 0, sizeof(*res));
	fs = fb_fileset_new(cfg, ops);
	if (!fs) {
		err = errno ? errno : EINVAL;
		if (err == EINVAL && cfg)
			fb_config_check(cfg, res->error, sizeof(res->error));
		else
			snprintf(res->error, sizeof(res->error), "fileset: %s", strerror(err));
		return err;
	}
	err = fb_prepare(fs, res);
	if (!err)
		err = fb_run_fileset(fs, res);
	fb_fileset_free(fs);
	return err;
}

size_t fb_abi_size(uint32_t which)
{
	switch (which) {
	case 0:
		return sizeof(struct fb_config);
	case 1:
		return sizeof(struct fb_result);
	case 2:
		return sizeof(struct fb_check_result);
	case 3:
		return sizeof(struct fb_pmo_ops);
	case 4:
		return sizeof(struct fb_flowop_stat);
	case 5:
		return sizeof(struct fb_counters);
	default:
		return 0;
	}
}
