//! Working extents (design `c`'s working copies on the expander): stores through the DPA
//! mapping are recorded per page, host-path writes are not, dropping an extent wipes it, and
//! the area hands out first-fit runs under their own range ids. Host threads stand in for
//! vCPUs by touching the uffd-backed DPA space directly.

// Helpers outside `#[test]` functions unwrap too.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use cxl_t3::cache::BLOCK;
use cxl_t3::expander::{CxlMedium, ExpanderError};
use cxl_t3::media::HEADER_LEN;
use cxl_t3::{WorkingArea, WorkingExtent};

const P: u64 = BLOCK;

/// Stores one byte at `off` of the extent through the mapping, as a guest would.
fn store(e: &WorkingExtent, off: u64, v: u8) {
    assert!(off < e.len());
    // SAFETY: inside the extent's part of the DPA mapping; faults are served by the expander.
    unsafe { std::ptr::write_volatile((e.host_addr() + off) as *mut u8, v) }
}

/// Stores a u64 at `off` of the extent through the mapping.
fn store64(e: &WorkingExtent, off: u64, v: u64) {
    assert!(off + 8 <= e.len() && off.is_multiple_of(8));
    // SAFETY: as in `store`; aligned.
    unsafe { std::ptr::write_volatile((e.host_addr() + off) as *mut u64, v) }
}

