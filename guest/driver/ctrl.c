// SPDX-License-Identifier: GPL-2.0
/*
 * The control virtqueue: one request in flight at a time, its answer
 * checked against the buffer and the op before anything is passed on.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/scatterlist.h>
#include <linux/string.h>

#include "pmo_drv.h"

/*
 * Only the status values the protocol defines reach user space.  ESTALE
 * (VIRTIO_PMO_S_STALE) is the host refusing a PMO whose stored record may be
 * an old copy: "stale" is what it means, and no other PMO error uses it, so
 * a program can tell it from a wrong key (EACCES) or a failed page (EBADMSG).
 */
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
	case ESTALE:
		return -(int)status;
	case VIRTIO_PMO_S_NOSYS:
		return -EOPNOTSUPP;
	default:
		pr_warn_ratelimited("device returned unknown status %u\n", status);
		return -EIO;
	}
}

void pmo_ctrl_done(struct virtqueue *vq)
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
int pmo_request(struct pmo_dev *pd, u16 op, const void *payload, u32 plen,
		void *out, u32 olen)
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

int pmo_send_detach(struct pmo_dev *pd, u64 handle)
{
	__le64 h = cpu_to_le64(handle);

	return pmo_request(pd, VIRTIO_PMO_OP_DETACH, &h, sizeof(h), NULL, 0);
}
