//! A session's detach: the design's detach work, the journal scrub, the final state.

use super::Attachment;
use crate::{Perm, PmoState, StoreError};
use locked::{Locked, RwLocked};
use pmo_crypto::{wipe, PAGE};

impl Attachment {
    /// Detach work of the design, then the shadow scrub.
    pub(super) fn detach_work(&self) -> Result<(), StoreError> {
        // UC (Id designs): the deferred checksums.
        self.update_checksums()?;
        if self.perm == Perm::Write {
            if let Some(plain) = &self.plain {
                // WED/Ip: encrypt the whole PMO at detach.
                let g = plain.read_locked();
                let pages: Vec<(u64, &[u8; PAGE])> =
                    g.0.chunks_exact(PAGE)
                        .enumerate()
                        .filter_map(|(i, c)| <&[u8; PAGE]>::try_from(c).ok().map(|a| (i as u64, a)))
                        .collect();
                self.commit(pages.into_iter(), false)?;
            } else if self.design.reencrypt_touched_at_detach() {
                // BP: EPP/CPP re-encrypt every touched page.
                let touched: Vec<u64> = self.touched.locked().iter().copied().collect();
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

    /// DS/DT: scrub the journal area, then record D (or R if other readers remain).
    pub(super) fn shadow_scrub(&self) -> Result<(), StoreError> {
        let others = {
            let g = self.pmo.lock_holders();
            match self.perm {
                Perm::Write => 0,
                Perm::Read => g.readers.saturating_sub(1),
            }
        };
        let mut cell = self.pmo.lock_rec();
        if others > 0 {
            return Ok(());
        }
        if cell.rec.journal_dirty > 0 {
            cell.rec.state = PmoState::ScrubbingJournal;
            self.store.write_rec(&self.pmo, &mut cell)?;
            self.store
                .scrub_journal(&self.pmo, cell.rec.journal_dirty)?;
            cell.rec.journal_dirty = 0;
        }
        cell.rec.state = PmoState::Detached;
        self.store.write_rec(&self.pmo, &mut cell)?;
        Ok(())
    }

    pub(super) fn finish_detach(&self) {
        let mut g = self.pmo.lock_holders();
        match self.perm {
            Perm::Write => g.writer = false,
            Perm::Read => g.readers = g.readers.saturating_sub(1),
        }
        g.busy = g.busy.saturating_sub(1);
        self.pmo.holders_changed.notify_all();
    }

    pub(super) fn mark_detached_after_failure(&self) {
        if let Err(e) = self.shadow_scrub() {
            log::warn!("detach after failed attach of {:?}: {e}", self.pmo.name);
        }
    }
}
