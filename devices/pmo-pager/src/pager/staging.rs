//! Trigger pages held back for their first touch: verified plaintext kept outside the
//! window (see [`Pager::set_predictor`](super::Pager::set_predictor)).

use locked::Locked;
use std::collections::VecDeque;
use std::sync::Mutex;

use zeroize::Zeroize;

use super::PAGE;

/// A staged trigger page waits this many later faults of its attachment for
/// its first access; then it counts as a wasted prediction.
const STAGE_HORIZON: u64 = 64;
/// Staged trigger pages per attachment; the oldest counts as wasted beyond this.
const STAGE_CAP: usize = 64;

/// A trigger page: verified plaintext held outside the window until the
/// guest touches it (installed then, at the cost of a fault without crypto)
/// or the horizon passes (wasted). Zeroized when dropped.
pub(super) struct Staged {
    page: u64,
    /// The attachment's fault count when it was staged.
    seq: u64,
    data: Box<[u8; PAGE]>,
}

impl Staged {
    /// A copy of `data`, the verified plaintext of `page`, staged at fault count `seq`.
    pub(super) fn new(page: u64, seq: u64, data: &[u8; PAGE]) -> Self {
        Staged {
            page,
            seq,
            data: Box::new(*data),
        }
    }

    /// The plaintext.
    pub(super) fn data(&self) -> &[u8; PAGE] {
        &self.data
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        self.data.zeroize();
    }
}

/// One attachment's staged triggers, oldest first.
#[derive(Default)]
pub(super) struct Triggers(Mutex<VecDeque<Staged>>);

impl Triggers {
    /// Holds a trigger until its fault or its expiry.
    pub(super) fn push(&self, staged: Staged) {
        self.0.locked().push_back(staged);
    }

    /// Takes the trigger for `page`, if there is one.
    pub(super) fn take(&self, page: u64) -> Option<Staged> {
        let mut staged = self.0.locked();
        let i = staged.iter().position(|s| s.page == page)?;
        staged.remove(i)
    }

    /// Drops the triggers older than the horizon at fault count `now` (or beyond the cap)
    /// and returns their pages, oldest first.
    pub(super) fn expire(&self, now: u64) -> Vec<u64> {
        let mut expired = Vec::new();
        let mut staged = self.0.locked();
        while let Some(front) = staged.front() {
            if front.seq + STAGE_HORIZON > now && staged.len() <= STAGE_CAP {
                break;
            }
            if let Some(s) = staged.pop_front() {
                expired.push(s.page);
            }
        }
        expired
    }

    /// Drops every trigger (the attachment ends); returns how many there were.
    pub(super) fn drop_all(&self) -> u64 {
        let left = std::mem::take(&mut *self.0.locked());
        left.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_expire_past_the_horizon_or_the_cap() {
        let t = Triggers::default();
        let page = [1u8; PAGE];
        t.push(Staged::new(7, 0, &page));
        t.push(Staged::new(8, 10, &page));
        assert_eq!(t.expire(STAGE_HORIZON - 1), Vec::<u64>::new());
        assert_eq!(t.expire(STAGE_HORIZON), vec![7]);
        assert_eq!(t.take(8).map(|s| s.data()[0]), Some(1));
        assert!(t.take(8).is_none());
        for p in 0..=STAGE_CAP as u64 {
            t.push(Staged::new(p, 100, &page));
        }
        assert_eq!(t.expire(100), vec![0], "the oldest beyond the cap");
        assert_eq!(t.drop_all(), STAGE_CAP as u64);
        assert_eq!(t.drop_all(), 0);
    }
}
