/*
 * ycsb.h - the YCSB core workloads A-F as a deterministic operation generator.
 *
 * One implementation, used by the guest driver (ycsb_lmdb.c) and, through
 * FFI, by the host-side Rust crate `ycsb` (apps/ycsb/src/lib.rs).  It follows
 * YCSB's CoreWorkload (brianfrankcooper/YCSB, core/.../workloads/CoreWorkload
 * and the generators it uses); apps/ycsb/README.md lists each definition and
 * the few places where this code differs.
 *
 * Records: key "user" + decimal of YCSB's FNV-64 hash of the key number
 * (insertorder=hashed, zeropadding=1); 10 fields of 100 bytes (fieldcount=10,
 * fieldlength=100, constant).  Field bytes are this library's own
 * deterministic, self-describing format (ycsb_field_value()), so a checker can
 * recompute and verify every stored field without knowing the seed.
 *
 * Determinism: every random choice comes from a xoshiro256** generator
 * seeded (through splitmix64) from the seed and the thread index; the same
 * (workload, records, ops, seed, thread, threads) give the same operation
 * sequence on every machine (IEEE-754 doubles; build without -ffast-math and
 * with -ffp-contract=off).
 *
 * No globals, no allocation: a struct ycsb is a plain value the caller owns;
 * ycsb_init() is the only call that costs more than O(1) (it sums zeta over
 * the record count for workload D).
 *
 * Errors: functions that can fail return 0 or a negative errno value
 * (-EINVAL for bad arguments, -EBADMSG for a field or record that does not
 * verify).
 */
#ifndef YCSB_H
#define YCSB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define YCSB_FIELDS		10	/* fieldcount */
#define YCSB_FIELD_LEN		100	/* fieldlength */
#define YCSB_RECORD_LEN		(YCSB_FIELDS * YCSB_FIELD_LEN)
#define YCSB_KEY_MAX		32	/* "user" + up to 20 digits + NUL fits */
#define YCSB_ALL_FIELDS		UINT32_MAX

/* ZipfianGenerator.ZIPFIAN_CONSTANT */
#define YCSB_ZIPFIAN_CONSTANT	0.99
/* ScrambledZipfianGenerator.ITEM_COUNT and its precomputed ZETAN */
#define YCSB_SCRAMBLED_ITEMS	10000000000ULL
#define YCSB_SCRAMBLED_ZETAN	26.46902820178302

/* Upper bounds accepted by ycsb_init(). */
#define YCSB_MAX_RECORDS	(1ULL << 40)
#define YCSB_MAX_THREADS	1024U

/* Operation types, in the order YCSB's DiscreteGenerator is filled. */
enum ycsb_optype {
	YCSB_OP_READ = 0,
	YCSB_OP_UPDATE = 1,
	YCSB_OP_INSERT = 2,
	YCSB_OP_SCAN = 3,
	YCSB_OP_RMW = 4,	/* read-modify-write */
	YCSB_OP_COUNT = 5,
};

/* requestdistribution */
enum ycsb_dist {
	YCSB_DIST_ZIPFIAN = 0,	/* ScrambledZipfianGenerator */
	YCSB_DIST_LATEST = 1,	/* SkewedLatestGenerator */
};

/* One of the core workload files workloads/workload[a-f]. */
struct ycsb_workload {
	char name;				/* 'a'..'f' */
	double proportion[YCSB_OP_COUNT];	/* by enum ycsb_optype */
	uint32_t dist;				/* enum ycsb_dist */
	uint32_t min_scan, max_scan;		/* scan length, uniform */
};

/*
 * The workload called @s: "a".."f", "A".."F" or "workloada".."workloadf".
 * 0, or -EINVAL for anything else.
 */
int ycsb_workload_parse(const char *s, struct ycsb_workload *out);

/* YCSB's measurement name: "READ", "UPDATE", "INSERT", "SCAN", "READ-MODIFY-WRITE". */
const char *ycsb_op_name(uint32_t type);

/* ---- random numbers ---------------------------------------------------- */

/* xoshiro256** seeded by splitmix64 (never all-zero). */
struct ycsb_rng {
	uint64_t s[4];
};

void ycsb_rng_seed(struct ycsb_rng *r, uint64_t seed);
uint64_t ycsb_rng_next(struct ycsb_rng *r);
/* Uniform double in [0, 1) with 53 random bits (like Java's nextDouble()). */
double ycsb_rng_double(struct ycsb_rng *r);
/* Uniform integer in [0, n), unbiased; 0 when n == 0. */
uint64_t ycsb_rng_below(struct ycsb_rng *r, uint64_t n);

