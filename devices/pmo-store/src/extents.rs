//! The store's side of a medium that keys PMO extents itself (the CXL expander's TEE range
//! keys): announcing and releasing extents, and refusing designs and suites that leave
//! encryption to the medium on an extent it does not encrypt. Creating, opening and attaching
//! all go through here, so no two of them decide it differently.

use crate::{Design, StoreError};
use pmo_crypto::Suite;
use pmo_media::{Extent, ExtentKeys, MediumError};
use std::sync::Arc;

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
