//! The PMO pager: what serves an attached PMO's pages to whoever touches them.
//!
//! The store (`pmo-store`) keeps PMOs encrypted at rest; this crate puts an attached PMO in
//! front of loads and stores: the [`Pager`] (the userfaultfd-backed window that holds the
//! plaintext working copies and decrypts a page on its first touch), a store session as the
//! pager's page [`source`], and design `c`'s [`working`] copies on a CXL expander, which bypass
//! the pager. It knows nothing of virtio or of any VMM: a VMM's PMO device and the host-side
//! harness both drive it.

pub mod pager;
pub mod source;
pub mod working;

pub use pager::{
    Detected, FillError, PageSource, Pager, PagerError, PredictionCounts, PredictionEstimate,
    SliceStats, HIST_BUCKETS,
};
