//! The one fault server: threads that wait on a userfaultfd and hand each fault to a pager.
//!
//! Every user (the PMO window's pager, the CXL expander's device cache) has the same needs: a
//! few threads; after a fault, a short spin on the non-blocking fd before sleeping again,
//! because a guest walking memory faults again within microseconds and catching that fault
//! without a wake-up saves a context switch per page; and a clean stop that never joins the
//! thread it runs on.
//!
//! One watcher at a time: the threads share one epoll set in which the userfaultfd is armed
//! one-shot. A fault wakes one sleeping thread and disarms the fd; that thread serves faults
//! and spins, and re-arms the fd only when its spin ends. So while a thread spins no other
//! thread is woken for the faults it catches anyway. (With an `EPOLLEXCLUSIVE` set per
//! thread, as before, every fault also woke a sleeping thread that found nothing to do; on a
//! two-CPU host that wake-up took the faulting thread's CPU and cost 1.7x a lone spinning
//! handler per fault, `benches/fault.rs`.) A handler about to wait (media latency, a lock held
//! long) calls [`Watch::hand_off`] so another thread serves faults meanwhile.
//!
//! Invariant: the fd is armed, or some thread is inside a burst (between its wake-up and its
//! re-arm). Only a thread inside a burst disarms it, and every burst ends with a re-arm, which
//! epoll checks against the fd's readiness, so no fault waits unwatched.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, Weak};

use locked::Locked;
use std::time::{Duration, Instant};
use threads::{JoinHandle, ThreadKind};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::{Fault, Uffd};

/// How long a fault thread keeps polling for the next fault before it sleeps.
pub const SPIN_AFTER_FAULT: Duration = Duration::from_micros(20);

/// A pager: what the fault threads call for each fault.
pub trait FaultHandler: Send + Sync + 'static {
    /// Per-thread working memory (page buffers), made once when a thread starts.
    type Scratch: Send;

    /// A fresh scratch for one thread.
    fn scratch(&self) -> Self::Scratch;

    /// Serves one fault: installs the page, or wakes the faulting thread, or makes the access
    /// fail. Must not block on another fault of the same userfaultfd. Before a long wait it
    /// calls [`Watch::hand_off`], or faults from other threads wait for it.
    fn handle(&self, fault: Fault, scratch: &mut Self::Scratch, watch: &mut Watch<'_>);

    /// Called while the thread spins between faults: does one short piece of background
    /// work (a pager fills a predicted page) and returns true, or returns false when there
    /// is none. A fault that arrives meanwhile waits for that piece, so keep it to about one
    /// fault's work, and hand the watch over before a longer wait.
    fn idle(&self, _scratch: &mut Self::Scratch, _watch: &mut Watch<'_>) -> bool {
        false
    }
}

/// The fault threads of one userfaultfd. Dropping it (or [`FaultServer::stop`]) stops and
/// joins them.
pub struct FaultServer {
    stop: EventFd,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl FaultServer {
    /// A server with no threads yet. Two steps, because the handler usually owns the server
    /// and must be in its `Arc` before threads can hold it.
    pub fn new() -> io::Result<Self> {
        Ok(FaultServer {
            stop: EventFd::new(libc::EFD_NONBLOCK)?,
            threads: Mutex::new(Vec::new()),
        })
    }

    /// Starts `threads` (at least one) threads of `kind` named `{name}{i}` serving `uffd` for
    /// `handler`. They hold the handler weakly, so dropping its last owner ends them.
    pub fn start<H: FaultHandler>(
        &self,
        kind: ThreadKind,
        name: &str,
        uffd: &Arc<Uffd>,
        handler: Weak<H>,
        threads: usize,
    ) -> io::Result<()> {
        let watcher = Arc::new(Watcher::new(uffd, &self.stop)?);
        for i in 0..threads.max(1) {
            let uffd = Arc::clone(uffd);
            let handler = handler.clone();
            let watcher = Arc::clone(&watcher);
            let t = threads::spawn(kind, format!("{name}{i}"), move || {
                serve(&handler, &uffd, &watcher)
            })?;
            self.threads.locked().push(t);
        }
        Ok(())
    }

    /// Stops the threads and joins them, except the calling thread if it is one of them (the
    /// last owner of a handler may be a fault thread that upgraded it).
    pub fn stop(&self) {
        if let Err(e) = self.stop.write(1) {
            log::error!("fault server: signal stop: {e}");
        }
        let threads = std::mem::take(&mut *self.threads.locked());
        let me = std::thread::current().id();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The epoll set the threads of one [`FaultServer::start`] share.
struct Watcher {
    epoll: Epoll,
    uffd: RawFd,
    /// Our own handle on the server's stop eventfd: closing a file takes it out of every
    /// epoll set, so the registration must live as long as the threads, which may outlive
    /// the server (the last owner of a handler can be one of its fault threads).
    _stop: EventFd,
}

const FAULT: u64 = 0;
const STOP: u64 = 1;

impl Watcher {
    fn new(uffd: &Uffd, stop: &EventFd) -> io::Result<Self> {
        let stop = stop.try_clone()?;
        let epoll = Epoll::new()?;
        epoll.ctl(
            ControlOperation::Add,
            uffd.as_raw_fd(),
            EpollEvent::new(EventSet::IN | EventSet::ONE_SHOT, FAULT),
        )?;
        // Level-triggered and never read: once signalled, every thread sees it.
        epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP),
        )?;
        Ok(Watcher {
            epoll,
            uffd: uffd.as_raw_fd(),
            _stop: stop,
        })
    }

    /// Arms (or disarms) the userfaultfd for the next sleeping thread.
    fn arm(&self, armed: bool) {
        let events = if armed {
            EventSet::IN | EventSet::ONE_SHOT
        } else {
            EventSet::ONE_SHOT
        };
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Modify,
            self.uffd,
            EpollEvent::new(events, FAULT),
        ) {
            log::error!("fault thread: arm userfaultfd: {e}");
        }
    }
}

