/*
 * pmo_bench - the papers' microbenchmarks on a PMO (docs/workloads.md).
 *
 *   pmo_bench run WORKLOAD N [-t THREADS] [-c CADENCE] [-s SESSION] [-m SWEEPS]
 *                 [-T TILE] [-n NAME] [-k KEY] [-x STOP] [-X] [-D DESIGN]
 *   pmo_bench verify [-n NAME] [-k KEY] [-D DESIGN]
 *   pmo_bench ref WORKLOAD N [-m SWEEPS] [-T TILE]
 *
 * "run" keeps its arrays in PMO NAME (created if missing), allocated with
 * p_malloc and found again through the persistent root by offset, psyncs
 * every CADENCE iterations and detaches/re-attaches every SESSION psyncs, so
 * the computation continues at whatever address the next attach returns.  A
 * PMO that holds an unfinished run of the same workload is resumed from its
 * last psync.  "verify" recomputes as many iterations in malloc memory and
 * compares checksums.  The key comes from -k or $PMO_KEY and is never printed.
 * -D selects the host's PMO design (wedi, bp-ip, ..., d) before attaching; it
 * is device-wide and stays for later attaches of every process.
 *
 * Exit status: 0 ok, 1 error (one "pmo_bench: ..." line on stderr), 2 usage,
 * 3 verify found a different checksum.
 *
 * One concern, kept whole past 600 lines: driving a workload through PMO
 * sessions; the kernels are kernels.c, the persistent root root.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels.h"
#include "pmo.h"
#include "root.h"

#define MAX_THREADS	8
#define PAGE		4096ULL

struct opts {
	const char *mode;
	struct wl_params p;
	unsigned int threads;
	uint64_t cadence;
	uint64_t session;
	uint64_t stop;		/* 0: run to the end */
	int scribble;		/* -X: one unsynced iteration after the stop, then exit */
	char name[PMO_NAME_MAX + 1];
	char key[PMO_KEY_MAX + 1];
	const char *design;	/* NULL: leave the device's design alone */
};

/* What thread 0 measured; printed in the PMOBENCH line. */
struct timing {
	uint64_t attach_ns, setup_ns, compute_ns, psync_ns, detach_ns, total_ns;
	uint64_t psyncs, detaches, faults, fault_ns, prefetched;
};

/* State the worker threads share; changed by thread 0 only between the two barriers. */
struct shared {
	const struct opts *o;
	const char *key;
	unsigned char *base;	/* current attach address */
	uint64_t root_off;
	float *arr[WL_MAX_ARRAYS];
	uint64_t start, end;
	uint64_t session_psyncs;
	pthread_barrier_t bar;
	int failed;		/* set by thread 0: everybody leaves after the barrier */
	char err[160];
	struct timing t;
};

/*
 * The key buffer of the running command, wiped at exit whichever way the
 * program ends (die() exits from deep inside).
 */
static char *key_to_wipe;

static void wipe_key(void)
{
	if (key_to_wipe)
		explicit_bzero(key_to_wipe, PMO_KEY_MAX + 1);
}

static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("pmo_bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void usage(void)
{
	fputs("usage: pmo_bench run WORKLOAD N [-t THREADS] [-c CADENCE] [-s SESSION] [-m SWEEPS]\n"
	      "                     [-T TILE] [-n NAME] [-k KEY] [-x STOP] [-X] [-D DESIGN]\n"
	      "       pmo_bench verify [-n NAME] [-k KEY] [-D DESIGN]\n"
	      "       pmo_bench ref WORKLOAD N [-m SWEEPS] [-T TILE]\n"
	      "WORKLOAD: 2dconv gauss lu tmm; key from -k or $PMO_KEY\n", stderr);
	exit(2);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t parse_u64(const char *s, const char *what, uint64_t max)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || !*s || *end || *s == '-' || v > max) {
		fprintf(stderr, "pmo_bench: bad %s '%s' (0..%llu)\n", what, s,
			(unsigned long long)max);
		exit(2);
	}
	return v;
}

