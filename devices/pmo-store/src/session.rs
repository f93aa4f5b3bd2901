//! Attach sessions: fault, psync, detach and the crash handler.

use super::journal::{self, JournalWriter};
use super::tree::{Leaf, TreeCache, TreeUpdate};
use super::{Design, Perm, PmoRt, PmoState, StoreError, StoreInner};
use crate::crypto::wipe;
use crate::crypto::{KeyGen, PageId, PmoKeys, PAGE, TAG_LEN};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

/// Plaintext of a whole PMO held by a `wedi` session (zeroized on drop).
struct PlainCopy(Vec<u8>);

impl Drop for PlainCopy {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

struct Core {
    store: Arc<StoreInner>,
    rt: Arc<PmoRt>,
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
}

/// An attach session on one PMO. `Send + Sync`: `fault` may run from several threads at once.
/// Dropping a session without [`Session::detach`] runs the crash handler: the PMO stays as of its
/// last psync, encrypted, and becomes detached.
pub struct Session {
    core: Arc<Core>,
    /// Set by `detach`, so `drop` knows the crash handler is not needed.
    detached: bool,
}

/// Completion of a nonblocking detach.
pub struct DetachHandle {
    thread: Option<std::thread::JoinHandle<Result<(), StoreError>>>,
    inline: Option<Result<(), StoreError>>,
}

impl DetachHandle {
    /// Waits for the background part of the detach and returns its outcome.
    pub fn wait(mut self) -> Result<(), StoreError> {
        if let Some(t) = self.thread.take() {
            return t.join().map_err(|_| StoreError::Worker)?;
        }
        self.inline.take().unwrap_or(Ok(()))
    }
}

pub(crate) fn release_gate(rt: &PmoRt, perm: Perm) {
    let mut g = rt.lock_gate();
    match perm {
        Perm::Write => g.writer = false,
        Perm::Read => g.readers = g.readers.saturating_sub(1),
    }
    rt.cv.notify_all();
}

/// The epoch of the next commit: above every epoch already used (checked; a counter at its
/// maximum is refused, never wrapped).
fn next_epoch(rec: &super::record::Record) -> Result<u64, StoreError> {
    let after = rec
        .epoch
        .checked_add(1)
        .ok_or(StoreError::CounterExhausted("epoch"))?;
    Ok(rec.next_epoch.max(after))
}

fn integrity(page: u64) -> impl Fn(super::TreeError) -> StoreError {
    move |e| match e {
        super::TreeError::Medium(m) => StoreError::Medium(m),
        super::TreeError::Mismatch { .. } => StoreError::Integrity { page },
    }
}

impl Session {
    pub(crate) fn start(
        store: Arc<StoreInner>,
        rt: Arc<PmoRt>,
        perm: Perm,
        keys: PmoKeys,
        design: Option<Design>,
    ) -> Result<Session, StoreError> {
        let gen = match perm {
            Perm::Write => Some(PmoKeys::new_generation()?),
            Perm::Read => None,
        };
        let rt2 = rt.clone();
        let mut cell = rt2.lock_rec();
        let r = &cell.rec;
        // Every field that decides how pages are encrypted and checked (suite, KDF cost, uid,
        // salt, IV, size, extent, design, epochs, root) is under this MAC: a keyless edit of
        // any of them is refused here, never used.
        if !r.verify(&keys, &store.sb.uuid) {
            return Err(StoreError::Corrupt {
                name: rt.name.clone(),
                why: "record MAC".into(),
            });
        }
        let root = r.root;
        let design = design.unwrap_or(r.design);
        let mut core = Core {
            store,
            rt,
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
        };
        // Persist R/W (first attacher only), as in the papers' diagrams.
        let want = match perm {
            Perm::Write => PmoState::Write,
            Perm::Read => PmoState::Read,
        };
        if cell.rec.state == PmoState::Detached || want == PmoState::Write {
            cell.rec.state = want;
            core.store.write_rec(&core.rt, &mut cell)?;
        }
        // Id crash handler: tags left pending by a session that died with the power.
        if cell.rec.pending_tags > 0 {
            if let Err(e) = core.finish_pending_tags(&mut cell) {
                drop(cell);
                core.mark_detached_after_failure();
                return Err(e);
            }
        }
        drop(cell);
        if design.whole() {
            // WEDI: decrypt and verify the whole PMO now.
            let n = core.rt.npages as usize;
            let bytes = core.rt.npages * PAGE as u64;
            // SAFETY: sysconf has no memory effects.
            let phys = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) }.max(0) as u64 * PAGE as u64;
            let mut v: Vec<u8> = Vec::new();
            if bytes > phys / 2 || v.try_reserve_exact(n * PAGE).is_err() {
                core.mark_detached_after_failure();
                return Err(StoreError::TooLargeForDesign {
                    design: design.name(),
                    size: bytes,
                });
            }
            v.resize(n * PAGE, 0);
            let mut plain = PlainCopy(v);
            for p in 0..n as u64 {
                let mut page = [0u8; PAGE];
                let r = core.fault_medium(p, &mut page);
                if let Err(e) = r {
                    core.mark_detached_after_failure();
                    return Err(e);
                }
                plain.0[p as usize * PAGE..(p as usize + 1) * PAGE].copy_from_slice(&page);
                wipe(&mut page[..]);
            }
            core.plain = Some(RwLock::new(plain));
        }
        Ok(Session {
            core: Arc::new(core),
            detached: false,
        })
    }

    fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// Number of pages in the PMO.
    pub fn pages(&self) -> u64 {
        self.core().rt.npages
    }

    /// The design this session runs.
    pub fn design(&self) -> Design {
        self.core().design
    }

    /// The access mode.
    pub fn perm(&self) -> Perm {
        self.core().perm
    }

    /// Serves a page fault: verified plaintext of `page` into `out`. On any failure `out` holds no
    /// plaintext (it is zeroed). Callable concurrently for different pages.
    pub fn fault(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        let c = self.core();
        if page >= c.rt.npages {
            return Err(StoreError::PageOutOfRange {
                page,
                npages: c.rt.npages,
            });
        }
        if let Some(plain) = &c.plain {
            let g = plain.read().unwrap_or_else(|e| e.into_inner());
            let a = page as usize * PAGE;
            out.copy_from_slice(&g.0[a..a + PAGE]);
            return Ok(());
        }
        if let Some(p) = c
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&page)
        {
            // Id: psync'd, checksum not yet updated: the shadow copy is authoritative.
            out.copy_from_slice(&p[..]);
            return Ok(());
        }
        let _io = c.io.read().unwrap_or_else(|e| e.into_inner());
        c.fault_medium(page, out)?;
        c.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(page);
        Ok(())
    }

    /// Atomically persists the given dirty pages (page index, plaintext). A crash at any instant
    /// leaves the PMO exactly as before or exactly as after. Later duplicates of a page win.
    pub fn psync<'a, I>(&self, pages: I) -> Result<(), StoreError>
    where
        I: IntoIterator<Item = (u64, &'a [u8; PAGE])>,
    {
        let c = self.core();
        if c.perm != Perm::Write {
            return Err(StoreError::ReadOnly);
        }
        let mut dirty: BTreeMap<u64, &[u8; PAGE]> = BTreeMap::new();
        for (p, d) in pages {
            if p >= c.rt.npages {
                return Err(StoreError::PageOutOfRange {
                    page: p,
                    npages: c.rt.npages,
                });
            }
            dirty.insert(p, d);
        }
        let _serial = c.psync_lock.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plain) = &c.plain {
            // WED/Ip: the PMO-level checksum covers every page: re-verify all pages' tags.
            c.verify_every_page(&dirty)?;
            let mut g = plain.write().unwrap_or_else(|e| e.into_inner());
            for (p, d) in &dirty {
                let a = *p as usize * PAGE;
                g.0[a..a + PAGE].copy_from_slice(&d[..]);
            }
        }
        let defer = c.design.defers_checksum() && c.keys.tags_separable();
        c.commit(dirty.into_iter(), defer)
    }

    /// Nonblocking detach: returns at once; the design's detach work (re-encryption for `wedi`
    /// and `bp`, TSC scrub for all) runs in the background. A later attach of the same PMO waits.
    pub fn detach(mut self) -> DetachHandle {
        self.detached = true;
        let core = self.core.clone();
        core.rt.lock_gate().busy += 1;
        let worker = core.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("pmo-detach-{}", core.rt.slot))
            .spawn(move || {
                let r = worker.detach_work();
                worker.finish_detach();
                if let Err(e) = &r {
                    log::warn!("background detach of {:?} failed: {e}", worker.rt.name);
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
                let r = core.detach_work();
                core.finish_detach();
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
            let core = &self.core;
            // Crash handler: nothing plaintext is on the medium; scrub the TSC and detach.
            core.rt.lock_gate().busy += 1;
            // The LOaPP crash handler: finish the Id checksum update (we still hold the key).
            if let Err(e) = core.update_checksums() {
                log::warn!("crash handler for {:?}: {e}", core.rt.name);
            }
            if let Err(e) = core.shadow_scrub() {
                log::warn!("crash handler for {:?}: {e}", core.rt.name);
            }
            core.finish_detach();
        }
    }
}

