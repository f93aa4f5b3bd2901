//! The psync engine of a session: encrypt into the journal, commit, apply; and the deferred
//! tags of the `id` designs.

use super::{integrity, next_epoch, Attachment};
use crate::journal::{self, JournalWriter};
use crate::tree::{Leaf, TreeUpdate};
use crate::{PmoState, StoreError};
use locked::{Locked, RwLocked};
use pmo_crypto::{wipe, PageId, PAGE, TAG_LEN};
use std::collections::BTreeMap;

impl Attachment {
    /// The psync engine for plaintext pages: encrypt each under the new epoch, then commit.
    /// `defer` (Id designs) skips the tags: leaves get a zero tag and the plaintext stays in the
    /// session until the checksum update (UC) at detach.
    pub(super) fn commit<'a>(
        &self,
        pages: impl Iterator<Item = (u64, &'a [u8; PAGE])>,
        defer: bool,
    ) -> Result<(), StoreError> {
        let uid = self.keys.params().uid;
        let gen = self.gen.ok_or(StoreError::ReadOnly)?;
        let mut cell = self.pmo.lock_rec();
        let epoch = next_epoch(&cell.rec)?;
        let mut cts = Sealed::with_capacity(pages.size_hint().0);
        let mut leaves = BTreeMap::new();
        let mut kept = Vec::new();
        for (p, plain) in pages {
            let id = PageId {
                uid,
                page: p as u32,
                version: epoch,
                gen,
            };
            let ct = cts.push(p, plain);
            let sealed = if defer {
                kept.push((p, Box::new(*plain)));
                self.keys.encrypt_page(id, ct).map(|()| [0u8; TAG_LEN])
            } else {
                self.keys.seal_page(id, ct)
            };
            let tag = match sealed {
                Ok(t) => t,
                Err(e) => {
                    // The page just copied in may still be plaintext.
                    wipe(ct);
                    for (_, mut k) in kept {
                        wipe(&mut k[..]);
                    }
                    return Err(e.into());
                }
            };
            leaves.insert(
                p,
                Leaf {
                    version: epoch,
                    gen,
                    tag,
                },
            );
        }
        if cts.pages.is_empty() {
            return Ok(());
        }
        if !defer {
            let pending_after = {
                // Pages rewritten with a tag are no longer pending.
                let pend = self.pending.locked();
                pend.keys().filter(|p| !leaves.contains_key(p)).count() as u64
            };
            self.commit_changes(&mut cell, epoch, &cts, &leaves, pending_after)?;
            let mut pend = self.pending.locked();
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
            let mut pend = self.pending.locked();
            let mut previous = Vec::new();
            for (p, plain) in kept {
                previous.push((p, pend.insert(p, plain)));
            }
            (previous, pend.len() as u64)
        };
        let r = self.commit_changes(&mut cell, epoch, &cts, &leaves, pending_after);
        let mut pend = self.pending.locked();
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

    /// EP: reserve the epoch and write the journal into the journal area; TC: commit the record; copy the
    /// journal to primaries and tree; back to R/W.
    pub(super) fn commit_changes(
        &self,
        cell: &mut crate::LiveRecord,
        epoch: u64,
        cts: &Sealed,
        leaves: &BTreeMap<u64, Leaf>,
        pending_after: u64,
    ) -> Result<(), StoreError> {
        let m = &*self.store.medium;
        let geo = self.pmo.geometry();
        let up: TreeUpdate = self
            .tree
            .plan(&self.pmo.layout, m, self.meta_off(), leaves)
            .map_err(|e| StoreError::Corrupt {
                name: self.pmo.name.clone(),
                why: e.to_string(),
            })?;
        let jlen = journal::HEADER
            + cts.pages.len() as u64 * journal::entry_cost(PAGE as u64)
            + up.groups
                .values()
                .map(|g| journal::entry_cost(g.len() as u64))
                .sum::<u64>();
        // EP: reserve the epoch and note how much journal area will be dirty.
        let back_to = cell.rec.state;
        cell.rec.state = PmoState::Journaling;
        cell.rec.next_epoch = epoch
            .checked_add(1)
            .ok_or(StoreError::CounterExhausted("epoch"))?;
        cell.rec.journal_dirty = cell.rec.journal_dirty.max(jlen);
        self.store.write_rec_keyed(&self.pmo, cell, &self.keys)?;
        let journal_at = self.pmo.ext_off + geo.journal_rel();
        let mut w = JournalWriter::new(m, journal_at, geo.journal_len);
        let mut entries: Vec<(u64, &[u8])> = Vec::with_capacity(cts.pages.len() + up.groups.len());
        for (p, ct) in cts.pages.iter().zip(&cts.bytes) {
            entries.push((p * PAGE as u64, &ct[..]));
        }
        for ((k, g), bytes) in &up.groups {
            entries.push((
                geo.meta_rel() + self.pmo.layout.group_range(*k, *g).0,
                bytes,
            ));
        }
        for (i, (dest, data)) in entries.iter().enumerate() {
            // Pages (the first `cts.pages.len()` entries) are covered by their tags, tree
            // groups by the journal checksum.
            w.append(*dest, data, i >= cts.pages.len())?;
        }
        let (len, sum) = w.finish(epoch)?;
        // TC: the commit point.
        cell.rec.state = PmoState::ApplyingJournal;
        cell.rec.epoch = epoch;
        cell.rec.root = up.root;
        cell.rec.journal_len = len;
        cell.rec.journal_sum = sum;
        cell.rec.pending_tags = pending_after;
        self.store.write_rec_commit(&self.pmo, cell, &self.keys)?;
        {
            let _io = self.io.write_locked();
            journal::apply_entries(m, self.pmo.ext_off, &entries)?;
            self.tree.apply(&up);
        }
        cell.rec.state = if back_to == PmoState::Read {
            PmoState::Read
        } else {
            PmoState::Write
        };
        cell.rec.journal_len = 0;
        self.store.write_rec(&self.pmo, cell)?;
        Ok(())
    }

    /// UC: compute the deferred tags of every pending page (its ciphertext is re-derived from the
    /// kept plaintext: XTS is deterministic for a given tweak) and commit them with the tree.
    pub(super) fn update_checksums(&self) -> Result<(), StoreError> {
        let pend: Vec<(u64, Box<[u8; PAGE]>)> = {
            let mut g = self.pending.locked();
            std::mem::take(&mut *g).into_iter().collect()
        };
        if pend.is_empty() {
            return Ok(());
        }
        let uid = self.keys.params().uid;
        let m = &*self.store.medium;
        let mut leaves = BTreeMap::new();
        for (p, plain) in &pend {
            let leaf = self
                .tree
                .leaf(&self.pmo.layout, m, self.meta_off(), *p)
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
            let mut cell = self.pmo.lock_rec();
            next_epoch(&cell.rec).and_then(|epoch| {
                self.commit_changes(&mut cell, epoch, &Sealed::default(), &leaves, 0)
            })
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
                let mut g = self.pending.locked();
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
    pub(super) fn finish_pending_tags(
        &self,
        cell: &mut crate::LiveRecord,
    ) -> Result<(), StoreError> {
        let m = &*self.store.medium;
        let uid = self.keys.params().uid;
        let mut leaves = BTreeMap::new();
        let mut ct = Box::new([0u8; PAGE]);
        for p in 0..self.pmo.npages {
            let leaf = self
                .tree
                .leaf(&self.pmo.layout, m, self.meta_off(), p)
                .map_err(integrity(p))?;
            if leaf.version == 0 || leaf.tag != [0u8; TAG_LEN] {
                continue;
            }
            m.read(self.pmo.ext_off + p * PAGE as u64, &mut ct[..])?;
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
            return self.store.write_rec_keyed(&self.pmo, cell, &self.keys);
        }
        let epoch = next_epoch(&cell.rec)?;
        self.commit_changes(cell, epoch, &Sealed::default(), &leaves, 0)
    }
}

/// The ciphertext pages of one psync, in one buffer: each plaintext page is copied in once and
/// sealed in place (a `Box` per page cost an allocation and, through the stack, a second
/// copy).
#[derive(Default)]
pub(super) struct Sealed {
    /// Page indices, in the order of `bytes`.
    pages: Vec<u64>,
    /// Their ciphertext.
    bytes: Vec<[u8; PAGE]>,
}

impl Sealed {
    fn with_capacity(pages: usize) -> Self {
        Sealed {
            pages: Vec::with_capacity(pages),
            bytes: Vec::with_capacity(pages),
        }
    }

    /// Appends a copy of `plain` as page `page` and returns it, to be sealed in place.
    fn push(&mut self, page: u64, plain: &[u8; PAGE]) -> &mut [u8; PAGE] {
        let i = self.bytes.len();
        // `extend_from_slice` copies straight into the vector's spare room.
        self.bytes.extend_from_slice(std::slice::from_ref(plain));
        self.pages.push(page);
        &mut self.bytes[i]
    }
}
