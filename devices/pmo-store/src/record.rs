//! PMO table records: one slot per PMO, two copies per slot.
//!
//! A record update writes the copy that is *not* current with a higher sequence number and its own
//! checksum, then persists it. A crash mid-write leaves a copy whose checksum fails, so the other
//! (older, complete) copy wins at open: every record update is crash-atomic.
//!
//! The checksum is unkeyed: it catches torn writes, not an attacker, who can recompute it. What an
//! attacker must not change is carried by the **record MAC**, keyed by the PMO's key: every field
//! that decides how pages are encrypted and checked or what the PMO is, the table slot the
//! record belongs in, and whether it is destroyed ([`Record::bound_bytes`]).
//! Keyless recovery changes only the fields outside it (sequence, state, journal, journal area mark), and
//! [`LiveRecord`] makes that a checked rule rather than a convention.

use super::codec::{checksum, Dec, Enc};
use super::design::Design;
use super::superblock::{Superblock, SLOT_SIZE};
use super::StoreError;
use pmo_crypto::{KdfParams, KeyParams, PmoKeys, Suite, PAGE};
use pmo_media::{Medium, MediumError};

const MAGIC: u32 = 0x3352_4d50; // "PMR3"
/// Bytes of the name field of a record on media.
pub const NAME_FIELD: usize = 64;
/// Longest PMO name: the field less one byte, so the guest protocol's NUL-terminated
/// 64-byte name field carries every name the store holds (one limit for both).
pub const MAX_NAME: usize = NAME_FIELD - 1;

/// Persistent per-PMO state: the states of the papers' diagrams that must survive a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PmoState {
    /// Slot unused.
    Free,
    /// Detached (D): at rest.
    Detached,
    /// Attached for reading (R).
    Read,
    /// Attached for writing (W).
    Write,
    /// Encrypting dirty pages into the journal area (LPMO EP; LOaPP P / EPP): not yet committed.
    Journaling,
    /// Committed; copying the journal area into primaries and tree (LPMO TC; LOaPP CP / CPP).
    ApplyingJournal,
    /// Destroying the shadow: scrubbing the journal area (LOaPP DS; LPMO DT).
    ScrubbingJournal,
    /// pdestroy in progress: scrubbing the whole extent.
    Destroying,
}

impl PmoState {
    fn code(self) -> u8 {
        match self {
            PmoState::Free => 0,
            PmoState::Detached => 1,
            PmoState::Read => 2,
            PmoState::Write => 3,
            PmoState::Journaling => 4,
            PmoState::ApplyingJournal => 5,
            PmoState::ScrubbingJournal => 6,
            PmoState::Destroying => 7,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => PmoState::Free,
            1 => PmoState::Detached,
            2 => PmoState::Read,
            3 => PmoState::Write,
            4 => PmoState::Journaling,
            5 => PmoState::ApplyingJournal,
            6 => PmoState::ScrubbingJournal,
            7 => PmoState::Destroying,
            _ => return None,
        })
    }
    /// True for the states of a destroyed PMO (`destroying`, `free`): a keyed commit (destroy)
    /// enters them and only a keyed commit (create) leaves them, so the record MAC binds this
    /// bit and a keyless edit of the state byte cannot bring a destroyed PMO back.
    pub fn is_destroyed(self) -> bool {
        matches!(self, PmoState::Destroying | PmoState::Free)
    }

    /// Short name as in the papers' diagrams.
    pub fn name(self) -> &'static str {
        match self {
            PmoState::Free => "free",
            PmoState::Detached => "D",
            PmoState::Read => "R",
            PmoState::Write => "W",
            PmoState::Journaling => "EP",
            PmoState::ApplyingJournal => "TC",
            PmoState::ScrubbingJournal => "DS",
            PmoState::Destroying => "destroying",
        }
    }
}

