//! Attach sessions: fault, psync, detach and the crash handler.

mod detach;
mod psync;

use super::tree::{GroupCursor, TreeCache};
use super::{Design, LivePmo, Perm, PmoState, StoreError, StoreState};
use locked::{Locked, RwLocked};
use pmo_crypto::wipe;
use pmo_crypto::{CipherCache, KeyGen, PageId, PmoKeys, PAGE};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

/// Plaintext of a whole PMO held by a `wedi` session (zeroized on drop).
struct PlainCopy(Vec<u8>);

impl Drop for PlainCopy {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// What an attach session and its background detach share: the keys, the tree cache and the
/// session's page bookkeeping.
struct Attachment {
    store: Arc<StoreState>,
    pmo: Arc<LivePmo>,
    perm: Perm,
    design: Design,
    keys: PmoKeys,
    /// The generation this session seals pages under (writers only; see `crypto::page_keys`).
    gen: Option<KeyGen>,
    tree: TreeCache,
    /// Faults hold it shared; psync holds it exclusive while primaries and tree change.
    io: RwLock<()>,
    /// Pages faulted in this session (BP re-encrypts them at detach).
    touched: Mutex<BTreeSet<u64>>,
    /// `wedi`: the attach-time plaintext.
    plain: Option<RwLock<PlainCopy>>,
    /// Serialises psync calls.
    psync_lock: Mutex<()>,
    /// Id designs: plaintext of pages psync'd without a tag yet (the shadow, until UC).
    pending: Mutex<BTreeMap<u64, Box<[u8; PAGE]>>>,
    /// Psync defers tags (an `id` design with a suite whose tags can be): only then can
    /// `pending` hold pages, so only then do faults look there.
    defers_tags: bool,
}

/// What consecutive page reads of one fault run share: the leaf group and the cipher of
/// the last page.
#[derive(Default)]
struct RunCache<'k> {
    group: GroupCursor,
    cipher: CipherCache<'k>,
}

/// An attach session on one PMO. `Send + Sync`: `fault` may run from several threads at once.
/// Dropping a session without [`Session::detach`] runs the crash handler: the PMO stays as of its
/// last psync, encrypted, and becomes detached.
pub struct Session {
    attachment: Arc<Attachment>,
    /// Set by `detach`, so `drop` knows the crash handler is not needed.
    detached: bool,
}

/// Completion of a nonblocking detach.
pub struct DetachHandle {
    thread: Option<threads::JoinHandle<Result<(), StoreError>>>,
    inline: Option<Result<(), StoreError>>,
}

impl DetachHandle {
    /// Whether the background work has ended ([`DetachHandle::wait`] would not block).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the background part of the detach and returns its outcome.
    pub fn wait(mut self) -> Result<(), StoreError> {
        if let Some(t) = self.thread.take() {
            return t.join().map_err(|_| StoreError::Worker)?;
        }
        self.inline.take().unwrap_or(Ok(()))
    }
}

pub(crate) fn release_holder(pmo: &LivePmo, perm: Perm) {
    let mut g = pmo.lock_holders();
    match perm {
        Perm::Write => g.writer = false,
        Perm::Read => g.readers = g.readers.saturating_sub(1),
    }
    pmo.holders_changed.notify_all();
}

/// The epoch of the next commit: above every epoch already used (checked; a counter at its
/// maximum is refused, never wrapped).
fn next_epoch(rec: &crate::record::Record) -> Result<u64, StoreError> {
    let after = rec
        .epoch
        .checked_add(1)
        .ok_or(StoreError::CounterExhausted("epoch"))?;
    Ok(rec.next_epoch.max(after))
}

fn integrity(page: u64) -> impl Fn(crate::TreeError) -> StoreError {
    move |e| match e {
        crate::TreeError::Medium(m) => StoreError::Medium(m),
        crate::TreeError::Mismatch { .. } => StoreError::Integrity { page },
    }
}

