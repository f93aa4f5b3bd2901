//! The PMO store: encrypted persistent memory objects on a medium.
//!
//! Three parts, each its own module: the [`medium`] that persists bytes (a file, or a test
//! medium that crashes or is killed on cue), the [`crypto`] that protects pages (Argon2id root
//! key, per-page AES-XTS with keyed tags), and the store proper (this module and its children):
//! the on-media format, crash-atomic psync, recovery and the designs of the papers. It knows
//! nothing of virtio or userfaultfd: the PMO device, the CXL expander and the host tools use it.
//!
//! Layout of a medium (all little endian; see docs/store.md):
//!
//! ```text
//! 0        superblock copy A          (4 KiB)
//! 4 KiB    superblock copy B          (4 KiB)
//! 8 KiB    PMO table: slots x 1 KiB   (two 512-byte record copies per slot)
//! 2 MiB-aligned data area: one extent per PMO =
//!          [ primaries: npages x 4 KiB ][ tree: leaves (version, tag) + interior hashes ][ TSC ]
//! ```
//!
//! Invariants kept here: the medium only ever holds ciphertext; a page reaches the caller only
//! after its tag and tree path verified; every metadata update is a crash-atomic record write;
//! psync commits through a redo journal in the TSC.

mod alloc;
pub mod anchor;
mod codec;
pub mod crypto;
pub mod design;
mod journal;
pub mod medium;
pub mod record;
mod recovery;
mod session;
pub mod superblock;
pub mod tree;

pub use alloc::AllocError;
pub use design::Design;
pub use journal::JournalError;
pub use record::{PmoState, RecordError};
pub use recovery::{FsckReport, RecoveryAction, RecoveryReport};
pub use session::{DetachHandle, Session};
pub use superblock::SuperblockError;
pub use tree::TreeError;

use crate::crypto::{CryptoError, KdfParams, KeyParams, PmoKeys, Suite, UserKey, PAGE};
use crate::medium::{Medium, MediumError};
use alloc::Allocator;
pub use anchor::{Anchor, AnchorError};
use record::{write_record, Record, MAX_NAME};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use superblock::Superblock;
use tree::TreeLayout;

/// Largest PMO: 64 GiB.
pub const MAX_PMO_SIZE: u64 = 64 << 30;
/// Default number of PMO table slots.
pub const DEFAULT_SLOTS: u32 = 65_536;
/// Alignment of PMO extents.
const EXTENT_ALIGN: u64 = 64 << 10;

