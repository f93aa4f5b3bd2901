//! The rollback anchor: what the store last committed, kept outside the medium.
//!
//! Everything on the medium can be replaced by an older copy of itself: an attacker who keeps a
//! copy of the store file (or of one PMO's record, tree and pages) can put it back later, and
//! each piece will verify, because it once was genuine. Only state kept elsewhere can tell.
//! The anchor is a small file, meant to live where the store's editor cannot write (another
//! disk or host; in production a TPM NV counter would take its place), holding the store's id
//! and geometry, its commit counter, and for every table slot the number, PMO name and kind
//! (live or destroyed) of the slot's last commit.
//!
//! Every record commit (create, psync, destroy) takes the next store-wide commit number, stores
//! it in the record (bound under the PMO's record MAC), and then advances the slot's entry
//! here. At open, a slot whose record carries a lower number than its entry has been rolled
//! back, and the store is refused ([`Anchor::check`]); the names let open refuse, by name, a
//! PMO whose slot is damaged or whose record turns up in another slot (`admit.rs`). Raising a
//! record's number keylessly does not help: it breaks that record's MAC at attach.
//!
//! What remains: the store and the anchor rolled back together are indistinguishable from the
//! past. The anchor's MACs are keyed by a random secret kept in the anchor itself; they tie the
//! anchor to one store, each entry to its slot, and detect damage, but whoever can read and
//! write the anchor can forge it (or put back an older genuine entry of one slot), which is
//! why the anchor must be out of the store editor's reach.
//!
//! Layout (version 2): a 4 KiB header (magic, version, store uuid, slots, secret, counter,
//! store length, data offset, MAC), then one 96-byte entry per slot (commit number, flags,
//! name length, name, MAC truncated to 128 bits). An all-zero entry is commit 0 (never
//! committed). Each advance writes its entries and the header and `fdatasync`s once.

use crate::record::{Record, MAX_NAME};
use crate::superblock::Superblock;
use locked::Locked;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use zeroize::Zeroizing;

const MAGIC: &[u8; 8] = b"PMOANCH1";
/// 2: entries carry the PMO name and kind; the header binds the store's geometry.
const VERSION: u32 = 2;
const HEADER: u64 = 4096;
const ENTRY: u64 = 96;
/// Magic, version, uuid, slots, secret, counter, store length, data offset.
const HEADER_BODY: usize = 8 + 4 + 16 + 4 + 32 + 8 + 8 + 8;
/// Where an entry's name starts and its MAC.
const NAME_AT: usize = 10;
const MAC_AT: usize = 80;
const FLAG_DESTROYED: u8 = 1;

/// Errors of the rollback anchor.
#[derive(Debug, thiserror::Error)]
pub enum AnchorError {
    /// The anchor file could not be read, written or synced.
    #[error("anchor {path}: {source}")]
    Io {
        /// The anchor file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The anchor's header or an entry fails its MAC, or the file is too short.
    #[error("anchor {path} is damaged: {why}")]
    Damaged {
        /// The anchor file.
        path: PathBuf,
        /// What failed.
        why: &'static str,
    },
    /// The anchor was made for another store.
    #[error("anchor {0} belongs to another store")]
    OtherStore(PathBuf),
    /// The store's superblock describes another geometry than its anchor recorded: the
    /// superblock (which carries only an unkeyed checksum) was edited.
    #[error(
        "the store's superblock ({store}) differs from its anchor {path} ({anchor}): \
         an edited superblock; refused"
    )]
    Geometry {
        /// The anchor file.
        path: PathBuf,
        /// The superblock's length, slots and data offset.
        store: String,
        /// The anchor's.
        anchor: String,
    },
    /// The store on the medium is older than its anchor: it was rolled back.
    #[error(
        "store is older than its anchor: slot {slot} is at commit {slot_store}, the anchor at \
         {slot_anchor} (store counter {store}, anchor counter {anchor})"
    )]
    RolledBack {
        /// The store's commit counter (the highest commit number of any record).
        store: u64,
        /// The anchor's counter.
        anchor: u64,
        /// First slot found behind the anchor.
        slot: u32,
        /// That slot's commit number on the medium.
        slot_store: u64,
        /// That slot's commit number in the anchor.
        slot_anchor: u64,
    },
    /// A commit number that cannot advance (at its maximum).
    #[error("anchor counter exhausted")]
    Exhausted,
}