/// Errors decoding a record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// Neither copy is valid but the slot is not blank.
    #[error("PMO table slot {0} is damaged")]
    Damaged(u32),
}

/// One PMO's persistent record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Update sequence number (higher wins).
    pub seq: u64,
    /// Persistent state.
    pub state: PmoState,
    /// Design the PMO was created with (default for attach).
    pub design: Design,
    /// Name.
    pub name: String,
    /// Number of 4 KiB pages.
    pub npages: u64,
    /// Extent offset on the medium.
    pub ext_off: u64,
    /// Extent length.
    pub ext_len: u64,
    /// Key derivation parameters (salt, uid, suite, paper IV, Argon2id cost).
    pub keys: KeyParams,
    /// Key check value.
    pub kcv: [u8; 32],
    /// Epoch of the last completed psync (page versions are epochs).
    pub epoch: u64,
    /// Every epoch below this may have been used for a ciphertext; never reuse one.
    pub next_epoch: u64,
    /// Merkle root over the per-page metadata.
    pub root: [u8; 32],
    /// The store-wide commit counter when this record last committed (create, psync, destroy):
    /// what a rollback anchor compares.
    pub commit: u64,
    /// Bytes of the committed journal in the journal area (state ApplyingJournal).
    pub journal_len: u64,
    /// Checksum of that journal.
    pub journal_sum: [u8; 32],
    /// High-water mark of journal area bytes written since the last scrub.
    pub journal_dirty: u64,
    /// Pages psync'd by an `id` design whose tags are still to be computed (their leaves hold
    /// a zero tag); the crash handler at the next attach computes them.
    pub pending_tags: u64,
    /// Keyed MAC over [`Record::bound_bytes`].
    pub rec_mac: [u8; 32],
}

impl Record {
    /// The fields bound under the record MAC, in a canonical encoding: everything that decides
    /// how the PMO's pages are encrypted and checked, where they are, and which version of them
    /// is current. `store_uuid` ties the record to its store, `slot` to its table slot (a
    /// record copied into another slot fails its MAC there), and the destroyed bit of its state
    /// to the commit that destroyed it.
    pub fn bound_bytes(&self, store_uuid: &[u8; 16], slot: u32) -> Vec<u8> {
        let mut e = Enc::default();
        e.bytes(store_uuid)
            .u32(PAGE as u32)
            .u32(slot)
            .u8(u8::from(self.state.is_destroyed()));
        self.put_bound(&mut e);
        e.0
    }

    /// The bound fields, in the order both the record and its MAC input carry them.
    fn put_bound(&self, e: &mut Enc) {
        let (n, nb) = self.name_field();
        e.u8(self.design.code())
            .u8(self.keys.suite.code())
            .u8(n)
            .bytes(&nb)
            .u64(self.npages)
            .u64(self.ext_off)
            .u64(self.ext_len)
            .u64(self.keys.uid)
            .bytes(&self.keys.salt)
            .bytes(&self.keys.paper_iv)
            .u32(self.keys.kdf.m_kib)
            .u32(self.keys.kdf.t)
            .u32(self.keys.kdf.p)
            .bytes(&self.kcv)
            .u64(self.epoch)
            .u64(self.next_epoch)
            .bytes(&self.root)
            .u64(self.commit)
            .u64(self.pending_tags);
    }

    /// Sets the record MAC with the PMO's keys (after a change of a bound field), for the
    /// record in table slot `slot` of the store `store_uuid`.
    pub fn seal(&mut self, keys: &PmoKeys, store_uuid: &[u8; 16], slot: u32) {
        self.rec_mac = keys.record_mac(&self.bound_bytes(store_uuid, slot));
    }

    /// Checks the record MAC in constant time, for the record found in table slot `slot`.
    pub fn verify(&self, keys: &PmoKeys, store_uuid: &[u8; 16], slot: u32) -> bool {
        keys.check_record_mac(&self.bound_bytes(store_uuid, slot), &self.rec_mac)
    }

