/*
 * fb_files.c - the test backend of ordinary files (fb_files.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "fb_files.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One attachment. */
struct attached {
	char name[64];
	void *addr;
	size_t size;
	int writable;
};

struct fb_files {
	char dir[PATH_MAX];
	pthread_mutex_t lock;	/* the table */
	struct attached *a;
	size_t n, cap;
};

/* PMO name rules (pmo.h): 1..63 of [A-Za-z0-9._-], not starting with '.'. */
static int check_name(const char *name)
{
	size_t n = strnlen(name, 64);

	if (n == 0 || name[0] == '.')
		return EINVAL;
	if (n > 63)
		return ENAMETOOLONG;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return EINVAL;
	}
	return 0;
}

static int path_of(const struct fb_files *f, const char *name, char *path)
{
	int err = check_name(name);

	if (err)
		return err;
	if (snprintf(path, PATH_MAX, "%s/%s", f->dir, name) >= PATH_MAX)
		return ENAMETOOLONG;
	return 0;
}

struct fb_files *fb_files_open(const char *dir)
{
	struct fb_files *f;

	if (!dir || strlen(dir) >= PATH_MAX - 70) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	if (mkdir(dir, 0700) && errno != EEXIST)
		return NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	snprintf(f->dir, sizeof(f->dir), "%s", dir);
	pthread_mutex_init(&f->lock, NULL);
	return f;
}

void fb_files_close(struct fb_files *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n; i++)
		munmap(f->a[i].addr, f->a[i].size);
	free(f->a);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

/* Index of the attachment of @name (any mode) from @from, or -1; lock held. */
static long find_name(const struct fb_files *f, const char *name, size_t from)
{
	for (size_t i = from; i < f->n; i++)
		if (strcmp(f->a[i].name, name) == 0)
			return (long)i;
	return -1;
}

/* Index of the attachment containing @addr, or -1; lock held. */
static long find_addr(const struct fb_files *f, const void *addr)
{
	const char *p = addr;

	for (size_t i = 0; i < f->n; i++) {
		const char *b = f->a[i].addr;

		if (p >= b && p < b + f->a[i].size)
			return (long)i;
	}
	return -1;
}

static int files_create(void *ctx, const char *name, size_t size)
{
	struct fb_files *f = ctx;
	char path[PATH_MAX];
	int fd, err = path_of(f, name, path);

	if (err)
		return err;
	if (size == 0 || size % FB_PAGE)
		return EINVAL;
	fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return errno;
	/* A sparse file of zeros, as pcreate() makes a zero-filled PMO. */
	if (ftruncate(fd, (off_t)size)) {
		err = errno;
		close(fd);
		unlink(path);
		return err;
	}
	close(fd);
	return 0;
}

static int files_destroy(void *ctx, const char *name)
{
	struct fb_files *f = ctx;
	char path[PATH_MAX];
	int err = path_of(f, name, path);

	if (err)
		return err;
	pthread_mutex_lock(&f->lock);
	if (find_name(f, name, 0) >= 0)
		err = EBUSY;
	else if (unlink(path))
		err = errno;
	pthread_mutex_unlock(&f->lock);
	return err;
}

static void *files_attach(void *ctx, const char *name, int writable, size_t *size)
{
	struct fb_files *f = ctx;
	char path[PATH_MAX];
	struct stat st;
	void *addr = NULL;
	int fd = -1, err = path_of(f, name, path);
	long i;

	if (err) {
		errno = err;
		return NULL;
	}
	pthread_mutex_lock(&f->lock);
	/* A writer excludes everybody; readers exclude a writer. */
	for (i = find_name(f, name, 0); i >= 0; i = find_name(f, name, (size_t)i + 1))
		if (writable || f->a[i].writable) {
			err = EBUSY;
			goto out;
		}
	if (f->n == f->cap) {
		size_t cap = f->cap ? 2 * f->cap : 16;
		struct attached *a = realloc(f->a, cap * sizeof(*a));

		if (!a) {
			err = ENOMEM;
			goto out;
		}
		f->a = a;
		f->cap = cap;
	}
	fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		err = errno;
		goto out;
	}
	if (st.st_size <= 0 || st.st_size % FB_PAGE) {
		err = EIO;
		goto out;
	}
	addr = mmap(NULL, (size_t)st.st_size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED,
		    fd, 0);
	if (addr == MAP_FAILED) {
		addr = NULL;
		err = errno;
		goto out;
	}
	snprintf(f->a[f->n].name, sizeof(f->a[f->n].name), "%s", name);
	f->a[f->n].addr = addr;
	f->a[f->n].size = (size_t)st.st_size;
	f->a[f->n].writable = writable;
	f->n++;
	*size = (size_t)st.st_size;
out:
	pthread_mutex_unlock(&f->lock);
	if (fd >= 0)
		close(fd);
	if (!addr)
		errno = err;
	return addr;
}

static int files_sync(void *ctx, void *addr)
{
	struct fb_files *f = ctx;
	void *base = NULL;
	size_t size = 0;
	long i;

	pthread_mutex_lock(&f->lock);
	i = find_addr(f, addr);
	if (i >= 0) {
		base = f->a[i].addr;
		size = f->a[i].size;
	}
	pthread_mutex_unlock(&f->lock);
	if (!base)
		return EINVAL;
	/* The attachment stays: only its holder detaches it. */
	return msync(base, size, MS_SYNC) ? errno : 0;
}

static int files_detach(void *ctx, void *addr)
{
	struct fb_files *f = ctx;
	struct attached a;
	long i;

	pthread_mutex_lock(&f->lock);
	i = find_addr(f, addr);
	if (i < 0) {
		pthread_mutex_unlock(&f->lock);
		return EINVAL;
	}
	a = f->a[i];
	f->a[i] = f->a[--f->n];
	pthread_mutex_unlock(&f->lock);
	return munmap(a.addr, a.size) ? errno : 0;
}

void fb_files_ops(struct fb_files *f, struct fb_pmo_ops *ops)
{
	ops->create = files_create;
	ops->destroy = files_destroy;
	ops->attach = files_attach;
	ops->sync = files_sync;
	ops->detach = files_detach;
	ops->ctx = f;
}
