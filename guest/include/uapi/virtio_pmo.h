/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * virtio_pmo.h - the virtio-pmo device protocol (docs/virtio-pmo.md).
 *
 * One definition for the guest driver (guest/driver/) and, through
 * pmo_ioctl.h, libpmo.  The device model's side is
 * devices/pmo-virtio/src/proto/wire.rs; its test tests/c_layout.rs reads
 * every structure and constant of this header, asks the compiler for each
 * field's offset and size, and fails unless the Rust side has the same
 * fields, names, offsets, sizes and values.
 *
 * Every field is little-endian and no structure has padding.  A request is
 * a virtio_pmo_req_hdr followed by the op's payload; a response is a
 * virtio_pmo_resp_hdr (status and payload length) followed by the payload,
 * present only when the status is VIRTIO_PMO_S_OK.
 */
#ifndef _UAPI_VIRTIO_PMO_H
#define _UAPI_VIRTIO_PMO_H

#include <linux/types.h>

/* Virtio device type (unassigned in virtio 1.3). */
#define VIRTIO_ID_PMO			63
#define VIRTIO_PMO_VERSION		1

#define VIRTIO_PMO_NAME_FIELD		64	/* NUL padded */
#define VIRTIO_PMO_NAME_MAX		63	/* longest name: the field keeps a NUL */
#define VIRTIO_PMO_KEY_FIELD		64	/* 1..64 bytes used */
#define VIRTIO_PMO_DESIGN_FIELD		16	/* NUL padded */
#define VIRTIO_PMO_HIST_BUCKETS		16	/* [2^i, 2^(i+1)) microseconds */

enum virtio_pmo_op {
	VIRTIO_PMO_OP_CREATE = 1,	/* virtio_pmo_create */
	VIRTIO_PMO_OP_DESTROY = 2,	/* virtio_pmo_destroy */
	VIRTIO_PMO_OP_ATTACH = 3,	/* virtio_pmo_attach -> virtio_pmo_attach_resp */
	VIRTIO_PMO_OP_DETACH = 4,	/* virtio_pmo_handle */
	VIRTIO_PMO_OP_PSYNC = 5,	/* virtio_pmo_handle -> virtio_pmo_psync_resp */
	VIRTIO_PMO_OP_STAT = 6,		/* virtio_pmo_handle -> virtio_pmo_stat */
	VIRTIO_PMO_OP_SET_DESIGN = 7,	/* virtio_pmo_set_design */
	VIRTIO_PMO_OP_LIST = 8,		/* virtio_pmo_list -> virtio_pmo_list_resp */
};

/* Status: 0 or a Linux errno value, so the driver passes it on as -status. */
enum virtio_pmo_status {
	VIRTIO_PMO_S_OK = 0,
	VIRTIO_PMO_S_PERM = 1,		/* psync of a reader */
	VIRTIO_PMO_S_NOENT = 2,		/* no such PMO, handle or index */
	VIRTIO_PMO_S_IO = 5,		/* the medium failed */
	VIRTIO_PMO_S_NOMEM = 12,	/* no room in the window */
	VIRTIO_PMO_S_ACCES = 13,	/* wrong key */
	VIRTIO_PMO_S_BUSY = 16,		/* attached, or one writer */
	VIRTIO_PMO_S_EXIST = 17,	/* name taken */
	VIRTIO_PMO_S_INVAL = 22,	/* malformed field */
	VIRTIO_PMO_S_NOSPC = 28,	/* store full */
	VIRTIO_PMO_S_NAMETOOLONG = 36,	/* name over VIRTIO_PMO_NAME_MAX */
	VIRTIO_PMO_S_NOSYS = 38,	/* unknown op */
	VIRTIO_PMO_S_PROTO = 71,	/* bad header or version */
	VIRTIO_PMO_S_BADMSG = 74,	/* a page failed verification */
	VIRTIO_PMO_S_STALE = 116,	/* refused by the host at open: stale record */
};

#define VIRTIO_PMO_PERM_READ		1
#define VIRTIO_PMO_PERM_WRITE		2

/* virtio_pmo_list_resp.attached */
#define VIRTIO_PMO_LIST_DETACHED	0
#define VIRTIO_PMO_LIST_READERS		1
#define VIRTIO_PMO_LIST_WRITER		2

/* An access to the page was refused: unmap it, SIGBUS the attaching process. */
#define VIRTIO_PMO_EVENT_PAGE_POISONED	1
/* A prefetch found the page bad before any access: unmap it. */
#define VIRTIO_PMO_EVENT_PAGE_BAD	2

