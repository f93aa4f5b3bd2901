//! The superblock: what a store is and where its regions lie. Two copies, each with its own
//! checksum, written once at format time; open takes any valid copy.

use super::codec::{checksum, Dec, Enc};
use crate::DEFAULT_SLOTS;
use pmo_media::{Medium, MediumError};

/// Magic at offset 0.
pub const MAGIC: &[u8; 8] = b"PMOSTOR1";
/// On-media format version. 2: record MAC over every bound field, Argon2id parameters,
/// commit numbers, and a generation in each tree leaf. 3: the record MAC also binds the
/// record's table slot and whether it is destroyed (a format 2 store is refused).
pub const FORMAT_VERSION: u32 = 3;
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
    /// A new store's PMO table and data area do not fit the medium.
    #[error(
        "a store of {len} bytes is too small for a table of {slots} PMOs: \
         it needs at least {min_mib} MiB (or fewer PMO slots)"
    )]
    TooSmall {
        /// The medium's length.
        len: u64,
        /// The PMO table slots asked for.
        slots: u32,
        /// The smallest medium, in MiB, with room for that table and one data block.
        min_mib: u64,
    },
    /// The superblock's store length is not the length the opener knows the store has (a
    /// store file spans its file): the superblock was edited, or the file resized.
    #[error(
        "the superblock says the store is {store} bytes, its medium is {medium}: \
         an edited superblock (or a resized store file); refused"
    )]
    Length {
        /// The superblock's store length.
        store: u64,
        /// The length the opener knows.
        medium: u64,
    },
    /// A PMO's extent ends past the store's length, inside the medium: the length was cut
    /// below it (or the record edited). Honest stores never have such a record.
    #[error(
        "PMO table slot {slot}'s extent ends at {end:#x}, past the store's end {store:#x} in \
         the superblock: an edited store length (or record); refused"
    )]
    CutsExtent {
        /// The slot.
        slot: u32,
        /// Where its extent ends.
        end: u64,
        /// The superblock's store length.
        store: u64,
    },
    /// The slot right after the table is in use: the slot count was lowered, hiding PMOs.
    #[error(
        "the PMO table slot after the superblock's {slots} slots is in use: an edited slot \
         count; refused"
    )]
    TableTail {
        /// The superblock's slot count.
        slots: u32,
    },
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
    /// The PMO table a new store gets unless told otherwise: at most an eighth of the medium
    /// (one 1 KiB slot per 8 KiB), at most [`DEFAULT_SLOTS`], at least one.
    pub fn slots_for(medium_len: u64) -> u32 {
        let slots = medium_len / 8 / SLOT_SIZE;
        u32::try_from(slots).map_or(DEFAULT_SLOTS, |s| s.clamp(1, DEFAULT_SLOTS))
    }

    /// Where the data area of a store with `slots` table slots begins.
    fn data_off_for(slots: u32) -> u64 {
        let table_end = 2 * SB_SIZE + u64::from(slots) * SLOT_SIZE;
        table_end.div_ceil(DATA_ALIGN) * DATA_ALIGN
    }

    /// Geometry for a new store.
    pub fn layout(uuid: [u8; 16], medium_len: u64, slots: u32) -> Result<Self, SuperblockError> {
        let table_off = 2 * SB_SIZE;
        let data_off = Self::data_off_for(slots);
        if slots == 0 || data_off >= medium_len {
            return Err(SuperblockError::TooSmall {
                len: medium_len,
                slots,
                min_mib: (data_off + DATA_ALIGN) >> 20,
            });
        }
        let sb = Self {
            uuid,
            medium_len,
            slots,
            table_off,
            data_off,
        };
        if !sb.fits(medium_len) {
            return Err(SuperblockError::Geometry);
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
                Ok(_) => last = SuperblockError::Geometry,
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether the regions lie where `layout` puts them, inside a medium of `len` bytes: the
    /// table right after the two copies, the data area at the first aligned offset after the
    /// table (so an edited data offset or slot count cannot move one without the other).
    fn fits(&self, len: u64) -> bool {
        let table_end = u64::from(self.slots)
            .checked_mul(SLOT_SIZE)
            .and_then(|t| t.checked_add(self.table_off));
        self.slots > 0
            && self.table_off == 2 * SB_SIZE
            && self.medium_len <= len
            && matches!(table_end, Some(e) if e <= self.data_off)
            && self.data_off.is_multiple_of(DATA_ALIGN)
            && self.data_off == Self::data_off_for(self.slots)
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
    use pmo_media::CrashMedium;

    fn write_copy(m: &CrashMedium, copy: u64, sb: &Superblock) {
        m.write(copy * SB_SIZE, &sb.encode()).unwrap();
    }

    #[test]
    fn the_default_table_is_sized_to_the_medium() {
        assert_eq!(Superblock::slots_for(64 << 20), 8192);
        assert_eq!(Superblock::slots_for(512 << 20), DEFAULT_SLOTS);
        assert_eq!(Superblock::slots_for(6 << 30), DEFAULT_SLOTS);
        assert_eq!(Superblock::slots_for(0), 1);
        for len in [4 << 20, 8 << 20, 64 << 20, 100 << 20, 1 << 30] {
            let sb = Superblock::layout([0; 16], len, Superblock::slots_for(len)).unwrap();
            assert!(sb.data_off <= len / 2, "{len}: data at {}", sb.data_off);
        }
    }

    #[test]
    fn a_medium_too_small_for_the_table_says_the_smallest_that_works() {
        let e = Superblock::layout([0; 16], 64 << 20, DEFAULT_SLOTS).unwrap_err();
        assert!(matches!(
            e,
            SuperblockError::TooSmall {
                slots: DEFAULT_SLOTS,
                min_mib: 68,
                ..
            }
        ));
        assert!(e.to_string().contains("at least 68 MiB"), "{e}");
        assert!(Superblock::layout([0; 16], 68 << 20, DEFAULT_SLOTS).is_ok());
        assert!(Superblock::layout([0; 16], 2 << 20, 1).is_err());
        assert!(Superblock::layout([0; 16], 4 << 20, 0).is_err());
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
                Err(SuperblockError::Geometry)
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
