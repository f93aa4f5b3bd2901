//! Fuzz target bodies for pmovmm's guest-facing parsers and state machines.
//!
//! Each target is a plain `fn run(data: &[u8])` that panics when its oracle
//! is violated. Two drivers call the same bodies:
//!
//! - `fuzz/` (cargo-fuzz, nightly, libFuzzer + AddressSanitizer): one thin
//!   `fuzz_target!` wrapper per target, coverage-guided;
//! - `cargo test` on stable (`tests/loops.rs`): every saved regression input
//!   under `regressions/<target>/`, then a bounded number of inputs from a
//!   seeded PRNG, so CI without nightly still runs every body.
//!
//! The targets (docs/fuzzing.md says what each covers and its oracle):
//!
//! | target | what |
//! |---|---|
//! | [`pmo_service`] | virtio-pmo requests: `proto::parse` + `PmoService::execute` on a real store file and a real userfaultfd window, window touched from a host thread |
//! | [`cxl_mailbox`] | the CXL Type 3 register BAR (component + device blocks), mailbox commands, HDM decoders |
//! | [`virtio_pci`] | the virtio-pci transport: common config, ISR, device config, notify, MSI-X table/PBA, PCI config space |
//! | [`virtio_chains`] | descriptor chains on a split queue into virtio-pmem's and virtio-pmo's request handlers |
//! | [`store_image`] | the PMO store on images a keyless editor changed (record, superblock, tree and journal fields with every unkeyed checksum recomputed): open, fsck, attach, fault, psync, destroy |

pub mod common;
pub mod cxl_mailbox;
pub mod pmo_service;
pub mod store_image;
pub mod virtio_chains;
pub mod virtio_pci;

/// A target body: runs one input, panics when the oracle is violated.
pub type Body = fn(&[u8]);

/// Every target by name, for the stable loops and `scripts/fuzz.sh`.
pub const TARGETS: &[(&str, Body)] = &[
    ("pmo_service", pmo_service::run),
    ("cxl_mailbox", cxl_mailbox::run),
    ("virtio_pci", virtio_pci::run),
    ("virtio_chains", virtio_chains::run),
    ("store_image", store_image::run),
];
