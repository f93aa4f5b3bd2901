//! What callers choose when they format or open a store, create or attach a PMO, and what
//! they are told about a PMO.

use crate::{Design, PmoState};
use pmo_crypto::{ExternalSuites, KdfParams, Suite};
use std::path::PathBuf;

/// Access mode of an attach session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    /// Read only; many at once.
    Read,
    /// Read and write; exclusive.
    Write,
}

/// Options for formatting a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Number of PMO table slots (the most PMOs the store can hold); `None`: sized to the
    /// medium ([`Superblock::slots_for`](crate::superblock::Superblock::slots_for)).
    pub slots: Option<u32>,
    /// Rollback anchor to create for the new store (see [`anchor`]).
    pub anchor: Option<PathBuf>,
    /// Key-derivation cost of PMOs created through this handle without their own
    /// (not stored: each PMO's own cost is in its record).
    pub kdf: KdfParams,
    /// Bytes of the medium the store occupies, from its start; `None`: all of it. The rest is
    /// left to the medium's owner (the VMM keeps it for working copies on a CXL expander);
    /// the store's superblock records the length, so later opens keep to it.
    pub len: Option<u64>,
    /// Page suites of other crates this handle may create, seal and open: the registration
    /// point of the design-comparison harness's benchmark-only suites. Empty in every product
    /// program, whose handles then refuse such PMOs.
    pub suites: ExternalSuites,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            len: None,
            slots: None,
            anchor: None,
            kdf: KdfParams::DEFAULT,
            suites: ExternalSuites::new(),
        }
    }
}

/// Options for opening a store.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Rollback anchor: the store is refused if it is older than the anchor; the anchor is
    /// created from the store if the file does not exist yet (see [`anchor`]).
    pub anchor: Option<PathBuf>,
    /// As [`StoreOptions::kdf`].
    pub kdf: KdfParams,
    /// The store's length, when the opener knows it (a store file spans its whole file):
    /// a superblock that says otherwise was edited, and the store is refused. `None`: the
    /// superblock's length is taken as long as it fits the medium (a store on part of an
    /// expander's media, whose rest is the working area).
    pub len: Option<u64>,
    /// As [`StoreOptions::suites`].
    pub suites: ExternalSuites,
}

/// Options for creating a PMO.
#[derive(Debug, Clone, Copy)]
pub struct CreateOptions {
    /// Default design of its attach sessions.
    pub design: Design,
    /// Page cipher and tag; `None`: the design's own ([`Design::default_suite`]).
    pub suite: Option<Suite>,
    /// Cost of deriving the PMO's root key from the user key (Argon2id); `None`: the store
    /// handle's default (see [`StoreOptions::kdf`]).
    pub kdf: Option<KdfParams>,
}

impl CreateOptions {
    /// The suite a PMO created with these options gets.
    pub fn suite(&self) -> Suite {
        self.suite.unwrap_or_else(|| self.design.default_suite())
    }
}

impl Default for CreateOptions {
    fn default() -> Self {
        Self {
            design: Design::D,
            suite: None,
            kdf: None,
        }
    }
}

/// What `list` reports per PMO (nothing secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmoInfo {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Persistent state.
    pub state: PmoState,
    /// Default design.
    pub design: Design,
    /// Suite.
    pub suite: Suite,
    /// Last completed psync epoch.
    pub epoch: u64,
    /// Table slot.
    pub slot: u32,
    /// Extent offset and length on the medium.
    pub extent: (u64, u64),
    /// Pages whose tag an `id` design still owes (nonzero only after a crash).
    pub pending_tags: u64,
}
