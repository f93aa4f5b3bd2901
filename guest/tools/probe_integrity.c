/*
 * pmo_probe's checks of pages the host refused: a user access dies of
 * SIGBUS, a kernel copy from the page fails or comes with SIGBUS, and the
 * attachment's psync and detach report EBADMSG.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "probe.h"

int fill(const char *name)
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

int poisoned(const char *name, const char *page_s)
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

int kernel_write(const char *name, const char *page_s, const char *marker, int ahead,
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
