//! The bounded queue of prefetch jobs between the fault path, which fills it, and the
//! prefetch worker and spinning fault threads, which empty it.

use locked::Locked;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use super::job::PrefetchJob;

/// Prefetch jobs waiting for the prefetch worker; beyond this they are dropped.
const PREFETCH_BACKLOG: usize = 4096;

/// Predicted pages waiting to be filled, taken by the prefetch worker and by fault threads
/// while they spin between faults. Bounded: a full queue drops predictions, so prefetch never
/// delays a fault.
pub(in crate::pager) struct PrefetchQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
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
            ready: Condvar::new(),
        }
    }

    /// Queues `jobs` in order under one lock until the queue is full; returns how many
    /// went in (the rest are dropped, as everything is once the queue is closed) and whether
    /// a worker sleeps that should be woken for them ([`PrefetchQueue::wake_one`]).
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

    /// Wakes one sleeping worker.
    pub(super) fn wake_one(&self) {
        self.ready.notify_one();
    }

    /// The next job, without waiting, not even for the lock (a fault thread must not).
    pub(super) fn try_pop(&self) -> Option<PrefetchJob> {
        self.state.try_lock().ok()?.jobs.pop_front()
    }

    /// Waits for the next job; `None` once the queue is closed.
    pub(super) fn pop_wait(&self) -> Option<PrefetchJob> {
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
