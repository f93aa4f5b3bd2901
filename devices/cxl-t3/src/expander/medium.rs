//! A [`Medium`] over an expander, so a PMO store (designs C, CL, CF) can
//! live on CXL memory: reads and writes go through the device cache on the
//! host path, `persist` writes the covered dirty blocks back to media and
//! `fdatasync`s it.
//!
//! With an [`ExtentKeySource`] the medium also keys each PMO's extent as the
//! store announces it ([`ExtentKeys::extent_in_use`]): TEE range id = the
//! PMO's table slot, key = what the source returns for that extent. The
//! source is the PMO service's business (where the key comes from); this
//! only programs it and clears it at `extent_released`. The store gets both
//! halves from one [`Backing`] (`Backing::from(cxl_medium)`), so a keyed
//! medium's keys cannot be left behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use locked::Locked;
use pmo_media::{check_range, Backing, Extent, ExtentKeys, Medium, MediumError};
use zeroize::Zeroizing;

use super::{Expander, ExpanderError};

/// Gives the TEE key (32 or 64 bytes) for a PMO extent (offsets relative to
/// the medium); `None` leaves that extent unkeyed.
pub type ExtentKeySource = dyn Fn(&Extent) -> Option<Zeroizing<Vec<u8>>> + Send + Sync;

/// A window `[base, base+len)` of an expander's DPA space as a medium.
#[derive(Clone)]
pub struct CxlMedium {
    exp: Arc<Expander>,
    base: u64,
    len: u64,
    keys: Option<Arc<ExtentKeySource>>,
    /// Range id -> the owner (`Extent::owner`) this medium keyed it for. Shared by clones; a
    /// new medium over the same expander knows no owner and keys every extent afresh.
    owners: Arc<Mutex<HashMap<u16, [u8; 32]>>>,
}

impl std::fmt::Debug for CxlMedium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CxlMedium")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("extent_keys", &self.keys.is_some())
            .finish()
    }
}

impl CxlMedium {
    /// The whole DPA space.
    pub fn new(exp: Arc<Expander>) -> Self {
        let len = exp.size();
        Self {
            exp,
            base: 0,
            len,
            keys: None,
            owners: Arc::default(),
        }
    }

    /// A part of the DPA space (e.g. one keyed range).
    pub fn window(exp: Arc<Expander>, base: u64, len: u64) -> Result<Self, MediumError> {
        check_range(exp.size(), base, len)?;
        Ok(Self {
            exp,
            base,
            len,
            keys: None,
            owners: Arc::default(),
        })
    }

    /// Keys each PMO extent the store announces with the source's key
    /// (see the module doc). Extents must be 4 KiB aligned in DPA.
    pub fn with_extent_keys(mut self, keys: Arc<ExtentKeySource>) -> Self {
        self.keys = Some(keys);
        self
    }

    /// Keys each PMO extent with its own key from the PMO service's keyring
    /// (derived from the VMM's master key; nothing stored).
    pub fn with_keyring(self, keyring: pmo_crypto::ExtentKeyring) -> Self {
        self.with_extent_keys(Arc::new(move |e: &Extent| {
            Some(keyring.extent_key(e.slot, e.off, e.len, &e.owner))
        }))
    }

    /// True when reads may wait for the media's modelled latency (see
    /// [`Backing::with_reads_wait`]).
    pub fn reads_wait(&self) -> bool {
        !self.exp.media_latency().is_zero()
    }

    /// The expander underneath.
    pub fn expander(&self) -> &Arc<Expander> {
        &self.exp
    }
}

fn to_medium(what: &'static str, e: ExpanderError) -> MediumError {
    MediumError::Io {
        what,
        source: std::io::Error::other(e.to_string()),
    }
}

