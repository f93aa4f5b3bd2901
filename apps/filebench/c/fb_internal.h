/*
 * fb_internal.h - the personalities' flowop lists, shared by the engine
 * (fb.c), the check (fb_check.c), the report (fb_report.c) and the tests.
 */
#ifndef FB_INTERNAL_H
#define FB_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fb.h"

/* What a flowop does (fb_flowop_stat.op). */
enum fb_op {
	FB_OP_CREATE = 1,	/* createfile: pick an absent entry, create + attach rw */
	FB_OP_WRITEWHOLE,	/* writewholefile: write the entry's size in iosize chunks */
	FB_OP_APPENDRAND,	/* appendfilerand: append 1..appendsize bytes */
	FB_OP_FSYNC,		/* fsync: psync */
	FB_OP_CLOSE,		/* closefile: psync if dirty, detach */
	FB_OP_OPEN,		/* openfile: pick an existing entry, attach */
	FB_OP_READWHOLE,	/* readwholefile: read the whole file in iosize chunks */
	FB_OP_DELETE,		/* deletefile: pick an existing idle entry, destroy */
	FB_OP_STAT,		/* statfile: attach ro, read the header, detach */
	FB_OP_APPENDLOG,	/* appendfilerand on the webserver's log file */
};

/* Filesets: the main one (Filebench's bigfileset) and the webserver log. */
#define FB_SET_MAIN	0u
#define FB_SET_LOG	1u

/* One flowop of a personality's thread. */
struct fb_flowop_def {
	const char *name;
	uint8_t op;		/* enum fb_op */
};

/* A personality: Filebench's defaults and flowop list. */
struct fb_personality_def {
	const char *name;
	uint32_t nfiles;
	uint32_t nthreads;
	uint32_t prealloc_pct;
	uint64_t meanfilesize;
	uint64_t iosize;
	uint64_t appendsize;
	int has_log;		/* webserver: a one-file log fileset, prealloc'ed */
	uint32_t nflowops;
	const struct fb_flowop_def *flowops;
};

/* The definition of @p, or NULL. */
const struct fb_personality_def *fb_personality_def(uint32_t p);
/* enum fb_kind of an operation. */
uint32_t fb_op_kind(uint32_t op);
/*
 * Whether the openfile at position @i of @def opens for writing: a write or
 * fsync flowop follows before the next closefile.
 */
int fb_open_writable(const struct fb_personality_def *def, uint32_t i);

/* One entry of a fileset; guarded by fb_fileset.lock. */
struct fb_entry {
	uint64_t target;	/* bytes writewholefile and the preallocation write */
	uint64_t len;		/* length as of the last close / psync by the engine */
	uint32_t readers;	/* read-only attachments */
	uint8_t exists;		/* its PMO exists */
	uint8_t writer;		/* attached for writing by one thread */
	uint8_t busy;		/* being created or destroyed */
};

/* The webserver's log: one writable attachment shared by all threads. */
struct fb_log {
	pthread_mutex_t lock;
	struct fb_entry e;	/* e.exists, e.len, e.target; guarded by fb_fileset.lock */
	uint8_t *base;		/* attachment, or NULL */
	size_t size;
	uint64_t len;
	int dirty;
};

/* The fileset and everything the threads of a run share. */
struct fb_fileset {
	struct fb_config cfg;
	struct fb_pmo_ops ops;
	const struct fb_personality_def *def;
	struct fb_entry *e;		/* cfg.nfiles entries */
	pthread_mutex_t lock;		/* entries, the counts below, the error */
	pthread_cond_t cond;		/* an entry was released, or a thread left */
	uint32_t running;		/* threads still looping */
	uint32_t waiting;		/* threads waiting in a pick */
	uint32_t held;			/* entries some thread holds (attached or busy) */
	int failed;			/* first error of the run, or 0 */
	char error[FB_ERROR_MAX];
	struct fb_log log;
	_Atomic uint64_t loops_claimed;
	uint64_t loops_total;		/* ops mode */
	uint64_t deadline_ns;		/* seconds mode */
	uint8_t writable[FB_MAX_FLOWOPS]; /* per openfile: attach for writing */
};

/* "<prefix>.<index>" of the main fileset or "<prefix>.log". */
void fb_entry_name(const struct fb_fileset *fs, uint32_t set, uint32_t index, char name[64]);
/* Record the first error of @fs (fs->lock not held), return @err. */
int fb_fail(struct fb_fileset *fs, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Report an event to cfg.event, if set. */
void fb_event(const struct fb_fileset *fs, uint32_t kind, const char *name, uint64_t len);
/* The backend's create, destroy and sync with their events before and after; 0 or errno. */
int fb_call_create(const struct fb_fileset *fs, const char *name, uint64_t size);
int fb_call_destroy(const struct fb_fileset *fs, const char *name);
int fb_call_sync(const struct fb_fileset *fs, void *base, const char *name, uint64_t len);

#endif /* FB_INTERNAL_H */
