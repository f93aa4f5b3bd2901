//! Detach racing the pager's own work: fills in flight across a detach and the next attach
//! over the same range, and a psync that looked its attachment up before a detach.

use super::*;

/// xorshift64: a small deterministic generator for the stress tests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Byte of every page of the attachment the stress test detaches (A)...
const A_BYTE: u8 = 0xa5;
/// ...and of the one it attaches next over the same range (B).
const B_BYTE: u8 = 0x5b;

/// A page source whose fills take a variable time: most of them wait until
/// the test releases them (after it detached the attachment and attached the
/// next one over the same range), so a fill is in flight across detach and
/// attach in every cycle. Some fills fail verification (refused pages).
struct SlowSource {
    byte: u8,
    writable: bool,
    refuse_one_in: u64,
    /// Fills running now.
    active: AtomicU64,
    released: AtomicBool,
    rng: Mutex<Rng>,
}

impl SlowSource {
    fn new(byte: u8, writable: bool, refuse_one_in: u64, seed: u64) -> Self {
        SlowSource {
            byte,
            writable,
            refuse_one_in,
            active: AtomicU64::new(0),
            released: AtomicBool::new(false),
            rng: Mutex::new(Rng(seed | 1)),
        }
    }
}

impl PageSource for SlowSource {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        self.active.fetch_add(1, Ordering::SeqCst);
        let r = self.rng.lock().unwrap().next();
        // Three in four fills wait for the release; the others take a short, random time.
        // Both waits are bounded, so a fill never hangs the test.
        let quick = r.is_multiple_of(4);
        let spins = if quick { r % 64 } else { 1 << 22 };
        for _ in 0..spins {
            if !quick && self.released.load(Ordering::SeqCst) {
                break;
            }
            std::thread::yield_now();
        }
        let refuse = self.refuse_one_in != 0 && (r >> 8).is_multiple_of(self.refuse_one_in);
        if !refuse {
            out.fill(self.byte);
            out[..8].copy_from_slice(&page.to_le_bytes());
        }
        self.active.fetch_sub(1, Ordering::SeqCst);
        if refuse {
            return Err(FillError::Integrity(page));
        }
        Ok(())
    }
    fn writable(&self) -> bool {
        self.writable
    }
}

/// What the page at `addr` of attachment B should hold, or why it does not.
fn check_b_page(kc: &KernelCopy, addr: u64, page: u64) -> Result<(), String> {
    let mut got = vec![0u8; PAGE];
    kc.read(addr, &mut got).map_err(|e| {
        format!("page {page} of B is inaccessible (errno {e}): A's refusal landed in B")
    })?;
    if got[8..].contains(&A_BYTE) {
        return Err(format!("page {page} of B holds A's plaintext"));
    }
    if u64::from_le_bytes(got[..8].try_into().unwrap()) != page
        || got[8..].iter().any(|&b| b != B_BYTE)
    {
        return Err(format!(
            "page {page} of B does not hold B's data: {:02x?}",
            &got[..16]
        ));
    }
    Ok(())
}

