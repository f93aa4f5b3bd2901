/*
 * ycsb.c - the YCSB core workloads A-F as a deterministic operation generator
 * (see ycsb.h for the interface and apps/ycsb/README.md for the definitions).
 */
#include "ycsb.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* ---- workloads ---------------------------------------------------------- */

/* workloads/workload[a-f] of YCSB's distribution, as data. */
static const struct ycsb_workload workloads[] = {
	/* A: update heavy */
	{ 'a', { 0.5, 0.5, 0, 0, 0 }, YCSB_DIST_ZIPFIAN, 1, 1000 },
	/* B: read mostly */
	{ 'b', { 0.95, 0.05, 0, 0, 0 }, YCSB_DIST_ZIPFIAN, 1, 1000 },
	/* C: read only */
	{ 'c', { 1.0, 0, 0, 0, 0 }, YCSB_DIST_ZIPFIAN, 1, 1000 },
	/* D: read latest */
	{ 'd', { 0.95, 0, 0.05, 0, 0 }, YCSB_DIST_LATEST, 1, 1000 },
	/* E: short ranges */
	{ 'e', { 0, 0, 0.05, 0.95, 0 }, YCSB_DIST_ZIPFIAN, 1, 100 },
	/* F: read-modify-write */
	{ 'f', { 0.5, 0, 0, 0, 0.5 }, YCSB_DIST_ZIPFIAN, 1, 1000 },
};

int ycsb_workload_parse(const char *s, struct ycsb_workload *out)
{
	char c;

	if (!s || !out)
		return -EINVAL;
	if (strncmp(s, "workload", 8) == 0)
		s += 8;
	if (s[0] == '\0' || s[1] != '\0')
		return -EINVAL;
	c = s[0];
	if (c >= 'A' && c <= 'F')
		c = (char)(c - 'A' + 'a');
	if (c < 'a' || c > 'f')
		return -EINVAL;
	*out = workloads[c - 'a'];
	return 0;
}

const char *ycsb_op_name(uint32_t type)
{
	static const char *const names[YCSB_OP_COUNT] = {
		"READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE",
	};

	return type < YCSB_OP_COUNT ? names[type] : "UNKNOWN";
}

/* ---- random numbers ----------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

void ycsb_rng_seed(struct ycsb_rng *r, uint64_t seed)
{
	uint64_t x = seed;

	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&x);
	if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0)
		r->s[0] = 1;
}

uint64_t ycsb_rng_next(struct ycsb_rng *r)
{
	uint64_t *s = r->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double ycsb_rng_double(struct ycsb_rng *r)
{
	return (double)(ycsb_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t ycsb_rng_below(struct ycsb_rng *r, uint64_t n)
{
	uint64_t x, limit;

	if (n == 0)
		return 0;
	/* Reject the top (2^64 mod n) values so every residue is equally likely. */
	limit = UINT64_MAX - (UINT64_MAX % n + 1) % n;
	do {
		x = ycsb_rng_next(r);
	} while (x > limit);
	return x % n;
}

/* ---- hashing and keys --------------------------------------------------- */

#define FNV_OFFSET_BASIS_64	0xCBF29CE484222325ULL
#define FNV_PRIME_64		1099511628211ULL

uint64_t ycsb_fnvhash64(uint64_t val)
{
	uint64_t h = FNV_OFFSET_BASIS_64;

	for (int i = 0; i < 8; i++) {
		h ^= val & 0xff;
		val >>= 8;
		h *= FNV_PRIME_64;
	}
	/* Math.abs() of the signed value: two's complement negation if negative. */
	if (h >> 63)
		h = ~h + 1;
	return h;
}

