/*
 * kernels.h - the papers' four microbenchmarks (2dConv, Gauss, LU, TMM) as
 * pure functions over float arrays.
 *
 * The exact definitions (initial values, operation order, iteration counts,
 * thread split, checksum) are in docs/workloads.md; the host-side harness
 * implements the same ones in Rust, so both give bit-identical checksums.
 * The kernels know nothing about PMOs: pmo_bench hands them arrays inside a
 * PMO, the verifier hands them malloc'ed ones.
 */
#ifndef PMO_BENCH_KERNELS_H
#define PMO_BENCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define WL_MAX_ARRAYS	3
#define WL_MAX_N	8192			/* keeps N*N*4 inside 256 MiB */
#define WL_MAX_BYTES	(768ULL << 20)		/* all arrays; the window is 1 GiB */
#define WL_MAX_SWEEPS	100000

enum wl_kind {
	WL_2DCONV = 1,
	WL_GAUSS = 2,
	WL_LU = 3,
	WL_TMM = 4,
};

struct wl_params {
	enum wl_kind kind;
	uint64_t n;		/* matrix side */
	uint64_t sweeps;	/* 2dConv only: stencil sweeps */
	uint64_t tile;		/* TMM only: tile side, divides n */
};

/* The workload called @name ("2dconv", "gauss", "lu", "tmm"), or 0. */
enum wl_kind wl_kind_from_name(const char *name);
const char *wl_kind_name(enum wl_kind kind);

/*
 * NULL when @p describes a workload the kernels can run within the limits
 * above, else a short reason.  Every other function assumes this passed.
 */
const char *wl_invalid(const struct wl_params *p);

/* Outer-loop iterations of the whole workload. */
uint64_t wl_iters(const struct wl_params *p);

/* Number of arrays, and the byte length of array @idx. */
unsigned int wl_narrays(const struct wl_params *p);
uint64_t wl_array_bytes(const struct wl_params *p, unsigned int idx);

/* Fill the arrays with their initial values. */
void wl_init(const struct wl_params *p, float *const a[WL_MAX_ARRAYS]);

/*
 * Thread @tid's share (of @nthreads) of iteration @it.  All threads of an
 * iteration must finish before any starts the next one.
 */
void wl_step(const struct wl_params *p, float *const a[WL_MAX_ARRAYS], uint64_t it,
	     unsigned int tid, unsigned int nthreads);

/* FNV-1a 64 over @len bytes, continuing from @h (start: WL_FNV_BASIS). */
#define WL_FNV_BASIS 0xcbf29ce484222325ULL
uint64_t wl_fnv1a(uint64_t h, const void *data, size_t len);

/* Checksum of the output arrays after @done iterations. */
uint64_t wl_checksum(const struct wl_params *p, float *const a[WL_MAX_ARRAYS], uint64_t done);

#endif /* PMO_BENCH_KERNELS_H */