    fn name_field(&self) -> (u8, [u8; NAME_FIELD]) {
        let name = self.name.as_bytes();
        let mut nb = [0u8; NAME_FIELD];
        let n = name.len().min(NAME_FIELD);
        nb[..n].copy_from_slice(&name[..n]);
        (n as u8, nb)
    }

    /// Encodes the record with its checksum (public for tamper tests and tools).
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u32(MAGIC).u64(self.seq).u8(self.state.code());
        self.put_bound(&mut e);
        e.bytes(&self.rec_mac)
            .u64(self.journal_len)
            .bytes(&self.journal_sum)
            .u64(self.journal_dirty);
        debug_assert_eq!(e.0.len(), ENCODED_BODY);
        let sum = checksum(&[&e.0]);
        e.bytes(&sum);
        e.0
    }

    /// Decodes one record copy; `None` if it is not a valid record (public for tools and tests).
    pub fn decode(b: &[u8]) -> Option<Self> {
        let mut d = Dec::new(b);
        if d.u32().ok()? != MAGIC {
            return None;
        }
        let seq = d.u64().ok()?;
        let state = PmoState::from_code(d.u8().ok()?)?;
        let design = Design::from_code(d.u8().ok()?)?;
        let suite = Suite::from_code(d.u8().ok()?).ok()?;
        let n = d.u8().ok()? as usize;
        let nb = d.take(NAME_FIELD).ok()?;
        let name = std::str::from_utf8(nb.get(..n)?).ok()?.to_string();
        let npages = d.u64().ok()?;
        let ext_off = d.u64().ok()?;
        let ext_len = d.u64().ok()?;
        let uid = d.u64().ok()?;
        let salt = d.arr().ok()?;
        let paper_iv = d.arr().ok()?;
        let kdf = KdfParams {
            m_kib: d.u32().ok()?,
            t: d.u32().ok()?,
            p: d.u32().ok()?,
        };
        let kcv = d.arr().ok()?;
        let epoch = d.u64().ok()?;
        let next_epoch = d.u64().ok()?;
        let root = d.arr().ok()?;
        let commit = d.u64().ok()?;
        let pending_tags = d.u64().ok()?;
        let rec_mac = d.arr().ok()?;
        let journal_len = d.u64().ok()?;
        let journal_sum = d.arr().ok()?;
        let journal_dirty = d.u64().ok()?;
        let sum: [u8; 32] = d.arr().ok()?;
        if checksum(&[b.get(..ENCODED_BODY)?]) != sum {
            return None;
        }
        Some(Self {
            seq,
            state,
            design,
            name,
            npages,
            ext_off,
            ext_len,
            keys: KeyParams {
                salt,
                paper_iv,
                suite,
                uid,
                kdf,
            },
            kcv,
            epoch,
            next_epoch,
            root,
            commit,
            pending_tags,
            rec_mac,
            journal_len,
            journal_sum,
            journal_dirty,
        })
    }
}

/// Length of the encoded record body before its checksum.
const ENCODED_BODY: usize =
    4 + 8 + 4 + NAME_FIELD + 8 * 4 + 32 + 16 + 12 + 32 + 8 + 8 + 32 + 8 + 8 + 32 + 8 + 32 + 8;

/// What a table slot holds after reading both copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotContent {
    /// Both copies blank (all zero): never used.
    Blank,
    /// A valid record; `copy` is the index of the current copy.
    Valid {
        /// The record.
        rec: Box<Record>,
        /// Which copy.
        copy: u8,
    },
    /// Not blank, but no copy decodes.
    Damaged,
}

/// Reads and arbitrates the two copies of a slot.
pub fn read_slot(m: &dyn Medium, sb: &Superblock, slot: u32) -> Result<SlotContent, MediumError> {
    let mut buf = vec![0u8; SLOT_SIZE as usize];
    m.read(sb.record_off(slot, 0), &mut buf)?;
    Ok(arbitrate(&buf))
}

