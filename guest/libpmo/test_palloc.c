/*
 * Host-side unit test of the PMO allocator (palloc.c).  A plain buffer stands
 * in for a mapped PMO: the allocator only needs bytes.  Prints one line per
 * check and "N passed, M failed" at the end; exits non-zero on a failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmo.h"

static int passed, failed;

#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (cond) {                                                \
			passed++;                                          \
		} else {                                                   \
			failed++;                                          \
			printf("FAIL %s:%d: %s: ", __func__, __LINE__, #cond); \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
		}                                                          \
	} while (0)

#define HEAP_SIZE (1u << 20)

static void *new_heap(size_t size)
{
	void *buf = aligned_alloc(4096, size);

	if (!buf) {
		perror("aligned_alloc");
		exit(2);
	}
	memset(buf, 0xa5, size);	/* init must not rely on zeroed memory */
	if (p_heap_init(buf, size) < 0) {
		perror("p_heap_init");
		exit(2);
	}
	return buf;
}

static uint64_t rng_state = 0x1234567887654321ULL;

static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void test_empty(void)
{
	void *h = new_heap(HEAP_SIZE);
	struct p_heap_info in;

	CHECK(p_heap_check(h, &in) == 0, "errno %d", errno);
	CHECK(in.used_blocks == 0 && in.free_blocks == 1, "used %llu free %llu",
	      (unsigned long long)in.used_blocks, (unsigned long long)in.free_blocks);
	CHECK(in.free_bytes == HEAP_SIZE - 128, "free %llu", (unsigned long long)in.free_bytes);
	errno = 123;
	CHECK(p_get_root(h) == NULL && errno == 0, "errno %d", errno);
	free(h);
}

static void test_basic(void)
{
	unsigned char *h = new_heap(HEAP_SIZE);
	unsigned char *p[8];
	size_t sizes[8] = { 1, 15, 16, 17, 100, 4096, 0, 12345 };
	struct p_heap_info in;
	int i, j;

	for (i = 0; i < 8; i++) {
		p[i] = p_malloc(h, sizes[i]);
		CHECK(p[i] != NULL, "malloc %zu: errno %d", sizes[i], errno);
		if (!p[i])
			return;
		CHECK((uintptr_t)p[i] % 16 == 0, "alignment %p", (void *)p[i]);
		CHECK(p[i] >= h + 128 && p[i] + sizes[i] <= h + HEAP_SIZE, "range");
		memset(p[i], i + 1, sizes[i]);
	}
	for (i = 0; i < 8; i++)
		for (j = 0; j < 8; j++)
			if (i != j)
				CHECK(p[i] + sizes[i] <= p[j] || p[j] + sizes[j] <= p[i] ||
				      sizes[i] == 0 || sizes[j] == 0, "overlap %d %d", i, j);
	CHECK(p[6] != p[7] && p[6] != p[5], "malloc(0) gives a unique block");
	for (i = 0; i < 8; i++) {
		size_t k;
		int ok = 1;

		for (k = 0; k < sizes[i]; k++)
			ok &= p[i][k] == i + 1;
		CHECK(ok, "contents of block %d", i);
	}
	CHECK(p_heap_check(h, &in) == 0 && in.used_blocks == 8, "errno %d used %llu", errno,
	      (unsigned long long)in.used_blocks);
	for (i = 7; i >= 0; i -= 2)
		p_free(h, p[i]);
	for (i = 0; i < 8; i += 2)
		p_free(h, p[i]);
	CHECK(p_heap_check(h, &in) == 0, "errno %d", errno);
	CHECK(in.used_blocks == 0 && in.free_blocks == 1 && in.free_bytes == HEAP_SIZE - 128,
	      "coalesced back to one block: free blocks %llu bytes %llu",
	      (unsigned long long)in.free_blocks, (unsigned long long)in.free_bytes);
	free(h);
}

static void test_exhaust(void)
{
	void *h = new_heap(64 * 1024);
	void *ptrs[4096];
	int n = 0, i;
	struct p_heap_info in;

	while (n < 4096 && (ptrs[n] = p_malloc(h, 100)) != NULL)
		n++;
	CHECK(n > 400 && n < 4096 && errno == ENOMEM, "n %d errno %d", n, errno);
	CHECK(p_malloc(h, 1u << 20) == NULL && errno == ENOMEM, "huge: errno %d", errno);
	CHECK(p_malloc(h, SIZE_MAX) == NULL && errno == ENOMEM, "SIZE_MAX: errno %d", errno);
	CHECK(p_calloc(h, SIZE_MAX / 2, 4) == NULL && errno == ENOMEM, "calloc overflow");
	for (i = 0; i < n; i += 2)
		p_free(h, ptrs[i]);
	for (i = 1; i < n; i += 2)
		p_free(h, ptrs[i]);
	CHECK(p_heap_check(h, &in) == 0 && in.free_blocks == 1 && in.used_blocks == 0,
	      "errno %d free blocks %llu", errno, (unsigned long long)in.free_blocks);
	free(h);
}

