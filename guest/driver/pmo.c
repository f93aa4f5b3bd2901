// SPDX-License-Identifier: GPL-2.0
/*
 * pmo.ko - guest driver of the virtio-pmo device (docs/virtio-pmo.md).
 *
 * A thin bridge: it binds the device, forwards the PMO calls of /dev/pmo
 * over the control virtqueue, and maps attached PMOs (slices of the
 * device's shared-memory window) into the calling process.  All policy
 * (keys, crypto, integrity, paging) lives in the host device.
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
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/completion.h>
#include <linux/ctype.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/kref.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pid.h>
#include <linux/rwsem.h>
#include <linux/scatterlist.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
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

static void pmo_dev_free(struct kref *ref)
{
	struct pmo_dev *pd = container_of(ref, struct pmo_dev, ref);

	kfree(pd->evbufs);
	kfree(pd->resp);
	kfree(pd->req);
	kfree(pd);
}

/* Only the status values the protocol defines reach user space. */
static int pmo_status_errno(u32 status)
{
	switch (status) {
	case EPERM:
	case ENOENT:
	case EIO:
	case ENOMEM:
	case EACCES:
	case EBUSY:
	case EEXIST:
	case EINVAL:
	case ENOSPC:
	case ENAMETOOLONG:
	case EPROTO:
	case EBADMSG:
		return -(int)status;
	case VIRTIO_PMO_S_NOSYS:
		return -EOPNOTSUPP;
	default:
		pr_warn_ratelimited("device returned unknown status %u\n", status);
		return -EIO;
	}
}

static void pmo_ctrl_done(struct virtqueue *vq)
{
	struct pmo_dev *pd = vq->vdev->priv;
	unsigned long flags;
	unsigned int len;

	spin_lock_irqsave(&pd->vq_lock, flags);
	while (virtqueue_get_buf(vq, &len)) {
		if (!pd->inflight)
			continue;
		pd->inflight = false;
		pd->resp_len = len;
		pd->inflight_err = 0;
		complete(&pd->done);
	}
	spin_unlock_irqrestore(&pd->vq_lock, flags);
}

/*
 * pmo_request - send one control request and wait for its response.
 * @payload/@plen: request payload; @out/@olen: expected response payload.
 *
 * The response must carry exactly @olen bytes on success.  The request
 * buffer is wiped afterwards: it may hold a key.
 */
static int pmo_request(struct pmo_dev *pd, u16 op, const void *payload,
		       u32 plen, void *out, u32 olen)
{
	struct virtio_pmo_req_hdr *hdr = pd->req;
	struct virtio_pmo_resp_hdr *rh = pd->resp;
	struct scatterlist sg_out, sg_in, *sgs[2];
	u32 status, rlen;
	unsigned int written = 0;
	int err;

	if (WARN_ON(plen > PMO_REQ_MAX - sizeof(*hdr) ||
		    olen > PMO_RESP_MAX - sizeof(*rh)))
		return -EINVAL;

	mutex_lock(&pd->req_lock);
	hdr->version = cpu_to_le16(VIRTIO_PMO_VERSION);
	hdr->op = cpu_to_le16(op);
	hdr->len = cpu_to_le32(plen);
	memcpy(hdr + 1, payload, plen);
	memset(pd->resp, 0, PMO_RESP_MAX);
	sg_init_one(&sg_out, pd->req, sizeof(*hdr) + plen);
	sg_init_one(&sg_in, pd->resp, sizeof(*rh) + olen);
	sgs[0] = &sg_out;
	sgs[1] = &sg_in;
	reinit_completion(&pd->done);

	spin_lock_irq(&pd->vq_lock);
	if (pd->broken) {
		err = -ENODEV;
	} else {
		err = virtqueue_add_sgs(pd->ctrlq, sgs, 1, 1, pd, GFP_ATOMIC);
		if (!err) {
			pd->inflight = true;
			virtqueue_kick(pd->ctrlq);
		}
	}
	spin_unlock_irq(&pd->vq_lock);

	if (!err) {
		/* Completed by pmo_ctrl_done() or, on removal/reset, by pmo_kill(). */
		wait_for_completion(&pd->done);
		spin_lock_irq(&pd->vq_lock);
		err = pd->inflight_err;
		written = pd->resp_len;
		spin_unlock_irq(&pd->vq_lock);
	}
	memzero_explicit(pd->req, sizeof(*hdr) + plen);
	if (err)
		goto out;

	/* Never trust the device's lengths beyond our buffer. */
	if (written < sizeof(*rh) || written > sizeof(*rh) + olen) {
		pr_warn_ratelimited("op %u: bad response length %u\n", op, written);
		err = -EIO;
		goto out;
	}
	status = le32_to_cpu(rh->status);
	if (status) {
		err = pmo_status_errno(status);
		goto out;
	}
	rlen = le32_to_cpu(rh->len);
	if (rlen != olen || written != sizeof(*rh) + olen) {
		pr_warn_ratelimited("op %u: response payload %u bytes (written %u), want %u\n",
				    op, rlen, written, olen);
		err = -EIO;
		goto out;
	}
	if (olen)
		memcpy(out, rh + 1, olen);
out:
	memset(pd->resp, 0, PMO_RESP_MAX);
	mutex_unlock(&pd->req_lock);
	return err;
}

