//! The superblock: what a store is and where its regions lie. Two copies, each with its own
//! checksum, written once at format time; open takes any valid copy.

use super::codec::{checksum, Dec, Enc};
use crate::medium::{Medium, MediumError};

/// Magic at offset 0.
pub const MAGIC: &[u8; 8] = b"PMOSTOR1";
/// On-media format version.
pub const FORMAT_VERSION: u32 = 1;
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
    Geometry,
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
    /// Geometry for a new store.
    pub fn layout(uuid: [u8; 16], medium_len: u64, slots: u32) -> Result<Self, SuperblockError> {
        let table_off = 2 * SB_SIZE;
        let table_end = table_off + slots as u64 * SLOT_SIZE;
        let data_off = table_end.div_ceil(DATA_ALIGN) * DATA_ALIGN;
        if slots == 0 || data_off >= medium_len {
            return Err(SuperblockError::Geometry);
        }
        Ok(Self {
            uuid,
            medium_len,
            slots,
            table_off,
            data_off,
        })
    }

    fn encode(&self) -> Vec<u8> {
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

    fn decode(b: &[u8]) -> Result<Self, SuperblockError> {
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

    /// Reads the first valid copy and checks it against the medium.
    pub fn read(m: &dyn Medium) -> Result<Self, SuperblockError> {
        let mut last = SuperblockError::Invalid;
        for copy in 0..2u64 {
            let mut b = vec![0u8; 128];
            if m.len() < (copy + 1) * SB_SIZE {
                break;
            }
            m.read(copy * SB_SIZE, &mut b)?;
            match Self::decode(&b) {
                Ok(sb) => {
                    let table_end = (sb.slots as u64)
                        .checked_mul(SLOT_SIZE)
                        .and_then(|t| t.checked_add(sb.table_off));
                    let ok = sb.table_off == 2 * SB_SIZE
                        && sb.medium_len <= m.len()
                        && matches!(table_end, Some(e) if e <= sb.data_off)
                        && sb.data_off < sb.medium_len;
                    if !ok {
                        return Err(SuperblockError::Geometry);
                    }
                    return Ok(sb);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Offset of record copy `copy` of table slot `slot`.
    pub fn record_off(&self, slot: u32, copy: u8) -> u64 {
        self.table_off + slot as u64 * SLOT_SIZE + copy as u64 * (SLOT_SIZE / 2)
    }
}
