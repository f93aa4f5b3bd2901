// SPDX-License-Identifier: GPL-2.0
/*
 * pmo.ko - guest driver of the virtio-pmo device (docs/virtio-pmo.md).
 *
 * A thin bridge: it binds the device, forwards the PMO calls of /dev/pmo
 * over the control virtqueue, and maps attached PMOs (slices of the
 * device's shared-memory window) into the calling process.  All policy
 * (keys, crypto, integrity, paging) lives in the host device.  The files
 * and the lock order are in pmo_drv.h.
 *
 * This file binds the device: probe (config space, window, queues,
 * /dev/pmo), reset and removal.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/io.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/virtio_config.h>

#include "pmo_drv.h"

void pmo_dev_free(struct kref *ref)
{
	struct pmo_dev *pd = container_of(ref, struct pmo_dev, ref);

	kfree(pd->evbufs);
	kfree(pd->resp);
	kfree(pd->req);
	kfree(pd);
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