impl Core {
    fn meta_off(&self) -> u64 {
        self.rt.ext_off + self.rt.geometry().meta_rel()
    }

    /// Reads, verifies and decrypts one page from the medium.
    fn fault_medium(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        let m = &*self.store.m;
        let leaf = self
            .tree
            .leaf(&self.rt.layout, m, self.meta_off(), page)
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
        if let Err(e) = m.read(self.rt.ext_off + page * PAGE as u64, out) {
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
            .open_page(id, out, &leaf.tag)
            .map_err(|_| StoreError::Integrity { page })
    }

    fn verify_every_page(&self, skip: &BTreeMap<u64, &[u8; PAGE]>) -> Result<(), StoreError> {
        let mut buf = [0u8; PAGE];
        for p in 0..self.rt.npages {
            if skip.contains_key(&p) {
                continue;
            }
            self.fault_medium(p, &mut buf)?;
        }
        wipe(&mut buf[..]);
        Ok(())
    }

    /// The psync engine for plaintext pages: encrypt each under the new epoch, then commit.
    /// `defer` (Id designs) skips the tags: leaves get a zero tag and the plaintext stays in the
    /// session until the checksum update (UC) at detach.
    fn commit<'a>(
        &self,
        pages: impl Iterator<Item = (u64, &'a [u8; PAGE])>,
        defer: bool,
    ) -> Result<(), StoreError> {
        let uid = self.keys.params().uid;
        let gen = self.gen.ok_or(StoreError::ReadOnly)?;
        let mut cell = self.rt.lock_rec();
        let epoch = next_epoch(&cell.rec)?;
        let mut cts: Vec<(u64, Box<[u8; PAGE]>)> = Vec::new();
        let mut leaves = BTreeMap::new();
        let mut kept = Vec::new();
        for (p, plain) in pages {
            let id = PageId {
                uid,
                page: p as u32,
                version: epoch,
                gen,
            };
            let mut ct = Box::new(*plain);
            let tag = if defer {
                self.keys.encrypt_page(id, &mut ct)?;
                kept.push((p, Box::new(*plain)));
                [0u8; TAG_LEN]
            } else {
                self.keys.seal_page(id, &mut ct)?
            };
            leaves.insert(
                p,
                Leaf {
                    version: epoch,
                    gen,
                    tag,
                },
            );
            cts.push((p, ct));
        }
        if cts.is_empty() {
            return Ok(());
        }
        if !defer {
            let pending_after = {
                // Pages rewritten with a tag are no longer pending.
                let pend = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                pend.keys().filter(|p| !leaves.contains_key(p)).count() as u64
            };
            self.commit_changes(&mut cell, epoch, &cts, &leaves, pending_after)?;
            let mut pend = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            for p in leaves.keys() {
                if let Some(mut old) = pend.remove(p) {
                    wipe(&mut old[..]);
                }
            }
            return Ok(());
        }
        // Id: the kept plaintext must serve faults as soon as the untagged leaves are visible,
        // so it goes in first and comes out again if the commit fails.
        let (previous, pending_after) = {
            let mut pend = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let mut previous = Vec::new();
            for (p, plain) in kept {
                previous.push((p, pend.insert(p, plain)));
            }
            (previous, pend.len() as u64)
        };
        let r = self.commit_changes(&mut cell, epoch, &cts, &leaves, pending_after);
        let mut pend = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for (p, old) in previous {
            match (&r, old) {
                (Ok(()), Some(mut o)) => wipe(&mut o[..]),
                (Ok(()), None) => {}
                (Err(_), Some(o)) => {
                    if let Some(mut new) = pend.insert(p, o) {
                        wipe(&mut new[..]);
                    }
                }
                (Err(_), None) => {
                    if let Some(mut new) = pend.remove(&p) {
                        wipe(&mut new[..]);
                    }
                }
            }
        }
        r
    }

    /// EP: reserve the epoch and write the journal into the TSC; TC: commit the record; copy the
    /// journal to primaries and tree; back to R/W.
    fn commit_changes(
        &self,
        cell: &mut super::RecCell,
        epoch: u64,
        cts: &[(u64, Box<[u8; PAGE]>)],
        leaves: &BTreeMap<u64, Leaf>,
        pending_after: u64,
    ) -> Result<(), StoreError> {
        let m = &*self.store.m;
        let geo = self.rt.geometry();
        let up: TreeUpdate = self
            .tree
            .plan(&self.rt.layout, m, self.meta_off(), leaves)
            .map_err(|e| StoreError::Corrupt {
                name: self.rt.name.clone(),
                why: e.to_string(),
            })?;
        let jlen = journal::HEADER
            + cts.len() as u64 * journal::entry_cost(PAGE as u64)
            + up.groups
                .values()
                .map(|g| journal::entry_cost(g.len() as u64))
                .sum::<u64>();
        // EP: reserve the epoch and note how much TSC will be dirty.
        let back_to = cell.rec.state;
        cell.rec.state = PmoState::EncryptPersist;
        cell.rec.next_epoch = epoch
            .checked_add(1)
            .ok_or(StoreError::CounterExhausted("epoch"))?;
        cell.rec.tsc_dirty = cell.rec.tsc_dirty.max(jlen);
        self.store.write_rec_keyed(&self.rt, cell, &self.keys)?;
        let tsc = self.rt.ext_off + geo.tsc_rel();
        let mut w = JournalWriter::new(m, tsc, geo.tsc_len);
        let mut entries: Vec<(u64, &[u8])> = Vec::with_capacity(cts.len() + up.groups.len());
        for (p, ct) in cts {
            entries.push((p * PAGE as u64, &ct[..]));
        }
        for ((k, g), bytes) in &up.groups {
            entries.push((geo.meta_rel() + self.rt.layout.group_range(*k, *g).0, bytes));
        }
        for (i, (dest, data)) in entries.iter().enumerate() {
            // Pages (the first `cts.len()` entries) are covered by their tags, tree groups by
            // the journal checksum.
            w.append(*dest, data, i >= cts.len())?;
        }
        let (len, sum) = w.finish(epoch)?;
        // TC: the commit point.
        cell.rec.state = PmoState::TscCopy;
        cell.rec.epoch = epoch;
        cell.rec.root = up.root;
        cell.rec.journal_len = len;
        cell.rec.journal_sum = sum;
        cell.rec.pending_tags = pending_after;
        self.store.write_rec_commit(&self.rt, cell, &self.keys)?;
        {
            let _io = self.io.write().unwrap_or_else(|e| e.into_inner());
            journal::apply_entries(m, self.rt.ext_off, &entries)?;
            self.tree.apply(&up);
        }
        cell.rec.state = if back_to == PmoState::Read {
            PmoState::Read
        } else {
            PmoState::Write
        };
        cell.rec.journal_len = 0;
        self.store.write_rec(&self.rt, cell)?;
        Ok(())
    }

    /// UC: compute the deferred tags of every pending page (its ciphertext is re-derived from the
    /// kept plaintext: XTS is deterministic for a given tweak) and commit them with the tree.
    fn update_checksums(&self) -> Result<(), StoreError> {
        let pend: Vec<(u64, Box<[u8; PAGE]>)> = {
            let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut *g).into_iter().collect()
        };
        if pend.is_empty() {
            return Ok(());
        }
        let uid = self.keys.params().uid;
        let m = &*self.store.m;
        let mut leaves = BTreeMap::new();
        for (p, plain) in &pend {
            let leaf = self
                .tree
                .leaf(&self.rt.layout, m, self.meta_off(), *p)
                .map_err(integrity(*p))?;
            let id = PageId {
                uid,
                page: *p as u32,
                version: leaf.version,
                gen: leaf.gen,
            };
            let mut ct = Box::new(**plain);
            self.keys.encrypt_page(id, &mut ct)?;
            let tag = self.keys.tag_page(id, &ct)?;
            leaves.insert(
                *p,
                Leaf {
                    version: leaf.version,
                    gen: leaf.gen,
                    tag,
                },
            );
        }
        let r = {
            let mut cell = self.rt.lock_rec();
            next_epoch(&cell.rec)
                .and_then(|epoch| self.commit_changes(&mut cell, epoch, &[], &leaves, 0))
        };
        match r {
            Ok(()) => {
                for (_, mut plain) in pend {
                    wipe(&mut plain[..]);
                }
                Ok(())
            }
            Err(e) => {
                // Keep them for a retry by the crash handler.
                let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                for (p, plain) in pend {
                    g.insert(p, plain);
                }
                Err(e)
            }
        }
    }

