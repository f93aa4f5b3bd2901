//! Filebench's personalities on PMOs of the host: [`FbHost`], the `filebench::Backend` over a
//! [`PmoHost`], and the sizes of the cells.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use filebench::{Attachment, Backend, Config, Personality, Scale};
use pmo_host::{HostError, PmoHost};

/// The Filebench engine's PMO calls on a [`PmoHost`]. Outside the measured run (preparing the
/// prealloc'ed files, checking them afterwards) attaches go to a second host, `setup`, whose
/// sessions run design `d` without prediction; creates always go to `run`, so every file's PMO
/// has the cell's design. Errors reach the engine as bare errnos (EEXIST, ENOENT, EBUSY matter
/// to it).
pub struct FbHost<'a> {
    run: &'a PmoHost,
    setup: &'a PmoHost,
    measured: AtomicBool,
}

impl<'a> FbHost<'a> {
    /// Calls go to `setup` until [`FbHost::set_measured`].
    pub fn new(run: &'a PmoHost, setup: &'a PmoHost) -> Self {
        FbHost {
            run,
            setup,
            measured: AtomicBool::new(false),
        }
    }

    /// From now on calls go to the measured host (`true`) or the setup host; switch only while
    /// nothing is attached.
    pub fn set_measured(&self, on: bool) {
        self.measured.store(on, Ordering::SeqCst);
    }

    fn current(&self) -> &PmoHost {
        if self.measured.load(Ordering::SeqCst) {
            self.run
        } else {
            self.setup
        }
    }
}

fn errno(e: HostError) -> io::Error {
    e.into_raw_os_error()
}

// SAFETY: `attach` returns a slice of a `PmoHost`'s pager window: `len` bytes that the pager's
// anonymous mapping keeps mapped as long as the host (which outlives this adapter), filled on
// first touch from the PMO and left in place until `detach` of that address (the host removes
// an attachment only in its detach, or when it is dropped). Exclusivity is the store's: a
// writable session is refused (EBUSY) while any other session holds the PMO, and a read-only
// one while a writer does; the pager installs pages only into missing ones, so nothing else
// writes the bytes while the engine uses them. `create` makes a zero-filled PMO of whole pages.
unsafe impl Backend for FbHost<'_> {
    fn create(&self, name: &str, size: usize) -> io::Result<()> {
        self.run.create(name, size).map_err(errno)
    }

    fn destroy(&self, name: &str) -> io::Result<()> {
        self.current().destroy(name).map_err(errno)
    }

    fn attach(&self, name: &str, writable: bool) -> io::Result<Attachment> {
        let (addr, len) = self.current().attach(name, writable, None).map_err(errno)?;
        Ok(Attachment { addr, len })
    }

    fn sync(&self, addr: NonNull<u8>) -> io::Result<()> {
        self.current().sync(addr).map(|_| ()).map_err(errno)
    }

    fn detach(&self, addr: NonNull<u8>) -> io::Result<()> {
        self.current().detach(addr).map_err(errno)
    }
}

/// The configuration of a cell: the filebench crate's small scale (Filebench's `nfiles / 10`,
/// 5000 flowops) with `threads` threads; `quick`: a handful of files and a few hundred flowops.
pub fn config(p: Personality, threads: usize, quick: bool) -> Config {
    let mut c = Config::new(p, Scale::Small);
    c.nthreads = u32::try_from(threads).unwrap_or(1).max(1);
    if quick {
        c.nfiles = c.nfiles.min(24);
        c.ops = 300;
    }
    c
}

/// For reports.
pub fn describe(c: &Config) -> String {
    format!(
        "{} files (mean {} KiB, PMO {} KiB each), prealloc {}%, {} flowops, seed {}",
        c.nfiles,
        c.mean_file_size >> 10,
        c.file_cap >> 10,
        c.prealloc_pct,
        c.ops,
        c.seed
    )
}

/// Bytes of a store that holds every file of `c` at once (the store keeps primaries, tree and
/// TSC, a little over twice the data: room for three) and its table slots.
pub fn store_size(c: &Config) -> (u64, u32) {
    let data = u64::from(c.nfiles) * c.file_cap + c.log_cap;
    (data * 3 + (64 << 20), (c.nfiles + 64).min(65_536))
}
