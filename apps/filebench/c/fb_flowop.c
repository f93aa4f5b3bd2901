/*
 * fb_flowop.c - the flowops on PMOs: createfile, openfile, closefile,
 * fsync, writewholefile, appendfilerand, readwholefile, deletefile,
 * statfile and the webserver log's append, each through the backend's
 * struct fb_pmo_ops.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fb_thread.h"

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
	int err = fb_pick(t, FB_PICK_ABSENT, &j, &len);

	if (err)
		return err;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	err = fb_call_create(fs, name, fs->cfg.file_cap);
	if (err) {
		fb_release(fs, j, FB_PICK_ABSENT, 0, 0);
		return fb_fail(fs, err, "create %s: %s", name, strerror(err));
	}
	t->c.creates++;
	t->fd.base = do_attach(t, name, 1, &t->fd.size, &err);
	if (!t->fd.base) {
		fb_release(fs, j, FB_PICK_ABSENT, 1, 0);
		return err;
	}
	if (t->fd.size < FB_HDR_SIZE) {
		do_detach(t, t->fd.base, name);
		fb_release(fs, j, FB_PICK_ABSENT, 1, 0);
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
	enum fb_pick k = writable ? FB_PICK_WRITE : FB_PICK_READ;
	char name[64];
	uint32_t j = 0;
	uint64_t known = 0;
	int err = fb_pick(t, k, &j, &known);

	if (err)
		return err;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	t->fd.base = do_attach(t, name, writable, &t->fd.size, &err);
	if (!t->fd.base) {
		fb_release(fs, j, k, 1, known);
		return err;
	}
	err = read_header(t, t->fd.base, t->fd.size, FB_SET_MAIN, j, name, &t->fd.len);
	if (err) {
		do_detach(t, t->fd.base, name);
		fb_release(fs, j, k, 1, known);
		return err;
	}
	if (t->fd.len != known)
		t->c.verify_errors++;
	t->fd.entry = (int32_t)j;
	t->fd.writable = writable;
	t->fd.dirty = 0;
	return 0;
}

int fb_flowop_close(struct fb_thread *t)
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
	fb_release(fs, j, t->fd.writable ? FB_PICK_WRITE : FB_PICK_READ, 1, t->fd.len);
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
	int err = fb_pick(t, FB_PICK_DELETE, &j, &len);

	if (err)
		return err;
	fb_entry_name(fs, FB_SET_MAIN, j, name);
	err = fb_call_destroy(fs, name);
	if (err) {
		fb_release(fs, j, FB_PICK_DELETE, 1, len);
		return fb_fail(fs, err, "destroy %s: %s", name, strerror(err));
	}
	t->c.destroys++;
	fb_release(fs, j, FB_PICK_DELETE, 0, 0);
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
	int err = fb_pick(t, FB_PICK_READ, &j, &known);

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
	fb_release(fs, j, FB_PICK_READ, 1, known);
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
int fb_log_close(struct fb_thread *t)
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

int fb_flowop_run(struct fb_thread *t, uint32_t i, uint64_t *bytes)
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
		return fb_flowop_close(t);
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