size_t ycsb_key_name(uint64_t keynum, char out[YCSB_KEY_MAX])
{
	char digits[24];
	uint64_t v = ycsb_fnvhash64(keynum);
	size_t n = 0, len;

	do {
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	memcpy(out, "user", 4);
	len = 4;
	while (n)
		out[len++] = digits[--n];
	out[len] = '\0';
	return len;
}

/* ---- zipfian ------------------------------------------------------------ */

double ycsb_zeta(uint64_t st, uint64_t n, double theta, double initial)
{
	double sum = initial;

	for (uint64_t i = st; i < n; i++)
		sum += 1.0 / pow((double)(i + 1), theta);
	return sum;
}

/* Gray's eta for @n items (YCSB keeps the initial item count here; see README). */
static double zipf_eta(const struct ycsb_zipf *z, uint64_t n)
{
	return (1.0 - pow(2.0 / (double)n, 1.0 - z->theta)) / (1.0 - z->zeta2theta / z->zetan);
}

int ycsb_zipf_init_zetan(struct ycsb_zipf *z, uint64_t min, uint64_t max, double theta,
			 double zetan)
{
	if (!z || min > max || max - min == UINT64_MAX || !(theta > 0.0 && theta < 1.0) ||
	    !(zetan >= 1.0))
		return -EINVAL;
	z->base = min;
	z->items = max - min + 1;
	z->countforzeta = z->items;
	z->theta = theta;
	z->alpha = 1.0 / (1.0 - theta);
	z->zeta2theta = ycsb_zeta(0, 2, theta, 0.0);
	z->zetan = zetan;
	z->eta = zipf_eta(z, z->items);
	return 0;
}

int ycsb_zipf_init(struct ycsb_zipf *z, uint64_t min, uint64_t max, double theta)
{
	if (min > max || max - min == UINT64_MAX || !(theta > 0.0 && theta < 1.0))
		return -EINVAL;
	return ycsb_zipf_init_zetan(z, min, max, theta, ycsb_zeta(0, max - min + 1, theta, 0.0));
}

uint64_t ycsb_zipf_next_n(struct ycsb_zipf *z, struct ycsb_rng *r, uint64_t itemcount)
{
	double u, uz, x;
	uint64_t ret;

	if (itemcount == 0)
		return z->base;
	if (itemcount > z->countforzeta) {
		z->zetan = ycsb_zeta(z->countforzeta, itemcount, z->theta, z->zetan);
		z->countforzeta = itemcount;
		z->eta = zipf_eta(z, itemcount);
	}
	u = ycsb_rng_double(r);
	uz = u * z->zetan;
	if (uz < 1.0)
		return z->base;
	/* 1 + 0.5^theta, i.e. zeta(2, theta) */
	if (uz < z->zeta2theta)
		return z->base + 1;
	x = (double)itemcount * pow(z->eta * u - z->eta + 1.0, z->alpha);
	/* The approximation can reach itemcount when u is close to 1: clamp. */
	if (!(x >= 0.0))
		ret = 0;
	else if (x >= (double)itemcount)
		ret = itemcount - 1;
	else
		ret = (uint64_t)x;
	return z->base + (ret < itemcount ? ret : itemcount - 1);
}

uint64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *r)
{
	return ycsb_zipf_next_n(z, r, z->items);
}

int ycsb_scrambled_init(struct ycsb_scrambled *s, uint64_t min, uint64_t max)
{
	if (!s || min > max || max - min == UINT64_MAX)
		return -EINVAL;
	s->min = min;
	s->itemcount = max - min + 1;
	return ycsb_zipf_init_zetan(&s->z, 0, YCSB_SCRAMBLED_ITEMS, YCSB_ZIPFIAN_CONSTANT,
				    YCSB_SCRAMBLED_ZETAN);
}

uint64_t ycsb_scrambled_next(struct ycsb_scrambled *s, struct ycsb_rng *r)
{
	uint64_t v = ycsb_zipf_next(&s->z, r);

	return s->min + ycsb_fnvhash64(v) % s->itemcount;
}

/* ---- field values ------------------------------------------------------- */

#define HDR_LEN		36	/* keynum ':' version ':' field ':' */

static void put_hex16(uint8_t *out, uint64_t v)
{
	static const char hex[] = "0123456789abcdef";

	for (int i = 15; i >= 0; i--) {
		out[i] = (uint8_t)hex[v & 0xf];
		v >>= 4;
	}
}

/* 16 lowercase hex digits at @in, or -1. */
static int get_hex16(const uint8_t *in, uint64_t *v)
{
	uint64_t x = 0;

	for (int i = 0; i < 16; i++) {
		uint8_t c = in[i];

		if (c >= '0' && c <= '9')
			x = (x << 4) | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			x = (x << 4) | (uint64_t)(c - 'a' + 10);
		else
			return -1;
	}
	*v = x;
	return 0;
}

