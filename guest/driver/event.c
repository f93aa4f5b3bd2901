// SPDX-License-Identifier: GPL-2.0
/*
 * The event virtqueue: the host reports pages it refused; the interrupt
 * signals the attaching process, the work item unmaps the page.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/string.h>

#include "pmo_drv.h"

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

void pmo_evq_add(struct pmo_dev *pd, struct virtio_pmo_event *ev, gfp_t gfp)
{
	struct scatterlist sg;

	memset(ev, 0, sizeof(*ev));
	sg_init_one(&sg, ev, sizeof(*ev));
	if (virtqueue_add_inbuf(pd->evq, &sg, 1, ev, gfp))
		pr_warn_ratelimited("cannot re-post an event buffer\n");
}

/* Unmaps the pages the events name (process context: it sleeps). */
void pmo_event_work(struct work_struct *work)
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
void pmo_ev_done(struct virtqueue *vq)
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
