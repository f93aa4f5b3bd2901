/*
 * kernels.c - 2dConv, Gauss, LU and TMM exactly as docs/workloads.md defines
 * them.  Every floating-point operation is a separate binary32 operation in
 * the documented order (built with -ffp-contract=off): the Rust harness must
 * reproduce the results bit for bit.
 */
#include <string.h>

#include "kernels.h"

static const struct {
	const char *name;
	enum wl_kind kind;
} kinds[] = {
	{ "2dconv", WL_2DCONV },
	{ "gauss", WL_GAUSS },
	{ "lu", WL_LU },
	{ "tmm", WL_TMM },
};

enum wl_kind wl_kind_from_name(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (strcmp(kinds[i].name, name) == 0)
			return kinds[i].kind;
	return 0;
}

const char *wl_kind_name(enum wl_kind kind)
{
	size_t i;

	for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (kinds[i].kind == kind)
			return kinds[i].name;
	return "?";
}

const char *wl_invalid(const struct wl_params *p)
{
	uint64_t total = 0;
	unsigned int i;

	if (!wl_kind_from_name(wl_kind_name(p->kind)))
		return "unknown workload";
	if (p->n < 2 || p->n > WL_MAX_N)
		return "N out of range (2..8192)";
	switch (p->kind) {
	case WL_2DCONV:
		if (p->n < 3)
			return "2dconv needs N >= 3";
		if (p->sweeps < 1 || p->sweeps > WL_MAX_SWEEPS)
			return "sweeps out of range (1..100000)";
		break;
	case WL_TMM:
		if (p->tile < 1 || p->tile > p->n || p->n % p->tile != 0)
			return "tile must divide N";
		break;
	default:
		break;
	}
	for (i = 0; i < wl_narrays(p); i++)
		total += wl_array_bytes(p, i);
	if (total > WL_MAX_BYTES)
		return "arrays larger than 768 MiB";
	return NULL;
}

uint64_t wl_iters(const struct wl_params *p)
{
	switch (p->kind) {
	case WL_2DCONV:
		return p->sweeps;
	case WL_GAUSS:
		return p->n;		/* n-1 eliminations + back substitution */
	case WL_LU:
		return p->n - 1;
	case WL_TMM:
		return p->n / p->tile;
	}
	return 0;
}

unsigned int wl_narrays(const struct wl_params *p)
{
	switch (p->kind) {
	case WL_2DCONV:
		return 2;	/* A, B (ping-pong) */
	case WL_GAUSS:
		return 3;	/* A, b, x */
	case WL_LU:
		return 1;	/* A, in place */
	case WL_TMM:
		return 3;	/* A, B, C */
	}
	return 0;
}

uint64_t wl_array_bytes(const struct wl_params *p, unsigned int idx)
{
	uint64_t mat = p->n * p->n * sizeof(float);

	if (p->kind == WL_GAUSS && idx > 0)
		return p->n * sizeof(float);	/* b and x are vectors */
	return idx < wl_narrays(p) ? mat : 0;
}

/* The documented initial value v(i, j, s): exact integer, one rounded division. */
static float v_init(uint64_t i, uint64_t j, uint64_t s)
{
	return (float)((i * 31 + j * 17 + s) % 1000 + 1) / 1000.0f;
}

static void fill(float *m, uint64_t n, uint64_t seed, int dominant)
{
	uint64_t i, j;

	for (i = 0; i < n; i++)
		for (j = 0; j < n; j++)
			m[i * n + j] = v_init(i, j, seed);
	if (dominant)
		for (i = 0; i < n; i++)
			m[i * n + i] = m[i * n + i] + (float)n;
}

void wl_init(const struct wl_params *p, float *const a[WL_MAX_ARRAYS])
{
	uint64_t n = p->n, i;

	switch (p->kind) {
	case WL_2DCONV:
		fill(a[0], n, 1, 0);
		memset(a[1], 0, n * n * sizeof(float));
		break;
	case WL_GAUSS:
		fill(a[0], n, 1, 1);
		for (i = 0; i < n; i++) {
			a[1][i] = v_init(i, 0, 3);
			a[2][i] = 0.0f;
		}
		break;
	case WL_LU:
		fill(a[0], n, 1, 1);
		break;
	case WL_TMM:
		fill(a[0], n, 1, 0);
		fill(a[1], n, 2, 0);
		memset(a[2], 0, n * n * sizeof(float));
		break;
	}
}

static const float conv_w[3][3] = {
	{ 0.05f, 0.1f, 0.05f },
	{ 0.1f, 0.4f, 0.1f },
	{ 0.05f, 0.1f, 0.05f },
};

