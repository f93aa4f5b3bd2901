/*
 * pmo.h - encrypted Persistent Memory Objects for guest programs (libpmo.a).
 *
 * A PMO is a named, fixed-size, encrypted persistent object kept by the
 * hypervisor.  attach() maps it into the process; the hypervisor decrypts and
 * verifies each page on first touch.  psync() makes the current contents
 * durable atomically; after any crash the PMO holds exactly its last psync'ed
 * contents.  detach() (or closing/exiting) ends the attach session.
 *
 * Errors: every call returns -1 (or NULL) and sets errno.  The values:
 *   EACCES        wrong key (the device says nothing about which part)
 *   EBUSY         the PMO is attached by a writer, or by readers when a writer
 *                 asks, or pdestroy() of an attached PMO
 *   EEXIST        pcreate() of a name that exists
 *   ENOENT        no PMO of that name
 *   EINVAL        malformed argument: name characters, size (zero or not a
 *                 multiple of the page size, or too large), perm, key length
 *                 (1..64 bytes), an address that is not inside an attachment
 *   ENAMETOOLONG  name longer than 63 bytes
 *   ENOMEM        no room in the device window for the attachment, or no
 *                 memory; p_malloc(): no free block large enough
 *   ENOSPC        the PMO store is full
 *   EIO           the store's medium failed, or the device answered nonsense
 *   EBADMSG       integrity check failed: attach(): the PMO's metadata does not
 *                 verify; psync(), detach(): a page of this attachment failed its
 *                 check on the host (psync() persisted nothing: the PMO stays as
 *                 of its last good psync; detach() did detach and unmap);
 *                 allocator calls: the heap header or a block is corrupted
 *   ESTALE        the host refused the PMO when it opened the store: its stored
 *                 record may be an old copy (damaged, duplicated, or contradicted
 *                 by the rollback anchor); nothing of it is used until repaired
 *   EPERM         write access refused by the device
 *   EROFS         allocator call that writes, on a read-only attachment
 *   ENODEV        /dev/pmo is missing (driver not loaded), or the device was
 *                 reset/removed (every attachment is then gone)
 *   EOPNOTSUPP    the device does not know the request
 *   EPROTO        protocol version mismatch with the device
 *   (and what open(2), mmap(2) and malloc(3) report: EMFILE, ENFILE, ...)
 *
 * Names: 1..63 bytes of [A-Za-z0-9._-], not starting with '.'.  Keys: C
 * strings of 1..64 bytes.  Sizes: whole pages (4096 bytes).
 *
 * Pointers inside a PMO: an attachment may land at a different address each
 * time, so data structures in a PMO must store offsets, not pointers:
 * p_off() turns a pointer into an offset, p_ptr() back.  libpmo never maps a
 * PMO at a fixed address.
 *
 * Faults: a write to a read-only attachment kills the process with SIGSEGV.
 * A page that fails its integrity check on the host raises SIGBUS in the
 * process that attached the PMO when anything touches the page (pmo.ko
 * signals and unmaps it on the host's PAGE_POISONED event); a system call
 * reading such a page from the mapping (write(2) straight from it) fails
 * with EFAULT or the SIGBUS arrives before it returns (with one vCPU the
 * kernel may have copied zeros, never data).  Either way the attachment's
 * psync() and detach() then fail with EBADMSG.  After detach() any access to
 * the old range is SIGSEGV (unmapped); a mapping the device reset took away
 * gives SIGBUS.
 *
 * Threads: all calls are thread-safe.  The only process-global state is the
 * table of attachments (address range -> /dev/pmo file descriptor), guarded
 * by one mutex; allocator calls hold that mutex too, so they are serialized
 * per process.  psync() and pmo_stat() do not hold it across the request.
 * fork(): attachments are not inherited (the child has no mapping there).
 */
#ifndef PMO_H
#define PMO_H

#include <stddef.h>
#include <stdint.h>

/*
 * The device protocol's structures (pmo_stat's counters).  It includes
 * <linux/types.h>: with musl, add the system's kernel headers, e.g.
 * -isystem target/guest/libpmo-build/uapi (guest/libpmo/README.md).
 */
#include "virtio_pmo.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PMO_READ	VIRTIO_PMO_PERM_READ	/* attach for reading; many readers at once */
#define PMO_WRITE	VIRTIO_PMO_PERM_WRITE	/* attach for reading and writing; exclusive */

/* The device protocol's limits (virtio_pmo.h). */
#define PMO_NAME_MAX	VIRTIO_PMO_NAME_MAX	/* 63 */
#define PMO_KEY_MAX	VIRTIO_PMO_KEY_FIELD	/* 64 */

/* Create PMO @name of @size bytes (whole pages, zero-filled) under @key. */
int pcreate(const char *name, size_t size, const char *key);