    /// Crash handler of the Id designs after a power loss: tags of pages psync'd but never
    /// checksummed are computed from the ciphertext on the medium (the paper's CrH; it trusts
    /// the medium for those pages, see docs/store.md).
    fn finish_pending_tags(&self, cell: &mut super::RecCell) -> Result<(), StoreError> {
        let m = &*self.store.m;
        let uid = self.keys.params().uid;
        let mut leaves = BTreeMap::new();
        let mut ct = Box::new([0u8; PAGE]);
        for p in 0..self.rt.npages {
            let leaf = self
                .tree
                .leaf(&self.rt.layout, m, self.meta_off(), p)
                .map_err(integrity(p))?;
            if leaf.version == 0 || leaf.tag != [0u8; TAG_LEN] {
                continue;
            }
            m.read(self.rt.ext_off + p * PAGE as u64, &mut ct[..])?;
            let id = PageId {
                uid,
                page: p as u32,
                version: leaf.version,
                gen: leaf.gen,
            };
            let tag = self.keys.tag_page(id, &ct)?;
            leaves.insert(
                p,
                Leaf {
                    version: leaf.version,
                    gen: leaf.gen,
                    tag,
                },
            );
        }
        if leaves.is_empty() {
            cell.rec.pending_tags = 0;
            return self.store.write_rec_keyed(&self.rt, cell, &self.keys);
        }
        let epoch = next_epoch(&cell.rec)?;
        self.commit_changes(cell, epoch, &[], &leaves, 0)
    }

