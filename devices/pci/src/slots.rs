//! How a device's memory gets into the guest's physical address space: the VMM maps host memory
//! at a guest-physical address (pmovmm: a KVM memslot) and takes it away again when the slot
//! is dropped.

/// Why a mapping could not be made (the VMM's own error, e.g. KVM's).
pub type SlotError = Box<dyn std::error::Error + Send + Sync>;

/// A live guest mapping: dropping it removes the range from the guest.
pub type GuestSlot = Box<dyn Send>;

/// Maps host memory into the guest; shared by the transports that need it.
pub trait GuestSlots: Send + Sync {
    /// Maps guest-physical `[gpa, gpa + len)` onto host `[host_addr, host_addr + len)`,
    /// read-only for the guest if `read_only`.
    ///
    /// # Safety
    /// `[host_addr, host_addr + len)` must stay mapped for as long as the returned slot lives.
    unsafe fn map(
        &self,
        gpa: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<GuestSlot, SlotError>;
}