/// Every way a store operation can fail. Messages are short and never carry key material.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No PMO of that name.
    #[error("no PMO named {0:?}")]
    NotFound(String),
    /// A PMO of that name exists.
    #[error("a PMO named {0:?} already exists")]
    Exists(String),
    /// Attached in a conflicting mode (many readers or one writer).
    #[error("PMO {0:?} is attached")]
    Busy(String),
    /// The key does not open this PMO. Same error whatever the key and wherever it differs.
    #[error("wrong key")]
    WrongKey,
    /// Name rules: 1..=64 bytes of [A-Za-z0-9._-], not starting with '.'.
    #[error("invalid PMO name {0:?}")]
    InvalidName(String),
    /// Size rules: a nonzero multiple of 4096 up to 64 GiB.
    #[error("invalid PMO size {0} (a nonzero multiple of 4096, at most 64 GiB)")]
    InvalidSize(u64),
    /// A page index beyond the PMO.
    #[error("page {page} beyond PMO of {npages} pages")]
    PageOutOfRange {
        /// Requested page.
        page: u64,
        /// PMO size in pages.
        npages: u64,
    },
    /// A page failed authentication; its plaintext was not returned.
    #[error("page {page} failed integrity verification")]
    Integrity {
        /// The page.
        page: u64,
    },
    /// PMO metadata (root, tree or journal) failed authentication or is damaged.
    #[error("PMO {name:?} metadata failed verification: {why}")]
    Corrupt {
        /// PMO name.
        name: String,
        /// What failed.
        why: String,
    },
    /// Writing through a read-only session.
    #[error("session is read-only")]
    ReadOnly,
    /// No free PMO table slot.
    #[error("PMO table full")]
    TableFull,
    /// Not enough free space.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The store could not be formatted or opened.
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
    /// The medium failed (or an injected crash fired).
    #[error(transparent)]
    Medium(#[from] MediumError),
    /// A crypto primitive failed (not a verification failure).
    #[error("crypto: {0}")]
    Crypto(CryptoError),
    /// A journal could not be written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// `wedi` holds the whole plaintext in host memory; this PMO would not fit.
    #[error("PMO of {size} bytes is too large for design {design} on this host")]
    TooLargeForDesign {
        /// Design name.
        design: &'static str,
        /// PMO size.
        size: u64,
    },
    /// A background detach thread could not be started or died.
    #[error("detach worker failed")]
    Worker,
    /// A counter read from the medium is at its maximum; it is refused, never wrapped.
    #[error("{0} exhausted")]
    CounterExhausted(&'static str),
    /// The rollback anchor refused the store or could not be updated.
    #[error(transparent)]
    Anchor(#[from] AnchorError),
    /// A keyless record write would have changed a field bound under the record MAC (a bug).
    #[error("internal: keyless write of a bound record field")]
    BoundFieldChanged,
}

impl From<CryptoError> for StoreError {
    fn from(e: CryptoError) -> Self {
        match e {
            CryptoError::WrongKey => StoreError::WrongKey,
            other => StoreError::Crypto(other),
        }
    }
}

/// Access mode of an attach session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Perm {
    /// Read only; many at once.
    Read,
    /// Read and write; exclusive.
    Write,
}

/// Options for formatting a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Number of PMO table slots (the most PMOs the store can hold).
    pub slots: u32,
    /// Rollback anchor to create for the new store (see [`anchor`]).
    pub anchor: Option<PathBuf>,
    /// Key-derivation cost of PMOs created through this handle without their own
    /// (not stored: each PMO's own cost is in its record).
    pub kdf: KdfParams,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            slots: DEFAULT_SLOTS,
            anchor: None,
            kdf: KdfParams::DEFAULT,
        }
    }
}

/// Options for opening a store.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Rollback anchor: the store is refused if it is older than the anchor; the anchor is
    /// created from the store if the file does not exist yet (see [`anchor`]).
    pub anchor: Option<PathBuf>,
    /// As [`StoreOptions::kdf`].
    pub kdf: KdfParams,
}

/// Options for creating a PMO.
#[derive(Debug, Clone, Copy)]
pub struct CreateOptions {
    /// Default design of its attach sessions.
    pub design: Design,
    /// Page cipher and tag.
    pub suite: Suite,
    /// Cost of deriving the PMO's root key from the user key (Argon2id); `None`: the store
    /// handle's default (see [`StoreOptions::kdf`]).
    pub kdf: Option<KdfParams>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        Self {
            design: Design::D,
            suite: Suite::XtsBlake3,
            kdf: None,
        }
    }
}

/// What `list` reports per PMO (nothing secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmoInfo {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Persistent state.
    pub state: PmoState,
    /// Default design.
    pub design: Design,
    /// Suite.
    pub suite: Suite,
    /// Last completed psync epoch.
    pub epoch: u64,
    /// Table slot.
    pub slot: u32,
    /// Extent offset and length on the medium.
    pub extent: (u64, u64),
    /// Pages whose tag an `id` design still owes (nonzero only after a crash).
    pub pending_tags: u64,
}

/// Current record of a PMO, which copy holds it, and a digest of its bound fields as last
/// verified or sealed: a keyless write checks against it (see [`StoreInner::write_rec`]).
pub(crate) struct RecCell {
    pub rec: Record,
    pub copy: u8,
    bound: [u8; 32],
}

