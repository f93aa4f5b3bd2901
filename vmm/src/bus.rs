//! Routes vCPU port I/O and MMIO exits to the device that owns the address.
//!
//! Two buses exist (PIO and MMIO). Ranges never overlap; a PCI BAR that the
//! guest moves is removed and inserted again. Lookups take a read lock only,
//! so vCPUs do not serialise on the bus itself, only on the device they hit.

use locked::{Locked, RwLocked};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

/// A device that answers guest accesses within its range.
pub trait BusDevice: Send {
    /// `offset` is relative to the start of the registered range.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Errors changing the bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap { base: u64, len: u64 },
    #[error("range {base:#x}+{len:#x} is empty or wraps")]
    BadRange { base: u64, len: u64 },
    #[error("no device at {0:#x}")]
    NotFound(u64),
}

struct Entry {
    len: u64,
    dev: Arc<Mutex<dyn BusDevice>>,
}

/// A set of non-overlapping address ranges, each owned by one device.
#[derive(Default)]
pub struct Bus {
    ranges: RwLock<BTreeMap<u64, Entry>>,
}

impl Bus {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `dev` for `[base, base + len)`.
    pub fn insert(
        &self,
        base: u64,
        len: u64,
        dev: Arc<Mutex<dyn BusDevice>>,
    ) -> Result<(), BusError> {
        if len == 0 || base.checked_add(len).is_none() {
            return Err(BusError::BadRange { base, len });
        }
        let mut ranges = self.ranges.write_locked();
        if let Some((&b, e)) = ranges.range(..base.saturating_add(len)).next_back() {
            if b + e.len > base {
                return Err(BusError::Overlap { base, len });
            }
        }
        ranges.insert(base, Entry { len, dev });
        Ok(())
    }

    /// Unregisters the range starting at `base`.
    pub fn remove(&self, base: u64) -> Result<(), BusError> {
        let mut ranges = self.ranges.write_locked();
        ranges
            .remove(&base)
            .map(|_| ())
            .ok_or(BusError::NotFound(base))
    }

    fn find(&self, addr: u64) -> Option<(u64, Arc<Mutex<dyn BusDevice>>)> {
        let ranges = self.ranges.read_locked();
        let (&base, e) = ranges.range(..=addr).next_back()?;
        (addr - base < e.len).then(|| (base, e.dev.clone()))
    }

    /// Serves a guest read; returns false (and leaves `data` as all-ones) if nothing is there.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((base, dev)) => {
                dev.locked().read(addr - base, data);
                true
            }
            None => {
                data.fill(0xff);
                false
            }
        }
    }

    /// Serves a guest write; returns false if nothing is there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((base, dev)) => {
                dev.locked().write(addr - base, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Reg(u8);
    impl BusDevice for Reg {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(self.0.wrapping_add(offset as u8));
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0 = data[0];
        }
    }

    #[test]
    fn routes_by_range_and_rejects_overlap() {
        let bus = Bus::new();
        bus.insert(0x100, 0x10, Arc::new(Mutex::new(Reg(1))))
            .unwrap();
        bus.insert(0x110, 0x10, Arc::new(Mutex::new(Reg(7))))
            .unwrap();
        assert_eq!(
            bus.insert(0x10f, 2, Arc::new(Mutex::new(Reg(0)))),
            Err(BusError::Overlap {
                base: 0x10f,
                len: 2
            })
        );
        assert_eq!(
            bus.insert(0xf0, 0x11, Arc::new(Mutex::new(Reg(0)))),
            Err(BusError::Overlap {
                base: 0xf0,
                len: 0x11
            })
        );
        let mut b = [0u8; 1];
        assert!(bus.read(0x103, &mut b));
        assert_eq!(b[0], 4);
        assert!(bus.write(0x111, &[9]));
        assert!(bus.read(0x110, &mut b));
        assert_eq!(b[0], 9);
        assert!(!bus.read(0x120, &mut b));
        assert_eq!(b[0], 0xff);
        bus.remove(0x110).unwrap();
        assert!(!bus.write(0x111, &[1]));
        assert_eq!(bus.remove(0x110), Err(BusError::NotFound(0x110)));
        assert!(bus
            .insert(u64::MAX, 2, Arc::new(Mutex::new(Reg(0))))
            .is_err());
    }
}
