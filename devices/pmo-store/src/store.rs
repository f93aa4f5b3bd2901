//! [`Store`]: format, open, list, create, destroy, attach, verify and fsck.

use crate::alloc::Allocator;
use crate::anchor::Anchor;
use crate::extents::{self, ExtentKeying};
use crate::record::{Record, MAX_NAME};
use crate::state::{Catalog, ExtentGeometry, Holders, LivePmo, LiveRecord, StoreState};
use crate::superblock::Superblock;
use crate::tree::TreeLayout;
use crate::{recovery, session};
use crate::{
    AllocError, CreateOptions, Design, FsckReport, OpenOptions, Perm, PmoInfo, PmoState,
    RecoveryReport, Session, StoreError, StoreOptions, EXTENT_ALIGN, MAX_PMO_SIZE,
};
use locked::{Locked, Waited};
use pmo_crypto::{CryptoError, KeyParams, PmoKeys, UserKey, PAGE};
use pmo_media::{Backing, Medium};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A PMO store on a medium. Cheap to clone; `Send + Sync`; operations on different PMOs run in
/// parallel.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<StoreState>,
}

/// Checks a PMO name.
pub fn validate_name(name: &str) -> Result<(), StoreError> {
    if name.len() > MAX_NAME {
        return Err(StoreError::NameTooLong(name.len()));
    }
    let ok = !name.is_empty()
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
    /// Formats `backing` as an empty store. The superblock is written last, so a crash during
    /// formatting leaves no store rather than a half one.
    pub fn create(backing: impl Into<Backing>, opts: StoreOptions) -> Result<Store, StoreError> {
        Self::create_with_progress(backing, opts, &mut |_, _| {})
    }

    /// The store on `medium`: formatted with `opts` when `fresh` (a medium just created, see
    /// `FileMedium::open_or_create`), else opened and recovered under the same anchor and
    /// default key-derivation cost. The recovery report is `None` for a fresh store.
    pub fn open_or_format(
        backing: impl Into<Backing>,
        fresh: bool,
        opts: StoreOptions,
    ) -> Result<(Store, Option<RecoveryReport>), StoreError> {
        if fresh {
            return Ok((Self::create(backing, opts)?, None));
        }
        let open = OpenOptions {
            anchor: opts.anchor,
            kdf: opts.kdf,
            len: None,
            suites: opts.suites,
        };
        let (store, report) = Self::open_with(backing, &open)?;
        Ok((store, Some(report)))
    }

    /// [`Store::create`] reporting (done, total) table bytes scrubbed.
    pub fn create_with_progress(
        backing: impl Into<Backing>,
        opts: StoreOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Store, StoreError> {
        let backing = backing.into();
        let medium = backing.medium().clone();
        let mut uuid = [0u8; 16];
        pmo_crypto::random_bytes(&mut uuid)?;
        let len = match opts.len {
            None => medium.len(),
            Some(len) if len <= medium.len() => len,
            Some(len) => {
                return Err(StoreError::TooLong {
                    len,
                    medium: medium.len(),
                })
            }
        };
        let slots = opts.slots.unwrap_or_else(|| Superblock::slots_for(len));
        let sb = Superblock::layout(uuid, len, slots)?;
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
            Some(path) => Some(Anchor::create(
                path,
                &sb,
                &vec![crate::AnchorEntry::default(); sb.slots as usize],
            )?),
            None => None,
        };
        Ok(Store {
            inner: Arc::new(StoreState {
                medium,
                extent_keys: ExtentKeying::new(backing.extent_keys().cloned()),
                reads_wait: backing.reads_wait(),
                suites: opts.suites,
                superblock: sb,
                catalog: Mutex::new(Catalog {
                    names: BTreeMap::new(),
                    free_slots,
                    refused: BTreeMap::new(),
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
    /// caught mid-operation, its journal; independent of data size otherwise.
    pub fn open(backing: impl Into<Backing>) -> Result<(Store, RecoveryReport), StoreError> {
        Self::open_with(backing, &OpenOptions::default())
    }

    /// [`Store::open`] with options (a rollback anchor, registered suites).
    pub fn open_with(
        backing: impl Into<Backing>,
        opts: &OpenOptions,
    ) -> Result<(Store, RecoveryReport), StoreError> {
        recovery::open(backing.into(), opts)
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
        &self.inner.medium
    }

    /// The store's superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.inner.superblock
    }

    /// Free bytes in the data area.
    pub fn free_bytes(&self) -> u64 {
        self.inner.lock_catalog().alloc.free_bytes()
    }

    /// The PMOs open refused (see [`StoreError::Refused`]), by name, with why.
    pub fn refused(&self) -> Vec<(String, String)> {
        let cat = self.inner.lock_catalog();
        cat.refused
            .iter()
            .map(|(n, w)| (n.clone(), w.clone()))
            .collect()
    }

    /// Lists PMOs, sorted by name (refused ones are not among them: [`Store::refused`]).
    pub fn list(&self) -> Vec<PmoInfo> {
        // Catalog first, records after it is released: the lock order is catalog -> record,
        // and no record lock is held while waiting for the catalog.
        let rts: Vec<Arc<LivePmo>> = self.inner.lock_catalog().names.values().cloned().collect();
        rts.iter()
            .map(|pmo| {
                let c = pmo.lock_rec();
                PmoInfo {
                    name: pmo.name.clone(),
                    size: pmo.npages * PAGE as u64,
                    state: c.rec.state,
                    design: c.rec.design,
                    suite: c.rec.keys.suite,
                    epoch: c.rec.epoch,
                    slot: pmo.slot,
                    extent: (c.rec.ext_off, c.rec.ext_len),
                    pending_tags: c.rec.pending_tags,
                }
            })
            .collect()
    }

    /// Creates a PMO with the default design (`d`), its suite (`aes-gcm`) and the handle's
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
        let geo = ExtentGeometry::of(npages, &layout);
        let suite = opts.suite();
        if !self.inner.suites.can_use(suite) {
            return Err(CryptoError::SuiteUnavailable(suite.code()).into());
        }
        let params = KeyParams::generate(suite, opts.kdf.unwrap_or(self.inner.default_kdf))?;
        let keys = PmoKeys::derive(key, params, &self.inner.suites)?;
        let mut cat = self.inner.lock_catalog();
        if cat.names.contains_key(name) {
            return Err(StoreError::Exists(name.to_string()));
        }
        if let Some(why) = cat.refused.get(name) {
            return Err(StoreError::Refused {
                name: name.to_string(),
                why: why.clone(),
            });
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
            let extent = extents::extent(slot, ext_off, ext_len, &params, &keys.key_check_value());
            self.inner.extent_keys.in_use(&extent)?;
            self.inner
                .extent_keys
                .require_range_encryption(name, &extent, opts.design, suite)?;
            // The free space may hold a destroyed PMO's bytes or a crashed create's: scrub the
            // tree region (a zero tree is the valid empty tree). Primaries and journal area are never
            // read before being written under this PMO's keys.
            let meta = ext_off + geo.meta_rel();
            self.inner.medium.zero(meta, geo.meta_len)?;
            self.inner.medium.persist(meta, geo.meta_len)?;
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
                journal_dirty: 0,
            };
            let pmo = Arc::new(LivePmo {
                slot,
                name: name.to_string(),
                npages,
                ext_off,
                layout,
                rec: Mutex::new(LiveRecord::new(
                    rec,
                    copy,
                    &self.inner.superblock.uuid,
                    slot,
                )),
                holders: Mutex::new(Holders::default()),
                holders_changed: Condvar::new(),
                damaged: Mutex::new(None),
            });
            // The commit point; the anchor (if any) moves after it.
            self.inner
                .write_rec_commit(&pmo, &mut pmo.lock_rec(), &keys)?;
            Ok::<_, StoreError>(pmo)
        })();
        match result {
            Ok(pmo) => {
                cat.free_slots.remove(&slot);
                cat.names.insert(name.to_string(), pmo);
                self.inner.catalog_version.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                // A failure after the record write (the anchor) leaves a committed PMO that
                // the next open will find; this process just does not list it.
                if let Err(re) = self.inner.extent_keys.released(slot) {
                    log::warn!("release extent of slot {slot}: {re}");
                }
                cat.alloc.release(ext_off, ext_len);
                Err(e)
            }
        }
    }

    fn lookup(&self, name: &str) -> Result<Arc<LivePmo>, StoreError> {
        validate_name(name)?;
        let cat = self.inner.lock_catalog();
        if let Some(pmo) = cat.names.get(name) {
            return Ok(pmo.clone());
        }
        Err(match cat.refused.get(name) {
            Some(why) => StoreError::Refused {
                name: name.to_string(),
                why: why.clone(),
            },
            None => StoreError::NotFound(name.to_string()),
        })
    }

    /// Derives the PMO's keys and checks them in constant time.
    fn unlock(
        pmo: &LivePmo,
        key: &UserKey,
        suites: &pmo_crypto::ExternalSuites,
    ) -> Result<PmoKeys, StoreError> {
        let (params, kcv) = {
            let c = pmo.lock_rec();
            (c.rec.keys, c.rec.kcv)
        };
        let keys = PmoKeys::derive(key, params, suites)?;
        keys.check(&kcv)?;
        Ok(keys)
    }

    /// Waits until no background detach runs on `pmo`, then returns the gate.
    fn wait_idle(pmo: &LivePmo) -> MutexGuard<'_, Holders> {
        let mut g = pmo.lock_holders();
        while g.busy > 0 {
            g = pmo.holders_changed.wait_locked(g);
        }
        g
    }

    /// Destroys a PMO: checks the key, scrubs its extent, frees its slot.
    pub fn destroy_pmo(&self, name: &str, key: &UserKey) -> Result<(), StoreError> {
        let pmo = self.lookup(name)?;
        let keys = Self::unlock(&pmo, key, &self.inner.suites)?;
        let mut gate = Self::wait_idle(&pmo);
        if gate.gone {
            return Err(StoreError::NotFound(name.to_string()));
        }
        if gate.writer || gate.readers > 0 {
            return Err(StoreError::Busy(name.to_string()));
        }
        gate.busy += 1;
        drop(gate);
        let r = self.destroy_locked(&pmo, &keys);
        let mut gate = pmo.lock_holders();
        gate.busy -= 1;
        if r.is_ok() {
            gate.gone = true;
        }
        pmo.holders_changed.notify_all();
        r
    }

    fn destroy_locked(&self, pmo: &Arc<LivePmo>, keys: &PmoKeys) -> Result<(), StoreError> {
        let (off, len, seq, copy) = {
            let mut cell = pmo.lock_rec();
            // The commit point: a rollback anchor learns that this slot moved on.
            cell.rec.state = PmoState::Destroying;
            self.inner.write_rec_commit(pmo, &mut cell, keys)?;
            let (off, len) = (cell.rec.ext_off, cell.rec.ext_len);
            self.inner.medium.zero(off, len)?;
            self.inner.medium.persist(off, len)?;
            cell.rec.state = PmoState::Free;
            self.inner.write_rec(pmo, &mut cell)?;
            self.inner.extent_keys.released(pmo.slot)?;
            (off, len, cell.rec.seq, cell.copy)
        };
        // The record lock is released first: the lock order is catalog -> record.
        let mut cat = self.inner.lock_catalog();
        cat.names.remove(&pmo.name);
        cat.alloc.release(off, len);
        cat.free_slots.insert(pmo.slot, (seq, copy));
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
        let pmo = self.lookup(name)?;
        let keys = Self::unlock(&pmo, key, &self.inner.suites)?;
        if let Some(why) = pmo.damaged.locked().clone() {
            return Err(StoreError::Corrupt {
                name: name.to_string(),
                why,
            });
        }
        {
            let mut gate = Self::wait_idle(&pmo);
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
        match session::Session::start(self.inner.clone(), pmo.clone(), perm, keys, design) {
            Ok(s) => Ok(s),
            Err(e) => {
                session::release_holder(&pmo, perm);
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
        pmo_crypto::wipe(&mut buf);
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
