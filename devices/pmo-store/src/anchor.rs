//! The rollback anchor: commit numbers kept outside the medium.
//!
//! Everything on the medium can be replaced by an older copy of itself: an attacker who keeps a
//! copy of the store file (or of one PMO's record, tree and pages) can put it back later, and
//! each piece will verify, because it once was genuine. Only state kept elsewhere can tell.
//! The anchor is a small file, meant to live where the store's editor cannot write (another
//! disk or host; in production a TPM NV counter would take its place), holding the store's id,
//! its commit counter and the commit number of every table slot.
//!
//! Every record commit (create, psync, destroy) takes the next store-wide commit number, stores
//! it in the record (bound under the PMO's record MAC), and then advances the slot's number
//! here. At open, a slot whose record carries a lower number than the anchor, or a store whose
//! highest number is below the anchor's counter, has been rolled back, and the store is refused.
//! Raising a record's number keylessly does not help: it breaks that record's MAC at attach.
//!
//! What remains: the store and the anchor rolled back together are indistinguishable from the
//! past. The anchor's MAC is keyed by a random secret kept in the anchor itself; it ties the
//! anchor to one store and detects damage, but whoever can read and write the anchor can forge
//! it, which is why the anchor must be out of the store editor's reach.
//!
//! Layout: a 4 KiB header (magic, version, store uuid, slots, secret, counter, MAC), then one
//! 32-byte entry per slot (commit number, MAC truncated to 128 bits, padding). An all-zero
//! entry is commit 0 (never committed). Each advance writes its entry and the header and
//! `fdatasync`s once.

use locked::Locked;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use zeroize::Zeroizing;

const MAGIC: &[u8; 8] = b"PMOANCH1";
const VERSION: u32 = 1;
const HEADER: u64 = 4096;
const ENTRY: u64 = 32;
const HEADER_BODY: usize = 8 + 4 + 16 + 4 + 32 + 8;

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

struct State {
    file: File,
    counter: u64,
    slots: Vec<u64>,
}

/// An open rollback anchor.
pub struct Anchor {
    path: PathBuf,
    uuid: [u8; 16],
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
    /// Creates (or replaces) the anchor of the store `uuid`, seeded with the given per-slot
    /// commit numbers (all zero for a new store; the medium's numbers when a store gets its
    /// first anchor).
    pub fn create(path: &Path, uuid: [u8; 16], slots: &[u64]) -> Result<Anchor, AnchorError> {
        let io = |source| AnchorError::Io {
            path: path.to_owned(),
            source,
        };
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
        let counter = slots.iter().copied().max().unwrap_or(0);
        let a = Anchor::with(path, uuid, secret, file, counter, slots.to_vec());
        {
            let st = a.lock();
            st.file
                .set_len(HEADER + ENTRY * slots.len() as u64)
                .map_err(io)?;
            for (i, &c) in slots.iter().enumerate() {
                if c > 0 {
                    a.write_entry(&st, i as u32, c)?;
                }
            }
            a.write_header(&st)?;
            st.file.sync_all().map_err(io)?;
        }
        Ok(a)
    }