void ycsb_field_value(uint64_t keynum, uint32_t field, uint64_t version,
		      uint8_t out[YCSB_FIELD_LEN])
{
	static const char alphabet[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	uint64_t x = keynum * 0xD1B54A32D192ED03ULL ^ version * 0x8CB92BA72F3D8DD7ULL ^
		     ((uint64_t)field + 1) * 0xABC98388FB8FAC03ULL;
	size_t i = HDR_LEN;

	put_hex16(out, keynum);
	out[16] = ':';
	put_hex16(out + 17, version);
	out[33] = ':';
	out[34] = (uint8_t)('0' + field % 10);
	out[35] = ':';
	while (i < YCSB_FIELD_LEN) {
		uint64_t w = splitmix64(&x);

		for (int k = 0; k < 10 && i < YCSB_FIELD_LEN; k++, w >>= 6)
			out[i++] = (uint8_t)alphabet[w & 63];
	}
}

int ycsb_field_check(uint64_t keynum, uint32_t field, const uint8_t *val, size_t len,
		     uint64_t *version)
{
	uint8_t want[YCSB_FIELD_LEN];
	uint64_t v;

	if (!val || len != YCSB_FIELD_LEN || field >= YCSB_FIELDS || get_hex16(val + 17, &v))
		return -EBADMSG;
	ycsb_field_value(keynum, field, v, want);
	if (memcmp(want, val, YCSB_FIELD_LEN) != 0)
		return -EBADMSG;
	if (version)
		*version = v;
	return 0;
}

int ycsb_record_check(const char *key, size_t keylen, const uint8_t *rec, size_t len,
		      uint64_t *keynum, uint64_t versions[YCSB_FIELDS])
{
	char name[YCSB_KEY_MAX];
	uint64_t k, v[YCSB_FIELDS];

	if (!key || !rec || len != YCSB_RECORD_LEN || get_hex16(rec, &k))
		return -EBADMSG;
	if (ycsb_key_name(k, name) != keylen || memcmp(name, key, keylen) != 0)
		return -EBADMSG;
	for (uint32_t f = 0; f < YCSB_FIELDS; f++)
		if (ycsb_field_check(k, f, rec + (size_t)f * YCSB_FIELD_LEN, YCSB_FIELD_LEN, &v[f]))
			return -EBADMSG;
	if (keynum)
		*keynum = k;
	if (versions)
		memcpy(versions, v, sizeof(v));
	return 0;
}

/* ---- the generator ------------------------------------------------------ */

int ycsb_init(struct ycsb *y, const struct ycsb_workload *w, uint64_t records, uint64_t seed,
	      const struct ycsb_opts *opts)
{
	static const struct ycsb_opts defaults;
	const struct ycsb_opts *o = opts ? opts : &defaults;
	uint32_t threads = o->threads ? o->threads : 1;
	double sum = 0;
	uint64_t expected;
	int err;

	if (!y || !w || records == 0 || records > YCSB_MAX_RECORDS || threads > YCSB_MAX_THREADS ||
	    o->thread >= threads || o->reserved || o->ops > YCSB_MAX_RECORDS ||
	    w->min_scan == 0 || w->min_scan > w->max_scan ||
	    (w->dist != YCSB_DIST_ZIPFIAN && w->dist != YCSB_DIST_LATEST) ||
	    (w->dist == YCSB_DIST_LATEST && records < 2))
		return -EINVAL;
	for (int i = 0; i < YCSB_OP_COUNT; i++) {
		if (!(w->proportion[i] >= 0.0 && w->proportion[i] <= 1.0))
			return -EINVAL;
		sum += w->proportion[i];
	}
	if (!(sum > 0.0))
		return -EINVAL;

	memset(y, 0, sizeof(*y));
	y->w = *w;
	for (int i = 0; i < YCSB_OP_COUNT; i++)
		y->share[i] = w->proportion[i] / sum;
	y->records = records;
	y->ops = o->ops;
	y->seed = seed;
	y->thread = o->thread;
	y->threads = threads;
	y->write_all = o->write_all_fields ? 1 : 0;
	ycsb_rng_seed(&y->rng, seed + (uint64_t)o->thread * 0x9E3779B97F4A7C15ULL);

	if (w->dist == YCSB_DIST_ZIPFIAN) {
		/* CoreWorkload: expectednewkeys = (int)(opcount * insertproportion * 2.0) */
		expected = (uint64_t)((double)o->ops * y->share[YCSB_OP_INSERT] * 2.0);
		err = ycsb_scrambled_init(&y->scrambled, 0, records + expected);
	} else {
		/* SkewedLatestGenerator: ZipfianGenerator(basis.lastValue()) */
		err = ycsb_zipf_init(&y->latest, 0, records - 2, YCSB_ZIPFIAN_CONSTANT);
	}
	return err;
}

uint64_t ycsb_keynum_of(const struct ycsb *y, uint64_t i)
{
	if (i < y->records)
		return i;
	return y->records + (i - y->records) * y->threads + y->thread;
}

/* Logical index of the newest acknowledged key. */
static uint64_t last_index(const struct ycsb *y)
{
	return y->records + y->inserted - 1;
}

uint64_t ycsb_last_keynum(const struct ycsb *y)
{
	return ycsb_keynum_of(y, last_index(y));
}

/* CoreWorkload.nextKeynum() over this generator's logical key space. */
static uint64_t next_keynum(struct ycsb *y)
{
	uint64_t last = last_index(y), i;

	if (y->w.dist == YCSB_DIST_LATEST) {
		/* SkewedLatestGenerator.nextValue(): max - zipfian.nextLong(max) */
		i = last - ycsb_zipf_next_n(&y->latest, &y->rng, last);
	} else {
		do {
			i = ycsb_scrambled_next(&y->scrambled, &y->rng);
		} while (i > last);
	}
	return ycsb_keynum_of(y, i);
}

/* DiscreteGenerator.nextValue() over the operation shares. */
static uint32_t next_type(struct ycsb *y)
{
	double val = ycsb_rng_double(&y->rng);
	uint32_t last = YCSB_OP_READ;

	for (uint32_t i = 0; i < YCSB_OP_COUNT; i++) {
		if (y->share[i] <= 0.0)
			continue;
		if (val < y->share[i])
			return i;
		val -= y->share[i];
		last = i;
	}
	return last;	/* rounding left val just above the sum */
}

static void set_key(struct ycsb_op *out, uint64_t keynum)
{
	out->keynum = keynum;
	out->key_len = (uint32_t)ycsb_key_name(keynum, out->key);
}

static void fill_all(struct ycsb_op *out)
{
	for (uint32_t f = 0; f < YCSB_FIELDS; f++)
		ycsb_field_value(out->keynum, f, out->version, out->values[f]);
}

void ycsb_next_op(struct ycsb *y, struct ycsb_op *out)
{
	uint64_t seq = y->seq++;
	uint32_t type = next_type(y);

	out->type = type;
	out->field = YCSB_ALL_FIELDS;
	out->scan_len = 0;
	out->version = 0;
	out->seq = seq;

	switch (type) {
	case YCSB_OP_INSERT:
		/* transactioninsertkeysequence.nextValue(), acknowledged at once */
		set_key(out, ycsb_keynum_of(y, y->records + y->inserted));
		out->version = seq * y->threads + y->thread + 1;
		fill_all(out);
		y->inserted++;
		break;
	case YCSB_OP_SCAN:
		set_key(out, next_keynum(y));
		out->scan_len = y->w.min_scan +
				(uint32_t)ycsb_rng_below(&y->rng, y->w.max_scan - y->w.min_scan + 1);
		break;
	case YCSB_OP_UPDATE:
	case YCSB_OP_RMW:
		set_key(out, next_keynum(y));
		out->version = seq * y->threads + y->thread + 1;
		if (y->write_all) {
			fill_all(out);
		} else {
			out->field = (uint32_t)ycsb_rng_below(&y->rng, YCSB_FIELDS);
			ycsb_field_value(out->keynum, out->field, out->version,
					 out->values[out->field]);
		}
		break;
	default:	/* READ */
		set_key(out, next_keynum(y));
		break;
	}
}

void ycsb_load_op(uint64_t keynum, struct ycsb_op *out)
{
	out->type = YCSB_OP_INSERT;
	out->field = YCSB_ALL_FIELDS;
	out->scan_len = 0;
	out->version = 0;
	out->seq = keynum;
	set_key(out, keynum);
	fill_all(out);
}

size_t ycsb_sizeof(void)
{
	return sizeof(struct ycsb);
}

size_t ycsb_alignof(void)
{
	return _Alignof(struct ycsb);
}

size_t ycsb_op_sizeof(void)
{
	return sizeof(struct ycsb_op);
}

size_t ycsb_op_key_offset(void)
{
	return offsetof(struct ycsb_op, key);
}

size_t ycsb_op_values_offset(void)
{
	return offsetof(struct ycsb_op, values);
}