static int pmo_copy_name(struct pmo_dev *pd, u8 *dst, const char *src)
{
	size_t i, n = strnlen(src, PMO_NAME_LEN);

	if (n == PMO_NAME_LEN || n > pd->max_name_len)
		return -ENAMETOOLONG;
	if (n == 0 || src[0] == '.')
		return -EINVAL;
	for (i = 0; i < n; i++) {
		if (!isalnum(src[i]) && src[i] != '.' && src[i] != '_' &&
		    src[i] != '-')
			return -EINVAL;
	}
	memset(dst, 0, PMO_NAME_LEN);
	memcpy(dst, src, n);
	return 0;
}

static int pmo_copy_key(struct pmo_dev *pd, __le32 *dst_len, u8 *dst,
			u32 len, const u8 *src)
{
	if (len == 0 || len > pd->max_key_len || len > PMO_KEY_LEN)
		return -EINVAL;
	*dst_len = cpu_to_le32(len);
	memset(dst, 0, PMO_KEY_LEN);
	memcpy(dst, src, len);
	return 0;
}

static long pmo_ioc_create(struct pmo_dev *pd, void __user *argp)
{
	struct pmo_ioc_create a;
	struct virtio_pmo_create w;
	long err;

	if (copy_from_user(&a, argp, sizeof(a)))
		return -EFAULT;
	memset(&w, 0, sizeof(w));
	err = -EINVAL;
	if (a.reserved || !a.size || !PAGE_ALIGNED(a.size) ||
	    a.size > pd->max_pmo_size)
		goto out;
	err = pmo_copy_name(pd, w.name, a.name);
	if (!err)
		err = pmo_copy_key(pd, &w.key_len, w.key, a.key_len, a.key);
	if (err)
		goto out;
	w.size = cpu_to_le64(a.size);
	err = pmo_request(pd, VIRTIO_PMO_OP_CREATE, &w, sizeof(w), NULL, 0);
out:
	memzero_explicit(&w, sizeof(w));
	memzero_explicit(&a, sizeof(a));
	return err;
}

static long pmo_ioc_destroy(struct pmo_dev *pd, void __user *argp)
{
	struct pmo_ioc_destroy a;
	struct virtio_pmo_destroy w;
	long err;

	if (copy_from_user(&a, argp, sizeof(a)))
		return -EFAULT;
	memset(&w, 0, sizeof(w));
	err = a.reserved ? -EINVAL : pmo_copy_name(pd, w.name, a.name);
	if (!err)
		err = pmo_copy_key(pd, &w.key_len, w.key, a.key_len, a.key);
	if (!err)
		err = pmo_request(pd, VIRTIO_PMO_OP_DESTROY, &w, sizeof(w), NULL, 0);
	memzero_explicit(&w, sizeof(w));
	memzero_explicit(&a, sizeof(a));
	return err;
}

static int pmo_send_detach(struct pmo_dev *pd, u64 handle)
{
	__le64 h = cpu_to_le64(handle);

	return pmo_request(pd, VIRTIO_PMO_OP_DETACH, &h, sizeof(h), NULL, 0);
}