impl RecCell {
    /// A record as read from the medium (its MAC is checked at attach, with the key).
    pub fn new(rec: Record, copy: u8, store_uuid: &[u8; 16]) -> Self {
        let bound = bound_digest(&rec, store_uuid);
        Self { rec, copy, bound }
    }
}

fn bound_digest(rec: &Record, store_uuid: &[u8; 16]) -> [u8; 32] {
    codec::checksum(&[&rec.bound_bytes(store_uuid)])
}

/// Who holds a PMO.
#[derive(Default)]
pub(crate) struct Gate {
    pub readers: u32,
    pub writer: bool,
    /// Detaches (or a destroy) still running; concurrent reader detaches each count.
    pub busy: u32,
    pub gone: bool,
}

/// In-memory runtime of one live PMO.
pub(crate) struct PmoRt {
    pub slot: u32,
    pub name: String,
    pub npages: u64,
    pub ext_off: u64,
    pub layout: TreeLayout,
    pub rec: Mutex<RecCell>,
    pub gate: Mutex<Gate>,
    pub cv: Condvar,
    pub damaged: Mutex<Option<String>>,
}

/// Geometry of a PMO extent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub data_len: u64,
    pub meta_len: u64,
    pub tsc_len: u64,
}

impl Geometry {
    pub fn of(npages: u64, layout: &TreeLayout) -> Self {
        let data_len = npages * PAGE as u64;
        let meta_len = layout.size();
        let tsc = journal::HEADER
            + npages * journal::entry_cost(PAGE as u64)
            + layout.total_groups() * journal::entry_cost(tree::ARITY * tree::LEAF as u64);
        Self {
            data_len,
            meta_len,
            tsc_len: tsc.div_ceil(4096) * 4096,
        }
    }
    pub fn total(&self) -> u64 {
        self.data_len + self.meta_len + self.tsc_len
    }
    pub fn meta_rel(&self) -> u64 {
        self.data_len
    }
    pub fn tsc_rel(&self) -> u64 {
        self.data_len + self.meta_len
    }
}

impl PmoRt {
    pub fn geometry(&self) -> Geometry {
        Geometry::of(self.npages, &self.layout)
    }
    pub fn lock_rec(&self) -> MutexGuard<'_, RecCell> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn lock_gate(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) struct Catalog {
    /// Live PMOs by name, in name order (LIST walks it without sorting).
    pub names: BTreeMap<String, Arc<PmoRt>>,
    /// Free slot -> (last seq, current copy) so a reused slot continues its sequence.
    pub free_slots: BTreeMap<u32, (u64, u8)>,
    pub alloc: Allocator,
}

/// Lock order: `cat` before any PMO's `rec`; a PMO's `rec` before its session's locks. `gate`
/// is never held while another of these is taken.
pub(crate) struct StoreInner {
    pub m: Arc<dyn Medium>,
    pub sb: Superblock,
    pub cat: Mutex<Catalog>,
    /// The store-wide commit counter: the highest `commit` of any record.
    pub commit: AtomicU64,
    /// Bumped by every create and destroy, so a lister can tell its snapshot is stale.
    pub catalog_version: AtomicU64,
    /// Rollback anchor kept outside the medium, if the store has one.
    pub anchor: Option<Anchor>,
    /// Key-derivation cost for creates that do not name one.
    pub default_kdf: KdfParams,
}

impl StoreInner {
    pub fn lock_cat(&self) -> MutexGuard<'_, Catalog> {
        self.cat.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes a record update that changes no bound field (state, journal, TSC mark):
    /// crash-atomic, and needs no key, so recovery can do it. Refuses if a bound field changed.
    pub fn write_rec(&self, rt: &PmoRt, cell: &mut RecCell) -> Result<(), StoreError> {
        if bound_digest(&cell.rec, &self.sb.uuid) != cell.bound {
            return Err(StoreError::BoundFieldChanged);
        }
        cell.copy = write_record(&*self.m, &self.sb, rt.slot, cell.copy, &mut cell.rec)?;
        Ok(())
    }

