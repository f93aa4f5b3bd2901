//! Taking a slice's dirty pages for psync: each is write-protected again and copied out, and
//! the copies go to the caller's sink in page order.

use locked::Locked;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::budget::DramBudget;
use super::slice::Slice;
use super::window::Window;
use super::{PagerError, PAGE, PAGE_U64};

/// A psync taking a slice's pages: demotion of them waits until it is dropped.
struct Collecting<'a>(&'a Slice);

impl Drop for Collecting<'_> {
    fn drop(&mut self) {
        self.0.collecting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Takes the dirty set of `slice`, write-protects those pages again, and hands their current
/// contents to `sink` in page order (see [`Pager::collect_dirty`](super::Pager::collect_dirty)).
/// Returns the number of pages handed over.
pub(super) fn collect_dirty<E>(
    window: &Window,
    budget: Option<&DramBudget>,
    slice: &Slice,
    sink: impl FnOnce(&[(u64, Box<[u8; PAGE]>)]) -> Result<(), E>,
) -> Result<Result<u64, E>, PagerError> {
    let offset = slice.start * PAGE_U64;
    // Reading the window for this slice: a detach must not clear (and a
    // next attachment refill) the range under the copies.
    let Some(gate) = slice.gate.enter() else {
        return Err(PagerError::Detaching(offset));
    };
    // Under the tier lock: no page is demoted while this psync takes the slice's pages
    // (`collecting`), and the dirty pages already in device memory are read as they are.
    let mut pages = Vec::new();
    let mut out = Vec::new();
    let spilled_pages: Vec<u64>;
    let _collecting = {
        let spilled = slice.spilled.locked();
        slice.collecting.fetch_add(1, Ordering::SeqCst);
        slice.dirty.take_each(|page| {
            if !spilled.contains_key(&page) {
                pages.push(page);
            }
        });
        spilled_pages = spilled.keys().copied().collect();
        if let Some(b) = budget {
            b.read_spilled(window, &spilled, &mut out);
        }
        Collecting(slice)
    };
    // A refused page never holds the attachment's data (it is
    // inaccessible, or zeros): never hand it over, never touch it.
    {
        let poisoned = slice.poisoned.locked();
        if !poisoned.is_empty() {
            pages.retain(|p| !poisoned.contains(p));
        }
    }
    out.reserve(pages.len());
    for page in pages {
        let addr = window.page_addr(slice, page);
        // Protect first so a concurrent write lands in the next psync's dirty set.
        if let Err(e) = window.write_protect(addr, true) {
            log::warn!("pmo: re-protect page {page}: {e}");
            slice.mark_dirty(page);
        }
        let mut buf = Box::new([0u8; PAGE]);
        let copied = Instant::now();
        // SAFETY: `addr` is a page of our window mapping inside this
        // slice, which cannot be cleared while we hold its gate; if it is
        // not present, the copy faults and the fault service fills it. A
        // raw byte copy tolerates concurrent writes.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), PAGE) };
        if slice.on_device {
            // Read out of the expander's device memory (LPMO CF).
            window.charge_device(copied);
        }
        out.push((page, buf));
    }
    // A detach that began meanwhile serves this slice's missing pages as
    // zeros: the copies may not be the attachment's data. Hand nothing over.
    let detaching = slice.gate.closing(Ordering::SeqCst);
    drop(gate);
    if detaching {
        for (_, b) in out.iter_mut() {
            zeroize::Zeroize::zeroize(&mut b[..]);
        }
        return Err(PagerError::Detaching(offset));
    }
    // Pages that still hold what the store has (reads KVM faulted in for writing, writes
    // of the same bytes) are clean: nothing to write.
    if let Some(d) = &slice.digests {
        out.retain_mut(|(p, b)| {
            let same = d.unchanged(*p, b);
            if same {
                zeroize::Zeroize::zeroize(&mut b[..]);
                slice.stats.psync_unchanged.fetch_add(1, Ordering::Relaxed);
            }
            !same
        });
    }
    out.sort_unstable_by_key(|(p, _)| *p);
    let n = out.len() as u64;
    let r = sink(&out);
    if r.is_ok() {
        // Written: the store holds these now (recorded under the tier lock, see
        // `Slice::install_run`); spilled pages are clean and leave device memory.
        if let Some(d) = &slice.digests {
            let _tier = slice.spilled.locked();
            for (p, b) in &out {
                d.record(*p, &b[..]);
            }
        }
        if let Some(b) = budget {
            b.spilled_written(slice, &spilled_pages);
        }
    }
    // The plaintext copies leave memory now.
    for (_, b) in out.iter_mut() {
        zeroize::Zeroize::zeroize(&mut b[..]);
    }
    if r.is_err() {
        // Keep them dirty so a retry writes them (spilled pages stay spilled, so dirty).
        for (p, _) in &out {
            if !spilled_pages.contains(p) {
                slice.mark_dirty(*p);
            }
        }
    }
    Ok(r.map(|()| n))
}