/// What a handler holds while it serves a fault: lets it hand the watch over before it waits.
pub struct Watch<'a> {
    watcher: Option<&'a Watcher>,
    handed_off: bool,
}

impl Watch<'_> {
    /// A watch for calling a handler outside the fault threads (tests, a handler replaying
    /// a fault itself): there is no other thread to hand over to.
    pub fn outside_server() -> Self {
        Watch {
            watcher: None,
            handed_off: false,
        }
    }

    /// Lets another thread serve faults while this one waits (on media, on a lock held
    /// long). Costs one system call; call it only before a wait that is longer than a
    /// thread's wake-up (a few microseconds). Idempotent within one fault.
    pub fn hand_off(&mut self) {
        if let (false, Some(w)) = (self.handed_off, self.watcher) {
            self.handed_off = true;
            w.arm(true);
        }
    }
}

/// Runs `work` on the handler with a fresh watch and takes the watch back afterwards if the
/// work handed it over (unless another thread is serving already; if one is, it re-arms when
/// its burst ends). `None` when the handler is gone; the fd is re-armed for whoever is left.
fn run_watched<H: FaultHandler, R>(
    handler: &Weak<H>,
    watcher: &Watcher,
    work: impl FnOnce(&H, &mut Watch<'_>) -> R,
) -> Option<R> {
    let Some(h) = handler.upgrade() else {
        watcher.arm(true);
        return None;
    };
    let mut watch = Watch {
        watcher: Some(watcher),
        handed_off: false,
    };
    let r = work(&h, &mut watch);
    if watch.handed_off {
        watcher.arm(false);
    }
    Some(r)
}

/// One fault thread: sleep in epoll until the fd is armed and readable or the stop signal,
/// then serve faults, spinning for [`SPIN_AFTER_FAULT`] after each, and re-arm before
/// sleeping again.
fn serve<H: FaultHandler>(handler: &Weak<H>, uffd: &Uffd, watcher: &Watcher) {
    let Some(mut scratch) = handler.upgrade().map(|h| h.scratch()) else {
        return;
    };
    let mut events = [EpollEvent::default(); 2];
    loop {
        let n = match watcher.epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("fault thread: wait: {e}");
                return;
            }
        };
        if events[..n].iter().any(|e| e.data() == STOP) {
            return;
        }
        if events[..n].iter().all(|e| e.data() != FAULT) {
            continue;
        }
        let mut idle_since = Instant::now();
        loop {
            match uffd.read_fault() {
                Ok(Some(f)) => {
                    if run_watched(handler, watcher, |h, w| h.handle(f, &mut scratch, w)).is_none()
                    {
                        return;
                    }
                    idle_since = Instant::now();
                }
                Ok(None) if idle_since.elapsed() < SPIN_AFTER_FAULT => {
                    match run_watched(handler, watcher, |h, w| h.idle(&mut scratch, w)) {
                        None => return,
                        // Busy, not idle: keep watching as after a fault.
                        Some(true) => idle_since = Instant::now(),
                        Some(false) => std::hint::spin_loop(),
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log::error!("fault thread: read userfaultfd: {e}");
                    break;
                }
            }
        }
        watcher.arm(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AnonMap, Install, PAGE_SIZE};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// Fills every page with its index and counts what it installed, and the faults it found
    /// answered already (two threads touching a page at once fault twice).
    struct Numbered {
        uffd: Arc<Uffd>,
        map: AnonMap,
        served: AtomicU64,
        already: AtomicU64,
        /// Page 0's fault waits until page 1 is installed (at most 1 s, then it records the
        /// timeout), handing the watch over first if `hand_off` is set.
        hold_first: AtomicBool,
        hand_off: AtomicBool,
        timed_out: AtomicBool,
        /// The next idle call sleeps 100 ms (holding the handler) and reports no work.
        idle_hold: AtomicBool,
        server: FaultServer,
    }

    impl FaultHandler for Numbered {
        type Scratch = Box<[u8; PAGE_SIZE as usize]>;

        fn scratch(&self) -> Self::Scratch {
            Box::new([0; PAGE_SIZE as usize])
        }

        fn handle(&self, f: Fault, buf: &mut Self::Scratch, watch: &mut Watch<'_>) {
            let page = (f.address - self.map.addr()) / PAGE_SIZE;
            if page == 0 && self.hold_first.load(Ordering::SeqCst) {
                if self.hand_off.load(Ordering::SeqCst) {
                    watch.hand_off();
                }
                let t = Instant::now();
                while self.served.load(Ordering::SeqCst) == 0 {
                    if t.elapsed() > Duration::from_secs(1) {
                        self.timed_out.store(true, Ordering::SeqCst);
                        break;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            buf.fill(page as u8 ^ 0x5a);
            match self.uffd.install(f.address, &buf[..], false) {
                Ok(Install::Done) => self.served.fetch_add(1, Ordering::Relaxed),
                Ok(Install::AlreadyThere) => self.already.fetch_add(1, Ordering::Relaxed),
                Err(e) => panic!("install: {e}"),
            };
        }

        fn idle(&self, _buf: &mut Self::Scratch, _watch: &mut Watch<'_>) -> bool {
            if self.idle_hold.swap(false, Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
            }
            false
        }
    }

    fn numbered(name: &str, pages: u64, threads: usize) -> Arc<Numbered> {
        let map = AnonMap::new((pages * PAGE_SIZE) as usize).unwrap();
        let uffd = Arc::new(Uffd::new().unwrap());
        uffd.register(map.addr(), pages * PAGE_SIZE).unwrap();
        let h = Arc::new(Numbered {
            uffd,
            map,
            served: AtomicU64::new(0),
            already: AtomicU64::new(0),
            hold_first: AtomicBool::new(false),
            hand_off: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
            idle_hold: AtomicBool::new(false),
            server: FaultServer::new().unwrap(),
        });
        h.server
            .start(
                ThreadKind::PmoFault,
                name,
                &h.uffd,
                Arc::downgrade(&h),
                threads,
            )
            .unwrap();
        h
    }

    #[test]
    fn host_threads_touching_the_window_get_every_page_installed_once() {
        const PAGES: u64 = 256;
        let h = numbered("uffd-touch", PAGES, 2);
        let base = h.map.addr();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                s.spawn(move || {
                    for p in (0..PAGES).map(|i| (i * 7 + t * 13) % PAGES) {
                        let addr = (base + p * PAGE_SIZE + t) as *const u8;
                        // SAFETY: inside the registered mapping, which `h` keeps alive; the
                        // fault server installs the page before the read completes.
                        let v = unsafe { addr.read_volatile() };
                        assert_eq!(v, p as u8 ^ 0x5a);
                    }
                });
            }
        });
        // Every read above saw its page's bytes. The install wakes the reader before the
        // handler counts it, so the counts may trail the reads by a moment.
        let answers = || h.served.load(Ordering::Relaxed) + h.already.load(Ordering::Relaxed);
        let t = Instant::now();
        while answers() < PAGES && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (served, already) = (
            h.served.load(Ordering::Relaxed),
            h.already.load(Ordering::Relaxed),
        );
        // No page went in twice; a racing fault on a present page counts as answered.
        assert!(served <= PAGES, "{served} installs for {PAGES} pages");
        assert!(
            served + already >= PAGES,
            "{served} + {already} answers for {PAGES} pages"
        );
    }

    /// Reads one byte of `page`, faulting it in.
    fn touch(h: &Numbered, page: u64) -> u8 {
        let addr = (h.map.addr() + page * PAGE_SIZE) as *const u8;
        // SAFETY: inside the registered mapping, which `h` keeps alive; the fault server
        // installs the page before the read completes.
        unsafe { addr.read_volatile() }
    }

    /// Times the threads whose names start with `prefix` went to sleep (voluntary context
    /// switches): a fault thread's wake-ups.
    fn sleeps_of(prefix: &str) -> u64 {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| {
                let dir = t.ok()?.path();
                let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
                if !comm.starts_with(prefix) {
                    return None;
                }
                let status = std::fs::read_to_string(dir.join("status")).ok()?;
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .sum()
    }

    #[test]
    fn a_walk_wakes_a_thread_once_per_burst_not_once_per_fault() {
        const PAGES: u64 = 512;
        let h = numbered("uffd-burst", PAGES, 3);
        // Let the threads start and go to sleep.
        std::thread::sleep(Duration::from_millis(50));
        let before = sleeps_of("uffd-burst");
        for p in 0..PAGES {
            assert_eq!(touch(&h, p), p as u8 ^ 0x5a);
        }
        // The thread that woke for the first fault catches the next ones in its spin. With
        // the userfaultfd armed in every idle thread's epoll set (as before), each fault
        // also woke an idle thread, which found nothing and slept again: about PAGES sleeps.
        // Preemption may end a spin now and then.
        let sleeps = sleeps_of("uffd-burst") - before;
        assert!(sleeps < PAGES / 4, "{sleeps} sleeps for {PAGES} faults");
        // Faults after quiet gaps (each spin ended and re-armed the fd) are served too.
        let gaps = numbered("uffd-gaps", 4, 2);
        for p in 0..4 {
            std::thread::sleep(SPIN_AFTER_FAULT * 50);
            assert_eq!(touch(&gaps, p), p as u8 ^ 0x5a);
        }
    }

    #[test]
    fn a_handler_that_hands_off_lets_another_thread_serve_meanwhile() {
        for hand_off in [true, false] {
            let h = numbered("uffd-handoff", 2, 2);
            h.hold_first.store(true, Ordering::SeqCst);
            h.hand_off.store(hand_off, Ordering::SeqCst);
            std::thread::scope(|s| {
                let first = s.spawn(|| touch(&h, 0));
                // Page 0's fault is being held before page 1 is touched.
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(200) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(touch(&h, 1), 1 ^ 0x5a);
                assert_eq!(first.join().unwrap(), 0x5a);
            });
            // Without the hand-off, page 1 waits behind page 0's handler, which waits
            // for page 1: only the timeout ends it.
            assert_eq!(
                h.timed_out.load(Ordering::SeqCst),
                !hand_off,
                "hand_off {hand_off}"
            );
        }
    }

    fn threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.starts_with(prefix))
            .count()
    }

    #[test]
    fn a_fault_thread_left_as_the_handlers_last_owner_still_ends() {
        let h = numbered("uffd-last", 4, 1);
        h.idle_hold.store(true, Ordering::SeqCst);
        // The fault starts the thread's burst; its first idle call holds the handler.
        assert_eq!(touch(&h, 0), 0x5a);
        std::thread::sleep(Duration::from_millis(30));
        drop(h);
        // The fault thread drops the handler, and with it the server, whose stop eventfd
        // its epoll set must still see: the idle call reported no work and its spin is
        // over, so it goes back to sleep in epoll.
        let t = Instant::now();
        while threads_named("uffd-last") > 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            threads_named("uffd-last"),
            0,
            "the fault thread never ended"
        );
    }

    #[test]
    fn dropping_the_handler_stops_and_joins_its_threads() {
        let h = numbered("uffd-stop", 4, 3);
        // A thread names itself when it starts running.
        let started = Instant::now();
        while threads_named("uffd-stop") < 3 && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(threads_named("uffd-stop"), 3);
        drop(h);
        // The drop joined them: they are gone, not just told to go.
        assert_eq!(threads_named("uffd-stop"), 0);
        // A stopped server can be stopped again.
        let s = FaultServer::new().unwrap();
        s.stop();
        s.stop();
    }
}