    /// Writes a record update under a new record MAC (bound fields may have changed).
    pub fn write_rec_keyed(
        &self,
        rt: &PmoRt,
        cell: &mut RecCell,
        keys: &PmoKeys,
    ) -> Result<(), StoreError> {
        cell.rec.seal(keys, &self.sb.uuid);
        cell.bound = bound_digest(&cell.rec, &self.sb.uuid);
        cell.copy = write_record(&*self.m, &self.sb, rt.slot, cell.copy, &mut cell.rec)?;
        Ok(())
    }

    /// A commit: the record takes the next store-wide commit number, is sealed and written,
    /// and then the anchor (if any) learns the slot's new number. The record is durable before
    /// the anchor moves, so a crash in between leaves the medium ahead of the anchor, which
    /// open accepts.
    pub fn write_rec_commit(
        &self,
        rt: &PmoRt,
        cell: &mut RecCell,
        keys: &PmoKeys,
    ) -> Result<(), StoreError> {
        cell.rec.commit = self.next_commit()?;
        self.write_rec_keyed(rt, cell, keys)?;
        if let Some(a) = &self.anchor {
            a.advance(rt.slot, cell.rec.commit)?;
        }
        Ok(())
    }

    fn next_commit(&self) -> Result<u64, StoreError> {
        self.commit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_add(1))
            .map(|prev| prev + 1)
            .map_err(|_| StoreError::CounterExhausted("store commit counter"))
    }

    /// Durably zeroes the first `len` bytes of a PMO's TSC.
    pub fn scrub_tsc(&self, rt: &PmoRt, len: u64) -> Result<(), StoreError> {
        let g = rt.geometry();
        let len = len.min(g.tsc_len);
        if len > 0 {
            let off = rt.ext_off + g.tsc_rel();
            self.m.zero(off, len)?;
            self.m.persist(off, len)?;
        }
        Ok(())
    }
}

/// A PMO store on a medium. Cheap to clone; `Send + Sync`; operations on different PMOs run in
/// parallel.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<StoreInner>,
}

/// Checks a PMO name.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidName(name.chars().take(80).collect()))
    }
}

/// Checks a PMO size.
pub fn validate_size(size: u64) -> Result<u64, StoreError> {
    if size == 0 || !size.is_multiple_of(PAGE as u64) || size > MAX_PMO_SIZE {
        return Err(StoreError::InvalidSize(size));
    }
    Ok(size / PAGE as u64)
}

impl Store {
    /// Formats `medium` as an empty store. The superblock is written last, so a crash during
    /// formatting leaves no store rather than a half one.
    pub fn create(medium: Arc<dyn Medium>, opts: StoreOptions) -> Result<Store, StoreError> {
        Self::create_with_progress(medium, opts, &mut |_, _| {})
    }

