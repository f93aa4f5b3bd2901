/*
 * pmo_probe's checks of what the host counts and how the window is cached:
 * STAT after touching pages, design c's direct mapping, write-back speed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "probe.h"

static double memset_time(unsigned char *p, size_t n)
{
	double t0, best = 1e9;
	int i;

	for (i = 0; i < 3; i++) {
		t0 = now();
		memset(p, i + 1, n);
		__asm__ __volatile__("" : : "r"(p) : "memory");
		if (now() - t0 < best)
			best = now() - t0;
	}
	return best;
}

int wb(const char *name)
{
	unsigned char *p = attach(name, PMO_WRITE, key), *ram;
	size_t n;
	double tp, tr;

	if (!p)
		FAIL("attach(w): %s", strerror(errno));
	n = pmo_size(p);
	ram = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ram == MAP_FAILED)
		FAIL("mmap: %s", strerror(errno));
	memset(p, 0, n);	/* fault everything in first */
	memset(ram, 0, n);
	tp = memset_time(p, n);
	tr = memset_time(ram, n);
	detach(p);
	munmap(ram, n);
	printf("%s memset of %zu MiB: PMO %.1f ms, RAM %.1f ms, ratio %.2f\n",
	       tp <= 3 * tr ? "ok" : "fail", n >> 20, tp * 1e3, tr * 1e3, tp / tr);
	return tp <= 3 * tr ? 0 : 1;
}

/* Attaches NAME for writing, stores to its first 4 pages, psyncs and stats it. */
static int touch4_and_stat(const char *name, struct pmo_stat *st)
{
	volatile unsigned char *p = attach(name, PMO_WRITE, key);
	size_t n;
	int i;

	if (!p)
		FAIL("attach(w): %s", strerror(errno));
	n = pmo_size((void *)p);
	if (n < 4 * 4096)
		FAIL("PMO too small for this check");
	for (i = 0; i < 4; i++)
		p[i * 4096 + 7] = (unsigned char)(i + 1);
	if (psync((void *)p) < 0)
		FAIL("psync: %s", strerror(errno));
	if (pmo_stat((void *)p, st) < 0)
		FAIL("pmo_stat: %s", strerror(errno));
	detach((void *)p);
	if (st->host.size != n)
		FAIL("stat size %llu, attached %zu", (unsigned long long)st->host.size, n);
	return 0;
}

int stats(const char *name)
{
	struct pmo_stat st;

	if (touch4_and_stat(name, &st))
		return 1;
	if (st.host.pages_decrypted + st.host.pages_prefetched < 4 || st.host.faults < 1 || st.host.psyncs != 1 ||
	    st.host.psync_pages < 4 || st.perm != PMO_WRITE || st.host.integrity_failures)
		FAIL("after touching 4 pages and one psync: faults %llu decrypted %llu prefetched %llu "
		     "psyncs %llu psync_pages %llu perm %d integrity_failures %llu",
		     (unsigned long long)st.host.faults, (unsigned long long)st.host.pages_decrypted,
		     (unsigned long long)st.host.pages_prefetched, (unsigned long long)st.host.psyncs,
		     (unsigned long long)st.host.psync_pages, st.perm,
		     (unsigned long long)st.host.integrity_failures);
	printf("ok faults %llu decrypted %llu prefetched %llu psyncs %llu psync_pages %llu "
	       "fault_ns_total %llu\n",
	       (unsigned long long)st.host.faults, (unsigned long long)st.host.pages_decrypted,
	       (unsigned long long)st.host.pages_prefetched, (unsigned long long)st.host.psyncs,
	       (unsigned long long)st.host.psync_pages, (unsigned long long)st.host.fault_ns_total);
	return 0;
}

/*
 * A design c attachment mapped from the expander's memory: the host's pager never sees a
 * fault of it, and psync persists exactly the pages the expander saw written.
 */
int stats_direct(const char *name)
{
	struct pmo_stat st;

	if (touch4_and_stat(name, &st))
		return 1;
	if (st.host.faults || st.host.pages_decrypted || st.host.pages_prefetched || st.host.psyncs != 1 ||
	    st.host.psync_pages != 4 || st.perm != PMO_WRITE || st.host.integrity_failures)
		FAIL("after touching 4 pages of an expander-mapped PMO and one psync: faults %llu "
		     "decrypted %llu prefetched %llu psyncs %llu psync_pages %llu perm %d "
		     "integrity_failures %llu",
		     (unsigned long long)st.host.faults, (unsigned long long)st.host.pages_decrypted,
		     (unsigned long long)st.host.pages_prefetched, (unsigned long long)st.host.psyncs,
		     (unsigned long long)st.host.psync_pages, st.perm,
		     (unsigned long long)st.host.integrity_failures);
	printf("ok mapped from the expander: no pager fault, psync of exactly the 4 pages written\n");
	return 0;
}
