//! Pager tests: host threads touch the window exactly as a vCPU would, and
//! the real userfaultfd delivers the faults.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod detach_races;
mod fault_threads;
mod runs;
use std::time::Instant;

/// Page `p` holds bytes `p as u8` with its index in the first 8 bytes.
struct Pattern {
    writable: bool,
    bad_page: Option<u64>,
}

impl PageSource for Pattern {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        if Some(page) == self.bad_page {
            return Err(FillError::Integrity(page));
        }
        out.fill(page as u8);
        out[..8].copy_from_slice(&page.to_le_bytes());
        Ok(())
    }
    fn writable(&self) -> bool {
        self.writable
    }
}

fn read_u64(addr: u64) -> u64 {
    // SAFETY: test reads of window pages that are attached (and thus served).
    unsafe { std::ptr::read_volatile(addr as *const u64) }
}

#[test]
fn first_touch_installs_verified_plaintext() {
    let pager = Pager::new(64 * PAGE_U64, 2).unwrap();
    let (off, stats) = pager
        .attach(
            Arc::new(Pattern {
                writable: false,
                bad_page: None,
            }),
            16,
        )
        .unwrap();
    let base = pager.host_addr() + off;
    // Two host threads touch interleaved pages, like two vCPUs.
    std::thread::scope(|s| {
        for t in 0..2u64 {
            s.spawn(move || {
                for p in (t..16).step_by(2) {
                    assert_eq!(read_u64(base + p * PAGE_U64), p);
                }
            });
        }
    });
    assert_eq!(stats.faults.load(Ordering::Relaxed), 16);
    assert_eq!(stats.pages_decrypted.load(Ordering::Relaxed), 16);
    // Touching again costs nothing.
    assert_eq!(read_u64(base + 5 * PAGE_U64), 5);
    assert_eq!(stats.faults.load(Ordering::Relaxed), 16);
    let hist: u64 = stats
        .fault_hist
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .sum();
    assert_eq!(hist, 16);
}