static long pmo_ioc_attach(struct pmo_file *pf, struct file *file,
			   void __user *argp)
{
	struct pmo_dev *pd = pf->pd;
	struct pmo_ioc_attach a;
	struct virtio_pmo_attach w;
	struct virtio_pmo_attach_resp r;
	u64 handle, off, size;
	long err;

	if (copy_from_user(&a, argp, sizeof(a)))
		return -EFAULT;
	memset(&w, 0, sizeof(w));
	err = -EINVAL;
	if (a.perm != PMO_PERM_READ && a.perm != PMO_PERM_WRITE)
		goto wipe;
	/* A writable mapping needs a file opened for writing. */
	err = -EBADF;
	if (a.perm == PMO_PERM_WRITE && !(file->f_mode & FMODE_WRITE))
		goto wipe;
	err = pmo_copy_name(pd, w.name, a.name);
	if (!err)
		err = pmo_copy_key(pd, &w.key_len, w.key, a.key_len, a.key);
	if (err)
		goto wipe;
	w.perm = cpu_to_le32(a.perm);

	mutex_lock(&pf->lock);
	if (pf->state != PMO_F_FRESH) {
		err = -EINVAL;
		goto unlock;
	}
	err = pmo_request(pd, VIRTIO_PMO_OP_ATTACH, &w, sizeof(w), &r, sizeof(r));
	memzero_explicit(&w, sizeof(w));
	if (err)
		goto unlock;
	handle = le64_to_cpu(r.handle);
	off = le64_to_cpu(r.window_offset);
	size = le64_to_cpu(r.size);
	if (!handle || !size || !PAGE_ALIGNED(size) || !PAGE_ALIGNED(off) ||
	    size > pd->max_pmo_size || off > pd->win_size ||
	    size > pd->win_size - off) {
		pr_warn_ratelimited("attach: bad slice %#llx+%#llx (handle %llu)\n",
				    off, size, handle);
		if (handle)
			pmo_send_detach(pd, handle);
		err = -EIO;
		goto unlock;
	}

	pf->handle = handle;
	pf->win_off = off;
	pf->size = size;
	pf->perm = a.perm;
	mutex_lock(&pd->att_lock);
	if (pd->att_dead) {
		err = -ENODEV;
	} else {
		down_write(&pf->map_sem);
		pf->live = true;
		up_write(&pf->map_sem);
		pf->owner = get_task_pid(current, PIDTYPE_TGID);
		spin_lock_irq(&pd->sig_lock);
		list_add(&pf->node, &pd->attachments);
		spin_unlock_irq(&pd->sig_lock);
	}
	mutex_unlock(&pd->att_lock);
	if (err)
		goto unlock;
	pf->state = PMO_F_ATTACHED;
unlock:
	mutex_unlock(&pf->lock);
	/* Outside pf->lock: a fault here takes mmap_lock, ->mmap nests the other way. */
	if (!err && put_user(size, &((struct pmo_ioc_attach __user *)argp)->size))
		err = -EFAULT;	/* still attached: close() detaches */
wipe:
	memzero_explicit(&w, sizeof(w));
	memzero_explicit(&a, sizeof(a));
	return err;
}

/* Unmap the slice from every process; later accesses get SIGBUS. */
static void pmo_zap(struct pmo_file *pf, u64 off, u64 len)
{
	unmap_mapping_range(pf->mapping, off, len, 1);
}

/* Caller holds pf->lock and pf is attached. */
static int pmo_file_detach(struct pmo_file *pf)
{
	struct pmo_dev *pd = pf->pd;
	bool torn_down;

	mutex_lock(&pd->att_lock);
	torn_down = list_empty(&pf->node);
	spin_lock_irq(&pd->sig_lock);
	list_del_init(&pf->node);
	spin_unlock_irq(&pd->sig_lock);
	mutex_unlock(&pd->att_lock);

	pf->state = PMO_F_DETACHED;
	down_write(&pf->map_sem);
	pf->live = false;
	up_write(&pf->map_sem);
	/* No PTE of the slice survives this, before the host hears of it. */
	pmo_zap(pf, pf->win_off, pf->size);
	if (torn_down)
		return -ENODEV;	/* the device was reset or removed */
	return pmo_send_detach(pd, pf->handle);
}

static long pmo_ioc_detach(struct pmo_file *pf)
{
	long err = -EINVAL;

	mutex_lock(&pf->lock);
	if (pf->state == PMO_F_ATTACHED)
		err = pmo_file_detach(pf);
	mutex_unlock(&pf->lock);
	return err;
}

static long pmo_ioc_psync(struct pmo_file *pf, void __user *argp)
{
	struct pmo_ioc_psync a = {};
	__le64 h, pages;
	long err = -EINVAL;

	mutex_lock(&pf->lock);
	if (pf->state == PMO_F_ATTACHED) {
		h = cpu_to_le64(pf->handle);
		err = pmo_request(pf->pd, VIRTIO_PMO_OP_PSYNC, &h, sizeof(h), &pages,
				  sizeof(pages));
	}
	mutex_unlock(&pf->lock);
	if (err)
		return err;
	a.pages_written = le64_to_cpu(pages);
	return copy_to_user(argp, &a, sizeof(a)) ? -EFAULT : 0;
}

