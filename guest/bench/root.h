/*
 * root.h - the persistent root object of a pmo_bench run, and its checks.
 *
 * The root lives in the PMO and is found through the heap root; everything
 * in it is by offset.  A PMO is data from outside the program (another run,
 * another program, a damaged or forged store), so root_check() treats every
 * field as hostile before anything uses it.  It is pure (no libpmo), so the
 * unit tests can feed it forged roots.
 */
#ifndef PMO_BENCH_ROOT_H
#define PMO_BENCH_ROOT_H

#include <stdint.h>

#include "kernels.h"

#define ROOT_MAGIC	0x31484e43424f4d50ULL	/* "PMOBNCH1" */
#define ROOT_VERSION	1

struct bench_root {
	uint64_t magic;
	uint32_t version;
	uint32_t kind;
	uint64_t n;
	uint64_t sweeps;
	uint64_t tile;
	uint64_t iters;
	uint64_t next;		/* iterations completed; psynced together with the data */
	uint64_t narrays;
	uint64_t off[WL_MAX_ARRAYS];
	uint64_t bytes[WL_MAX_ARRAYS];
};

/*
 * NULL when root @r, at offset @roff of a PMO of @size bytes, describes a
 * run the kernels can take up: magic and version, parameters the kernels
 * accept, progress within the iterations, and each array of exactly the
 * right length, 16-byte aligned, inside the PMO and clear of the root.
 * Else a short reason.  On NULL, @p holds the run's parameters.
 */
const char *root_check(const struct bench_root *r, uint64_t roff, uint64_t size,
		       struct wl_params *p);

#endif /* PMO_BENCH_ROOT_H */
