//! Design `c` attachments the guest loads and stores in the expander's own memory (LPMO C): a
//! [`WorkingCopy`] mapped into the guest right after the pager's window, through whatever the
//! front end's VMM maps guest memory with ([`GuestMapper`]: pmovmm's virtio transport makes a
//! KVM memslot in the device's shared-memory region).

use std::sync::{Arc, Mutex};

use cxl_t3::WorkingArea;
use pmo_store::Session;

use crate::working::{WorkingCopy, WorkingError};
use crate::Failure;

/// Why a working copy could not be mapped into the guest.
pub type MapError = Box<dyn std::error::Error + Send + Sync>;

/// A live mapping made by a [`GuestMapper`]: dropping it takes the memory out of the guest.
pub struct GuestMapping {
    _owner: Box<dyn Send + Sync>,
}

impl GuestMapping {
    /// Wraps the VMM's owner of the mapping (whose drop unmaps it).
    pub fn new(owner: Box<dyn Send + Sync>) -> Self {
        GuestMapping { _owner: owner }
    }
}

/// Maps host memory into the guest in the PMO device's address range, after the window.
/// Implemented by each VMM's front end.
pub trait GuestMapper: Send + Sync {
    /// Maps `len` bytes at `host_addr` at `offset` bytes into the PMO device's range (the
    /// window first, then the working area); the guest sees them there until the returned
    /// mapping is dropped. A `read_only` mapping refuses guest stores.
    ///
    /// # Safety
    /// `host_addr..host_addr + len` must stay mapped in this process for as long as the
    /// returned [`GuestMapping`] lives.
    unsafe fn map(
        &self,
        offset: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<GuestMapping, MapError>;
}

/// The working area and the means to map its extents into the guest, as the front end
/// provides them (the area when the store's expander is known, the mapper when the guest's
/// transport is up).
#[derive(Default)]
pub(crate) struct DirectSetup {
    area: Option<Arc<WorkingArea>>,
    mapper: Option<Arc<dyn GuestMapper>>,
}

impl DirectSetup {
    pub fn set_area(&mut self, area: Arc<WorkingArea>) {
        self.area = Some(area);
    }

    pub fn set_mapper(&mut self, mapper: Arc<dyn GuestMapper>) {
        self.mapper = Some(mapper);
    }

    /// Bytes of guest address space after the window that direct attachments can take.
    pub fn len(&self) -> u64 {
        self.area.as_ref().map_or(0, |a| a.len())
    }

    /// Both halves, once the transport has handed over its mapper.
    pub fn ready(&self) -> Option<(Arc<WorkingArea>, Arc<dyn GuestMapper>)> {
        Some((self.area.clone()?, self.mapper.clone()?))
    }
}

/// A design `c` attachment's working copy and, when a guest uses it, its place there.
pub(crate) struct DirectCopy {
    /// The guest's view of the copy; taken (and so unmapped) before the copy goes.
    mapping: Mutex<Option<GuestMapping>>,
    copy: WorkingCopy,
    /// Where the copy's first byte is: the offset in the device's range the guest maps, or
    /// for a copy no guest maps, its offset in the working area.
    offset: u64,
}

impl DirectCopy {
    /// Makes the working copy of `session` in `area`, for a program on the host that touches
    /// it at [`DirectCopy::host_addr`].
    pub fn on_host(session: &Session, area: &Arc<WorkingArea>) -> Result<Self, WorkingError> {
        let copy = WorkingCopy::attach(session, area)?;
        Ok(DirectCopy {
            mapping: Mutex::new(None),
            offset: copy.offset(),
            copy,
        })
    }

    /// Makes the working copy of `session` in `area` and maps it for the guest at
    /// `window_len` + its offset in the area.
    pub fn in_guest(
        session: &Session,
        area: &Arc<WorkingArea>,
        mapper: &dyn GuestMapper,
        window_len: u64,
        writable: bool,
    ) -> Result<Self, Failure> {
        let copy = WorkingCopy::attach(session, area).map_err(|e| {
            log::warn!("pmo: design c working copy: {e}");
            Failure::from(&e)
        })?;
        let offset = window_len
            .checked_add(copy.offset())
            .ok_or(Failure::NoMemory)?;
        // SAFETY: the copy's host range is the expander's DPA mapping, which stays mapped
        // while the copy (holding the expander) lives; `DirectCopy` drops the mapping before
        // the copy, in `unmap` or by field order.
        let mapping = unsafe { mapper.map(offset, copy.host_addr(), copy.len(), !writable) }
            .map_err(|e| {
                log::warn!("pmo: map the working copy into the guest: {e}");
                Failure::NoMemory
            })?;
        Ok(DirectCopy {
            mapping: Mutex::new(Some(mapping)),
            copy,
            offset,
        })
    }

    /// The copy's offset in the device's range (in the working area for a host copy).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Host address of the copy's first byte.
    pub fn host_addr(&self) -> u64 {
        self.copy.host_addr()
    }

    /// Takes the working copy out of the guest (detach: before the session ends).
    pub fn unmap(&self) {
        if let Ok(mut m) = self.mapping.lock() {
            m.take();
        }
    }

    /// Persists every page written since the last psync; returns how many.
    pub fn psync(&self, session: &Session) -> Result<u64, WorkingError> {
        self.copy.psync(session)
    }

    /// The first page of the working copy the expander refused (see
    /// [`WorkingCopy::failed_page`]).
    pub fn failed_page(&self) -> Option<u64> {
        self.copy.failed_page()
    }
}
