/*
 * fb.c - running a personality: the worker threads, each looping over the
 * personality's flowops (fb_flowop.c) on entries it picks (fb_pick.c), and
 * their counts merged into the result.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb_thread.h"

#define STREAM_THREAD	100	/* thread t uses RNG stream STREAM_THREAD + t */

/* Claim the next loop: 0 when the run is over. */
static int next_loop(struct fb_thread *t)
{
	struct fb_fileset *fs = t->fs;

	if (__atomic_load_n(&fs->failed, __ATOMIC_RELAXED))
		return 0;
	if (fs->cfg.ops)
		return atomic_fetch_add(&fs->loops_claimed, 1) < fs->loops_total;
	return fb_now_ns() < fs->deadline_ns;
}

static void *worker(void *arg)
{
	struct fb_thread *t = arg;
	struct fb_fileset *fs = t->fs;
	uint32_t nops = fs->def->nflowops;

	while (next_loop(t)) {
		int err = 0;

		for (uint32_t i = 0; i < nops && !err; i++) {
			struct fb_flowop_stat *s = &t->st[i];
			uint64_t t0 = fb_now_ns(), bytes, dt;

			err = fb_flowop_run(t, i, &bytes);
			if (err)
				break;
			dt = fb_now_ns() - t0;
			s->ops++;
			s->bytes += bytes;
			s->ns += dt;
			if (s->ops == 1 || dt < s->min_ns)
				s->min_ns = dt;
			if (dt > s->max_ns)
				s->max_ns = dt;
		}
		if (err)
			break;
		t->loops++;
	}
	/* After an error a file may still be open: close it (psyncs if dirty). */
	if (t->fd.entry >= 0)
		fb_flowop_close(t);
	pthread_mutex_lock(&fs->lock);
	fs->running--;
	pthread_cond_broadcast(&fs->cond);
	pthread_mutex_unlock(&fs->lock);
	return NULL;
}

static void add_counters(struct fb_counters *a, const struct fb_counters *b)
{
	a->creates += b->creates;
	a->destroys += b->destroys;
	a->attaches += b->attaches;
	a->detaches += b->detaches;
	a->psyncs += b->psyncs;
	a->bytes_read += b->bytes_read;
	a->bytes_written += b->bytes_written;
	a->truncated_writes += b->truncated_writes;
	a->truncated_bytes += b->truncated_bytes;
	a->pick_waits += b->pick_waits;
	a->verify_errors += b->verify_errors;
}

static void merge(struct fb_result *res, const struct fb_thread *t, uint32_t nops)
{
	add_counters(&res->run, &t->c);
	res->loops += t->loops;
	for (uint32_t i = 0; i < nops; i++) {
		struct fb_flowop_stat *d = &res->flowops[i];
		const struct fb_flowop_stat *s = &t->st[i];

		if (!s->ops)
			continue;
		if (d->ops == 0 || s->min_ns < d->min_ns)
			d->min_ns = s->min_ns;
		if (s->max_ns > d->max_ns)
			d->max_ns = s->max_ns;
		d->ops += s->ops;
		d->bytes += s->bytes;
		d->ns += s->ns;
	}
}

/* Identity fields and flowop names of @res. */
static void result_init(const struct fb_fileset *fs, struct fb_result *res)
{
	res->personality = fs->cfg.personality;
	res->nflowops = fs->def->nflowops;
	res->nthreads = fs->cfg.nthreads;
	res->nfiles = fs->cfg.nfiles;
	res->loops = 0;
	res->elapsed_ns = 0;
	res->files_at_end = 0;
	res->bytes_at_end = 0;
	res->error[0] = '\0';
	memset(&res->run, 0, sizeof(res->run));
	memset(res->flowops, 0, sizeof(res->flowops));
	for (uint32_t i = 0; i < fs->def->nflowops; i++) {
		struct fb_flowop_stat *s = &res->flowops[i];

		strncpy(s->name, fs->def->flowops[i].name, sizeof(s->name) - 1);
		s->op = fs->def->flowops[i].op;
		s->kind = fb_op_kind(s->op);
	}
}

int fb_run_fileset(struct fb_fileset *fs, struct fb_result *res)
{
	uint32_t n = fs->cfg.nthreads, started = 0, loop = fs->def->nflowops;
	struct fb_thread *th;
	uint64_t t0;
	int err = 0;

	result_init(fs, res);
	th = calloc(n, sizeof(*th));
	if (!th)
		return fb_fail(fs, ENOMEM, "run: out of memory");
	fs->failed = 0;
	fs->error[0] = '\0';
	fs->waiting = 0;
	fs->held = 0;
	fs->running = n;
	atomic_store(&fs->loops_claimed, 0);
	fs->loops_total = fs->cfg.ops ? (fs->cfg.ops + loop - 1) / loop : 0;
	fs->log.base = NULL;
	fs->log.dirty = 0;
	for (uint32_t i = 0; i < n; i++) {
		th[i].fs = fs;
		th[i].id = i;
		th[i].fd.entry = -1;
		fb_rng_seed(&th[i].rng, fs->cfg.seed, STREAM_THREAD + i);
		th[i].buf = malloc(fs->cfg.iosize);
		if (!th[i].buf) {
			err = fb_fail(fs, ENOMEM, "run: out of memory");
			break;
		}
	}
	t0 = fb_now_ns();
	fs->deadline_ns = t0 + fs->cfg.seconds * 1000000000ull;
	for (uint32_t i = 0; i < n && !err; i++) {
		err = pthread_create(&th[i].tid, NULL, worker, &th[i]);
		if (err) {
			fb_fail(fs, err, "run: pthread_create: %s", strerror(err));
			break;
		}
		started++;
	}
	if (started < n) {
		/* The threads never started are not running. */
		pthread_mutex_lock(&fs->lock);
		fs->running -= n - started;
		pthread_cond_broadcast(&fs->cond);
		pthread_mutex_unlock(&fs->lock);
	}
	for (uint32_t i = 0; i < started; i++)
		pthread_join(th[i].tid, NULL);
	if (started && fb_log_close(&th[0]) && !err)
		err = fs->failed;
	res->elapsed_ns = fb_now_ns() - t0;
	for (uint32_t i = 0; i < n; i++) {
		merge(res, &th[i], loop);
		free(th[i].buf);
	}
	free(th);
	for (uint32_t i = 0; i < fs->cfg.nfiles; i++) {
		res->files_at_end += fs->e[i].exists;
		res->bytes_at_end += fs->e[i].exists ? fs->e[i].len : 0;
	}
	if (!err)
		err = fs->failed;
	if (err)
		snprintf(res->error, sizeof(res->error), "%s", fs->error);
	return err;
}