static void parse(int argc, char **argv, struct opts *o)
{
	const char *key = NULL;
	int i, positional = 0, need;

	memset(o, 0, sizeof(*o));
	if (argc < 2)
		usage();
	o->mode = argv[1];
	o->threads = 1;
	o->cadence = 1;
	o->p.sweeps = 4;
	o->p.tile = 8;
	need = strcmp(o->mode, "verify") == 0 ? 0 : 2;
	if (need == 2 && strcmp(o->mode, "run") != 0 && strcmp(o->mode, "ref") != 0)
		usage();
	for (i = 2; i < argc; i++) {
		const char *a = argv[i];

		if (a[0] == '-' && a[1] && !a[2]) {
			if (a[1] == 'X') {
				o->scribble = 1;
				continue;
			}
			if (i + 1 >= argc)
				usage();
			switch (a[1]) {
			case 't':
				o->threads = parse_u64(argv[++i], "threads", MAX_THREADS);
				break;
			case 'c':
				o->cadence = parse_u64(argv[++i], "cadence", UINT32_MAX);
				break;
			case 's':
				o->session = parse_u64(argv[++i], "session size", UINT32_MAX);
				break;
			case 'm':
				o->p.sweeps = parse_u64(argv[++i], "sweeps", WL_MAX_SWEEPS);
				break;
			case 'T':
				o->p.tile = parse_u64(argv[++i], "tile", WL_MAX_N);
				break;
			case 'x':
				o->stop = parse_u64(argv[++i], "stop", UINT32_MAX);
				break;
			case 'n':
				if (strlen(argv[++i]) > PMO_NAME_MAX)
					usage();
				strcpy(o->name, argv[i]);
				break;
			case 'k':
				key = argv[++i];
				break;
			case 'D':
				o->design = argv[++i];
				break;
			default:
				usage();
			}
			continue;
		}
		if (positional == 0 && need > 0) {
			o->p.kind = wl_kind_from_name(a);
			if (!o->p.kind) {
				fprintf(stderr, "pmo_bench: unknown workload '%s'\n", a);
				exit(2);
			}
		} else if (positional == 1 && need > 1) {
			o->p.n = parse_u64(a, "N", WL_MAX_N);
		} else {
			usage();
		}
		positional++;
	}
	if (positional != need || o->threads < 1 || o->cadence < 1)
		usage();
	if (o->scribble && !o->stop)
		usage();
	if (need) {
		const char *why = wl_invalid(&o->p);

		if (why) {
			fprintf(stderr, "pmo_bench: %s\n", why);
			exit(2);
		}
	}
	if (!o->name[0])
		snprintf(o->name, sizeof(o->name), "bench-%s",
			 need ? wl_kind_name(o->p.kind) : "gauss");
	if (strcmp(o->mode, "ref") == 0)
		return;
	if (o->design && pmo_set_design(o->design) < 0)
		die("design %s: %s", o->design, strerror(errno));
	if (!key)
		key = getenv("PMO_KEY");
	if (!key || !*key || strlen(key) > PMO_KEY_MAX) {
		fputs("pmo_bench: need a key of 1..64 bytes (-k or $PMO_KEY)\n", stderr);
		exit(2);
	}
	strcpy(o->key, key);
	key_to_wipe = o->key;
	atexit(wipe_key);
	/* Our copy is the only one we keep; a -k argument is wiped from argv. */
	for (i = 2; i < argc; i++)
		if (argv[i] == key)
			explicit_bzero(argv[i], strlen(argv[i]));
}

/* PMO bytes for the arrays: the heap header, the root and each block with its header. */
static uint64_t pmo_bytes(const struct wl_params *p)
{
	uint64_t sz = 2 * PAGE + sizeof(struct bench_root) + 64;
	unsigned int i;

	for (i = 0; i < wl_narrays(p); i++)
		sz += ((wl_array_bytes(p, i) + 15) & ~15ULL) + 64;
	return (sz + PAGE - 1) & ~(PAGE - 1);
}

/*
 * The root of the PMO at @base, checked as hostile data (root_check()).
 * NULL with @why set when anything is off (also when there is no root).
 * Fills @p and @arr.
 */
static struct bench_root *load_root(unsigned char *base, struct wl_params *p,
				    float *arr[WL_MAX_ARRAYS], const char **why)
{
	struct bench_root *r;
	unsigned int i;

	errno = 0;
	r = p_get_root(base);
	if (!r) {
		/* p_get_root: 0 = heap without root, EINVAL = no heap, EBADMSG = broken heap. */
		*why = errno == 0 || errno == EINVAL ? "no pmo_bench run in this PMO" :
		       errno == EBADMSG ? "its heap header is corrupted" :
		       "cannot read the heap root";
		return NULL;
	}
	*why = root_check(r, p_off(base, r), pmo_size(base), p);
	if (*why)
		return NULL;
	for (i = 0; i < WL_MAX_ARRAYS; i++) {
		arr[i] = i < r->narrays ? p_ptr(base, r->off[i]) : NULL;
		if (i < r->narrays && !arr[i]) {
			*why = "an array lies outside the PMO";
			return NULL;
		}
	}
	return r;
}

