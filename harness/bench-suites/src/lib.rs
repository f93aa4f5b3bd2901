//! The design comparison's benchmark-only page suites, kept out of every product program.
//!
//! - [`PAPER`] (`paper`): what the authors' kernel does, AES-XTS-256 with one tweak for every
//!   page and version of a PMO and an unkeyed SHA-256 of the ciphertext as its tag. Equal
//!   plaintexts show, and anyone who edits a page can recompute the hash. Kept so the benches
//!   and the weakness tests can compare against it.
//! - [`NOMAC`] (`xts-nomac-bench`): `xts-blake3`'s encryption with an all-zero tag that checks
//!   nothing, to measure the designs "without integrity" as the papers do.
//!
//! The store knows them only as [`Suite::External`] codes; a store handle seals and opens their
//! pages only when its options register [`suites`]. Only the design-comparison harness (and
//! tests and benches, as dev-dependencies) depends on this crate, so no product program can
//! create or open such a PMO whatever cargo features a build unifies: a product handle lists
//! one but refuses to attach it. `vmm/tests/product_binaries.rs` checks that no product
//! package's dependency graph contains this crate and that no `pmovmm` binary contains its
//! markers ([`MARKERS`]).

mod nomac;
mod paper;

use pmo_crypto::{ExternalSuites, Suite};
use std::sync::Arc;

pub use paper::paper_checksum;

/// The authors' scheme (on-media code 2, as before it moved here).
pub const PAPER: Suite = Suite::External(paper::CODE);
/// XTS without page integrity (on-media code 4, as before it moved here).
pub const NOMAC: Suite = Suite::External(nomac::CODE);

/// Byte strings only this crate's code puts into a binary: its crate name as symbols carry it,
/// a label of each suite's key derivation and the no-MAC suite's name. The product-binary test
/// looks for these (it keeps its own copy: it must not depend on this crate).
pub const MARKERS: &[&str] = &["pmo_bench_suites", paper::LABEL, nomac::LABEL, nomac::NAME];

/// Both suites, to put into a store's options (`StoreOptions::suites`, `OpenOptions::suites`).
pub fn suites() -> ExternalSuites {
    let both = ExternalSuites::new()
        .with(Arc::new(paper::Paper))
        .and_then(|s| s.with(Arc::new(nomac::NoMac)));
    match both {
        Ok(s) => s,
        // Codes 2 and 4 are neither built in nor registered twice (tested).
        Err(e) => unreachable!("benchmark suite codes: {e}"),
    }
}

#[cfg(test)]
mod tests;
