/*
 * pmo_probe's check of the device going away under a mapped attachment
 * (driver unbind, the removal/reset path) and of the rebind after it.
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
#include <sys/mman.h>
#include <unistd.h>

#include "probe.h"

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

int rebind(const char *name)
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