    /// [`Store::create`] reporting (done, total) table bytes scrubbed.
    pub fn create_with_progress(
        medium: Arc<dyn Medium>,
        opts: StoreOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Store, StoreError> {
        let mut uuid = [0u8; 16];
        crate::crypto::random_bytes(&mut uuid)?;
        let sb = Superblock::layout(uuid, medium.len(), opts.slots)?;
        // Scrub any old superblock first, then the table.
        medium.zero(0, sb.data_off)?;
        medium.persist(0, sb.data_off)?;
        progress(sb.data_off, sb.data_off);
        sb.write(&*medium)?;
        let mut free_slots = BTreeMap::new();
        for s in 0..sb.slots {
            free_slots.insert(s, (0, 1));
        }
        let alloc = Allocator::new(sb.data_off, sb.medium_len, EXTENT_ALIGN);
        let anchor = match &opts.anchor {
            Some(path) => Some(Anchor::create(path, sb.uuid, &vec![0; sb.slots as usize])?),
            None => None,
        };
        Ok(Store {
            inner: Arc::new(StoreInner {
                m: medium,
                sb,
                cat: Mutex::new(Catalog {
                    names: BTreeMap::new(),
                    free_slots,
                    alloc,
                }),
                commit: AtomicU64::new(0),
                catalog_version: AtomicU64::new(0),
                anchor,
                default_kdf: opts.kdf,
            }),
        })
    }

    /// Opens a store and runs recovery. Cost: one pass over the PMO table plus, for each PMO
    /// caught mid-operation, its journal/TSC; independent of data size otherwise.
    pub fn open(medium: Arc<dyn Medium>) -> Result<(Store, RecoveryReport), StoreError> {
        Self::open_with(medium, &OpenOptions::default())
    }

    /// [`Store::open`] with options (a rollback anchor).
    pub fn open_with(
        medium: Arc<dyn Medium>,
        opts: &OpenOptions,
    ) -> Result<(Store, RecoveryReport), StoreError> {
        recovery::open(medium, opts)
    }

    /// A number that changes whenever a PMO is created or destroyed: a lister's snapshot of
    /// [`Store::list`] is current while it stays the same.
    pub fn catalog_version(&self) -> u64 {
        self.inner.catalog_version.load(Ordering::Acquire)
    }

    /// The store-wide commit counter (highest commit number of any record).
    pub fn commit_counter(&self) -> u64 {
        self.inner.commit.load(Ordering::Acquire)
    }

    /// The medium under this store.
    pub fn medium(&self) -> &Arc<dyn Medium> {
        &self.inner.m
    }

    /// The store's superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// Free bytes in the data area.
    pub fn free_bytes(&self) -> u64 {
        self.inner.lock_cat().alloc.free_bytes()
    }

    /// Lists PMOs, sorted by name.
    pub fn list(&self) -> Vec<PmoInfo> {
        // Catalog first, records after it is released: the lock order is catalog -> record,
        // and no record lock is held while waiting for the catalog.
        let rts: Vec<Arc<PmoRt>> = self.inner.lock_cat().names.values().cloned().collect();
        rts.iter()
            .map(|rt| {
                let c = rt.lock_rec();
                PmoInfo {
                    name: rt.name.clone(),
                    size: rt.npages * PAGE as u64,
                    state: c.rec.state,
                    design: c.rec.design,
                    suite: c.rec.keys.suite,
                    epoch: c.rec.epoch,
                    slot: rt.slot,
                    extent: (c.rec.ext_off, c.rec.ext_len),
                    pending_tags: c.rec.pending_tags,
                }
            })
            .collect()
    }

    /// Creates a PMO with the default design (`d`), suite (`xts-blake3`) and the handle's
    /// key-derivation cost.
    pub fn create_pmo(&self, name: &str, size: u64, key: &UserKey) -> Result<(), StoreError> {
        self.create_pmo_with(name, size, key, CreateOptions::default())
    }

    /// Creates a PMO. Commit point: the record write; a crash before it leaves nothing.
    pub fn create_pmo_with(
        &self,
        name: &str,
        size: u64,
        key: &UserKey,
        opts: CreateOptions,
    ) -> Result<(), StoreError> {
        validate_name(name)?;
        let npages = validate_size(size)?;
        let layout = TreeLayout::new(npages);
        let geo = Geometry::of(npages, &layout);
        let params = KeyParams::generate(opts.suite, opts.kdf.unwrap_or(self.inner.default_kdf))?;
        let keys = PmoKeys::derive(key, params)?;
        let mut cat = self.inner.lock_cat();
        if cat.names.contains_key(name) {
            return Err(StoreError::Exists(name.to_string()));
        }
        let (&slot, &(seq, copy)) = cat.free_slots.iter().next().ok_or(StoreError::TableFull)?;
        let (ext_off, ext_len) = cat.alloc.alloc(geo.total())?;
        let result = (|| {
            // Extents are aligned by construction; check it anyway, since open refuses a
            // record whose extent is not (nothing unaligned is ever written).
            if !ext_off.is_multiple_of(EXTENT_ALIGN) || !ext_len.is_multiple_of(EXTENT_ALIGN) {
                return Err(StoreError::Alloc(AllocError::Overlap {
                    off: ext_off,
                    len: ext_len,
                }));
            }
            // Key the range (on a medium with inline encryption) before anything is written.
            self.inner.m.extent_in_use(slot, ext_off, ext_len)?;
            // The free space may hold a destroyed PMO's bytes or a crashed create's: scrub the
            // tree region (a zero tree is the valid empty tree). Primaries and TSC are never
            // read before being written under this PMO's keys.
            let meta = ext_off + geo.meta_rel();
            self.inner.m.zero(meta, geo.meta_len)?;
            self.inner.m.persist(meta, geo.meta_len)?;
            let rec = Record {
                seq,
                state: PmoState::Detached,
                design: opts.design,
                name: name.to_string(),
                npages,
                ext_off,
                ext_len,
                keys: params,
                kcv: keys.key_check_value(),
                epoch: 0,
                next_epoch: 1,
                root: [0u8; 32],
                commit: 0,
                pending_tags: 0,
                rec_mac: [0; 32],
                journal_len: 0,
                journal_sum: [0; 32],
                tsc_dirty: 0,
            };
            let rt = Arc::new(PmoRt {
                slot,
                name: name.to_string(),
                npages,
                ext_off,
                layout,
                rec: Mutex::new(RecCell::new(rec, copy, &self.inner.sb.uuid)),
                gate: Mutex::new(Gate::default()),
                cv: Condvar::new(),
                damaged: Mutex::new(None),
            });
            // The commit point; the anchor (if any) moves after it.
            self.inner
                .write_rec_commit(&rt, &mut rt.lock_rec(), &keys)?;
            Ok::<_, StoreError>(rt)
        })();
        match result {
            Ok(rt) => {
                cat.free_slots.remove(&slot);
                cat.names.insert(name.to_string(), rt);
                self.inner.catalog_version.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                // A failure after the record write (the anchor) leaves a committed PMO that
                // the next open will find; this process just does not list it.
                if let Err(re) = self.inner.m.extent_released(slot) {
                    log::warn!("release extent of slot {slot}: {re}");
                }
                cat.alloc.release(ext_off, ext_len);
                Err(e)
            }
        }
    }

    fn lookup(&self, name: &str) -> Result<Arc<PmoRt>, StoreError> {
        validate_name(name)?;
        self.inner
            .lock_cat()
            .names
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(name.to_string()))
    }

