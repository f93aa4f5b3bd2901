//! TEE range-based encryption (seed 000 §2.5/§5.2; CXL TSP's range keys):
//! a table of DPA ranges, each with its own key, that the expander applies
//! between its cache and the media. Blocks of a keyed range are encrypted on
//! write-back and decrypted on fill, so the media never holds their
//! plaintext; the cache (device DRAM, inside the trust boundary) does.
//!
//! One algorithm at a time: AES-XTS-128 (32-byte keys) or AES-XTS-256
//! (64-byte keys), both as data key then tweak key. The first key set picks
//! the algorithm from its length unless [`RangeTable::set_algorithm`] chose
//! one; while any range is keyed a key of the other length is refused, and
//! the choice can change only with the table empty. The XTS data unit is one
//! 4 KiB block and its tweak is the block's DPA block index, so equal
//! plaintext at different DPAs encrypts differently.
//!
//! Keys are never stored as bytes: they go straight into AES key schedules,
//! which zeroize on clear and drop, and nothing here formats them.

use std::collections::BTreeMap;

use pmo_crypto::XtsCipher;
use zeroize::Zeroizing;

use crate::cache::BLOCK;

/// The most ranges the table holds (a 16-bit range id space, as in TSP).
pub const MAX_RANGES: usize = 65_535;

/// Errors of the range table.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TeeError {
    /// The range is empty, its ends are not 4 KiB aligned, or it ends past
    /// the DPA space.
    #[error("range {start:#x}..{end:#x} is empty, unaligned to 4 KiB or beyond the device end {size:#x}")]
    BadRange {
        /// Requested start DPA.
        start: u64,
        /// Requested exclusive end DPA.
        end: u64,
        /// Size of the DPA space.
        size: u64,
    },
    /// The range shares bytes with a range that is already keyed.
    #[error("range {start:#x}..{end:#x} overlaps range id {other}")]
    Overlap {
        /// Requested start DPA.
        start: u64,
        /// Requested exclusive end DPA.
        end: u64,
        /// Id of the keyed range it overlaps.
        other: u16,
    },
    /// Setting a range under an id that is already keyed.
    #[error("range id {0} is already keyed (clear it first)")]
    IdInUse(u16),
    /// Clearing or looking up an id that is not keyed.
    #[error("range id {0} is not keyed")]
    NoSuchId(u16),
    /// A key that is neither 32 nor 64 bytes long.
    #[error("key of {0} bytes: XTS-AES-128 takes 32, XTS-AES-256 takes 64")]
    BadKeyLength(usize),
    /// A key whose length selects the other algorithm than the one in force
    /// (chosen explicitly, or by the keys already set).
    #[error("the table runs {0:?}; that key is for the other algorithm")]
    AlgorithmMismatch(Algorithm),
    /// [`RangeTable::set_algorithm`] asked for a different algorithm while
    /// ranges are keyed.
    #[error("the algorithm can change only while no range is keyed")]
    AlgorithmBusy,
    /// The table already holds [`MAX_RANGES`] ranges.
    #[error("the table is full ({MAX_RANGES} ranges)")]
    Full,
}

/// The cipher every range of the table uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// IEEE 1619 XTS with AES-128 (32-byte key).
    XtsAes128,
    /// IEEE 1619 XTS with AES-256 (64-byte key).
    XtsAes256,
}

impl Algorithm {
    /// Key length in bytes (data key and tweak key).
    pub fn key_len(self) -> usize {
        match self {
            Algorithm::XtsAes128 => 32,
            Algorithm::XtsAes256 => 64,
        }
    }

    fn for_key_len(len: usize) -> Result<Self, TeeError> {
        match len {
            32 => Ok(Algorithm::XtsAes128),
            64 => Ok(Algorithm::XtsAes256),
            n => Err(TeeError::BadKeyLength(n)),
        }
    }
}

/// One keyed range.
struct Range {
    id: u16,
    /// Exclusive end DPA.
    end: u64,
    cipher: XtsCipher,
}

/// The range table of one device.
pub struct RangeTable {
    /// DPA space size; ranges lie inside it.
    size: u64,
    /// Chosen explicitly, or by the first key; `None` while free to choose.
    algorithm: Option<Algorithm>,
    /// Whether `algorithm` was chosen explicitly (then it stays when the table empties).
    pinned: bool,
    /// Keyed ranges by start DPA.
    ranges: BTreeMap<u64, Range>,
    /// Range id → start DPA.
    ids: BTreeMap<u16, u64>,
}

