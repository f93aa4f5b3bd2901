//! Opening a store: the superblock, the table as `admit.rs` admits it against the rollback
//! anchor, and recovery of PMOs caught in the middle of an operation. Also the keyless `fsck`.
//!
//! Recovery per persistent state (no key is needed for any of it):
//!
//! | state at crash | meaning | recovery |
//! |---|---|---|
//! | D | at rest | nothing |
//! | R, W | session died (process, VMM or power) | crash handler: scrub journal area, -> D |
//! | EP | psync/detach encrypting into journal area, not committed | discard journal area, -> D (old state) |
//! | TC | committed, copy to primaries unfinished | verify journal, redo copy, scrub, -> D (new state) |
//! | DS | scrubbing journal area | scrub again, -> D |
//! | destroying | pdestroy scrubbing | scrub extent, -> free |

use super::admit::{self, validate, Slot};
use super::alloc::Allocator;
use super::anchor::{Anchor, AnchorEntry};
use super::record::{read_slot, SlotContent};
use super::superblock::{Superblock, SuperblockError};
use super::tree::TreeCache;
use super::{
    journal, Catalog, Holders, LivePmo, LiveRecord, OpenOptions, PmoState, Store, StoreError,
    StoreState, EXTENT_ALIGN,
};
use crate::extents::{self, ExtentKeying};
use locked::Locked;
use pmo_media::Backing;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};

/// What recovery did to one PMO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryAction {
    /// A session had died: journal area scrubbed, detached.
    CrashHandler,
    /// Uncommitted psync discarded (PMO as of the previous psync).
    RolledBack,
    /// Committed psync completed (PMO as of that psync).
    RolledForward,
    /// Shadow scrub finished.
    ShadowScrubbed,
    /// Interrupted pdestroy finished.
    DestroyFinished,
    /// Committed journal is damaged: the PMO is refused until repaired.
    Damaged(String),
}

/// What `Store::open` found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Live PMOs after recovery.
    pub pmos: usize,
    /// Per-PMO actions: (name, state found, action).
    pub actions: Vec<(String, PmoState, RecoveryAction)>,
    /// Table slots that could not be decoded or failed validation.
    pub bad_slots: Vec<(u32, String)>,
    /// PMOs refused by name, and why (`StoreError::Refused` for each until repaired): a host
    /// should say these loudly.
    pub refused: Vec<(String, String)>,
    /// Commits the medium made durable but the anchor had not learned (a crash in between, or
    /// a keyless edit: a destroy among them is worth a warning), now in the anchor.
    pub anchor_caught_up: Vec<(u32, AnchorEntry)>,
}

/// Result of `fsck`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsckReport {
    /// PMOs checked.
    pub pmos: usize,
    /// Problems found (empty = clean).
    pub problems: Vec<String>,
}

