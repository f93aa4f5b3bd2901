/*
 * test_kernels - unit tests of the workload kernels (make -C guest/bench test).
 * Each check prints its name and fails the run (exit 1) when it does not hold.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

static int failures;

#define CHECK(cond, ...)                                                    \
	do {                                                                \
		if (!(cond)) {                                              \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);         \
			printf(__VA_ARGS__);                                \
			printf("\n");                                       \
			failures++;                                         \
		}                                                           \
	} while (0)

struct run {
	struct wl_params p;
	float *a[WL_MAX_ARRAYS];
};

static void alloc_run(struct run *r, const struct wl_params *p)
{
	unsigned int i;

	memset(r, 0, sizeof(*r));
	r->p = *p;
	for (i = 0; i < wl_narrays(p); i++) {
		r->a[i] = malloc(wl_array_bytes(p, i));
		if (!r->a[i]) {
			perror("malloc");
			exit(1);
		}
	}
	wl_init(p, r->a);
}

static void free_run(struct run *r)
{
	unsigned int i;

	for (i = 0; i < WL_MAX_ARRAYS; i++)
		free(r->a[i]);
}

/* Iterations [from, to) with @nt threads played one after the other. */
static void steps(struct run *r, uint64_t from, uint64_t to, unsigned int nt)
{
	uint64_t it;
	unsigned int t;

	for (it = from; it < to; it++)
		for (t = 0; t < nt; t++)
			wl_step(&r->p, r->a, it, t, nt);
}

static uint64_t full_checksum(const struct wl_params *p, unsigned int nt)
{
	struct run r;
	uint64_t sum;

	alloc_run(&r, p);
	steps(&r, 0, wl_iters(p), nt);
	sum = wl_checksum(p, r.a, wl_iters(p));
	free_run(&r);
	return sum;
}

static const struct wl_params small[] = {
	{ WL_2DCONV, 16, 4, 0 },
	{ WL_GAUSS, 16, 0, 0 },
	{ WL_LU, 16, 0, 0 },
	{ WL_TMM, 16, 0, 4 },
};

/*
 * Pinned checksums of the small configurations: the definitions in
 * docs/workloads.md must not drift, and the Rust harness checks the same
 * numbers (the table in the doc).
 */
static const uint64_t golden[] = {
	0x40fb36dd42f6ee9aULL,	/* 2dconv N=16 M=4 */
	0x0e94c06d38df3446ULL,	/* gauss N=16 */
	0x92267288e96c846aULL,	/* lu N=16 */
	0xa8e26d6b00c0cf48ULL,	/* tmm N=16 T=4 */
};

static void test_fnv(void)
{
	CHECK(wl_fnv1a(WL_FNV_BASIS, "", 0) == 0xcbf29ce484222325ULL, "fnv empty");
	CHECK(wl_fnv1a(WL_FNV_BASIS, "a", 1) == 0xaf63dc4c8601ec8cULL, "fnv 'a'");
	CHECK(wl_fnv1a(WL_FNV_BASIS, "foobar", 6) == 0x85944171f73967e8ULL, "fnv 'foobar'");
}

static void test_invalid(void)
{
	struct wl_params p = { WL_TMM, 16, 0, 5 };

	CHECK(wl_invalid(&p), "tile 5 does not divide 16");
	p.tile = 4;
	CHECK(!wl_invalid(&p), "tmm 16/4 is fine");
	p = (struct wl_params){ WL_2DCONV, 2, 1, 0 };
	CHECK(wl_invalid(&p), "2dconv N=2");
	p = (struct wl_params){ WL_2DCONV, 8, 0, 0 };
	CHECK(wl_invalid(&p), "2dconv 0 sweeps");
	p = (struct wl_params){ WL_LU, 1, 0, 0 };
	CHECK(wl_invalid(&p), "lu N=1");
	p = (struct wl_params){ WL_LU, WL_MAX_N + 1, 0, 0 };
	CHECK(wl_invalid(&p), "lu N too large");
	p = (struct wl_params){ 9, 16, 0, 0 };
	CHECK(wl_invalid(&p), "unknown kind");
	CHECK(wl_kind_from_name("gauss") == WL_GAUSS && !wl_kind_from_name("GAUSS"), "names");
}

static void test_init(void)
{
	struct wl_params p = { WL_GAUSS, 4, 0, 0 };
	struct run r;

	alloc_run(&r, &p);
	/* v(0,1,1) = (17+1)%1000+1 = 19 -> 0.019; diagonal v(1,1,1)+4 = 0.050+4. */
	CHECK(r.a[0][1] == 19.0f / 1000.0f, "A[0][1] = %g", r.a[0][1]);
	CHECK(r.a[0][5] == 50.0f / 1000.0f + 4.0f, "A[1][1] = %g", r.a[0][5]);
	CHECK(r.a[1][2] == 66.0f / 1000.0f, "b[2] = %g", r.a[1][2]);
	CHECK(r.a[2][3] == 0.0f, "x starts at zero");
	free_run(&r);
}

/* Any thread count gives the same bits: every element has one writer per iteration. */
static void test_threads_agree(void)
{
	unsigned int i, nt;

	for (i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
		uint64_t one = full_checksum(&small[i], 1);

		for (nt = 2; nt <= 3; nt++)
			CHECK(full_checksum(&small[i], nt) == one, "%s with %u threads",
			      wl_kind_name(small[i].kind), nt);
	}
}

