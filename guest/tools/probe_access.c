/*
 * pmo_probe's checks of the access rules: wrong keys, read-only and
 * exclusive attachments, destroy while attached, detach and death of a
 * mapping process, and the driver's argument checks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

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

int wrongkey(const char *name, const char *bad)
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

int rowrite(const char *name)
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

int readers(const char *name)
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

int excl(const char *name)
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

int destroybusy(const char *name)
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

int detachmapped(const char *name)
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

int crash(const char *name)
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

int abi(const char *name)
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