/* Attach @name for writing; counts the time. */
static unsigned char *timed_attach(struct shared *sh)
{
	uint64_t t0 = now_ns();
	unsigned char *b = attach(sh->o->name, PMO_WRITE, sh->key);

	sh->t.attach_ns += now_ns() - t0;
	return b;
}

static int fail(struct shared *sh, const char *what, int err)
{
	snprintf(sh->err, sizeof(sh->err), "%s: %s", what, strerror(err));
	sh->failed = 1;
	return -1;
}

/* Collect the session's host fault count, then detach. */
static int end_session(struct shared *sh)
{
	struct pmo_stat st;
	uint64_t t0;

	if (pmo_stat(sh->base, &st) < 0)
		return fail(sh, "pmo_stat", errno);
	sh->t.faults += st.host.faults;
	sh->t.fault_ns += st.host.fault_ns_total;
	sh->t.prefetched += st.host.pages_prefetched;
	t0 = now_ns();
	if (detach(sh->base) < 0)
		return fail(sh, "detach", errno);
	sh->t.detach_ns += now_ns() - t0;
	sh->t.detaches++;
	sh->base = NULL;
	return 0;
}

/* Point the array pointers at the current attachment (after a re-attach). */
static int rebase(struct shared *sh)
{
	struct wl_params p;
	const char *why = NULL;

	if (!load_root(sh->base, &p, sh->arr, &why)) {
		snprintf(sh->err, sizeof(sh->err), "after re-attach: %s", why);
		sh->failed = 1;
		return -1;
	}
	return 0;
}

/*
 * Thread 0's work after iteration @it: record progress, psync on the cadence,
 * detach and re-attach at the session size.  Runs while the others wait.
 */
static int after_iteration(struct shared *sh, uint64_t it)
{
	const struct opts *o = sh->o;
	struct bench_root *r = p_ptr(sh->base, sh->root_off);
	uint64_t done = it + 1, t0;

	if (!r)
		return fail(sh, "root", EINVAL);
	r->next = done;
	if (done % o->cadence != 0 && done != r->iters && done != sh->end)
		return 0;
	t0 = now_ns();
	if (psync(sh->base) < 0)
		return fail(sh, "psync", errno);
	sh->t.psync_ns += now_ns() - t0;
	sh->t.psyncs++;
	sh->session_psyncs++;
	if (o->session == 0 || sh->session_psyncs < o->session || done == sh->end)
		return 0;
	if (end_session(sh) < 0)
		return -1;
	sh->base = timed_attach(sh);
	if (!sh->base)
		return fail(sh, "re-attach", errno);
	sh->session_psyncs = 0;
	return rebase(sh);
}

struct worker {
	struct shared *sh;
	unsigned int tid;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	struct shared *sh = w->sh;
	uint64_t it;

	for (it = sh->start; it < sh->end; it++) {
		uint64_t t0 = now_ns();

		wl_step(&sh->o->p, sh->arr, it, w->tid, sh->o->threads);
		pthread_barrier_wait(&sh->bar);
		if (w->tid == 0) {
			sh->t.compute_ns += now_ns() - t0;
			after_iteration(sh, it);
		}
		/* The others pick up the new base and arrays (or the failure) here. */
		pthread_barrier_wait(&sh->bar);
		if (sh->failed)
			break;
	}
	return NULL;
}

