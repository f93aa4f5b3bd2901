/*
 * The allocator inside a PMO (see pmo.h for the layout).
 *
 * Everything it knows lives in the PMO, so nothing here is process state:
 *   offset 0     struct p_hdr (128 bytes): magic, version, bounds, root,
 *                free list head, usage counters
 *   offset 128   blocks up to the end of the PMO, 16-byte aligned; each
 *                starts with struct p_blk (size | P_USED, then the next free
 *                block's offset if free, or P_TAG ^ own offset if used)
 * Free blocks form a singly linked list in strictly increasing address
 * order and are coalesced with their neighbours on free, so a walk always
 * terminates and two free blocks are never adjacent.  Every offset read
 * from the PMO is bounds-checked before use: a corrupted heap gives
 * EBADMSG, never a wild access.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "pmo.h"
#include "pmo_internal.h"

#define P_MAGIC		0x31504145484f4d50ULL	/* "PMOHEAP1" little-endian */
#define P_VERSION	1
#define P_HDR_SIZE	128
#define P_ALIGN		16
#define P_BHDR		16
#define P_MIN_BLOCK	32
#define P_USED		1ULL
#define P_FLAGS		(P_ALIGN - 1)
#define P_TAG		0x9e3779b97f4a7c15ULL

struct p_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_size;
	uint64_t size;		/* bytes of the PMO the heap covers */
	uint64_t heap_start;	/* offset of the first block */
	uint64_t heap_end;	/* == size */
	uint64_t root;		/* offset of the root object, 0 = none */
	uint64_t free_head;	/* offset of the first free block, 0 = none */
	uint64_t used_bytes;
	uint64_t used_blocks;
	uint64_t reserved[7];
};

struct p_blk {
	uint64_t size_flags;
	uint64_t link;
};

_Static_assert(sizeof(struct p_hdr) == P_HDR_SIZE, "p_hdr layout");
_Static_assert(sizeof(struct p_blk) == P_BHDR, "p_blk layout");

struct heap {
	unsigned char *base;
	struct p_hdr *h;
};

static struct p_blk *blk(const struct heap *hp, uint64_t off)
{
	return (struct p_blk *)(hp->base + off);
}

static uint64_t bsize(const struct p_blk *b)
{
	return b->size_flags & ~(uint64_t)P_FLAGS;
}

/* A block header at @off that lies inside the heap with a sane size. */
static int valid_block(const struct heap *hp, uint64_t off)
{
	const struct p_hdr *h = hp->h;
	uint64_t sz;

	if (off % P_ALIGN || off < h->heap_start || off > h->heap_end - P_MIN_BLOCK)
		return 0;
	sz = bsize(blk(hp, off));
	return sz >= P_MIN_BLOCK && sz <= h->heap_end - off;
}

static int format(unsigned char *base, size_t size)
{
	struct p_hdr *h = (struct p_hdr *)base;
	struct p_blk *b;
	uint64_t end = size & ~(uint64_t)(P_ALIGN - 1);

	if (!base || (uintptr_t)base % P_ALIGN || end < P_HDR_SIZE + P_MIN_BLOCK) {
		errno = EINVAL;
		return -1;
	}
	memset(h, 0, sizeof(*h));
	h->version = P_VERSION;
	h->hdr_size = P_HDR_SIZE;
	h->size = end;
	h->heap_start = P_HDR_SIZE;
	h->heap_end = end;
	h->free_head = P_HDR_SIZE;
	b = (struct p_blk *)(base + P_HDR_SIZE);
	b->size_flags = end - P_HDR_SIZE;
	b->link = 0;
	h->magic = P_MAGIC;	/* last: a half-formatted heap is not a heap */
	return 0;
}

static int all_zero(const unsigned char *p, size_t n)
{
	while (n--)
		if (*p++)
			return 0;
	return 1;
}

/*
 * With the lock held: validate the heap at @pmo.  @write: the caller will
 * modify it (EROFS on a read-only attachment; a zero-filled writable
 * attachment is formatted here).
 */
