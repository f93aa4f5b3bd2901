// SPDX-License-Identifier: GPL-2.0
/*
 * The ioctls of /dev/pmo (guest/include/uapi/pmo_ioctl.h): arguments
 * checked and turned into control requests; keys wiped after use.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ctype.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "pmo_drv.h"

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

long pmo_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
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
