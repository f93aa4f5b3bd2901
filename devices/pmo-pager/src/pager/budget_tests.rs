//! The DRAM budget on the real userfaultfd: host threads write and read far more pages than
//! the budget holds, psyncs run meanwhile, and nothing written is ever lost or reordered.

use super::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A store in memory: what a psync wrote, else page `p`'s initial pattern.
#[derive(Default)]
struct MemStore {
    pages: Mutex<HashMap<u64, Box<[u8; PAGE]>>>,
    /// Its working copy stands for the expander's device memory (design `cf`).
    on_device: bool,
}

impl MemStore {
    fn write(&self, pages: &[(u64, Box<[u8; PAGE]>)]) {
        let mut m = self.pages.lock().unwrap();
        for (p, d) in pages {
            m.insert(*p, d.clone());
        }
    }
    fn word(&self, page: u64) -> u64 {
        let mut b = [0u8; PAGE];
        self.fill(page, &mut b).unwrap();
        u64::from_le_bytes(b[8..16].try_into().unwrap())
    }
}

impl PageSource for MemStore {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        match self.pages.lock().unwrap().get(&page) {
            Some(d) => out.copy_from_slice(&d[..]),
            None => {
                out.fill(0);
                out[..8].copy_from_slice(&page.to_le_bytes());
            }
        }
        Ok(())
    }
    fn writable(&self) -> bool {
        true
    }
    fn working_copy_on_device(&self) -> bool {
        self.on_device
    }
}

fn word_at(base: u64, page: u64) -> u64 {
    // SAFETY: test reads of attached window pages (served by the pager).
    unsafe { std::ptr::read_volatile((base + page * PAGE_U64 + 8) as *const u64) }
}

fn set_word(base: u64, page: u64, v: u64) {
    // SAFETY: test writes into attached, writable window pages.
    unsafe { std::ptr::write_volatile((base + page * PAGE_U64 + 8) as *mut u64, v) }
}

fn budgeted(window_pages: u64, budget: u64, policy: &str) -> Arc<Pager> {
    let pager = Pager::new(window_pages * PAGE_U64, 2).unwrap();
    let policy = pmo_policies::placement_from_name(policy).unwrap();
    pager.set_dram_budget(budget, policy, window_pages).unwrap();
    pager
}

/// One xorshift64 step: the writers' page choices, deterministic per thread.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Psyncs the attachment at `off` into `store`; returns how many pages it wrote.
fn psync_into(pager: &Pager, off: u64, store: &MemStore) -> u64 {
    pager
        .collect_dirty::<()>(off, |pages| {
            store.write(pages);
            Ok(())
        })
        .unwrap()
        .unwrap()
}