/* The device's STAT block goes to user space as it came (little endian). */
static long pmo_ioc_stat(struct pmo_file *pf, void __user *argp)
{
	struct pmo_ioc_stat *a;
	__le64 h;
	long err = -EINVAL;

	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	mutex_lock(&pf->lock);
	if (pf->state == PMO_F_ATTACHED) {
		h = cpu_to_le64(pf->handle);
		a->perm = pf->perm;
		err = pmo_request(pf->pd, VIRTIO_PMO_OP_STAT, &h, sizeof(h),
				  &a->host, sizeof(a->host));
	}
	mutex_unlock(&pf->lock);
	if (!err) {
		a->poisoned = atomic_read(&pf->npoisoned);
		err = copy_to_user(argp, a, sizeof(*a)) ? -EFAULT : 0;
	}
	kfree(a);
	return err;
}

static long pmo_ioc_design(struct pmo_dev *pd, void __user *argp)
{
	struct pmo_ioc_design a;
	size_t i, n;

	if (copy_from_user(&a, argp, sizeof(a)))
		return -EFAULT;
	n = strnlen(a.name, PMO_DESIGN_LEN);
	if (n == PMO_DESIGN_LEN)
		return -ENAMETOOLONG;
	if (n == 0)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		if (!isalnum(a.name[i]) && a.name[i] != '-' && a.name[i] != '_')
			return -EINVAL;
	}
	memset(a.name + n, 0, PMO_DESIGN_LEN - n);
	return pmo_request(pd, VIRTIO_PMO_OP_SET_DESIGN, a.name, PMO_DESIGN_LEN,
			   NULL, 0);
}

static long pmo_ioc_list(struct pmo_dev *pd, void __user *argp)
{
	struct pmo_ioc_list a;
	struct virtio_pmo_list_resp r;
	__le32 idx;
	long err;

	if (copy_from_user(&a, argp, sizeof(a)))
		return -EFAULT;
	idx = cpu_to_le32(a.index);
	err = pmo_request(pd, VIRTIO_PMO_OP_LIST, &idx, sizeof(idx), &r, sizeof(r));
	if (err)
		return err;
	if (strnlen((const char *)r.name, PMO_NAME_LEN) == PMO_NAME_LEN ||
	    le32_to_cpu(r.attached) > VIRTIO_PMO_LIST_WRITER) {
		pr_warn_ratelimited("list: malformed entry from the device\n");
		return -EIO;
	}
	memset(&a, 0, sizeof(a));
	a.index = le32_to_cpu(idx);
	a.attached = le32_to_cpu(r.attached);
	a.more = !!le32_to_cpu(r.more);
	a.size = le64_to_cpu(r.size);
	memcpy(a.name, r.name, PMO_NAME_LEN);
	return copy_to_user(argp, &a, sizeof(a)) ? -EFAULT : 0;
}

static long pmo_ioc_info(struct pmo_dev *pd, void __user *argp)
{
	struct pmo_ioc_info a = {
		.version = VIRTIO_PMO_VERSION,
		.page_size = PAGE_SIZE,
		.window_size = pd->win_size,
		.max_name_len = pd->max_name_len,
		.max_key_len = pd->max_key_len,
		.max_pmo_size = pd->max_pmo_size,
	};

	return copy_to_user(argp, &a, sizeof(a)) ? -EFAULT : 0;
}

static long pmo_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct pmo_file *pf = file->private_data;
	void __user *argp = (void __user *)arg;

	switch (cmd) {
	case PMO_IOC_CREATE:
		return pmo_ioc_create(pf->pd, argp);
	case PMO_IOC_DESTROY:
		return pmo_ioc_destroy(pf->pd, argp);
	case PMO_IOC_ATTACH:
		return pmo_ioc_attach(pf, file, argp);
	case PMO_IOC_DETACH:
		return pmo_ioc_detach(pf);
	case PMO_IOC_PSYNC:
		return pmo_ioc_psync(pf, argp);
	case PMO_IOC_STAT:
		return pmo_ioc_stat(pf, argp);
	case PMO_IOC_SET_DESIGN:
		return pmo_ioc_design(pf->pd, argp);
	case PMO_IOC_LIST:
		return pmo_ioc_list(pf->pd, argp);
	case PMO_IOC_INFO:
		return pmo_ioc_info(pf->pd, argp);
	default:
		return -ENOTTY;
	}
}

/*
 * Pages are mapped on the guest page fault rather than in ->mmap: the VMA is
 * only linked into the file's mapping after ->mmap returns, so a detach
 * racing with remap_pfn_range() in ->mmap could miss it and leave PTEs of a
 * detached slice behind.  A fault sees the linked VMA, and map_sem orders it
 * against detach.  One fault maps an aligned 2 MiB chunk.
 */
