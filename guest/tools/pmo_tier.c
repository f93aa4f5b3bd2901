/*
 * pmo_tier: writes, psyncs and reads back a whole PMO round after round, for the
 * VMM's DRAM budget (--pmo-dram): with a budget smaller than the PMO, every round
 * moves pages between local DRAM and the CXL tier, and nothing may change on the way.
 *
 *   pmo_tier run NAME PAGES ROUNDS   create NAME (PAGES pages) unless it exists,
 *                                    attach(w); each round writes every page with a
 *                                    pattern of (round, page), psyncs, prints
 *                                    "psynced R", then reads every page back and
 *                                    checks it; at the end prints the tier counters
 *   pmo_tier check NAME PAGES        attach(r): every page holds the pattern of one
 *                                    and the same round; prints "ok round=R"
 * Key from $PMO_KEY.  Prints "fail ..." and exits 1 on any difference.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmo.h"

#define PAGE 4096
#define WORDS (PAGE / 8)

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* Word 0 names the round, word 1 the page; the rest depend on both. */
static void fill(uint64_t *w, uint64_t round, uint64_t page)
{
	size_t i;

	w[0] = round;
	w[1] = page;
	for (i = 2; i < WORDS; i++)
		w[i] = mix(round << 40 ^ page << 12 ^ i);
}

static int same(const uint64_t *w, uint64_t round, uint64_t page)
{
	uint64_t want[WORDS];

	fill(want, round, page);
	return memcmp(w, want, PAGE) == 0;
}

static int failf(const char *what, int err)
{
	printf("fail %s: %s\n", what, strerror(err));
	return 1;
}

static int run(const char *name, uint64_t pages, uint64_t rounds, const char *key)
{
	struct pmo_stat st;
	unsigned char *pmo;
	uint64_t r, p, synced;

	if (pcreate(name, pages * PAGE, key) < 0 && errno != EEXIST)
		return failf("pcreate", errno);
	pmo = attach(name, PMO_WRITE, key);
	if (!pmo)
		return failf("attach(w)", errno);
	for (r = 1; r <= rounds; r++) {
		for (p = 0; p < pages; p++)
			fill((uint64_t *)(pmo + p * PAGE), r, p);
		if (psync(pmo) < 0)
			return failf("psync", errno);
		printf("psynced %llu\n", (unsigned long long)r);
		fflush(stdout);
		for (p = 0; p < pages; p++) {
			if (!same((uint64_t *)(pmo + p * PAGE), r, p)) {
				printf("fail round %llu page %llu reads back different\n",
				       (unsigned long long)r, (unsigned long long)p);
				return 1;
			}
		}
	}
	/* Nothing was written since the last psync: a psync now says how many pages the
	 * read-back alone made dirty (it should be none).
	 */
	if (pmo_stat(pmo, &st) < 0)
		return failf("pmo_stat", errno);
	synced = st.host.psync_pages;
	if (psync(pmo) < 0)
		return failf("psync", errno);
	if (pmo_stat(pmo, &st) < 0)
		return failf("pmo_stat", errno);
	printf("ok rounds=%llu reread_psync_pages=%llu dram_pages=%llu cxl_dirty_pages=%llu promotions=%llu demotions=%llu vm_budget_pages=%llu vm_dram_pages=%llu vm_cxl_dirty_pages=%llu vm_bytes_moved=%llu\n",
	       (unsigned long long)rounds,
	       (unsigned long long)(st.host.psync_pages - synced),
	       (unsigned long long)st.host.tier.dram_pages,
	       (unsigned long long)st.host.tier.cxl_dirty_pages,
	       (unsigned long long)st.host.tier.promotions, (unsigned long long)st.host.tier.demotions,
	       (unsigned long long)st.host.tier.vm_budget_pages,
	       (unsigned long long)st.host.tier.vm_dram_pages,
	       (unsigned long long)st.host.tier.vm_cxl_dirty_pages,
	       (unsigned long long)st.host.tier.vm_bytes_moved);
	if (detach(pmo) < 0)
		return failf("detach", errno);
	return 0;
}

static int check(const char *name, uint64_t pages, const char *key)
{
	unsigned char *pmo = attach(name, PMO_READ, key);
	uint64_t round, p;

	if (!pmo)
		return failf("attach(r)", errno);
	round = ((uint64_t *)pmo)[0];
	for (p = 0; p < pages; p++) {
		if (!same((uint64_t *)(pmo + p * PAGE), round, p)) {
			printf("fail page %llu is not round %llu (it says round %llu)\n",
			       (unsigned long long)p, (unsigned long long)round,
			       (unsigned long long)((uint64_t *)(pmo + p * PAGE))[0]);
			return 1;
		}
	}
	detach(pmo);
	printf("ok round=%llu\n", (unsigned long long)round);
	return 0;
}

int main(int argc, char **argv)
{
	const char *key = getenv("PMO_KEY");

	if (!key || !*key) {
		printf("fail PMO_KEY is not set\n");
		return 1;
	}
	if (argc == 5 && strcmp(argv[1], "run") == 0)
		return run(argv[2], strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0), key);
	if (argc == 4 && strcmp(argv[1], "check") == 0)
		return check(argv[2], strtoull(argv[3], NULL, 0), key);
	fprintf(stderr, "usage: pmo_tier run NAME PAGES ROUNDS | check NAME PAGES\n");
	return 2;
}
