/*
 * test_root - root_check() against forged roots (make -C guest/bench test).
 * A root read from a PMO is hostile: every field is changed in turn and must
 * be refused; the untouched root must pass.
 */
#include <stdio.h>
#include <string.h>

#include "root.h"

static int failures;

#define ROFF	144ULL			/* where libpmo puts the first block's payload */
#define SIZE	(64ULL * 1024)		/* the forged PMO */

/* A well-formed root of gauss N=16: A, b, x after the root, 16-byte aligned. */
static struct bench_root good(void)
{
	struct bench_root r;
	struct wl_params p = { WL_GAUSS, 16, 0, 0 };
	uint64_t at = ROFF + ((sizeof(r) + 15) & ~15ULL) + 16;
	unsigned int i;

	memset(&r, 0, sizeof(r));
	r.magic = ROOT_MAGIC;
	r.version = ROOT_VERSION;
	r.kind = p.kind;
	r.n = p.n;
	r.iters = wl_iters(&p);
	r.next = 5;
	r.narrays = wl_narrays(&p);
	for (i = 0; i < r.narrays; i++) {
		r.off[i] = at;
		r.bytes[i] = wl_array_bytes(&p, i);
		at += ((r.bytes[i] + 15) & ~15ULL) + 16;
	}
	return r;
}

static void expect(const char *what, const struct bench_root *r, uint64_t roff, uint64_t size,
		   int ok)
{
	struct wl_params p;
	const char *why = root_check(r, roff, size, &p);

	if (ok && why) {
		printf("FAIL %s: refused (%s)\n", what, why);
		failures++;
	} else if (!ok && !why) {
		printf("FAIL %s: accepted\n", what);
		failures++;
	} else if (ok && (p.kind != WL_GAUSS || p.n != 16)) {
		printf("FAIL %s: parameters not filled in\n", what);
		failures++;
	}
}

/* Apply @change to a good root f and expect it refused. */
#define REFUSED(what, change)                           \
	do {                                            \
		struct bench_root f = good();           \
		change;                                 \
		expect(what, &f, ROFF, SIZE, 0);        \
	} while (0)

int main(void)
{
	struct bench_root r = good();

	expect("a good root", &r, ROFF, SIZE, 1);
	r.next = r.iters;
	expect("a finished run", &r, ROFF, SIZE, 1);
	r = good();
	r.next = 0;
	expect("a fresh run", &r, ROFF, SIZE, 1);

	REFUSED("magic", f.magic ^= 1);
	REFUSED("version", f.version = 2);
	REFUSED("unknown kind", f.kind = 9);
	REFUSED("kind 0", f.kind = 0);
	REFUSED("N=1", f.n = 1);
	REFUSED("N too large", f.n = WL_MAX_N + 1);
	REFUSED("N huge", f.n = UINT64_MAX);
	REFUSED("iterations", f.iters = 15);
	REFUSED("progress past the end", f.next = f.iters + 1);
	REFUSED("array count", f.narrays = 2);
	REFUSED("array count huge", f.narrays = UINT64_MAX);
	REFUSED("array length", f.bytes[1] = 60);
	REFUSED("array at 0", f.off[0] = 0);
	REFUSED("array misaligned", f.off[2] += 8);
	REFUSED("array past the end", f.off[0] = SIZE + 16);
	REFUSED("array running over the end", f.off[0] = SIZE - 512);
	REFUSED("array offset near 2^64", f.off[0] = UINT64_MAX - 15);
	REFUSED("array over the root", f.off[1] = ROFF - 16);
	REFUSED("arrays overlap", f.off[2] = f.off[1]);
	REFUSED("tmm tile", (f.kind = WL_TMM, f.tile = 5, f.iters = 3, f.bytes[1] = f.bytes[0],
			     f.bytes[2] = f.bytes[0]));
	REFUSED("2dconv without sweeps", (f.kind = WL_2DCONV, f.sweeps = 0, f.iters = 0,
					  f.narrays = 2));

	r = good();
	expect("root at 0", &r, 0, SIZE, 0);
	expect("root misaligned", &r, ROFF + 4, SIZE, 0);
	expect("root past the end", &r, SIZE, SIZE, 0);
	expect("root running over the end", &r, SIZE - 8, SIZE, 0);
	expect("empty PMO size", &r, ROFF, 0, 0);

	if (failures) {
		printf("test_root: %d failure(s)\n", failures);
		return 1;
	}
	printf("test_root: all ok\n");
	return 0;
}
