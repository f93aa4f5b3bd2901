/*
 * fb.c - running a personality: worker threads, picking fileset entries and
 * the flowops on PMOs.
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
 *
 * One concern, kept whole past 600 lines: the run's threads, picks and
 * flowops share one locking discipline over the fileset, read best in one
 * place.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fb_data.h"
#include "fb_internal.h"

#define STREAM_THREAD	100	/* thread t uses RNG stream STREAM_THREAD + t */
#define PICK_TRIES	32	/* random probes before counting the eligible entries */

enum pick {
	PICK_ABSENT,		/* createfile */
	PICK_WRITE,		/* openfile for writing */
	PICK_READ,		/* openfile read-only, statfile */
	PICK_DELETE,		/* deletefile */
};

/* The file a thread has open (Filebench's fd 1). */
struct fb_fd {
	int32_t entry;		/* -1: closed */
	uint8_t *base;
	size_t size;
	uint64_t len;
	int writable;
	int dirty;		/* written since the last psync */
};

struct fb_thread {
	struct fb_fileset *fs;
	uint32_t id;
	pthread_t tid;
	struct fb_rng rng;
	uint8_t *buf;		/* iosize bytes: where reads land */
	struct fb_fd fd;
	uint64_t loops;
	struct fb_counters c;
	struct fb_flowop_stat st[FB_MAX_FLOWOPS];
};

static int eligible(const struct fb_entry *e, enum pick k)
{
	if (e->busy || e->writer)
		return 0;
	switch (k) {
	case PICK_ABSENT:
		return !e->exists;
	case PICK_WRITE:
	case PICK_DELETE:
		return e->exists && e->readers == 0;
	case PICK_READ:
		return e->exists;
	}
	return 0;
}

