//! The PMO pager and attachment lifecycle: what serves an attached PMO's pages to whoever
//! touches them, for every front end.
//!
//! The store (`pmo-store`) keeps PMOs encrypted at rest; this crate puts them in front of
//! loads and stores:
//! - the [`Pager`]: the userfaultfd-backed window that holds the plaintext working copies and
//!   decrypts a page on its first touch, with prefetch and DRAM/CXL tiering;
//! - a store session as the pager's page [`source`], and design `c`'s [`working`] copies on a
//!   CXL expander, which bypass the pager ([`direct`]: mapped into a guest);
//! - the one [`Attachment`] lifecycle (attach, psync, detach, in that order of steps for
//!   every front end) and the [`PmoService`] of a VM: the store, the window, the attachments
//!   by handle, every PMO call and its [`Failure`].
//!
//! It knows nothing of virtio or of any VMM: a VMM's PMO device parses its wire requests and
//! calls the service ([`GuestMapper`] and [`PageEvents`] are how it plugs its guest in); the
//! host-side harness and applications hold [`Attachment`]s directly. Its configuration is
//! typed ([`PmoConfig`]), parsed once by the VMM.

pub mod attachment;
pub mod config;
pub mod direct;
pub mod events;
mod failure;
pub mod pager;
pub mod service;
pub mod source;
pub mod working;

pub use attachment::{
    AttachOptions, Attachment, AttachmentError, AttachmentStat, Detached, WorkingPlace,
};
pub use config::{DramBudget, PmoConfig};
pub use direct::{GuestMapper, GuestMapping, MapError};
pub use events::{PageEvent, PageEvents};
pub use failure::Failure;
pub use pager::{
    Detected, FillError, PageSets, PageSource, Pager, PagerError, PredictionCounts,
    PredictionEstimate, SliceStats, TierStats, HIST_BUCKETS,
};
pub use service::{Attached, ListEntry, Listed, PmoService, ServiceCounters, ServiceError};
