//! Host-side PMO workloads and the design comparison harness (issue 5).
//!
//! The papers' microbenchmarks ([`workloads`]) run over a PMO's memory: the pager's userfaultfd
//! window, with host threads playing the vCPUs, at native speed. [`engine`] drives one cell of
//! the comparison (workload × design × integrity × threads) through the real store and pager and
//! times it the way the papers break execution time down; [`metrics`] computes exact prediction
//! accuracy, coverage and timeliness from the pager's page sets; [`report`] prints the tables,
//! the CSV and the targets. [`apps`] runs the real applications (YCSB A-F on LMDB,
//! Filebench's four personalities) through a `pmo_host::PmoHost` for every design, and on the
//! floor a tenant would otherwise use. `scripts/compare.sh` runs the whole matrix; see
//! docs/compare.md. [`tiering`] is the DRAM/CXL tiering evaluation (docs/tiering.md); [`cli`]
//! the command lines of the two binaries, `pmo-compare` and `pmo-tiering`.

pub mod apps;
pub mod cli;
pub mod cxl_store;
pub mod engine;
pub mod metrics;
pub mod pmalloc;
pub mod report;
pub mod tiering;
pub mod workloads;