/// What the anchor learned of one table slot at the slot's last commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnchorEntry {
    /// The commit's number (0: the slot never committed).
    pub commit: u64,
    /// The PMO that commit was of (empty for commit 0).
    pub name: String,
    /// That commit destroyed the PMO (the slot is free since).
    pub destroyed: bool,
}

impl AnchorEntry {
    /// The entry for a commit of `rec`. A name the store would never have written (only an
    /// edited free record has one) is left out.
    pub fn of(rec: &Record) -> Self {
        let name = if rec.name.len() <= MAX_NAME {
            rec.name.clone()
        } else {
            String::new()
        };
        Self {
            commit: rec.commit,
            name,
            destroyed: rec.state.is_destroyed(),
        }
    }

    /// The slot holds a PMO that is not destroyed, as far as the anchor knows.
    pub fn is_live(&self) -> bool {
        self.commit > 0 && !self.destroyed
    }
}

struct State {
    file: File,
    counter: u64,
    slots: Vec<AnchorEntry>,
}

/// The superblock fields the anchor binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    medium_len: u64,
    slots: u32,
    data_off: u64,
}

impl Geometry {
    fn of(sb: &Superblock) -> Self {
        Self {
            medium_len: sb.medium_len,
            slots: sb.slots,
            data_off: sb.data_off,
        }
    }
}

impl std::fmt::Display for Geometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "length {}, {} slots, data at {:#x}",
            self.medium_len, self.slots, self.data_off
        )
    }
}

/// An open rollback anchor.
pub struct Anchor {
    path: PathBuf,
    uuid: [u8; 16],
    geometry: Geometry,
    secret: Zeroizing<[u8; 32]>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Anchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anchor")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Anchor {
    /// Creates (or replaces) the anchor of the store `sb` describes, seeded with one entry per
    /// table slot (all default for a new store; what the medium holds when a store gets its
    /// first anchor).
    pub fn create(
        path: &Path,
        sb: &Superblock,
        entries: &[AnchorEntry],
    ) -> Result<Anchor, AnchorError> {
        let io = |source| AnchorError::Io {
            path: path.to_owned(),
            source,
        };
        if entries.len() != sb.slots as usize {
            return Err(AnchorError::Damaged {
                path: path.to_owned(),
                why: "seed of another table size",
            });
        }
        let mut secret = Zeroizing::new([0u8; 32]);
        pmo_crypto::random_bytes(&mut secret[..])
            .map_err(|_| io(std::io::Error::other("random source failed")))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let counter = entries.iter().map(|e| e.commit).max().unwrap_or(0);
        let a = Anchor::with(path, sb, secret, file, counter, entries.to_vec());
        {
            let st = a.lock();
            st.file
                .set_len(HEADER + ENTRY * entries.len() as u64)
                .map_err(io)?;
            for (i, e) in entries.iter().enumerate() {
                if e.commit > 0 {
                    a.write_entry(&st, i as u32, e)?;
                }
            }
            a.write_header(&st)?;
            st.file.sync_all().map_err(io)?;
        }
        Ok(a)
    }