impl std::fmt::Debug for RangeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Ranges and ids only; keys never.
        f.debug_struct("RangeTable")
            .field("algorithm", &self.algorithm)
            .field(
                "ranges",
                &self
                    .ranges
                    .iter()
                    .map(|(s, r)| (r.id, *s, r.end))
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl RangeTable {
    /// An empty table over a DPA space of `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            size,
            algorithm: None,
            pinned: false,
            ranges: BTreeMap::new(),
            ids: BTreeMap::new(),
        }
    }

    /// The algorithm in force, if one is chosen.
    pub fn algorithm(&self) -> Option<Algorithm> {
        self.algorithm
    }

    /// Chooses the algorithm explicitly (only while no range is keyed).
    pub fn set_algorithm(&mut self, alg: Algorithm) -> Result<(), TeeError> {
        if !self.ranges.is_empty() && self.algorithm != Some(alg) {
            return Err(TeeError::AlgorithmBusy);
        }
        self.algorithm = Some(alg);
        self.pinned = true;
        Ok(())
    }

    /// Number of keyed ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// True when no range is keyed.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The `[start, end)` DPA range of a keyed id.
    pub fn range_of(&self, id: u16) -> Option<(u64, u64)> {
        let start = *self.ids.get(&id)?;
        self.ranges.get(&start).map(|r| (start, r.end))
    }

    /// Checks that `[start, end)` could be keyed under `id` (no key needed):
    /// lets a caller validate before draining the range.
    pub fn check(&self, id: u16, start: u64, end: u64) -> Result<(), TeeError> {
        if start >= end
            || !start.is_multiple_of(BLOCK)
            || !end.is_multiple_of(BLOCK)
            || end > self.size
        {
            return Err(TeeError::BadRange {
                start,
                end,
                size: self.size,
            });
        }
        if self.ids.contains_key(&id) {
            return Err(TeeError::IdInUse(id));
        }
        // The range starting last before `end` is the only one that can overlap.
        if let Some((_, r)) = self.ranges.range(..end).next_back() {
            if r.end > start {
                return Err(TeeError::Overlap {
                    start,
                    end,
                    other: r.id,
                });
            }
        }
        if self.ranges.len() >= MAX_RANGES {
            return Err(TeeError::Full);
        }
        Ok(())
    }

    /// Keys `[start, end)` (4 KiB aligned, exclusive end) as range `id`.
    /// Overlapping ranges and reused ids are refused.
    pub fn set(&mut self, id: u16, start: u64, end: u64, key: &[u8]) -> Result<(), TeeError> {
        self.check(id, start, end)?;
        let alg = Algorithm::for_key_len(key.len())?;
        match self.algorithm {
            Some(a) if a != alg && (self.pinned || !self.ranges.is_empty()) => {
                return Err(TeeError::AlgorithmMismatch(a));
            }
            _ => {}
        }
        let cipher = match alg {
            Algorithm::XtsAes128 => {
                let mut k = Zeroizing::new([0u8; 32]);
                k.copy_from_slice(key);
                XtsCipher::new_128(&k)
            }
            Algorithm::XtsAes256 => {
                let mut k = Zeroizing::new([0u8; 64]);
                k.copy_from_slice(key);
                XtsCipher::new(&k)
            }
        };
        self.algorithm = Some(alg);
        self.ranges.insert(start, Range { id, end, cipher });
        self.ids.insert(id, start);
        Ok(())
    }

    /// Clears range `id`: its key schedules are wiped (dropped). Returns the
    /// range it covered.
    pub fn clear(&mut self, id: u16) -> Result<(u64, u64), TeeError> {
        let start = self.ids.remove(&id).ok_or(TeeError::NoSuchId(id))?;
        let r = self.ranges.remove(&start).ok_or(TeeError::NoSuchId(id))?;
        let end = r.end;
        drop(r);
        if self.ranges.is_empty() && !self.pinned {
            self.algorithm = None;
        }
        Ok((start, end))
    }

    /// The cipher covering DPA block `block`, if that block is keyed.
    pub fn cipher_for(&self, block: u64) -> Option<&XtsCipher> {
        let dpa = block.checked_mul(BLOCK)?;
        let (_, r) = self.ranges.range(..=dpa).next_back()?;
        (dpa < r.end).then_some(&r.cipher)
    }

    /// Encrypts one block in place if it is keyed; returns whether it was.
    pub fn encrypt_block(&self, block: u64, data: &mut [u8; BLOCK as usize]) -> bool {
        match self.cipher_for(block) {
            Some(c) => c.encrypt(tweak(block), data).is_ok(),
            None => false,
        }
    }

    /// Decrypts one block in place if it is keyed; returns whether it was.
    pub fn decrypt_block(&self, block: u64, data: &mut [u8; BLOCK as usize]) -> bool {
        match self.cipher_for(block) {
            Some(c) => c.decrypt(tweak(block), data).is_ok(),
            None => false,
        }
    }
}

