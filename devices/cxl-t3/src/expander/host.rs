//! The host path: the VMM's own reads and writes of device memory (a PMO store on the
//! expander), write-back of dirty blocks (persist, flush), and the clean shutdown.

use super::*;

impl CachedMedia {
    pub(super) fn check(&self, off: u64, len: u64) -> Result<(), ExpanderError> {
        match off.checked_add(len) {
            Some(e) if e <= self.size => Ok(()),
            _ => Err(ExpanderError::OutOfRange {
                off,
                len,
                end: self.size,
            }),
        }
    }

    /// Makes `block` resident and usable from this thread, counted as one
    /// cache access, and runs `f` on its page. Caller holds the
    /// reconfiguration lock shared.
    pub(super) fn host_access(
        &self,
        block: u64,
        write: bool,
        tee: &RangeTable,
        bufs: &mut Option<Box<[Page; 2]>>,
        f: impl FnOnce(*mut u8),
    ) -> Result<(), ExpanderError> {
        let _set = self.set_lock(block);
        let resident = self.model.locked().lookup(block);
        match resident {
            Some(dirty) => {
                if write && !dirty {
                    // Unprotect before touching it: a write fault here would
                    // wait for the set lock this thread holds.
                    self.note_dirty()?;
                    self.uffd
                        .write_protect(self.addr(block), BLOCK, false)
                        .map_err(os("unprotect block"))?;
                }
                self.model.locked().access(block, write);
            }
            None => {
                // Buffers only for misses: hits stay allocation-free.
                let [buf, vbuf] = &mut **bufs.get_or_insert_with(|| Box::new([[0u8; PAGE]; 2]));
                self.fill_locked(block, write, tee, buf, vbuf)?;
            }
        }
        f(self.addr(block) as *mut u8);
        Ok(())
    }

    /// Reads DPA bytes through the cache (host path, counted).
    pub fn read(&self, dpa: u64, out: &mut [u8]) -> Result<(), ExpanderError> {
        self.check(dpa, out.len() as u64)?;
        let _cfg = self.reconfig_shared();
        let tee = self.tee_read();
        let mut bufs = None;
        let mut done = 0usize;
        while done < out.len() {
            let at = dpa + done as u64;
            let in_block = (at % BLOCK) as usize;
            let n = (PAGE - in_block).min(out.len() - done);
            let dst = &mut out[done..done + n];
            self.host_access(at / BLOCK, false, &tee, &mut bufs, |page| {
                // SAFETY: `page` is a present page of our mapping (resident,
                // set lock held) and `in_block + n <= PAGE`.
                unsafe { std::ptr::copy_nonoverlapping(page.add(in_block), dst.as_mut_ptr(), n) }
            })?;
            done += n;
        }
        Ok(())
    }

    /// Writes DPA bytes through the cache (host path, counted). Durable only
    /// after [`Expander::persist`] or [`Expander::flush`].
    pub fn write(&self, dpa: u64, data: &[u8]) -> Result<(), ExpanderError> {
        self.check(dpa, data.len() as u64)?;
        let _cfg = self.reconfig_shared();
        let tee = self.tee_read();
        let mut bufs = None;
        let mut done = 0usize;
        while done < data.len() {
            let at = dpa + done as u64;
            let in_block = (at % BLOCK) as usize;
            let n = (PAGE - in_block).min(data.len() - done);
            let src = &data[done..done + n];
            let block = at / BLOCK;
            if self.is_tracked(block) {
                // A working extent's block: its page must not become writable behind the
                // store tracking.
                self.write_tracked(block, in_block, src, &tee, &mut bufs)?;
            } else {
                self.host_access(block, true, &tee, &mut bufs, |page| {
                    // SAFETY: `page` is a present, writable page of our mapping
                    // (resident and unprotected, set lock held); `in_block + n <= PAGE`.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), page.add(in_block), n) }
                })?;
            }
            done += n;
        }
        Ok(())
    }

