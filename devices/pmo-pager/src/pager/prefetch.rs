//! Prediction and prefetch: after a fault the slice's predictor names likely next pages,
//! which the prefetch worker fills ahead (installed, or staged for a later fault).

use super::*;

impl Pager {
    /// Asks the slice's predictor what to pre-populate after a fault on `page`
    /// and queues what is not there yet. Pages predicted from a write fault
    /// of a writable attachment are installed writable and dirty: a stream
    /// being written (an output array) would otherwise take a write-protect
    /// fault on every prefetched page. A wrong guess costs psync one page.
    ///
    /// Consecutive pages go out as runs of up to [`RUN_PAGES`], each filled and installed
    /// as one (see [`PrefetchJob`]); the trigger is a job of its own.
    pub(super) fn predict_after(
        &self,
        slice: &Arc<Slice>,
        page: u64,
        tid: u32,
        write: bool,
    ) -> WakeWorker {
        let mut pages = Vec::new();
        let single_trigger;
        {
            let mut p = slice.predict.locked();
            let Some(st) = p.as_mut() else {
                return WakeWorker(false);
            };
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
            0 => return WakeWorker(false),
            1 if single_trigger => Some(0),
            1 => None,
            n => Some(n / 2),
        };
        let runs = runs_of(&pages, trigger);
        // A fault on a page of a queued run leaves it to the run from now on.
        for r in runs.iter().filter(|r| !r.stage) {
            for p in r.first..r.first + r.count {
                set_bit(&slice.filling, p);
            }
        }
        let n = pages.len() as u64;
        self.prefetch_backlog.fetch_add(n, Ordering::AcqRel);
        let jobs = runs.iter().map(|r| PrefetchJob {
            slice: slice.clone(),
            run: *r,
            writing: write,
        });
        let (queued, wake) = self.prefetch.push_all(jobs);
        for r in &runs[..queued] {
            for p in r.first..r.first + r.count {
                set_bit(&slice.issued, p);
            }
        }
        // A full backlog drops the rest: prefetch never delays a fault.
        for r in &runs[queued..] {
            self.prefetch_backlog.fetch_sub(r.count, Ordering::AcqRel);
            for q in r.first..r.first + r.count {
                clear_bit(&slice.predicted, q);
            }
            self.release_run(slice, r, 0);
        }
        WakeWorker(wake)
    }

    /// Wakes the prefetch worker if [`Pager::predict_after`] found it asleep. Called after
    /// the fault's own page is installed: a wake-up costs the fault thread an
    /// inter-processor interrupt (microseconds here) that the faulting access need not wait
    /// for, and a fault thread takes queued runs itself meanwhile.
    pub(super) fn wake_prefetch(&self, wake: WakeWorker) {
        if wake.0 {
            self.prefetch.ready.notify_one();
        }
    }

    /// Pre-populates one predicted run: fills its pages from the source and installs them,
    /// each stretch of pages that still needs it with one copy, unless a fault got there
    /// first. A page that fails verification is left alone: only a real access to it is
    /// refused (see `serve_fault`). Every page the run does not install is released to the
    /// fault path ([`Pager::release_run`]).
    pub(super) fn prefetch_run(&self, slice: &Slice, job: &PrefetchJob, bufs: &mut RunBufs) {
        let run = job.run;
        if run.stage {
            self.stage_trigger(slice, run.first, bufs.page());
            return;
        }
        let bufs = bufs.run();
        let mut placed = 0u64;
        if self.prefetch_to_dram(slice, &run) {
            let writable = slice.source.writable();
            let dirty = writable && job.writing;
            let mut i = 0;
            while i < run.count as usize && !slice.closing.load(Ordering::Acquire) {
                // The longest stretch from page i that nobody installed yet.
                let mut len = 0;
                while i + len < run.count as usize
                    && !test_bit(&slice.installed, run.first + (i + len) as u64)
                {
                    len += 1;
                }
                let first = run.first + i as u64;
                // Fill it; a failure at page k ends the stretch there.
                let filled = match slice.source.fill_run(first, &mut bufs[..len]) {
                    Ok(()) => len,
                    Err((k, e)) => {
                        self.refused_ahead(slice, first + k as u64, &e);
                        k
                    }
                };
                if filled > 0 {
                    let data = bufs[..filled].as_flattened();
                    let wp = writable && !job.writing;
                    placed |= self.install_run_in(slice, first, data, dirty, wp) << i;
                    for b in &mut bufs[..filled] {
                        b.fill(0);
                    }
                }
                // The page that ended the stretch is installed, bad, or failed: skip it.
                i += filled + 1;
            }
            let n = u64::from(placed.count_ones());
            if n > 0 {
                slice.stats.pages_prefetched.fetch_add(n, Ordering::Relaxed);
                self.enforce_budget();
            }
        }
        self.release_run(slice, &run, placed);
    }