/// The XTS tweak of a block: its DPA block index, little-endian.
fn tweak(block: u64) -> [u8; 16] {
    u128::from(block).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = BLOCK;

    #[test]
    fn ranges_are_validated_and_overlaps_refused() {
        let mut t = RangeTable::new(64 * B);
        let k = [1u8; 32];
        assert!(matches!(t.set(1, 0, 0, &k), Err(TeeError::BadRange { .. })));
        assert!(matches!(t.set(1, 1, B, &k), Err(TeeError::BadRange { .. })));
        assert!(matches!(
            t.set(1, 0, 65 * B, &k),
            Err(TeeError::BadRange { .. })
        ));
        assert!(matches!(
            t.set(1, 2 * B, B, &k),
            Err(TeeError::BadRange { .. })
        ));
        t.set(1, 4 * B, 8 * B, &k).unwrap();
        assert_eq!(t.set(1, 10 * B, 12 * B, &k), Err(TeeError::IdInUse(1)));
        for (s, e) in [(0, 5), (7, 9), (5, 6), (0, 64), (4, 8)] {
            assert_eq!(
                t.set(2, s * B, e * B, &k),
                Err(TeeError::Overlap {
                    start: s * B,
                    end: e * B,
                    other: 1
                }),
                "{s}..{e}"
            );
        }
        // Adjacent on both sides is fine.
        t.set(2, 0, 4 * B, &k).unwrap();
        t.set(3, 8 * B, 9 * B, &k).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t.range_of(3), Some((8 * B, 9 * B)));
        assert_eq!(t.clear(3), Ok((8 * B, 9 * B)));
        assert_eq!(t.clear(3), Err(TeeError::NoSuchId(3)));
        assert_eq!(t.range_of(3), None);
    }

    #[test]
    fn only_blocks_inside_a_range_are_keyed() {
        let mut t = RangeTable::new(64 * B);
        t.set(7, 4 * B, 8 * B, &[9u8; 64]).unwrap();
        let keyed: Vec<u64> = (0..64).filter(|b| t.cipher_for(*b).is_some()).collect();
        assert_eq!(keyed, vec![4, 5, 6, 7]);
        assert!(t.cipher_for(u64::MAX).is_none());
    }

    #[test]
    fn one_algorithm_at_a_time() {
        let mut t = RangeTable::new(64 * B);
        assert_eq!(t.set(1, 0, B, &[1u8; 48]), Err(TeeError::BadKeyLength(48)));
        t.set(1, 0, B, &[1u8; 32]).unwrap();
        assert_eq!(t.algorithm(), Some(Algorithm::XtsAes128));
        assert_eq!(
            t.set(2, B, 2 * B, &[1u8; 64]),
            Err(TeeError::AlgorithmMismatch(Algorithm::XtsAes128))
        );
        assert_eq!(
            t.set_algorithm(Algorithm::XtsAes256),
            Err(TeeError::AlgorithmBusy)
        );
        t.clear(1).unwrap();
        // Empty again: the next key picks.
        t.set(2, B, 2 * B, &[1u8; 64]).unwrap();
        assert_eq!(t.algorithm(), Some(Algorithm::XtsAes256));
        t.clear(2).unwrap();
        // An explicit choice holds even for an empty table.
        t.set_algorithm(Algorithm::XtsAes128).unwrap();
        assert_eq!(
            t.set(3, 0, B, &[1u8; 64]),
            Err(TeeError::AlgorithmMismatch(Algorithm::XtsAes128))
        );
        t.set(3, 0, B, &[1u8; 32]).unwrap();
    }

    #[test]
    fn tweak_is_the_dpa_block_and_round_trips() {
        for key in [vec![3u8; 32], vec![3u8; 64]] {
            let mut t = RangeTable::new(64 * B);
            t.set(1, 0, 16 * B, &key).unwrap();
            let plain = [0x5au8; BLOCK as usize];
            let mut a = plain;
            let mut b = plain;
            assert!(t.encrypt_block(2, &mut a));
            assert!(t.encrypt_block(3, &mut b));
            assert_ne!(a, plain);
            assert_ne!(a, b, "same plaintext at two DPAs must differ");
            assert!(t.decrypt_block(2, &mut a));
            assert_eq!(a, plain);
            // Unkeyed blocks pass through.
            let mut c = plain;
            assert!(!t.encrypt_block(20, &mut c));
            assert_eq!(c, plain);
        }
    }

    #[test]
    fn table_holds_at_most_max_ranges() {
        let mut t = RangeTable::new((MAX_RANGES as u64 + 1) * B);
        let k = [1u8; 32];
        for i in 0..MAX_RANGES as u64 {
            t.set(i as u16, i * B, (i + 1) * B, &k).unwrap();
        }
        assert_eq!(
            t.set(
                u16::MAX,
                MAX_RANGES as u64 * B,
                (MAX_RANGES as u64 + 1) * B,
                &k
            ),
            Err(TeeError::Full)
        );
    }

    #[test]
    fn debug_never_shows_keys() {
        let mut t = RangeTable::new(64 * B);
        t.set(1, 0, B, &[0xabu8; 32]).unwrap();
        let s = format!("{t:?}");
        assert!(
            !s.contains("171") && !s.to_lowercase().contains("ab, ab"),
            "{s}"
        );
        assert!(s.contains("XtsAes128"));
    }
}