    /// Derives the PMO's keys and checks them in constant time.
    fn unlock(rt: &PmoRt, key: &UserKey) -> Result<PmoKeys, StoreError> {
        let (params, kcv) = {
            let c = rt.lock_rec();
            (c.rec.keys, c.rec.kcv)
        };
        let keys = PmoKeys::derive(key, params)?;
        keys.check(&kcv)?;
        Ok(keys)
    }

    /// Waits until no background detach runs on `rt`, then returns the gate.
    fn wait_idle(rt: &PmoRt) -> MutexGuard<'_, Gate> {
        let mut g = rt.lock_gate();
        while g.busy > 0 {
            g = rt.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g
    }

    /// Destroys a PMO: checks the key, scrubs its extent, frees its slot.
    pub fn destroy_pmo(&self, name: &str, key: &UserKey) -> Result<(), StoreError> {
        let rt = self.lookup(name)?;
        let keys = Self::unlock(&rt, key)?;
        let mut gate = Self::wait_idle(&rt);
        if gate.gone {
            return Err(StoreError::NotFound(name.to_string()));
        }
        if gate.writer || gate.readers > 0 {
            return Err(StoreError::Busy(name.to_string()));
        }
        gate.busy += 1;
        drop(gate);
        let r = self.destroy_locked(&rt, &keys);
        let mut gate = rt.lock_gate();
        gate.busy -= 1;
        if r.is_ok() {
            gate.gone = true;
        }
        rt.cv.notify_all();
        r
    }

