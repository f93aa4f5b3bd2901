/*
 * libpmo: the PMO calls over /dev/pmo (guest/driver/pmo.ko).
 *
 * Each attach() opens its own /dev/pmo file, binds it to the attachment with
 * PMO_IOC_ATTACH and maps it; closing that file detaches (the driver does it
 * on process death too).  The table below maps an attached address range
 * back to its file; it is the library's only process-global state and is
 * guarded by one mutex.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pmo.h"
#include "pmo_internal.h"
#include "pmo_ioctl.h"

#define PMO_DEV "/dev/pmo"

struct att {
	struct att *next;
	unsigned char *addr;
	size_t size;
	int fd;
	int perm;
	int users;		/* psync/stat requests using fd right now */
};

static pthread_mutex_t pmo_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pmo_idle = PTHREAD_COND_INITIALIZER;
static struct att *pmo_atts;	/* guarded by pmo_mutex */

void pmo_lock_(void)
{
	pthread_mutex_lock(&pmo_mutex);
}

void pmo_unlock_(void)
{
	pthread_mutex_unlock(&pmo_mutex);
}

/* With the lock held: the attachment containing @addr, or NULL. */
static struct att **find_slot(const void *addr)
{
	struct att **pp;
	uintptr_t a = (uintptr_t)addr;

	for (pp = &pmo_atts; *pp; pp = &(*pp)->next) {
		uintptr_t s = (uintptr_t)(*pp)->addr;

		if (a >= s && a - s < (*pp)->size)
			return pp;
	}
	return NULL;
}

/*
 * Takes the lock and finds the attachment containing @addr: returns its
 * slot with the lock held, or NULL with errno EINVAL and the lock released.
 */
static struct att **lock_slot(const void *addr)
{
	struct att **pp;

	pmo_lock_();
	pp = find_slot(addr);
	if (!pp) {
		pmo_unlock_();
		errno = EINVAL;
	}
	return pp;
}

int pmo_find_base_(void *base, size_t *size, int *perm)
{
	struct att **pp = find_slot(base);

	if (!pp || (*pp)->addr != base)
		return 0;
	*size = (*pp)->size;
	*perm = (*pp)->perm;
	return 1;
}

static int open_dev(int flags)
{
	int fd = open(PMO_DEV, flags | O_CLOEXEC);

	if (fd < 0 && errno == ENOENT)
		errno = ENODEV;	/* ENOENT means "no such PMO" in this library */
	return fd;
}

/* ioctl on a fresh /dev/pmo file (calls that are not bound to an attachment). */
static int dev_ioctl(unsigned long cmd, void *arg)
{
	int fd = open_dev(O_RDONLY), rc, e;

	if (fd < 0)
		return -1;
	rc = ioctl(fd, cmd, arg);
	e = errno;
	close(fd);
	errno = e;
	return rc < 0 ? -1 : 0;
}

static int copy_name(char dst[PMO_NAME_LEN], const char *name)
{
	size_t n;

	if (!name) {
		errno = EINVAL;
		return -1;
	}
	n = strlen(name);
	if (n > PMO_NAME_MAX) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memset(dst, 0, PMO_NAME_LEN);
	memcpy(dst, name, n);
	return 0;
}

static int copy_key(__u32 *len, __u8 dst[PMO_KEY_LEN], const char *key)
{
	size_t n;

	if (!key) {
		errno = EINVAL;
		return -1;
	}
	n = strlen(key);
	if (n == 0 || n > PMO_KEY_MAX) {
		errno = EINVAL;
		return -1;
	}
	*len = (__u32)n;
	memcpy(dst, key, n);
	return 0;
}

int pcreate(const char *name, size_t size, const char *key)
{
	struct pmo_ioc_create c;
	int rc = -1, e;

	memset(&c, 0, sizeof(c));
	c.size = size;
	if (copy_name(c.name, name) == 0 && copy_key(&c.key_len, c.key, key) == 0)
		rc = dev_ioctl(PMO_IOC_CREATE, &c);
	e = errno;
	explicit_bzero(&c, sizeof(c));
	errno = e;
	return rc;
}

int pdestroy(const char *name, const char *key)
{
	struct pmo_ioc_destroy d;
	int rc = -1, e;

	memset(&d, 0, sizeof(d));
	if (copy_name(d.name, name) == 0 && copy_key(&d.key_len, d.key, key) == 0)
		rc = dev_ioctl(PMO_IOC_DESTROY, &d);
	e = errno;
	explicit_bzero(&d, sizeof(d));
	errno = e;
	return rc;
}

