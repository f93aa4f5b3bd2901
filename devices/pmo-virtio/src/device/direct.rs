//! Design `c` attachments the guest loads and stores in the expander's own memory (LPMO C):
//! a [`WorkingCopy`] mapped into the guest right after the pager's window, in the same shared
//! memory region, with a KVM memslot of its own while attached.

use std::sync::{Arc, Mutex};

use cxl_t3::WorkingArea;
use pmo_store::Session;
use virtio_devices::{ShmMapper, ShmMapping};

use super::service::store_status;
use crate::proto::Status;
use pmo_pager::working::{WorkingCopy, WorkingError};

/// The working area and the means to map its extents into the guest.
#[derive(Default)]
pub(super) struct DirectSetup {
    area: Option<Arc<WorkingArea>>,
    mapper: Option<Arc<dyn ShmMapper>>,
}

impl DirectSetup {
    pub fn set_area(&mut self, area: Arc<WorkingArea>) {
        self.area = Some(area);
    }

    pub fn set_mapper(&mut self, mapper: Arc<dyn ShmMapper>) {
        self.mapper = Some(mapper);
    }

    /// Bytes of guest address space after the window that direct attachments can take.
    pub fn len(&self) -> u64 {
        self.area.as_ref().map_or(0, |a| a.len())
    }

    /// Both halves, once the transport has handed over its mapper.
    pub fn ready(&self) -> Option<(Arc<WorkingArea>, Arc<dyn ShmMapper>)> {
        Some((self.area.clone()?, self.mapper.clone()?))
    }
}

/// The status a guest gets for a working-copy failure.
fn status(e: &WorkingError) -> Status {
    match e {
        WorkingError::NoRoom { .. } | WorkingError::TooLarge(_) => Status::NoMem,
        WorkingError::Integrity(_) => Status::BadMsg,
        WorkingError::Store(e) => store_status(e),
        WorkingError::Expander(_) => Status::Io,
    }
}

/// A design `c` attachment's working copy and its place in the guest.
pub(super) struct DirectCopy {
    /// The guest's view of the copy; taken (and so unmapped) before the copy goes.
    mapping: Mutex<Option<ShmMapping>>,
    copy: WorkingCopy,
}

impl DirectCopy {
    /// Makes the working copy of `session` in `area` and maps it for the guest at `window_len`
    /// + its offset in the area, in shared memory region 0. Returns it and that offset.
    pub fn attach(
        session: &Session,
        area: &Arc<WorkingArea>,
        mapper: &dyn ShmMapper,
        window_len: u64,
        writable: bool,
    ) -> Result<(Self, u64), Status> {
        let copy = WorkingCopy::attach(session, area).map_err(|e| {
            log::warn!("pmo: design c working copy: {e}");
            status(&e)
        })?;
        let offset = window_len.checked_add(copy.offset()).ok_or(Status::NoMem)?;
        // SAFETY: the copy's host range is the expander's DPA mapping, which stays mapped
        // while the copy (holding the expander) lives; `DirectCopy` drops the mapping before
        // the copy, in `unmap` or by field order.
        let mapping = unsafe { mapper.map(0, offset, copy.host_addr(), copy.len(), !writable) }
            .map_err(|e| {
                log::warn!("pmo: map the working copy into the guest: {e}");
                Status::NoMem
            })?;
        let direct = DirectCopy {
            mapping: Mutex::new(Some(mapping)),
            copy,
        };
        Ok((direct, offset))
    }

    /// Takes the working copy out of the guest (detach: before the session ends).
    pub fn unmap(&self) {
        if let Ok(mut m) = self.mapping.lock() {
            m.take();
        }
    }

    /// Persists every page the guest wrote since the last psync; returns how many.
    pub fn psync(&self, session: &Session) -> Result<u64, Status> {
        self.copy.psync(session).map_err(|e| {
            log::error!("pmo: psync of a design c working copy: {e}");
            status(&e)
        })
    }

    /// The first page of the working copy the expander refused (see
    /// [`WorkingCopy::failed_page`]).
    pub fn failed_page(&self) -> Option<u64> {
        self.copy.failed_page()
    }
}
