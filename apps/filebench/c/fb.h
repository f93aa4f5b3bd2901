/*
 * fb.h - Filebench's fileserver, varmail, webproxy and webserver personalities
 * over files kept in Persistent Memory Objects (PMOs), one PMO per file.
 *
 * One engine, two users: the guest driver fb_pmo (libpmo backend) and the
 * host-side Rust harness (crate `filebench`, through FFI).  The engine never
 * calls a PMO API itself: every create, destroy, attach, psync and detach goes
 * through struct fb_pmo_ops, so the same code runs on libpmo, on the host's
 * store + pager, or on the test backend of ordinary files (fb_files.h).
 *
 * Mapping of file operations to PMO operations:
 *   createfile  = create (pcreate, capacity fb_config.file_cap) + attach for writing
 *   openfile    = attach (for writing when the flowop list writes the file
 *                 before closing it, else read-only)
 *   closefile   = sync if written since the last sync (like a file system
 *                 writing back its page cache), then detach
 *   fsync       = sync (psync)
 *   deletefile  = destroy (pdestroy)
 *   statfile    = attach read-only, read the header, detach
 *
 * A file's PMO holds a 64-byte header (struct fb_file_header in fb_data.h:
 * magic, fileset, index, length, capacity, checksum) and the data after it.
 * File data are a fixed function of (fileset, index, offset), so fb_check()
 * can verify whatever survived.  A PMO that is all zeros is an empty file
 * (created, never written).  A write past the capacity is cut to what fits
 * and counted (truncated_writes, truncated_bytes).
 *
 * Errors: functions return 0 or a positive errno value; a message saying
 * what failed is left in fb_result.error (or fb_fileset_error()).
 */
#ifndef FB_H
#define FB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The four personalities. */
enum fb_personality {
	FB_FILESERVER = 0,
	FB_VARMAIL = 1,
	FB_WEBPROXY = 2,
	FB_WEBSERVER = 3,
	FB_NPERSONALITIES = 4,
};

/* Scales for fb_config_init(). */
enum fb_scale {
	/* Filebench's own numbers (nfiles, 16..100 threads), 60 s runs. */
	FB_SCALE_FULL = 0,
	/* nfiles / 10, 4 threads, 5000 flowops (the default for this machine). */
	FB_SCALE_SMALL = 1,
};

/* What a flowop does to data: Filebench's read / write attribute. */
enum fb_kind {
	FB_KIND_OTHER = 0,
	FB_KIND_READ = 1,
	FB_KIND_WRITE = 2,
};

/*
 * Events reported through fb_config.event: each call is announced before it
 * is made (_BEGIN) and reported again after it succeeded, so a log cut by a
 * crash tells what may and what must have happened (README.md, "Crash rule").
 */
enum fb_event {
	FB_EV_CREATE = 1,	/* a file's PMO was created (empty, length 0) */
	FB_EV_PSYNC = 2,	/* a file was psynced at length @len */
	FB_EV_DESTROY = 3,	/* a file's PMO was destroyed */
	FB_EV_CREATE_BEGIN = 4,	/* about to create it */
	FB_EV_PSYNC_BEGIN = 5,	/* about to psync it at length @len */
	FB_EV_DESTROY_BEGIN = 6, /* about to destroy it */
};

#define FB_MAX_FLOWOPS	40	/* flowops of the longest personality (webserver: 31) */
#define FB_PREFIX_MAX	47	/* PMO names are "<prefix>.<index>" or "<prefix>.log" */
#define FB_ERROR_MAX	160
#define FB_PAGE		4096u

/*
 * The backend: PMO calls on names.  Every callback may be called from several
 * threads at once.  create() makes a zero-filled object of @size bytes (a
 * multiple of 4096) and returns 0 or an errno value (EEXIST if it exists);
 * destroy() returns 0 or errno (ENOENT, EBUSY while attached); attach()
 * returns the address of the whole object and its size in *size, or NULL with
 * errno set (ENOENT; EBUSY when a writer holds it, or readers and a writer
 * asks); sync() makes the object containing @addr durable; detach() ends the
 * attachment.  The engine attaches an object for writing in one thread at a
 * time and never destroys an attached object.
 */
