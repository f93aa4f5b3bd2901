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
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pmo.h"
#include "pmo_ioctl.h"

static const char *key;

#define FAIL(...) do { printf("fail " __VA_ARGS__); printf("\n"); return 1; } while (0)

/* Lines of /proc/self/maps that map /dev/pmo. */
static int pmo_mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "/dev/pmo"))
			n++;
	fclose(f);
	return n;
}

static int wrongkey(const char *name, const char *bad)
{
	void *p;
	int before = pmo_mappings();

	errno = 0;
	p = attach(name, PMO_READ, bad);
	if (p)
		FAIL("attach with a wrong key succeeded at %p", p);
	if (errno != EACCES)
		FAIL("attach with a wrong key: %s (want EACCES)", strerror(errno));
	if (pmo_mappings() != before)
		FAIL("a /dev/pmo mapping appeared after the failed attach");
	errno = 0;
	if (attach(name, PMO_WRITE, bad) || errno != EACCES)
		FAIL("attach(w) with a wrong key: %s (want EACCES)", strerror(errno));
	if (pdestroy(name, bad) == 0 || errno != EACCES)
		FAIL("pdestroy with a wrong key: %s (want EACCES)", strerror(errno));
	printf("ok EACCES for attach(r), attach(w) and pdestroy; nothing mapped\n");
	return 0;
}

static int rowrite(const char *name)
{
	volatile unsigned char *p;
	pid_t pid;
	int st, mprot_err;

	p = attach(name, PMO_READ, key);
	if (!p)
		FAIL("attach(r): %s", strerror(errno));
	if (mprotect((void *)p, 4096, PROT_READ | PROT_WRITE) == 0)
		FAIL("mprotect(PROT_WRITE) of a read-only attachment succeeded");
	mprot_err = errno;
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		FAIL("fork: %s", strerror(errno));
	if (pid == 0) {
		/* The child has no mapping (not inherited): attach on its own. */
		volatile unsigned char *q = attach(name, PMO_READ, key);

		if (!q)
			_exit(3);
		(void)q[0];
		q[0] = 0x5a;	/* must not get past this */
		_exit(4);
	}
	if (waitpid(pid, &st, 0) < 0)
		FAIL("waitpid: %s", strerror(errno));
	detach((void *)p);
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGSEGV)
		FAIL("child %s %d (want SIGSEGV)", WIFSIGNALED(st) ? "got signal" : "exited with",
		     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	printf("ok mprotect(PROT_WRITE) refused (%s); a write killed the child with SIGSEGV\n",
	       strerror(mprot_err));
	return 0;
}

static int readers(const char *name)
{
	unsigned char *a, *b, first[256];
	pid_t pid;
	int st;
	size_t n;

	a = attach(name, PMO_READ, key);
	if (!a)
		FAIL("first attach(r): %s", strerror(errno));
	b = attach(name, PMO_READ, key);
	if (!b)
		FAIL("second attach(r) while the first is held: %s", strerror(errno));
	n = pmo_size(a);
	if (a == b || pmo_size(b) != n || memcmp(a, b, n) != 0)
		FAIL("two readers see different contents");
	memcpy(first, a, sizeof(first));
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		/* Attachments are not inherited: attach again in the child. */
		unsigned char *c = attach(name, PMO_READ, key);

		if (!c)
			_exit(10 + (errno & 0x7f));
		_exit(memcmp(c, first, sizeof(first)) ? 2 : 0);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		FAIL("fork/wait: %s", strerror(errno));
	if (detach(a) < 0 || detach(b) < 0)
		FAIL("detach: %s", strerror(errno));
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		FAIL("a third reader in another process failed (status %d%s)",
		     WIFEXITED(st) ? WEXITSTATUS(st) : -1,
		     WIFEXITED(st) && WEXITSTATUS(st) >= 10 ? ": errno + 10" : "");
	printf("ok three readers at once (two in one process, one in another)\n");
	return 0;
}

static int expect_busy(const char *name, int perm, const char *what)
{
	void *p;

	errno = 0;
	p = attach(name, perm, key);
	if (p) {
		detach(p);
		printf("fail %s succeeded (want EBUSY)\n", what);
		return 1;
	}
	if (errno != EBUSY) {
		printf("fail %s: %s (want EBUSY)\n", what, strerror(errno));
		return 1;
	}
	return 0;
}