    /// Detach work of the design, then the shadow scrub.
    fn detach_work(&self) -> Result<(), StoreError> {
        // UC (Id designs): the deferred checksums.
        self.update_checksums()?;
        if self.perm == Perm::Write {
            if let Some(plain) = &self.plain {
                // WED/Ip: encrypt the whole PMO at detach.
                let g = plain.read().unwrap_or_else(|e| e.into_inner());
                let pages: Vec<(u64, &[u8; PAGE])> =
                    g.0.chunks_exact(PAGE)
                        .enumerate()
                        .filter_map(|(i, c)| <&[u8; PAGE]>::try_from(c).ok().map(|a| (i as u64, a)))
                        .collect();
                self.commit(pages.into_iter(), false)?;
            } else if self.design.reencrypt_touched_at_detach() {
                // BP: EPP/CPP re-encrypt every touched page.
                let touched: Vec<u64> = self
                    .touched
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .copied()
                    .collect();
                let mut bufs: Vec<(u64, Box<[u8; PAGE]>)> = Vec::with_capacity(touched.len());
                for p in touched {
                    let mut b = Box::new([0u8; PAGE]);
                    self.fault_medium(p, &mut b)?;
                    bufs.push((p, b));
                }
                let r = self.commit(bufs.iter().map(|(p, b)| (*p, &**b)), false);
                for (_, b) in &mut bufs {
                    wipe(&mut b[..]);
                }
                r?;
            }
        }
        self.shadow_scrub()
    }