struct fb_pmo_ops {
	int (*create)(void *ctx, const char *name, size_t size);
	int (*destroy)(void *ctx, const char *name);
	void *(*attach)(void *ctx, const char *name, int writable, size_t *size);
	int (*sync)(void *ctx, void *addr);
	int (*detach)(void *ctx, void *addr);
	void *ctx;
};

/* What to run.  Fill with fb_config_init(), then change fields. */
struct fb_config {
	uint32_t personality;	/* enum fb_personality */
	uint32_t nfiles;	/* entries of the main fileset (bigfileset) */
	uint32_t nthreads;	/* worker threads, 1..256 */
	uint32_t prealloc_pct;	/* entries that exist at start, percent */
	uint64_t ops;		/* flowops to run, rounded up to whole loops; 0: @seconds */
	uint64_t seconds;	/* run time when @ops is 0 */
	uint64_t seed;		/* everything random derives from it */
	uint64_t meanfilesize;	/* mean of the file size distribution, bytes */
	uint32_t sizegamma_milli; /* gamma shape * 1000 (Filebench: 1500); 0: fixed size */
	uint32_t verify_reads;	/* non-zero: check contents on every read */
	uint64_t iosize;	/* chunk of readwholefile / writewholefile */
	uint64_t appendsize;	/* appendfilerand appends 1..appendsize bytes */
	uint64_t file_cap;	/* bytes of each file's PMO, a multiple of 4096 */
	uint64_t log_cap;	/* bytes of the webserver log's PMO, a multiple of 4096 */
	char prefix[FB_PREFIX_MAX + 1]; /* default "fb.<personality>" */
	/* Optional: called after each create, psync and destroy (may be NULL). */
	void (*event)(void *ctx, uint32_t kind, const char *name, uint64_t len);
	void *event_ctx;
};

/* Per flowop of the personality, in its order. */
struct fb_flowop_stat {
	char name[24];		/* Filebench's flowop name, e.g. "appendfilerand2" */
	uint32_t kind;		/* enum fb_kind */
	uint32_t op;		/* internal operation code */
	uint64_t ops;
	uint64_t bytes;
	uint64_t ns;		/* total latency */
	uint64_t min_ns;
	uint64_t max_ns;
};

/* PMO traffic, for the harness. */
struct fb_counters {
	uint64_t creates;
	uint64_t destroys;
	uint64_t attaches;
	uint64_t detaches;
	uint64_t psyncs;
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t truncated_writes;	/* writes cut at the file's capacity */
	uint64_t truncated_bytes;	/* bytes they did not write */
	uint64_t pick_waits;		/* a flowop waited for an eligible entry */
	uint64_t verify_errors;		/* header length or read data not as written */
};

/* What a run did. */
struct fb_result {
	uint32_t personality;
	uint32_t nflowops;
	uint32_t nthreads;
	uint32_t nfiles;
	uint64_t loops;			/* whole passes over the flowop list */
	uint64_t elapsed_ns;		/* of the run, not of the preparation */
	struct fb_counters run;
	struct fb_counters prepare;	/* creating the prealloc'ed fileset */
	uint64_t files_at_end;		/* main-fileset files existing after the run */
	uint64_t bytes_at_end;		/* their total length */
	struct fb_flowop_stat flowops[FB_MAX_FLOWOPS];
	char error[FB_ERROR_MAX];	/* empty, or what failed */
};

/* What fb_check() found. */
struct fb_check_result {
	uint64_t entries;	/* names looked at (main fileset + log) */
	uint64_t present;	/* PMOs found */
	uint64_t empty;		/* found, all-zero header: created, never written */
	uint64_t bytes;		/* data bytes verified */
	uint64_t bad_header;	/* magic, version, fileset, index, checksum or bounds wrong */
	uint64_t bad_data;	/* a data byte differs from what was written */
	uint64_t bad_tail;	/* a byte after the length is not zero */
	uint64_t wrong_length;	/* (expect mode) length differs from the engine's */
	uint64_t wrong_presence; /* (expect mode) exists but should not, or missing */
	uint64_t errors;	/* attach/detach failed otherwise */
};

