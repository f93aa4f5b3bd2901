//! The in-memory state of an open store: its catalog of live PMOs, each PMO's current record
//! and holders, and the record writes every operation goes through.

use crate::alloc::Allocator;
use crate::anchor::Anchor;
use crate::extents::ExtentKeying;
use crate::record::{write_record, Record};
use crate::superblock::Superblock;
use crate::tree::TreeLayout;
use crate::{codec, journal, tree, StoreError};
use locked::Locked;
use pmo_crypto::{ExternalSuites, KdfParams, PmoKeys, PAGE};
use pmo_media::Medium;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Current record of a PMO, which copy holds it, and a digest of its bound fields as last
/// verified or sealed: a keyless write checks against it (see [`StoreState::write_rec`]).
pub(crate) struct LiveRecord {
    pub rec: Record,
    pub copy: u8,
    bound: [u8; 32],
}

impl LiveRecord {
    /// A record as read from (or about to be written to) table slot `slot` of the store
    /// `store_uuid` (its MAC is checked at attach, with the key).
    pub fn new(rec: Record, copy: u8, store_uuid: &[u8; 16], slot: u32) -> Self {
        let bound = bound_digest(&rec, store_uuid, slot);
        Self { rec, copy, bound }
    }
}

fn bound_digest(rec: &Record, store_uuid: &[u8; 16], slot: u32) -> [u8; 32] {
    codec::checksum(&[&rec.bound_bytes(store_uuid, slot)])
}

/// Who holds a PMO: its attach sessions, running detaches, and whether it is destroyed.
#[derive(Default)]
pub(crate) struct Holders {
    pub readers: u32,
    pub writer: bool,
    /// Detaches (or a destroy) still running; concurrent reader detaches each count.
    pub busy: u32,
    pub gone: bool,
}

/// The in-memory state of one PMO of an open store (created, not destroyed).
pub(crate) struct LivePmo {
    pub slot: u32,
    pub name: String,
    pub npages: u64,
    pub ext_off: u64,
    pub layout: TreeLayout,
    pub rec: Mutex<LiveRecord>,
    pub holders: Mutex<Holders>,
    /// Signalled when `holders` changes.
    pub holders_changed: Condvar,
    pub damaged: Mutex<Option<String>>,
}

/// Where the parts of a PMO extent lie: primaries, then tree, then the psync journal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExtentGeometry {
    pub data_len: u64,
    pub meta_len: u64,
    pub journal_len: u64,
}

impl ExtentGeometry {
    pub fn of(npages: u64, layout: &TreeLayout) -> Self {
        let data_len = npages * PAGE as u64;
        let meta_len = layout.size();
        let journal_len = journal::HEADER
            + npages * journal::entry_cost(PAGE as u64)
            + layout.total_groups() * journal::entry_cost(tree::ARITY * tree::LEAF as u64);
        Self {
            data_len,
            meta_len,
            journal_len: journal_len.div_ceil(4096) * 4096,
        }
    }
    pub fn total(&self) -> u64 {
        self.data_len + self.meta_len + self.journal_len
    }
    pub fn meta_rel(&self) -> u64 {
        self.data_len
    }
    pub fn journal_rel(&self) -> u64 {
        self.data_len + self.meta_len
    }
}

impl LivePmo {
    pub fn geometry(&self) -> ExtentGeometry {
        ExtentGeometry::of(self.npages, &self.layout)
    }
    pub fn lock_rec(&self) -> MutexGuard<'_, LiveRecord> {
        self.rec.locked()
    }
    pub fn lock_holders(&self) -> MutexGuard<'_, Holders> {
        self.holders.locked()
    }
}

pub(crate) struct Catalog {
    /// Live PMOs by name, in name order (LIST walks it without sorting).
    pub names: BTreeMap<String, Arc<LivePmo>>,
    /// Free slot -> (last seq, current copy) so a reused slot continues its sequence.
    pub free_slots: BTreeMap<u32, (u64, u8)>,
    /// Names open refused, and why: attach, destroy and create of them fail with
    /// `StoreError::Refused` (see `admit.rs`).
    pub refused: BTreeMap<String, String>,
    pub alloc: Allocator,
}