#[test]
fn writes_are_tracked_per_psync() {
    let pager = Pager::new(32 * PAGE_U64, 1).unwrap();
    let (off, _) = pager
        .attach(
            Arc::new(Pattern {
                writable: true,
                bad_page: None,
            }),
            8,
        )
        .unwrap();
    let base = pager.host_addr() + off;
    // Read page 1 (installed write-protected), then write pages 1 and 6 (6 faults as a write).
    assert_eq!(read_u64(base + PAGE_U64), 1);
    // SAFETY: writes into attached, writable window pages.
    unsafe {
        std::ptr::write_volatile((base + PAGE_U64 + 8) as *mut u64, 0xdead);
        std::ptr::write_volatile((base + 6 * PAGE_U64 + 8) as *mut u64, 0xbeef);
    }
    assert_eq!(read_u64(base + 2 * PAGE_U64), 2);
    let got = pager
        .collect_dirty::<()>(off, |pages| {
            let idx: Vec<u64> = pages.iter().map(|(p, _)| *p).collect();
            assert_eq!(idx, vec![1, 6]);
            assert_eq!(
                u64::from_le_bytes(pages[0].1[8..16].try_into().unwrap()),
                0xdead
            );
            assert_eq!(
                u64::from_le_bytes(pages[1].1[8..16].try_into().unwrap()),
                0xbeef
            );
            Ok(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(got, 2);
    // Nothing new was written: the next psync has nothing to do.
    assert_eq!(
        pager.collect_dirty::<()>(off, |_| Ok(())).unwrap().unwrap(),
        0
    );
    // Pages are protected again after psync: a new write is seen.
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile((base + 6 * PAGE_U64) as *mut u64, 1) };
    let again = pager
        .collect_dirty::<()>(off, |pages| {
            assert_eq!(pages.len(), 1);
            assert_eq!(pages[0].0, 6);
            Ok(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(again, 1);
    // A failed psync keeps the pages dirty.
    // SAFETY: as above.
    unsafe { std::ptr::write_volatile((base + 3 * PAGE_U64) as *mut u64, 1) };
    assert!(pager
        .collect_dirty(off, |_| Err("medium"))
        .unwrap()
        .is_err());
    assert_eq!(
        pager.collect_dirty::<()>(off, |_| Ok(())).unwrap().unwrap(),
        1
    );
}

#[test]
fn detach_drops_plaintext_and_reuses_the_slice() {
    let pager = Pager::new(8 * PAGE_U64, 1).unwrap();
    let src = Arc::new(Pattern {
        writable: false,
        bad_page: None,
    });
    let (a, _) = pager.attach(src.clone(), 8).unwrap();
    assert!(matches!(
        pager.attach(src.clone(), 1),
        Err(PagerError::WindowFull(1))
    ));
    let base = pager.host_addr() + a;
    assert_eq!(read_u64(base + 7 * PAGE_U64), 7);
    pager.detach(a).unwrap();
    // The page is gone; touching the free window yields zeros, never old plaintext.
    assert_eq!(read_u64(base + 7 * PAGE_U64), 0);
    // The zero page from that free-window touch must not stand in for plaintext.
    let (b, stats) = pager.attach(src, 8).unwrap();
    assert_eq!(a, b);
    assert_eq!(read_u64(base + 7 * PAGE_U64), 7);
    assert_eq!(stats.faults.load(Ordering::Relaxed), 1);
}

#[test]
fn failed_pages_are_never_installed() {
    let pager = Pager::new(8 * PAGE_U64, 1).unwrap();
    let (off, stats) = pager
        .attach(
            Arc::new(Pattern {
                writable: true,
                bad_page: Some(3),
            }),
            4,
        )
        .unwrap();
    // Serve the fault directly (a real thread touching it would get SIGSEGV
    // here; in a VM the vCPU gets EFAULT until the guest driver unmaps the page).
    let addr = pager.host_addr() + off + 3 * PAGE_U64;
    let mut buf = pager.scratch();
    *buf.page() = [0xaau8; PAGE];
    pager.handle(
        Fault {
            address: addr,
            write: false,
            wp: false,
            tid: 4242,
        },
        &mut buf,
        &mut uffd::Watch::outside_server(),
    );
    assert_eq!(stats.integrity_failures.load(Ordering::Relaxed), 1);
    assert_eq!(stats.pages_decrypted.load(Ordering::Relaxed), 0);
    assert_eq!(pager.poisoned_pages(off).unwrap(), vec![3]);
    assert_eq!(pager.refused_pages(), 1);
    // A second fault on it (the vCPU retrying) refuses again, and counts once.
    pager.handle(
        Fault {
            address: addr,
            write: false,
            wp: false,
            tid: 7,
        },
        &mut buf,
        &mut uffd::Watch::outside_server(),
    );
    assert_eq!(pager.refused_pages(), 1);
    assert_eq!(stats.pages_decrypted.load(Ordering::Relaxed), 0);
    // The page is not resident: nothing was installed.
    let mut vec = [0u8; 1];
    // SAFETY: mincore on one page of our own mapping.
    let r = unsafe { libc::mincore(addr as *mut _, PAGE, vec.as_mut_ptr()) };
    assert_eq!(r, 0);
    assert_eq!(vec[0] & 1, 0);
    // Other pages are served normally.
    assert_eq!(read_u64(pager.host_addr() + off + 2 * PAGE_U64), 2);
    // When the guest cannot turn the access into SIGBUS, the page becomes zeros, never data.
    assert_eq!(pager.zero_refused(), 1);
    assert_eq!(pager.zero_refused(), 0);
    assert_eq!(read_u64(addr), 0);
    assert_eq!(
        stats.pages_decrypted.load(Ordering::Relaxed),
        1,
        "only page 2"
    );
    // Detach restores the slice for reuse.
    pager.detach(off).unwrap();
    assert_eq!(pager.refused_pages(), 0);
    assert_eq!(read_u64(addr), 0);
}

#[test]
fn dropping_the_pager_stops_its_threads() {
    let pager = Pager::new(4 * PAGE_U64, 3).unwrap();
    let weak = Arc::downgrade(&pager);
    drop(pager);
    // A thread that was just starting may hold it a moment longer (then it drops it itself).
    wait_for("the pager to be gone", || weak.upgrade().is_none());
}

/// Attaches `source` over `npages` with the predictor `spec`.
fn predicted(pager: &Pager, source: Pattern, npages: u64, spec: &str) -> (u64, Arc<SliceStats>) {
    let (off, stats) = pager.attach(Arc::new(source), npages).unwrap();
    let predictor = pmo_policies::predictor_from_name(spec).unwrap();
    pager.set_predictor(off, Some(predictor)).unwrap();
    (off, stats)
}

/// Waits (bounded) until `cond` holds; the test fails if it never does.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

#[test]
fn predicted_pages_are_installed_off_the_fault_path() {
    let pager = Pager::new(64 * PAGE_U64, 1).unwrap();
    // Next four pages after each fault, a stream buffer of depth 4.
    let (off, stats) = predicted(
        &pager,
        Pattern {
            writable: false,
            bad_page: Some(2),
        },
        32,
        "stream:4",
    );
    let base = pager.host_addr() + off;
    // Touch page 0: pages 1..=4 get predicted. Page 2 fails verification and
    // stays out; page 3, the middle of the batch, is held back as a trigger.
    assert_eq!(read_u64(base), 0);
    wait_for("pages 1 and 4 installed, 3 staged", || {
        stats.pages_prefetched.load(Ordering::Relaxed) == 2
            && stats.triggers.load(Ordering::Relaxed) == 1
    });
    for p in [1u64, 4] {
        assert_eq!(read_u64(base + p * PAGE_U64), p);
    }
    assert_eq!(
        stats.faults.load(Ordering::Relaxed),
        1,
        "prefetched pages did not fault"
    );
    let resident = |p: u64| {
        let mut vec = [0u8; 1];
        // SAFETY: mincore on one page of our own mapping.
        let r = unsafe { libc::mincore((base + p * PAGE_U64) as *mut _, PAGE, vec.as_mut_ptr()) };
        assert_eq!(r, 0);
        vec[0] & 1 == 1
    };
    assert!(
        !resident(2),
        "the page that failed verification was never installed"
    );
    assert!(!resident(3), "the trigger waits outside the window");
    assert_eq!(
        pager.refused_pages(),
        0,
        "a failed prediction refuses nothing by itself"
    );
    // The trigger faults, without decrypting again, and keeps the stream going.
    assert_eq!(read_u64(base + 3 * PAGE_U64), 3);
    assert_eq!(stats.faults.load(Ordering::Relaxed), 2);
    assert_eq!(stats.pages_decrypted.load(Ordering::Relaxed), 1);
    assert_eq!(stats.trigger_hits.load(Ordering::Relaxed), 1);
    wait_for("the next batch (5 and 7; 6 is its trigger)", || {
        stats.pages_prefetched.load(Ordering::Relaxed) == 4
            && stats.triggers.load(Ordering::Relaxed) == 2
    });
    // Every page ends up installed exactly once: by a fault, a prefetch or a trigger.
    walk_settled(&pager, base, 5..32u64);
    // Counters settle just after the wake-up: a fault and a prefetch racing
    // for one page both count it until the loser sees EEXIST.
    wait_for("each page counted once", || {
        stats.pages_decrypted.load(Ordering::Relaxed)
            + stats.pages_prefetched.load(Ordering::Relaxed)
            + stats.trigger_hits.load(Ordering::Relaxed)
            == 31
    });
    let sets = pager.page_sets(off).unwrap();
    let mut all: Vec<u64> = sets
        .demand
        .iter()
        .chain(&sets.prefetched)
        .copied()
        .collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all,
        (0..32).collect::<Vec<_>>(),
        "every page came one way or the other"
    );
    assert_eq!(sets.demand[0], 0);
    let est = stats.estimate();
    assert_eq!(est.accuracy, Some(1.0), "a scan uses every trigger");
    assert!(est.coverage.unwrap() > 0.8, "{est:?}");
    pager.detach(off).unwrap();
}

/// Touches `pages` in order from one host thread.
/// Reads each page of `pages` (each holds its own number); each touch waits until the prefetch worker has handled every prediction made
/// so far: the sequence of faults, stagings and expiries is then the same on a loaded machine
/// as on an idle one (without it, a slow worker stages fewer triggers in time).
fn walk_settled(pager: &Pager, base: u64, pages: impl Iterator<Item = u64>) {
    for p in pages {
        assert_eq!(read_u64(base + p * PAGE_U64), p);
        wait_for("the prefetch backlog to drain", || {
            pager.prefetch_backlog() == 0
        });
    }
}

#[test]
fn triggers_report_use_and_waste() {
    const N: u64 = 4096;
    let source = || Pattern {
        writable: false,
        bad_page: None,
    };
    let pager = Pager::new(2 * N * PAGE_U64, 2).unwrap();
    // A sequential scan with stream:8 faults only at the start, on late
    // pages and on triggers, and every trigger is used.
    let (off, stats) = predicted(&pager, source(), N, "stream:8");
    walk_settled(&pager, pager.host_addr() + off, 0..N);
    assert_eq!(stats.demand_unpredicted.load(Ordering::Relaxed), 1);
    assert_eq!(stats.trigger_wasted.load(Ordering::Relaxed), 0);
    let est = stats.estimate();
    assert!(est.coverage.unwrap() > 0.99, "{est:?}");
    pager.detach(off).unwrap();
    // Random touches: the stream's triggers expire untouched.
    let (off, stats) = predicted(&pager, source(), N, "stream:4");
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let random: Vec<u64> = (0..1500)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % N
        })
        .collect();
    walk_settled(&pager, pager.host_addr() + off, random.iter().copied());
    let wasted = stats.trigger_wasted.load(Ordering::Relaxed);
    assert!(wasted > 500, "only {wasted} triggers reported wasted");
    assert!(
        stats.estimate().accuracy.unwrap() < 0.2,
        "{:?}",
        stats.estimate()
    );
    let stream_issued = pager.page_sets(off).unwrap().prefetched.len();
    pager.detach(off).unwrap();
    // The adaptive predictor hears of that waste and stops predicting.
    let (off, _) = predicted(&pager, source(), N, "adaptive");
    walk_settled(&pager, pager.host_addr() + off, random.iter().copied());
    let adaptive_issued = pager.page_sets(off).unwrap().prefetched.len();
    assert!(
        adaptive_issued * 4 < stream_issued,
        "adaptive issued {adaptive_issued} pages, stream:4 {stream_issued}"
    );
    pager.detach(off).unwrap();
}

#[test]
fn pages_predicted_from_a_write_are_installed_dirty() {
    let pager = Pager::new(64 * PAGE_U64, 1).unwrap();
    let (off, stats) = predicted(
        &pager,
        Pattern {
            writable: true,
            bad_page: None,
        },
        32,
        "stream:4",
    );
    let base = pager.host_addr() + off;
    let write = |p: u64| {
        // SAFETY: test write to an attached, writable page of the window.
        unsafe { std::ptr::write_volatile((base + p * PAGE_U64 + 8) as *mut u8, 0xee) }
    };
    // A write fault on page 0: pages 1, 2 and 4 arrive writable and dirty (3 is the trigger).
    write(0);
    wait_for("pages 1, 2, 4 prefetched", || {
        stats.pages_prefetched.load(Ordering::Relaxed) == 3
    });
    write(1);
    write(2);
    assert_eq!(
        stats.wp_faults.load(Ordering::Relaxed),
        0,
        "no write-protect fault"
    );
    let mut got = Vec::new();
    pager
        .collect_dirty(off, |pages| {
            got = pages.iter().map(|(p, _)| *p).collect();
            Ok::<_, ()>(())
        })
        .unwrap()
        .unwrap();
    // Page 4 was installed dirty too, but nothing changed it: psync leaves it out.
    assert_eq!(got, [0, 1, 2], "the dirty set");
    assert_eq!(stats.psync_unchanged.load(Ordering::Relaxed), 1);
    // A read fault further on: its predictions are write-protected as before.
    assert_eq!(read_u64(base + 16 * PAGE_U64), 16);
    wait_for("pages 17, 18, 20 prefetched", || {
        stats.pages_prefetched.load(Ordering::Relaxed) == 6
    });
    write(17);
    assert_eq!(stats.wp_faults.load(Ordering::Relaxed), 1);
    pager.detach(off).unwrap();
}

/// A pipe through which a thread reads and writes window pages with the
/// kernel's user copies (`write(2)` from the page, `read(2)` into it), the
/// way KVM reaches guest memory: a refused (inaccessible) page is an
/// `EFAULT`, never a signal that would kill the test.
struct KernelCopy {
    r: std::os::fd::OwnedFd,
    w: std::os::fd::OwnedFd,
}

impl KernelCopy {
    fn new() -> Self {
        use std::os::fd::FromRawFd;
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills two fds on success.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh fds owned by nobody else.
        unsafe {
            KernelCopy {
                r: std::os::fd::OwnedFd::from_raw_fd(fds[0]),
                w: std::os::fd::OwnedFd::from_raw_fd(fds[1]),
            }
        }
    }

    /// Copies `out.len()` bytes from `addr` (window memory) into `out`; Err(errno).
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), i32> {
        use std::os::fd::AsRawFd;
        // SAFETY: the kernel reads `out.len()` bytes at `addr` and reports a bad address as EFAULT.
        let n = unsafe { libc::write(self.w.as_raw_fd(), addr as *const _, out.len()) };
        if n < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let n = n as usize;
        // SAFETY: reads back what was just written into our own buffer.
        let m = unsafe { libc::read(self.r.as_raw_fd(), out.as_mut_ptr().cast(), n) };
        assert_eq!(m, n as isize, "pipe read back");
        if n == out.len() {
            Ok(())
        } else {
            Err(libc::EFAULT)
        }
    }

    /// Copies `data` to `addr` (window memory); Err(errno).
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), i32> {
        use std::os::fd::AsRawFd;
        // SAFETY: our own buffer into our own pipe (far below its capacity).
        let n = unsafe { libc::write(self.w.as_raw_fd(), data.as_ptr().cast(), data.len()) };
        assert_eq!(n, data.len() as isize, "pipe write");
        // SAFETY: the kernel writes at most `data.len()` bytes at `addr` and
        // reports a bad address as EFAULT.
        let m = unsafe { libc::read(self.r.as_raw_fd(), addr as *mut _, data.len()) };
        if m == data.len() as isize {
            return Ok(());
        }
        let err = if m < 0 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            libc::EFAULT
        };
        // Drain what the failed copy left in the pipe.
        let left = data.len() - m.max(0) as usize;
        let mut sink = vec![0u8; left];
        // SAFETY: reads into our own buffer.
        let k = unsafe { libc::read(self.r.as_raw_fd(), sink.as_mut_ptr().cast(), left) };
        assert_eq!(k, left as isize, "pipe drain");
        Err(err)
    }
}

