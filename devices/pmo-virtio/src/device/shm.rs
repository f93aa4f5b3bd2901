//! The PMO service maps design `c` working copies into the guest through the transport's
//! shared-memory mapper: region 0, after the window.

use std::sync::Arc;

use pmo_pager::{GuestMapper, GuestMapping, MapError};
use virtio_devices::ShmMapper;

/// The transport's [`ShmMapper`] as the service's [`GuestMapper`].
pub(crate) struct ShmGuestMapper(pub(crate) Arc<dyn ShmMapper>);

impl GuestMapper for ShmGuestMapper {
    unsafe fn map(
        &self,
        offset: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<GuestMapping, MapError> {
        // SAFETY: the caller keeps `host_addr..+len` mapped while the returned mapping lives
        // (this trait's contract), which is what the transport's mapper asks.
        let m = unsafe { self.0.map(0, offset, host_addr, len, read_only) }?;
        Ok(GuestMapping::new(Box::new(m)))
    }
}
