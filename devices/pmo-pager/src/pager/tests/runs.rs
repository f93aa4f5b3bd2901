//! Prefetch runs: a fault on a page a run has in hand waits for the run instead of
//! decrypting the page again, and a run that installs nothing still lets its waiters go.

use super::*;
use std::sync::atomic::AtomicBool;

/// Pages hold their number (as `Pattern`); the fill of page `gate_at` waits until the gate
/// opens (at most 10 s), and every fill is counted per page.
struct Gated {
    gate_at: u64,
    open: AtomicBool,
    fills: Vec<AtomicU64>,
}

impl Gated {
    fn new(npages: u64, gate_at: u64) -> Arc<Self> {
        Arc::new(Gated {
            gate_at,
            open: AtomicBool::new(false),
            fills: (0..npages).map(|_| AtomicU64::new(0)).collect(),
        })
    }
    fn fills(&self, page: u64) -> u64 {
        self.fills[page as usize].load(Ordering::SeqCst)
    }
}

impl PageSource for Gated {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        if page == self.gate_at {
            let t = Instant::now();
            while !self.open.load(Ordering::SeqCst) && t.elapsed().as_secs() < 10 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        self.fills[page as usize].fetch_add(1, Ordering::SeqCst);
        out.fill(page as u8);
        out[..8].copy_from_slice(&page.to_le_bytes());
        Ok(())
    }
    fn writable(&self) -> bool {
        false
    }
}

/// Attaches `src` (64 pages) with `stream:16` and touches page 0: pages 1-8 and 10-16 go
/// out as two runs, page 9 is the trigger. The run of pages 1-8 stops at the gate (page 4).
fn run_in_flight(pager: &Pager, src: &Arc<Gated>) -> (u64, Arc<SliceStats>) {
    let (off, stats) = pager.attach(src.clone(), 64).unwrap();
    let predictor = pmo_policies::predictor_from_name("stream:16").unwrap();
    pager.set_predictor(off, Some(predictor)).unwrap();
    assert_eq!(read_u64(pager.host_addr() + off), 0);
    wait_for("the first run to reach the gate", || src.fills(3) == 1);
    (off, stats)
}

#[test]
fn a_fault_on_a_page_of_a_run_in_flight_waits_for_the_run_not_a_second_decryption() {
    let pager = Pager::new(128 * PAGE_U64, 2).unwrap();
    let src = Gated::new(64, 4);
    let (off, stats) = run_in_flight(&pager, &src);
    let base = pager.host_addr() + off;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let toucher = s.spawn(|| {
            let v = read_u64(base + 2 * PAGE_U64);
            done.store(true, Ordering::SeqCst);
            v
        });
        wait_for("the fault on page 2 to be left to the run", || {
            stats.prefetch_late.load(Ordering::Relaxed) == 1
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "page 2 is not installed before its run"
        );
        assert_eq!(
            src.fills(2),
            1,
            "the fault did not decrypt page 2 a second time"
        );
        src.open.store(true, Ordering::SeqCst);
        assert_eq!(toucher.join().unwrap(), 2);
    });
    assert_eq!(src.fills(2), 1);
    assert_eq!(
        stats.pages_decrypted.load(Ordering::Relaxed),
        1,
        "page 0 only"
    );
    walk_settled(&pager, base, 1..17);
    for p in 1..17 {
        assert_eq!(src.fills(p), 1, "page {p} filled once");
    }
    pager.detach(off).unwrap();
}

/// Detach lands while a run is still filling, with a vCPU waiting on one of its pages: the
/// run installs nothing (the slice is closing), and its release wakes the waiter, whose
/// retry finds free window space (zeros), never the page's data and never a hang.
#[test]
fn a_run_cut_off_by_detach_still_lets_its_waiters_go() {
    let pager = Pager::new(128 * PAGE_U64, 2).unwrap();
    let src = Gated::new(64, 4);
    let (off, stats) = run_in_flight(&pager, &src);
    let base = pager.host_addr() + off;
    // Not a scoped thread: if the release forgot the waiter, the test fails instead of
    // waiting on it forever.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(read_u64(base + 2 * PAGE_U64)));
    wait_for("the fault on page 2 to be left to the run", || {
        stats.prefetch_late.load(Ordering::Relaxed) == 1
    });
    pager.detach(off).unwrap();
    src.open.store(true, Ordering::SeqCst);
    let got = rx.recv_timeout(std::time::Duration::from_secs(10));
    assert_eq!(got, Ok(0), "zeros, not page 2, and no hang");
    wait_for("the run to end", || pager.prefetch_backlog() == 0);
}
