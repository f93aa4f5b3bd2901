/*
 * pmo_file.c - MDB_pmo_ops on an ordinary mapped file: a host TEST backend,
 * not atomic (see pmo_file.h).
 */
#define _XOPEN_SOURCE 700

#include "pmo_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* One attached file. */
struct file_map {
	void *addr;
	size_t size;
	struct file_map *next;
};

/* ops->ctx */
struct file_ctx {
	pthread_mutex_t lock;
	struct file_map *maps;
	unsigned long syncs;
};

/* Open (maybe create) @path and map it; the size in *size. NULL + errno. */
static void *map_file(const char *path, size_t *size, int writable)
{
	int fd = open(path, writable ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0664);
	struct stat st;
	size_t len;
	void *addr;
	int rc;

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) != 0)
		goto fail;
	len = (size_t)st.st_size;
	if (len == 0) {
		if (!writable || *size == 0) {
			errno = ENOENT;
			goto fail;
		}
		if (ftruncate(fd, (off_t)*size) != 0)
			goto fail;
		len = *size;
	}
	addr = mmap(NULL, len, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED)
		goto fail;
	close(fd);
	*size = len;
	return addr;
fail:
	rc = errno;
	close(fd);
	errno = rc;
	return NULL;
}

static void *file_attach(void *ctx, const char *path, size_t *size, int writable)
{
	struct file_ctx *c = ctx;
	struct file_map *m = malloc(sizeof(*m));
	size_t len = *size;

	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->addr = map_file(path, &len, writable);
	if (!m->addr) {
		int rc = errno;

		free(m);
		errno = rc;
		return NULL;
	}
	m->size = len;
	pthread_mutex_lock(&c->lock);
	m->next = c->maps;
	c->maps = m;
	pthread_mutex_unlock(&c->lock);
	*size = len;
	return m->addr;
}

/* The mapping at @addr, unlinked from the list if @take; NULL if unknown. */
static struct file_map *find(struct file_ctx *c, void *addr, int take)
{
	struct file_map **pp, *m;

	pthread_mutex_lock(&c->lock);
	for (pp = &c->maps; (m = *pp) != NULL; pp = &m->next) {
		if (m->addr == addr) {
			if (take)
				*pp = m->next;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return m;
}

static int file_sync(void *ctx, void *addr)
{
	struct file_ctx *c = ctx;
	struct file_map *m = find(c, addr, 0);

	if (!m)
		return EINVAL;
	if (msync(m->addr, m->size, MS_SYNC) != 0)
		return errno;
	pthread_mutex_lock(&c->lock);
	c->syncs++;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static int file_detach(void *ctx, void *addr)
{
	struct file_map *m = find(ctx, addr, 1);
	int rc;

	if (!m)
		return EINVAL;
	rc = munmap(m->addr, m->size) ? errno : 0;
	free(m);
	return rc;
}

int mdb_pmo_file(MDB_pmo_ops *ops)
{
	struct file_ctx *c;

	if (!ops)
		return EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return ENOMEM;
	if (pthread_mutex_init(&c->lock, NULL) != 0) {
		free(c);
		return ENOMEM;
	}
	ops->attach = file_attach;
	ops->sync = file_sync;
	ops->detach = file_detach;
	ops->ctx = c;
	return 0;
}

unsigned long mdb_pmo_file_syncs(const MDB_pmo_ops *ops)
{
	struct file_ctx *c;
	unsigned long n;

	if (!ops || !ops->ctx)
		return 0;
	c = ops->ctx;
	pthread_mutex_lock(&c->lock);
	n = c->syncs;
	pthread_mutex_unlock(&c->lock);
	return n;
}

void mdb_pmo_file_free(MDB_pmo_ops *ops)
{
	struct file_ctx *c;

	if (!ops || !ops->ctx)
		return;
	c = ops->ctx;
	while (c->maps) {
		struct file_map *m = c->maps;

		c->maps = m->next;
		free(m);
	}
	pthread_mutex_destroy(&c->lock);
	free(c);
	memset(ops, 0, sizeof(*ops));
}