static int excl(const char *name)
{
	void *w, *r;

	w = attach(name, PMO_WRITE, key);
	if (!w)
		FAIL("attach(w): %s", strerror(errno));
	if (expect_busy(name, PMO_READ, "attach(r) while a writer holds it") ||
	    expect_busy(name, PMO_WRITE, "attach(w) while a writer holds it"))
		return 1;
	if (detach(w) < 0)
		FAIL("detach(w): %s", strerror(errno));
	r = attach(name, PMO_READ, key);
	if (!r)
		FAIL("attach(r) after the writer left: %s", strerror(errno));
	if (expect_busy(name, PMO_WRITE, "attach(w) while a reader holds it"))
		return 1;
	if (detach(r) < 0)
		FAIL("detach(r): %s", strerror(errno));
	w = attach(name, PMO_WRITE, key);
	if (!w)
		FAIL("attach(w) after all left: %s", strerror(errno));
	detach(w);
	printf("ok writer excludes r and w, reader excludes w (EBUSY); free again after detach\n");
	return 0;
}

static int destroybusy(const char *name)
{
	void *p = attach(name, PMO_READ, key);
	int rc, e;

	if (!p)
		FAIL("attach(r): %s", strerror(errno));
	errno = 0;
	rc = pdestroy(name, key);
	e = errno;
	if (detach(p) < 0)
		FAIL("detach: %s", strerror(errno));
	if (rc == 0)
		FAIL("pdestroy of an attached PMO succeeded");
	if (e != EBUSY)
		FAIL("pdestroy of an attached PMO: %s (want EBUSY)", strerror(e));
	printf("ok pdestroy of an attached PMO: EBUSY\n");
	return 0;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

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

static int wb(const char *name)
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

/* Raw driver use: attach on @fd and map; returns the mapping or NULL. */
static unsigned char *raw_attach(int fd, const char *name, size_t *size)
{
	struct pmo_ioc_attach a;
	void *p;

	memset(&a, 0, sizeof(a));
	strncpy(a.name, name, sizeof(a.name) - 1);
	a.perm = PMO_PERM_WRITE;
	a.key_len = strlen(key);
	memcpy(a.key, key, a.key_len);
	if (ioctl(fd, PMO_IOC_ATTACH, &a) < 0)
		return NULL;
	*size = a.size;
	p = mmap(NULL, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int detachmapped(const char *name)
{
	volatile unsigned char *p;
	size_t size;
	pid_t pid;
	int fd, st;
	void *again;

	fflush(stdout);
	pid = fork();
	if (pid < 0)
		FAIL("fork: %s", strerror(errno));
	if (pid == 0) {
		fd = open("/dev/pmo", O_RDWR);
		if (fd < 0)
			_exit(3);
		p = raw_attach(fd, name, &size);
		if (!p)
			_exit(4);
		p[0] = 1;			/* faulted in and writable */
		if (ioctl(fd, PMO_IOC_DETACH) < 0)
			_exit(5);
		if (ioctl(fd, PMO_IOC_PSYNC, &size) == 0 || errno != EINVAL)
			_exit(6);		/* the fd has no attachment any more */
		(void)p[0];			/* must not get past this */
		_exit(7);
	}
	if (waitpid(pid, &st, 0) < 0)
		FAIL("waitpid: %s", strerror(errno));
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGBUS)
		FAIL("child %s %d (want SIGBUS)", WIFSIGNALED(st) ? "got signal" : "exited with",
		     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	again = attach(name, PMO_WRITE, key);
	if (!again)
		FAIL("attach(w) after the detach: %s", strerror(errno));
	detach(again);
	printf("ok access after PMO_IOC_DETACH with the mapping still there: SIGBUS; PMO free again\n");
	return 0;
}

static int crash(const char *name)
{
	static const char good[] = "PSYNCED-STATE", lost[] = "UNSYNCED-DATA";
	unsigned char *p;
	pid_t pid;
	int st, rc = 0;

	fflush(stdout);
	pid = fork();
	if (pid < 0)
		FAIL("fork: %s", strerror(errno));
	if (pid == 0) {
		p = attach(name, PMO_WRITE, key);
		if (!p)
			_exit(3);
		memcpy(p + 100, good, sizeof(good));
		if (psync(p) < 0)
			_exit(4);
		memcpy(p + 100, lost, sizeof(lost));
		memcpy(p + 8192, lost, sizeof(lost));
		raise(SIGKILL);
		_exit(5);
	}
	if (waitpid(pid, &st, 0) < 0)
		FAIL("waitpid: %s", strerror(errno));
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
		FAIL("writer child did not die by SIGKILL (status %d)",
		     WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	p = attach(name, PMO_READ, key);
	if (!p)
		FAIL("attach(r) after the writer was killed: %s", strerror(errno));
	if (memcmp(p + 100, good, sizeof(good)) != 0) {
		printf("fail offset 100 holds \"%.13s\", want the psync'ed \"%s\"\n", p + 100, good);
		rc = 1;
	} else if (pmo_size(p) > 8192 + sizeof(lost) && memcmp(p + 8192, lost, sizeof(lost)) == 0) {
		printf("fail an unsynced write of the killed writer survived\n");
		rc = 1;
	}
	detach(p);
	if (!rc)
		printf("ok killed writer: detached by the driver, PMO holds the last psync's data\n");
	return rc;
}

/* One raw ioctl expectation: @want 0 for success, else the errno. */
static int expect(int ok_so_far, const char *what, int rc, int want)
{
	int got = rc < 0 ? errno : 0;

	if (got == want)
		return ok_so_far;
	printf("fail %s: got %s, want %s\n", what, got ? strerror(got) : "success",
	       want ? strerror(want) : "success");
	return 0;
}

static int abi(const char *name)
{
	struct pmo_ioc_create c;
	struct pmo_ioc_attach a;
	struct pmo_ioc_list l;
	struct pmo_ioc_design d;
	struct pmo_ioc_info info;
	struct pmo_ioc_psync ps;
	int fd, ro, ok = 1;
	void *p;

	fd = open("/dev/pmo", O_RDWR);
	ro = open("/dev/pmo", O_RDONLY);
	if (fd < 0 || ro < 0)
		FAIL("open /dev/pmo: %s", strerror(errno));
	ok = expect(ok, "INFO", ioctl(fd, PMO_IOC_INFO, &info), 0);
	if (ok && (info.version != 1 || info.page_size != 4096 || !info.window_size ||
		   info.max_name_len != 63 || info.max_key_len != 64))
		FAIL("INFO: version %u page %u window %llu name %u key %u", info.version,
		     info.page_size, (unsigned long long)info.window_size, info.max_name_len,
		     info.max_key_len);
	ok = expect(ok, "unknown ioctl", ioctl(fd, _IO(PMO_IOC_MAGIC, 99)), ENOTTY);
	ok = expect(ok, "DETACH on a fresh fd", ioctl(fd, PMO_IOC_DETACH), EINVAL);
	ok = expect(ok, "PSYNC on a fresh fd", ioctl(fd, PMO_IOC_PSYNC, &ps), EINVAL);
	ok = expect(ok, "mmap of a fresh fd",
		    mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED ? -1 : 0, EINVAL);

	memset(&c, 0, sizeof(c));
	c.size = 4096;
	c.key_len = 1;
	c.key[0] = 'k';
	ok = expect(ok, "CREATE empty name", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	strcpy(c.name, ".hidden");
	ok = expect(ok, "CREATE leading dot", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	strcpy(c.name, "bad/name");
	ok = expect(ok, "CREATE slash", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	memset(c.name, 'a', sizeof(c.name));
	ok = expect(ok, "CREATE no NUL", ioctl(fd, PMO_IOC_CREATE, &c), ENAMETOOLONG);
	memset(c.name, 0, sizeof(c.name));
	strcpy(c.name, "t-abi-x");
	c.size = 4097;
	ok = expect(ok, "CREATE unaligned size", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	c.size = 0;
	ok = expect(ok, "CREATE size 0", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	c.size = 4096;
	c.key_len = 0;
	ok = expect(ok, "CREATE key_len 0", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	c.key_len = 65;
	ok = expect(ok, "CREATE key_len 65", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	c.key_len = 1;
	c.reserved = 1;
	ok = expect(ok, "CREATE reserved", ioctl(fd, PMO_IOC_CREATE, &c), EINVAL);
	ok = expect(ok, "CREATE bad pointer", ioctl(fd, PMO_IOC_CREATE, (void *)8), EFAULT);

	memset(&d, 0, sizeof(d));
	strcpy(d.name, "no such/design");
	ok = expect(ok, "SET_DESIGN bad chars", ioctl(fd, PMO_IOC_SET_DESIGN, &d), EINVAL);
	memset(&l, 0, sizeof(l));
	l.index = 0x7fffffff;
	ok = expect(ok, "LIST past the end", ioctl(fd, PMO_IOC_LIST, &l), ENOENT);

	memset(&a, 0, sizeof(a));
	strncpy(a.name, name, sizeof(a.name) - 1);
	a.key_len = strlen(key);
	memcpy(a.key, key, a.key_len);
	a.perm = 3;
	ok = expect(ok, "ATTACH perm 3", ioctl(fd, PMO_IOC_ATTACH, &a), EINVAL);
	a.perm = PMO_PERM_WRITE;
	ok = expect(ok, "ATTACH(w) on an O_RDONLY fd", ioctl(ro, PMO_IOC_ATTACH, &a), EBADF);
	a.perm = PMO_PERM_READ;
	ok = expect(ok, "ATTACH(r)", ioctl(ro, PMO_IOC_ATTACH, &a), 0);
	if (ok && a.size < 4096)
		FAIL("ATTACH returned size %llu", (unsigned long long)a.size);
	ok = expect(ok, "second ATTACH on the same fd", ioctl(ro, PMO_IOC_ATTACH, &a), EINVAL);
	ok = expect(ok, "mmap of the wrong length",
		    mmap(NULL, a.size + 4096, PROT_READ, MAP_SHARED, ro, 0) == MAP_FAILED ? -1 : 0,
		    EINVAL);
	ok = expect(ok, "mmap at an offset",
		    mmap(NULL, a.size, PROT_READ, MAP_SHARED, ro, 4096) == MAP_FAILED ? -1 : 0,
		    EINVAL);
	ok = expect(ok, "mmap MAP_PRIVATE",
		    mmap(NULL, a.size, PROT_READ, MAP_PRIVATE, ro, 0) == MAP_FAILED ? -1 : 0,
		    EINVAL);
	p = mmap(NULL, a.size, PROT_READ, MAP_SHARED, ro, 0);
	ok = expect(ok, "mmap of the read attachment", p == MAP_FAILED ? -1 : 0, 0);
	if (p != MAP_FAILED)
		munmap(p, a.size);
	ok = expect(ok, "DETACH", ioctl(ro, PMO_IOC_DETACH), 0);
	ok = expect(ok, "DETACH twice", ioctl(ro, PMO_IOC_DETACH), EINVAL);
	ok = expect(ok, "ATTACH after DETACH on the same fd", ioctl(ro, PMO_IOC_ATTACH, &a),
		    EINVAL);
	close(fd);
	close(ro);
	if (ok)
		printf("ok INFO, bad names/sizes/keys/reserved/perm, fd binding, mmap checks\n");
	return ok ? 0 : 1;
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

static int stats(const char *name)
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
static int stats_direct(const char *name)
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

static int fill(const char *name)
{
	unsigned char *p = attach(name, PMO_WRITE, key);
	size_t n, i;

	if (!p)
		FAIL("attach(w): %s", strerror(errno));
	n = pmo_size(p) / 4096;
	for (i = 0; i < n; i++)
		snprintf((char *)p + i * 4096, 32, "page %zu", i);
	if (psync(p) < 0)
		FAIL("psync: %s", strerror(errno));
	if (detach(p) < 0)
		FAIL("detach: %s", strerror(errno));
	printf("ok wrote %zu pages\n", n);
	return 0;
}

static int poisoned(const char *name, const char *page_s)
{
	size_t bad = strtoul(page_s, NULL, 0), n, i;
	unsigned char *p;
	char want[32];
	pid_t pid;
	int st;

	fflush(stdout);
	pid = fork();
	if (pid < 0)
		FAIL("fork: %s", strerror(errno));
	if (pid == 0) {
		volatile unsigned char *q = attach(name, PMO_READ, key);

		if (!q)
			_exit(3);
		(void)q[bad * 4096];	/* must not get past this */
		_exit(4);
	}
	if (waitpid(pid, &st, 0) < 0)
		FAIL("waitpid: %s", strerror(errno));
	if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGBUS)
		FAIL("reader of page %zu %s %d (want SIGBUS)", bad,
		     WIFSIGNALED(st) ? "got signal" : "exited with",
		     WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	p = attach(name, PMO_READ, key);
	if (!p)
		FAIL("attach(r) after the SIGBUS: %s", strerror(errno));
	n = pmo_size(p) / 4096;
	for (i = 0; i < n; i++) {
		if (i == bad)
			continue;
		snprintf(want, sizeof(want), "page %zu", i);
		if (strcmp((char *)p + i * 4096, want) != 0) {
			detach(p);
			FAIL("page %zu does not read back", i);
		}
	}
	detach(p);
	printf("ok page %zu: SIGBUS; the other %zu pages read fine\n", bad, n - 1);
	return 0;
}

static volatile sig_atomic_t bus_count;

static void count_sigbus(int sig)
{
	(void)sig;
	bus_count++;
}

/* Whether @hay holds @needle. */
static int holds(const unsigned char *hay, size_t n, const char *needle)
{
	return memmem(hay, n, needle, strlen(needle)) != NULL;
}

static int kernel_write(const char *name, const char *page_s, const char *marker, int ahead,
			int to_pipe)
{
	static unsigned char out[4096];
	size_t bad = strtoul(page_s, NULL, 0), i;
	volatile unsigned char *q;
	struct sigaction sa;
	struct pmo_stat st;
	int fd, e, bus_before, bus_after, zeros = 1, rc_psync, e_psync, rc_detach, e_detach;
	int fds[2] = { -1, -1 };
	ssize_t w, r;

	memset(&st, 0, sizeof(st));
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = count_sigbus;
	sigaction(SIGBUS, &sa, NULL);
	q = attach(name, PMO_WRITE, key);
	if (!q)
		FAIL("attach(w): %s", strerror(errno));
	if (ahead) {
		/* A user-space walk up to the page: the host's predictor reaches it first. */
		for (i = 0; i < bad; i++)
			(void)q[i * 4096];
		for (i = 0; i < 2000; i++) {
			if (pmo_stat((void *)q, &st) == 0 && st.poisoned > 0)
				break;
			usleep(10000);
		}
		if (!st.poisoned)
			FAIL("the driver never heard of page %zu (integrity_failures %llu)", bad,
			     (unsigned long long)st.host.integrity_failures);
	}
	if (to_pipe) {
		if (pipe(fds) < 0)
			FAIL("pipe: %s", strerror(errno));
		fd = fds[1];
	} else {
		fd = open("/tmp/kernel_write.out", O_CREAT | O_TRUNC | O_RDWR, 0600);
		if (fd < 0)
			FAIL("open: %s", strerror(errno));
	}
	printf("writing page %zu to a %s...\n", bad, to_pipe ? "pipe" : "file");
	fflush(stdout);
	bus_before = bus_count;
	w = write(fd, (void *)(q + bad * 4096), sizeof(out));
	e = errno;
	/* Handlers of signals pending at the syscall's return have run by now. */
	bus_after = bus_count;
	errno = 0;
	rc_psync = psync((void *)q);
	e_psync = errno;
	errno = 0;
	rc_detach = detach((void *)q);
	e_detach = errno;
	if (to_pipe) {
		r = w > 0 ? read(fds[0], out, (size_t)w) : 0;
		close(fds[0]);
	} else {
		r = pread(fd, out, sizeof(out), 0);
	}
	close(fd);
	if (r < 0)
		FAIL("read back: %s", strerror(errno));
	if (holds(out, (size_t)r, marker))
		FAIL("the file holds the tampered page's plaintext \"%s\"", marker);
	for (i = 0; i < (size_t)r; i++)
		zeros &= out[i] == 0;
	if (w >= 0 && !zeros)
		FAIL("write(2) passed on %zd bytes that are not zeros", w);
	if (w >= 0 && bus_after == bus_before)
		FAIL("write(2) passed on %zd bytes of zeros and no SIGBUS came before it returned", w);
	if (w < 0 && e != EFAULT)
		FAIL("write(2): %s (want EFAULT)", strerror(e));
	if (rc_psync == 0 || e_psync != EBADMSG)
		FAIL("psync after the failed page: %s (want EBADMSG)",
		     rc_psync ? strerror(e_psync) : "success");
	if (rc_detach == 0 || e_detach != EBADMSG)
		FAIL("detach after the failed page: %s (want EBADMSG)",
		     rc_detach ? strerror(e_detach) : "success");
	if (ahead && (w >= 0 || bus_count))
		FAIL("page %zu was announced ahead, yet write(2) gave %zd and %d SIGBUS", bad, w,
		     (int)bus_count);
	if (w < 0)
		printf("ok write(2) from page %zu to a %s: EFAULT, %s; psync and detach: EBADMSG\n",
		       bad, to_pipe ? "pipe" : "file", bus_count ? "SIGBUS" : "no SIGBUS");
	else
		printf("ok write(2) from page %zu to a %s: %zd bytes of zeros, SIGBUS before it "
		       "returned; psync and detach: EBADMSG\n", bad, to_pipe ? "pipe" : "file", w);
	return 0;
}

static sigjmp_buf bus_jmp;

static void on_sigbus(int sig)
{
	siglongjmp(bus_jmp, sig);
}

static int sysfs_write(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY), rc;

	if (fd < 0)
		return -1;
	rc = write(fd, text, strlen(text)) == (ssize_t)strlen(text) ? 0 : -1;
	close(fd);
	return rc;
}

static int rebind(const char *name)
{
	static const char drv[] = "/sys/bus/virtio/drivers/pmo";
	static const char good[] = "BEFORE-UNBIND";
	char dev[64] = "", path[128];
	volatile unsigned char *p;
	struct sigaction sa;
	struct dirent *de;
	DIR *dir;
	int i, sig, e;
	void *q;

	dir = opendir(drv);
	if (!dir)
		FAIL("%s: %s", drv, strerror(errno));
	while ((de = readdir(dir)))
		if (!strncmp(de->d_name, "virtio", 6) && strlen(de->d_name) < sizeof(dev))
			memcpy(dev, de->d_name, strlen(de->d_name) + 1);
	closedir(dir);
	if (!dev[0])
		FAIL("no device bound to %s", drv);

	p = attach(name, PMO_WRITE, key);
	if (!p)
		FAIL("attach(w): %s", strerror(errno));
	memcpy((void *)p, good, sizeof(good));
	if (psync((void *)p) < 0)
		FAIL("psync: %s", strerror(errno));
	memcpy((void *)p, "AFTER-PSYNC!!", sizeof(good));

	snprintf(path, sizeof(path), "%s/unbind", drv);
	if (sysfs_write(path, dev) < 0)
		FAIL("unbind %s: %s", dev, strerror(errno));
	errno = 0;
	if (psync((void *)p) == 0 || errno != ENODEV)
		FAIL("psync after unbind: %s (want ENODEV)", strerror(errno));
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigbus;
	sigaction(SIGBUS, &sa, NULL);
	sig = sigsetjmp(bus_jmp, 1);
	if (!sig) {
		(void)p[0];
		FAIL("read of the mapping after unbind succeeded");
	}
	signal(SIGBUS, SIG_DFL);
	errno = 0;
	if (detach((void *)p) == 0 || errno != ENODEV)
		FAIL("detach after unbind: %s (want ENODEV)", strerror(errno));

	snprintf(path, sizeof(path), "%s/bind", drv);
	if (sysfs_write(path, dev) < 0)
		FAIL("bind %s: %s", dev, strerror(errno));
	for (i = 0; i < 100 && access("/dev/pmo", F_OK) < 0; i++)
		usleep(100000);
	q = attach(name, PMO_READ, key);
	if (!q)
		FAIL("attach(r) after rebind: %s", strerror(errno));
	memcpy(path, q, sizeof(good));
	e = memcmp(path, good, sizeof(good));
	detach(q);
	if (e)
		FAIL("after rebind the PMO holds \"%.13s\", want the psync'ed \"%s\"", path, good);
	printf("ok unbind with a live mapping: psync ENODEV, access SIGBUS, detach ENODEV; "
	       "rebind: last psync's data\n");
	return 0;
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
