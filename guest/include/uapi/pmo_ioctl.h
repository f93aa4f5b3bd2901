/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * pmo_ioctl.h - ioctl ABI of /dev/pmo (guest/driver/pmo.ko), shared by the
 * driver and libpmo; its limits are the device protocol's (virtio_pmo.h).
 *
 * One attachment per open file: PMO_IOC_ATTACH binds the file to the
 * attachment; mmap(offset 0, length = size) of that file maps it;
 * PMO_IOC_DETACH, PMO_IOC_PSYNC and PMO_IOC_STAT act on it; close() (or
 * process death) detaches.  A file that was detached cannot attach again.
 * PMO_IOC_CREATE, PMO_IOC_DESTROY, PMO_IOC_LIST, PMO_IOC_SET_DESIGN and
 * PMO_IOC_INFO work on any open file.
 *
 * Errors are negative errno values from ioctl(), see guest/driver/README.md.
 * All structures have the same layout on 32- and 64-bit user space; padding
 * and reserved fields must be zero.
 */
#ifndef _UAPI_PMO_IOCTL_H
#define _UAPI_PMO_IOCTL_H

#include <linux/ioctl.h>
#include <linux/types.h>

#include "virtio_pmo.h"

/* The same limits as the device protocol, so a request passes through whole. */
#define PMO_NAME_LEN	VIRTIO_PMO_NAME_FIELD	/* name buffer: 1..63 bytes + NUL padding */
#define PMO_KEY_LEN	VIRTIO_PMO_KEY_FIELD	/* key buffer: 1..64 bytes */
#define PMO_DESIGN_LEN	VIRTIO_PMO_DESIGN_FIELD	/* design name buffer, NUL padded */

#define PMO_PERM_READ	VIRTIO_PMO_PERM_READ
#define PMO_PERM_WRITE	VIRTIO_PMO_PERM_WRITE

struct pmo_ioc_create {
	char name[PMO_NAME_LEN];	/* in: NUL terminated */
	__u64 size;			/* in: bytes, whole pages */
	__u32 key_len;			/* in */
	__u32 reserved;			/* in: 0 */
	__u8 key[PMO_KEY_LEN];		/* in */
};

struct pmo_ioc_destroy {
	char name[PMO_NAME_LEN];	/* in */
	__u32 key_len;			/* in */
	__u32 reserved;			/* in: 0 */
	__u8 key[PMO_KEY_LEN];		/* in */
};

struct pmo_ioc_attach {
	char name[PMO_NAME_LEN];	/* in */
	__u32 perm;			/* in: PMO_PERM_READ or PMO_PERM_WRITE */
	__u32 key_len;			/* in */
	__u8 key[PMO_KEY_LEN];		/* in */
	__u64 size;			/* out: bytes to mmap */
};

struct pmo_ioc_psync {
	__u64 pages_written;		/* out */
};

struct pmo_ioc_list {
	__u32 index;			/* in: 0, 1, 2, ... */
	__u32 attached;			/* out: 0 none, 1 readers, 2 writer */
	__u32 more;			/* out: non-zero if index + 1 exists */
	__u32 reserved;			/* out: 0 */
	__u64 size;			/* out */
	char name[PMO_NAME_LEN];	/* out: NUL terminated */
};

struct pmo_ioc_design {
	char name[PMO_DESIGN_LEN];	/* in: e.g. "d", "sp-id", "wedi" */
};

/*
 * The attachment's statistics: the device's STAT answer as it came, little
 * endian (struct virtio_pmo_stat, the one definition of those counters),
 * and what the driver itself knows.
 */
struct pmo_ioc_stat {
	struct virtio_pmo_stat host;	/* out */
	__u32 perm;			/* out: PMO_PERM_* of this attachment */
	__u32 poisoned;			/* out: pages the host reported poisoned */
};

/* The device's configuration space. */
struct pmo_ioc_info {
	__u32 version;
	__u32 page_size;
	__u64 window_size;
	__u32 max_name_len;
	__u32 max_key_len;
	__u64 max_pmo_size;
};

#define PMO_IOC_MAGIC	0xB8

#define PMO_IOC_CREATE		_IOW(PMO_IOC_MAGIC, 1, struct pmo_ioc_create)
#define PMO_IOC_DESTROY		_IOW(PMO_IOC_MAGIC, 2, struct pmo_ioc_destroy)
#define PMO_IOC_ATTACH		_IOWR(PMO_IOC_MAGIC, 3, struct pmo_ioc_attach)
#define PMO_IOC_DETACH		_IO(PMO_IOC_MAGIC, 4)
#define PMO_IOC_PSYNC		_IOR(PMO_IOC_MAGIC, 5, struct pmo_ioc_psync)
#define PMO_IOC_STAT		_IOR(PMO_IOC_MAGIC, 6, struct pmo_ioc_stat)
#define PMO_IOC_SET_DESIGN	_IOW(PMO_IOC_MAGIC, 7, struct pmo_ioc_design)
#define PMO_IOC_LIST		_IOWR(PMO_IOC_MAGIC, 8, struct pmo_ioc_list)
#define PMO_IOC_INFO		_IOR(PMO_IOC_MAGIC, 9, struct pmo_ioc_info)

#endif /* _UAPI_PMO_IOCTL_H */