pub(super) fn open(
    backing: Backing,
    opts: &OpenOptions,
) -> Result<(Store, RecoveryReport), StoreError> {
    let m = backing.medium().clone();
    let extent_keys = ExtentKeying::new(backing.extent_keys().cloned());
    let sb = Superblock::read(&*m)?;
    if let Some(len) = opts.len.filter(|l| *l != sb.medium_len) {
        return Err(SuperblockError::Length {
            store: sb.medium_len,
            medium: len,
        }
        .into());
    }
    let slots = admit::scan(&*m, &sb)?;
    let commits: Vec<Option<u64>> = slots.iter().map(Slot::commit).collect();
    // A store behind its anchor was rolled back: refuse it before anything is written.
    let (anchor, entries) = match &opts.anchor {
        Some(path) => match Anchor::open(path, &sb)? {
            Some(a) => {
                a.check(&commits)?;
                let entries = a.entries();
                (Some(a), Some(entries))
            }
            None => {
                // Trust on first use: the anchor starts from what the medium holds.
                let seed: Vec<AnchorEntry> = slots
                    .iter()
                    .map(|s| match s {
                        Slot::Free { rec, .. } | Slot::Live { rec, .. } => AnchorEntry::of(rec),
                        _ => AnchorEntry::default(),
                    })
                    .collect();
                log::info!("created rollback anchor {}", path.display());
                (Some(Anchor::create(path, &sb, &seed)?), None)
            }
        },
        None => (None, None),
    };
    let adm = admit::admit(slots, entries.as_deref());
    let mut report = RecoveryReport {
        bad_slots: adm.bad_slots,
        refused: adm
            .refused
            .iter()
            .map(|(n, w)| (n.clone(), w.clone()))
            .collect(),
        ..RecoveryReport::default()
    };
    if let Some(a) = &anchor {
        a.advance_all(&adm.catch_up)?;
        report.anchor_caught_up = adm.catch_up;
    }
    let mut alloc = Allocator::new(sb.data_off, sb.medium_len, EXTENT_ALIGN);
    let mut names: BTreeMap<String, Arc<LivePmo>> = BTreeMap::new();
    for p in adm.live {
        // Admission refused every overlap, so this only fails on a bug; refuse rather than
        // guess.
        if let Err(e) = alloc.reserve(p.rec.ext_off, p.rec.ext_len) {
            report.bad_slots.push((p.slot, e.to_string()));
            continue;
        }
        let pmo = Arc::new(LivePmo {
            slot: p.slot,
            name: p.rec.name.clone(),
            npages: p.rec.npages,
            ext_off: p.rec.ext_off,
            layout: p.layout,
            rec: Mutex::new(LiveRecord::new(p.rec, p.copy, &sb.uuid, p.slot)),
            holders: Mutex::new(Holders::default()),
            holders_changed: Condvar::new(),
            damaged: Mutex::new(None),
        });
        names.insert(pmo.name.clone(), pmo);
    }
    // A refused PMO's space is not handed to a new one while it waits for repair.
    for (off, len) in adm.refused_extents {
        let _ = alloc.reserve(off, len);
    }
    // Recovery may read and write the extents: key them first (inline-encrypting media).
    let mut by_slot: Vec<&Arc<LivePmo>> = names.values().collect();
    by_slot.sort_by_key(|pmo| pmo.slot);
    for pmo in by_slot {
        let c = pmo.lock_rec();
        let r = &c.rec;
        extent_keys.in_use(&extents::extent(
            pmo.slot, r.ext_off, r.ext_len, &r.keys, &r.kcv,
        ))?;
    }
    let counter = commits
        .iter()
        .flatten()
        .copied()
        .chain(anchor.as_ref().map(Anchor::counter))
        .max()
        .unwrap_or(0);
    let inner = Arc::new(StoreState {
        medium: m,
        extent_keys,
        reads_wait: backing.reads_wait(),
        suites: opts.suites.clone(),
        superblock: sb,
        catalog: Mutex::new(Catalog {
            names: BTreeMap::new(),
            free_slots: adm.free_slots,
            refused: adm.refused,
            alloc,
        }),
        commit: AtomicU64::new(counter),
        catalog_version: AtomicU64::new(0),
        anchor,
        default_kdf: opts.kdf,
    });
    // Recover PMOs caught mid-operation.
    let mut live = BTreeMap::new();
    let mut freed = Vec::new();
    for (name, pmo) in names {
        let found = pmo.lock_rec().rec.state;
        match recover_one(&inner, &pmo)? {
            None => {
                live.insert(name, pmo);
            }
            Some(RecoveryAction::DestroyFinished) => {
                report
                    .actions
                    .push((name, found, RecoveryAction::DestroyFinished));
                freed.push(pmo);
            }
            Some(a) => {
                report.actions.push((name.clone(), found, a));
                live.insert(name, pmo);
            }
        }
    }
    {
        let mut cat = inner.lock_catalog();
        for pmo in freed {
            inner.extent_keys.released(pmo.slot)?;
            let c = pmo.lock_rec();
            cat.alloc.release(c.rec.ext_off, c.rec.ext_len);
            cat.free_slots.insert(pmo.slot, (c.rec.seq, c.copy));
        }
        report.pmos = live.len();
        cat.names = live;
    }
    report.actions.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((Store { inner }, report))
}

