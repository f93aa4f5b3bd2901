/*
 * pmo: command-line tool for PMOs (guest side, static).
 *
 *   pmo [--key K] create NAME SIZE        SIZE in bytes, or with K, M, G suffix
 *   pmo [--key K] write NAME OFFSET DATA  DATA as given (bytes of the argument)
 *   pmo [--key K] read NAME OFFSET LEN    raw bytes to stdout
 *   pmo [--key K] cat NAME                the whole PMO to stdout
 *   pmo [--key K] stat NAME               host statistics of a read attachment
 *   pmo [--key K] rm NAME
 *   pmo ls                                NAME SIZE ATTACHED per line
 *   pmo design NAME                       select the host's PMO design
 *
 * The key comes from --key or the environment variable PMO_KEY.  Each command
 * attaches, acts, psyncs if it wrote, and detaches.  Errors print one line on
 * stderr ("pmo: CMD NAME: reason") and exit 1; usage errors exit 2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pmo.h"

static const char *cmd = "";

static void usage(void)
{
	fprintf(stderr,
		"usage: pmo [--key K] create NAME SIZE | write NAME OFFSET DATA |\n"
		"           read NAME OFFSET LEN | cat NAME | stat NAME | rm NAME |\n"
		"           ls | design NAME\n"
		"       the key comes from --key K or $PMO_KEY\n");
	exit(2);
}

static int fail(const char *what, int err)
{
	if (err == ESTALE) {
		/* The host refused the PMO when it opened the store. */
		fprintf(stderr,
			"pmo: %s %s: refused by the host: its stored record may be an old copy (damaged, duplicated or behind the rollback anchor); see the host log\n",
			cmd, what);
		return 1;
	}
	fprintf(stderr, "pmo: %s %s: %s\n", cmd, what, strerror(err));
	return 1;
}

/* A size or offset: decimal, 0x hex, optional K/M/G (powers of 1024). */
static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	int shift = 0;

	if (!*s || *s == '-')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno)
		return -1;
	switch (*end) {
	case 'K': case 'k': shift = 10; end++; break;
	case 'M': case 'm': shift = 20; end++; break;
	case 'G': case 'g': shift = 30; end++; break;
	default: break;
	}
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -1;
	*out = (uint64_t)v << shift;
	return 0;
}