static void test_bad_free(void)
{
	unsigned char *h = new_heap(HEAP_SIZE);
	unsigned char *a = p_malloc(h, 64), *b = p_malloc(h, 64);
	struct p_heap_info before, after;

	CHECK(a && b, "malloc");
	p_heap_check(h, &before);
	errno = 0;
	p_free(h, a + 8);
	CHECK(errno == EINVAL, "interior pointer: errno %d", errno);
	errno = 0;
	p_free(h, h + HEAP_SIZE + 64);
	CHECK(errno == EINVAL, "outside: errno %d", errno);
	errno = 0;
	p_free(h, h + 4);
	CHECK(errno == EINVAL, "header: errno %d", errno);
	p_heap_check(h, &after);
	CHECK(memcmp(&before, &after, sizeof(before)) == 0, "heap unchanged by bad frees");
	errno = 0;
	p_free(h, a);
	CHECK(errno == 0, "free: errno %d", errno);
	p_free(h, a);
	CHECK(errno == EINVAL, "double free: errno %d", errno);
	CHECK(p_heap_check(h, NULL) == 0, "heap intact after double free");
	p_free(h, NULL);
	CHECK(p_heap_check(h, NULL) == 0, "free(NULL)");
	free(h);
}

static void test_calloc(void)
{
	unsigned char *h = new_heap(HEAP_SIZE);
	unsigned char *p = p_malloc(h, 1000);
	size_t i;
	int zero = 1;

	memset(p, 0xff, 1000);
	p_free(h, p);
	p = p_calloc(h, 250, 4);
	CHECK(p != NULL, "calloc");
	for (i = 0; p && i < 1000; i++)
		zero &= p[i] == 0;
	CHECK(zero, "calloc zeroes reused memory");
	free(h);
}

struct node {
	uint64_t next;	/* offset of the next node, 0 = end */
	uint64_t value;
};

static void test_root_offsets_and_move(void)
{
	unsigned char *h = new_heap(HEAP_SIZE), *h2;
	uint64_t head = 0, sum = 0, got = 0;
	struct node *n;
	int i, count = 0;

	for (i = 1; i <= 1000; i++) {
		n = p_malloc(h, sizeof(*n));
		if (!n)
			break;
		n->value = (uint64_t)i * 7;
		n->next = head;
		head = p_off(h, n);
		sum += n->value;
	}
	CHECK(i == 1001, "built %d nodes", i - 1);
	CHECK(p_set_root(h, p_ptr(h, head)) == 0, "set root: errno %d", errno);
	CHECK(p_off(h, NULL) == 0 && p_ptr(h, 0) == NULL, "NULL <-> 0");
	errno = 0;
	CHECK(p_off(h, h + HEAP_SIZE) == 0 && errno == EINVAL, "p_off outside");
	errno = 0;
	CHECK(p_ptr(h, HEAP_SIZE) == NULL && errno == EINVAL, "p_ptr outside");
	CHECK(p_set_root(h, h + HEAP_SIZE + 1) < 0 && errno == EINVAL, "root outside");

	/* The same bytes at another address: the structure must still work. */
	h2 = aligned_alloc(4096, HEAP_SIZE);
	memcpy(h2, h, HEAP_SIZE);
	memset(h, 0, HEAP_SIZE);
	free(h);
	for (n = p_get_root(h2); n; n = p_ptr(h2, n->next)) {
		got += n->value;
		count++;
	}
	CHECK(count == 1000 && got == sum, "walk after move: %d nodes, sum %llu/%llu", count,
	      (unsigned long long)got, (unsigned long long)sum);
	CHECK(p_heap_check(h2, NULL) == 0, "heap check after move");
	n = p_malloc(h2, 32);
	CHECK(n != NULL && p_heap_check(h2, NULL) == 0, "allocate after move");
	CHECK(p_set_root(h2, NULL) == 0 && p_get_root(h2) == NULL, "clear root");
	free(h2);
}

static void test_corruption(void)
{
	unsigned char *h = new_heap(HEAP_SIZE);
	uint64_t *hdr = (uint64_t *)h;
	void *a;

	a = p_malloc(h, 100);
	p_free(h, a);
	/* free_head (word 6) pointing into the middle of nowhere */
	hdr[6] = HEAP_SIZE - 8;
	errno = 0;
	CHECK(p_malloc(h, 10) == NULL && errno == EBADMSG, "bad free head: errno %d", errno);
	hdr[6] = 128;
	/* a free list that loops back */
	((uint64_t *)(h + 128))[1] = 128;
	CHECK(p_malloc(h, HEAP_SIZE) == NULL && errno == EBADMSG, "walk of a looped list: errno %d",
	      errno);
	CHECK(p_heap_check(h, NULL) < 0 && errno == EBADMSG, "check sees the loop");
	((uint64_t *)(h + 128))[1] = 0;
	CHECK(p_heap_check(h, NULL) == 0, "repaired");
	/* a block size running past the end */
	((uint64_t *)(h + 128))[0] = HEAP_SIZE * 2;
	CHECK(p_malloc(h, 10) == NULL && errno == EBADMSG, "size past end: errno %d", errno);
	/* wrong magic, zero header */
	hdr[0] ^= 1;
	CHECK(p_malloc(h, 10) == NULL && errno == EBADMSG, "magic: errno %d", errno);
	memset(h, 0, 128);
	CHECK(p_malloc(h, 10) == NULL && errno == EINVAL, "unformatted plain buffer: errno %d",
	      errno);
	CHECK(p_heap_init(h, 100) < 0 && errno == EINVAL, "too small to format");
	free(h);
}