/// Picks the valid copy with the highest sequence number out of a raw slot.
pub fn arbitrate(slot: &[u8]) -> SlotContent {
    let half = (SLOT_SIZE / 2) as usize;
    if slot.iter().all(|b| *b == 0) {
        return SlotContent::Blank;
    }
    let a = slot.get(..half).and_then(Record::decode).map(Box::new);
    let b = slot.get(half..).and_then(Record::decode).map(Box::new);
    match (a, b) {
        (Some(a), Some(b)) => {
            if b.seq > a.seq {
                SlotContent::Valid { rec: b, copy: 1 }
            } else {
                SlotContent::Valid { rec: a, copy: 0 }
            }
        }
        (Some(a), None) => SlotContent::Valid { rec: a, copy: 0 },
        (None, Some(b)) => SlotContent::Valid { rec: b, copy: 1 },
        (None, None) => {
            // A torn first write into a blank slot: the other copy is still all zero.
            let blank = |r: Option<&[u8]>| r.is_some_and(|x| x.iter().all(|b| *b == 0));
            if blank(slot.get(..half)) || blank(slot.get(half..)) {
                SlotContent::Blank
            } else {
                SlotContent::Damaged
            }
        }
    }
}

/// Writes `rec` (with `seq` bumped) into the non-current copy of `slot` and persists it.
/// Returns the copy index that is now current. A sequence number at its maximum (only an edited
/// record gets there) is refused, never wrapped: a wrapped copy would lose arbitration.
pub fn write_record(
    m: &dyn Medium,
    sb: &Superblock,
    slot: u32,
    current: u8,
    rec: &mut Record,
) -> Result<u8, StoreError> {
    rec.seq = rec
        .seq
        .checked_add(1)
        .ok_or(StoreError::CounterExhausted("record sequence"))?;
    let next = 1 - current.min(1);
    let b = rec.encode();
    let off = sb.record_off(slot, next);
    m.write(off, &b)?;
    m.persist(off, b.len() as u64)?;
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record {
            seq: 1,
            state: PmoState::Detached,
            design: Design::D,
            name: "x".into(),
            npages: 3,
            ext_off: 1 << 21,
            ext_len: 1 << 21,
            keys: KeyParams {
                salt: [1; 32],
                paper_iv: [2; 16],
                suite: Suite::XtsBlake3,
                uid: 7,
                kdf: KdfParams::INSECURE_FAST,
            },
            kcv: [3; 32],
            epoch: 0,
            next_epoch: 1,
            root: [0; 32],
            commit: 9,
            rec_mac: [4; 32],
            journal_len: 0,
            journal_sum: [0; 32],
            journal_dirty: 0,
            pending_tags: 3,
        }
    }

    #[test]
    fn round_trip_and_torn_copy_loses() {
        let r = rec();
        let enc = r.encode();
        assert!(enc.len() <= (SLOT_SIZE / 2) as usize);
        assert_eq!(Record::decode(&enc), Some(r.clone()));
        let mut slot = vec![0u8; SLOT_SIZE as usize];
        slot[..enc.len()].copy_from_slice(&enc);
        let mut r2 = r.clone();
        r2.seq = 2;
        r2.epoch = 5;
        let enc2 = r2.encode();
        slot[512..512 + enc2.len()].copy_from_slice(&enc2);
        assert_eq!(
            arbitrate(&slot),
            SlotContent::Valid {
                rec: Box::new(r2),
                copy: 1
            }
        );
        slot[512 + 40] ^= 1; // torn newer copy
        assert_eq!(
            arbitrate(&slot),
            SlotContent::Valid {
                rec: Box::new(r),
                copy: 0
            }
        );
        slot[40] ^= 1;
        assert_eq!(arbitrate(&slot), SlotContent::Damaged);
    }
}