static vm_fault_t pmo_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct pmo_file *pf = vma->vm_private_data;
	unsigned long addr, start, end, pfn0;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	u64 win_pgoff, npages, idx;

	down_read(&pf->map_sem);
	/* The slice fields are stable while live (set before, under map_sem). */
	win_pgoff = pf->win_off >> PAGE_SHIFT;
	npages = pf->size >> PAGE_SHIFT;
	if (!pf->live || vma->vm_pgoff < win_pgoff ||
	    vma->vm_pgoff - win_pgoff + vma_pages(vma) > npages)
		goto out;
	idx = vmf->pgoff - win_pgoff;
	if (xa_load(&pf->poisoned, idx))
		goto out;

	pfn0 = PHYS_PFN(pf->pd->win_phys) + win_pgoff;
	ret = vmf_insert_pfn(vma, vmf->address, pfn0 + idx);
	if (ret & VM_FAULT_ERROR)
		goto out;
	start = max(vma->vm_start, ALIGN_DOWN(vmf->address, PMO_FAULT_CHUNK));
	end = min(vma->vm_end, start + PMO_FAULT_CHUNK);
	for (addr = start; addr < end; addr += PAGE_SIZE) {
		idx = vma->vm_pgoff - win_pgoff + ((addr - vma->vm_start) >> PAGE_SHIFT);
		if (addr == vmf->address || xa_load(&pf->poisoned, idx))
			continue;
		if (vmf_insert_pfn(vma, addr, pfn0 + idx) & VM_FAULT_ERROR)
			break;
	}
out:
	up_read(&pf->map_sem);
	return ret;
}

static const struct vm_operations_struct pmo_vm_ops = {
	.fault = pmo_vm_fault,
};

