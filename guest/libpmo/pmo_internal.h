/* Internal to libpmo: the attachment table shared by pmo.c and palloc.c. */
#ifndef PMO_INTERNAL_H
#define PMO_INTERNAL_H

#include <stddef.h>

/* The process-global lock of libpmo (attachment table and allocator calls). */
void pmo_lock_(void);
void pmo_unlock_(void);

/*
 * With the lock held: the attachment that starts exactly at @base.
 * Returns 1 and fills @size and @perm, or 0 if @base is not an attachment.
 */
int pmo_find_base_(void *base, size_t *size, int *perm);

#endif
