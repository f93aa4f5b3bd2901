//! The superblock: what a store is and where its regions lie. Two copies, each with its own
//! checksum, written once at format time; open takes any valid copy.

use super::codec::{checksum, Dec, Enc};
use crate::medium::{Medium, MediumError};

/// Magic at offset 0.
pub const MAGIC: &[u8; 8] = b"PMOSTOR1";
/// On-media format version. 2: record MAC over every bound field, Argon2id parameters,
/// commit numbers, and a generation in each tree leaf.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes reserved for one superblock copy.
pub const SB_SIZE: u64 = 4096;
/// Bytes of one PMO table slot (two record copies).
pub const SLOT_SIZE: u64 = 1024;
/// Alignment of the data area and of PMO extents.
pub const DATA_ALIGN: u64 = 1 << 21;

/// Superblock errors.
#[derive(Debug, thiserror::Error)]
pub enum SuperblockError {
    /// Neither copy is a valid superblock.
    #[error("no valid superblock (not a PMO store, or both copies damaged)")]
    Invalid,
    /// The store was made by a newer format.
    #[error("unsupported store format version {0}")]
    Version(u32),
    /// The superblock describes regions that do not fit the medium.
    #[error("superblock geometry does not fit the medium")]
    ExtentGeometry,
    /// The medium failed.
    #[error(transparent)]
    Medium(#[from] MediumError),
}

/// Decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Random store identifier.
    pub uuid: [u8; 16],
    /// Medium length when formatted.
    pub medium_len: u64,
    /// Number of PMO table slots.
    pub slots: u32,
    /// Offset of the PMO table.
    pub table_off: u64,
    /// Offset of the data area (extents).
    pub data_off: u64,
}

impl Superblock {
    /// ExtentGeometry for a new store.
    pub fn layout(uuid: [u8; 16], medium_len: u64, slots: u32) -> Result<Self, SuperblockError> {
        let table_off = 2 * SB_SIZE;
        let table_end = table_off + slots as u64 * SLOT_SIZE;
        let data_off = table_end.div_ceil(DATA_ALIGN) * DATA_ALIGN;
        let sb = Self {
            uuid,
            medium_len,
            slots,
            table_off,
            data_off,
        };
        if !sb.fits(medium_len) {
            return Err(SuperblockError::ExtentGeometry);
        }
        Ok(sb)
    }

    /// One copy as written, with its (unkeyed) checksum: public for tools, tamper tests and the
    /// store-image fuzz target, which edit a copy the way a keyless editor would.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.bytes(MAGIC)
            .u32(FORMAT_VERSION)
            .bytes(&self.uuid)
            .u64(self.medium_len)
            .u32(self.slots)
            .u64(self.table_off)
            .u64(self.data_off);
        let sum = checksum(&[&e.0]);
        e.bytes(&sum);
        e.0
    }

    /// Decodes one copy (checksum and version, not geometry: see [`Superblock::read`]).
    pub fn decode(b: &[u8]) -> Result<Self, SuperblockError> {
        let mut d = Dec::new(b);
        let bad = |_| SuperblockError::Invalid;
        if d.take(8).map_err(bad)? != MAGIC {
            return Err(SuperblockError::Invalid);
        }
        let version = d.u32().map_err(bad)?;
        let uuid = d.arr::<16>().map_err(bad)?;
        let medium_len = d.u64().map_err(bad)?;
        let slots = d.u32().map_err(bad)?;
        let table_off = d.u64().map_err(bad)?;
        let data_off = d.u64().map_err(bad)?;
        let body = 8 + 4 + 16 + 8 + 4 + 8 + 8;
        let sum = d.arr::<32>().map_err(bad)?;
        if checksum(&[&b[..body]]) != sum {
            return Err(SuperblockError::Invalid);
        }
        if version != FORMAT_VERSION {
            return Err(SuperblockError::Version(version));
        }
        Ok(Self {
            uuid,
            medium_len,
            slots,
            table_off,
            data_off,
        })
    }

    /// Writes both copies and persists them.
    pub fn write(&self, m: &dyn Medium) -> Result<(), SuperblockError> {
        let b = self.encode();
        for copy in 0..2 {
            m.write(copy * SB_SIZE, &b)?;
            m.persist(copy * SB_SIZE, b.len() as u64)?;
        }
        Ok(())
    }

    /// Reads the first valid copy and checks it against the medium. A copy whose checksum
    /// holds but whose geometry does not (an edited or damaged copy) is passed over for the
    /// other one, as a copy that fails its checksum is.
    pub fn read(m: &dyn Medium) -> Result<Self, SuperblockError> {
        let mut last = SuperblockError::Invalid;
        for copy in 0..2u64 {
            let mut b = vec![0u8; 128];
            if m.len() < (copy + 1) * SB_SIZE {
                break;
            }
            m.read(copy * SB_SIZE, &mut b)?;
            match Self::decode(&b) {
                Ok(sb) if sb.fits(m.len()) => return Ok(sb),
                Ok(_) => last = SuperblockError::ExtentGeometry,
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether the regions lie where `layout` puts them, inside a medium of `len` bytes: the
    /// table right after the two copies, the data area aligned and after the table.
    fn fits(&self, len: u64) -> bool {
        let table_end = u64::from(self.slots)
            .checked_mul(SLOT_SIZE)
            .and_then(|t| t.checked_add(self.table_off));
        self.slots > 0
            && self.table_off == 2 * SB_SIZE
            && self.medium_len <= len
            && matches!(table_end, Some(e) if e <= self.data_off)
            && self.data_off.is_multiple_of(DATA_ALIGN)
            && self.data_off < self.medium_len
    }

    /// Offset of record copy `copy` of table slot `slot`.
    pub fn record_off(&self, slot: u32, copy: u8) -> u64 {
        self.table_off + slot as u64 * SLOT_SIZE + copy as u64 * (SLOT_SIZE / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::medium::CrashMedium;

    fn write_copy(m: &CrashMedium, copy: u64, sb: &Superblock) {
        m.write(copy * SB_SIZE, &sb.encode()).unwrap();
    }

    #[test]
    fn a_copy_with_bad_geometry_falls_back_to_the_other() {
        let m = CrashMedium::new(64 << 20);
        let good = Superblock::layout([1; 16], 64 << 20, 16).unwrap();
        good.write(&m).unwrap();
        for bad in [
            Superblock {
                data_off: good.data_off + 4096, // unaligned data area
                ..good.clone()
            },
            Superblock {
                medium_len: 1 << 40, // larger than the medium
                ..good.clone()
            },
            Superblock {
                slots: u32::MAX, // table past the data area
                ..good.clone()
            },
            Superblock {
                table_off: 0, // table over the superblocks
                ..good.clone()
            },
        ] {
            write_copy(&m, 0, &bad);
            assert_eq!(Superblock::read(&m).unwrap(), good, "{bad:?}");
            write_copy(&m, 1, &bad);
            assert!(matches!(
                Superblock::read(&m),
                Err(SuperblockError::ExtentGeometry)
            ));
            good.write(&m).unwrap();
        }
    }

    #[test]
    fn layout_refuses_what_does_not_fit() {
        assert!(Superblock::layout([0; 16], 1 << 20, 16).is_err());
        assert!(Superblock::layout([0; 16], 64 << 20, 0).is_err());
        let sb = Superblock::layout([0; 16], 64 << 20, 16).unwrap();
        assert!(sb.data_off.is_multiple_of(DATA_ALIGN));
    }
}
