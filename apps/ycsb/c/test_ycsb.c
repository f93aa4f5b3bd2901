/*
 * test_ycsb.c - C unit tests of ycsb.c (make test).  The statistical tests of
 * the distributions live in the Rust crate (apps/ycsb/src/lib.rs), which
 * drives this same C code; these cover what the guest build relies on.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ycsb.h"

static int failures;

#define CHECK(cond)                                                                  \
	do {                                                                         \
		if (!(cond)) {                                                       \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,       \
				__LINE__, #cond);                                    \
			failures++;                                                  \
		}                                                                    \
	} while (0)

/* Keys of YCSB's own load phase (key numbers 0, 1, 2 with insertorder=hashed). */
static void test_keys(void)
{
	char k[YCSB_KEY_MAX];

	CHECK(ycsb_key_name(0, k) == strlen("user6284781860667377211"));
	CHECK(strcmp(k, "user6284781860667377211") == 0);
	ycsb_key_name(1, k);
	CHECK(strcmp(k, "user8517097267634966620") == 0);
	ycsb_key_name(2, k);
	CHECK(strcmp(k, "user1820151046732198393") == 0);
}

static void test_parse(void)
{
	struct ycsb_workload w;

	CHECK(ycsb_workload_parse("a", &w) == 0 && w.name == 'a');
	CHECK(ycsb_workload_parse("E", &w) == 0 && w.name == 'e' && w.max_scan == 100);
	CHECK(ycsb_workload_parse("workloadd", &w) == 0 && w.dist == YCSB_DIST_LATEST);
	CHECK(ycsb_workload_parse("g", &w) == -EINVAL);
	CHECK(ycsb_workload_parse("", &w) == -EINVAL);
	CHECK(ycsb_workload_parse("ab", &w) == -EINVAL);
}

static void test_fields(void)
{
	uint8_t v[YCSB_FIELD_LEN], rec[YCSB_RECORD_LEN];
	uint64_t ver, kn, vers[YCSB_FIELDS];
	char key[YCSB_KEY_MAX];
	size_t kl;

	ycsb_field_value(42, 3, 77, v);
	CHECK(ycsb_field_check(42, 3, v, sizeof(v), &ver) == 0 && ver == 77);
	CHECK(ycsb_field_check(42, 4, v, sizeof(v), NULL) == -EBADMSG);
	CHECK(ycsb_field_check(43, 3, v, sizeof(v), NULL) == -EBADMSG);
	v[60] ^= 1;
	CHECK(ycsb_field_check(42, 3, v, sizeof(v), NULL) == -EBADMSG);

	for (uint32_t f = 0; f < YCSB_FIELDS; f++)
		ycsb_field_value(42, f, f, rec + f * YCSB_FIELD_LEN);
	kl = ycsb_key_name(42, key);
	CHECK(ycsb_record_check(key, kl, rec, sizeof(rec), &kn, vers) == 0);
	CHECK(kn == 42 && vers[0] == 0 && vers[9] == 9);
	CHECK(ycsb_record_check(key, kl - 1, rec, sizeof(rec), NULL, NULL) == -EBADMSG);
	CHECK(ycsb_record_check(key, kl, rec, sizeof(rec) - 1, NULL, NULL) == -EBADMSG);
	rec[5 * YCSB_FIELD_LEN + 99] ^= 0x20;
	CHECK(ycsb_record_check(key, kl, rec, sizeof(rec), NULL, NULL) == -EBADMSG);
}

/* YCSB's precomputed zeta(10^10, 0.99): a direct sum to 10^6 plus the midpoint-rule tail. */
static void test_scrambled_zetan(void)
{
	const double theta = YCSB_ZIPFIAN_CONSTANT;
	const double n = 1e6, m = (double)YCSB_SCRAMBLED_ITEMS;
	double z = ycsb_zeta(0, (uint64_t)n, theta, 0.0);

	z += (pow(m + 0.5, 1 - theta) - pow(n + 0.5, 1 - theta)) / (1 - theta);
	CHECK(fabs(z - YCSB_SCRAMBLED_ZETAN) < 1e-6);
}