    /// Opens the anchor at `path` for the store `uuid` with `slots` table slots; checks every
    /// MAC. `Ok(None)` if the file does not exist.
    pub fn open(path: &Path, uuid: [u8; 16], slots: u32) -> Result<Option<Anchor>, AnchorError> {
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
        let mut secret = Zeroizing::new([0u8; 32]);
        secret.copy_from_slice(&h[32..64]);
        let mut file_uuid = [0u8; 16];
        file_uuid.copy_from_slice(&h[12..28]);
        let file_slots = u32::from_le_bytes([h[28], h[29], h[30], h[31]]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&h[64..72]);
        let counter = u64::from_le_bytes(c);
        let a = Anchor::with(path, uuid, secret, file, counter, Vec::new());
        let mac: [u8; 32] = h[HEADER_BODY..].try_into().map_err(|_| damaged("header"))?;
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            &a.header_mac(&h[..HEADER_BODY])[..],
            &mac[..],
        )) {
            return Err(damaged("header MAC"));
        }
        if file_uuid != uuid || file_slots != slots {
            return Err(AnchorError::OtherStore(path.to_owned()));
        }
        let mut entries = vec![0u8; slots as usize * ENTRY as usize];
        {
            let st = a.lock();
            st.file
                .read_exact_at(&mut entries, HEADER)
                .map_err(|_| damaged("short entry table"))?;
        }
        let mut v = Vec::with_capacity(slots as usize);
        for (i, e) in entries.chunks_exact(ENTRY as usize).enumerate() {
            if e.iter().all(|b| *b == 0) {
                v.push(0);
                continue;
            }
            let mut cb = [0u8; 8];
            cb.copy_from_slice(&e[..8]);
            let commit = u64::from_le_bytes(cb);
            let want = a.entry_mac(i as u32, commit);
            if !bool::from(subtle::ConstantTimeEq::ct_eq(&want[..], &e[8..24])) || commit > counter
            {
                return Err(damaged("entry MAC"));
            }
            v.push(commit);
        }
        a.lock().slots = v;
        Ok(Some(a))
    }

    fn with(
        path: &Path,
        uuid: [u8; 16],
        secret: Zeroizing<[u8; 32]>,
        file: File,
        counter: u64,
        slots: Vec<u64>,
    ) -> Anchor {
        Anchor {
            path: path.to_owned(),
            uuid,
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

    /// Compares the medium's per-slot commit numbers with the anchor (`None` for a slot to
    /// leave out: a damaged one, reported and refused elsewhere). Any slot behind its anchor
    /// entry means a rollback; the error names the store's and the anchor's counters and the
    /// first such slot.
    pub fn check(&self, medium: &[Option<u64>]) -> Result<(), AnchorError> {
        let st = self.lock();
        let behind = st
            .slots
            .iter()
            .zip(medium)
            .enumerate()
            .find_map(|(i, (a, m))| m.filter(|m| m < a).map(|m| (i as u32, m, *a)));
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

    /// Records that `slot` committed with number `commit` (durable when this returns).
    pub fn advance(&self, slot: u32, commit: u64) -> Result<(), AnchorError> {
        let mut st = self.lock();
        let Some(cur) = st.slots.get(slot as usize).copied() else {
            return Err(AnchorError::Damaged {
                path: self.path.clone(),
                why: "slot beyond the anchor",
            });
        };
        if commit <= cur {
            return Ok(());
        }
        st.slots[slot as usize] = commit;
        st.counter = st.counter.max(commit);
        self.write_entry(&st, slot, commit)?;
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

    fn entry_mac(&self, slot: u32, commit: u64) -> [u8; 16] {
        let mut h = blake3::Hasher::new_keyed(&self.secret);
        h.update(b"pmovmm anchor slot");
        h.update(&self.uuid);
        h.update(&slot.to_le_bytes());
        h.update(&commit.to_le_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.finalize().as_bytes()[..16]);
        out
    }

    fn write_entry(&self, st: &State, slot: u32, commit: u64) -> Result<(), AnchorError> {
        let mut e = [0u8; ENTRY as usize];
        e[..8].copy_from_slice(&commit.to_le_bytes());
        e[8..24].copy_from_slice(&self.entry_mac(slot, commit));
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

    #[test]
    fn advance_reopen_and_refuse_a_store_behind_it() {
        let dir = std::env::temp_dir().join(format!("pmo-anchor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a");
        let uuid = [5u8; 16];
        let a = Anchor::create(&p, uuid, &[0, 0, 0]).unwrap();
        a.advance(1, 3).unwrap();
        a.advance(1, 2).unwrap(); // never backwards
        a.advance(2, 4).unwrap();
        drop(a);
        let a = Anchor::open(&p, uuid, 3).unwrap().unwrap();
        assert_eq!(a.counter(), 4);
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
        // A damaged slot is left out here (open reports it on its own).
        a.check(&[Some(0), Some(3), None]).unwrap();
        assert!(matches!(
            Anchor::open(&p, [6; 16], 3),
            Err(AnchorError::OtherStore(_))
        ));
        assert!(Anchor::open(&dir.join("none"), uuid, 3).unwrap().is_none());
        // A keyless edit of an entry or of the counter breaks a MAC.
        let f = OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[1], HEADER + ENTRY).unwrap();
        assert!(matches!(
            Anchor::open(&p, uuid, 3),
            Err(AnchorError::Damaged { .. })
        ));
        f.write_all_at(&[3], HEADER + ENTRY).unwrap();
        Anchor::open(&p, uuid, 3).unwrap().unwrap();
        f.write_all_at(&[0], 64).unwrap();
        assert!(matches!(
            Anchor::open(&p, uuid, 3),
            Err(AnchorError::Damaged { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