/* Status passed to the fb_check() per-file callback. */
enum fb_check_status {
	FB_CHECK_OK = 0,
	FB_CHECK_MISSING = 1,
	FB_CHECK_BAD_HEADER = 2,
	FB_CHECK_BAD_DATA = 3,
	FB_CHECK_BAD_TAIL = 4,
	FB_CHECK_WRONG_LENGTH = 5,
	FB_CHECK_WRONG_PRESENCE = 6,
	FB_CHECK_ERROR = 7,
};

/* Modes of fb_check(). */
enum fb_check_mode {
	/* Compare presence and length with what the engine did, and verify. */
	FB_CHECK_EXPECT = 0,
	/* Learn presence and length from the PMOs (e.g. after a crash), verify. */
	FB_CHECK_DISCOVER = 1,
};

struct fb_fileset;

/* Personality by name ("fileserver", ...): its number or -1. */
int fb_personality_by_name(const char *name);
/* Name of @p, or NULL. */
const char *fb_personality_name(uint32_t p);
/*
 * Write share of @p from its flowop list: *writes write flowops among *ios
 * read or write flowops per loop.  EINVAL for an unknown personality.
 */
int fb_write_share(uint32_t p, uint32_t *writes, uint32_t *ios);
/* Flowops per loop of @p (0 if unknown). */
uint32_t fb_loop_len(uint32_t p);

/* Defaults of @p at @scale (enum fb_scale); EINVAL if either is unknown. */
int fb_config_init(struct fb_config *cfg, uint32_t p, uint32_t scale);
/*
 * The default capacity of a file's PMO: header + 4 x @meanfilesize + 2 x
 * @appendsize, rounded up to 4096.  Gamma(1.5) draws a size above 4x the mean
 * in about 0.7% of the files; their writes are cut and counted.
 */
uint64_t fb_default_file_cap(uint64_t meanfilesize, uint64_t appendsize);
/* Check a configuration; 0 or EINVAL with a message in @err (@errlen bytes). */
int fb_config_check(const struct fb_config *cfg, char *err, size_t errlen);

/*
 * A fileset: the table of the personality's files (which exist, their
 * lengths and their write sizes, drawn from the seed).  Copies @cfg and
 * @ops.  No I/O.  NULL with errno (EINVAL: see fb_config_check; ENOMEM).
 */
struct fb_fileset *fb_fileset_new(const struct fb_config *cfg, const struct fb_pmo_ops *ops);
void fb_fileset_free(struct fb_fileset *fs);
/* The last error message of @fs ("" if none). */
const char *fb_fileset_error(const struct fb_fileset *fs);

/*
 * Create the prealloc'ed files (prealloc_pct percent of the entries, chosen
 * from the seed, each written with its size) and the webserver log; remove
 * leftovers of an earlier run under the same names.  Counters in res->prepare.
 */
int fb_prepare(struct fb_fileset *fs, struct fb_result *res);
/* Run the personality on a prepared (or checked) fileset. */
int fb_run_fileset(struct fb_fileset *fs, struct fb_result *res);
/*
 * Verify every file: header, data and the zero tail after the length.
 * @each (may be NULL) is called per entry.  Returns 0 when the checks ran
 * (look at @out for what they found) or an errno value.
 */
int fb_check(struct fb_fileset *fs, uint32_t mode, struct fb_check_result *out,
	     void (*each)(void *ctx, const char *name, int present, uint64_t len, uint32_t status),
	     void *ctx);
/* Non-zero when @r found nothing wrong. */
int fb_check_ok(const struct fb_check_result *r);
/* Destroy every file of the fileset (ENOENT is fine). */
int fb_cleanup(struct fb_fileset *fs);

/* fb_fileset_new + fb_prepare + fb_run_fileset + free; leaves the files. */
int fb_run(const struct fb_config *cfg, const struct fb_pmo_ops *ops, struct fb_result *res);

/*
 * Format @res like Filebench (one line per flowop: ops, ops/s, mb/s, ms/op,
 * latency range; the IO Summary line; a PMO counters line) or, with @csv, as
 * CSV.  snprintf-style: returns the length the text needs.
 */
size_t fb_format(const struct fb_result *res, int csv, char *buf, size_t len);

/* sizeof of the ABI structs, for the Rust mirror's tests: 0 config, 1 result,
 * 2 check result, 3 ops, 4 flowop stat, 5 counters; 0 for others. */
size_t fb_abi_size(uint32_t which);

#ifdef __cplusplus
}
#endif

#endif /* FB_H */