/// A [`Pattern`] that records what the pager reports about failed pages.
struct Reporting {
    inner: Pattern,
    failed: Mutex<Vec<(u64, Detected)>>,
}

impl PageSource for Reporting {
    fn fill(&self, page: u64, out: &mut [u8; PAGE]) -> Result<(), FillError> {
        self.inner.fill(page, out)
    }
    fn writable(&self) -> bool {
        self.inner.writable
    }
    fn page_failed(&self, page: u64, _error: &FillError, how: Detected) {
        self.failed.lock().unwrap().push((page, how));
    }
}

fn reporting(bad_page: u64) -> Arc<Reporting> {
    Arc::new(Reporting {
        inner: Pattern {
            writable: true,
            bad_page: Some(bad_page),
        },
        failed: Mutex::new(Vec::new()),
    })
}

/// Every failed page is reported to the attachment's owner (refused to an
/// access, or found bad ahead by a prefetch), and a refused page never
/// reaches psync: not when the refused access was a write, not after it is
/// served as zeros (which a kernel write into it may then fill).
#[test]
fn failed_pages_are_reported_and_never_psynced() {
    let pager = Pager::new(64 * PAGE_U64, 1).unwrap();
    let src = reporting(3);
    let (off, stats) = pager.attach(src.clone(), 8).unwrap();
    let base = pager.host_addr() + off;
    let mut buf = pager.scratch();
    // A write fault on the bad page (a vCPU's store): refused, reported once.
    for tid in [1, 2] {
        pager.handle(
            Fault {
                address: base + 3 * PAGE_U64,
                write: true,
                wp: false,
                tid,
            },
            &mut buf,
            &mut uffd::Watch::outside_server(),
        );
    }
    assert_eq!(*src.failed.lock().unwrap(), [(3, Detected::OnAccess)]);
    assert_eq!(
        stats.integrity_failures.load(Ordering::Relaxed),
        2,
        "each failed fill counts"
    );
    // SAFETY: a write into an attached, writable, good page.
    unsafe { std::ptr::write_volatile((base + PAGE_U64 + 8) as *mut u64, 9) };
    let dirty = |pager: &Pager| {
        let mut got = Vec::new();
        pager
            .collect_dirty(off, |pages| {
                got = pages.iter().map(|(p, _)| *p).collect();
                Ok::<_, ()>(())
            })
            .unwrap()
            .unwrap();
        got
    };
    assert_eq!(dirty(&pager), [1], "the refused write left page 3 clean");
    // Served as zeros, the page takes a write (a guest kernel's copy into it
    // completes) but still never reaches psync.
    assert_eq!(pager.zero_refused(), 1);
    let kc = KernelCopy::new();
    kc.write(base + 3 * PAGE_U64 + 8, &[1, 2, 3]).unwrap();
    let mut got = [0u8; 3];
    kc.read(base + 3 * PAGE_U64 + 8, &mut got).unwrap();
    assert_eq!(got, [1, 2, 3]);
    pager.window.slice_at(off).unwrap().mark_dirty(3);
    assert_eq!(dirty(&pager), Vec::<u64>::new());
    assert_eq!(src.failed.lock().unwrap().len(), 1, "no further reports");
    pager.detach(off).unwrap();
    assert_eq!(pager.refused_pages(), 0);

    // A prefetch finding a bad page reports it ahead, once, and refuses nothing.
    let src = reporting(2);
    let (off, stats) = pager.attach(src.clone(), 32).unwrap();
    let predictor = pmo_policies::predictor_from_name("stream:4").unwrap();
    pager.set_predictor(off, Some(predictor)).unwrap();
    assert_eq!(read_u64(pager.host_addr() + off), 0);
    wait_for("page 2 reported", || !src.failed.lock().unwrap().is_empty());
    assert_eq!(*src.failed.lock().unwrap(), [(2, Detected::Ahead)]);
    assert_eq!(stats.integrity_failures.load(Ordering::Relaxed), 1);
    assert_eq!(pager.refused_pages(), 0);
    // Page 1 was predicted with it; predicting page 2 again (a fault on 1
    // would) does not refill or re-report it.
    assert_eq!(read_u64(pager.host_addr() + off + PAGE_U64), 1);
    assert_eq!(read_u64(pager.host_addr() + off + 4 * PAGE_U64), 4);
    assert_eq!(src.failed.lock().unwrap().len(), 1);
    pager.detach(off).unwrap();
}