void *attach(const char *name, int perm, const char *key)
{
	struct pmo_ioc_attach a;
	struct att *t;
	void *addr;
	int fd, rc = -1, e;

	if (perm != PMO_READ && perm != PMO_WRITE) {
		errno = EINVAL;
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.perm = perm == PMO_WRITE ? PMO_PERM_WRITE : PMO_PERM_READ;
	if (copy_name(a.name, name) < 0 || copy_key(&a.key_len, a.key, key) < 0)
		goto wipe;
	fd = open_dev(perm == PMO_WRITE ? O_RDWR : O_RDONLY);
	if (fd < 0)
		goto wipe;
	rc = ioctl(fd, PMO_IOC_ATTACH, &a);
	e = errno;
	explicit_bzero(&a.key, sizeof(a.key));
	errno = e;
	if (rc < 0)
		goto close_fd;
	rc = -1;
	if (a.size == 0 || a.size > SIZE_MAX) {
		errno = EIO;
		goto close_fd;
	}
	addr = mmap(NULL, (size_t)a.size,
		    PROT_READ | (perm == PMO_WRITE ? PROT_WRITE : 0),
		    MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED)
		goto close_fd;
	t = calloc(1, sizeof(*t));
	if (!t) {
		munmap(addr, (size_t)a.size);
		errno = ENOMEM;
		goto close_fd;
	}
	t->addr = addr;
	t->size = (size_t)a.size;
	t->fd = fd;
	t->perm = perm;
	pmo_lock_();
	t->next = pmo_atts;
	pmo_atts = t;
	pmo_unlock_();
	return addr;

close_fd:
	e = errno;
	close(fd);	/* the driver detaches on close */
	errno = e;
wipe:
	e = errno;
	explicit_bzero(&a, sizeof(a));
	errno = e;
	return NULL;
}

int detach(void *addr)
{
	struct att **pp, *t;
	int rc, e = 0;

	pp = lock_slot(addr);
	if (!pp)
		return -1;
	t = *pp;
	*pp = t->next;		/* no new users from here on */
	while (t->users)
		pthread_cond_wait(&pmo_idle, &pmo_mutex);
	pmo_unlock_();

	/* The driver unmaps the slice everywhere before telling the host. */
	rc = ioctl(t->fd, PMO_IOC_DETACH);
	if (rc < 0)
		e = errno;
	munmap(t->addr, t->size);
	close(t->fd);
	free(t);
	if (rc < 0) {
		errno = e;
		return -1;
	}
	return 0;
}

/* Runs @cmd on the file of the attachment containing @addr, without the lock. */
static int att_ioctl(void *addr, unsigned long cmd, void *arg)
{
	struct att **pp, *t;
	int rc, e;

	pp = lock_slot(addr);
	if (!pp)
		return -1;
	t = *pp;
	t->users++;
	pmo_unlock_();
	rc = ioctl(t->fd, cmd, arg);
	e = errno;
	pmo_lock_();
	if (--t->users == 0)
		pthread_cond_broadcast(&pmo_idle);
	pmo_unlock_();
	errno = e;
	return rc < 0 ? -1 : 0;
}

int psync(void *addr)
{
	struct pmo_ioc_psync p;

	memset(&p, 0, sizeof(p));
	return att_ioctl(addr, PMO_IOC_PSYNC, &p);
}

int pmo_stat(void *addr, struct pmo_stat *st)
{
	struct pmo_ioc_stat s;

	if (!st) {
		errno = EINVAL;
		return -1;
	}
	memset(&s, 0, sizeof(s));
	if (att_ioctl(addr, PMO_IOC_STAT, &s) < 0)
		return -1;
	memset(st, 0, sizeof(*st));
	st->host = s.host;
	st->perm = s.perm == PMO_PERM_WRITE ? PMO_WRITE : PMO_READ;
	st->poisoned = s.poisoned;
	return 0;
}

size_t pmo_size(void *addr)
{
	struct att **pp;
	size_t n = 0;

	pmo_lock_();
	pp = find_slot(addr);
	if (pp)
		n = (*pp)->size;
	pmo_unlock_();
	if (!pp)
		errno = EINVAL;
	return n;
}

int pmo_list(unsigned int index, struct pmo_entry *e)
{
	struct pmo_ioc_list l;

	if (!e) {
		errno = EINVAL;
		return -1;
	}
	memset(&l, 0, sizeof(l));
	l.index = index;
	if (dev_ioctl(PMO_IOC_LIST, &l) < 0)
		return -1;
	memset(e, 0, sizeof(*e));
	memcpy(e->name, l.name, PMO_NAME_MAX);
	e->size = l.size;
	e->attached = (int)l.attached;
	e->more = l.more != 0;
	return 0;
}

int pmo_set_design(const char *design)
{
	struct pmo_ioc_design d;

	memset(&d, 0, sizeof(d));
	if (!design || strlen(design) >= PMO_DESIGN_LEN) {
		errno = design ? ENAMETOOLONG : EINVAL;
		return -1;
	}
	memcpy(d.name, design, strlen(design));
	return dev_ioctl(PMO_IOC_SET_DESIGN, &d);
}
