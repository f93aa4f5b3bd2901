/*
 * pmo_list: builds or verifies a linked list made with p_malloc inside a PMO
 * (the "survives detach, VM reboot and VMM restart" test).
 *
 *   pmo_list build NAME COUNT   attach(w), format the heap, build COUNT nodes,
 *                               set the root, psync, detach
 *   pmo_list check NAME COUNT   attach(r), walk the list from the root, verify
 *                               every node, the checksum and the heap
 * Key from $PMO_KEY.  Prints one line "ok ..." or "fail ..."; exit 0 on ok.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmo.h"

#define LIST_MAGIC 0x5453494c4f4d50ULL	/* "PMOLIST" */

struct list_root {
	uint64_t magic;
	uint64_t count;
	uint64_t head;		/* offset of the first node */
	uint64_t checksum;	/* sum of all values */
};

struct node {
	uint64_t next;		/* offset, 0 = end */
	uint64_t index;
	uint64_t value;
	char text[40];
};

static uint64_t value_of(uint64_t i)
{
	return (i + 1) * 0x9e3779b97f4a7c15ULL;
}

static int failf(const char *what, int err)
{
	printf("fail %s: %s\n", what, strerror(err));
	return 1;
}

static int build(const char *name, uint64_t count, const char *key)
{
	unsigned char *pmo = attach(name, PMO_WRITE, key);
	struct list_root *root;
	struct node *n, *prev = NULL;
	uint64_t i, sum = 0;

	if (!pmo)
		return failf("attach(w)", errno);
	if (p_heap_init(pmo, pmo_size(pmo)) < 0)
		return failf("p_heap_init", errno);
	root = p_calloc(pmo, 1, sizeof(*root));
	if (!root)
		return failf("p_calloc root", errno);
	for (i = 0; i < count; i++) {
		n = p_malloc(pmo, sizeof(*n));
		if (!n) {
			printf("fail p_malloc node %llu: %s\n", (unsigned long long)i,
			       strerror(errno));
			return 1;
		}
		n->next = 0;
		n->index = i;
		n->value = value_of(i);
		snprintf(n->text, sizeof(n->text), "node %llu", (unsigned long long)i);
		sum += n->value;
		if (prev)
			prev->next = p_off(pmo, n);
		else
			root->head = p_off(pmo, n);
		prev = n;
	}
	root->count = count;
	root->checksum = sum;
	root->magic = LIST_MAGIC;
	if (p_set_root(pmo, root) < 0)
		return failf("p_set_root", errno);
	if (psync(pmo) < 0)
		return failf("psync", errno);
	if (detach(pmo) < 0)
		return failf("detach", errno);
	printf("ok built %llu nodes checksum %016llx\n", (unsigned long long)count,
	       (unsigned long long)sum);
	return 0;
}

static int check(const char *name, uint64_t count, const char *key)
{
	unsigned char *pmo = attach(name, PMO_READ, key);
	struct p_heap_info info;
	struct list_root *root;
	struct node *n;
	uint64_t i = 0, sum = 0, off;
	char want[40];
	int rc = 1;

	if (!pmo)
		return failf("attach(r)", errno);
	root = p_get_root(pmo);
	if (!root) {
		printf("fail no root: %s\n", errno ? strerror(errno) : "root not set");
		goto out;
	}
	if (root->magic != LIST_MAGIC || root->count != count) {
		printf("fail root magic %llx count %llu (want %llu)\n",
		       (unsigned long long)root->magic, (unsigned long long)root->count,
		       (unsigned long long)count);
		goto out;
	}
	for (off = root->head; off; off = n->next, i++) {
		n = p_ptr(pmo, off);
		snprintf(want, sizeof(want), "node %llu", (unsigned long long)i);
		if (!n || i >= count || n->index != i || n->value != value_of(i) ||
		    strncmp(n->text, want, sizeof(want)) != 0) {
			printf("fail node %llu at offset %llu is wrong\n", (unsigned long long)i,
			       (unsigned long long)off);
			goto out;
		}
		sum += n->value;
	}
	if (i != count || sum != root->checksum) {
		printf("fail walked %llu nodes, checksum %016llx (want %llu, %016llx)\n",
		       (unsigned long long)i, (unsigned long long)sum, (unsigned long long)count,
		       (unsigned long long)root->checksum);
		goto out;
	}
	if (p_heap_check(pmo, &info) < 0) {
		printf("fail heap check: %s\n", strerror(errno));
		goto out;
	}
	printf("ok %llu nodes checksum %016llx heap used %llu blocks\n", (unsigned long long)i,
	       (unsigned long long)sum, (unsigned long long)info.used_blocks);
	rc = 0;
out:
	if (detach(pmo) < 0 && rc == 0)
		return failf("detach", errno);
	return rc;
}

int main(int argc, char **argv)
{
	const char *key = getenv("PMO_KEY");
	char *end;
	unsigned long long count;

	if (argc != 4 || !key || !*key) {
		fprintf(stderr, "usage: PMO_KEY=K pmo_list build|check NAME COUNT\n");
		return 2;
	}
	count = strtoull(argv[3], &end, 0);
	if (*end || !*argv[3]) {
		fprintf(stderr, "pmo_list: bad COUNT %s\n", argv[3]);
		return 2;
	}
	if (strcmp(argv[1], "build") == 0)
		return build(argv[2], count, key);
	if (strcmp(argv[1], "check") == 0)
		return check(argv[2], count, key);
	fprintf(stderr, "pmo_list: unknown mode %s\n", argv[1]);
	return 2;
}