fn recover_one(inner: &StoreState, pmo: &LivePmo) -> Result<Option<RecoveryAction>, StoreError> {
    let mut cell = pmo.lock_rec();
    let action = match cell.rec.state {
        PmoState::Detached | PmoState::Free => return Ok(None),
        PmoState::Read | PmoState::Write => RecoveryAction::CrashHandler,
        PmoState::Journaling => RecoveryAction::RolledBack,
        PmoState::ScrubbingJournal => RecoveryAction::ShadowScrubbed,
        PmoState::ApplyingJournal => {
            let geo = pmo.geometry();
            let r = &cell.rec;
            let res = journal::apply(
                &*inner.medium,
                pmo.ext_off + geo.journal_rel(),
                geo.journal_len,
                r.journal_len,
                &r.journal_sum,
                r.epoch,
                pmo.ext_off,
                geo.journal_rel(),
            );
            match res {
                Ok(()) => RecoveryAction::RolledForward,
                Err(journal::JournalError::Medium(e)) => return Err(e.into()),
                Err(e) => {
                    let why = e.to_string();
                    *pmo.damaged.locked() = Some(why.clone());
                    return Ok(Some(RecoveryAction::Damaged(why)));
                }
            }
        }
        PmoState::Destroying => {
            let (off, len) = (cell.rec.ext_off, cell.rec.ext_len);
            inner.medium.zero(off, len)?;
            inner.medium.persist(off, len)?;
            cell.rec.state = PmoState::Free;
            inner.write_rec(pmo, &mut cell)?;
            return Ok(Some(RecoveryAction::DestroyFinished));
        }
    };
    if cell.rec.journal_dirty > 0 {
        cell.rec.state = PmoState::ScrubbingJournal;
        inner.write_rec(pmo, &mut cell)?;
        inner.scrub_journal(pmo, cell.rec.journal_dirty)?;
        cell.rec.journal_dirty = 0;
    }
    cell.rec.state = PmoState::Detached;
    cell.rec.journal_len = 0;
    inner.write_rec(pmo, &mut cell)?;
    Ok(Some(action))
}

pub(super) fn fsck(store: &Store, progress: &mut dyn FnMut(u64, u64)) -> FsckReport {
    let inner = &store.inner;
    let mut rep = FsckReport::default();
    let rts: Vec<Arc<LivePmo>> = inner.lock_catalog().names.values().cloned().collect();
    let total = rts.len() as u64;
    for (i, pmo) in rts.iter().enumerate() {
        rep.pmos += 1;
        let (rec, _) = {
            let c = pmo.lock_rec();
            (c.rec.clone(), c.copy)
        };
        if let Err(why) = validate(&inner.superblock, &rec) {
            rep.problems.push(format!("{}: {why}", pmo.name));
            continue;
        }
        if let Some(why) = pmo.damaged.locked().clone() {
            rep.problems.push(format!("{}: {why}", pmo.name));
        }
        let geo = pmo.geometry();
        if rec.state == PmoState::ApplyingJournal {
            let r = journal::check(
                &*inner.medium,
                pmo.ext_off + geo.journal_rel(),
                geo.journal_len,
                rec.journal_len,
                &rec.journal_sum,
                rec.epoch,
                geo.journal_rel(),
            );
            if let Err(e) = r {
                rep.problems.push(format!("{}: {e}", pmo.name));
            }
        }
        let cache = TreeCache::new(rec.root);
        if let Err(e) = cache.verify_all(&pmo.layout, &*inner.medium, pmo.ext_off + geo.meta_rel())
        {
            rep.problems.push(format!("{}: {e}", pmo.name));
        }
        progress(i as u64 + 1, total);
    }
    for (name, why) in inner.lock_catalog().refused.iter() {
        rep.problems.push(format!("{name}: refused: {why}"));
    }
    // Re-read the table to catch damaged slots.
    for slot in 0..inner.superblock.slots {
        match read_slot(&*inner.medium, &inner.superblock, slot) {
            Ok(SlotContent::Damaged) => rep.problems.push(format!("slot {slot}: damaged record")),
            Err(e) => rep.problems.push(format!("slot {slot}: {e}")),
            _ => {}
        }
    }
    rep
}