/// Detach of attachment A while its fills (demand faults, prefetches,
/// triggers, refusals) are in flight, then attach of B over the same range:
/// nothing A's fills do may land in B. B must read exactly its own data
/// (never A's plaintext, never a zero page, never an inaccessible page), and
/// every write to B must be seen by its dirty tracking.
///
/// Each defect this test was written against failed it in the first cycle; 20,000 cycles
/// (about 20 s unoptimized here) keep a wide margin. `PMO_RACE_CYCLES=N` runs a longer soak.
#[test]
fn detach_racing_fills_never_leaks_plaintext_into_the_next_attachment() {
    const NPAGES: u64 = 4;
    const TOUCHERS: usize = 2;
    let cycles: u64 = std::env::var("PMO_RACE_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    // The window is exactly one attachment: A and B always share the range.
    let pager = Pager::new(NPAGES * PAGE_U64, 2).unwrap();
    let base = pager.host_addr();
    let stop = AtomicBool::new(false);
    // The cycle the touchers are asked to touch A in...
    let epoch = AtomicU64::new(0);
    // ...and the last cycle each toucher finished its reads in (a read
    // returns only once its fault was served).
    let done: Vec<AtomicU64> = (0..TOUCHERS).map(|_| AtomicU64::new(0)).collect();
    let mut raced = 0u64;
    let current_a: Mutex<Option<Arc<SlowSource>>> = Mutex::new(None);
    std::thread::scope(|s| {
        let mut touchers = Vec::new();
        for (t, done) in done.iter().enumerate() {
            let (stop, epoch) = (&stop, &epoch);
            let h = s.spawn(move || {
                let kc = KernelCopy::new();
                let mut rng = Rng(0x1234_5678 + t as u64);
                let mut word = [0u8; 8];
                let mut last = 0;
                // Touchers idle between cycles so the test spends its CPU on races.
                while !stop.load(Ordering::SeqCst) {
                    let e = epoch.load(Ordering::SeqCst);
                    if e == last {
                        std::thread::park();
                        continue;
                    }
                    last = e;
                    // Two reads like a vCPU's: the first faults on A; the
                    // second lands in A, the free window or B, depending on
                    // how far the controller got meanwhile. A refused page of
                    // A is an EFAULT here, as for a vCPU.
                    for _ in 0..2 {
                        let p = rng.next() % NPAGES;
                        let _ = kc.read(base + p * PAGE_U64 + 8, &mut word);
                    }
                    done.store(e, Ordering::SeqCst);
                }
            });
            touchers.push(h.thread().clone());
        }
        let kc = KernelCopy::new();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let outcome = (|| -> Result<(), String> {
            for cycle in 0..cycles {
                let a = Arc::new(SlowSource::new(A_BYTE, false, 8, rng.next()));
                *current_a.lock().unwrap() = Some(a.clone());
                let (off, _) = pager.attach(a.clone(), NPAGES).map_err(|e| e.to_string())?;
                assert_eq!(off, 0);
                if rng.next().is_multiple_of(2) {
                    let p = pmo_policies::predictor_from_name("stream:2").unwrap();
                    pager.set_predictor(off, Some(p)).unwrap();
                }
                epoch.store(cycle + 1, Ordering::SeqCst);
                for t in &touchers {
                    t.unpark();
                }
                // Touchers fault on A within microseconds. Rarely every page
                // of A is resolved at once (quick fills, refusals): no race then.
                let slice = pager.window.slice_at(off).map_err(|e| e.to_string())?;
                let resolved =
                    |p: u64| slice.installed.test(p) || slice.poisoned.lock().unwrap().contains(&p);
                wait_for("a fill of A in flight", || {
                    a.active.load(Ordering::SeqCst) > 0
                        || (0..NPAGES).all(resolved)
                        || done.iter().all(|d| d.load(Ordering::SeqCst) == cycle + 1)
                });
                if a.active.load(Ordering::SeqCst) > 0 {
                    raced += 1;
                }
                drop(slice);
                // Sometimes the fill ends before the detach, mostly after B is attached.
                let early = rng.next().is_multiple_of(8);
                if early {
                    a.released.store(true, Ordering::SeqCst);
                }
                pager.detach(off).map_err(|e| e.to_string())?;
                let b = Arc::new(SlowSource::new(B_BYTE, true, 0, rng.next()));
                b.released.store(true, Ordering::SeqCst);
                let (off_b, _) = pager.attach(b, NPAGES).map_err(|e| e.to_string())?;
                assert_eq!(off_b, 0, "B reuses A's range");
                a.released.store(true, Ordering::SeqCst);
                // Let every read that was waiting on A finish: its fault was
                // served (by A's late install, or it retried into B).
                wait_for("the touchers' pending reads", || {
                    done.iter().all(|d| d.load(Ordering::SeqCst) == cycle + 1)
                });
                for p in 0..NPAGES {
                    check_b_page(&kc, base + off_b + p * PAGE_U64, p)
                        .map_err(|e| format!("cycle {cycle}: {e}"))?;
                }
                for p in 0..NPAGES {
                    kc.write(base + off_b + p * PAGE_U64 + 16, &[0xee])
                        .map_err(|e| format!("cycle {cycle}: write to page {p} of B: errno {e}"))?;
                }
                let mut dirty = Vec::new();
                pager
                    .collect_dirty(off_b, |pages| {
                        dirty = pages.iter().map(|(p, _)| *p).collect();
                        Ok::<_, ()>(())
                    })
                    .map_err(|e| e.to_string())?
                    .map_err(|()| "psync sink".to_string())?;
                if dirty != (0..NPAGES).collect::<Vec<_>>() {
                    return Err(format!(
                        "cycle {cycle}: B's writes to pages 0..{NPAGES} left dirty set {dirty:?}"
                    ));
                }
                pager.detach(off_b).map_err(|e| e.to_string())?;
                if pager.refused_pages() != 0 {
                    return Err(format!(
                        "cycle {cycle}: {} refused pages left after both detached",
                        pager.refused_pages()
                    ));
                }
            }
            Ok(())
        })();
        stop.store(true, Ordering::SeqCst);
        // Let a toucher still waiting on a fill of A finish (its fill is bounded anyway).
        if let Some(a) = current_a.lock().unwrap().take() {
            a.released.store(true, Ordering::SeqCst);
        }
        for t in &touchers {
            t.unpark();
        }
        if let Err(e) = outcome {
            panic!("{e} (after {raced} raced cycles)");
        }
    });
    eprintln!("{cycles} detach/attach cycles, {raced} with a fill of A in flight at detach");
    assert!(
        raced * 10 >= cycles * 9,
        "only {raced} of {cycles} cycles raced a fill of A against its detach"
    );
}

/// A psync that looked its attachment up before a detach must not take the
/// dirty pages of the attachment that reuses the offset after it.
#[test]
fn psync_of_a_detached_attachment_never_takes_the_next_ones_pages() {
    let pager = Pager::new(4 * PAGE_U64, 1).unwrap();
    let src = || {
        Arc::new(Pattern {
            writable: true,
            bad_page: None,
        })
    };
    let (a, a_stats) = pager.attach(src(), 4).unwrap();
    pager.detach(a).unwrap();
    let (b, b_stats) = pager.attach(src(), 4).unwrap();
    assert_eq!(a, b, "B reuses A's offset");
    // SAFETY: a write into B's attached, writable slice.
    unsafe { std::ptr::write_volatile((pager.host_addr() + b + 8) as *mut u64, 7) };
    let mut handed = 0;
    let r = pager.collect_dirty_of(a, &a_stats, |pages| {
        handed += pages.len();
        Ok::<_, ()>(())
    });
    assert!(matches!(r, Err(PagerError::NoSlice(_))), "A's psync fails");
    assert_eq!(handed, 0, "and hands none of B's pages over");
    let got = pager
        .collect_dirty_of(b, &b_stats, |pages| {
            assert_eq!(pages[0].0, 0);
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(got, 1, "B's own psync still finds its page");
}