static int write_buf(const unsigned char *p, size_t n)
{
	while (n) {
		ssize_t w = write(1, p, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/*
 * PMO bytes to stdout.  They are copied by this process first, never handed
 * to write(2) directly: a page that fails its integrity check then raises
 * SIGBUS here, in user mode, rather than inside the kernel's copy.
 */
static int write_all(const unsigned char *p, size_t n)
{
	unsigned char buf[4096];

	while (n) {
		size_t k = n < sizeof(buf) ? n : sizeof(buf);

		memcpy(buf, p, k);
		if (write_buf(buf, k) < 0)
			return -1;
		p += k;
		n -= k;
	}
	return 0;
}

static int detach_report(const char *name, void *addr, int rc)
{
	if (detach(addr) < 0 && rc == 0)
		return fail(name, errno);
	return rc;
}

static int cmd_create(const char *name, const char *size_s, const char *key)
{
	uint64_t size;

	if (parse_u64(size_s, &size) < 0)
		return fail(size_s, EINVAL);
	if (pcreate(name, (size_t)size, key) < 0)
		return fail(name, errno);
	return 0;
}

static int cmd_write(const char *name, const char *off_s, const char *data, const char *key)
{
	size_t len = strlen(data);
	uint64_t off;
	unsigned char *p;
	int rc = 0;

	if (parse_u64(off_s, &off) < 0)
		return fail(off_s, EINVAL);
	p = attach(name, PMO_WRITE, key);
	if (!p)
		return fail(name, errno);
	if (off > pmo_size(p) || len > pmo_size(p) - off) {
		fprintf(stderr, "pmo: write %s: %zu bytes at offset %llu pass the end (%zu bytes)\n",
			name, len, (unsigned long long)off, pmo_size(p));
		rc = 1;
	} else {
		memcpy(p + off, data, len);
		if (psync(p) < 0)
			rc = fail(name, errno);
	}
	return detach_report(name, p, rc);
}

static int cmd_read(const char *name, const char *off_s, const char *len_s, const char *key)
{
	uint64_t off, len;
	unsigned char *p;
	int rc = 0;

	if (parse_u64(off_s, &off) < 0)
		return fail(off_s, EINVAL);
	if (parse_u64(len_s, &len) < 0)
		return fail(len_s, EINVAL);
	p = attach(name, PMO_READ, key);
	if (!p)
		return fail(name, errno);
	if (off > pmo_size(p) || len > pmo_size(p) - off) {
		fprintf(stderr, "pmo: read %s: %llu bytes at offset %llu pass the end (%zu bytes)\n",
			name, (unsigned long long)len, (unsigned long long)off, pmo_size(p));
		rc = 1;
	} else if (write_all(p + off, (size_t)len) < 0) {
		rc = fail("stdout", errno);
	}
	return detach_report(name, p, rc);
}

static int cmd_cat(const char *name, const char *key)
{
	unsigned char *p = attach(name, PMO_READ, key);
	int rc = 0;

	if (!p)
		return fail(name, errno);
	if (write_all(p, pmo_size(p)) < 0)
		rc = fail("stdout", errno);
	return detach_report(name, p, rc);
}

static int cmd_stat(const char *name, const char *key)
{
	struct pmo_stat st;
	void *p = attach(name, PMO_READ, key);
	int i, rc = 0;

	if (!p)
		return fail(name, errno);
	if (pmo_stat(p, &st) < 0) {
		rc = fail(name, errno);
	} else {
		printf("name %s\nsize %llu\nfaults %llu\nfault_ns_total %llu\n"
		       "pages_decrypted %llu\npages_prefetched %llu\npsyncs %llu\n"
		       "psync_pages %llu\npsync_ns_total %llu\nintegrity_failures %llu\n"
		       "poisoned %u\nfault_hist_us",
		       name, (unsigned long long)st.host.size, (unsigned long long)st.host.faults,
		       (unsigned long long)st.host.fault_ns_total,
		       (unsigned long long)st.host.pages_decrypted,
		       (unsigned long long)st.host.pages_prefetched, (unsigned long long)st.host.psyncs,
		       (unsigned long long)st.host.psync_pages, (unsigned long long)st.host.psync_ns_total,
		       (unsigned long long)st.host.integrity_failures, st.poisoned);
		for (i = 0; i < VIRTIO_PMO_HIST_BUCKETS; i++)
			printf(" %llu", (unsigned long long)st.host.fault_hist[i]);
		printf("\ntriggers %llu\ntrigger_hits %llu\ntrigger_wasted %llu\n"
		       "prefetch_late %llu\ndemand_unpredicted %llu\n",
		       (unsigned long long)st.host.triggers, (unsigned long long)st.host.trigger_hits,
		       (unsigned long long)st.host.trigger_wasted,
		       (unsigned long long)st.host.prefetch_late,
		       (unsigned long long)st.host.demand_unpredicted);
		printf("dram_pages %llu\ncxl_dirty_pages %llu\npromotions %llu\n"
		       "demotions %llu\nprefetch_to_cxl %llu\nvm_budget_pages %llu\n"
		       "vm_dram_pages %llu\nvm_cxl_dirty_pages %llu\nvm_bytes_moved %llu\n",
		       (unsigned long long)st.host.tier.dram_pages,
		       (unsigned long long)st.host.tier.cxl_dirty_pages,
		       (unsigned long long)st.host.tier.promotions, (unsigned long long)st.host.tier.demotions,
		       (unsigned long long)st.host.tier.prefetch_to_cxl,
		       (unsigned long long)st.host.tier.vm_budget_pages,
		       (unsigned long long)st.host.tier.vm_dram_pages,
		       (unsigned long long)st.host.tier.vm_cxl_dirty_pages,
		       (unsigned long long)st.host.tier.vm_bytes_moved);
	}
	return detach_report(name, p, rc);
}

static int cmd_ls(void)
{
	static const char *const att[] = { "-", "readers", "writer" };
	struct pmo_entry e;
	unsigned int i;

	for (i = 0;; i++) {
		if (pmo_list(i, &e) < 0) {
			if (errno == ENOENT && i == 0)
				return 0;	/* empty store */
			return fail("list", errno);
		}
		printf("%s %llu %s\n", e.name, (unsigned long long)e.size,
		       att[e.attached >= 0 && e.attached <= 2 ? e.attached : 0]);
		if (!e.more)
			return 0;
	}
}

int main(int argc, char **argv)
{
	const char *key = getenv("PMO_KEY");
	int i = 1, n;

	if (i + 1 < argc && strcmp(argv[i], "--key") == 0) {
		key = argv[i + 1];
		i += 2;
	}
	if (i >= argc)
		usage();
	cmd = argv[i++];
	n = argc - i;
	argv += i;

	if (strcmp(cmd, "ls") == 0 && n == 0)
		return cmd_ls();
	if (strcmp(cmd, "design") == 0 && n == 1)
		return pmo_set_design(argv[0]) < 0 ? fail(argv[0], errno) : 0;

	if ((!strcmp(cmd, "create") && n == 2) || (!strcmp(cmd, "write") && n == 3) ||
	    (!strcmp(cmd, "read") && n == 3) || (!strcmp(cmd, "cat") && n == 1) ||
	    (!strcmp(cmd, "stat") && n == 1) || (!strcmp(cmd, "rm") && n == 1)) {
		if (!key || !*key) {
			fprintf(stderr, "pmo: %s: no key (use --key K or set PMO_KEY)\n", cmd);
			return 2;
		}
	} else {
		usage();
	}
	if (!strcmp(cmd, "create"))
		return cmd_create(argv[0], argv[1], key);
	if (!strcmp(cmd, "write"))
		return cmd_write(argv[0], argv[1], argv[2], key);
	if (!strcmp(cmd, "read"))
		return cmd_read(argv[0], argv[1], argv[2], key);
	if (!strcmp(cmd, "cat"))
		return cmd_cat(argv[0], key);
	if (!strcmp(cmd, "stat"))
		return cmd_stat(argv[0], key);
	return pdestroy(argv[0], key) < 0 ? fail(argv[0], errno) : 0;
}