/// The tier statistics once `done` holds: a fault thread may still be installing or
/// enforcing after the toucher resumed. Gives up (and shows them) after ten seconds.
fn settled(pager: &Pager, done: impl Fn(&TierStats) -> bool) -> TierStats {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let t = pager.tier_stats().unwrap();
        if done(&t) || std::time::Instant::now() > until {
            return t;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_budget_is_set_once_before_any_attach() {
    let pager = Pager::new(16 * PAGE_U64, 1).unwrap();
    let p = || pmo_policies::placement_from_name("fifo").unwrap();
    assert!(pager.set_dram_budget(0, p(), 16).is_err());
    pager.set_dram_budget(4, p(), 16).unwrap();
    assert!(pager.set_dram_budget(4, p(), 16).is_err(), "twice");
    let late = Pager::new(16 * PAGE_U64, 1).unwrap();
    late.attach(Arc::new(MemStore::default()), 4).unwrap();
    assert!(late.set_dram_budget(4, p(), 16).is_err(), "after an attach");
}

#[test]
fn dirty_pages_leave_dram_sealed_come_back_and_psync_takes_them() {
    for policy in ["fifo", "hotness"] {
        let pager = budgeted(64, 4, policy);
        let store = Arc::new(MemStore::default());
        let (off, stats) = pager.attach(store.clone(), 32).unwrap();
        let base = pager.host_addr() + off;
        for p in 0..32 {
            set_word(base, p, 1000 + p);
            let t = pager.tier_stats().unwrap();
            // One page per fault thread may be in flight above the budget.
            assert!(t.resident_pages <= 4 + 2, "{policy}: {t:?}");
        }
        // 32 written, 4 stay: 28 in device memory once the last fault's enforcement ends.
        let t = settled(&pager, |t| {
            t.resident_pages + t.spilled_pages == 32 && t.resident_pages <= 4
        });
        assert!(t.demotions_dirty >= 28, "{policy}: {t:?}");
        assert_eq!(t.spilled_pages, 28, "{policy}: {t:?}");
        // Read back: dirty pages come back from device memory with what was written.
        for p in 0..32 {
            assert_eq!(word_at(base, p), 1000 + p, "{policy}: page {p}");
        }
        let t = pager.tier_stats().unwrap();
        assert!(t.promotions_dirty >= 28, "{policy}: {t:?}");
        assert!(stats.promotions.load(Ordering::Relaxed) >= 28);
        // A psync takes every written page, resident or in device memory.
        let n = pager
            .collect_dirty::<()>(off, |pages| {
                let idx: Vec<u64> = pages.iter().map(|(p, _)| *p).collect();
                assert_eq!(idx, (0..32).collect::<Vec<_>>(), "{policy}");
                store.write(pages);
                Ok(())
            })
            .unwrap()
            .unwrap();
        assert_eq!(n, 32);
        assert_eq!(pager.tier_stats().unwrap().spilled_pages, 0, "{policy}");
        assert_eq!(stats.cxl_dirty_pages.load(Ordering::Relaxed), 0, "{policy}");
        for p in 0..32 {
            assert_eq!(store.word(p), 1000 + p, "{policy}: stored page {p}");
        }
        // Clean now: demoted pages are dropped and refilled from the store.
        for p in 0..32 {
            assert_eq!(word_at(base, p), 1000 + p, "{policy}: page {p}");
        }
        assert!(pager.tier_stats().unwrap().promotions_clean > 0, "{policy}");
        pager.detach(off).unwrap();
        let t = pager.tier_stats().unwrap();
        assert_eq!(
            (t.resident_pages, t.spilled_pages),
            (0, 0),
            "{policy}: {t:?}"
        );
    }
}

#[test]
fn unsynced_pages_in_device_memory_end_with_the_attachment() {
    let pager = budgeted(64, 2, "fifo");
    let store = Arc::new(MemStore::default());
    let (off, _) = pager.attach(store.clone(), 16).unwrap();
    let base = pager.host_addr() + off;
    for p in 0..16 {
        set_word(base, p, 7);
    }
    assert!(pager.tier_stats().unwrap().spilled_pages > 0);
    pager.detach(off).unwrap();
    assert_eq!(pager.tier_stats().unwrap().spilled_pages, 0);
    let (off, _) = pager.attach(store.clone(), 16).unwrap();
    let base = pager.host_addr() + off;
    for p in 0..16 {
        assert_eq!(word_at(base, p), 0, "page {p}: nothing was psynced");
    }
}

/// Writers own disjoint pages and count up in them while a psync loop runs and a budget of
/// 1/8 of the pages forces demotions and promotions all the time. After a last psync the
/// store holds every page's last value: no write lost to a demotion, a promotion or a psync.
#[test]
fn racing_writers_psyncs_and_demotions_lose_nothing() {
    const PAGES: u64 = 64;
    let pager = budgeted(128, PAGES / 8, "hotness");
    let store = Arc::new(MemStore::default());
    let (off, _) = pager.attach(store.clone(), PAGES).unwrap();
    let base = pager.host_addr() + off;
    let stop = AtomicBool::new(false);
    let last: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let last = &last;
                s.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                    for i in 1..=4000u64 {
                        let x = xorshift(&mut x);
                        // Thread t owns the pages with p % 2 == t; 90 % of its writes go
                        // to 4 of them.
                        let p = if x % 10 < 9 { x % 8 } else { x % PAGES };
                        let p = (p & !1) | t;
                        set_word(base, p, i);
                        assert_eq!(word_at(base, p), i, "page {p} lost its write");
                        last[p as usize].store(i, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                psync_into(&pager, off, &store);
                std::thread::yield_now();
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    psync_into(&pager, off, &store);
    for p in 0..PAGES {
        assert_eq!(
            store.word(p),
            last[p as usize].load(Ordering::Relaxed),
            "page {p}"
        );
    }
    let t = pager.tier_stats().unwrap();
    assert!(t.demotions_dirty > 0 && t.promotions_dirty > 0, "{t:?}");
}

/// In a VM, KVM's async page fault worker faults pages in for writing whatever the guest did:
/// a write of the bytes already there stands for it here. Such pages are not written by psync
/// and are dropped, not sealed, when demoted; a real change still is written.
#[test]
fn pages_marked_dirty_but_unchanged_are_neither_written_nor_sealed() {
    let pager = budgeted(64, 4, "fifo");
    let store = Arc::new(MemStore::default());
    let (off, stats) = pager.attach(store.clone(), 16).unwrap();
    let base = pager.host_addr() + off;
    for p in 0..16 {
        // The first access is a write fault: installed dirty.
        set_word(base, p, 0);
    }
    let t = settled(&pager, |t| t.resident_pages <= 4);
    assert_eq!(t.demotions_dirty, 0, "unchanged pages are dropped: {t:?}");
    assert!(t.demotions_clean >= 11, "{t:?}");
    let n = psync_into(&pager, off, &store);
    assert_eq!(n, 0, "nothing changed");
    assert!(stats.psync_unchanged.load(Ordering::Relaxed) > 0);
    set_word(base, 15, 5);
    let n = pager
        .collect_dirty::<()>(off, |pages| {
            assert_eq!(pages.len(), 1);
            assert_eq!(pages[0].0, 15);
            store.write(pages);
            Ok(())
        })
        .unwrap()
        .unwrap();
    assert_eq!((n, store.word(15)), (1, 5));
}

/// The fingerprint follows the store: bytes written back to what they were before the last
/// psync are a change, and are written. Writers flip their pages between two values while
/// psyncs and demotions run; the store ends with every page's last value.
#[test]
fn flipping_back_to_older_bytes_is_still_written() {
    const PAGES: u64 = 32;
    let pager = budgeted(64, 8, "hotness");
    let store = Arc::new(MemStore::default());
    let (off, _) = pager.attach(store.clone(), PAGES).unwrap();
    let base = pager.host_addr() + off;
    let psync = || psync_into(&pager, off, &store);
    // The simple case first: A (stored), B (psynced), A again.
    set_word(base, 0, 1);
    psync();
    set_word(base, 0, 0);
    psync();
    assert_eq!(store.word(0), 0, "the flip back was written");
    let stop = AtomicBool::new(false);
    let last: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let last = &last;
                s.spawn(move || {
                    let mut x = 0x2545_f491_4f6c_dd1du64 ^ (t + 1);
                    for _ in 0..4000 {
                        let x = xorshift(&mut x);
                        let p = ((x % PAGES) & !1) | t;
                        let v = (x >> 32) & 1;
                        set_word(base, p, v);
                        last[p as usize].store(v, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                psync();
                std::thread::yield_now();
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    psync();
    for p in 0..PAGES {
        assert_eq!(
            store.word(p),
            last[p as usize].load(Ordering::Relaxed),
            "page {p}"
        );
    }
}

/// With DRAM full, `hotness` leaves predicted pages in the CXL tier (counted) and `fifo`
/// installs them; either way every page reads back right.
#[test]
fn predictions_go_to_the_tier_the_policy_chooses() {
    for (policy, into_dram) in [("hotness", false), ("fifo", true)] {
        let pager = budgeted(64, 4, policy);
        let store = Arc::new(MemStore::default());
        let (off, stats) = pager.attach(store.clone(), 32).unwrap();
        let base = pager.host_addr() + off;
        // Fill the budget first, with no predictor.
        for p in 20..24 {
            assert_eq!(first_word(base, p), p);
        }
        let stream = pmo_policies::predictor_from_name("stream:4").unwrap();
        pager.set_predictor(off, Some(stream)).unwrap();
        // A fault on page 0 predicts 1..=4 (3 is held back as the trigger).
        assert_eq!(first_word(base, 0), 0);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let done = || {
            stats.prefetch_to_cxl.load(Ordering::Relaxed)
                + stats.pages_prefetched.load(Ordering::Relaxed)
                == 3
        };
        while !done() {
            assert!(
                std::time::Instant::now() < until,
                "{policy}: predictions never ended"
            );
            std::thread::yield_now();
        }
        let (to_dram, to_cxl) = (
            stats.pages_prefetched.load(Ordering::Relaxed),
            stats.prefetch_to_cxl.load(Ordering::Relaxed),
        );
        if into_dram {
            assert_eq!((to_dram, to_cxl), (3, 0), "{policy}");
        } else {
            assert_eq!((to_dram, to_cxl), (0, 3), "{policy}");
        }
        for p in 0..32 {
            assert_eq!(first_word(base, p), p, "{policy}: page {p}");
        }
        pager.detach(off).unwrap();
    }
}

/// Three attachments written at once share one budget: it holds (up to a page per fault
/// thread in flight) while they run, every write reaches the store, and a detach gives its
/// pages back.
#[test]
fn one_budget_holds_across_attachments() {
    const PAGES: u64 = 48;
    const BUDGET: u64 = 16;
    let pager = budgeted(256, BUDGET, "hotness");
    let attached: Vec<(u64, Arc<MemStore>, Arc<SliceStats>)> = (0..3)
        .map(|_| {
            let store = Arc::new(MemStore::default());
            let (off, stats) = pager.attach(store.clone(), PAGES).unwrap();
            (off, store, stats)
        })
        .collect();
    let stop = AtomicBool::new(false);
    let worst = AtomicU64::new(0);
    let last: Vec<Vec<AtomicU64>> = (0..3)
        .map(|_| (0..PAGES).map(|_| AtomicU64::new(0)).collect())
        .collect();
    std::thread::scope(|s| {
        let writers: Vec<_> = attached
            .iter()
            .enumerate()
            .map(|(i, (off, _, _))| {
                let base = pager.host_addr() + off;
                let last = &last[i];
                s.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 7);
                    for v in 1..=1500u64 {
                        let x = xorshift(&mut x);
                        let p = x % PAGES;
                        set_word(base, p, v);
                        last[p as usize].store(v, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let r = pager.tier_stats().unwrap().resident_pages;
                worst.fetch_max(r, Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let worst = worst.load(Ordering::Relaxed);
    assert!(worst <= BUDGET + 2, "resident reached {worst}");
    for (i, (off, store, _)) in attached.iter().enumerate() {
        psync_into(&pager, *off, store);
        for p in 0..PAGES {
            assert_eq!(
                store.word(p),
                last[i][p as usize].load(Ordering::Relaxed),
                "attachment {i} page {p}"
            );
        }
    }
    // Quiet now: the VM's count is the attachments' counts, and a detach takes its share.
    let share = |i: usize| attached[i].2.dram_pages.load(Ordering::Relaxed);
    let before = pager.tier_stats().unwrap().resident_pages;
    assert_eq!(before, share(0) + share(1) + share(2));
    pager.detach(attached[1].0).unwrap();
    assert_eq!(
        pager.tier_stats().unwrap().resident_pages,
        share(0) + share(2)
    );
    for (off, _, _) in [&attached[0], &attached[2]] {
        pager.detach(*off).unwrap();
    }
    let t = pager.tier_stats().unwrap();
    assert_eq!((t.resident_pages, t.spilled_pages), (0, 0), "{t:?}");
}

/// The first word of a page of the window: its number, as `MemStore` fills it.
fn first_word(base: u64, page: u64) -> u64 {
    // SAFETY: test reads of attached window pages (served by the pager).
    unsafe { std::ptr::read_volatile((base + page * PAGE_U64) as *const u64) }
}

/// Design `cf`: the working copy is in the expander's device memory. Its pages are never
/// counted against the DRAM budget nor demoted (a DRAM-tier attachment beside it is), every
/// page moved into device memory (an install) or out of it (a psync's read) waits the
/// device-memory latency, and what was written reaches the store.
#[test]
fn a_working_copy_on_the_device_is_outside_the_budget_and_charged_per_page() {
    const PAGES: u64 = 64;
    const BUDGET: u64 = 8;
    const LATENCY: std::time::Duration = std::time::Duration::from_millis(3);
    let pager = budgeted(256, BUDGET, "hotness");
    pager.set_device_memory_latency(LATENCY);
    let on_device = Arc::new(MemStore {
        on_device: true,
        ..MemStore::default()
    });
    let in_dram = Arc::new(MemStore::default());
    let (cf, cf_stats) = pager.attach(on_device.clone(), PAGES).unwrap();
    let (d, d_stats) = pager.attach(in_dram.clone(), PAGES).unwrap();
    let (cf_base, d_base) = (pager.host_addr() + cf, pager.host_addr() + d);
    // Every install is a charged transfer: the touches cannot take less than that.
    let t = std::time::Instant::now();
    for p in 0..PAGES {
        set_word(cf_base, p, 1000 + p);
    }
    assert!(t.elapsed() >= LATENCY * PAGES as u32, "{:?}", t.elapsed());
    // The install wakes the writer before its fault thread counts the page.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cf_stats.device_pages.load(Ordering::Relaxed) < PAGES && std::time::Instant::now() < until
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(cf_stats.device_pages.load(Ordering::Relaxed), PAGES);
    assert_eq!(cf_stats.dram_pages.load(Ordering::Relaxed), 0);
    assert_eq!(pager.tier_stats().unwrap().resident_pages, 0);
    // The DRAM attachment alone is held to the budget; the device's pages stay put.
    for round in 0..3 {
        for p in 0..PAGES {
            set_word(d_base, p, round * 100 + p);
        }
    }
    let tier = settled(&pager, |t| t.resident_pages <= BUDGET + 2);
    assert!(tier.resident_pages <= BUDGET + 2, "{tier:?}");
    assert!(d_stats.demotions.load(Ordering::Relaxed) > 0);
    assert_eq!(cf_stats.demotions.load(Ordering::Relaxed), 0);
    assert_eq!(cf_stats.promotions.load(Ordering::Relaxed), 0);
    for p in 0..PAGES {
        assert_eq!(word_at(cf_base, p), 1000 + p, "page {p} on the device");
    }
    // A psync reads every dirty page out of device memory, each a charged transfer.
    let t = std::time::Instant::now();
    assert_eq!(psync_into(&pager, cf, &on_device), PAGES);
    assert!(t.elapsed() >= LATENCY * PAGES as u32, "{:?}", t.elapsed());
    for p in 0..PAGES {
        assert_eq!(on_device.word(p), 1000 + p);
    }
    assert_eq!(psync_into(&pager, d, &in_dram), PAGES);
    for p in 0..PAGES {
        assert_eq!(in_dram.word(p), 200 + p);
    }
    pager.detach(cf).unwrap();
    pager.detach(d).unwrap();
}