static int heap_open(void *pmo, int write, struct heap *hp)
{
	size_t att_size = 0;
	int perm = PMO_WRITE, attached;
	struct p_hdr *h = pmo;

	if (!pmo || (uintptr_t)pmo % P_ALIGN) {
		errno = EINVAL;
		return -1;
	}
	attached = pmo_find_base_(pmo, &att_size, &perm);
	if (write && perm != PMO_WRITE) {
		errno = EROFS;
		return -1;
	}
	if (h->magic != P_MAGIC) {
		if (attached && write && all_zero(pmo, P_HDR_SIZE)) {
			if (format(pmo, att_size) < 0)
				return -1;
		} else {
			errno = h->magic ? EBADMSG : EINVAL;
			return -1;
		}
	}
	if (h->version != P_VERSION || h->hdr_size != P_HDR_SIZE ||
	    h->heap_start != P_HDR_SIZE || h->heap_end != h->size ||
	    h->size % P_ALIGN || h->size < P_HDR_SIZE + P_MIN_BLOCK ||
	    (attached && h->size > att_size) ||
	    h->root >= h->size || h->free_head >= h->size) {
		errno = EBADMSG;
		return -1;
	}
	hp->base = pmo;
	hp->h = h;
	return 0;
}

int p_heap_init(void *base, size_t size)
{
	size_t att_size;
	int perm, rc;

	pmo_lock_();
	if (pmo_find_base_(base, &att_size, &perm)) {
		if (perm != PMO_WRITE) {
			pmo_unlock_();
			errno = EROFS;
			return -1;
		}
		if (size > att_size)
			size = att_size;
	}
	rc = format(base, size);
	pmo_unlock_();
	return rc;
}

static void *heap_alloc(struct heap *hp, size_t n)
{
	struct p_hdr *h = hp->h;
	uint64_t need, off, *link = &h->free_head, prev_end = 0;
	struct p_blk *b = NULL;

	if (n > h->heap_end) {
		errno = ENOMEM;
		return NULL;
	}
	need = ((uint64_t)n + P_ALIGN - 1) / P_ALIGN * P_ALIGN + P_BHDR;
	if (need < P_MIN_BLOCK)
		need = P_MIN_BLOCK;
	for (off = *link; off; off = *link) {
		if (off < prev_end || !valid_block(hp, off) ||
		    (blk(hp, off)->size_flags & P_USED)) {
			errno = EBADMSG;
			return NULL;
		}
		b = blk(hp, off);
		if (bsize(b) >= need)
			break;
		prev_end = off + bsize(b);
		link = &b->link;
	}
	if (!off) {
		errno = ENOMEM;
		return NULL;
	}
	if (bsize(b) - need >= P_MIN_BLOCK) {
		struct p_blk *rest = blk(hp, off + need);

		rest->size_flags = bsize(b) - need;
		rest->link = b->link;
		*link = off + need;
	} else {
		need = bsize(b);
		*link = b->link;
	}
	b->size_flags = need | P_USED;
	b->link = P_TAG ^ off;
	h->used_bytes += need;
	h->used_blocks++;
	return hp->base + off + P_BHDR;
}

void *p_malloc(void *pmo, size_t n)
{
	struct heap hp;
	void *p = NULL;

	pmo_lock_();
	if (heap_open(pmo, 1, &hp) == 0)
		p = heap_alloc(&hp, n);
	pmo_unlock_();
	return p;
}

void *p_calloc(void *pmo, size_t n, size_t sz)
{
	void *p;

	if (sz && n > SIZE_MAX / sz) {
		errno = ENOMEM;
		return NULL;
	}
	p = p_malloc(pmo, n * sz);
	if (p)
		memset(p, 0, n * sz);
	return p;
}

static int heap_free(struct heap *hp, void *ptr)
{
	struct p_hdr *h = hp->h;
	uintptr_t a = (uintptr_t)ptr, base = (uintptr_t)hp->base;
	uint64_t off, size, prev = 0, cur;
	struct p_blk *b, *pb = NULL;

	if (a < base + P_BHDR || a - base - P_BHDR < h->heap_start) {
		errno = EINVAL;
		return -1;
	}
	off = a - base - P_BHDR;
	if (!valid_block(hp, off)) {
		errno = EINVAL;
		return -1;
	}
	b = blk(hp, off);
	if (!(b->size_flags & P_USED) || b->link != (P_TAG ^ off)) {
		errno = EINVAL;	/* not a block start, or freed already */
		return -1;
	}
	size = bsize(b);

	/* Find the free neighbours: prev < off < cur. */
	for (cur = h->free_head; cur && cur < off; cur = blk(hp, cur)->link) {
		if (!valid_block(hp, cur) || (blk(hp, cur)->size_flags & P_USED) ||
		    (prev && cur < prev + bsize(pb))) {
			errno = EBADMSG;
			return -1;
		}
		prev = cur;
		pb = blk(hp, cur);
	}
	if ((pb && prev + bsize(pb) > off) || (cur && cur < off + size) ||
	    (cur && (!valid_block(hp, cur) || (blk(hp, cur)->size_flags & P_USED)))) {
		errno = EBADMSG;
		return -1;
	}
	h->used_bytes -= size;
	h->used_blocks--;
	b->size_flags = size;
	b->link = cur;
	if (cur && off + size == cur) {
		struct p_blk *nb = blk(hp, cur);

		b->size_flags = size + bsize(nb);
		b->link = nb->link;
		nb->size_flags = 0;
		nb->link = 0;
	}
	if (pb && prev + bsize(pb) == off) {
		pb->size_flags = bsize(pb) + bsize(b);
		pb->link = b->link;
		b->size_flags = 0;
		b->link = 0;
	} else if (pb) {
		pb->link = off;
	} else {
		h->free_head = off;
	}
	return 0;
}

