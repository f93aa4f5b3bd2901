/*
 * fb_data.h - the engine's building blocks without threads or I/O: random
 * numbers, the gamma size distribution, the file header and the data pattern.
 * Internal to the engine and its tests.
 */
#ifndef FB_DATA_H
#define FB_DATA_H

#include <stddef.h>
#include <stdint.h>

/* A splitmix64 stream: small, fast, good enough for workload choices. */
struct fb_rng {
	uint64_t s;
};

/* Seed stream @stream of @seed (streams are independent for practical purposes). */
void fb_rng_seed(struct fb_rng *r, uint64_t seed, uint64_t stream);
uint64_t fb_rng_next(struct fb_rng *r);
/* Uniform in [0, n) for n >= 1, without modulo bias. */
uint64_t fb_rng_below(struct fb_rng *r, uint64_t n);
/* Uniform in (0, 1). */
double fb_rng_unit(struct fb_rng *r);
/*
 * A file size with mean @mean: Gamma(shape, mean / shape) with shape
 * @gamma_milli / 1000 (Filebench's fileset sizes: shape 1.5), rounded down
 * to bytes; exactly @mean when @gamma_milli is 0.
 */
uint64_t fb_gamma_size(struct fb_rng *r, uint64_t mean, uint32_t gamma_milli);

/* The file header at offset 0 of every file's PMO; data follow at FB_HDR_SIZE. */
#define FB_HDR_SIZE	64u
#define FB_HDR_MAGIC	"FBPMO\0\0\1"
#define FB_HDR_VERSION	1u

struct fb_file_header {
	char magic[8];
	uint32_t version;
	uint32_t fileset;	/* 0 main fileset, 1 webserver log */
	uint32_t index;		/* entry in the fileset */
	uint32_t zero;
	uint64_t len;		/* data bytes */
	uint64_t cap;		/* data capacity: PMO size - FB_HDR_SIZE */
	uint64_t sum;		/* FNV-1a of the 40 bytes before it */
	uint8_t pad[16];	/* zero */
};

_Static_assert(sizeof(struct fb_file_header) == FB_HDR_SIZE, "header is 64 bytes");

/* Results of fb_header_read(). */
enum fb_hdr_state {
	FB_HDR_EMPTY = 0,	/* all 64 bytes zero: created, never written */
	FB_HDR_VALID = 1,
	FB_HDR_BAD = 2,
};

/* Write a header for (fileset, index) with @len and @cap at @base. */
void fb_header_write(void *base, uint32_t fileset, uint32_t index, uint64_t len, uint64_t cap);
/*
 * Read the header at @base of a PMO of @size bytes that should belong to
 * (fileset, index); *len is its length (0 when empty).
 */
int fb_header_read(const void *base, size_t size, uint32_t fileset, uint32_t index, uint64_t *len);

/* The data of (fileset, index) from byte @off: fill @dst with @n bytes. */
void fb_pattern_fill(uint8_t *dst, uint32_t fileset, uint32_t index, uint64_t off, size_t n);
/* Compare @n bytes at @src with the pattern from @off: the index (from @src) of the
 * first differing byte, or -1 when all match. */
int64_t fb_pattern_check(const uint8_t *src, uint32_t fileset, uint32_t index, uint64_t off,
			 size_t n);

/* Monotonic nanoseconds. */
uint64_t fb_now_ns(void);

#endif /* FB_DATA_H */