/* ---- hashing and keys --------------------------------------------------- */

/*
 * YCSB's Utils.fnvhash64(): FNV-1a over the 8 little-endian bytes of @val,
 * then Java's Math.abs() of the signed result (INT64_MIN stays 2^63).
 */
uint64_t ycsb_fnvhash64(uint64_t val);

/*
 * CoreWorkload.buildKeyName(keynum, 1, hashed): "user" followed by the
 * decimal digits of ycsb_fnvhash64(@keynum).  Writes a NUL-terminated string
 * into @out and returns its length (at most YCSB_KEY_MAX - 1).
 */
size_t ycsb_key_name(uint64_t keynum, char out[YCSB_KEY_MAX]);

/* ---- zipfian ------------------------------------------------------------ */

/*
 * ZipfianGenerator: Gray et al., "Quickly Generating Billion-Record Synthetic
 * Databases" (SIGMOD 1994), over the items base .. base+items-1, item base
 * the most popular.  The item count may grow (ycsb_zipf_next_n), zeta then
 * grows incrementally.
 */
struct ycsb_zipf {
	uint64_t base, items, countforzeta;
	double theta, alpha, zeta2theta, zetan, eta;
};

/* sum_{i=st+1}^{n} 1/i^theta, added to @initial (ZipfianGenerator.zetastatic). */
double ycsb_zeta(uint64_t st, uint64_t n, double theta, double initial);

/* Items @min..@max, zeta summed here (O(max-min)).  -EINVAL unless min <= max, 0 < theta < 1. */
int ycsb_zipf_init(struct ycsb_zipf *z, uint64_t min, uint64_t max, double theta);
/* The same with a precomputed zeta(max-min+1, theta). */
int ycsb_zipf_init_zetan(struct ycsb_zipf *z, uint64_t min, uint64_t max, double theta,
			 double zetan);
/* Next item of the initial item count. */
uint64_t ycsb_zipf_next(struct ycsb_zipf *z, struct ycsb_rng *r);
/*
 * Next item over @itemcount items (base .. base+itemcount-1); a count larger
 * than any before extends zeta incrementally, a smaller one reuses the
 * larger zeta (YCSB's allowitemcountdecrease=false).
 */
uint64_t ycsb_zipf_next_n(struct ycsb_zipf *z, struct ycsb_rng *r, uint64_t itemcount);

/*
 * ScrambledZipfianGenerator(min, max): a zipfian value over
 * YCSB_SCRAMBLED_ITEMS items (precomputed zeta), hashed with
 * ycsb_fnvhash64 and taken modulo the item count max-min+1.
 */
struct ycsb_scrambled {
	struct ycsb_zipf z;
	uint64_t min, itemcount;
};

int ycsb_scrambled_init(struct ycsb_scrambled *s, uint64_t min, uint64_t max);
uint64_t ycsb_scrambled_next(struct ycsb_scrambled *s, struct ycsb_rng *r);

/* ---- field values ------------------------------------------------------- */

/*
 * The YCSB_FIELD_LEN bytes of field @field of key number @keynum as written
 * at version @version (0 = the load phase), printable ASCII:
 *   [0,16)   keynum, 16 lowercase hex digits
 *   [16]     ':'
 *   [17,33)  version, 16 lowercase hex digits
 *   [33]     ':'
 *   [34]     '0' + field
 *   [35]     ':'
 *   [36,100) 64 characters of [A-Za-z0-9+/] from a generator seeded by
 *            (keynum, field, version)
 */
void ycsb_field_value(uint64_t keynum, uint32_t field, uint64_t version,
		      uint8_t out[YCSB_FIELD_LEN]);

/*
 * Verify @len bytes at @val as field @field of @keynum: 0 and the version in
 * *@version (may be NULL) when they are exactly ycsb_field_value(keynum,
 * field, version) for the version they name; -EBADMSG otherwise.
 */
int ycsb_field_check(uint64_t keynum, uint32_t field, const uint8_t *val, size_t len,
		     uint64_t *version);

/*
 * Verify a stored record: @rec (@len bytes) must be YCSB_RECORD_LEN bytes of
 * YCSB_FIELDS valid fields of one key number whose ycsb_key_name() is the
 * @keylen bytes at @key.  0 with *@keynum and @versions[] (either may be
 * NULL) filled, or -EBADMSG.
 */
