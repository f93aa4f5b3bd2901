//! Per-thread stride detection.

use std::collections::HashMap;

use crate::{offset_page, FaultEvent, Predictor};

/// Most threads tracked at once. The pager's thread ids are unbounded over a long run (threads come
/// and go), so the table evicts the least recently faulting thread instead of growing.
const MAX_THREADS: usize = 256;

#[derive(Debug, Clone, Copy)]
struct ThreadState {
    last_page: u64,
    /// The line predicted at the last fault (see [`Line`]).
    line: Option<Line>,
    last_delta: Option<i64>,
    stride: Option<i64>,
    last_seen: u64,
}

/// Pages `last_page + k*step` for k in 1..=steps were handed to the pager at the thread's last
/// fault. Only a `confirmed` line (one backed by an established stride, or by a predicted page
/// the thread was seen to use) may explain the next fault: a guessed stream line that nobody used
/// says nothing, and trusting it would read a stride of 3 as a stream continuation.
#[derive(Debug, Clone, Copy)]
struct Line {
    step: i64,
    steps: u64,
    confirmed: bool,
}

/// Per-thread delta history shared by [`Stride`] and [`crate::Adaptive`].
///
/// A stride is established when one thread's two consecutive fault deltas are equal.
///
/// Deltas are measured *through* the last prediction: with pre-population working, predicted
/// pages do not fault, so after predicting p+s .. p+n*s the next fault is typically p+(n+1)*s,
/// and a late access to a page still in flight faults somewhere inside that line. Either way the
/// fault continues the line, so it counts as a delta of one step. Without this a stream of depth d
/// on a sequential scan would read as a false stride of d+1, and one slow pre-population would
/// break an established stride.
#[derive(Debug, Clone, Default)]
pub(crate) struct StrideTable {
    threads: HashMap<u32, ThreadState>,
    clock: u64,
}

impl StrideTable {
    /// Records the fault and returns the stride now established for its thread, if any.
    pub(crate) fn observe(&mut self, ev: &FaultEvent) -> Option<i64> {
        self.clock += 1;
        let clock = self.clock;
        if !self.threads.contains_key(&ev.thread) && self.threads.len() >= MAX_THREADS {
            self.evict_oldest();
        }
        let page = ev.page;
        let st = self.threads.entry(ev.thread).or_insert(ThreadState {
            last_page: page,
            line: None,
            last_delta: None,
            stride: None,
            last_seen: clock,
        });
        if st.last_seen == clock {
            // First fault of this thread: nothing to compare with yet.
            return None;
        }
        st.last_seen = clock;
        let raw = i128::from(page) - i128::from(st.last_page);
        let line = st.line.take();
        st.last_page = page;
        let Ok(raw) = i64::try_from(raw) else {
            st.last_delta = None;
            st.stride = None;
            return None;
        };
        if raw == 0 {
            // A repeated fault on the same page (e.g. a racing vCPU) says nothing about direction.
            return st.stride;
        }
        let delta = match line {
            Some(l) if l.confirmed && raw % l.step == 0 => {
                let k = raw / l.step;
                if k >= 1 && (k as u64) <= l.steps.saturating_add(1) {
                    l.step
                } else {
                    raw
                }
            }
            _ => raw,
        };
        if st.stride != Some(delta) {
            st.stride = if st.last_delta == Some(delta) {
                Some(delta)
            } else {
                None
            };
        }
        st.last_delta = Some(delta);
        st.stride
    }

    /// Tells the table that, at this thread's last fault, pages last + k*step for k in
    /// 1..=steps were predicted (see the type's doc for why). `confirmed`: whether the line is
    /// already trusted (it follows an established stride); otherwise see [`Self::confirm_line`].
    pub(crate) fn set_line(&mut self, thread: u32, step: i64, steps: u64, confirmed: bool) {
        if let Some(st) = self.threads.get_mut(&thread) {
            if step != 0 && steps > 0 {
                st.line = Some(Line {
                    step,
                    steps,
                    confirmed,
                });
            }
        }
    }

    /// `page` was used; if it lies on this thread's current line, the line really is where the
    /// thread is going. (A page from an older prediction confirms nothing about the new line.)
    pub(crate) fn confirm_line(&mut self, thread: u32, page: u64) {
        let Some(st) = self.threads.get_mut(&thread) else {
            return;
        };
        let base = st.last_page;
        if let Some(l) = st.line.as_mut() {
            let off = i128::from(page) - i128::from(base);
            let step = i128::from(l.step);
            if off % step == 0 && off / step >= 1 && off / step <= i128::from(l.steps) {
                l.confirmed = true;
            }
        }
    }

    fn evict_oldest(&mut self) {
        if let Some((&tid, _)) = self.threads.iter().min_by_key(|(_, st)| st.last_seen) {
            self.threads.remove(&tid);
        }
    }

    #[cfg(test)]
    pub(crate) fn thread_count(&self) -> usize {
        self.threads.len()
    }
}

/// Pushes `page + stride, page + 2*stride, ...` (`depth` of them, clipped to the PMO).
/// With a stride other than 0 the pages are distinct and never the faulting one, so they go
/// in without a duplicate check; a stride of 0 predicts nothing.
pub(crate) fn push_stride(ev: &FaultEvent, stride: i64, depth: usize, out: &mut Vec<u64>) {
    if stride == 0 {
        return;
    }
    for k in 1..=depth as u64 {
        match offset_page(ev.page, stride, k, ev.npages) {
            Some(p) => out.push(p),
            None => break,
        }
    }
}

/// Stride predictor: once a thread's faults show a constant delta s (two equal consecutive
/// deltas), predict p+s, p+2s, ... `depth` times. Negative strides (reverse walks) work the same.
/// History is kept per faulting thread, so two threads walking different strides (TMM's tiles,
/// one thread per tile row) do not break each other's detection. Predicts nothing until a
/// stride is established: a wrong guess costs a decrypt and PM bandwidth.
#[derive(Debug, Clone)]
pub struct Stride {
    depth: usize,
    table: StrideTable,
}

impl Stride {
    /// A predictor of `depth` pages along the detected stride.
    pub fn new(depth: usize) -> Self {
        Stride {
            depth,
            table: StrideTable::default(),
        }
    }

    #[cfg(test)]
    pub(crate) fn thread_count(&self) -> usize {
        self.table.thread_count()
    }
}

impl Predictor for Stride {
    fn on_fault(&mut self, ev: &FaultEvent, out: &mut Vec<u64>) {
        if let Some(s) = self.table.observe(ev) {
            push_stride(ev, s, self.depth, out);
            self.table.set_line(ev.thread, s, self.depth as u64, true);
        }
    }

    fn name(&self) -> String {
        format!("stride:{}", self.depth)
    }
}
