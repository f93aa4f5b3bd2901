/*
 * fb_thread.h - one worker thread of a run and what it does: the thread's
 * state (fb.c runs the threads), the pick of fileset entries shared between
 * threads (fb_pick.c) and the flowops on PMOs (fb_flowop.c).
 */
#ifndef FB_THREAD_H
#define FB_THREAD_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fb_data.h"
#include "fb_internal.h"

/* What a pick takes an entry for. */
enum fb_pick {
	FB_PICK_ABSENT,		/* createfile */
	FB_PICK_WRITE,		/* openfile for writing */
	FB_PICK_READ,		/* openfile read-only, statfile */
	FB_PICK_DELETE,		/* deletefile */
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

/*
 * Pick an entry for @k and take it (busy, writer or reader); *len is its
 * length as the engine knows it.  Waits while none is eligible.  0, or the
 * run's error.
 */
int fb_pick(struct fb_thread *t, enum fb_pick k, uint32_t *out, uint64_t *len);
/* Release entry @j taken with @k; @exists and @len are its new state (writer/busy). */
void fb_release(struct fb_fileset *fs, uint32_t j, enum fb_pick k, int exists, uint64_t len);

/* Run flowop @i of the personality on thread @t; *bytes read or written.  0 or errno. */
int fb_flowop_run(struct fb_thread *t, uint32_t i, uint64_t *bytes);
/* closefile: psync the open file if dirty, detach, release its entry.  0 or errno. */
int fb_flowop_close(struct fb_thread *t);
/* Close the log at the end of the run: psync if written, detach.  0 or errno. */
int fb_log_close(struct fb_thread *t);

#endif /* FB_THREAD_H */