    /// A predicted page failed to fill. One that fails verification is news even though
    /// nothing touched it (and a wrong guess must not kill a process): the guest driver can
    /// unmap it before anything, its own kernel included, reads it.
    fn refused_ahead(&self, slice: &Slice, page: u64, e: &FillError) {
        if matches!(e, FillError::Integrity(_)) && !set_bit(&slice.bad, page) {
            if let Some(_gate) = slice.enter() {
                slice
                    .stats
                    .integrity_failures
                    .fetch_add(1, Ordering::Relaxed);
                slice.source.page_failed(page, e, Detected::Ahead);
            }
        }
    }

    /// Whether predicted pages go into local DRAM now: under a DRAM budget the placement
    /// policy may keep them in the CXL tier (the store) until they are touched, rather than
    /// push out pages it rates hotter. Decided before any decryption.
    fn prefetch_to_dram(&self, slice: &Slice, run: &Run) -> bool {
        let Some(b) = self.budget.get().filter(|_| !slice.on_device) else {
            return true;
        };
        let resident = b.resident.load(Ordering::Acquire) as usize;
        if b.policy.locked().prefetch_tier(resident, b.pages as usize) == pmo_policies::Tier::Dram {
            return true;
        }
        // Left in the CXL tier: filled when touched, and free to be predicted again.
        for p in run.first..run.first + run.count {
            clear_bit(&slice.predicted, p);
        }
        slice
            .stats
            .prefetch_to_cxl
            .fetch_add(run.count, Ordering::Relaxed);
        false
    }

    /// A run is done: its pages are no longer the run's to fill. Wakes whatever waits on a
    /// page it did not install (`placed`, bit i for page `first + i`), in that order: a fault
    /// that saw the page as the run's before the release is woken and retries on the fault
    /// path; one after it takes the fault path at once.
    fn release_run(&self, slice: &Slice, run: &Run, placed: u64) {
        if run.stage {
            return;
        }
        for p in run.first..run.first + run.count {
            clear_bit(&slice.filling, p);
        }
        let mut i = 0;
        while i < run.count {
            if placed & (1 << i) != 0 {
                i += 1;
                continue;
            }
            let mut len = 1;
            while i + len < run.count && placed & (1 << (i + len)) == 0 {
                len += 1;
            }
            let addr = self.page_addr(slice, run.first + i);
            if let Err(e) = self.uffd.wake(addr, len * PAGE_U64) {
                log::error!("pmo: wake {addr:#x}: {e}");
            }
            i += len;
        }
    }

    /// Fills a trigger page and holds it outside the window until its fault (see
    /// [`Pager::set_predictor`]), unless a fault installed it meanwhile.
    fn stage_trigger(&self, slice: &Slice, page: u64, buf: &mut [u8; PAGE]) {
        if slice.closing.load(Ordering::Acquire) || test_bit(&slice.installed, page) {
            return;
        }
        if let Err(e) = slice.source.fill(page, buf) {
            self.refused_ahead(slice, page, &e);
            return;
        }
        let staged = Staged {
            page,
            seq: slice.seq.load(Ordering::Acquire),
            data: Box::new(*buf),
        };
        buf.fill(0);
        // A late fault may have installed it while we decrypted. Staged inside the gate, so
        // detach (which drops the staged pages after waiting for the gate) cannot miss it.
        let Some(gate) = slice.enter() else { return };
        if test_bit(&slice.installed, page) {
            return;
        }
        slice.stats.triggers.fetch_add(1, Ordering::Relaxed);
        slice.staged.locked().push_back(staged);
        drop(gate);
        slice.expire_staged(slice.seq.load(Ordering::Acquire));
    }

    /// Takes one queued prediction, if any, and fills it (a fault thread between faults).
    /// Called on every turn of a fault thread's spin: with nothing predicted (the backlog
    /// counts a job before it is queued) it costs one load, not a lock attempt. A run of
    /// several pages takes tens of microseconds, so the thread hands the watch over first.
    pub(super) fn prefetch_one(&self, bufs: &mut RunBufs, watch: &mut Watch<'_>) -> bool {
        if self.prefetch_backlog.load(Ordering::Acquire) == 0 {
            return false;
        }
        let Some(job) = self.prefetch.try_pop() else {
            return false;
        };
        if job.slice.source.fill_waits() || job.run.count > 1 {
            watch.hand_off();
        }
        self.run_prefetch_job(&job, bufs);
        true
    }

    /// Fills one dequeued prediction and takes it off the backlog.
    fn run_prefetch_job(&self, job: &PrefetchJob, bufs: &mut RunBufs) {
        self.prefetch_run(&job.slice, job, bufs);
        self.prefetch_backlog
            .fetch_sub(job.run.count, Ordering::AcqRel);
    }

