//! The detach gate of a slice: what keeps a late change of the window on behalf of an
//! attachment from landing in the next attachment of the same range.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Admits window changes on behalf of one slice until detach closes it.
#[derive(Default)]
pub(super) struct DetachGate {
    /// Set once detach began: nothing more of this slice may reach the window
    /// (see [`DetachGate::enter`]).
    closing: AtomicBool,
    /// Window mutations on behalf of this slice in progress (see [`DetachGate::enter`]).
    inflight: AtomicU64,
}

/// One window mutation on behalf of a slice in progress; detach waits until it is dropped.
pub(super) struct InFlight<'a>(&'a DetachGate);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl DetachGate {
    /// Admits one change of the window on behalf of this slice (installing a
    /// page, protecting or unprotecting one, copying pages out for psync), or
    /// refuses it once detach began.
    ///
    /// Fills take long (decrypt and verify) and run outside the gate; only
    /// the change itself runs inside. Detach sets `closing` and then waits
    /// until nothing is in flight before it clears the range, so whatever a
    /// late fill would do either happens before the clear or not at all: it
    /// can never land in the next attachment of the range. Both sides use
    /// SeqCst (increment then read `closing`; set `closing` then read the
    /// count), so at least one of them sees the other.
    #[inline]
    pub(super) fn enter(&self) -> Option<InFlight<'_>> {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self);
        if self.closing.load(Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    /// Starts detach: refuses new window changes and waits for those in
    /// flight. False if another detach got there first.
    pub(super) fn close(&self) -> bool {
        if self.closing.swap(true, Ordering::SeqCst) {
            return false;
        }
        // In flight = one ioctl, mprotect or a psync's page copies: short.
        while self.inflight.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        true
    }

    /// Whether detach began. Outside the gate only a hint (a fill about to start is skipped,
    /// a fault finds no live slice): what must not happen after detach is kept out by
    /// [`DetachGate::enter`].
    #[inline]
    pub(super) fn closing(&self, order: Ordering) -> bool {
        self.closing.load(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_waits_for_changes_in_flight_and_refuses_new_ones() {
        let gate = DetachGate::default();
        let held = gate.enter().expect("open");
        std::thread::scope(|s| {
            let closer = s.spawn(|| gate.close());
            // The closer sets `closing` first, then waits for `held`.
            while !gate.closing(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            assert!(gate.enter().is_none(), "no new change once closing");
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!closer.is_finished(), "waits for the change in flight");
            drop(held);
            assert!(closer.join().unwrap());
        });
        assert!(!gate.close(), "a second detach does not get it");
    }
}
