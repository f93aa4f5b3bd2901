//! A design `c` working copy on the CXL expander (LPMO C): the PMO's plaintext in a working
//! extent of the expander's memory, which the guest (or a host thread playing one) loads and
//! stores directly, with psync persisting the pages written since the last one.
//!
//! Attach copies every page of the PMO into a new extent of the working area, checking each
//! page's tag, under a range key made for this copy alone. Accesses then go to the expander's
//! DPA mapping: its fault threads fill and evict blocks, charging media latency, and record the
//! pages written (a write-protect fault on the first store after each psync). psync copies
//! those pages out to a stable buffer and commits them through the store's temporary shadow
//! copy, as for `cl`. Dropping the copy wipes the extent: its blocks leave the device cache
//! without a write-back, zero blocks go to the media and its key is cleared. The device maps
//! the extent into the guest (`direct.rs`); the comparison harness touches it from
//! host threads.

use std::sync::Arc;

use cxl_t3::expander::ExpanderError;
use cxl_t3::{WorkingArea, WorkingExtent};
use pmo_crypto::{wipe, PAGE};
use pmo_store::{Session, StoreError};

/// Errors of a working copy.
#[derive(Debug, thiserror::Error)]
pub enum WorkingError {
    /// The working area has no room (or no free range id) for the copy.
    #[error("no room for a working copy of {len} bytes: {source}")]
    NoRoom {
        /// The copy's size.
        len: u64,
        /// What the expander said.
        source: ExpanderError,
    },
    /// A page of the PMO failed verification while it was copied in, or a block of the
    /// working copy came back from the media other than it was written (see
    /// [`WorkingCopy::failed_page`]).
    #[error("page {0} failed integrity verification")]
    Integrity(u64),
    /// The store failed to read a page or to persist the written ones.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// Reading or writing the working extent failed.
    #[error("working extent: {0}")]
    Expander(#[from] ExpanderError),
    /// The PMO's size in bytes does not fit the address space.
    #[error("a PMO of {0} pages is too large for a working copy")]
    TooLarge(u64),
}

/// The working copy of one attachment.
pub struct WorkingCopy {
    extent: WorkingExtent,
}

impl WorkingCopy {
    /// Copies every page of `session`'s PMO, verified, into a new extent of `area`.
    pub fn attach(session: &Session, area: &Arc<WorkingArea>) -> Result<Self, WorkingError> {
        let pages = session.pages();
        let len = pages
            .checked_mul(PAGE as u64)
            .ok_or(WorkingError::TooLarge(pages))?;
        let extent = area
            .alloc(len)
            .map_err(|source| WorkingError::NoRoom { len, source })?;
        let mut page = Box::new([0u8; PAGE]);
        let copied = (0..pages).try_for_each(|p| {
            session.fault(p, &mut page).map_err(|e| match e {
                StoreError::Integrity { page } => WorkingError::Integrity(page),
                e => WorkingError::Store(e),
            })?;
            Ok::<_, WorkingError>(extent.write(p * PAGE as u64, &page[..])?)
        });
        wipe(&mut page[..]);
        copied?;
        Ok(WorkingCopy { extent })
    }

    /// Host address of the copy's first byte: the expander's DPA mapping, valid while the
    /// copy lives.
    pub fn host_addr(&self) -> u64 {
        self.extent.host_addr()
    }

    /// The copy's size in bytes.
    pub fn len(&self) -> u64 {
        self.extent.len()
    }

    /// Always false: a PMO has at least one page.
    pub fn is_empty(&self) -> bool {
        self.extent.len() == 0
    }

    /// Where the copy lies in the working area (the guest sees it at the same offset after
    /// the window).
    pub fn offset(&self) -> u64 {
        self.extent.offset()
    }

    /// The first page of the copy the expander refused since attach: its block came back
    /// from the media other than it was written there (a keyless editor changed or rolled it
    /// back), and it read as zeros. From then on the copy is not trusted: psync refuses.
    pub fn failed_page(&self) -> Option<u64> {
        match self.extent.integrity_failures() {
            0 => None,
            _ => Some(self.extent.first_failed_page().unwrap_or(0)),
        }
    }

    /// Persists every page written since the last psync, atomically; returns how many.
    /// On failure the pages stay to be persisted by the next psync. Once a page of the copy
    /// was refused ([`WorkingCopy::failed_page`]) nothing is persisted any more: the zeros it
    /// read as, or anything computed from them, must not reach the PMO.
    pub fn psync(&self, session: &Session) -> Result<u64, WorkingError> {
        if let Some(p) = self.failed_page() {
            return Err(WorkingError::Integrity(p));
        }
        let written = self.extent.take_written()?;
        if written.is_empty() {
            return Ok(0);
        }
        // A stable copy: stores may land on these pages meanwhile, and a page's tag and its
        // bytes on the medium must be of the same bytes.
        let mut data = vec![0u8; written.len() * PAGE];
        let r = self.persist(session, &written, &mut data);
        wipe(&mut data);
        if r.is_err() {
            self.extent.mark_written(&written);
        }
        r.map(|()| written.len() as u64)
    }

    fn persist(
        &self,
        session: &Session,
        pages: &[u64],
        data: &mut [u8],
    ) -> Result<(), WorkingError> {
        for (&p, buf) in pages.iter().zip(data.chunks_exact_mut(PAGE)) {
            self.extent.read(p * PAGE as u64, buf)?;
        }
        // A page refused while it was read here, after the check in `psync`.
        if let Some(p) = self.failed_page() {
            return Err(WorkingError::Integrity(p));
        }
        let pages_data = pages
            .iter()
            .zip(data.chunks_exact(PAGE))
            .filter_map(|(&p, d)| {
                let d: &[u8; PAGE] = d.try_into().ok()?;
                Some((p, d))
            });
        Ok(session.psync(pages_data)?)
    }
}