void p_free(void *pmo, void *p)
{
	struct heap hp;

	if (!p)
		return;
	pmo_lock_();
	if (heap_open(pmo, 1, &hp) == 0)
		heap_free(&hp, p);
	pmo_unlock_();
}

int p_set_root(void *pmo, void *p)
{
	struct heap hp;
	uintptr_t a = (uintptr_t)p, base = (uintptr_t)pmo;
	int rc = -1;

	pmo_lock_();
	if (heap_open(pmo, 1, &hp) == 0) {
		if (!p) {
			hp.h->root = 0;
			rc = 0;
		} else if (a >= base + hp.h->heap_start && a - base < hp.h->heap_end) {
			hp.h->root = a - base;
			rc = 0;
		} else {
			errno = EINVAL;
		}
	}
	pmo_unlock_();
	return rc;
}

void *p_get_root(void *pmo)
{
	struct heap hp;
	void *p = NULL;

	pmo_lock_();
	if (heap_open(pmo, 0, &hp) == 0) {
		errno = 0;
		if (hp.h->root)
			p = hp.base + hp.h->root;
	}
	pmo_unlock_();
	return p;
}

/* Lock-free: only the PMO's own header is read. */
static uint64_t pmo_bytes(void *pmo)
{
	const struct p_hdr *h = pmo;

	if (!pmo || h->magic != P_MAGIC)
		return 0;
	return h->size;
}

uint64_t p_off(void *pmo, const void *p)
{
	uintptr_t a = (uintptr_t)p, base = (uintptr_t)pmo;
	uint64_t size;

	if (!p)
		return 0;
	size = pmo_bytes(pmo);
	if (a <= base || a - base >= size) {
		errno = EINVAL;
		return 0;
	}
	return a - base;
}

void *p_ptr(void *pmo, uint64_t off)
{
	if (!off)
		return NULL;
	if (off >= pmo_bytes(pmo)) {
		errno = EINVAL;
		return NULL;
	}
	return (unsigned char *)pmo + off;
}

int p_heap_check(void *pmo, struct p_heap_info *info)
{
	struct p_heap_info st;
	struct heap hp;
	uint64_t off, next_free, nfree_list = 0;
	int rc = -1, prev_free = 0;

	memset(&st, 0, sizeof(st));
	pmo_lock_();
	if (heap_open(pmo, 0, &hp) < 0)
		goto out;
	st.size = hp.h->size;
	next_free = hp.h->free_head;
	/* Physical walk; the free list must visit exactly the free blocks, in order. */
	for (off = hp.h->heap_start; off < hp.h->heap_end; off += bsize(blk(&hp, off))) {
		struct p_blk *b;

		if (!valid_block(&hp, off))
			goto bad;
		b = blk(&hp, off);
		if (b->size_flags & P_USED) {
			if (b->link != (P_TAG ^ off) || off == next_free)
				goto bad;
			st.used_bytes += bsize(b);
			st.used_blocks++;
			prev_free = 0;
		} else {
			if (prev_free || off != next_free)
				goto bad;
			st.free_bytes += bsize(b);
			st.free_blocks++;
			if (bsize(b) > st.largest_free)
				st.largest_free = bsize(b);
			next_free = b->link;
			nfree_list++;
			prev_free = 1;
		}
	}
	if (off != hp.h->heap_end || next_free != 0 || nfree_list != st.free_blocks ||
	    st.used_bytes != hp.h->used_bytes || st.used_blocks != hp.h->used_blocks)
		goto bad;
	if (info)
		*info = st;
	rc = 0;
	goto out;
bad:
	errno = EBADMSG;
out:
	pmo_unlock_();
	return rc;
}
