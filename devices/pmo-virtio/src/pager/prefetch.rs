//! Prediction and prefetch: after a fault the slice's predictor names likely next pages,
//! which the prefetch worker fills ahead (installed, or staged for a later fault).

use super::*;

impl Pager {
    /// Asks the slice's predictor what to pre-populate after a fault on `page`
    /// and queues what is not there yet. Pages predicted from a write fault
    /// of a writable attachment are installed writable and dirty: a stream
    /// being written (an output array) would otherwise take a write-protect
    /// fault on every prefetched page. A wrong guess costs psync one page.
    pub(super) fn predict_after(&self, slice: &Arc<Slice>, page: u64, tid: u32, write: bool) {
        let mut pages = Vec::new();
        let single_trigger;
        {
            let mut p = slice.predict.locked();
            let Some(st) = p.as_mut() else { return };
            let ev = FaultEvent {
                page,
                npages: slice.npages,
                thread: tid,
            };
            st.predictor.on_fault(&ev, &mut pages);
            pages.retain(|&p| {
                p < slice.npages
                    && !test_bit(&slice.installed, p)
                    && !test_bit(&slice.bad, p)
                    && !set_bit(&slice.predicted, p)
            });
            if pages.len() == 1 {
                st.singles += 1;
            }
            single_trigger = st.singles.is_multiple_of(SINGLE_TRIGGER_EVERY);
        }
        let trigger = match pages.len() {
            0 => return,
            1 if single_trigger => Some(0),
            1 => None,
            n => Some(n / 2),
        };
        let tx = self.prefetch.locked().clone();
        for (i, &p) in pages.iter().enumerate() {
            let job = PrefetchJob {
                slice: slice.clone(),
                page: p,
                stage: trigger == Some(i),
                writing: write,
            };
            // A full backlog drops the prediction: prefetch never delays a fault.
            self.prefetch_backlog.fetch_add(1, Ordering::AcqRel);
            if tx.as_ref().is_none_or(|tx| tx.try_send(job).is_err()) {
                self.prefetch_backlog.fetch_sub(1, Ordering::AcqRel);
                for &q in &pages[i..] {
                    clear_bit(&slice.predicted, q);
                }
                return;
            }
            set_bit(&slice.issued, p);
        }
    }

    /// Pre-populates one predicted page: fill from the source and install it,
    /// unless a fault got there first. A page that fails verification is left
    /// alone: only a real access to it is refused (see `handle`).
    pub(super) fn prefetch_page(&self, slice: &Slice, job: &PrefetchJob, buf: &mut [u8; PAGE]) {
        let (page, stage) = (job.page, job.stage);
        if slice.closing.load(Ordering::Acquire) || test_bit(&slice.installed, page) {
            return;
        }
        if let Err(e) = slice.source.fill(page, buf) {
            // Not refused (nothing touched it, and a wrong guess must not
            // kill a process), but a page that fails verification is news:
            // the guest driver can unmap it before anything, its own kernel
            // included, reads it.
            if matches!(e, FillError::Integrity(_)) && !set_bit(&slice.bad, page) {
                if let Some(_gate) = slice.enter() {
                    slice
                        .stats
                        .integrity_failures
                        .fetch_add(1, Ordering::Relaxed);
                    slice.source.page_failed(page, &e, Detected::Ahead);
                }
            }
            return;
        }
        if stage {
            let staged = Staged {
                page,
                seq: slice.seq.load(Ordering::Acquire),
                data: Box::new(*buf),
            };
            buf.fill(0);
            // A late fault may have installed it while we decrypted. Staged
            // inside the gate, so detach (which drops the staged pages after
            // waiting for the gate) cannot miss it.
            let Some(gate) = slice.enter() else { return };
            if test_bit(&slice.installed, page) {
                return;
            }
            slice.stats.triggers.fetch_add(1, Ordering::Relaxed);
            slice.staged.locked().push_back(staged);
            drop(gate);
            slice.expire_staged(slice.seq.load(Ordering::Acquire));
            return;
        }
        if let Some(b) = self.budget.get().filter(|_| !slice.on_device) {
            let resident = b.resident.load(Ordering::Acquire) as usize;
            if b.policy.locked().prefetch_tier(resident, b.pages as usize)
                == pmo_policies::Tier::Cxl
            {
                // No room in DRAM without pushing out pages the policy rates hotter: the page
                // stays in the CXL tier (the store) until it is touched.
                buf.fill(0);
                clear_bit(&slice.predicted, page);
                slice.stats.prefetch_to_cxl.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let writable = slice.source.writable();
        let dirty = writable && job.writing;
        let installed = self.install_in(slice, page, buf, dirty, writable && !job.writing);
        buf.fill(0);
        if installed == super::budget::Installed::Done {
            slice.stats.pages_prefetched.fetch_add(1, Ordering::Relaxed);
            self.enforce_budget();
        }
    }

    /// Predicted pages queued for the prefetch worker and not handled yet: 0 means every
    /// prediction made so far has been installed, staged or dropped (what a test or harness
    /// waits for before it compares).
    pub fn prefetch_backlog(&self) -> u64 {
        self.prefetch_backlog.load(Ordering::Acquire)
    }
}

/// One predicted page for the prefetch worker: install it, or stage it as a trigger.
pub(super) struct PrefetchJob {
    slice: Arc<Slice>,
    page: u64,
    stage: bool,
    /// Predicted from a write fault: install it writable and dirty (see `predict_after`).
    writing: bool,
}

/// Prefetch worker body: install predicted pages while the pager lives.
pub(super) fn prefetch_worker(
    pager: std::sync::Weak<Pager>,
    rx: std::sync::mpsc::Receiver<PrefetchJob>,
) {
    let mut buf = Box::new([0u8; PAGE]);
    while let Ok(job) = rx.recv() {
        let Some(p) = pager.upgrade() else { return };
        p.prefetch_page(&job.slice, &job, &mut buf);
        p.prefetch_backlog.fetch_sub(1, Ordering::AcqRel);
    }
}
