//! The extent-key hooks of a medium that encrypts PMO extents itself (the CXL expander's TEE
//! range keys), apart from byte I/O: the store announces each PMO extent before it touches it
//! and releases it after scrubbing it; a medium without inline encryption has no such hooks.

use crate::MediumError;

/// One PMO extent as the store announces it: where it lies and whose it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The PMO's table slot.
    pub slot: u32,
    /// Offset of the extent on the medium.
    pub off: u64,
    /// Length of the extent.
    pub len: u64,
    /// What makes this PMO's extent key its own: the store passes a digest of the PMO's random
    /// uid, salt and key-check value, fixed at create and stored in its record. A PMO created
    /// later in the same slot and place has another owner (fresh randomness), and a tenant
    /// cannot copy a destroyed PMO's owner into its own record and still attach (its key check
    /// would fail), so no two PMOs share an extent key.
    pub owner: [u8; 32],
}

/// A medium that encrypts PMO extents inline, one key per extent (the CXL expander's
/// `CxlMedium`). The store takes it beside the [`Medium`](crate::Medium) ([`Backing`](crate::Backing)).
pub trait ExtentKeys: Send + Sync {
    /// The store is about to use `extent` (creating its PMO, or found at open before recovery
    /// touches it): key it for its owner. Announced again for the same owner, nothing changes.
    fn extent_in_use(&self, extent: &Extent) -> Result<(), MediumError>;
    /// The extent of slot `slot` was scrubbed and freed: its key may go.
    fn extent_released(&self, slot: u32) -> Result<(), MediumError>;
    /// True only when the medium itself encrypts every byte of `extent`, for its owner, before
    /// it reaches persistent media (a keyed range covering exactly that extent). A PMO whose
    /// pages carry no software cipher (`tee-blake3`, the CXL designs) may live only there.
    fn extent_encrypted(&self, extent: &Extent) -> bool;
}