/* Stopping and going on (a resume) changes nothing. */
static void test_resume_agrees(void)
{
	unsigned int i;

	for (i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
		const struct wl_params *p = &small[i];
		uint64_t n = wl_iters(p), half = n / 2;
		struct run r;
		uint64_t mid;

		alloc_run(&r, p);
		steps(&r, 0, half, 2);
		mid = wl_checksum(p, r.a, half);
		steps(&r, half, n, 1);
		CHECK(wl_checksum(p, r.a, n) == full_checksum(p, 1), "%s resumed",
		      wl_kind_name(p->kind));
		CHECK(mid != wl_checksum(p, r.a, n), "%s: half-way differs from the end",
		      wl_kind_name(p->kind));
		free_run(&r);
	}
}

static void test_golden(void)
{
	unsigned int i;

	for (i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
		uint64_t got = full_checksum(&small[i], 1);

		printf("golden %s n=%llu sweeps=%llu tile=%llu: %016llx\n",
		       wl_kind_name(small[i].kind), (unsigned long long)small[i].n,
		       (unsigned long long)small[i].sweeps, (unsigned long long)small[i].tile,
		       (unsigned long long)got);
		CHECK(got == golden[i], "%s checksum %016llx, pinned %016llx",
		      wl_kind_name(small[i].kind), (unsigned long long)got,
		      (unsigned long long)golden[i]);
	}
}

static void test_tmm_is_a_product(void)
{
	struct wl_params p = { WL_TMM, 12, 0, 3 };
	struct run r;
	uint64_t i, j, k, n = p.n;
	int bad = 0;

	alloc_run(&r, &p);
	steps(&r, 0, wl_iters(&p), 2);
	for (i = 0; i < n; i++)
		for (j = 0; j < n; j++) {
			float s = 0.0f;

			for (k = 0; k < n; k++)
				s = s + r.a[0][i * n + k] * r.a[1][k * n + j];
			bad += s != r.a[2][i * n + j];
		}
	CHECK(bad == 0, "tmm differs from the untiled product in %d elements", bad);
	free_run(&r);
}

static void test_lu_reconstructs(void)
{
	struct wl_params p = { WL_LU, 20, 0, 0 };
	struct run orig, r;
	uint64_t i, j, k, n = p.n;
	double worst = 0;

	alloc_run(&orig, &p);
	alloc_run(&r, &p);
	steps(&r, 0, wl_iters(&p), 2);
	for (i = 0; i < n; i++)
		for (j = 0; j < n; j++) {
			double s = 0;

			for (k = 0; k <= i && k <= j; k++)
				s += (k == i ? 1.0 : r.a[0][i * n + k]) * r.a[0][k * n + j];
			worst = fmax(worst, fabs(s - orig.a[0][i * n + j]));
		}
	CHECK(worst < 1e-3, "L*U differs from A by %g", worst);
	free_run(&orig);
	free_run(&r);
}

static void test_gauss_solves(void)
{
	struct wl_params p = { WL_GAUSS, 20, 0, 0 };
	struct run orig, r;
	uint64_t i, j, n = p.n;
	double worst = 0;

	alloc_run(&orig, &p);
	alloc_run(&r, &p);
	steps(&r, 0, wl_iters(&p), 2);
	for (i = 0; i < n; i++) {
		double s = 0;

		for (j = 0; j < n; j++)
			s += (double)orig.a[0][i * n + j] * r.a[2][j];
		worst = fmax(worst, fabs(s - orig.a[1][i]));
	}
	CHECK(worst < 1e-4, "A*x differs from b by %g", worst);
	free_run(&orig);
	free_run(&r);
}

static void test_conv_stencil(void)
{
	struct wl_params p = { WL_2DCONV, 6, 1, 0 };
	struct run r;
	static const double w[3][3] = { { .05, .1, .05 }, { .1, .4, .1 }, { .05, .1, .05 } };
	double want = 0;
	int di, dj;

	alloc_run(&r, &p);
	steps(&r, 0, 1, 2);
	for (di = 0; di < 3; di++)
		for (dj = 0; dj < 3; dj++)
			want += w[di][dj] * r.a[0][(2 + di - 1) * 6 + (3 + dj - 1)];
	CHECK(fabs(r.a[1][2 * 6 + 3] - want) < 1e-6, "B[2][3] = %g, want %g", r.a[1][15], want);
	CHECK(r.a[1][0] == r.a[0][0] && r.a[1][5 * 6 + 2] == r.a[0][5 * 6 + 2] &&
	      r.a[1][3 * 6 + 5] == r.a[0][3 * 6 + 5], "borders copy");
	/* Sweep 2 writes back into A, and the checksum follows it. */
	steps(&r, 1, 2, 1);
	CHECK(wl_checksum(&p, r.a, 2) != wl_checksum(&p, r.a, 1), "checksum follows the sweep");
	free_run(&r);
}

int main(void)
{
	test_fnv();
	test_invalid();
	test_init();
	test_threads_agree();
	test_resume_agrees();
	test_tmm_is_a_product();
	test_lu_reconstructs();
	test_gauss_solves();
	test_conv_stencil();
	test_golden();
	if (failures) {
		printf("test_kernels: %d failure(s)\n", failures);
		return 1;
	}
	printf("test_kernels: all ok\n");
	return 0;
}