static void test_determinism(void)
{
	struct ycsb a, b;
	struct ycsb_workload w;
	struct ycsb_op x, y;
	struct ycsb_opts o = { .ops = 10000 };
	int differ = 0;

	for (char c = 'a'; c <= 'f'; c++) {
		char name[2] = { c, 0 };

		CHECK(ycsb_workload_parse(name, &w) == 0);
		CHECK(ycsb_init(&a, &w, 1000, 7, &o) == 0);
		CHECK(ycsb_init(&b, &w, 1000, 7, &o) == 0);
		for (int i = 0; i < 10000; i++) {
			ycsb_next_op(&a, &x);
			ycsb_next_op(&b, &y);
			CHECK(x.type == y.type && x.keynum == y.keynum && x.field == y.field &&
			      x.scan_len == y.scan_len && x.version == y.version &&
			      strcmp(x.key, y.key) == 0);
			if (x.type == YCSB_OP_INSERT)
				CHECK(memcmp(x.values, y.values, sizeof(x.values)) == 0);
		}
		CHECK(ycsb_init(&b, &w, 1000, 8, &o) == 0);
		ycsb_init(&a, &w, 1000, 7, &o);
		for (int i = 0; i < 100; i++) {
			ycsb_next_op(&a, &x);
			ycsb_next_op(&b, &y);
			differ |= x.keynum != y.keynum;
		}
		CHECK(differ);
	}
}

static void test_init_errors(void)
{
	struct ycsb y;
	struct ycsb_workload w;
	struct ycsb_opts o = { .thread = 2, .threads = 2 };

	ycsb_workload_parse("a", &w);
	CHECK(ycsb_init(&y, &w, 0, 1, NULL) == -EINVAL);
	CHECK(ycsb_init(&y, &w, 10, 1, &o) == -EINVAL);
	ycsb_workload_parse("d", &w);
	CHECK(ycsb_init(&y, &w, 1, 1, NULL) == -EINVAL);
	CHECK(ycsb_init(&y, &w, 2, 1, NULL) == 0);
}

/* Threads: inserts of generator t of T take records + t + k*T. */
static void test_threads(void)
{
	struct ycsb y;
	struct ycsb_workload w;
	struct ycsb_op op;
	struct ycsb_opts o = { .ops = 1000, .thread = 1, .threads = 3 };
	uint64_t want = 100 + 1;

	ycsb_workload_parse("d", &w);
	CHECK(ycsb_init(&y, &w, 100, 5, &o) == 0);
	for (int i = 0; i < 1000; i++) {
		ycsb_next_op(&y, &op);
		if (op.type == YCSB_OP_INSERT) {
			CHECK(op.keynum == want);
			want += 3;
		} else {
			CHECK(op.keynum < 100 || (op.keynum - 100) % 3 == 1);
			CHECK(op.keynum <= ycsb_last_keynum(&y));
		}
	}
	CHECK(want > 101);
}

static uint64_t digest_h = 0xCBF29CE484222325ULL;

static void mix(uint64_t v)
{
	for (int i = 0; i < 8; i++, v >>= 8) {
		digest_h ^= v & 0xff;
		digest_h *= 0x100000001b3ULL;
	}
}

/*
 * The first 1000 ops of each workload for seed 1, digested; the Rust crate pins the same
 * value (src/tests.rs), so gcc, musl-gcc and the crate's build draw one sequence.
 */
static void test_golden_digest(void)
{
	struct ycsb y;
	struct ycsb_workload w;
	struct ycsb_op op;
	struct ycsb_opts o = { .ops = 1000 };

	for (char c = 'a'; c <= 'f'; c++) {
		char name[2] = { c, 0 };

		ycsb_workload_parse(name, &w);
		CHECK(ycsb_init(&y, &w, 1000, 1, &o) == 0);
		for (int i = 0; i < 1000; i++) {
			ycsb_next_op(&y, &op);
			mix(op.type);
			mix(op.keynum);
			mix(op.type == YCSB_OP_SCAN ? op.scan_len : 0);
			mix((op.type == YCSB_OP_UPDATE || op.type == YCSB_OP_RMW) ? op.field
										 : UINT64_MAX);
			mix(op.version);
		}
	}
	if (digest_h != 0xefe6f0f5d22fb8e8ULL) {
		fprintf(stderr, "golden digest: got %#018llx\n", (unsigned long long)digest_h);
		failures++;
	}
}

int main(void)
{
	test_keys();
	test_parse();
	test_fields();
	test_scrambled_zetan();
	test_determinism();
	test_init_errors();
	test_threads();
	test_golden_digest();
	if (failures) {
		fprintf(stderr, "test_ycsb: %d checks failed\n", failures);
		return 1;
	}
	printf("test_ycsb: all checks passed\n");
	return 0;
}