/* One row of sweep: interior points get the stencil, the two edge points copy. */
static void conv_row(const float *src, float *dst, uint64_t n, uint64_t i)
{
	uint64_t j;
	int di, dj;

	if (i == 0 || i == n - 1) {
		memcpy(&dst[i * n], &src[i * n], n * sizeof(float));
		return;
	}
	dst[i * n] = src[i * n];
	for (j = 1; j < n - 1; j++) {
		float acc = 0.0f;

		for (di = 0; di < 3; di++)
			for (dj = 0; dj < 3; dj++)
				acc = acc + conv_w[di][dj] * src[(i + di - 1) * n + (j + dj - 1)];
		dst[i * n + j] = acc;
	}
	dst[i * n + n - 1] = src[i * n + n - 1];
}

static void gauss_step(float *A, float *b, float *x, uint64_t n, uint64_t k, unsigned int tid,
		       unsigned int nt)
{
	uint64_t i, j;

	if (k == n - 1) {
		/* Back substitution: sequential by nature, thread 0 alone. */
		if (tid != 0)
			return;
		for (i = n; i-- > 0;) {
			float s = b[i];

			for (j = i + 1; j < n; j++)
				s = s - A[i * n + j] * x[j];
			x[i] = s / A[i * n + i];
		}
		return;
	}
	for (i = k + 1 + tid; i < n; i += nt) {
		float f = A[i * n + k] / A[k * n + k];

		for (j = k; j < n; j++)
			A[i * n + j] = A[i * n + j] - f * A[k * n + j];
		b[i] = b[i] - f * b[k];
	}
}

static void lu_step(float *A, uint64_t n, uint64_t k, unsigned int tid, unsigned int nt)
{
	uint64_t i, j;

	for (i = k + 1 + tid; i < n; i += nt) {
		A[i * n + k] = A[i * n + k] / A[k * n + k];
		for (j = k + 1; j < n; j++)
			A[i * n + j] = A[i * n + j] - A[i * n + k] * A[k * n + j];
	}
}

static void tmm_step(const float *A, const float *B, float *C, uint64_t n, uint64_t t,
		     uint64_t it, unsigned int tid, unsigned int nt)
{
	uint64_t ii = it * t, jj, kk, i, j, k;

	for (jj = (uint64_t)tid * t; jj < n; jj += (uint64_t)nt * t)
		for (kk = 0; kk < n; kk += t)
			for (i = ii; i < ii + t; i++)
				for (j = jj; j < jj + t; j++) {
					float s = C[i * n + j];

					for (k = kk; k < kk + t; k++)
						s = s + A[i * n + k] * B[k * n + j];
					C[i * n + j] = s;
				}
}

void wl_step(const struct wl_params *p, float *const a[WL_MAX_ARRAYS], uint64_t it,
	     unsigned int tid, unsigned int nthreads)
{
	uint64_t i;

	switch (p->kind) {
	case WL_2DCONV: {
		/* Even sweeps read A and write B, odd ones the other way round. */
		const float *src = a[it % 2];
		float *dst = a[(it + 1) % 2];

		for (i = tid; i < p->n; i += nthreads)
			conv_row(src, dst, p->n, i);
		break;
	}
	case WL_GAUSS:
		gauss_step(a[0], a[1], a[2], p->n, it, tid, nthreads);
		break;
	case WL_LU:
		lu_step(a[0], p->n, it, tid, nthreads);
		break;
	case WL_TMM:
		tmm_step(a[0], a[1], a[2], p->n, p->tile, it, tid, nthreads);
		break;
	}
}

uint64_t wl_fnv1a(uint64_t h, const void *data, size_t len)
{
	const unsigned char *b = data;
	size_t i;

	for (i = 0; i < len; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

/* Hash floats by their bit patterns, little-endian, whatever the host order. */
static uint64_t hash_floats(uint64_t h, const float *f, uint64_t count)
{
	uint64_t i;

	for (i = 0; i < count; i++) {
		uint32_t bits;
		unsigned char le[4];

		memcpy(&bits, &f[i], sizeof(bits));
		le[0] = bits & 0xff;
		le[1] = (bits >> 8) & 0xff;
		le[2] = (bits >> 16) & 0xff;
		le[3] = bits >> 24;
		h = wl_fnv1a(h, le, sizeof(le));
	}
	return h;
}

uint64_t wl_checksum(const struct wl_params *p, float *const a[WL_MAX_ARRAYS], uint64_t done)
{
	uint64_t nn = p->n * p->n, h = WL_FNV_BASIS;

	switch (p->kind) {
	case WL_2DCONV:
		/* The array the last sweep wrote: B after an odd count, A after an even one. */
		return hash_floats(h, a[done % 2], nn);
	case WL_GAUSS:
		h = hash_floats(h, a[0], nn);
		h = hash_floats(h, a[1], p->n);
		return hash_floats(h, a[2], p->n);
	case WL_LU:
		return hash_floats(h, a[0], nn);
	case WL_TMM:
		return hash_floats(h, a[2], nn);
	}
	return h;
}