    /// Predicted pages queued for the prefetch worker and not handled yet: 0 means every
    /// prediction made so far has been installed, staged or dropped (what a test or harness
    /// waits for before it compares).
    pub fn prefetch_backlog(&self) -> u64 {
        self.prefetch_backlog.load(Ordering::Acquire)
    }
}

/// Pages filled and installed as one prefetch job: a run of consecutive pages, or one
/// trigger page to stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    first: u64,
    count: u64,
    /// A trigger: filled and held back, not installed (always one page).
    stage: bool,
}

/// Splits predicted pages, in their order, into runs of consecutive pages of at most
/// [`RUN_PAGES`]; the page at index `trigger` becomes a staging job of its own.
fn runs_of(pages: &[u64], trigger: Option<usize>) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < pages.len() {
        if trigger == Some(i) {
            runs.push(Run {
                first: pages[i],
                count: 1,
                stage: true,
            });
            i += 1;
            continue;
        }
        let first = pages[i];
        let mut n = 1;
        while i + n < pages.len()
            && n < RUN_PAGES
            && trigger != Some(i + n)
            && pages[i + n] == first + n as u64
        {
            n += 1;
        }
        runs.push(Run {
            first,
            count: n as u64,
            stage: false,
        });
        i += n;
    }
    runs
}

/// Whether the prefetch worker must be woken for jobs just queued.
#[must_use]
pub(super) struct WakeWorker(bool);

/// One prefetch job for the worker or a spinning fault thread.
pub(super) struct PrefetchJob {
    slice: Arc<Slice>,
    run: Run,
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
    /// went in (the rest are dropped, as everything is once the queue is closed) and whether
    /// a worker sleeps that should be woken for them ([`Pager::wake_prefetch`]).
    pub(super) fn push_all(&self, jobs: impl Iterator<Item = PrefetchJob>) -> (usize, bool) {
        let mut st = self.state.locked();
        if !st.open {
            return (0, false);
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
        (queued, wake)
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

    /// Closes the queue and returns how many pages its dropped jobs held.
    pub(super) fn close(&self) -> u64 {
        let mut st = self.state.locked();
        st.open = false;
        let dropped = std::mem::take(&mut st.jobs)
            .iter()
            .map(|j| j.run.count)
            .sum();
        drop(st);
        self.ready.notify_all();
        dropped
    }
}

/// Prefetch worker body: install predicted pages while the pager lives.
pub(super) fn prefetch_worker(pager: std::sync::Weak<Pager>, queue: &PrefetchQueue) {
    let mut bufs = run_bufs();
    while let Some(job) = queue.pop_wait() {
        let Some(p) = pager.upgrade() else { return };
        p.run_prefetch_job(&job, &mut bufs);
    }
}

/// A thread's page buffers: one for a fault, up to [`RUN_PAGES`] for a prefetch run (made on
/// the first run, so a fault thread that never prefetches keeps one page). Wiped after each
/// use.
pub struct RunBufs(Vec<[u8; PAGE]>);

impl RunBufs {
    /// The first page, for a fault or a trigger.
    pub(super) fn page(&mut self) -> &mut [u8; PAGE] {
        &mut self.0[0]
    }

    /// Buffers for a whole run.
    fn run(&mut self) -> &mut [[u8; PAGE]] {
        if self.0.len() < RUN_PAGES {
            self.0.resize(RUN_PAGES, [0u8; PAGE]);
        }
        &mut self.0
    }
}

/// One page's buffer; the run's are added when first needed.
pub(super) fn run_bufs() -> RunBufs {
    RunBufs(vec![[0u8; PAGE]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, count: u64, stage: bool) -> Run {
        Run {
            first,
            count,
            stage,
        }
    }

    #[test]
    fn predictions_split_into_runs_of_consecutive_pages_around_the_trigger() {
        assert_eq!(runs_of(&[], None), vec![]);
        assert_eq!(runs_of(&[5], Some(0)), vec![run(5, 1, true)]);
        assert_eq!(
            runs_of(&[1, 2, 3, 4, 5], Some(2)),
            vec![run(1, 2, false), run(3, 1, true), run(4, 2, false)]
        );
        // Not consecutive, or out of order (a Markov guess): runs break there.
        assert_eq!(
            runs_of(&[7, 8, 20, 9, 10], None),
            vec![run(7, 2, false), run(20, 1, false), run(9, 2, false)]
        );
        let long: Vec<u64> = (100..100 + 2 * RUN_PAGES as u64 + 3).collect();
        let runs = runs_of(&long, None);
        assert_eq!(runs.len(), 3);
        assert_eq!(runs[0], run(100, RUN_PAGES as u64, false));
        assert_eq!(runs[2], run(100 + 2 * RUN_PAGES as u64, 3, false));
        assert_eq!(runs.iter().map(|r| r.count).sum::<u64>(), long.len() as u64);
    }
}