    /// Opens the anchor at `path` for the store `sb` describes; checks every MAC, then that
    /// the anchor is this store's and recorded the geometry the superblock now says.
    /// `Ok(None)` if the file does not exist.
    pub fn open(path: &Path, sb: &Superblock) -> Result<Option<Anchor>, AnchorError> {
        let io = |source| AnchorError::Io {
            path: path.to_owned(),
            source,
        };
        let damaged = |why| AnchorError::Damaged {
            path: path.to_owned(),
            why,
        };
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let mut h = [0u8; HEADER_BODY + 32];
        file.read_exact_at(&mut h, 0)
            .map_err(|_| damaged("short header"))?;
        if &h[..8] != MAGIC || h[8..12] != VERSION.to_le_bytes() {
            return Err(damaged("not an anchor of this version"));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut secret = Zeroizing::new([0u8; 32]);
        secret.copy_from_slice(&h[32..64]);
        let mut file_uuid = [0u8; 16];
        file_uuid.copy_from_slice(&h[12..28]);
        let recorded = Geometry {
            slots: u32::from_le_bytes([h[28], h[29], h[30], h[31]]),
            medium_len: u64_at(72),
            data_off: u64_at(80),
        };
        let counter = u64_at(64);
        let a = Anchor::with(path, sb, secret, file, counter, Vec::new());
        let mac: [u8; 32] = h[HEADER_BODY..].try_into().map_err(|_| damaged("header"))?;
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            &a.header_mac(&h[..HEADER_BODY])[..],
            &mac[..],
        )) {
            return Err(damaged("header MAC"));
        }
        if file_uuid != sb.uuid {
            return Err(AnchorError::OtherStore(path.to_owned()));
        }
        if recorded != a.geometry {
            return Err(AnchorError::Geometry {
                path: path.to_owned(),
                store: a.geometry.to_string(),
                anchor: recorded.to_string(),
            });
        }
        let mut raw = vec![0u8; recorded.slots as usize * ENTRY as usize];
        {
            let st = a.lock();
            st.file
                .read_exact_at(&mut raw, HEADER)
                .map_err(|_| damaged("short entry table"))?;
        }
        let mut v = Vec::with_capacity(recorded.slots as usize);
        for (i, e) in raw.chunks_exact(ENTRY as usize).enumerate() {
            let entry = a.decode_entry(i as u32, e).ok_or(damaged("entry MAC"))?;
            if entry.commit > counter {
                return Err(damaged("entry above the counter"));
            }
            v.push(entry);
        }
        a.lock().slots = v;
        Ok(Some(a))
    }

    fn with(
        path: &Path,
        sb: &Superblock,
        secret: Zeroizing<[u8; 32]>,
        file: File,
        counter: u64,
        slots: Vec<AnchorEntry>,
    ) -> Anchor {
        Anchor {
            path: path.to_owned(),
            uuid: sb.uuid,
            geometry: Geometry::of(sb),
            secret,
            state: Mutex::new(State {
                file,
                counter,
                slots,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// The anchor's counter (the highest commit number it has seen).
    pub fn counter(&self) -> u64 {
        self.lock().counter
    }

    /// Every slot's entry, in slot order.
    pub fn entries(&self) -> Vec<AnchorEntry> {
        self.lock().slots.clone()
    }

    /// Compares the medium's per-slot commit numbers with the anchor (`None` for a slot to
    /// leave out: a damaged one, which open refuses by the name its entry holds). Any slot
    /// behind its anchor entry means a rollback; the error names the store's and the anchor's
    /// counters and the first such slot.
    pub fn check(&self, medium: &[Option<u64>]) -> Result<(), AnchorError> {
        let st = self.lock();
        let behind = st
            .slots
            .iter()
            .zip(medium)
            .enumerate()
            .find_map(|(i, (a, m))| m.filter(|m| *m < a.commit).map(|m| (i as u32, m, a.commit)));
        match behind {
            None => Ok(()),
            Some((slot, slot_store, slot_anchor)) => Err(AnchorError::RolledBack {
                store: medium.iter().flatten().copied().max().unwrap_or(0),
                anchor: st.counter,
                slot,
                slot_store,
                slot_anchor,
            }),
        }
    }

    /// Records that `slot` committed `entry` (durable when this returns).
    pub fn advance(&self, slot: u32, entry: &AnchorEntry) -> Result<(), AnchorError> {
        self.advance_all(&[(slot, entry.clone())])
    }

    /// Records several slots' commits with one `fdatasync` (open catching up with commits a
    /// crash kept from the anchor). An entry not above the slot's current one is skipped:
    /// the anchor never moves back.
    pub fn advance_all(&self, commits: &[(u32, AnchorEntry)]) -> Result<(), AnchorError> {
        let mut st = self.lock();
        let mut wrote = false;
        for (slot, entry) in commits {
            let Some(cur) = st.slots.get(*slot as usize) else {
                return Err(AnchorError::Damaged {
                    path: self.path.clone(),
                    why: "slot beyond the anchor",
                });
            };
            if entry.commit <= cur.commit {
                continue;
            }
            st.slots[*slot as usize] = entry.clone();
            st.counter = st.counter.max(entry.commit);
            self.write_entry(&st, *slot, entry)?;
            wrote = true;
        }
        if !wrote {
            return Ok(());
        }
        self.write_header(&st)?;
        st.file.sync_data().map_err(|source| AnchorError::Io {
            path: self.path.clone(),
            source,
        })
    }

    fn header_mac(&self, body: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.secret);
        h.update(b"pmovmm anchor header");
        h.update(body);
        *h.finalize().as_bytes()
    }

    /// MAC over an entry's bytes before its MAC field, bound to the store and the slot.
    fn entry_mac(&self, slot: u32, bytes: &[u8]) -> [u8; 16] {
        let mut h = blake3::Hasher::new_keyed(&self.secret);
        h.update(b"pmovmm anchor slot v2");
        h.update(&self.uuid);
        h.update(&slot.to_le_bytes());
        h.update(bytes);
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        out
    }

    fn encode_entry(&self, slot: u32, entry: &AnchorEntry) -> [u8; ENTRY as usize] {
        let mut e = [0u8; ENTRY as usize];
        e[..8].copy_from_slice(&entry.commit.to_le_bytes());
        e[8] = if entry.destroyed { FLAG_DESTROYED } else { 0 };
        // A PMO name has at most MAX_NAME bytes; anything longer is not one (AnchorEntry::of).
        let name = match entry.name.len() {
            n if n <= MAX_NAME => entry.name.as_bytes(),
            _ => &[],
        };
        let n = name.len();
        e[9] = n as u8;
        e[NAME_AT..NAME_AT + n].copy_from_slice(&name[..n]);
        let mac = self.entry_mac(slot, &e[..MAC_AT]);
        e[MAC_AT..MAC_AT + 16].copy_from_slice(&mac);
        e
    }

    /// An entry as stored; `None` if its MAC, flags or name do not hold.
    fn decode_entry(&self, slot: u32, e: &[u8]) -> Option<AnchorEntry> {
        if e.iter().all(|b| *b == 0) {
            return Some(AnchorEntry::default());
        }
        let want = self.entry_mac(slot, e.get(..MAC_AT)?);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            &want[..],
            e.get(MAC_AT..MAC_AT + 16)?,
        )) {
            return None;
        }
        let commit = u64::from_le_bytes(e.get(..8)?.try_into().ok()?);
        let flags = *e.get(8)?;
        let n = usize::from(*e.get(9)?);
        if flags & !FLAG_DESTROYED != 0 || n > MAX_NAME {
            return None;
        }
        let name = std::str::from_utf8(e.get(NAME_AT..NAME_AT + n)?).ok()?;
        Some(AnchorEntry {
            commit,
            name: name.to_string(),
            destroyed: flags & FLAG_DESTROYED != 0,
        })
    }

    fn write_entry(&self, st: &State, slot: u32, entry: &AnchorEntry) -> Result<(), AnchorError> {
        let e = self.encode_entry(slot, entry);
        st.file
            .write_all_at(&e, HEADER + ENTRY * u64::from(slot))
            .map_err(|source| AnchorError::Io {
                path: self.path.clone(),
                source,
            })
    }

    fn write_header(&self, st: &State) -> Result<(), AnchorError> {
        let mut h = Vec::with_capacity(HEADER_BODY + 32);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&self.uuid);
        h.extend_from_slice(&(st.slots.len() as u32).to_le_bytes());
        h.extend_from_slice(&self.secret[..]);
        h.extend_from_slice(&st.counter.to_le_bytes());
        h.extend_from_slice(&self.geometry.medium_len.to_le_bytes());
        h.extend_from_slice(&self.geometry.data_off.to_le_bytes());
        let mac = self.header_mac(&h);
        h.extend_from_slice(&mac);
        st.file
            .write_all_at(&h, 0)
            .map_err(|source| AnchorError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(uuid: u8) -> Superblock {
        Superblock::layout([uuid; 16], 64 << 20, 3).unwrap()
    }

    fn live(commit: u64, name: &str) -> AnchorEntry {
        AnchorEntry {
            commit,
            name: name.into(),
            destroyed: false,
        }
    }

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn dir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("pmo-anchor-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    #[test]
    fn advance_reopen_and_refuse_a_store_behind_it() {
        let d = dir("advance");
        let p = d.0.join("a");
        let s = sb(5);
        let a = Anchor::create(&p, &s, &vec![AnchorEntry::default(); 3]).unwrap();
        a.advance(1, &live(3, "x")).unwrap();
        a.advance(1, &live(2, "old")).unwrap(); // never backwards
        let gone = AnchorEntry {
            commit: 4,
            name: "y".into(),
            destroyed: true,
        };
        a.advance(2, &gone).unwrap();
        drop(a);
        let a = Anchor::open(&p, &s).unwrap().unwrap();
        assert_eq!(a.counter(), 4);
        assert_eq!(
            a.entries(),
            vec![AnchorEntry::default(), live(3, "x"), gone.clone()]
        );
        a.check(&[Some(0), Some(3), Some(4)]).unwrap();
        a.check(&[Some(9), Some(5), Some(7)]).unwrap();
        let e = a.check(&[Some(0), Some(2), Some(4)]).unwrap_err();
        assert!(matches!(
            e,
            AnchorError::RolledBack {
                store: 4,
                anchor: 4,
                slot: 1,
                slot_store: 2,
                slot_anchor: 3
            }
        ));
        assert_eq!(
            e.to_string(),
            "store is older than its anchor: slot 1 is at commit 2, the anchor at 3 \
             (store counter 4, anchor counter 4)"
        );
        // A damaged slot is left out here (open refuses it by the entry's name).
        a.check(&[Some(0), Some(3), None]).unwrap();
        assert!(matches!(
            Anchor::open(&p, &sb(6)),
            Err(AnchorError::OtherStore(_))
        ));
        assert!(Anchor::open(&d.0.join("none"), &s).unwrap().is_none());
        // A keyless edit of an entry's number, its name, or of the counter breaks a MAC.
        let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        for (at, good) in [
            (HEADER + ENTRY, 3u8),
            (HEADER + ENTRY + NAME_AT as u64, b'x'),
            (64, 4),
        ] {
            f.write_all_at(&[good ^ 1], at).unwrap();
            assert!(
                matches!(Anchor::open(&p, &s), Err(AnchorError::Damaged { .. })),
                "edit at {at}"
            );
            f.write_all_at(&[good], at).unwrap();
            Anchor::open(&p, &s).unwrap().unwrap();
        }
        // An entry copied to another slot fails there: each entry is bound to its slot.
        let mut e = [0u8; ENTRY as usize];
        f.read_exact_at(&mut e, HEADER + ENTRY).unwrap();
        f.write_all_at(&e, HEADER).unwrap();
        assert!(matches!(
            Anchor::open(&p, &s),
            Err(AnchorError::Damaged { .. })
        ));
    }

    /// The anchor records the store's length, table size and data offset: a superblock edited
    /// in any of them (its checksum recomputed) is refused by name of the mismatch.
    #[test]
    fn a_superblock_with_another_geometry_is_refused() {
        let d = dir("geometry");
        let p = d.0.join("a");
        let s = sb(5);
        Anchor::create(&p, &s, &vec![AnchorEntry::default(); 3]).unwrap();
        for edited in [
            Superblock {
                medium_len: s.medium_len - 4096,
                ..s.clone()
            },
            Superblock {
                medium_len: s.medium_len + 4096,
                ..s.clone()
            },
            Superblock {
                slots: 2,
                ..s.clone()
            },
            Superblock {
                data_off: s.data_off + (2 << 20),
                ..s.clone()
            },
        ] {
            let e = Anchor::open(&p, &edited).unwrap_err();
            assert!(matches!(e, AnchorError::Geometry { .. }), "{edited:?}: {e}");
            assert!(e.to_string().contains("edited superblock"), "{e}");
        }
        Anchor::open(&p, &s).unwrap().unwrap();
    }

    #[test]
    fn names_longer_than_a_pmo_name_are_not_kept() {
        let mut rec_name = "n".repeat(MAX_NAME + 1);
        let d = dir("names");
        let p = d.0.join("a");
        let s = sb(1);
        let a = Anchor::create(&p, &s, &vec![AnchorEntry::default(); 3]).unwrap();
        let e = AnchorEntry {
            commit: 1,
            name: std::mem::take(&mut rec_name),
            destroyed: true,
        };
        a.advance(0, &e).unwrap();
        drop(a);
        let a = Anchor::open(&p, &s).unwrap().unwrap();
        assert_eq!(a.entries()[0].name, "");
        assert_eq!(a.entries()[0].commit, 1);
    }
}
