//! The device cache's block path: a guest (or host-thread) fault on the DPA space fills the
//! block from media through the TEE range key, evicting (and writing back) its set's victim;
//! the first write to a clean block marks it dirty.

use super::*;

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
        let r = self.media.write_block(block, buf);
        wipe(&mut buf[..]);
        if let Err(e) = r {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            // Still dirty, so writable again (a dirty block is never
            // protected); should this fail too, the media is failing anyway.
            let _ = self.uffd.write_protect(addr, BLOCK, false);
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
        if write {
            self.note_dirty()?;
        }
        if let Err(e) = self.media.read_block(block, buf) {
            self.media_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e.into());
        }
        // An all-zero media block was never written: it reads as zeros
        // whether or not the range is keyed.
        if !is_zero(buf) {
            tee.decrypt_block(block, buf);
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
        self.model.locked().access(block, write);
        let r = self.install(self.addr(block), buf, !write);
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
                // First write to a clean block (or a stale write fault).
                self.wp_faults.fetch_add(1, Ordering::Relaxed);
                // Dirty before the unprotect wakes the writer; if the
                // unprotect fails the old bit comes back, so a dirty block
                // is never write-protected (the host path's writes rely on it).
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
                // A fill waits for the media (and maybe a write-back): let another
                // thread serve faults on other sets meanwhile.
                watch.hand_off();
                let tee = self.tee_read();
                self.fill_locked(block, f.write || f.wp, &tee, buf, vbuf)
            }
        };
        if let Err(e) = r {
            log::error!("cxl: fault on DPA {:#x}: {e}", block * BLOCK);
            // Let the access retry rather than hang.
            let _ = self.uffd.wake(f.address, BLOCK);
        }
    }
}