/* A fresh run: arrays from p_malloc, initial values, the root; psynced. */
static int setup(struct shared *sh, struct bench_root **rootp)
{
	const struct wl_params *p = &sh->o->p;
	struct bench_root *r;
	unsigned int i;

	r = p_calloc(sh->base, 1, sizeof(*r));
	if (!r)
		return fail(sh, "p_calloc root", errno);
	for (i = 0; i < wl_narrays(p); i++) {
		sh->arr[i] = p_malloc(sh->base, wl_array_bytes(p, i));
		if (!sh->arr[i])
			return fail(sh, "p_malloc array", errno);
		r->off[i] = p_off(sh->base, sh->arr[i]);
		if (!r->off[i])
			return fail(sh, "p_off array", errno);
		r->bytes[i] = wl_array_bytes(p, i);
	}
	wl_init(p, sh->arr);
	r->kind = p->kind;
	r->n = p->n;
	r->sweeps = p->sweeps;
	r->tile = p->tile;
	r->iters = wl_iters(p);
	r->next = 0;
	r->narrays = wl_narrays(p);
	r->version = ROOT_VERSION;
	r->magic = ROOT_MAGIC;
	if (p_set_root(sh->base, r) < 0)
		return fail(sh, "p_set_root", errno);
	if (psync(sh->base) < 0)
		return fail(sh, "psync", errno);
	*rootp = r;
	return 0;
}

static int same_run(const struct wl_params *a, const struct wl_params *b)
{
	return a->kind == b->kind && a->n == b->n &&
	       (a->kind != WL_2DCONV || a->sweeps == b->sweeps) &&
	       (a->kind != WL_TMM || a->tile == b->tile);
}

static int cmd_run(const struct opts *o)
{
	struct shared sh;
	struct worker w[MAX_THREADS];
	pthread_t tids[MAX_THREADS];
	struct bench_root *r = NULL;
	struct wl_params have;
	const char *why = NULL;
	uint64_t t_start = now_ns(), t0, sum;
	unsigned int i;
	int err;

	memset(&sh, 0, sizeof(sh));
	sh.o = o;
	sh.key = o->key;
	if (pcreate(o->name, pmo_bytes(&o->p), o->key) < 0 && errno != EEXIST)
		die("pcreate %s: %s", o->name, strerror(errno));
	sh.base = timed_attach(&sh);
	if (!sh.base)
		die("attach %s: %s", o->name, strerror(errno));
	t0 = now_ns();
	/*
	 * A fresh PMO is zero-filled: no heap yet (EINVAL; the first p_malloc
	 * formats it), or a heap without a root.  Anything else must be a run.
	 */
	errno = 0;
	if (!p_get_root(sh.base) && (errno == 0 || errno == EINVAL)) {
		if (setup(&sh, &r) < 0)
			die("%s", sh.err);
	} else {
		r = load_root(sh.base, &have, sh.arr, &why);
		if (!r)
			die("PMO %s: %s", o->name, why);
		if (!same_run(&have, &o->p))
			die("PMO %s holds a different run (%s N=%llu)", o->name,
			    wl_kind_name(have.kind), (unsigned long long)have.n);
		if (r->next == r->iters)
			die("PMO %s holds a finished run; remove it first", o->name);
	}
	sh.t.setup_ns = now_ns() - t0;
	sh.root_off = p_off(sh.base, r);
	sh.start = r->next;
	sh.end = r->iters;
	if (o->stop && o->stop < sh.end) {
		if (o->stop <= sh.start)
			die("stop %llu is not after the resume point %llu",
			    (unsigned long long)o->stop, (unsigned long long)sh.start);
		sh.end = o->stop;
	}

	err = pthread_barrier_init(&sh.bar, NULL, o->threads);
	if (err)
		die("pthread_barrier_init: %s", strerror(err));
	for (i = 0; i < o->threads; i++) {
		w[i].sh = &sh;
		w[i].tid = i;
	}
	for (i = 1; i < o->threads; i++) {
		err = pthread_create(&tids[i], NULL, work, &w[i]);
		if (err)
			die("pthread_create: %s", strerror(err));
	}
	work(&w[0]);
	for (i = 1; i < o->threads; i++) {
		err = pthread_join(tids[i], NULL);
		if (err)
			die("pthread_join: %s", strerror(err));
	}
	pthread_barrier_destroy(&sh.bar);
	if (sh.failed)
		die("%s", sh.err);

	r = p_ptr(sh.base, sh.root_off);
	if (!r)
		die("root: %s", strerror(EINVAL));
	sum = wl_checksum(&o->p, sh.arr, r->next);
	if (o->scribble && sh.end < r->iters) {
		/*
		 * The crash test: change the data past the last psync and leave
		 * without psync or detach; the driver's release must drop it.
		 */
		wl_step(&o->p, sh.arr, sh.end, 0, 1);
		r->next = sh.end + 1;
		printf("PMOBENCH-SCRIBBLE workload=%s n=%llu done=%llu unsynced=1\n",
		       wl_kind_name(o->p.kind), (unsigned long long)o->p.n,
		       (unsigned long long)sh.end);
		fflush(stdout);
		wipe_key();	/* _exit() skips the atexit handler */
		_exit(0);
	}
	if (end_session(&sh) < 0)
		die("%s", sh.err);
	sh.t.total_ns = now_ns() - t_start;
	printf("PMOBENCH workload=%s n=%llu threads=%u cadence=%llu session=%llu iters=%llu "
	       "done=%llu start=%llu psyncs=%llu detaches=%llu faults=%llu fault_ns=%llu "
	       "prefetched=%llu attach_ns=%llu "
	       "setup_ns=%llu compute_ns=%llu psync_ns=%llu detach_ns=%llu total_ns=%llu "
	       "checksum=%016llx\n",
	       wl_kind_name(o->p.kind), (unsigned long long)o->p.n, o->threads,
	       (unsigned long long)o->cadence, (unsigned long long)o->session,
	       (unsigned long long)wl_iters(&o->p), (unsigned long long)sh.end,
	       (unsigned long long)sh.start, (unsigned long long)sh.t.psyncs,
	       (unsigned long long)sh.t.detaches, (unsigned long long)sh.t.faults,
	       (unsigned long long)sh.t.fault_ns, (unsigned long long)sh.t.prefetched,
	       (unsigned long long)sh.t.attach_ns, (unsigned long long)sh.t.setup_ns,
	       (unsigned long long)sh.t.compute_ns, (unsigned long long)sh.t.psync_ns,
	       (unsigned long long)sh.t.detach_ns, (unsigned long long)sh.t.total_ns,
	       (unsigned long long)sum);
	return 0;
}