    /// DS/DT: scrub the TSC, then record D (or R if other readers remain).
    fn shadow_scrub(&self) -> Result<(), StoreError> {
        let others = {
            let g = self.rt.lock_gate();
            match self.perm {
                Perm::Write => 0,
                Perm::Read => g.readers.saturating_sub(1),
            }
        };
        let mut cell = self.rt.lock_rec();
        if others > 0 {
            return Ok(());
        }
        if cell.rec.tsc_dirty > 0 {
            cell.rec.state = PmoState::DestroyShadow;
            self.store.write_rec(&self.rt, &mut cell)?;
            self.store.scrub_tsc(&self.rt, cell.rec.tsc_dirty)?;
            cell.rec.tsc_dirty = 0;
        }
        cell.rec.state = PmoState::Detached;
        self.store.write_rec(&self.rt, &mut cell)?;
        Ok(())
    }

    fn finish_detach(&self) {
        let mut g = self.rt.lock_gate();
        match self.perm {
            Perm::Write => g.writer = false,
            Perm::Read => g.readers = g.readers.saturating_sub(1),
        }
        g.busy = g.busy.saturating_sub(1);
        self.rt.cv.notify_all();
    }

    fn mark_detached_after_failure(&self) {
        if let Err(e) = self.shadow_scrub() {
            log::warn!("detach after failed attach of {:?}: {e}", self.rt.name);
        }
    }
}