/// Loads one byte at `off` of the extent through the mapping.
fn load(e: &WorkingExtent, off: u64) -> u8 {
    assert!(off < e.len());
    // SAFETY: as in `store`.
    unsafe { std::ptr::read_volatile((e.host_addr() + off) as *const u8) }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn stores_through_the_mapping_are_taken_exactly() {
    // Two sets of two ways: almost every touch evicts something.
    let (x, area, media) = setup("exact", 2, 2);
    let e = area.alloc(32 * P).unwrap();
    let blk = |page: u64| e.dpa() / BLOCK + page;
    let mut fresh = 0u64;
    assert_eq!(e.take_written().unwrap(), Vec::<u64>::new());

    // A set of pages, more than the cache holds: bits survive eviction.
    let pages = [1u64, 5, 6, 17, 30, 31];
    for &p in &pages {
        store(&e, p * P + 9, p as u8 + 1);
    }
    // Loads alone are not stores.
    for p in [2u64, 7, 20] {
        assert_eq!(load(&e, p * P), 0);
    }
    assert_eq!(e.take_written().unwrap(), pages.to_vec());
    assert_eq!(e.take_written().unwrap(), Vec::<u64>::new());

    // A block that is cache-dirty when taken: protected again while dirty, its next store is
    // a write-protect fault on the resident block (no fill), and it is reported again.
    store(&e, 3 * P, 0x33);
    assert_eq!(e.take_written().unwrap(), vec![3]);
    let (fills, wp) = (x.stats().fills, x.counters().wp_faults);
    store(&e, 3 * P + 1, 0x34);
    assert_eq!(x.stats().fills, fills, "block 3 should still be resident");
    assert_eq!(x.counters().wp_faults, wp + 1);
    assert_eq!(e.take_written().unwrap(), vec![3]);
    assert_eq!(e.take_written().unwrap(), Vec::<u64>::new());
    assert_eq!(peek(&e, 3 * P, 2), [0x33, 0x34]);

    // Taken, then evicted, then stored again: the store fills the block writable and is
    // reported.
    store(&e, 8 * P, 0x88);
    assert_eq!(e.take_written().unwrap(), vec![8]);
    evict_set_of(&x, blk(8), &mut fresh);
    let fills = x.stats().fills;
    store(&e, 8 * P + 1, 0x89);
    assert_eq!(
        x.stats().fills,
        fills + 1,
        "block 8 should have been evicted"
    );
    assert_eq!(e.take_written().unwrap(), vec![8]);

    // Stored, evicted before the take: still reported; the next store after the take too.
    store(&e, 9 * P, 0x99);
    evict_set_of(&x, blk(9), &mut fresh);
    assert_eq!(e.take_written().unwrap(), vec![9]);
    assert_eq!(e.take_written().unwrap(), Vec::<u64>::new());
    store(&e, 9 * P + 1, 0x9a);
    assert_eq!(e.take_written().unwrap(), vec![9]);

    // Written back (which protects and cleans) after the take: the next store is seen.
    store(&e, 11 * P, 0xbb);
    assert_eq!(e.take_written().unwrap(), vec![11]);
    x.flush().unwrap();
    assert_eq!(e.take_written().unwrap(), Vec::<u64>::new());
    store(&e, 11 * P + 1, 0xbc);
    assert_eq!(e.take_written().unwrap(), vec![11]);
    // Written back before the take: the record is about the extent, not the cache.
    store(&e, 12 * P, 0xcc);
    x.persist(e.dpa(), e.len()).unwrap();
    assert_eq!(e.take_written().unwrap(), vec![12]);
    store(&e, 12 * P + 1, 0xcd);
    assert_eq!(e.take_written().unwrap(), vec![12]);

    // Every byte stored is there, through the mapping and the host path.
    let mut b = [0u8; 2];
    for (p, v) in [
        (3u64, [0x33, 0x34]),
        (8, [0x88, 0x89]),
        (9, [0x99, 0x9a]),
        (11, [0xbb, 0xbc]),
    ] {
        assert_eq!(peek(&e, p * P, 2), v, "page {p}");
        e.read(p * P, &mut b).unwrap();
        assert_eq!(b, v, "page {p}");
    }
    for &p in &pages {
        assert_eq!(load(&e, p * P + 9), p as u8 + 1, "page {p}");
    }
    // Reading pages back stores nothing.
    assert_eq!(e.take_written().unwrap(), Vec::<u64>::new());
    // mark_written puts pages back (a failed psync); pages past the extent are ignored.
    e.mark_written(&[4, 2, 99, 4]);
    assert_eq!(e.take_written().unwrap(), vec![2, 4]);
    assert!(x.stats().evictions > 10);
    // Every fill from the media matched what the extent wrote there.
    assert_eq!(e.integrity_failures(), 0);
    drop(e);
    done(x, area, media);
}

/// A writer stores sequence numbers to pages without pause while a taker takes the written
/// pages and copies each one out (as a psync does). Every store must be reported by a take
/// that ends after it began, and the last copy of every page must hold its last store: none
/// is lost to a take racing it, to a write-protect of a dirty block or to an eviction.
#[test]
fn no_store_is_lost_to_racing_takes() {
    // Four sets of two ways for a 24-page extent: the writer's pages are evicted, filled,
    // protected dirty and clean by turns.
    let (x, area, media) = setup("race", 4, 2);
    const PAGES: u64 = 24;
    const STORES: u64 = 20_000;
    let e = area.alloc(PAGES * P).unwrap();
    let takes_done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);

    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    // Per page: the number of takes completed before its last store began, and that store
    // (slot, value); every take; per page, the slot of its last store in its last copy.
    let (last_after, last_value, takes, synced) = std::thread::scope(|s| {
        let (e, takes_done, stop) = (&e, &takes_done, &stop);
        let writer = s.spawn(|| {
            let _stop = Stop(stop);
            let mut after = BTreeMap::new();
            let mut value = BTreeMap::new();
            for i in 0..STORES {
                // Every other store goes to one of four hot pages, which stay resident for a
                // while (write-protect faults on blocks a take protected while dirty), the
                // others stride over every page (fills, evictions, write-backs).
                let page = if i % 2 == 0 {
                    (i / 2) % 4
                } else {
                    (i * 7) % PAGES
                };
                let seq = i + 1;
                let done = takes_done.load(Ordering::Acquire);
                store64(e, page * P + 8 * (i % 4), seq);
                after.insert(page, done);
                value.insert(page, (i % 4, seq));
            }
            (after, value)
        });
        let taker = s.spawn(|| {
            let mut takes = Vec::new();
            let mut synced: BTreeMap<u64, [u64; 4]> = BTreeMap::new();
            let mut buf = [0u8; 32];
            loop {
                let last = stop.load(Ordering::Acquire);
                let t = e.take_written().unwrap();
                for &p in &t {
                    e.read(p * P, &mut buf).unwrap();
                    let mut words = [0u64; 4];
                    for (w, c) in words.iter_mut().zip(buf.chunks_exact(8)) {
                        *w = u64::from_le_bytes(c.try_into().unwrap());
                    }
                    synced.insert(p, words);
                }
                takes.push(t);
                takes_done.store(takes.len() as u64, Ordering::Release);
                if last {
                    break;
                }
            }
            (takes, synced)
        });
        let (after, value) = writer.join().unwrap();
        let (takes, copies) = taker.join().unwrap();
        let synced: BTreeMap<u64, u64> = copies
            .into_iter()
            .filter_map(|(p, words)| {
                let (slot, _) = value.get(&p)?;
                Some((p, words[*slot as usize]))
            })
            .collect();
        (after, value, takes, synced)
    });

    assert!(
        takes.len() > 2,
        "the taker must have raced the writer: {} takes",
        takes.len()
    );
    let busy = takes.iter().filter(|t| !t.is_empty()).count();
    assert!(busy > 1, "only {busy} takes found stores");
    // Takes are numbered from 1; `last_after[p] = n` means the store began after take n.
    let mut last_take = BTreeMap::new();
    for (n, t) in takes.iter().enumerate() {
        for &p in t {
            last_take.insert(p, n as u64 + 1);
        }
    }
    for (&p, &after) in &last_after {
        let got = last_take.get(&p).copied().unwrap_or(0);
        assert!(
            got > after,
            "page {p}: last stored after take {after}, last reported by take {got}"
        );
    }
    for (&p, &(_, seq)) in &last_value {
        assert_eq!(
            synced.get(&p),
            Some(&seq),
            "page {p}: its last store was never copied out"
        );
    }
    assert!(x.stats().evictions > 100, "the race must also evict");
    assert_eq!(e.integrity_failures(), 0, "no false alarm under the race");
    assert_eq!(x.counters().working_integrity_failures, 0);
    drop(e);
    done(x, area, media);
}

