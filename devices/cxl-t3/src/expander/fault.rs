//! The device cache's block path: a guest (or host-thread) fault on the DPA space fills the
//! block from media through the TEE range key, evicting (and writing back) its set's victim;
//! the first write to a clean block marks it dirty. In a working extent, every fault that
//! makes a block writable records the store first (`working.rs`).

use super::*;

/// How a fill leaves the block.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fill {
    /// Enters the model dirty.
    pub dirty: bool,
    /// Installed write-protected.
    pub wp: bool,
    /// The patch overwrites every byte, so the media's bytes are not used: neither checked
    /// (a working extent's) nor decrypted. They are still read, as the fill is charged.
    pub whole: bool,
}

impl CachedMedia {
    /// A block becomes dirty: if a clean shutdown was recorded, the run is
    /// live again on media first.
    pub(super) fn note_dirty(&self) -> Result<(), ExpanderError> {
        if self.clean.load(Ordering::Acquire) {
            self.media.mark_running()?;
            self.clean.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Writes a resident block to media without dropping it: protect it
    /// first (later writes fault and wait for our set lock), copy it out,
    /// encrypt if keyed. Caller holds the set lock; the model is unchanged.
    pub(super) fn write_back_locked(
        &self,
        block: u64,
        tee: &RangeTable,
        buf: &mut Page,
    ) -> Result<(), ExpanderError> {
        let addr = self.addr(block);
        self.uffd
            .write_protect(addr, BLOCK, true)
            .map_err(os("write-protect block"))?;
        // SAFETY: the block is resident (set lock held), so `addr` is a
        // present page of our mapping; the guest cannot write it now.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), PAGE) };
        tee.encrypt_block(block, buf);
        // Before the write: should it fail, the block stays resident (and dirty), so it is
        // not filled from the media before a later write-back records its digest again.
        self.note_media_write(block, buf);
        let r = self.media.write_block(block, buf);
        wipe(&mut buf[..]);
        if let Err(e) = r {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            // Still dirty, so writable again outside a working extent (the host path writes
            // into dirty blocks there directly); should this fail too, the media is failing
            // anyway. In a working extent it stays protected: a store to it must fault to be
            // recorded, and the host path never needs it writable there.
            if !self.is_tracked(block) {
                let _ = self.uffd.write_protect(addr, BLOCK, false);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Drops a resident block from the mapping (after any write-back).
    pub(super) fn discard_locked(&self, block: u64) {
        if let Err(e) = self.map.discard(self.addr(block), BLOCK) {
            log::error!("cxl: drop block {block} from the DPA space: {e}");
        }
    }

    /// Brings a non-resident block in, evicting its set's LRU block if the
    /// set is full. `write` installs it writable and dirty. Caller holds the
    /// set lock and the reconfiguration lock shared.
    pub(super) fn fill_locked(
        &self,
        block: u64,
        write: bool,
        tee: &RangeTable,
        buf: &mut Page,
        vbuf: &mut Page,
    ) -> Result<(), ExpanderError> {
        let how = Fill {
            dirty: write,
            wp: !write,
            whole: false,
        };
        self.fill_with(block, how, tee, (buf, vbuf), |_| {})
    }

    /// [`CachedMedia::fill_locked`] with the block's state chosen apart (`how`) and `patch`
    /// applied to its bytes before they are installed (a host-path write into a working
    /// extent, which must install a dirty block write-protected). Caller holds the set lock
    /// and the reconfiguration lock shared.
    pub(super) fn fill_with(
        &self,
        block: u64,
        how: Fill,
        tee: &RangeTable,
        (buf, vbuf): (&mut Page, &mut Page),
        patch: impl FnOnce(&mut Page),
    ) -> Result<(), ExpanderError> {
        if how.dirty {
            self.note_dirty()?;
        }
        if let Err(e) = self.media.read_block(block, buf) {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e.into());
        }
        if !how.whole {
            // An all-zero media block was never written: it reads as zeros
            // whether or not the range is keyed.
            let zero = is_zero(buf);
            // A working extent's block is checked against what it last wrote to the media,
            // before the cipher sees it; refused, it reads as zeros (see `working.rs`).
            if !self.vet_fill(block, buf, zero) {
                wipe(&mut buf[..]);
            } else if !zero {
                tee.decrypt_block(block, buf);
            }
        }
        let victim = self.model.locked().peek_victim(block);
        if let Some((v, dirty)) = victim {
            if dirty {
                if let Err(e) = self.write_back_locked(v, tee, vbuf) {
                    wipe(&mut buf[..]);
                    return Err(e);
                }
            }
            self.discard_locked(v);
        }
        patch(buf);
        self.model.locked().access(block, how.dirty);
        let r = self.install(self.addr(block), buf, how.wp);
        wipe(&mut buf[..]);
        if r.is_err() {
            // Not present, so not resident: keep the model true to the mapping.
            self.model.locked().remove(block);
        }
        r
    }

    pub(super) fn install(&self, addr: u64, page: &Page, wp: bool) -> Result<(), ExpanderError> {
        match self.uffd.install(addr, page, wp) {
            Ok(Install::Done | Install::AlreadyThere) => Ok(()),
            Err(source) => Err(ExpanderError::Os {
                what: "install block",
                source,
            }),
        }
    }

    /// Serves one guest (or host-thread) fault on the DPA space (the body of
    /// [`FaultHandler::handle`]).
    pub(super) fn serve_fault(
        &self,
        f: Fault,
        buf: &mut Page,
        vbuf: &mut Page,
        watch: &mut Watch<'_>,
    ) {
        let base = self.host_addr();
        if f.address < base || f.address >= base + self.size {
            return;
        }
        let block = (f.address - base) / BLOCK;
        let _cfg = self.reconfig_shared();
        let _set = self.set_lock(block);
        let resident = self.model.locked().lookup(block);
        let r = match resident {
            Some(_) if f.wp || f.write => {
                // First write to a clean block, a store to a dirty block of a working extent
                // that a take of its written pages protected again (it stays dirty), or a
                // stale write fault.
                self.wp_faults.fetch_add(1, Ordering::Relaxed);
                // Recorded before the unprotect lets the store land (a take waits for this
                // set lock, so it sees the bit).
                self.note_written(block);
                // Dirty before the unprotect wakes the writer; if the unprotect fails the old
                // bit comes back, so outside a working extent a dirty block is never
                // write-protected (the host path's writes rely on it there).
                self.note_dirty().and_then(|()| {
                    let was = self.model.locked().swap_dirty(block, true);
                    self.uffd
                        .write_protect(f.address, BLOCK, false)
                        .map_err(|e| {
                            if let Some(was) = was {
                                self.model.locked().swap_dirty(block, was);
                            }
                            ExpanderError::Os {
                                what: "unprotect block",
                                source: e,
                            }
                        })
                })
            }
            // Another fault installed it meanwhile.
            Some(_) => self.uffd.wake(f.address, BLOCK).map_err(os("wake")),
            None => {
                if f.wp {
                    self.raced_evictions.fetch_add(1, Ordering::Relaxed);
                }
                let write = f.write || f.wp;
                if write {
                    // Filled writable: recorded first, as above.
                    self.note_written(block);
                }
                // A fill waits for the media (and maybe a write-back): let another
                // thread serve faults on other sets meanwhile.
                watch.hand_off();
                let tee = self.tee_read();
                self.fill_locked(block, write, &tee, buf, vbuf)
            }
        };
        if let Err(e) = r {
            log::error!("cxl: fault on DPA {:#x}: {e}", block * BLOCK);
            // Let the access retry rather than hang.
            let _ = self.uffd.wake(f.address, BLOCK);
        }
    }
}
