//! The PMO store: encrypted persistent memory objects on a medium.
//!
//! Three parts: the medium that persists bytes (crate `pmo-media`: a file, or a test medium
//! that crashes or is killed on cue; with the extent keys of a medium that encrypts PMO extents
//! itself), the crypto that protects pages (crate `pmo-crypto`: Argon2id root key, per-page
//! AES-GCM or AES-XTS with keyed tags), and the store proper (this crate): the on-media
//! format, crash-atomic psync, recovery and the designs of the papers. The ciphers and the
//! medium live in their own crates because the CXL expander uses them too and must not depend
//! on the store. It knows nothing of virtio or userfaultfd: the PMO device and the host tools
//! use it, and it runs on the CXL expander through `pmo-media`'s traits.
//!
//! Layout of a medium (all little endian; see docs/store.md):
//!
//! ```text
//! 0        superblock copy A          (4 KiB)
//! 4 KiB    superblock copy B          (4 KiB)
//! 8 KiB    PMO table: slots x 1 KiB   (two 512-byte record copies per slot)
//! 2 MiB-aligned data area: one extent per PMO =
//!          [ primaries: npages x 4 KiB ][ tree: leaves (version, tag) + interior hashes ][ journal area ]
//! ```
//!
//! Invariants kept here: the medium only ever holds ciphertext; a page reaches the caller only
//! after its tag and tree path verified; every metadata update is a crash-atomic record write;
//! psync commits through a redo journal in the journal area.

mod admit;
mod alloc;
pub mod anchor;
mod codec;
pub mod design;
mod error;
mod extents;
mod journal;
mod options;
pub mod record;
mod recovery;
mod session;
mod state;
mod store;
pub mod superblock;
pub mod tree;

pub use alloc::AllocError;
pub use design::{Design, UnknownDesign};
pub use journal::JournalError;
pub use record::{PmoState, RecordError};
pub use recovery::{FsckReport, RecoveryAction, RecoveryReport};
pub use session::{DetachHandle, Session};
pub use superblock::SuperblockError;
pub use tree::TreeError;

pub use anchor::{Anchor, AnchorEntry, AnchorError};
pub use error::StoreError;
pub use options::{CreateOptions, OpenOptions, Perm, PmoInfo, StoreOptions};
pub(crate) use state::{Catalog, ExtentGeometry, Holders, LivePmo, LiveRecord, StoreState};
pub use store::{validate_name, validate_size, Store};

/// Largest PMO: 64 GiB.
pub const MAX_PMO_SIZE: u64 = 64 << 30;
/// Most PMO table slots a store gets by default (a 512 MiB store or larger).
pub const DEFAULT_SLOTS: u32 = 65_536;
/// Alignment of PMO extents.
const EXTENT_ALIGN: u64 = 64 << 10;
