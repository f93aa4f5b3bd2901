//! The one fault server: threads that wait on a userfaultfd and hand each fault to a pager.
//!
//! Every user (the PMO window's pager, the CXL expander's device cache, and later the tiering
//! pager) has the same needs: a few threads, each in its own epoll set with the userfaultfd
//! added `EPOLLEXCLUSIVE` (so one fault wakes one thread, not all of them) beside a stop
//! eventfd; after a fault, a short spin on the non-blocking fd before sleeping again, because
//! a guest walking memory faults again within microseconds and catching that fault without a
//! wake-up saves a context switch per page; and a clean stop that never joins the thread it
//! runs on.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, Weak};

use locked::Locked;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// fail. Must not block on another fault of the same userfaultfd.
    fn handle(&self, fault: Fault, scratch: &mut Self::Scratch);
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

    /// Starts `threads` (at least one) threads named `{name}{i}` serving `uffd` for
    /// `handler`. They hold the handler weakly, so dropping its last owner ends them.
    pub fn start<H: FaultHandler>(
        &self,
        name: &str,
        uffd: &Arc<Uffd>,
        handler: Weak<H>,
        threads: usize,
    ) -> io::Result<()> {
        for i in 0..threads.max(1) {
            let uffd = Arc::clone(uffd);
            let stop = self.stop.try_clone()?;
            let handler = handler.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}{i}"))
                .spawn(move || serve(&handler, &uffd, &stop))?;
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

/// One fault thread: sleep in epoll until a fault or the stop signal, then serve faults,
/// spinning for [`SPIN_AFTER_FAULT`] after each before sleeping again.
fn serve<H: FaultHandler>(handler: &Weak<H>, uffd: &Uffd, stop: &EventFd) {
    const FAULT: u64 = 0;
    const STOP: u64 = 1;
    let setup = || -> io::Result<Epoll> {
        let ep = Epoll::new()?;
        ep.ctl(
            ControlOperation::Add,
            uffd.as_raw_fd(),
            EpollEvent::new(EventSet::IN | EventSet::EXCLUSIVE, FAULT),
        )?;
        ep.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP),
        )?;
        Ok(ep)
    };
    let epoll = match setup() {
        Ok(ep) => ep,
        Err(e) => {
            log::error!("fault thread: epoll: {e}");
            return;
        }
    };
    let Some(mut scratch) = handler.upgrade().map(|h| h.scratch()) else {
        return;
    };
    let mut events = [EpollEvent::default(); 2];
    loop {
        let n = match epoll.wait(-1, &mut events) {
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
        let mut idle_since = Instant::now();
        loop {
            match uffd.read_fault() {
                Ok(Some(f)) => {
                    match handler.upgrade() {
                        Some(h) => h.handle(f, &mut scratch),
                        None => return,
                    }
                    idle_since = Instant::now();
                }
                Ok(None) if idle_since.elapsed() < SPIN_AFTER_FAULT => std::hint::spin_loop(),
                Ok(None) => break,
                Err(e) => {
                    log::error!("fault thread: read userfaultfd: {e}");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AnonMap, Install, PAGE_SIZE};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Fills every page with its index and counts what it installed, and the faults it found
    /// answered already (two threads touching a page at once fault twice).
    struct Numbered {
        uffd: Arc<Uffd>,
        map: AnonMap,
        served: AtomicU64,
        already: AtomicU64,
        server: FaultServer,
    }

    impl FaultHandler for Numbered {
        type Scratch = Box<[u8; PAGE_SIZE as usize]>;

        fn scratch(&self) -> Self::Scratch {
            Box::new([0; PAGE_SIZE as usize])
        }

        fn handle(&self, f: Fault, buf: &mut Self::Scratch) {
            let page = (f.address - self.map.addr()) / PAGE_SIZE;
            buf.fill(page as u8 ^ 0x5a);
            match self.uffd.install(f.address, &buf[..], false) {
                Ok(Install::Done) => self.served.fetch_add(1, Ordering::Relaxed),
                Ok(Install::AlreadyThere) => self.already.fetch_add(1, Ordering::Relaxed),
                Err(e) => panic!("install: {e}"),
            };
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
            server: FaultServer::new().unwrap(),
        });
        h.server
            .start(name, &h.uffd, Arc::downgrade(&h), threads)
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

    #[test]
    fn dropping_the_handler_stops_and_joins_its_threads() {
        let threads_named = |prefix: &str| {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|comm| comm.starts_with(prefix))
                .count()
        };
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