/// Lock order: `catalog` before any PMO's `rec`; a PMO's `rec` before its session's locks. `holders`
/// is never held while another of these is taken.
pub(crate) struct StoreState {
    pub medium: Arc<dyn Medium>,
    /// The medium's PMO extent keys, if it encrypts extents itself.
    pub extent_keys: ExtentKeying,
    /// Reads of the medium may wait for modelled device time (a hint the pager schedules by).
    pub reads_wait: bool,
    /// Page suites of other crates this handle may seal and open (the harness's benchmark
    /// suites; none in a product program).
    pub suites: ExternalSuites,
    pub superblock: Superblock,
    pub catalog: Mutex<Catalog>,
    /// The store-wide commit counter: the highest `commit` of any record.
    pub commit: AtomicU64,
    /// Bumped by every create and destroy, so a lister can tell its snapshot is stale.
    pub catalog_version: AtomicU64,
    /// Rollback anchor kept outside the medium, if the store has one.
    pub anchor: Option<Anchor>,
    /// Key-derivation cost for creates that do not name one.
    pub default_kdf: KdfParams,
}

impl StoreState {
    pub fn lock_catalog(&self) -> MutexGuard<'_, Catalog> {
        self.catalog.locked()
    }

    /// Writes a record update that changes no bound field (state, journal, journal area mark):
    /// crash-atomic, and needs no key, so recovery can do it. Refuses if a bound field changed.
    pub fn write_rec(&self, pmo: &LivePmo, cell: &mut LiveRecord) -> Result<(), StoreError> {
        if bound_digest(&cell.rec, &self.superblock.uuid, pmo.slot) != cell.bound {
            return Err(StoreError::BoundFieldChanged);
        }
        cell.copy = write_record(
            &*self.medium,
            &self.superblock,
            pmo.slot,
            cell.copy,
            &mut cell.rec,
        )?;
        Ok(())
    }

    /// Writes a record update under a new record MAC (bound fields may have changed).
    pub fn write_rec_keyed(
        &self,
        pmo: &LivePmo,
        cell: &mut LiveRecord,
        keys: &PmoKeys,
    ) -> Result<(), StoreError> {
        cell.rec.seal(keys, &self.superblock.uuid, pmo.slot);
        cell.bound = bound_digest(&cell.rec, &self.superblock.uuid, pmo.slot);
        cell.copy = write_record(
            &*self.medium,
            &self.superblock,
            pmo.slot,
            cell.copy,
            &mut cell.rec,
        )?;
        Ok(())
    }

    /// A commit: the record takes the next store-wide commit number, is sealed and written,
    /// and then the anchor (if any) learns the slot's new number. The record is durable before
    /// the anchor moves, so a crash in between leaves the medium ahead of the anchor, which
    /// open accepts.
    pub fn write_rec_commit(
        &self,
        pmo: &LivePmo,
        cell: &mut LiveRecord,
        keys: &PmoKeys,
    ) -> Result<(), StoreError> {
        cell.rec.commit = self.next_commit()?;
        self.write_rec_keyed(pmo, cell, keys)?;
        if let Some(a) = &self.anchor {
            a.advance(pmo.slot, &crate::AnchorEntry::of(&cell.rec))?;
        }
        Ok(())
    }

    fn next_commit(&self) -> Result<u64, StoreError> {
        self.commit
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| c.checked_add(1))
            .map(|prev| prev + 1)
            .map_err(|_| StoreError::CounterExhausted("store commit counter"))
    }

    /// Durably zeroes the first `len` bytes of a PMO's journal area.
    pub fn scrub_journal(&self, pmo: &LivePmo, len: u64) -> Result<(), StoreError> {
        let g = pmo.geometry();
        let len = len.min(g.journal_len);
        if len > 0 {
            let off = pmo.ext_off + g.journal_rel();
            self.medium.zero_in_place(off, len)?;
            self.medium.persist(off, len)?;
        }
        Ok(())
    }
}
