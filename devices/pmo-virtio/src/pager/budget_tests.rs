//! The DRAM budget on the real userfaultfd: host threads write and read far more pages than
//! the budget holds, psyncs run meanwhile, and nothing written is ever lost or reordered.

use super::*;
use std::collections::HashMap;

/// A store in memory: what a psync wrote, else page `p`'s initial pattern.
#[derive(Default)]
struct MemStore {
    pages: Mutex<HashMap<u64, Box<[u8; PAGE]>>>,
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
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
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
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
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