/// Host-path writes are not stores through the mapping: not reported, and they leave the
/// page write-protected, so the next store through the mapping still is.
#[test]
fn host_path_writes_are_not_reported() {
    let (x, area, media) = setup("host", 2, 4);
    let e = area.alloc(8 * P).unwrap();
    store(&e, P, 1); // page 1 resident and dirty
    assert_eq!(e.take_written().unwrap(), vec![1]); // ... and protected again
    assert_eq!(load(&e, 2 * P), 0); // page 2 resident and clean
    store(&e, 3 * P, 3); // page 3 reported and writable
                         // Page 0 not resident, page 1 dirty and protected, page 2 clean, page 3 writable, and a
                         // write straddling pages 4 and 5.
    e.write(0, b"host-zero").unwrap();
    e.write(P + 100, b"host-one").unwrap();
    e.write(2 * P + 200, b"host-two").unwrap();
    e.write(3 * P + 300, b"host-three").unwrap();
    e.write(5 * P - 4, b"straddle").unwrap();
    assert_eq!(
        e.take_written().unwrap(),
        vec![3],
        "only the mapping's store"
    );
    assert_eq!(e.take_written().unwrap(), Vec::<u64>::new());
    // The host writes are there, through both paths.
    for (off, want) in [
        (0, &b"host-zero"[..]),
        (P + 100, b"host-one"),
        (2 * P + 200, b"host-two"),
        (3 * P + 300, b"host-three"),
        (5 * P - 4, b"straddle"),
    ] {
        assert_eq!(peek(&e, off, want.len()), want, "at {off:#x}");
        let mut b = vec![0u8; want.len()];
        e.read(off, &mut b).unwrap();
        assert_eq!(b, want, "at {off:#x}");
    }
    assert_eq!(peek(&e, P, 1), [1]);
    assert_eq!(peek(&e, 3 * P, 1), [3]);
    // Every page a host write touched is still protected: stores to them are reported.
    for p in 0..6 {
        store(&e, p * P + 4000, 0x40 + p as u8);
    }
    assert_eq!(e.take_written().unwrap(), (0..6).collect::<Vec<_>>());
    assert_eq!(peek(&e, 0, 9), b"host-zero");
    // Out of the extent.
    assert!(matches!(
        e.write(8 * P - 1, &[0, 0]),
        Err(ExpanderError::OutsideExtent { .. })
    ));
    assert!(matches!(
        e.read(u64::MAX, &mut [0u8; 2]),
        Err(ExpanderError::OutsideExtent { .. })
    ));
    assert!(matches!(
        e.write(8 * P, &[0]),
        Err(ExpanderError::OutsideExtent { .. })
    ));
    e.write(8 * P, &[]).unwrap();
    drop(e);
    done(x, area, media);
}

