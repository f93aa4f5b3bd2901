//! What a cell measured: its time by component, the pager's prediction counters and the pages
//! of each session.

use pmo_pager::PredictionCounts;

/// Time of one run by component, in nanoseconds, plus counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// `Store::attach_with` + pager slice + predictor (the papers' "A Other").
    pub attach_ns: u64,
    /// Waiting for the previous background detach before attaching (the papers' "A Stall").
    pub stall_ns: u64,
    /// The iterations on the window: compute plus every fault they take.
    pub workload_ns: u64,
    /// Dirty-page collection plus `Session::psync`.
    pub psync_ns: u64,
    /// Pager detach plus the nonblocking `Session::detach` call.
    pub detach_ns: u64,
    /// Creating and destroying PMOs during the run (the applications' files; 0 for the
    /// microbenchmarks, whose PMO is made before the run).
    pub create_ns: u64,
    /// Attach sessions in the run.
    pub sessions: u64,
    /// Psyncs in the run.
    pub psyncs: u64,
    /// Dirty pages all psyncs wrote (what psync time scales with).
    pub psync_pages: u64,
    /// Demand faults the pager served (all sessions).
    pub faults: u64,
    /// Demand faults on pages predicted but not yet installed.
    pub late: u64,
    /// Write-protect faults: first writes to pages installed read-only for dirty tracking
    /// (demand-read and prefetched pages); each is a uffd round trip without crypto.
    pub wp_faults: u64,
    /// The pager's own prediction counters, summed over sessions (for its estimate).
    pub est: PredictionCounts,
    /// Time the pager's fault threads spent serving the demand faults (`SliceStats::
    /// fault_ns_total`): the part of "fault" spent in the fill and install, without the
    /// faulting thread's wait for a fault thread to pick the fault up.
    pub fault_service_ns: u64,
}

impl Breakdown {
    /// Everything but compute: what the run cost end to end.
    pub fn total_ns(&self) -> u64 {
        self.attach_ns
            + self.stall_ns
            + self.workload_ns
            + self.psync_ns
            + self.detach_ns
            + self.create_ns
    }
}

/// What one session's pages did (from `Pager::page_sets`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionPages {
    /// Pages a demand fault decrypted.
    pub demand: Vec<u64>,
    /// Pages handed to the prefetch worker.
    pub prefetched: Vec<u64>,
    /// Demand faults on predicted pages not installed yet.
    pub late: u64,
}

/// Result of one cell.
#[derive(Debug, Clone, Default)]
pub struct CellResult {
    /// Where the time went.
    pub breakdown: Breakdown,
    /// Per session, for the exact prediction metrics.
    pub sessions: Vec<SessionPages>,
    /// Checksum of the psynced result (equal to the plain-memory run's, or the cell failed).
    pub checksum: u64,
}
