//! How the pager uses its fault threads: a fill that waits hands the watch over, and a
//! spinning fault thread fills predicted pages.

use super::*;
use std::sync::atomic::AtomicBool;

/// The fill of page `waiter` waits (up to 1 s, then it records the timeout) until page
/// `awaited` has been filled, as a fill through slow media holds its thread; `waits` says
/// whether the source admits it.
struct WaitsFor {
    waiter: u64,
    awaited: u64,
    waits: bool,
    awaited_filled: AtomicBool,
    timed_out: AtomicBool,
}

impl WaitsFor {
    fn new(waiter: u64, awaited: u64, waits: bool) -> Arc<Self> {
        Arc::new(WaitsFor {
            waiter,
            awaited,
            waits,
            awaited_filled: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
        })
    }
}

impl PageSource for WaitsFor {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        if page == self.waiter {
            let t = Instant::now();
            while !self.awaited_filled.load(Ordering::SeqCst) {
                if t.elapsed() > std::time::Duration::from_secs(1) {
                    self.timed_out.store(true, Ordering::SeqCst);
                    break;
                }
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        out.fill(page as u8);
        out[..8].copy_from_slice(&page.to_le_bytes());
        if page == self.awaited {
            self.awaited_filled.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
    fn writable(&self) -> bool {
        false
    }
    fn fill_waits(&self) -> bool {
        self.waits
    }
}

#[test]
fn a_fill_that_waits_on_media_does_not_hold_up_other_faults() {
    for waits in [true, false] {
        let pager = Pager::new(16 * PAGE_U64, 2).unwrap();
        let src = WaitsFor::new(0, 1, waits);
        let (off, _) = pager.attach(src.clone(), 2).unwrap();
        let base = pager.host_addr() + off;
        std::thread::scope(|s| {
            let first = s.spawn(|| read_u64(base));
            // Page 0's fill is under way before page 1 is touched.
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert_eq!(read_u64(base + PAGE_U64), 1);
            assert_eq!(first.join().unwrap(), 0);
        });
        // Without the hand-off the second fault queues behind the first fill, which
        // waits for it: only the timeout ends that.
        assert_eq!(
            src.timed_out.load(Ordering::SeqCst),
            !waits,
            "waits {waits}"
        );
        pager.detach(off).unwrap();
    }
}

/// A fault thread spinning between faults fills predicted pages itself, so predictions are
/// not held up behind one busy prefetch worker (on two CPUs the spinner used to take the
/// worker's CPU and leave it far behind a walk).
#[test]
fn a_spinning_fault_thread_fills_predictions_the_worker_has_not_reached() {
    let pager = Pager::new(16 * PAGE_U64, 1).unwrap();
    let src = WaitsFor::new(1, 2, false);
    let (off, _) = pager.attach(src.clone(), 8).unwrap();
    pager
        .set_predictor(
            off,
            Some(pmo_policies::predictor_from_name("stream:2").unwrap()),
        )
        .unwrap();
    let base = pager.host_addr() + off;
    // The fault on page 0 predicts pages 1 and 2: whoever takes page 1 waits for page 2,
    // which only another thread can fill. Faults on pages 4-7 follow, each followed by a spin
    // of the fault thread, so a spin cut short by a loaded machine is not the end of it.
    assert_eq!(read_u64(base), 0);
    for p in 4..8 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(read_u64(base + p * PAGE_U64), p);
    }
    let t = Instant::now();
    while pager.prefetch_backlog() > 0 && t.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(pager.prefetch_backlog(), 0);
    assert!(
        !src.timed_out.load(Ordering::SeqCst),
        "page 2 was filled only after page 1 gave up"
    );
    assert_eq!(read_u64(base + PAGE_U64), 1);
    assert_eq!(read_u64(base + 2 * PAGE_U64), 2);
    pager.detach(off).unwrap();
}
