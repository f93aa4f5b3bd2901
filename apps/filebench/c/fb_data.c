/*
 * fb_data.c - random numbers, the gamma size distribution, the file header
 * and the data pattern (fb_data.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "fb_data.h"

#include <math.h>
#include <string.h>
#include <time.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the data pattern and the header assume a little-endian machine"
#endif

#define GOLDEN 0x9E3779B97F4A7C15ull

/* The splitmix64 output function. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

void fb_rng_seed(struct fb_rng *r, uint64_t seed, uint64_t stream)
{
	r->s = mix64(seed ^ mix64((stream + 1) * GOLDEN));
}

uint64_t fb_rng_next(struct fb_rng *r)
{
	r->s += GOLDEN;
	return mix64(r->s);
}

uint64_t fb_rng_below(struct fb_rng *r, uint64_t n)
{
	uint64_t limit, x;

	if (n <= 1)
		return 0;
	/* Reject the top partial block so every residue is equally likely. */
	limit = UINT64_MAX - UINT64_MAX % n;
	do
		x = fb_rng_next(r);
	while (x >= limit);
	return x % n;
}

double fb_rng_unit(struct fb_rng *r)
{
	/* 53 random bits, shifted off zero: (0, 1). */
	return ((double)(fb_rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

/* A standard normal deviate (Box-Muller, one of the pair). */
static double normal(struct fb_rng *r)
{
	double u1 = fb_rng_unit(r), u2 = fb_rng_unit(r);

	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Gamma(@a, 1) by Marsaglia and Tsang's squeeze method; @a > 0. */
static double gamma_unit(struct fb_rng *r, double a)
{
	double d, c;

	if (a < 1.0) {
		/* Gamma(a) = Gamma(a + 1) * U^(1/a). */
		double g = gamma_unit(r, a + 1.0);

		return g * pow(fb_rng_unit(r), 1.0 / a);
	}
	d = a - 1.0 / 3.0;
	c = 1.0 / sqrt(9.0 * d);
	for (;;) {
		double x = normal(r), v = 1.0 + c * x, u;

		if (v <= 0.0)
			continue;
		v = v * v * v;
		u = fb_rng_unit(r);
		if (u < 1.0 - 0.0331 * x * x * x * x)
			return d * v;
		if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
			return d * v;
	}
}

uint64_t fb_gamma_size(struct fb_rng *r, uint64_t mean, uint32_t gamma_milli)
{
	double shape, x;

	if (gamma_milli == 0 || mean == 0)
		return mean;
	shape = gamma_milli / 1000.0;
	x = gamma_unit(r, shape) * ((double)mean / shape);
	if (x >= 18446744073709549568.0)
		return UINT64_MAX;
	return (uint64_t)x;
}

/* FNV-1a, 64 bits. */
static uint64_t fnv1a(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 0xcbf29ce484222325ull;

	while (n--) {
		h ^= *b++;
		h *= 0x100000001b3ull;
	}
	return h;
}

#define HDR_SUMMED offsetof(struct fb_file_header, sum)

void fb_header_write(void *base, uint32_t fileset, uint32_t index, uint64_t len, uint64_t cap)
{
	struct fb_file_header h;

	memset(&h, 0, sizeof(h));
	memcpy(h.magic, FB_HDR_MAGIC, sizeof(h.magic));
	h.version = FB_HDR_VERSION;
	h.fileset = fileset;
	h.index = index;
	h.len = len;
	h.cap = cap;
	h.sum = fnv1a(&h, HDR_SUMMED);
	memcpy(base, &h, sizeof(h));
}

int fb_header_read(const void *base, size_t size, uint32_t fileset, uint32_t index, uint64_t *len)
{
	static const uint8_t zeros[FB_HDR_SIZE];
	struct fb_file_header h;

	*len = 0;
	if (size < FB_HDR_SIZE)
		return FB_HDR_BAD;
	memcpy(&h, base, sizeof(h));
	if (memcmp(&h, zeros, sizeof(h)) == 0)
		return FB_HDR_EMPTY;
	if (memcmp(h.magic, FB_HDR_MAGIC, sizeof(h.magic)) != 0 || h.version != FB_HDR_VERSION ||
	    h.fileset != fileset || h.index != index || h.zero != 0 ||
	    h.sum != fnv1a(&h, HDR_SUMMED) || memcmp(h.pad, zeros, sizeof(h.pad)) != 0)
		return FB_HDR_BAD;
	if (h.cap != size - FB_HDR_SIZE || h.len > h.cap)
		return FB_HDR_BAD;
	*len = h.len;
	return FB_HDR_VALID;
}

/* The 8 pattern bytes of word @w (bytes 8w .. 8w+7) of file @key. */
static uint64_t pat_word(uint64_t key, uint64_t w)
{
	return mix64(key + w * GOLDEN);
}

static uint64_t pat_key(uint32_t fileset, uint32_t index)
{
	return mix64(((uint64_t)fileset << 32 | index) ^ 0x243F6A8885A308D3ull);
}

void fb_pattern_fill(uint8_t *dst, uint32_t fileset, uint32_t index, uint64_t off, size_t n)
{
	uint64_t key = pat_key(fileset, index);

	while (n && (off & 7)) {
		*dst++ = (uint8_t)(pat_word(key, off >> 3) >> (8 * (off & 7)));
		off++;
		n--;
	}
	while (n >= 8) {
		uint64_t w = pat_word(key, off >> 3);

		memcpy(dst, &w, 8);
		dst += 8;
		off += 8;
		n -= 8;
	}
	while (n) {
		*dst++ = (uint8_t)(pat_word(key, off >> 3) >> (8 * (off & 7)));
		off++;
		n--;
	}
}

int64_t fb_pattern_check(const uint8_t *src, uint32_t fileset, uint32_t index, uint64_t off,
			 size_t n)
{
	uint64_t key = pat_key(fileset, index);
	uint64_t start = off;

	while (n) {
		uint64_t w = pat_word(key, off >> 3);

		if ((off & 7) == 0 && n >= 8) {
			uint64_t got;

			memcpy(&got, src, 8);
			if (got == w) {
				src += 8;
				off += 8;
				n -= 8;
				continue;
			}
		}
		if (*src != (uint8_t)(w >> (8 * (off & 7))))
			return (int64_t)(off - start);
		src++;
		off++;
		n--;
	}
	return -1;
}

uint64_t fb_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
