/*
 * fb_pick.c - the fileset entries the threads of a run share: picking one
 * for a flowop and releasing it.
 *
 * Threads share the fileset.  An entry is held by at most one writer, or by
 * any number of readers, or is busy (being created or destroyed); a pick
 * chooses uniformly at random among the entries eligible for the flowop
 * (createfile: absent; openfile for writing, deletefile: existing and not
 * held; openfile read-only, statfile: existing and not written), so an entry
 * another thread writes is never picked: the pick takes another one.  Only
 * when no entry is eligible does the thread wait for a release; when every
 * running thread waits and nothing is held, the run fails (ENOSPC for
 * createfile, ENOENT otherwise) instead of hanging.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>

#include "fb_thread.h"

#define PICK_TRIES	32	/* random probes before counting the eligible entries */

static int eligible(const struct fb_entry *e, enum fb_pick k)
{
	if (e->busy || e->writer)
		return 0;
	switch (k) {
	case FB_PICK_ABSENT:
		return !e->exists;
	case FB_PICK_WRITE:
	case FB_PICK_DELETE:
		return e->exists && e->readers == 0;
	case FB_PICK_READ:
		return e->exists;
	}
	return 0;
}

/* Choose an eligible entry uniformly at random; fs->lock held.  -1 if none. */
static int64_t choose(struct fb_thread *t, enum fb_pick k)
{
	struct fb_fileset *fs = t->fs;
	uint32_t n = fs->cfg.nfiles, count = 0;
	uint64_t want;

	for (int i = 0; i < PICK_TRIES; i++) {
		uint32_t j = (uint32_t)fb_rng_below(&t->rng, n);

		if (eligible(&fs->e[j], k))
			return j;
	}
	/* Few eligible entries: pick the k-th of them, which is as uniform. */
	for (uint32_t j = 0; j < n; j++)
		count += (uint32_t)eligible(&fs->e[j], k);
	if (count == 0)
		return -1;
	want = fb_rng_below(&t->rng, count);
	for (uint32_t j = 0; j < n; j++)
		if (eligible(&fs->e[j], k) && want-- == 0)
			return j;
	return -1;
}

/*
 * Pick an entry for @k and take it (busy, writer or reader); *len is its
 * length as the engine knows it.  Waits while none is eligible.
 */
int fb_pick(struct fb_thread *t, enum fb_pick k, uint32_t *out, uint64_t *len)
{
	struct fb_fileset *fs = t->fs;
	int waited = 0;

	pthread_mutex_lock(&fs->lock);
	for (;;) {
		int64_t j;

		if (fs->failed) {
			pthread_mutex_unlock(&fs->lock);
			return ECANCELED;
		}
		j = choose(t, k);
		if (j >= 0) {
			struct fb_entry *e = &fs->e[j];

			if (k == FB_PICK_ABSENT || k == FB_PICK_DELETE)
				e->busy = 1;
			else if (k == FB_PICK_WRITE)
				e->writer = 1;
			else
				e->readers++;
			fs->held++;
			*out = (uint32_t)j;
			*len = e->len;
			pthread_mutex_unlock(&fs->lock);
			return 0;
		}
		if (fs->held == 0 && fs->waiting + 1 >= fs->running) {
			/* Nobody can release anything: the pick can never succeed. */
			int err = k == FB_PICK_ABSENT ? ENOSPC : ENOENT;

			pthread_mutex_unlock(&fs->lock);
			return fb_fail(fs, err, "%s: no entry of %u can be picked",
				       k == FB_PICK_ABSENT ? "createfile (fileset full)" :
				       "no file exists for openfile/deletefile/statfile",
				       fs->cfg.nfiles);
		}
		if (!waited)
			t->c.pick_waits++;
		waited = 1;
		fs->waiting++;
		pthread_cond_wait(&fs->cond, &fs->lock);
		fs->waiting--;
	}
}

/* Release entry @j taken with @k; @exists and @len are its new state (writer/busy). */
void fb_release(struct fb_fileset *fs, uint32_t j, enum fb_pick k, int exists, uint64_t len)
{
	struct fb_entry *e = &fs->e[j];

	pthread_mutex_lock(&fs->lock);
	if (k == FB_PICK_READ) {
		e->readers--;
	} else {
		e->busy = 0;
		e->writer = 0;
		e->exists = (uint8_t)exists;
		e->len = len;
	}
	fs->held--;
	pthread_cond_broadcast(&fs->cond);
	pthread_mutex_unlock(&fs->lock);
}
