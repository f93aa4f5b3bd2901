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
        let n = pages.len() as u64;
        self.prefetch_backlog.fetch_add(n, Ordering::AcqRel);
        let jobs = pages.iter().enumerate().map(|(i, &p)| PrefetchJob {
            slice: slice.clone(),
            page: p,
            stage: trigger == Some(i),
            writing: write,
        });
        let queued = self.prefetch.push_all(jobs);
        for &p in &pages[..queued] {
            set_bit(&slice.issued, p);
        }
        // A full backlog drops the rest: prefetch never delays a fault.
        if queued < pages.len() {
            self.prefetch_backlog
                .fetch_sub(n - queued as u64, Ordering::AcqRel);
            for &q in &pages[queued..] {
                clear_bit(&slice.predicted, q);
            }
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

    /// Takes one queued prediction, if any, and fills it (a fault thread between faults).
    /// Called on every turn of a fault thread's spin: with nothing predicted (the backlog
    /// counts a job before it is queued) it costs one load, not a lock attempt.
    pub(super) fn prefetch_one(&self, buf: &mut [u8; PAGE], watch: &mut Watch<'_>) -> bool {
        if self.prefetch_backlog.load(Ordering::Acquire) == 0 {
            return false;
        }
        let Some(job) = self.prefetch.try_pop() else {
            return false;
        };
        if job.slice.source.fill_waits() {
            watch.hand_off();
        }
        self.run_prefetch_job(&job, buf);
        true
    }

    /// Fills one dequeued prediction and takes it off the backlog.
    fn run_prefetch_job(&self, job: &PrefetchJob, buf: &mut [u8; PAGE]) {
        self.prefetch_page(&job.slice, job, buf);
        self.prefetch_backlog.fetch_sub(1, Ordering::AcqRel);
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

/// Predicted pages waiting to be filled, taken by the prefetch worker and by fault threads
/// while they spin between faults. Bounded: a full queue drops predictions, so prefetch never
/// delays a fault.
pub(super) struct PrefetchQueue {
    state: Mutex<QueueState>,
    ready: std::sync::Condvar,
}

struct QueueState {
    jobs: VecDeque<PrefetchJob>,
    open: bool,
    /// Workers asleep on `ready`: a push wakes one only then (a futex wake per queued page
    /// would sit on the fault path, before the install).
    sleepers: usize,
}

impl PrefetchQueue {
    pub(super) fn new() -> Self {
        PrefetchQueue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                open: true,
                sleepers: 0,
            }),
            ready: std::sync::Condvar::new(),
        }
    }

    /// Queues `jobs` in order under one lock until the queue is full; returns how many
    /// went in (the rest are dropped, as everything is once the queue is closed).
    pub(super) fn push_all(&self, jobs: impl Iterator<Item = PrefetchJob>) -> usize {
        let mut st = self.state.locked();
        if !st.open {
            return 0;
        }
        let mut queued = 0;
        for job in jobs {
            if st.jobs.len() >= PREFETCH_BACKLOG {
                break;
            }
            st.jobs.push_back(job);
            queued += 1;
        }
        let wake = queued > 0 && st.sleepers > 0;
        drop(st);
        if wake {
            self.ready.notify_one();
        }
        queued
    }

    /// The next job, without waiting, not even for the lock (a fault thread must not).
    fn try_pop(&self) -> Option<PrefetchJob> {
        self.state.try_lock().ok()?.jobs.pop_front()
    }

    /// Waits for the next job; `None` once the queue is closed.
    fn pop_wait(&self) -> Option<PrefetchJob> {
        let mut st = self.state.locked();
        loop {
            if !st.open {
                return None;
            }
            if let Some(job) = st.jobs.pop_front() {
                return Some(job);
            }
            st.sleepers += 1;
            st = self.ready.wait(st).unwrap_or_else(|e| e.into_inner());
            st.sleepers -= 1;
        }
    }

    /// Closes the queue and returns how many jobs it dropped.
    pub(super) fn close(&self) -> u64 {
        let mut st = self.state.locked();
        st.open = false;
        let dropped = std::mem::take(&mut st.jobs).len() as u64;
        drop(st);
        self.ready.notify_all();
        dropped
    }
}

/// Prefetch worker body: install predicted pages while the pager lives.
pub(super) fn prefetch_worker(pager: std::sync::Weak<Pager>, queue: &PrefetchQueue) {
    let mut buf = Box::new([0u8; PAGE]);
    while let Some(job) = queue.pop_wait() {
        let Some(p) = pager.upgrade() else { return };
        p.run_prefetch_job(&job, &mut buf);
    }
}
