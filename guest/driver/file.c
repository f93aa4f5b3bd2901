// SPDX-License-Identifier: GPL-2.0
/*
 * A /dev/pmo file: open, release (the crash path: detach), and the mapping
 * of its attachment, whose pages the fault handler inserts.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>

#include "pmo_drv.h"

/* Unmap the slice from every process; later accesses get SIGBUS. */
void pmo_zap(struct pmo_file *pf, u64 off, u64 len)
{
	unmap_mapping_range(pf->mapping, off, len, 1);
}

/* Caller holds pf->lock and pf is attached. */
int pmo_file_detach(struct pmo_file *pf)
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

const struct file_operations pmo_fops = {
	.owner = THIS_MODULE,
	.open = pmo_open,
	.release = pmo_release,
	.unlocked_ioctl = pmo_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = pmo_mmap,
	.llseek = no_llseek,
};