/* Device configuration space. */
struct virtio_pmo_config {
	__le32 version;
	__le32 page_size;
	__le64 window_size;		/* bytes of the shared-memory window */
	__le32 max_name_len;
	__le32 max_key_len;
	__le64 max_pmo_size;
} __attribute__((packed));

struct virtio_pmo_req_hdr {
	__le16 version;			/* VIRTIO_PMO_VERSION */
	__le16 op;			/* enum virtio_pmo_op */
	__le32 len;			/* payload bytes, exactly the op's */
} __attribute__((packed));

struct virtio_pmo_resp_hdr {
	__le32 status;			/* enum virtio_pmo_status */
	__le32 len;			/* payload bytes */
} __attribute__((packed));

struct virtio_pmo_create {
	__u8 name[VIRTIO_PMO_NAME_FIELD];
	__le64 size;			/* bytes, whole pages */
	__le32 key_len;
	__u8 key[VIRTIO_PMO_KEY_FIELD];
} __attribute__((packed));

struct virtio_pmo_destroy {
	__u8 name[VIRTIO_PMO_NAME_FIELD];
	__le32 key_len;
	__u8 key[VIRTIO_PMO_KEY_FIELD];
} __attribute__((packed));

struct virtio_pmo_attach {
	__u8 name[VIRTIO_PMO_NAME_FIELD];
	__le32 perm;			/* VIRTIO_PMO_PERM_* */
	__le32 key_len;
	__u8 key[VIRTIO_PMO_KEY_FIELD];
} __attribute__((packed));

/* DETACH, PSYNC and STAT name an attachment by its handle. */
struct virtio_pmo_handle {
	__le64 handle;
} __attribute__((packed));

struct virtio_pmo_set_design {
	__u8 name[VIRTIO_PMO_DESIGN_FIELD];
} __attribute__((packed));

struct virtio_pmo_list {
	__le32 index;
} __attribute__((packed));

struct virtio_pmo_attach_resp {
	__le64 handle;
	__le64 window_offset;
	__le64 size;
} __attribute__((packed));

struct virtio_pmo_psync_resp {
	__le64 pages_written;
} __attribute__((packed));

/* DRAM/CXL tiering under the VMM's DRAM budget (all 0 without one). */
struct virtio_pmo_tier_stat {
	__le64 dram_pages;		/* this attachment's pages in local DRAM */
	__le64 cxl_dirty_pages;		/* ... written, demoted to device memory */
	__le64 promotions;		/* ... brought back into DRAM */
	__le64 demotions;		/* ... moved out of DRAM */
	__le64 prefetch_to_cxl;		/* predictions left in the CXL tier */
	__le64 vm_budget_pages;		/* the VM's DRAM budget */
	__le64 vm_dram_pages;		/* resident across the VM's attachments */
	__le64 vm_cxl_dirty_pages;	/* in device memory across them */
	__le64 vm_bytes_moved;		/* between DRAM and the CXL tier */
} __attribute__((packed));

/*
 * STAT's answer: the attachment's host-side counters.  The one definition
 * of this block: PMO_IOC_STAT passes it to user space unchanged and libpmo's
 * struct pmo_stat embeds it.
 */
struct virtio_pmo_stat {
	__le64 size;
	__le64 faults;
	__le64 fault_ns_total;
	__le64 pages_decrypted;
	__le64 pages_prefetched;
	__le64 psyncs;
	__le64 psync_pages;
	__le64 psync_ns_total;
	__le64 integrity_failures;
	__le64 fault_hist[VIRTIO_PMO_HIST_BUCKETS];
	__le64 triggers;
	__le64 trigger_hits;
	__le64 trigger_wasted;
	__le64 prefetch_late;
	__le64 demand_unpredicted;
	struct virtio_pmo_tier_stat tier;
} __attribute__((packed));

struct virtio_pmo_list_resp {
	__u8 name[VIRTIO_PMO_NAME_FIELD];
	__le64 size;
	__le32 attached;		/* VIRTIO_PMO_LIST_* */
	__le32 more;			/* non-zero if index + 1 exists */
} __attribute__((packed));

/* One event-queue buffer. */
struct virtio_pmo_event {
	__le32 kind;			/* VIRTIO_PMO_EVENT_* */
	__le32 reserved;
	__le64 handle;
	__le64 page;			/* from the PMO's start */
	__le64 reserved2;
} __attribute__((packed));

#endif /* _UAPI_VIRTIO_PMO_H */