    /// Zeroes DPA bytes. Whole blocks are zeroed on the media directly, as a device's
    /// zeroing command does: dropped from the cache without a write-back, then written to the
    /// media as the all-zero block, which reads as zeros whether or not its range is keyed
    /// (one charged media write per block, no fill, no cipher). Partial blocks at the ends go
    /// through the cache as a write. Durable after [`Expander::persist`] or
    /// [`Expander::flush`], like a write.
    pub fn zero(&self, dpa: u64, len: u64) -> Result<(), ExpanderError> {
        self.check(dpa, len)?;
        let end = dpa + len;
        let (first, last) = (dpa.div_ceil(BLOCK), end / BLOCK);
        if first >= last {
            return self.write(dpa, &vec![0u8; len as usize]);
        }
        let zeros = [0u8; PAGE];
        if dpa < first * BLOCK {
            self.write(dpa, &zeros[..(first * BLOCK - dpa) as usize])?;
        }
        if last * BLOCK < end {
            self.write(last * BLOCK, &zeros[..(end - last * BLOCK) as usize])?;
        }
        let _cfg = self.reconfig_shared();
        // The media changes: a recorded clean shutdown no longer holds.
        self.note_dirty()?;
        for b in first..last {
            let _set = self.set_lock(b);
            if self.model.locked().remove(b).is_some() {
                self.discard_locked(b);
            }
            // A working extent's block expects the all-zero block from now on (if this write
            // fails, the media holds the old bytes or a torn write, and the block's next fill
            // is refused rather than trusted).
            self.note_media_zeroed(b);
            if let Err(e) = self.media.write_block(b, &zeros) {
                self.media_errors.fetch_add(1, Ordering::Relaxed);
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Writes back one set's dirty blocks that `pick` selects; they stay
    /// resident, clean. Caller holds the reconfiguration lock.
    pub(super) fn write_back_set(
        &self,
        set: u64,
        tee: &RangeTable,
        buf: &mut Page,
        pick: impl Fn(u64) -> bool,
    ) -> Result<(), ExpanderError> {
        let Some(l) = self.set_locks.get(set as usize) else {
            return Ok(());
        };
        let _set = l.locked();
        let lines = self.model.locked().set_lines(set);
        let mut first_err = None;
        for (b, dirty) in lines {
            if !dirty || !pick(b) {
                continue;
            }
            match self.write_back_locked(b, tee, buf) {
                Ok(()) => {
                    self.model.locked().clean(b);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Makes every earlier write inside `[dpa, dpa+len)` durable: writes
    /// back the covered dirty blocks, then `fdatasync`s the media.
    pub fn persist(&self, dpa: u64, len: u64) -> Result<(), ExpanderError> {
        self.check(dpa, len)?;
        if len == 0 {
            return Ok(());
        }
        let first = dpa / BLOCK;
        let last = (dpa + len - 1) / BLOCK;
        let _cfg = self.reconfig_shared();
        let tee = self.tee_read();
        let mut buf = Box::new([0u8; PAGE]);
        let (sets, capacity) = {
            let m = self.model.locked();
            (m.sets(), m.capacity())
        };
        if last - first + 1 > capacity {
            for set in 0..sets {
                self.write_back_set(set, &tee, &mut buf, |b| (first..=last).contains(&b))?;
            }
        } else {
            for b in first..=last {
                let _set = self.set_lock(b);
                if self.model.locked().lookup(b) == Some(true) {
                    self.write_back_locked(b, &tee, &mut buf)?;
                    self.model.locked().clean(b);
                }
            }
        }
        Ok(self.media.sync()?)
    }

    /// GPF: writes back every dirty block (each stays cached, now clean and
    /// write-protected) and `fdatasync`s the media.
    pub fn flush(&self) -> Result<(), ExpanderError> {
        let _cfg = self.reconfig_shared();
        self.flush_locked()
    }

    /// [`Expander::flush`] for a caller that holds the reconfiguration lock.
    pub(super) fn flush_locked(&self) -> Result<(), ExpanderError> {
        let tee = self.tee_read();
        let mut buf = Box::new([0u8; PAGE]);
        let sets = self.model.locked().sets();
        let mut first_err = None;
        for set in 0..sets {
            if let Err(e) = self.write_back_set(set, &tee, &mut buf, |_| true) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)?;
        Ok(self.media.sync()?)
    }

    /// Flushes and records a clean shutdown on the media (idempotent). Only
    /// this clears the media's "running" mark: dropping the expander
    /// without it counts as a dirty shutdown at the next open.
    pub fn shutdown(&self) -> Result<(), ExpanderError> {
        // Exclusive: no block can be dirtied between the flush and the
        // clean mark; one dirtied after it finds `clean` set and undoes it.
        let _cfg = self.reconfig.write_locked();
        self.flush_locked()?;
        self.media.mark_clean()?;
        self.clean.store(true, Ordering::Release);
        Ok(())
    }

    /// Writes back and drops every cached block of `[start, end)`. Caller
    /// holds the reconfiguration lock exclusively.
    pub(super) fn drain_locked(
        &self,
        start: u64,
        end: u64,
        tee: &RangeTable,
    ) -> Result<(), ExpanderError> {
        let range = start / BLOCK..end.div_ceil(BLOCK);
        let mut buf = Box::new([0u8; PAGE]);
        let sets = self.model.locked().sets();
        let mut wrote_back = false;
        if range.end.saturating_sub(range.start) < sets {
            // A range smaller than the cache (a PMO extent): look each of its blocks up in
            // its own set instead of walking every set (a PMO create or destroy would cost
            // a pass over the whole cache otherwise).
            for b in range {
                let _set = self.set_lock(b);
                let Some(dirty) = self.model.locked().lookup(b) else {
                    continue;
                };
                wrote_back |= self.drain_block_locked(b, dirty, tee, &mut buf)?;
            }
        } else {
            for set in 0..sets {
                let Some(l) = self.set_locks.get(set as usize) else {
                    continue;
                };
                let _set = l.locked();
                let lines = self.model.locked().set_lines(set);
                for (b, dirty) in lines {
                    if range.contains(&b) {
                        wrote_back |= self.drain_block_locked(b, dirty, tee, &mut buf)?;
                    }
                }
            }
        }
        // Only what was written back needs to be made durable.
        if wrote_back {
            self.media.sync()?;
        }
        Ok(())
    }

    /// Writes cached block `b` back if `dirty` and drops it (under its set lock); true if it
    /// was written back.
    fn drain_block_locked(
        &self,
        b: u64,
        dirty: bool,
        tee: &RangeTable,
        buf: &mut [u8; PAGE],
    ) -> Result<bool, ExpanderError> {
        if dirty {
            self.write_back_locked(b, tee, buf)?;
            self.model.locked().clean(b);
        }
        self.discard_locked(b);
        self.model.locked().remove(b);
        Ok(dirty)
    }
}