static int pmo_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct pmo_file *pf = file->private_data;
	int err = 0;

	/* MAP_SHARED of a read-only file keeps VM_MAYSHARE but loses VM_SHARED. */
	if (vma->vm_pgoff || !(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	/* mmap_lock is held: use map_sem, never pf->lock (see pmo_ioc_attach). */
	down_read(&pf->map_sem);
	if (!pf->live || vma_pages(vma) != pf->size >> PAGE_SHIFT) {
		err = -EINVAL;
	} else if (pf->perm == PMO_PERM_READ && (vma->vm_flags & VM_WRITE)) {
		err = -EACCES;
	} else {
		if (pf->perm == PMO_PERM_READ)
			vma->vm_flags &= ~VM_MAYWRITE;
		/* Plaintext: not inherited by children, not in core dumps. */
		vma->vm_flags |= VM_IO | VM_PFNMAP | VM_DONTEXPAND |
				 VM_DONTDUMP | VM_DONTCOPY;
		/* The file offset of the VMA is the slice's window offset. */
		vma->vm_pgoff = pf->win_off >> PAGE_SHIFT;
		vma->vm_private_data = pf;
		vma->vm_ops = &pmo_vm_ops;
	}
	up_read(&pf->map_sem);
	return err;
}

static int pmo_open(struct inode *inode, struct file *file)
{
	struct pmo_dev *pd = container_of(file->private_data, struct pmo_dev,
					  misc);
	struct pmo_file *pf;

	pf = kzalloc(sizeof(*pf), GFP_KERNEL);
	if (!pf)
		return -ENOMEM;
	kref_get(&pd->ref);
	pf->pd = pd;
	pf->mapping = file->f_mapping;
	mutex_init(&pf->lock);
	init_rwsem(&pf->map_sem);
	INIT_LIST_HEAD(&pf->node);
	xa_init(&pf->poisoned);
	file->private_data = pf;
	return nonseekable_open(inode, file);
}

/* Close or process death: the crash-handler path detaches. */
static int pmo_release(struct inode *inode, struct file *file)
{
	struct pmo_file *pf = file->private_data;
	int err;

	mutex_lock(&pf->lock);
	if (pf->state == PMO_F_ATTACHED) {
		err = pmo_file_detach(pf);
		if (err && err != -ENODEV)
			pr_warn_ratelimited("detach of handle %llu on close: %d\n",
					    pf->handle, err);
	}
	mutex_unlock(&pf->lock);
	/* Off the attachment list by now: the interrupt no longer sees it. */
	put_pid(pf->owner);
	xa_destroy(&pf->poisoned);
	kref_put(&pf->pd->ref, pmo_dev_free);
	kfree(pf);
	return 0;
}

static const struct file_operations pmo_fops = {
	.owner = THIS_MODULE,
	.open = pmo_open,
	.release = pmo_release,
	.unlocked_ioctl = pmo_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = pmo_mmap,
	.llseek = no_llseek,
};

/*
 * PAGE_POISONED, PAGE_BAD: no process may map that page again (SIGBUS instead).
 * The page is counted only once it is unmapped: a process that sees the count
 * in PMO_IOC_STAT can no longer reach the page through a PTE mapped before.
 */
static void pmo_poison(struct pmo_dev *pd, u64 handle, u64 page)
{
	struct pmo_file *pf;
	bool fresh;

	mutex_lock(&pd->att_lock);
	list_for_each_entry(pf, &pd->attachments, node) {
		if (pf->handle != handle)
			continue;
		if (page >= pf->size >> PAGE_SHIFT) {
			pr_warn_ratelimited("poisoned page %llu beyond handle %llu\n",
					    page, handle);
			break;
		}
		down_write(&pf->map_sem);
		fresh = !xa_load(&pf->poisoned, page) &&
			!xa_err(xa_store(&pf->poisoned, page, xa_mk_value(1),
					 GFP_KERNEL));
		up_write(&pf->map_sem);
		pmo_zap(pf, pf->win_off + (page << PAGE_SHIFT), PAGE_SIZE);
		if (fresh)
			atomic_inc(&pf->npoisoned);
		break;
	}
	mutex_unlock(&pd->att_lock);
}

static void pmo_evq_add(struct pmo_dev *pd, struct virtio_pmo_event *ev,
			gfp_t gfp)
{
	struct scatterlist sg;

	memset(ev, 0, sizeof(*ev));
	sg_init_one(&sg, ev, sizeof(*ev));
	if (virtqueue_add_inbuf(pd->evq, &sg, 1, ev, gfp))
		pr_warn_ratelimited("cannot re-post an event buffer\n");
}

/* Unmaps the pages the events name (process context: it sleeps). */
static void pmo_event_work(struct work_struct *work)
{
	struct pmo_dev *pd = container_of(work, struct pmo_dev, event_work);
	struct virtio_pmo_event *buf, ev;
	unsigned int len;
	u32 kind;

	for (;;) {
		spin_lock_irq(&pd->vq_lock);
		buf = NULL;
		if (!pd->broken && pd->evdone_count) {
			buf = pd->evdone[pd->evdone_head];
			len = pd->evdone_len[pd->evdone_head];
			pd->evdone_head = (pd->evdone_head + 1) % PMO_EVQ_BUFS;
			pd->evdone_count--;
			ev = *buf;
			pmo_evq_add(pd, buf, GFP_ATOMIC);
			virtqueue_kick(pd->evq);
		}
		spin_unlock_irq(&pd->vq_lock);
		if (!buf)
			break;
		if (len != sizeof(ev))
			continue;	/* reported by the interrupt */
		kind = le32_to_cpu(ev.kind);
		if (kind != VIRTIO_PMO_EVENT_PAGE_POISONED && kind != VIRTIO_PMO_EVENT_PAGE_BAD)
			continue;
		pr_warn_ratelimited("handle %llu page %llu failed its integrity check on the host%s\n",
				    le64_to_cpu(ev.handle), le64_to_cpu(ev.page),
				    kind == VIRTIO_PMO_EVENT_PAGE_BAD ?
				    " (found before any access)" : "");
		pmo_poison(pd, le64_to_cpu(ev.handle), le64_to_cpu(ev.page));
	}
}

/* With pd->sig_lock held: SIGBUS to the process that attached @handle. */
static void pmo_signal_owner(struct pmo_dev *pd, u64 handle)
{
	struct pmo_file *pf;

	list_for_each_entry(pf, &pd->attachments, node) {
		if (pf->handle == handle) {
			if (pf->owner)
				kill_pid(pf->owner, SIGBUS, 1);
			return;
		}
	}
}

/*
 * Event interrupt.  The unmap sleeps, so it is left to event_work; but the
 * signal goes out from here.  With one vCPU stuck in a kernel copy from a
 * refused page (write(2) straight from a PMO mapping), no work item can run
 * until the copy ends, which only the host can end (by serving zeros): the
 * process must already have its SIGBUS pending by then, so it never sees
 * the copy's result without being told.
 */
static void pmo_ev_done(struct virtqueue *vq)
{
	struct pmo_dev *pd = vq->vdev->priv;
	struct virtio_pmo_event *buf;
	u64 refused[PMO_EVQ_BUFS];
	unsigned long flags;
	unsigned int len, slot, n = 0, i;

	spin_lock_irqsave(&pd->vq_lock, flags);
	while (!pd->broken && pd->evdone_count < PMO_EVQ_BUFS &&
	       (buf = virtqueue_get_buf(pd->evq, &len))) {
		slot = (pd->evdone_head + pd->evdone_count) % PMO_EVQ_BUFS;
		pd->evdone[slot] = buf;
		pd->evdone_len[slot] = len;
		pd->evdone_count++;
		if (len != sizeof(*buf))
			pr_warn_ratelimited("event of %u bytes ignored\n", len);
		else if (le32_to_cpu(buf->kind) == VIRTIO_PMO_EVENT_PAGE_POISONED)
			refused[n++] = le64_to_cpu(buf->handle);
		else if (le32_to_cpu(buf->kind) != VIRTIO_PMO_EVENT_PAGE_BAD)
			pr_warn_ratelimited("unknown event type %u ignored\n",
					    le32_to_cpu(buf->kind));
	}
	spin_unlock_irqrestore(&pd->vq_lock, flags);

	spin_lock_irqsave(&pd->sig_lock, flags);
	for (i = 0; i < n; i++)
		pmo_signal_owner(pd, refused[i]);
	spin_unlock_irqrestore(&pd->sig_lock, flags);

	/* Unbound: the CPU that took the interrupt may be the one stuck on a poisoned page. */
	queue_work(system_unbound_wq, &pd->event_work);
}

/*
 * Stop using the device for good: fail the request in flight, detach every
 * attachment locally (zap its mappings).  Recovery is a driver rebind.
 */
static void pmo_kill(struct pmo_dev *pd)
{
	struct pmo_file *pf, *tmp;
	bool was_broken;

	spin_lock_irq(&pd->vq_lock);
	was_broken = pd->broken;
	pd->broken = true;
	spin_unlock_irq(&pd->vq_lock);
	if (was_broken)
		return;

	virtio_break_device(pd->vdev);
	/* After the reset the device no longer touches our buffers. */
	virtio_reset_device(pd->vdev);
	spin_lock_irq(&pd->vq_lock);
	if (pd->inflight) {
		pd->inflight = false;
		pd->inflight_err = -ENODEV;
		complete(&pd->done);
	}
	spin_unlock_irq(&pd->vq_lock);
	/* Wait for the waiter to leave. */
	mutex_lock(&pd->req_lock);
	mutex_unlock(&pd->req_lock);

	mutex_lock(&pd->att_lock);
	pd->att_dead = true;
	list_for_each_entry_safe(pf, tmp, &pd->attachments, node) {
		spin_lock_irq(&pd->sig_lock);
		list_del_init(&pf->node);
		spin_unlock_irq(&pd->sig_lock);
		down_write(&pf->map_sem);
		pf->live = false;
		up_write(&pf->map_sem);
		pmo_zap(pf, pf->win_off, pf->size);
	}
	mutex_unlock(&pd->att_lock);
}

static void pmo_reset_work(struct work_struct *work)
{
	struct pmo_dev *pd = container_of(work, struct pmo_dev, reset_work);
	u8 status = pd->vdev->config->get_status(pd->vdev);

	if (!(status & VIRTIO_CONFIG_S_NEEDS_RESET))
		return;
	dev_err(&pd->vdev->dev,
		"device needs reset: all attachments detached; rebind the driver to recover\n");
	pmo_kill(pd);
}

static void pmo_config_changed(struct virtio_device *vdev)
{
	struct pmo_dev *pd = vdev->priv;

	schedule_work(&pd->reset_work);
}

static int pmo_read_config(struct pmo_dev *pd)
{
	struct virtio_device *vdev = pd->vdev;
	struct virtio_shm_region region;
	u32 version, page_size;

	virtio_cread_le(vdev, struct virtio_pmo_config, version, &version);
	virtio_cread_le(vdev, struct virtio_pmo_config, page_size, &page_size);
	virtio_cread_le(vdev, struct virtio_pmo_config, window_size, &pd->win_size);
	virtio_cread_le(vdev, struct virtio_pmo_config, max_name_len,
			&pd->max_name_len);
	virtio_cread_le(vdev, struct virtio_pmo_config, max_key_len,
			&pd->max_key_len);
	virtio_cread_le(vdev, struct virtio_pmo_config, max_pmo_size,
			&pd->max_pmo_size);

	if (version != VIRTIO_PMO_VERSION || page_size != PAGE_SIZE ||
	    !pd->max_name_len || pd->max_name_len >= PMO_NAME_LEN ||
	    !pd->max_key_len || pd->max_key_len > PMO_KEY_LEN ||
	    !pd->win_size || !PAGE_ALIGNED(pd->win_size)) {
		dev_err(&vdev->dev,
			"unsupported config: version %u page %u window %#llx name %u key %u\n",
			version, page_size, pd->win_size, pd->max_name_len,
			pd->max_key_len);
		return -EINVAL;
	}
	if (!virtio_get_shm_region(vdev, &region, 0)) {
		dev_err(&vdev->dev, "no shared memory region 0 (window)\n");
		return -ENODEV;
	}
	if (!PAGE_ALIGNED(region.addr) || region.len < pd->win_size) {
		dev_err(&vdev->dev, "window %#llx+%#llx does not hold %#llx bytes\n",
			region.addr, region.len, pd->win_size);
		return -EINVAL;
	}
	pd->win_phys = region.addr;
	return 0;
}

static int pmo_probe(struct virtio_device *vdev)
{
	static const char * const names[] = { "control", "events" };
	vq_callback_t *callbacks[] = { pmo_ctrl_done, pmo_ev_done };
	struct virtqueue *vqs[2];
	struct pmo_dev *pd;
	int err, i;

	if (!vdev->config->get)
		return -EINVAL;
	pd = kzalloc(sizeof(*pd), GFP_KERNEL);
	if (!pd)
		return -ENOMEM;
	kref_init(&pd->ref);
	pd->vdev = vdev;
	vdev->priv = pd;
	spin_lock_init(&pd->vq_lock);
	init_completion(&pd->done);
	mutex_init(&pd->req_lock);
	mutex_init(&pd->att_lock);
	spin_lock_init(&pd->sig_lock);
	INIT_LIST_HEAD(&pd->attachments);
	INIT_WORK(&pd->event_work, pmo_event_work);
	INIT_WORK(&pd->reset_work, pmo_reset_work);

	pd->req = kzalloc(PMO_REQ_MAX, GFP_KERNEL);
	pd->resp = kzalloc(PMO_RESP_MAX, GFP_KERNEL);
	pd->evbufs = kcalloc(PMO_EVQ_BUFS, sizeof(*pd->evbufs), GFP_KERNEL);
	err = -ENOMEM;
	if (!pd->req || !pd->resp || !pd->evbufs)
		goto err_free;

	err = pmo_read_config(pd);
	if (err)
		goto err_free;
	if (!devm_request_mem_region(&vdev->dev, pd->win_phys, pd->win_size,
				     "pmo-window")) {
		err = -EBUSY;
		goto err_free;
	}
	/*
	 * Declare the window write-back: the PAT memtype reserved here is what
	 * vmf_insert_pfn() looks up for the user mappings.  The driver itself
	 * never touches the window through this mapping.
	 */
	pd->win_kaddr = devm_memremap(&vdev->dev, pd->win_phys, pd->win_size,
				      MEMREMAP_WB);
	if (IS_ERR(pd->win_kaddr)) {
		err = PTR_ERR(pd->win_kaddr);
		goto err_free;
	}

	err = virtio_find_vqs(vdev, 2, vqs, callbacks, names, NULL);
	if (err)
		goto err_free;
	pd->ctrlq = vqs[0];
	pd->evq = vqs[1];
	for (i = 0; i < PMO_EVQ_BUFS; i++)
		pmo_evq_add(pd, &pd->evbufs[i], GFP_KERNEL);
	virtio_device_ready(vdev);
	virtqueue_kick(pd->evq);

	pd->misc.minor = MISC_DYNAMIC_MINOR;
	pd->misc.name = "pmo";
	pd->misc.fops = &pmo_fops;
	pd->misc.parent = &vdev->dev;
	err = misc_register(&pd->misc);
	if (err)
		goto err_reset;

	dev_info(&vdev->dev, "window %pa+%#llx write-back, max PMO %#llx bytes\n",
		 &pd->win_phys, pd->win_size, pd->max_pmo_size);
	return 0;

err_reset:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
err_free:
	vdev->priv = NULL;
	kref_put(&pd->ref, pmo_dev_free);
	return err;
}

static void pmo_remove(struct virtio_device *vdev)
{
	struct pmo_dev *pd = vdev->priv;

	misc_deregister(&pd->misc);
	cancel_work_sync(&pd->reset_work);
	pmo_kill(pd);
	cancel_work_sync(&pd->event_work);
	vdev->config->del_vqs(vdev);
	pd->vdev = NULL;
	kref_put(&pd->ref, pmo_dev_free);
}

static int pmo_validate(struct virtio_device *vdev)
{
	if (!virtio_has_feature(vdev, VIRTIO_F_VERSION_1)) {
		dev_err(&vdev->dev, "needs VIRTIO_F_VERSION_1\n");
		return -ENODEV;
	}
	return 0;
}

static const struct virtio_device_id pmo_id_table[] = {
	{ VIRTIO_ID_PMO, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, pmo_id_table);

static struct virtio_driver pmo_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.id_table = pmo_id_table,
	.validate = pmo_validate,
	.probe = pmo_probe,
	.remove = pmo_remove,
	.config_changed = pmo_config_changed,
};
module_virtio_driver(pmo_driver);

MODULE_DESCRIPTION("virtio-pmo: encrypted persistent memory objects");
MODULE_LICENSE("GPL");