/* Destroy PMO @name; needs the right key; EBUSY while attached. */
int pdestroy(const char *name, const char *key);

/*
 * Attach PMO @name with @perm (PMO_READ or PMO_WRITE) and return its address
 * (write-back cacheable, demand-decrypted).  NULL and errno on error; a
 * failed attach maps nothing.
 */
void *attach(const char *name, int perm, const char *key);

/* End the attach session of the PMO containing @addr; unmaps it. */
int detach(void *addr);

/* Make the PMO containing @addr durable, atomically (whole PMO). */
int psync(void *addr);

/* Size in bytes of the attachment containing @addr, or 0 with errno EINVAL. */
size_t pmo_size(void *addr);

/*
 * Statistics of an attachment.  host is the device's STAT block, defined
 * once in virtio_pmo.h (guest/include/uapi/), as the device sent it: little
 * endian, the byte order of x86-64.  Its counters:
 *   size, faults (host faults served this session), fault_ns_total,
 *   pages_decrypted, pages_prefetched, psyncs, psync_pages, psync_ns_total,
 *   integrity_failures, fault_hist[i] (faults of [2^i, 2^(i+1)) us);
 *   prediction: a pre-populated page is used without a fault, so the host
 *   holds one page of each predicted batch back as a trigger whose use (or
 *   expiry unused) it sees; late pages were predicted but not ready when
 *   touched.  Estimates, as in the paper (seed 000 4.2):
 *     accuracy   ~ trigger_hits / (trigger_hits + trigger_wasted)
 *     used       ~ accuracy * pages_prefetched + trigger_hits + prefetch_late
 *     coverage   ~ used / (used + demand_unpredicted)
 *     timeliness ~ (used - prefetch_late) / used
 *   tier: DRAM/CXL tiering when the VMM keeps PMO plaintext within a DRAM
 *   budget (all 0 otherwise): dram_pages, cxl_dirty_pages, promotions,
 *   demotions, prefetch_to_cxl of this attachment, vm_budget_pages,
 *   vm_dram_pages, vm_cxl_dirty_pages, vm_bytes_moved across the VM.
 */
struct pmo_stat {
	struct virtio_pmo_stat host;
	int perm;			/* PMO_READ or PMO_WRITE */
	unsigned int poisoned;		/* pages reported poisoned */
};

/* Host-side statistics of the attachment containing @addr. */
int pmo_stat(void *addr, struct pmo_stat *st);

struct pmo_entry {
	char name[PMO_NAME_MAX + 1];
	uint64_t size;
	int attached;			/* 0 no, 1 readers, 2 a writer */
	int more;			/* non-zero: index + 1 exists */
};

/* The @index-th PMO of the store (0, 1, ...); ENOENT past the end. */
int pmo_list(unsigned int index, struct pmo_entry *e);

/* Select the host's PMO design by name (e.g. "d", "sp-id", "wedi"). */
int pmo_set_design(const char *design);

/*
 * Allocator inside a PMO.  @pmo is the address attach() returned.  The heap
 * metadata lives in the PMO: a header at offset 0 (magic "PMOHEAP1",
 * version, heap bounds, root offset, free list) followed by 16-byte aligned
 * blocks, each with a 16-byte header; free blocks form an address-ordered,
 * coalescing free list.  A heap built with it survives detach, VM reboot and
 * VMM restart as of the last psync(): call psync() when your structure is
 * consistent.  A zero-filled writable PMO is formatted on first use.
 */

/* Format @size bytes at @base as an empty heap (any writable memory). */
int p_heap_init(void *base, size_t size);

void *p_malloc(void *pmo, size_t n);			/* NULL + errno */
void *p_calloc(void *pmo, size_t n, size_t sz);	/* zeroed */
void p_free(void *pmo, void *p);	/* NULL is a no-op; bad pointer: errno EINVAL */

/* The persistent root object (NULL clears it). */
int p_set_root(void *pmo, void *p);
void *p_get_root(void *pmo);		/* NULL: none (errno 0) or error */

/* Pointer <-> offset from the PMO start; offset 0 stands for NULL. */
uint64_t p_off(void *pmo, const void *p);	/* 0 + EINVAL if outside */
void *p_ptr(void *pmo, uint64_t off);		/* NULL + EINVAL if outside */

struct p_heap_info {
	uint64_t size;			/* PMO bytes covered by the heap */
	uint64_t used_bytes;		/* in allocated blocks, headers included */
	uint64_t free_bytes;
	uint64_t used_blocks;
	uint64_t free_blocks;
	uint64_t largest_free;		/* largest allocation possible + 16 */
};

/* Walk and check the whole heap; EBADMSG if anything is inconsistent. */
int p_heap_check(void *pmo, struct p_heap_info *info);

#ifdef __cplusplus
}
#endif

#endif /* PMO_H */