/// Dropping an extent leaves nothing of it: no block of its range on the media is non-zero
/// (the written-back ones zeroed, the dirty ones dropped unwritten), its key is cleared, and
/// the same run allocated again reads as zeros.
#[test]
fn dropping_an_extent_wipes_it() {
    let (x, area, media) = setup("drop", 4, 2);
    let marker = b"WORKING-COPY-MARKER-0123456789";
    let e = area.alloc(16 * P).unwrap();
    let (dpa, len, id) = (e.dpa(), e.len(), e.range_id());
    assert_eq!(id, u16::MAX);
    assert_eq!(x.range_key(id), Some((dpa, dpa + len)));
    for p in 0..16 {
        poke(&e, p * P + 64, marker);
    }
    x.flush().unwrap();
    let range = (HEADER_LEN + dpa) as usize..(HEADER_LEN + dpa + len) as usize;
    let raw = std::fs::read(&media).unwrap();
    assert_eq!(
        count(&raw, marker),
        0,
        "the range key keeps plaintext off the media"
    );
    let written = raw[range.clone()]
        .chunks(P as usize)
        .filter(|b| b.iter().any(|&c| c != 0))
        .count();
    assert_eq!(written, 16, "the flush wrote the extent's ciphertext");
    // And some dirty in the cache at the drop.
    for p in [2u64, 3, 9] {
        poke(&e, p * P + 1000, marker);
    }
    let writebacks = x.stats().writebacks;
    drop(e);
    assert_eq!(
        x.stats().writebacks,
        writebacks,
        "the drop wrote nothing back"
    );
    let raw = std::fs::read(&media).unwrap();
    assert_eq!(count(&raw, marker), 0);
    let dirty_blocks: Vec<usize> = raw[range.clone()]
        .chunks(P as usize)
        .enumerate()
        .filter(|(_, b)| b.iter().any(|&c| c != 0))
        .map(|(i, _)| i)
        .collect();
    assert!(
        dirty_blocks.is_empty(),
        "blocks {dirty_blocks:?} of the extent hold data"
    );
    assert_eq!(x.range_key(id), None, "the key is cleared");
    // The same run and id again, reading as zeros both ways.
    let e = area.alloc(16 * P).unwrap();
    assert_eq!((e.dpa(), e.range_id()), (dpa, id));
    let zeros = vec![0u8; len as usize];
    assert_eq!(peek(&e, 0, len as usize), zeros);
    let mut b = vec![0xffu8; len as usize];
    e.read(0, &mut b).unwrap();
    assert_eq!(b, zeros);
    drop(e);
    done(x, area, media);
}

/// A pattern stored through the mapping over four times the cache survives eviction (with
/// takes in between, so dirty blocks protected for the record are evicted too).
#[test]
fn data_survives_eviction() {
    let (x, area, media) = setup("evict", 4, 2);
    let e = area.alloc(32 * P).unwrap();
    let page_of =
        |p: u64| -> Vec<u8> { (0..P).map(|i| (p * 31 + i * 7 + (i >> 8)) as u8).collect() };
    for p in 0..32 {
        poke(&e, p * P, &page_of(p));
        if p % 5 == 4 {
            assert_eq!(e.take_written().unwrap(), ((p - 4)..=p).collect::<Vec<_>>());
        }
    }
    assert_eq!(e.take_written().unwrap(), vec![30, 31]);
    assert!(x.stats().evictions >= 24 && x.stats().writebacks >= 24);
    for p in (0..32).rev() {
        assert_eq!(
            peek(&e, p * P, P as usize),
            page_of(p),
            "page {p} via the mapping"
        );
    }
    let mut b = vec![0u8; P as usize];
    for p in 0..32 {
        e.read(p * P, &mut b).unwrap();
        assert_eq!(b, page_of(p), "page {p} via the host path");
    }
    assert_eq!(e.integrity_failures(), 0);
    drop(e);
    done(x, area, media);
}