int ycsb_record_check(const char *key, size_t keylen, const uint8_t *rec, size_t len,
		      uint64_t *keynum, uint64_t versions[YCSB_FIELDS]);

/* ---- the generator ------------------------------------------------------ */

/* One operation.  Fixed-width fields only: the Rust crate mirrors this layout. */
struct ycsb_op {
	uint32_t type;		/* enum ycsb_optype */
	uint32_t field;		/* UPDATE, RMW: the field written, or YCSB_ALL_FIELDS */
	uint32_t scan_len;	/* SCAN: records to scan; else 0 */
	uint32_t key_len;	/* strlen(key) */
	uint64_t keynum;	/* key number (before hashing) */
	uint64_t version;	/* UPDATE, RMW, INSERT: version of the written fields; else 0 */
	uint64_t seq;		/* index of this op in its generator (load: the key number) */
	char key[YCSB_KEY_MAX];	/* ycsb_key_name(keynum), NUL-terminated */
	/*
	 * UPDATE, RMW: values[field] (or all of them with YCSB_ALL_FIELDS);
	 * INSERT: all fields, i.e. the whole record.  Other rows are unspecified.
	 */
	uint8_t values[YCSB_FIELDS][YCSB_FIELD_LEN];
};

/* Options of ycsb_init(); a NULL pointer means all defaults (zeros). */
struct ycsb_opts {
	/*
	 * Operations this generator will produce (YCSB's operationcount): sizes
	 * the scrambled zipfian key space to records + 2 * ops * insertproportion
	 * (CoreWorkload's expectednewkeys).  0: records only.
	 */
	uint64_t ops;
	uint32_t thread;	/* this generator's thread index, < threads */
	uint32_t threads;	/* number of generators in the run; 0 means 1 */
	uint32_t write_all_fields; /* nonzero: updates write all fields (writeallfields=true) */
	uint32_t reserved;	/* must be 0 */
};

/*
 * A generator.  Treat as opaque; its size is fixed (ycsb_sizeof()) and it
 * holds no pointers, so it may be copied or moved freely.
 */
struct ycsb {
	struct ycsb_workload w;
	double share[YCSB_OP_COUNT];	/* operation shares, normalized to sum 1 */
	uint64_t records, ops, seed, seq, inserted;
	uint32_t thread, threads, write_all, pad;
	struct ycsb_rng rng;
	struct ycsb_scrambled scrambled;	/* zipfian */
	struct ycsb_zipf latest;		/* latest */
};

/*
 * Set up @y for workload @w over @records loaded records (key numbers
 * 0..records-1), random choices seeded from @seed and opts->thread.
 * -EINVAL for records == 0 or above YCSB_MAX_RECORDS, threads above
 * YCSB_MAX_THREADS, thread >= threads, workload D with records < 2, or
 * nonzero reserved bits.
 *
 * Threads: generator t of T behaves like one YCSB client over its own view of
 * the key space: the loaded records plus its own inserts, which take the key
 * numbers records + t, records + t + T, records + t + 2T, ...  Key choice
 * (zipfian or latest) runs over that logical space (loaded records, then its
 * own inserts in order), so every chosen key exists once the thread's
 * earlier operations are done.  With T = 1 this is exactly YCSB's
 * single-client semantics.
 */
int ycsb_init(struct ycsb *y, const struct ycsb_workload *w, uint64_t records, uint64_t seed,
	      const struct ycsb_opts *opts);

/*
 * The next run-phase operation.  An INSERT is taken as acknowledged (its key
 * becomes choosable) from the next call on: perform each op before asking for
 * the next one.  Never fails.
 */
void ycsb_next_op(struct ycsb *y, struct ycsb_op *out);

/* The load-phase insert of key number @keynum (version 0, all fields). */
void ycsb_load_op(uint64_t keynum, struct ycsb_op *out);

/* The key number of this generator's newest acknowledged key (YCSB's lastValue). */
uint64_t ycsb_last_keynum(const struct ycsb *y);

/* Key number that logical index @i of generator @y's key space stands for. */
uint64_t ycsb_keynum_of(const struct ycsb *y, uint64_t i);

/* sizeof and alignof struct ycsb and struct ycsb_op, for FFI users. */
size_t ycsb_sizeof(void);
size_t ycsb_alignof(void);
size_t ycsb_op_sizeof(void);
/* offsetof(struct ycsb_op, key) and offsetof(struct ycsb_op, values). */
size_t ycsb_op_key_offset(void);
size_t ycsb_op_values_offset(void);

#ifdef __cplusplus
}
#endif

#endif /* YCSB_H */