impl Session {
    pub(crate) fn start(
        store: Arc<StoreState>,
        pmo: Arc<LivePmo>,
        perm: Perm,
        keys: PmoKeys,
        design: Option<Design>,
    ) -> Result<Session, StoreError> {
        let gen = match perm {
            Perm::Write => Some(PmoKeys::new_generation()?),
            Perm::Read => None,
        };
        let rt2 = pmo.clone();
        let mut cell = rt2.lock_rec();
        let r = &cell.rec;
        // Every field that decides how pages are encrypted and checked (suite, KDF cost, uid,
        // salt, IV, size, extent, design, epochs, root), and the table slot the record was
        // sealed for, is under this MAC: a keyless edit of any of them, or the record copied
        // into another slot, is refused here, never used.
        if !r.verify(&keys, &store.superblock.uuid, pmo.slot) {
            return Err(StoreError::Corrupt {
                name: pmo.name.clone(),
                why: "record MAC".into(),
            });
        }
        let root = r.root;
        let design = design.unwrap_or(r.design);
        // A suite of another crate (the harness's benchmark suites) opens only where it was
        // registered; the record MAC above already held, so this is a genuine PMO of it.
        if !keys.suite_available() {
            return Err(pmo_crypto::CryptoError::SuiteUnavailable(r.keys.suite.code()).into());
        }
        let extent = crate::extents::extent(pmo.slot, r.ext_off, r.ext_len, &r.keys, &r.kcv);
        store
            .extent_keys
            .require_range_encryption(&pmo.name, &extent, design, r.keys.suite)?;
        let defers_tags = design.defers_checksum() && keys.tags_separable();
        let mut attachment = Attachment {
            store,
            pmo,
            perm,
            design,
            keys,
            gen,
            tree: TreeCache::new(root),
            io: RwLock::new(()),
            touched: Mutex::new(BTreeSet::new()),
            plain: None,
            psync_lock: Mutex::new(()),
            pending: Mutex::new(BTreeMap::new()),
            defers_tags,
        };
        // Persist R/W (first attacher only), as in the papers' diagrams.
        let want = match perm {
            Perm::Write => PmoState::Write,
            Perm::Read => PmoState::Read,
        };
        if cell.rec.state == PmoState::Detached || want == PmoState::Write {
            cell.rec.state = want;
            attachment.store.write_rec(&attachment.pmo, &mut cell)?;
        }
        // Id crash handler: tags left pending by a session that died with the power.
        if cell.rec.pending_tags > 0 {
            if let Err(e) = attachment.finish_pending_tags(&mut cell) {
                drop(cell);
                attachment.mark_detached_after_failure();
                return Err(e);
            }
        }
        drop(cell);
        if design.verifies_at_attach() {
            // LPMO C: the CPU checks the whole PMO before the guest may use any of it.
            if let Err(e) = attachment.verify_every_page(&BTreeMap::new()) {
                attachment.mark_detached_after_failure();
                return Err(e);
            }
        }
        if design.whole() {
            // WEDI: decrypt and verify the whole PMO now.
            let n = attachment.pmo.npages as usize;
            let bytes = attachment.pmo.npages * PAGE as u64;
            // SAFETY: sysconf has no memory effects.
            let phys = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) }.max(0) as u64 * PAGE as u64;
            let mut v: Vec<u8> = Vec::new();
            if bytes > phys / 2 || v.try_reserve_exact(n * PAGE).is_err() {
                attachment.mark_detached_after_failure();
                return Err(StoreError::TooLargeForDesign {
                    design: design.name(),
                    size: bytes,
                });
            }
            v.resize(n * PAGE, 0);
            let mut plain = PlainCopy(v);
            for p in 0..n as u64 {
                let mut page = [0u8; PAGE];
                let r = attachment.fault_medium(p, &mut page);
                if let Err(e) = r {
                    attachment.mark_detached_after_failure();
                    return Err(e);
                }
                plain.0[p as usize * PAGE..(p as usize + 1) * PAGE].copy_from_slice(&page);
                wipe(&mut page[..]);
            }
            attachment.plain = Some(RwLock::new(plain));
        }
        Ok(Session {
            attachment: Arc::new(attachment),
            detached: false,
        })
    }

    fn attachment(&self) -> &Arc<Attachment> {
        &self.attachment
    }

    /// Number of pages in the PMO.
    pub fn pages(&self) -> u64 {
        self.attachment().pmo.npages
    }

    /// True when reading a page may wait for modelled media time: the hint the store's
    /// media came with ([`pmo_media::Backing::reads_wait`]), for the pager's scheduling.
    pub fn reads_wait(&self) -> bool {
        self.attachment().store.reads_wait
    }

    /// The design this session runs.
    pub fn design(&self) -> Design {
        self.attachment().design
    }

    /// The access mode.
    pub fn perm(&self) -> Perm {
        self.attachment().perm
    }

    /// Serves a page fault: verified plaintext of `page` into `out`. On any failure `out` holds no
    /// plaintext (it is zeroed). Callable concurrently for different pages.
    pub fn fault(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        self.fault_run(page, std::slice::from_mut(out))
            .map_err(|(_, e)| e)
    }

    /// Serves faults on the consecutive pages `first ..`, one per buffer of `out`, in order:
    /// what a prefetch of a sequential run asks for. The session's I/O lock is taken once
    /// and consecutive pages share their tree group and cipher lookups, so threads filling
    /// runs side by side do not meet on a lock per page. On a failure at `first + i` the
    /// error comes back with `i`: `out[i]` holds no plaintext (it is zeroed) and `out[..i]`
    /// holds verified pages; nothing after `i` is read.
    pub fn fault_run(&self, first: u64, out: &mut [[u8; PAGE]]) -> Result<(), (usize, StoreError)> {
        let c = self.attachment();
        let npages = c.pmo.npages;
        let mut cache = RunCache::default();
        // `wedi` copies from its attach-time plaintext and touches no primary.
        let _io = c.plain.is_none().then(|| c.io.read_locked());
        // BP re-encrypts at detach the pages read from the medium.
        let track = c.design.reencrypt_touched_at_detach();
        let mut touched = Vec::new();
        let mut result = Ok(());
        for (i, o) in out.iter_mut().enumerate() {
            let page = match first.checked_add(i as u64).filter(|p| *p < npages) {
                Some(p) => p,
                None => {
                    wipe(&mut o[..]);
                    let page = first.saturating_add(i as u64);
                    result = Err((i, StoreError::PageOutOfRange { page, npages }));
                    break;
                }
            };
            if let Some(plain) = &c.plain {
                let g = plain.read_locked();
                let a = page as usize * PAGE;
                o.copy_from_slice(&g.0[a..a + PAGE]);
                continue;
            }
            if c.defers_tags {
                if let Some(p) = c.pending.locked().get(&page) {
                    // Id: psync'd, checksum not yet updated: the shadow copy is authoritative.
                    o.copy_from_slice(&p[..]);
                    continue;
                }
            }
            if let Err(e) = c.fault_medium_cached(page, o, &mut cache) {
                result = Err((i, e));
                break;
            }
            if track {
                touched.push(page);
            }
        }
        if !touched.is_empty() {
            c.touched.locked().extend(touched);
        }
        result
    }

    /// Atomically persists the given dirty pages (page index, plaintext). A crash at any instant
    /// leaves the PMO exactly as before or exactly as after. Later duplicates of a page win.
    pub fn psync<'a, I>(&self, pages: I) -> Result<(), StoreError>
    where
        I: IntoIterator<Item = (u64, &'a [u8; PAGE])>,
    {
        let c = self.attachment();
        if c.perm != Perm::Write {
            return Err(StoreError::ReadOnly);
        }
        let mut dirty: BTreeMap<u64, &[u8; PAGE]> = BTreeMap::new();
        for (p, d) in pages {
            if p >= c.pmo.npages {
                return Err(StoreError::PageOutOfRange {
                    page: p,
                    npages: c.pmo.npages,
                });
            }
            dirty.insert(p, d);
        }
        let _serial = c.psync_lock.locked();
        if let Some(plain) = &c.plain {
            // WED/Ip: the PMO-level checksum covers every page: re-verify all pages' tags.
            c.verify_every_page(&dirty)?;
            let mut g = plain.write_locked();
            for (p, d) in &dirty {
                let a = *p as usize * PAGE;
                g.0[a..a + PAGE].copy_from_slice(&d[..]);
            }
        }
        let defer = c.defers_tags;
        c.commit(dirty.into_iter(), defer)
    }

    /// Nonblocking detach: returns at once; the design's detach work (re-encryption for `wedi`
    /// and `bp`, journal area scrub for all) runs in the background. A later attach of the same PMO waits.
    pub fn detach(mut self) -> DetachHandle {
        self.detached = true;
        let attachment = self.attachment.clone();
        attachment.pmo.lock_holders().busy += 1;
        let worker = attachment.clone();
        let name = format!("pmo-detach-{}", attachment.pmo.slot);
        let spawned = threads::spawn(threads::ThreadKind::PmoDetach, name, move || {
            let r = worker.detach_work();
            worker.finish_detach();
            if let Err(e) = &r {
                log::warn!("background detach of {:?} failed: {e}", worker.pmo.name);
            }
            r
        });
        match spawned {
            Ok(t) => DetachHandle {
                thread: Some(t),
                inline: None,
            },
            Err(_) => {
                // No thread available: do the work inline.
                let r = attachment.detach_work();
                attachment.finish_detach();
                DetachHandle {
                    thread: None,
                    inline: Some(r),
                }
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.detached {
            let attachment = &self.attachment;
            // Crash handler: nothing plaintext is on the medium; scrub the journal area and detach.
            attachment.pmo.lock_holders().busy += 1;
            // The LOaPP crash handler: finish the Id checksum update (we still hold the key).
            if let Err(e) = attachment.update_checksums() {
                log::warn!("crash handler for {:?}: {e}", attachment.pmo.name);
            }
            if let Err(e) = attachment.shadow_scrub() {
                log::warn!("crash handler for {:?}: {e}", attachment.pmo.name);
            }
            attachment.finish_detach();
        }
    }
}

impl Attachment {
    fn meta_off(&self) -> u64 {
        self.pmo.ext_off + self.pmo.geometry().meta_rel()
    }

    /// Reads, verifies and decrypts one page from the medium.
    fn fault_medium(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        self.fault_medium_cached(page, out, &mut RunCache::default())
    }

    /// [`Attachment::fault_medium`] for one page of a run, through the run's cache.
    fn fault_medium_cached<'k>(
        &'k self,
        page: u64,
        out: &mut [u8; PAGE],
        cache: &mut RunCache<'k>,
    ) -> Result<(), StoreError> {
        let m = &*self.store.medium;
        let leaf = self
            .tree
            .leaf_at(&self.pmo.layout, m, self.meta_off(), page, &mut cache.group)
            .map_err(integrity(page));
        let leaf = match leaf {
            Ok(l) => l,
            Err(e) => {
                wipe(&mut out[..]);
                return Err(e);
            }
        };
        if leaf.version == 0 {
            wipe(&mut out[..]);
            return Ok(());
        }
        if let Err(e) = m.read(self.pmo.ext_off + page * PAGE as u64, out) {
            wipe(&mut out[..]);
            return Err(e.into());
        }
        let id = PageId {
            uid: self.keys.params().uid,
            page: page as u32,
            version: leaf.version,
            gen: leaf.gen,
        };
        self.keys
            .open_page_cached(id, out, &leaf.tag, &mut cache.cipher)
            .map_err(|_| StoreError::Integrity { page })
    }

    fn verify_every_page(&self, skip: &BTreeMap<u64, &[u8; PAGE]>) -> Result<(), StoreError> {
        let mut buf = [0u8; PAGE];
        let mut cache = RunCache::default();
        for p in 0..self.pmo.npages {
            if skip.contains_key(&p) {
                continue;
            }
            self.fault_medium_cached(p, &mut buf, &mut cache)?;
        }
        wipe(&mut buf[..]);
        Ok(())
    }
}