/* Choose an eligible entry uniformly at random; fs->lock held.  -1 if none. */
static int64_t choose(struct fb_thread *t, enum pick k)
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
static int pick(struct fb_thread *t, enum pick k, uint32_t *out, uint64_t *len)
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

			if (k == PICK_ABSENT || k == PICK_DELETE)
				e->busy = 1;
			else if (k == PICK_WRITE)
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
			int err = k == PICK_ABSENT ? ENOSPC : ENOENT;

			pthread_mutex_unlock(&fs->lock);
			return fb_fail(fs, err, "%s: no entry of %u can be picked",
				       k == PICK_ABSENT ? "createfile (fileset full)" :
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
static void release(struct fb_fileset *fs, uint32_t j, enum pick k, int exists, uint64_t len)
{
	struct fb_entry *e = &fs->e[j];

	pthread_mutex_lock(&fs->lock);
	if (k == PICK_READ) {
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

/* Attach @name; on failure record the error. */
static uint8_t *do_attach(struct fb_thread *t, const char *name, int writable, size_t *size,
			  int *err)
{
	const struct fb_pmo_ops *o = &t->fs->ops;
	uint8_t *p;

	errno = 0;
	p = o->attach(o->ctx, name, writable, size);
	if (!p) {
		*err = errno ? errno : EIO;
		fb_fail(t->fs, *err, "attach %s%s: %s", name, writable ? " rw" : "",
			strerror(*err));
		return NULL;
	}
	t->c.attaches++;
	*err = 0;
	return p;
}

static int do_sync(struct fb_thread *t, uint8_t *base, const char *name, uint64_t len)
{
	int err = fb_call_sync(t->fs, base, name, len);

	if (err)
		return fb_fail(t->fs, err, "psync %s: %s", name, strerror(err));
	t->c.psyncs++;
	return 0;
}

static int do_detach(struct fb_thread *t, uint8_t *base, const char *name)
{
	const struct fb_pmo_ops *o = &t->fs->ops;
	int err = o->detach(o->ctx, base);

	if (err)
		return fb_fail(t->fs, err, "detach %s: %s", name, strerror(err));
	t->c.detaches++;
	return 0;
}

/*
 * Append @n bytes of the file's pattern at *len of the attachment @base of
 * @size bytes, in @chunk pieces, cut at the capacity; update the header.
 */
static uint64_t write_data(struct fb_thread *t, uint8_t *base, size_t size, uint32_t set,
			   uint32_t index, uint64_t *len, uint64_t n, uint64_t chunk)
{
	uint64_t cap = size - FB_HDR_SIZE, room = cap - *len, w = n < room ? n : room;

	if (w < n) {
		t->c.truncated_writes++;
		t->c.truncated_bytes += n - w;
	}
	for (uint64_t done = 0; done < w; done += chunk) {
		uint64_t c = w - done < chunk ? w - done : chunk;

		fb_pattern_fill(base + FB_HDR_SIZE + *len + done, set, index, *len + done, c);
	}
	*len += w;
	fb_header_write(base, set, index, *len, cap);
	t->c.bytes_written += w;
	return w;
}

/* Read the open file's header; its length in *len. */
static int read_header(struct fb_thread *t, uint8_t *base, size_t size, uint32_t set,
		       uint32_t index, const char *name, uint64_t *len)
{
	if (fb_header_read(base, size, set, index, len) == FB_HDR_BAD)
		return fb_fail(t->fs, EBADMSG, "%s: bad file header", name);
	return 0;
}

static int op_create(struct fb_thread *t)
{
	struct fb_fileset *fs = t->fs;
	char name[64];
	uint32_t j = 0;
	uint64_t len = 0;
	int err = pick(t, PICK_ABSENT, &j, &len);

	if (err)
		return err;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	err = fb_call_create(fs, name, fs->cfg.file_cap);
	if (err) {
		release(fs, j, PICK_ABSENT, 0, 0);
		return fb_fail(fs, err, "create %s: %s", name, strerror(err));
	}
	t->c.creates++;
	t->fd.base = do_attach(t, name, 1, &t->fd.size, &err);
	if (!t->fd.base) {
		release(fs, j, PICK_ABSENT, 1, 0);
		return err;
	}
	if (t->fd.size < FB_HDR_SIZE) {
		do_detach(t, t->fd.base, name);
		release(fs, j, PICK_ABSENT, 1, 0);
		return fb_fail(fs, EIO, "%s: object of %zu bytes", name, t->fd.size);
	}
	/* Now held as its writer. */
	pthread_mutex_lock(&fs->lock);
	fs->e[j].busy = 0;
	fs->e[j].writer = 1;
	fs->e[j].exists = 1;
	fs->e[j].len = 0;
	pthread_mutex_unlock(&fs->lock);
	t->fd.entry = (int32_t)j;
	t->fd.len = 0;
	t->fd.writable = 1;
	t->fd.dirty = 0;
	return 0;
}

static int op_open(struct fb_thread *t, int writable)
{
	struct fb_fileset *fs = t->fs;
	enum pick k = writable ? PICK_WRITE : PICK_READ;
	char name[64];
	uint32_t j = 0;
	uint64_t known = 0;
	int err = pick(t, k, &j, &known);

	if (err)
		return err;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	t->fd.base = do_attach(t, name, writable, &t->fd.size, &err);
	if (!t->fd.base) {
		release(fs, j, k, 1, known);
		return err;
	}
	err = read_header(t, t->fd.base, t->fd.size, FB_SET_MAIN, j, name, &t->fd.len);
	if (err) {
		do_detach(t, t->fd.base, name);
		release(fs, j, k, 1, known);
		return err;
	}
	if (t->fd.len != known)
		t->c.verify_errors++;
	t->fd.entry = (int32_t)j;
	t->fd.writable = writable;
	t->fd.dirty = 0;
	return 0;
}

static int op_close(struct fb_thread *t)
{
	struct fb_fileset *fs = t->fs;
	char name[64];
	uint32_t j = 0;
	int err = 0;

	if (t->fd.entry < 0)
		return fb_fail(fs, EBADF, "closefile: no file open");
	j = (uint32_t)t->fd.entry;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	/* Like a file system writing back its page cache: dirty data are psynced. */
	if (t->fd.writable && t->fd.dirty)
		err = do_sync(t, t->fd.base, name, t->fd.len);
	if (do_detach(t, t->fd.base, name) && !err)
		err = EIO;
	release(fs, j, t->fd.writable ? PICK_WRITE : PICK_READ, 1, t->fd.len);
	t->fd.entry = -1;
	t->fd.base = NULL;
	return err;
}

static int op_fsync(struct fb_thread *t)
{
	char name[64];
	int err;

	if (t->fd.entry < 0 || !t->fd.writable)
		return fb_fail(t->fs, EBADF, "fsync: no file open for writing");
	fb_entry_name(t->fs, FB_SET_MAIN, (uint32_t)t->fd.entry, name);
	err = do_sync(t, t->fd.base, name, t->fd.len);
	if (!err)
		t->fd.dirty = 0;
	return err;
}

/* writewholefile (@whole) or appendfilerand on the open file; *bytes written. */
static int op_write(struct fb_thread *t, int whole, uint64_t *bytes)
{
	struct fb_fileset *fs = t->fs;
	uint32_t j = 0;
	uint64_t n;

	if (t->fd.entry < 0 || !t->fd.writable)
		return fb_fail(fs, EBADF, "write: no file open for writing");
	j = (uint32_t)t->fd.entry;
	/* The entry's size (fixed when the fileset was drawn), or 1..appendsize. */
	n = whole ? fs->e[j].target : 1 + fb_rng_below(&t->rng, fs->cfg.appendsize);
	*bytes = write_data(t, t->fd.base, t->fd.size, FB_SET_MAIN, j, &t->fd.len, n,
			    whole ? fs->cfg.iosize : n);
	t->fd.dirty = 1;
	return 0;
}

static int op_read(struct fb_thread *t, uint64_t *bytes)
{
	struct fb_fileset *fs = t->fs;
	uint64_t len = t->fd.len, chunk = fs->cfg.iosize;
	uint32_t j = 0;

	if (t->fd.entry < 0)
		return fb_fail(fs, EBADF, "readwholefile: no file open");
	j = (uint32_t)t->fd.entry;
	for (uint64_t off = 0; off < len; off += chunk) {
		uint64_t c = len - off < chunk ? len - off : chunk;

		memcpy(t->buf, t->fd.base + FB_HDR_SIZE + off, c);
		if (fs->cfg.verify_reads && fb_pattern_check(t->buf, FB_SET_MAIN, j, off, c) >= 0)
			t->c.verify_errors++;
	}
	t->c.bytes_read += len;
	*bytes = len;
	return 0;
}

static int op_delete(struct fb_thread *t)
{
	struct fb_fileset *fs = t->fs;
	char name[64];
	uint32_t j = 0;
	uint64_t len = 0;
	int err = pick(t, PICK_DELETE, &j, &len);

	if (err)
		return err;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	err = fb_call_destroy(fs, name);
	if (err) {
		release(fs, j, PICK_DELETE, 1, len);
		return fb_fail(fs, err, "destroy %s: %s", name, strerror(err));
	}
	t->c.destroys++;
	release(fs, j, PICK_DELETE, 0, 0);
	return 0;
}

static int op_stat(struct fb_thread *t)
{
	struct fb_fileset *fs = t->fs;
	char name[64];
	uint8_t *base;
	size_t size = 0;
	uint32_t j = 0;
	uint64_t known = 0, len = 0;
	int err = pick(t, PICK_READ, &j, &known);

	if (err)
		return err;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	base = do_attach(t, name, 0, &size, &err);
	if (base) {
		err = read_header(t, base, size, FB_SET_MAIN, j, name, &len);
		if (!err && len != known)
			t->c.verify_errors++;
		if (do_detach(t, base, name) && !err)
			err = EIO;
	}
	release(fs, j, PICK_READ, 1, known);
	return err;
}

/* appendfilerand on the webserver log: one attachment, kept for the run. */
static int op_appendlog(struct fb_thread *t, uint64_t *bytes)
{
	struct fb_fileset *fs = t->fs;
	struct fb_log *l = &fs->log;
	char name[64];
	uint64_t n = 1 + fb_rng_below(&t->rng, fs->cfg.appendsize);
	int err = 0;

	fb_entry_name(fs, FB_SET_LOG, 0, name);
	pthread_mutex_lock(&l->lock);
	if (!l->base) {
		/* Opened on first use and kept, as Filebench keeps the log's fd. */
		l->base = do_attach(t, name, 1, &l->size, &err);
		if (l->base) {
			err = read_header(t, l->base, l->size, FB_SET_LOG, 0, name, &l->len);
			if (err) {
				do_detach(t, l->base, name);
				l->base = NULL;
			} else if (l->len != l->e.len) {
				t->c.verify_errors++;
			}
		}
	}
	if (l->base) {
		*bytes = write_data(t, l->base, l->size, FB_SET_LOG, 0, &l->len, n, n);
		l->dirty = 1;
	}
	pthread_mutex_unlock(&l->lock);
	return err;
}

/* Close the log at the end of the run: psync if written, detach. */
static int close_log(struct fb_thread *t)
{
	struct fb_fileset *fs = t->fs;
	struct fb_log *l = &fs->log;
	char name[64];
	int err = 0;

	if (!l->base)
		return 0;
	fb_entry_name(fs, FB_SET_LOG, 0, name);
	if (l->dirty)
		err = do_sync(t, l->base, name, l->len);
	if (do_detach(t, l->base, name) && !err)
		err = EIO;
	l->base = NULL;
	l->dirty = 0;
	l->e.len = l->len;
	return err;
}

static int run_flowop(struct fb_thread *t, uint32_t i, uint64_t *bytes)
{
	*bytes = 0;
	switch (t->fs->def->flowops[i].op) {
	case FB_OP_CREATE:
		return op_create(t);
	case FB_OP_WRITEWHOLE:
		return op_write(t, 1, bytes);
	case FB_OP_APPENDRAND:
		return op_write(t, 0, bytes);
	case FB_OP_FSYNC:
		return op_fsync(t);
	case FB_OP_CLOSE:
		return op_close(t);
	case FB_OP_OPEN:
		return op_open(t, t->fs->writable[i]);
	case FB_OP_READWHOLE:
		return op_read(t, bytes);
	case FB_OP_DELETE:
		return op_delete(t);
	case FB_OP_STAT:
		return op_stat(t);
	case FB_OP_APPENDLOG:
		return op_appendlog(t, bytes);
	}
	return fb_fail(t->fs, EINVAL, "unknown flowop");
}

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

			err = run_flowop(t, i, &bytes);
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
		op_close(t);
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
	if (started && close_log(&th[0]) && !err)
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
