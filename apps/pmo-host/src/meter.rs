//! What a [`PmoHost`](crate::PmoHost) measures: time in its calls and the pager's counters of
//! every attachment, summed at detach ([`Measurements`]), and, when asked, each session's page
//! sets ([`SessionRecord`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pmo_pager::{PredictionCounts, PredictionEstimate, SliceStats};

/// Declares [`Measurements`] (plain numbers) and `Meters` (the same fields as atomics).
macro_rules! measurements {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// A snapshot of what a host measured. Times are summed over calls (from every thread
        /// that made them, so with several threads they can exceed the wall-clock time);
        /// the pager's counters are summed over the attachments that were detached.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Measurements {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        /// The running counters behind [`Measurements`].
        #[derive(Default)]
        pub(crate) struct Meters {
            $(pub(crate) $field: AtomicU64,)*
        }

        impl Meters {
            pub(crate) fn snapshot(&self) -> Measurements {
                Measurements { $($field: self.$field.load(Relaxed),)* }
            }

            pub(crate) fn reset(&self) {
                $(self.$field.store(0, Relaxed);)*
            }
        }

        impl Measurements {
            /// What was measured after `earlier` (a snapshot of the same host).
            pub fn since(&self, earlier: &Measurements) -> Measurements {
                Measurements { $($field: self.$field.saturating_sub(earlier.$field),)* }
            }
        }
    };
}

measurements! {
    /// In attach: the store session, the pager slice and the predictor (for `wedi`: decrypting
    /// and verifying the whole PMO); without the stall and without a create on attach.
    attach_ns,
    /// Waiting for a previous nonblocking detach of the same PMO (at attach, destroy and
    /// [`PmoHost::drain`](crate::PmoHost::drain)): the papers' "attach stall".
    stall_ns,
    /// In sync: collecting the dirty pages from the window and `Session::psync`.
    psync_ns,
    /// In detach: dropping the plaintext from the window and the store's detach call (and,
    /// with a blocking detach, waiting for its background work).
    detach_ns,
    /// In create (also when attach creates).
    create_ns,
    /// In destroy, without waiting for a pending detach.
    destroy_ns,
    /// Attach calls that succeeded.
    attaches,
    /// Detach calls that succeeded.
    detaches,
    /// Syncs of writable attachments (psyncs).
    psyncs,
    /// Dirty pages those psyncs wrote.
    psync_pages,
    /// PMOs created.
    creates,
    /// PMOs destroyed.
    destroys,
    /// Demand faults the pager served (`SliceStats::faults`).
    faults,
    /// Their service time in the pager (`SliceStats::fault_ns_total`).
    fault_ns,
    /// Write-protect faults: first writes to pages installed read-only for dirty tracking.
    wp_faults,
    /// Demand faults on predicted pages not installed yet (`SliceStats::prefetch_late`).
    prefetch_late,
    /// `SliceStats::pages_prefetched`.
    pages_prefetched,
    /// `SliceStats::trigger_hits`.
    trigger_hits,
    /// `SliceStats::trigger_wasted` (counted after the pager's detach, which adds the triggers
    /// left untouched).
    trigger_wasted,
    /// `SliceStats::demand_unpredicted`.
    demand_unpredicted,
}

impl Meters {
    /// Adds a detached attachment's pager counters.
    pub(crate) fn add_slice(&self, s: &SliceStats) {
        let get = |c: &AtomicU64| c.load(Relaxed);
        self.faults.fetch_add(get(&s.faults), Relaxed);
        self.fault_ns.fetch_add(get(&s.fault_ns_total), Relaxed);
        self.wp_faults.fetch_add(get(&s.wp_faults), Relaxed);
        self.prefetch_late.fetch_add(get(&s.prefetch_late), Relaxed);
        self.pages_prefetched
            .fetch_add(get(&s.pages_prefetched), Relaxed);
        self.trigger_hits.fetch_add(get(&s.trigger_hits), Relaxed);
        self.trigger_wasted
            .fetch_add(get(&s.trigger_wasted), Relaxed);
        self.demand_unpredicted
            .fetch_add(get(&s.demand_unpredicted), Relaxed);
    }
}

impl Measurements {
    /// The pager's own estimate of accuracy, coverage and timeliness from these counters
    /// (`SliceStats::estimate` over the sum).
    pub fn estimate(&self) -> PredictionEstimate {
        PredictionCounts {
            pages_prefetched: self.pages_prefetched,
            trigger_hits: self.trigger_hits,
            trigger_wasted: self.trigger_wasted,
            prefetch_late: self.prefetch_late,
            demand_unpredicted: self.demand_unpredicted,
        }
        .estimate()
    }
}

/// One attach session's pages (`Pager::page_sets` taken at detach), recorded when
/// [`HostConfig::record_sessions`](crate::HostConfig::record_sessions) is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionRecord {
    /// The PMO.
    pub name: String,
    /// Attached for writing.
    pub writable: bool,
    /// Pages a demand fault decrypted.
    pub demand: Vec<u64>,
    /// Pages handed to the prefetch worker.
    pub prefetched: Vec<u64>,
    /// Demand faults on predicted pages not installed yet.
    pub late: u64,
}
