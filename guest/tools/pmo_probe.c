/*
 * pmo_probe: small guest checks of the PMO access rules, for the VM scenarios.
 *
 *   pmo_probe wrongkey NAME BADKEY  attach with a wrong key: EACCES, nothing mapped
 *   pmo_probe rowrite NAME          read-only attachment: mprotect(PROT_WRITE)
 *                                   fails and a write kills a child with SIGSEGV
 *   pmo_probe readers NAME          two readers at once (two in this process and
 *                                   one in a child), same contents
 *   pmo_probe excl NAME             a writer excludes readers and writers (EBUSY),
 *                                   readers exclude a writer
 *   pmo_probe destroybusy NAME      pdestroy of an attached PMO: EBUSY
 *   pmo_probe wb NAME               memset over an attached, faulted PMO vs. a
 *                                   private anonymous buffer (prints the ratio)
 *   pmo_probe detachmapped NAME     PMO_IOC_DETACH while the mapping exists: a
 *                                   later access is SIGBUS, the PMO is free again
 *   pmo_probe crash NAME            a writer killed (SIGKILL) between psyncs:
 *                                   the PMO is free again and holds the psync'ed data
 *   pmo_probe abi NAME              the driver's argument checks (raw ioctls, mmap)
 *   pmo_probe stats NAME            touch 4 pages of a write attachment and psync:
 *                                   the host's statistics count them
 *   pmo_probe fill NAME             write "page <i>" at the start of every page, psync
 *   pmo_probe poisoned NAME PAGE    PAGE was tampered with on the host: a child that
 *                                   reads it dies of SIGBUS, every other page reads
 *                                   back what fill wrote
 *   pmo_probe kernel_write NAME PAGE MARKER [ahead] [pipe]
 *                                   the same page read by the kernel on the process's
 *                                   behalf (write(2) from the mapping into a file, or
 *                                   a pipe): EFAULT, or SIGBUS before write(2)
 *                                   returns; never MARKER (the page's plaintext) in
 *                                   the file, zeros only with the SIGBUS; psync and
 *                                   detach EBADMSG. "ahead": first read the pages
 *                                   before PAGE and wait until the driver reports PAGE
 *                                   poisoned (a predictor found it bad first): then
 *                                   EFAULT and no SIGBUS
 *   pmo_probe rebind NAME           unbind the driver from the device while a PMO is
 *                                   attached and mapped (the removal/reset path):
 *                                   psync gives ENODEV, an access SIGBUS; after a
 *                                   rebind the PMO holds the last psync's data
 * Key from $PMO_KEY.  Prints one line "ok ..." or "fail ..."; exit 0 on ok.
 *
 * This file: usage and dispatch.  The checks, by concern: probe_access.c
 * (access rules, driver ABI), probe_stats.c (host counters, caching),
 * probe_integrity.c (refused pages), probe_rebind.c (device removal).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe.h"

const char *key;

double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The checks that take only the PMO name. */
static const struct {
	const char *name;
	int (*run)(const char *name);
} checks[] = {
	{ "rowrite", rowrite },
	{ "readers", readers },
	{ "excl", excl },
	{ "destroybusy", destroybusy },
	{ "wb", wb },
	{ "detachmapped", detachmapped },
	{ "crash", crash },
	{ "abi", abi },
	{ "rebind", rebind },
	{ "stats", stats },
	{ "stats-direct", stats_direct },
	{ "fill", fill },
};

int main(int argc, char **argv)
{
	size_t i;

	key = getenv("PMO_KEY");
	if (argc < 3 || !key || !*key) {
		fprintf(stderr, "usage: PMO_KEY=K pmo_probe wrongkey|rowrite|readers|excl|"
				"destroybusy|wb|detachmapped|crash|abi|rebind|stats|stats-direct|fill|poisoned|kernel_write NAME [BADKEY|PAGE [MARKER [ahead] [pipe]]]\n");
		return 2;
	}
	if (!strcmp(argv[1], "wrongkey") && argc == 4)
		return wrongkey(argv[2], argv[3]);
	for (i = 0; i < sizeof(checks) / sizeof(checks[0]); i++)
		if (!strcmp(argv[1], checks[i].name))
			return checks[i].run(argv[2]);
	if (!strcmp(argv[1], "poisoned") && argc == 4)
		return poisoned(argv[2], argv[3]);
	if (!strcmp(argv[1], "kernel_write") && argc >= 5 && argc <= 7) {
		int ahead = 0, to_pipe = 0, j;

		for (j = 5; j < argc; j++) {
			if (!strcmp(argv[j], "ahead"))
				ahead = 1;
			else if (!strcmp(argv[j], "pipe"))
				to_pipe = 1;
			else
				return 2;
		}
		return kernel_write(argv[2], argv[3], argv[4], ahead, to_pipe);
	}
	fprintf(stderr, "pmo_probe: unknown check %s\n", argv[1]);
	return 2;
}
