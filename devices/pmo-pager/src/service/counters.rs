//! The service's counters over its whole life: what a VMM's metrics API reports for the PMO
//! device (Cloud Hypervisor's `vm.counters`). Live attachments are read where they count;
//! an attachment's counts are folded into the totals when it detaches, so nothing is lost
//! when one ends.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::attachment::AttachmentStat;

/// Counts of the PMO device since the service started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServiceCounters {
    /// Attachments live now.
    pub attachments: u64,
    /// Attaches that succeeded.
    pub attaches: u64,
    /// Demand faults served (first touches of pages not decrypted yet).
    pub faults: u64,
    /// Pages decrypted and verified, by faults and by prefetch.
    pub pages_decrypted: u64,
    /// Of those, by prefetch.
    pub pages_prefetched: u64,
    /// Prefetched pages seen used before their attachment ended (its triggers).
    pub prefetch_hits: u64,
    /// Prefetched pages never used (triggers left untouched).
    pub prefetch_wasted: u64,
    /// psyncs that persisted.
    pub psyncs: u64,
    /// Pages they wrote.
    pub psync_pages: u64,
    /// Pages that failed verification.
    pub integrity_failures: u64,
}

impl ServiceCounters {
    /// Bytes the psyncs wrote (pages of 4 KiB).
    pub fn psync_bytes(&self) -> u64 {
        self.psync_pages.saturating_mul(pmo_crypto::PAGE as u64)
    }

    /// Adds one attachment's counts.
    fn add(&mut self, a: &AttachmentStat) {
        let s = &a.slice;
        let get = |x: &AtomicU64| x.load(Ordering::Relaxed);
        self.faults += get(&s.faults);
        self.pages_decrypted += get(&s.pages_decrypted);
        self.pages_prefetched += get(&s.pages_prefetched);
        self.prefetch_hits += get(&s.trigger_hits);
        self.prefetch_wasted += get(&s.trigger_wasted);
        self.integrity_failures += get(&s.integrity_failures);
        self.psyncs += a.psyncs;
        self.psync_pages += a.psync_pages;
    }
}

/// The totals of ended attachments and the count of attaches.
#[derive(Default)]
pub(super) struct Totals {
    ended: std::sync::Mutex<ServiceCounters>,
    attaches: AtomicU64,
}

impl Totals {
    pub fn attached(&self) {
        self.attaches.fetch_add(1, Ordering::Relaxed);
    }

    /// Folds a detached attachment's counts in (after its detach, so its wasted triggers are
    /// counted).
    pub fn ended(&self, a: &AttachmentStat) {
        locked::Locked::locked(&self.ended).add(a);
    }

    /// The totals with the live attachments' counts added.
    pub fn with_live(&self, live: impl Iterator<Item = AttachmentStat>) -> ServiceCounters {
        let mut c = *locked::Locked::locked(&self.ended);
        for a in live {
            c.attachments += 1;
            c.add(&a);
        }
        c.attaches = self.attaches.load(Ordering::Relaxed);
        c
    }
}