impl Medium for CxlMedium {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), MediumError> {
        check_range(self.len, off, buf.len() as u64)?;
        self.exp
            .read(self.base + off, buf)
            .map_err(|e| to_medium("cxl read", e))
    }

    fn write(&self, off: u64, data: &[u8]) -> Result<(), MediumError> {
        check_range(self.len, off, data.len() as u64)?;
        self.exp
            .write(self.base + off, data)
            .map_err(|e| to_medium("cxl write", e))
    }

    fn persist(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)?;
        self.exp
            .persist(self.base + off, len)
            .map_err(|e| to_medium("cxl persist", e))
    }

    fn zero(&self, off: u64, len: u64) -> Result<(), MediumError> {
        check_range(self.len, off, len)?;
        self.exp
            .zero(self.base + off, len)
            .map_err(|e| to_medium("cxl zero", e))
    }
}

/// The store's media on this expander window: its bytes, its extent keys
/// when it has a key source, and whether reads wait for media latency.
impl From<CxlMedium> for Backing {
    fn from(m: CxlMedium) -> Self {
        let reads_wait = m.reads_wait();
        let keyed = m.keys.is_some();
        let m = Arc::new(m);
        let media = Backing::new(m.clone()).with_reads_wait(reads_wait);
        if keyed {
            media.with_extent_keys(m)
        } else {
            media
        }
    }
}

impl ExtentKeys for CxlMedium {
    fn extent_in_use(&self, e: &Extent) -> Result<(), MediumError> {
        let Some(keys) = &self.keys else {
            return Ok(());
        };
        let (slot, off, len) = (e.slot, e.off, e.len);
        check_range(self.len, off, len)?;
        let id = range_id(slot)?;
        if self.exp.memory.working_id(id) {
            // A working extent's key (ids from 65535 down) must not be cleared or reused:
            // the extent stays unkeyed, which designs that need the range key refuse.
            log::warn!(
                "cxl: slot {slot}'s TEE range id is a working extent's; extent left unkeyed"
            );
            return Ok(());
        }
        let (start, end) = (self.base + off, self.base + off + len);
        // The owners' lock is taken before the expander's key changes, everywhere.
        let mut owners = self.owners.locked();
        // Announced again (a reopen): already keyed for exactly this extent and owner. Keyed
        // for another owner or place (a range left keyed by another medium, whose owner this
        // one cannot know): cleared and keyed again, so no PMO inherits another's key.
        match self.exp.range_key(id) {
            Some(r) if r == (start, end) && owners.get(&id) == Some(&e.owner) => return Ok(()),
            Some(_) => {
                owners.remove(&id);
                self.exp
                    .clear_range_key(id)
                    .map_err(|e| to_medium("cxl clear extent key", e))?
            }
            None => {}
        }
        let Some(key) = keys(e) else {
            return Ok(());
        };
        self.exp
            .set_range_key(id, start, end, &key)
            .map_err(|e| to_medium("cxl key extent", e))?;
        owners.insert(id, e.owner);
        Ok(())
    }

    fn extent_encrypted(&self, e: &Extent) -> bool {
        let (Ok(id), Some(_)) = (range_id(e.slot), &self.keys) else {
            return false;
        };
        let Some(end) = e.off.checked_add(e.len).filter(|end| *end <= self.len) else {
            return false;
        };
        let owners = self.owners.locked();
        owners.get(&id) == Some(&e.owner)
            && self.exp.range_key(id) == Some((self.base + e.off, self.base + end))
    }

    fn extent_released(&self, slot: u32) -> Result<(), MediumError> {
        if self.keys.is_none() {
            return Ok(());
        }
        let id = range_id(slot)?;
        let mut owners = self.owners.locked();
        if self.exp.range_key(id).is_none() || self.exp.memory.working_id(id) {
            return Ok(());
        }
        owners.remove(&id);
        self.exp
            .clear_range_key(id)
            .map_err(|e| to_medium("cxl clear extent key", e))
    }
}

/// TEE range ids are 16-bit: slots beyond that cannot be keyed.
fn range_id(slot: u32) -> Result<u16, MediumError> {
    u16::try_from(slot).map_err(|_| MediumError::Io {
        what: "cxl key extent",
        source: std::io::Error::other(format!("slot {slot} has no 16-bit TEE range id")),
    })
}
