//! The store's side of a medium that keys PMO extents itself (the CXL expander's TEE range
//! keys): announcing and releasing extents, and refusing designs and suites that leave
//! encryption to the medium on an extent it does not encrypt. Creating, opening and attaching
//! all go through here, so no two of them decide it differently.

use crate::{Design, StoreError};
use pmo_crypto::{KeyParams, Suite};
use pmo_media::{Extent, ExtentKeys, MediumError};
use std::sync::Arc;

/// The extent `[off, off+len)` of the PMO in table slot `slot` whose record holds `keys` and
/// `kcv`, as a medium that keys extents is told about it. Its owner is a digest of the PMO's
/// uid, salt and key-check value: random per create (a PMO created in a destroyed PMO's slot
/// and place gets another range key), and not something another tenant can copy into its own
/// record and still attach (the key check of its own key would fail). The fields are read from
/// the record before anything verified them (open announces extents before recovery); an edit
/// changes the key, and the PMO then reads as garbage its page tags reject.
pub(crate) fn extent(slot: u32, off: u64, len: u64, keys: &KeyParams, kcv: &[u8; 32]) -> Extent {
    let mut h = blake3::Hasher::new_derive_key("pmovmm 2025 extent owner: uid, salt, key check");
    h.update(&keys.uid.to_le_bytes());
    h.update(&keys.salt);
    h.update(kcv);
    Extent {
        slot,
        off,
        len,
        owner: *h.finalize().as_bytes(),
    }
}

/// The extent keys of a store's media; none on a medium that encrypts nothing itself.
#[derive(Clone, Default)]
pub(crate) struct ExtentKeying(Option<Arc<dyn ExtentKeys>>);

impl ExtentKeying {
    pub fn new(keys: Option<Arc<dyn ExtentKeys>>) -> Self {
        Self(keys)
    }

    /// The store is about to use `extent` (create, or open before recovery touches it).
    pub fn in_use(&self, extent: &Extent) -> Result<(), MediumError> {
        match &self.0 {
            Some(k) => k.extent_in_use(extent),
            None => Ok(()),
        }
    }

    /// The extent of `slot` was scrubbed and freed.
    pub fn released(&self, slot: u32) -> Result<(), MediumError> {
        match &self.0 {
            Some(k) => k.extent_released(slot),
            None => Ok(()),
        }
    }

    /// Refuses a design or suite that leaves encryption to the medium (the CXL designs,
    /// `tee-blake3`) unless the medium encrypts the extent of PMO `name` itself: without a
    /// range key such pages would reach the media as plaintext.
    pub fn require_range_encryption(
        &self,
        name: &str,
        extent: &Extent,
        design: Design,
        suite: Suite,
    ) -> Result<(), StoreError> {
        let what = if design.needs_range_encryption() {
            format!("design {}", design.name())
        } else if suite.needs_range_encryption() {
            format!("suite {}", suite.name())
        } else {
            return Ok(());
        };
        if self.0.as_ref().is_some_and(|k| k.extent_encrypted(extent)) {
            Ok(())
        } else {
            Err(StoreError::NeedsRangeEncryption {
                name: name.to_string(),
                what,
            })
        }
    }
}
