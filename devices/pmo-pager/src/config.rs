//! How a front end sets up its PMO service: one typed configuration, parsed once by the VMM
//! that reads the user's flags or file (pmovmm's `config/`, Cloud Hypervisor's `--pmo`), so that
//! nothing here holds a string that could still fail to parse.

use std::path::PathBuf;

use pmo_policies::{PlacementPolicy, PredictorSpec};
use pmo_store::{Design, StoreOptions};

/// The PMO service of one VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmoConfig {
    /// The store file (or, for a store on an expander's media, that media: it names the
    /// store in errors and logs).
    pub store: PathBuf,
    /// Size to create the store file with when it does not exist.
    pub store_size: Option<u64>,
    /// Design of every attach session (`None`: each PMO's own).
    pub design: Option<Design>,
    /// Bytes of the window attached PMOs appear in (address space until touched).
    pub window_size: u64,
    /// Threads serving the window's faults.
    pub fault_threads: usize,
    /// Prefetch predictor of every attachment.
    pub predictor: PredictorSpec,
    /// The store's rollback anchor and the Argon2id cost of PMOs the guest creates (both
    /// always), and how a missing store is formatted (slots; ignored when the file exists).
    /// Tests and fuzz targets format small stores, which create and open in microseconds.
    pub store_options: StoreOptions,
    /// Keep the plaintext in the window within a DRAM budget, demoting to the CXL tier.
    pub dram_budget: Option<DramBudget>,
    /// What moving one page into or out of the store's expander's device memory costs, in ns
    /// (a working copy of design `cf`, dirty pages demoted under a DRAM budget); 0 for a
    /// store file.
    pub device_memory_latency_ns: u64,
    /// Test hook: kill the process at this persist point of every psync.
    pub test_kill_in_psync: Option<u64>,
}

/// The window's local-DRAM budget and its placement policy (`--pmo-dram SIZE[,policy=NAME]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DramBudget {
    /// Bytes of plaintext the window may hold, across all attachments.
    pub bytes: u64,
    /// Which pages leave DRAM first.
    pub placement: PlacementPolicy,
}