    fn destroy_locked(&self, rt: &Arc<PmoRt>, keys: &PmoKeys) -> Result<(), StoreError> {
        let (off, len, seq, copy) = {
            let mut cell = rt.lock_rec();
            // The commit point: a rollback anchor learns that this slot moved on.
            cell.rec.state = PmoState::Destroying;
            self.inner.write_rec_commit(rt, &mut cell, keys)?;
            let (off, len) = (cell.rec.ext_off, cell.rec.ext_len);
            self.inner.m.zero(off, len)?;
            self.inner.m.persist(off, len)?;
            cell.rec.state = PmoState::Free;
            self.inner.write_rec(rt, &mut cell)?;
            self.inner.m.extent_released(rt.slot)?;
            (off, len, cell.rec.seq, cell.copy)
        };
        // The record lock is released first: the lock order is catalog -> record.
        let mut cat = self.inner.lock_cat();
        cat.names.remove(&rt.name);
        cat.alloc.release(off, len);
        cat.free_slots.insert(rt.slot, (seq, copy));
        self.inner.catalog_version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Attaches a PMO with its own default design.
    pub fn attach(&self, name: &str, perm: Perm, key: &UserKey) -> Result<Session, StoreError> {
        self.attach_with(name, perm, key, None)
    }

    /// Attaches a PMO, optionally overriding its design for this session. Many readers or one
    /// writer; waits for a pending background detach of the same PMO.
    pub fn attach_with(
        &self,
        name: &str,
        perm: Perm,
        key: &UserKey,
        design: Option<Design>,
    ) -> Result<Session, StoreError> {
        let rt = self.lookup(name)?;
        let keys = Self::unlock(&rt, key)?;
        if let Some(why) = rt.damaged.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(StoreError::Corrupt {
                name: name.to_string(),
                why,
            });
        }
        {
            let mut gate = Self::wait_idle(&rt);
            if gate.gone {
                return Err(StoreError::NotFound(name.to_string()));
            }
            let conflict = match perm {
                Perm::Write => gate.writer || gate.readers > 0,
                Perm::Read => gate.writer,
            };
            if conflict {
                return Err(StoreError::Busy(name.to_string()));
            }
            match perm {
                Perm::Write => gate.writer = true,
                Perm::Read => gate.readers += 1,
            }
        }
        match session::Session::start(self.inner.clone(), rt.clone(), perm, keys, design) {
            Ok(s) => Ok(s),
            Err(e) => {
                session::release_gate(&rt, perm);
                Err(e)
            }
        }
    }

    /// Keyed check of one PMO: root MAC, every tree group and every page tag. Attaches it for
    /// reading (so it waits for a pending detach and fails with `Busy` if a writer holds it).
    /// Returns the pages that failed; their plaintext is never produced.
    pub fn verify_pmo(
        &self,
        name: &str,
        key: &UserKey,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Vec<u64>, StoreError> {
        let s = self.attach_with(name, Perm::Read, key, Some(Design::D))?;
        let n = s.pages();
        let mut bad = Vec::new();
        let mut buf = [0u8; PAGE];
        for p in 0..n {
            match s.fault(p, &mut buf) {
                Ok(()) => {}
                Err(StoreError::Integrity { page }) => bad.push(page),
                Err(e) => return Err(e),
            }
            if p % 4096 == 0 || p + 1 == n {
                progress(p + 1, n);
            }
        }
        crate::crypto::wipe(&mut buf);
        s.detach().wait()?;
        Ok(bad)
    }

    /// Keyless structural check of every PMO: records, extents, journals and trees.
    pub fn fsck(&self) -> FsckReport {
        recovery::fsck(self, &mut |_, _| {})
    }

    /// [`Store::fsck`] reporting (done, total) PMOs.
    pub fn fsck_with_progress(&self, progress: &mut dyn FnMut(u64, u64)) -> FsckReport {
        recovery::fsck(self, progress)
    }
}