/* Plain-memory run of @p's first @iters iterations; its checksum. */
static uint64_t reference(const struct wl_params *p, uint64_t iters)
{
	float *a[WL_MAX_ARRAYS] = { NULL, NULL, NULL };
	uint64_t it, sum;
	unsigned int i;

	for (i = 0; i < wl_narrays(p); i++) {
		a[i] = malloc(wl_array_bytes(p, i));
		if (!a[i])
			die("malloc %llu bytes: %s", (unsigned long long)wl_array_bytes(p, i),
			    strerror(errno));
	}
	wl_init(p, a);
	for (it = 0; it < iters; it++)
		wl_step(p, a, it, 0, 1);
	sum = wl_checksum(p, a, iters);
	for (i = 0; i < WL_MAX_ARRAYS; i++)
		free(a[i]);
	return sum;
}

static int cmd_verify(const struct opts *o)
{
	float *arr[WL_MAX_ARRAYS];
	struct wl_params p;
	struct bench_root *r;
	const char *why = NULL;
	unsigned char *base;
	uint64_t done, iters, got, want;

	base = attach(o->name, PMO_READ, o->key);
	if (!base)
		die("attach %s: %s", o->name, strerror(errno));
	r = load_root(base, &p, arr, &why);
	if (!r)
		die("PMO %s: %s", o->name, why);
	/* Copy what we need before detaching; the PMO is read-only anyway. */
	done = r->next;
	iters = r->iters;
	got = wl_checksum(&p, arr, done);
	if (detach(base) < 0)
		die("detach: %s", strerror(errno));
	want = reference(&p, done);
	printf("PMOBENCH-VERIFY workload=%s n=%llu done=%llu iters=%llu checksum=%016llx "
	       "reference=%016llx match=%s\n",
	       wl_kind_name(p.kind), (unsigned long long)p.n, (unsigned long long)done,
	       (unsigned long long)iters, (unsigned long long)got, (unsigned long long)want,
	       got == want ? "yes" : "no");
	return got == want ? 0 : 3;
}

int main(int argc, char **argv)
{
	struct opts o;
	int rc;

	parse(argc, argv, &o);
	if (strcmp(o.mode, "ref") == 0) {
		printf("PMOBENCH-REF workload=%s n=%llu iters=%llu checksum=%016llx\n",
		       wl_kind_name(o.p.kind), (unsigned long long)o.p.n,
		       (unsigned long long)wl_iters(&o.p),
		       (unsigned long long)reference(&o.p, wl_iters(&o.p)));
		return 0;
	}
	rc = strcmp(o.mode, "run") == 0 ? cmd_run(&o) : cmd_verify(&o);
	wipe_key();
	key_to_wipe = NULL;
	return rc;
}
