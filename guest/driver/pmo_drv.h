/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pmo_drv.h - what the files of pmo.ko share: the device and per-file
 * state, and the calls one file makes into another.
 *
 *   main.c    binding the virtio device: probe, config, reset, removal
 *   ctrl.c    the control virtqueue: one request at a time, its answer checked
 *   ioctl.c   the ioctls of /dev/pmo
 *   file.c    a /dev/pmo file: open, release (= detach), mmap and page faults
 *   event.c   the event virtqueue: refused pages signalled and unmapped
 *
 * Locking, outermost first:
 *   pmo_file.lock       ioctls on one file; state, handle, slice, perm
 *   pmo_dev.att_lock    the list of live attachments (event and reset paths)
 *   pmo_dev.sig_lock    also held to change that list, so the event
 *                       interrupt can walk it to signal attaching processes
 *   pmo_file.map_sem    whether the slice may be mapped, the poisoned pages
 *   pmo_dev.req_lock    one control request in flight, the request buffers
 *                       (taken under pmo_file.lock only)
 *   pmo_dev.vq_lock     the virtqueues, the in-flight bookkeeping, the
 *                       events taken off the event queue
 * ->mmap and the page-fault handler run under mmap_lock and take map_sem
 * only; nothing holds pmo_file.lock while touching user memory.  The zap of
 * a slice (unmap_mapping_range) is done after dropping map_sem.
 */
#ifndef PMO_DRV_H
#define PMO_DRV_H

#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/fs.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mutex.h>
#include <linux/pid.h>
#include <linux/rwsem.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "pmo_ioctl.h"
#include "virtio_pmo.h"

#define PMO_EVQ_BUFS		16
/* Pages a guest page fault maps at once: 2 MiB, aligned. */
#define PMO_FAULT_CHUNK		(512UL << PAGE_SHIFT)

#define PMO_REQ_MAX	(sizeof(struct virtio_pmo_req_hdr) + sizeof(struct virtio_pmo_create))
#define PMO_RESP_MAX	(sizeof(struct virtio_pmo_resp_hdr) + sizeof(struct virtio_pmo_stat))

struct pmo_dev {
	struct virtio_device *vdev;	/* NULL-safe only while !broken */
	struct kref ref;		/* probe + one per open file */
	struct miscdevice misc;
	struct virtqueue *ctrlq;
	struct virtqueue *evq;

	/* Protects ctrlq, evq, inflight, resp_len, inflight_err, broken. */
	spinlock_t vq_lock;
	bool inflight;
	bool broken;			/* removed or reset: fail everything */
	unsigned int resp_len;
	int inflight_err;
	struct completion done;

	/* One control request at a time; owns req and resp. */
	struct mutex req_lock;
	void *req;
	void *resp;

	struct virtio_pmo_event *evbufs;
	/* Used event buffers waiting for event_work (under vq_lock). */
	struct virtio_pmo_event *evdone[PMO_EVQ_BUFS];
	unsigned int evdone_len[PMO_EVQ_BUFS];
	unsigned int evdone_head, evdone_count;
	struct work_struct event_work;
	struct work_struct reset_work;

	/* Protects attachments and att_dead. */
	struct mutex att_lock;
	/* Also held (irqsave, inside att_lock) to change attachments. */
	spinlock_t sig_lock;
	struct list_head attachments;
	bool att_dead;

	/* Configuration, read once at probe. */
	phys_addr_t win_phys;
	u64 win_size;
	void *win_kaddr;
	u32 max_name_len;
	u32 max_key_len;
	u64 max_pmo_size;
};

enum pmo_fstate { PMO_F_FRESH, PMO_F_ATTACHED, PMO_F_DETACHED };

struct pmo_file {
	struct pmo_dev *pd;
	struct address_space *mapping;

	/* Serializes the ioctls of this file; protects the fields below it. */
	struct mutex lock;
	enum pmo_fstate state;
	u64 handle;
	u64 win_off;
	u64 size;
	u32 perm;
	/* The process that attached: told (SIGBUS) when the host refuses a page. */
	struct pid *owner;

	/* In pd->attachments while attached and the device lives. */
	struct list_head node;

	/* Protects live and poisoned against the page-fault handler. */
	struct rw_semaphore map_sem;
	bool live;
	struct xarray poisoned;
	atomic_t npoisoned;
};

/* main.c */
void pmo_dev_free(struct kref *ref);

/* ctrl.c */
void pmo_ctrl_done(struct virtqueue *vq);
int pmo_request(struct pmo_dev *pd, u16 op, const void *payload, u32 plen,
		void *out, u32 olen);
int pmo_send_detach(struct pmo_dev *pd, u64 handle);

/* ioctl.c */
long pmo_ioctl(struct file *file, unsigned int cmd, unsigned long arg);

/* file.c */
extern const struct file_operations pmo_fops;
void pmo_zap(struct pmo_file *pf, u64 off, u64 len);
int pmo_file_detach(struct pmo_file *pf);

/* event.c */
void pmo_evq_add(struct pmo_dev *pd, struct virtio_pmo_event *ev, gfp_t gfp);
void pmo_event_work(struct work_struct *work);
void pmo_ev_done(struct virtqueue *vq);

#endif /* PMO_DRV_H */
