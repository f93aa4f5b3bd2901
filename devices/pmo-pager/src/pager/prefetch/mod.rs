//! Prediction and prefetch: after a fault the slice's predictor names likely next pages,
//! which the prefetch worker (or a fault thread between faults) fills ahead: installed, or
//! staged for a later fault.
//!
//! Files: this one holds the [`Prefetcher`] (predictions in, jobs out, the backlog, the
//! worker); `job.rs` a job and what it does (fill, install or stage, release); `queue.rs`
//! the bounded queue between them.

use locked::Locked;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use threads::JoinHandle;

use pmo_policies::FaultEvent;
use uffd::Watch;

mod job;
mod queue;

use job::runs_of;
pub(super) use job::PrefetchJob;
pub(in crate::pager) use job::RUN_PAGES;
use queue::PrefetchQueue;

use super::budget::DramBudget;
use super::bufs::RunBufs;
use super::slice::Slice;
use super::window::Window;
use super::Pager;

/// Of single-page predictions, one in this many is staged as a trigger.
const SINGLE_TRIGGER_EVERY: u64 = 4;

/// Whether the prefetch worker must be woken for jobs just queued.
#[must_use]
pub(super) struct WakeWorker(bool);

/// The pager's prefetch: the queue of predicted runs, how many pages it holds, and the
/// worker that empties it.
pub(super) struct Prefetcher {
    /// Predicted pages for the prefetch worker and the spinning fault threads; closed at
    /// shutdown to stop the worker.
    queue: Arc<PrefetchQueue>,
    /// Predicted pages queued for the prefetch worker and not yet handled.
    backlog: AtomicU64,
    /// The prefetch worker, joined at shutdown.
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Prefetcher {
    /// An open queue and no worker yet ([`Prefetcher::set_worker`]).
    pub(super) fn new() -> Self {
        Prefetcher {
            queue: Arc::new(PrefetchQueue::new()),
            backlog: AtomicU64::new(0),
            worker: Mutex::new(None),
        }
    }

    /// The queue, for the worker.
    pub(super) fn queue(&self) -> Arc<PrefetchQueue> {
        Arc::clone(&self.queue)
    }

    /// The worker that runs [`prefetch_worker`], joined at shutdown.
    pub(super) fn set_worker(&self, worker: JoinHandle<()>) {
        *self.worker.locked() = Some(worker);
    }

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
        window: &Window,
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
                    && !slice.installed.test(p)
                    && !slice.bad.test(p)
                    && !slice.predicted.set(p)
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
                slice.filling.set(p);
            }
        }
        let n = pages.len() as u64;
        self.backlog.fetch_add(n, Ordering::AcqRel);
        let jobs = runs.iter().map(|r| PrefetchJob {
            slice: slice.clone(),
            run: *r,
            writing: write,
        });
        let (queued, wake) = self.queue.push_all(jobs);
        for r in &runs[..queued] {
            for p in r.first..r.first + r.count {
                slice.issued.set(p);
            }
        }
        // A full backlog drops the rest: prefetch never delays a fault.
        for r in &runs[queued..] {
            self.backlog.fetch_sub(r.count, Ordering::AcqRel);
            for q in r.first..r.first + r.count {
                slice.predicted.clear(q);
            }
            r.release(window, slice, 0);
        }
        WakeWorker(wake)
    }

    /// Wakes the prefetch worker if [`Prefetcher::predict_after`] found it asleep. Called
    /// after the fault's own page is installed: a wake-up costs the fault thread an
    /// inter-processor interrupt (microseconds here) that the faulting access need not wait
    /// for, and a fault thread takes queued runs itself meanwhile.
    #[inline]
    pub(super) fn wake(&self, wake: WakeWorker) {
        if wake.0 {
            self.queue.wake_one();
        }
    }

    /// Takes one queued prediction, if any, for a fault thread between faults to fill
    /// ([`Prefetcher::run`]). Called on every turn of a fault thread's spin: with nothing
    /// predicted (the backlog counts a job before it is queued) it costs one load, not a
    /// lock attempt. A run of several pages takes tens of microseconds, so the thread hands
    /// the watch over first.
    #[inline]
    pub(super) fn take_one(&self, watch: &mut Watch<'_>) -> Option<PrefetchJob> {
        if self.backlog.load(Ordering::Acquire) == 0 {
            return None;
        }
        let job = self.queue.try_pop()?;
        if job.slice.source.fill_waits() || job.run.count > 1 {
            watch.hand_off();
        }
        Some(job)
    }

    /// Fills one dequeued prediction and takes it off the backlog.
    pub(super) fn run(
        &self,
        window: &Window,
        budget: Option<&DramBudget>,
        job: &PrefetchJob,
        bufs: &mut RunBufs,
    ) {
        job.populate(window, budget, bufs);
        self.backlog.fetch_sub(job.run.count, Ordering::AcqRel);
    }

    /// Predicted pages queued and not handled yet (see
    /// [`Pager::prefetch_backlog`](super::Pager::prefetch_backlog)).
    pub(super) fn backlog(&self) -> u64 {
        self.backlog.load(Ordering::Acquire)
    }

    /// Stops the worker: closing the queue ends it; what it still held is dropped.
    pub(super) fn shutdown(&self) {
        let dropped = self.queue.close();
        self.backlog.fetch_sub(dropped, Ordering::AcqRel);
        if let Some(t) = self.worker.locked().take() {
            // The last owner may be the worker itself; it must not join itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// Prefetch worker body: install predicted pages while the pager lives.
pub(super) fn prefetch_worker(pager: Weak<Pager>, queue: &PrefetchQueue) {
    let mut bufs = RunBufs::new();
    while let Some(job) = queue.pop_wait() {
        let Some(p) = pager.upgrade() else { return };
        p.prefetch(&job, &mut bufs);
    }
}