#[test]
fn allocation_is_first_fit_and_reuses_freed_runs() {
    let (x, _, media) = setup("alloc", 4, 2);
    let base = MIB;
    assert!(matches!(
        WorkingArea::new(x.clone(), base + 1, 2 * MIB),
        Err(ExpanderError::BadWorkingArea { .. })
    ));
    assert!(matches!(
        WorkingArea::new(x.clone(), base, 2 * MIB + P),
        Err(ExpanderError::BadWorkingArea { .. })
    ));
    assert!(matches!(
        WorkingArea::new(x.clone(), base, base),
        Err(ExpanderError::BadWorkingArea { .. })
    ));
    let area = WorkingArea::new(x.clone(), base, base + 16 * P).unwrap();
    assert_eq!((area.start(), area.len()), (base, 16 * P));
    // The range table already holds id 65535 (outside the area): the area skips it.
    x.set_range_key(u16::MAX, 0, P, &[7u8; 64]).unwrap();
    let a = area.alloc(4 * P).unwrap();
    let b = area.alloc(4 * P).unwrap();
    let c = area.alloc(8 * P).unwrap();
    let got = |e: &WorkingExtent| (e.offset(), e.len(), e.range_id());
    assert_eq!(got(&a), (0, 4 * P, 65534));
    assert_eq!(got(&b), (4 * P, 4 * P, 65533));
    assert_eq!(got(&c), (8 * P, 8 * P, 65532));
    for e in [&a, &b, &c] {
        assert_eq!(e.dpa(), base + e.offset());
        assert_eq!(e.host_addr(), x.host_addr() + e.dpa());
        assert_eq!(
            x.range_key(e.range_id()),
            Some((e.dpa(), e.dpa() + e.len()))
        );
    }
    assert!(matches!(area.alloc(P), Err(ExpanderError::NoRoom(_))));
    drop(b);
    // The freed run and id come back, lowest run first.
    let d = area.alloc(2 * P).unwrap();
    assert_eq!(got(&d), (4 * P, 2 * P, 65533));
    assert!(matches!(area.alloc(4 * P), Err(ExpanderError::NoRoom(_))));
    let f = area.alloc(2 * P).unwrap();
    assert_eq!(got(&f), (6 * P, 2 * P, 65531));
    drop(a);
    drop(c);
    assert!(matches!(area.alloc(17 * P), Err(ExpanderError::NoRoom(_))));
    assert!(matches!(
        area.alloc(!(P - 1)),
        Err(ExpanderError::NoRoom(_))
    ));
    assert!(matches!(area.alloc(0), Err(ExpanderError::BadExtentLen(0))));
    assert!(matches!(
        area.alloc(100),
        Err(ExpanderError::BadExtentLen(100))
    ));
    assert!(matches!(
        area.alloc(P + 1),
        Err(ExpanderError::BadExtentLen(_))
    ));
    // 8 pages free at the end, 4 at the start: first fit takes the start.
    let g = area.alloc(4 * P).unwrap();
    assert_eq!(got(&g), (0, 4 * P, 65535 - 1));
    let h = area.alloc(8 * P).unwrap();
    assert_eq!(h.offset(), 8 * P);
    let ids: BTreeSet<u16> = [&d, &f, &g, &h].iter().map(|e| e.range_id()).collect();
    assert_eq!(ids.len(), 4, "ids are unique");
    drop((d, f, g, h));
    // All free again: one extent takes the whole area.
    let all = area.alloc(16 * P).unwrap();
    assert_eq!(got(&all), (0, 16 * P, 65534));
    drop(all);
    done(x, area, media);
}

/// A table running XTS-AES-128 (a store formatted with `cipher=xts-128`) gets 32-byte keys
/// for its extents, and their data round-trips through the media under them.
#[test]
fn extents_follow_the_tables_algorithm() {
    let (x, area, media) = setup("xts128", 2, 2);
    x.set_range_key(0, 0, 4 * P, &[9u8; 32]).unwrap();
    let e = area.alloc(8 * P).unwrap();
    for p in 0..8 {
        poke(&e, p * P, &[p as u8 + 1; 64]);
    }
    x.flush().unwrap();
    let mut b = [0u8; 64];
    for p in 0..8 {
        e.read(p * P, &mut b).unwrap();
        assert_eq!(b, [p as u8 + 1; 64]);
    }
    // A 64-byte key is now refused by the table: the extent's was not one.
    assert!(x.set_range_key(5, 8 * P, 9 * P, &[1u8; 64]).is_err());
    drop(e);
    done(x, area, media);
}

/// The PMO store's medium never clears or reuses a working extent's range id (a store with
/// that many slots leaves that extent unkeyed instead).
#[test]
fn the_store_medium_leaves_working_keys_alone() {
    use pmo_media::{Extent, ExtentKeys};
    let (x, area, media) = setup("medium", 2, 2);
    let e = area.alloc(4 * P).unwrap();
    let m = CxlMedium::new(x.clone()).with_extent_keys(Arc::new(|_: &Extent| {
        Some(zeroize::Zeroizing::new(vec![5u8; 64]))
    }));
    let id = e.range_id();
    let at = |slot: u32| Extent {
        slot,
        off: 0,
        len: 4 * P,
        owner: [1; 32],
    };
    m.extent_in_use(&at(u32::from(id))).unwrap();
    assert_eq!(x.range_key(id), Some((e.dpa(), e.dpa() + e.len())));
    assert!(!m.extent_encrypted(&at(u32::from(id))));
    m.extent_released(u32::from(id)).unwrap();
    assert_eq!(x.range_key(id), Some((e.dpa(), e.dpa() + e.len())));
    // Other slots are keyed as before.
    m.extent_in_use(&at(1)).unwrap();
    assert!(m.extent_encrypted(&at(1)));
    drop(e);
    drop(m);
    done(x, area, media);
}