static void test_random(void)
{
	enum { SLOTS = 512, ROUNDS = 20000 };
	unsigned char *h = new_heap(HEAP_SIZE);
	unsigned char *ptr[SLOTS] = { 0 };
	size_t len[SLOTS] = { 0 };
	int round, bad_contents = 0, bad_check = 0, oom = 0;

	for (round = 0; round < ROUNDS; round++) {
		int s = rng() % SLOTS;

		if (ptr[s]) {
			size_t k;

			for (k = 0; k < len[s]; k++)
				if (ptr[s][k] != (unsigned char)(s ^ len[s]))
					bad_contents++;
			p_free(h, ptr[s]);
			ptr[s] = NULL;
		} else {
			len[s] = rng() % 3 ? rng() % 256 : rng() % 20000;
			ptr[s] = p_malloc(h, len[s]);
			if (!ptr[s])
				oom++;
			else
				memset(ptr[s], s ^ len[s], len[s]);
		}
		if (round % 97 == 0 && p_heap_check(h, NULL) < 0)
			bad_check++;
	}
	CHECK(bad_contents == 0, "%d corrupted bytes", bad_contents);
	CHECK(bad_check == 0, "%d failed heap checks", bad_check);
	for (int s = 0; s < SLOTS; s++)
		p_free(h, ptr[s]);
	struct p_heap_info in;

	CHECK(p_heap_check(h, &in) == 0 && in.free_blocks == 1 && in.used_bytes == 0,
	      "all freed: %llu free blocks", (unsigned long long)in.free_blocks);
	printf("random: %d rounds, %d allocations failed with ENOMEM\n", ROUNDS, oom);
	free(h);
}

static unsigned char *thread_heap;

static void *thread_main(void *arg)
{
	uintptr_t id = (uintptr_t)arg;
	void *mine[64];
	int r, i;

	for (r = 0; r < 200; r++) {
		for (i = 0; i < 64; i++) {
			mine[i] = p_malloc(thread_heap, 16 + (i * 13 + id) % 200);
			if (mine[i])
				memset(mine[i], (int)id, 16);
		}
		for (i = 0; i < 64; i++) {
			if (mine[i] && *(unsigned char *)mine[i] != (unsigned char)id)
				return (void *)1;
			p_free(thread_heap, mine[i]);
		}
	}
	return NULL;
}

static void test_threads(void)
{
	pthread_t t[4];
	void *ret;
	int i, bad = 0;
	struct p_heap_info in;

	thread_heap = new_heap(HEAP_SIZE);
	for (i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, thread_main, (void *)(uintptr_t)(i + 1));
	for (i = 0; i < 4; i++) {
		pthread_join(t[i], &ret);
		bad += ret != NULL;
	}
	CHECK(bad == 0, "%d threads saw foreign data", bad);
	CHECK(p_heap_check(thread_heap, &in) == 0 && in.used_blocks == 0, "heap after threads");
	free(thread_heap);
}

static void test_not_attached(void)
{
	char buf[64];

	errno = 0;
	CHECK(psync(buf) < 0 && errno == EINVAL, "psync of a non-PMO: errno %d", errno);
	CHECK(detach(buf) < 0 && errno == EINVAL, "detach of a non-PMO: errno %d", errno);
	CHECK(pmo_size(buf) == 0 && errno == EINVAL, "pmo_size of a non-PMO");
	CHECK(attach("x", 3, "k") == NULL && errno == EINVAL, "bad perm");
	CHECK(pcreate("x", 4096, "") < 0 && errno == EINVAL, "empty key");
	CHECK(pcreate("0123456789012345678901234567890123456789012345678901234567890123",
		      4096, "k") < 0 && errno == ENAMETOOLONG, "64-byte name");
	CHECK(attach("x", PMO_READ,
		     "01234567890123456789012345678901234567890123456789012345678901234") == NULL &&
	      errno == EINVAL, "65-byte key");
}

int main(void)
{
	test_empty();
	test_basic();
	test_exhaust();
	test_bad_free();
	test_calloc();
	test_root_offsets_and_move();
	test_corruption();
	test_random();
	test_threads();
	test_not_attached();
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
