//! Filebench's fileserver, varmail, webproxy and webserver personalities over files kept in
//! Persistent Memory Objects, one PMO per file.
//!
//! The workload engine is C (`c/`, shared with the guest driver `fb_pmo`); this crate compiles
//! it and drives it through FFI on any [`Backend`]: the host's store and pager, or the test
//! backend of ordinary files, [`FileBackend`]. What each personality does, what is scaled down
//! and how file operations map to PMO operations: `apps/filebench/README.md`.
//!
//! ```no_run
//! use filebench::{run, Config, FileBackend, Personality, Scale};
//! let backend = FileBackend::new("/tmp/fb").unwrap();
//! let summary = run(&Config::new(Personality::Varmail, Scale::Small), &backend).unwrap();
//! println!("{summary}");
//! ```

mod bridge;
mod ffi;
mod files;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::str::FromStr;

pub use files::FileBackend;

use bridge::Bridge;

/// What can go wrong running a personality.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration was refused.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The engine failed: errno and what it was doing.
    #[error("{message} (errno {errno})")]
    Engine {
        /// The errno value (e.g. ENOSPC: createfile found the fileset full).
        errno: i32,
        /// What failed, from the engine.
        message: String,
    },
    /// A [`Backend`] callback panicked; the engine saw `EIO`.
    #[error("a backend callback panicked")]
    BackendPanicked,
    /// An unknown personality name.
    #[error("unknown personality {0:?}")]
    UnknownPersonality(String),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// The four personalities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Personality {
    /// createfile, writewholefile, close, open, appendfilerand, close, open, readwholefile,
    /// close, deletefile, statfile.
    Fileserver,
    /// deletefile, createfile, append, fsync, close, open, read, append, fsync, close, open,
    /// read, close.
    Varmail,
    /// deletefile, createfile, append, close, then 5 x (open, readwholefile, close).
    Webproxy,
    /// 10 x (open, readwholefile, close), then an append to the log file.
    Webserver,
}

impl Personality {
    /// All four, in Filebench's order.
    pub const ALL: [Personality; 4] = [
        Self::Fileserver,
        Self::Varmail,
        Self::Webproxy,
        Self::Webserver,
    ];

    /// The engine's number.
    fn code(self) -> u32 {
        match self {
            Self::Fileserver => 0,
            Self::Varmail => 1,
            Self::Webproxy => 2,
            Self::Webserver => 3,
        }
    }

    /// Filebench's name ("fileserver", ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Fileserver => "fileserver",
            Self::Varmail => "varmail",
            Self::Webproxy => "webproxy",
            Self::Webserver => "webserver",
        }
    }

    /// Write flowops and read-or-write flowops per loop, from the engine's flowop list:
    /// (2, 3), (2, 4), (1, 6), (1, 11).
    pub fn write_share(self) -> (u32, u32) {
        let (mut writes, mut ios) = (0u32, 0u32);
        // SAFETY: valid personality code and out-pointers to locals.
        unsafe { ffi::fb_write_share(self.code(), &mut writes, &mut ios) };
        (writes, ios)
    }

    /// Flowops per loop.
    pub fn loop_len(self) -> u32 {
        // SAFETY: a pure lookup.
        unsafe { ffi::fb_loop_len(self.code()) }
    }
}

impl FromStr for Personality {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::UnknownPersonality(s.to_owned()))
    }
}

impl fmt::Display for Personality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Starting points for a [`Config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Filebench's numbers: nfiles 10000/1000, 50/16/100/100 threads, 60 s.
    Full,
    /// nfiles / 10, 4 threads, 5000 flowops: the default on this 2-core machine.
    Small,
}

/// What to run; [`Config::new`] gives the engine's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The personality.
    pub personality: Personality,
    /// Entries of the main fileset.
    pub nfiles: u32,
    /// Worker threads (1..256).
    pub nthreads: u32,
    /// Percent of the entries that exist at start.
    pub prealloc_pct: u32,
    /// Flowops to run, rounded up to whole loops; 0 runs for `seconds`.
    pub ops: u64,
    /// Run time when `ops` is 0.
    pub seconds: u64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Mean file size in bytes.
    pub mean_file_size: u64,
    /// Gamma shape x 1000 of the file sizes (Filebench: 1500); 0 makes every size the mean.
    pub size_gamma_milli: u32,
    /// Check the data of every read (counted in `verify_errors`).
    pub verify_reads: bool,
    /// Chunk of readwholefile and writewholefile.
    pub io_size: u64,
    /// appendfilerand appends 1..=append_size bytes.
    pub append_size: u64,
    /// Bytes of each file's PMO (a multiple of 4096; header included).
    pub file_cap: u64,
    /// Bytes of the webserver log's PMO.
    pub log_cap: u64,
    /// PMO names are `<prefix>.<index>` and `<prefix>.log`.
    pub prefix: String,
}

impl Config {
    /// The engine's defaults for `personality` at `scale`.
    pub fn new(personality: Personality, scale: Scale) -> Self {
        let mut c = zeroed_config();
        let scale = match scale {
            Scale::Full => 0,
            Scale::Small => 1,
        };
        // SAFETY: valid personality and scale; `c` is a writable FbConfig.
        unsafe { ffi::fb_config_init(&mut c, personality.code(), scale) };
        Self {
            personality,
            nfiles: c.nfiles,
            nthreads: c.nthreads,
            prealloc_pct: c.prealloc_pct,
            ops: c.ops,
            seconds: c.seconds,
            seed: c.seed,
            mean_file_size: c.meanfilesize,
            size_gamma_milli: c.sizegamma_milli,
            verify_reads: c.verify_reads != 0,
            io_size: c.iosize,
            append_size: c.appendsize,
            file_cap: c.file_cap,
            log_cap: c.log_cap,
            prefix: c_text(&c.prefix),
        }
    }

    /// The default `file_cap` for `mean_file_size` and `append_size`: header + 4 x mean +
    /// 2 x append size, rounded up to 4096.
    pub fn default_file_cap(mean_file_size: u64, append_size: u64) -> u64 {
        // SAFETY: pure arithmetic.
        unsafe { ffi::fb_default_file_cap(mean_file_size, append_size) }
    }

    /// The engine's struct, checked by the engine.
    fn to_c(&self) -> Result<ffi::FbConfig> {
        let mut c = zeroed_config();
        c.personality = self.personality.code();
        c.nfiles = self.nfiles;
        c.nthreads = self.nthreads;
        c.prealloc_pct = self.prealloc_pct;
        c.ops = self.ops;
        c.seconds = self.seconds;
        c.seed = self.seed;
        c.meanfilesize = self.mean_file_size;
        c.sizegamma_milli = self.size_gamma_milli;
        c.verify_reads = u32::from(self.verify_reads);
        c.iosize = self.io_size;
        c.appendsize = self.append_size;
        c.file_cap = self.file_cap;
        c.log_cap = self.log_cap;
        let prefix = self.prefix.as_bytes();
        if prefix.len() > ffi::PREFIX_MAX || prefix.contains(&0) {
            return Err(Error::Config(format!(
                "prefix {:?} is too long",
                self.prefix
            )));
        }
        for (d, &s) in c.prefix.iter_mut().zip(prefix) {
            *d = s as c_char;
        }
        let mut err = [0 as c_char; 128];
        // SAFETY: `c` is a complete FbConfig, `err` a writable buffer of its length.
        if unsafe { ffi::fb_config_check(&c, err.as_mut_ptr(), err.len()) } != 0 {
            return Err(Error::Config(c_text(&err)));
        }
        Ok(c)
    }
}

/// An all-zero FbConfig.
fn zeroed_config() -> ffi::FbConfig {
    ffi::FbConfig {
        personality: 0,
        nfiles: 0,
        nthreads: 0,
        prealloc_pct: 0,
        ops: 0,
        seconds: 0,
        seed: 0,
        meanfilesize: 0,
        sizegamma_milli: 0,
        verify_reads: 0,
        iosize: 0,
        appendsize: 0,
        file_cap: 0,
        log_cap: 0,
        prefix: [0; ffi::PREFIX_MAX + 1],
        event: None,
        event_ctx: std::ptr::null_mut(),
    }
}

/// The text of a NUL-terminated C array (up to its first NUL; lossy UTF-8).
fn c_text(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// One attachment a [`Backend`] hands out: the whole object, mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attachment {
    /// Its first byte.
    pub addr: NonNull<u8>,
    /// Its size in bytes (the object's size).
    pub len: usize,
}

/// PMO calls on names, which the engine makes from several threads at once.
///
/// # Safety
///
/// The engine reads (and, for a writable attachment, writes) through what [`Backend::attach`]
/// returns, so an implementation must guarantee: `addr` points to `len` bytes that stay mapped,
/// readable (and writable when `writable`) until [`Backend::detach`] of that attachment;
/// nothing else writes them meanwhile while attached for writing, nor while the engine reads
/// them (a writable attachment is exclusive: attach fails with EBUSY when a writer holds the
/// object, or readers hold it and a writer asks); `create` makes a zero-filled object of `size`
/// bytes; `sync` and `detach` take the `addr` of a live attachment. Errors are `io::Error`s with
/// an errno (`from_raw_os_error`): EEXIST from `create`, ENOENT from `destroy` and `attach`
/// matter to the engine; anything without an errno becomes EIO.
pub unsafe trait Backend: Sync {
    /// Creates object `name` of `size` bytes (a multiple of 4096), zero-filled.
    fn create(&self, name: &str, size: usize) -> io::Result<()>;
    /// Destroys object `name` (EBUSY while attached).
    fn destroy(&self, name: &str) -> io::Result<()>;
    /// Attaches object `name` for reading, or reading and writing.
    fn attach(&self, name: &str, writable: bool) -> io::Result<Attachment>;
    /// Makes the object attached at `addr` durable (psync).
    fn sync(&self, addr: NonNull<u8>) -> io::Result<()>;
    /// Ends the attachment at `addr`.
    fn detach(&self, addr: NonNull<u8>) -> io::Result<()>;
}

/// Whether a flowop reads, writes or neither (Filebench's read/write attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// readwholefile.
    Read,
    /// writewholefile, appendfilerand.
    Write,
    /// Everything else (create, open, close, fsync, delete, stat).
    Other,
}

/// One flowop's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowopStats {
    /// Filebench's flowop name, e.g. "appendfilerand2".
    pub name: String,
    /// Read, write or other.
    pub kind: Kind,
    /// Executions.
    pub ops: u64,
    /// Bytes read or written.
    pub bytes: u64,
    /// Total latency.
    pub ns: u64,
    /// Shortest latency.
    pub min_ns: u64,
    /// Longest latency.
    pub max_ns: u64,
}

/// PMO traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Objects created.
    pub creates: u64,
    /// Objects destroyed.
    pub destroys: u64,
    /// Attachments.
    pub attaches: u64,
    /// Detaches.
    pub detaches: u64,
    /// Syncs (psyncs).
    pub psyncs: u64,
    /// Bytes read by readwholefile.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Writes cut at the file's capacity.
    pub truncated_writes: u64,
    /// Bytes those writes did not write.
    pub truncated_bytes: u64,
    /// Flowops that waited for an eligible entry.
    pub pick_waits: u64,
    /// Lengths or data found other than written.
    pub verify_errors: u64,
}

impl From<&ffi::FbCounters> for Counters {
    fn from(c: &ffi::FbCounters) -> Self {
        Self {
            creates: c.creates,
            destroys: c.destroys,
            attaches: c.attaches,
            detaches: c.detaches,
            psyncs: c.psyncs,
            bytes_read: c.bytes_read,
            bytes_written: c.bytes_written,
            truncated_writes: c.truncated_writes,
            truncated_bytes: c.truncated_bytes,
            pick_waits: c.pick_waits,
            verify_errors: c.verify_errors,
        }
    }
}

/// What a run did.
#[derive(Clone)]
pub struct Summary {
    /// The personality.
    pub personality: Personality,
    /// Worker threads.
    pub nthreads: u32,
    /// Entries of the main fileset.
    pub nfiles: u32,
    /// Whole passes over the flowop list.
    pub loops: u64,
    /// Duration of the run (not of the preparation).
    pub elapsed_ns: u64,
    /// PMO traffic of the run.
    pub run: Counters,
    /// PMO traffic of the preparation (creating the prealloc'ed files).
    pub prepare: Counters,
    /// Main-fileset files existing after the run.
    pub files_at_end: u64,
    /// Their total length.
    pub bytes_at_end: u64,
    /// Per flowop, in the personality's order.
    pub flowops: Vec<FlowopStats>,
    raw: Box<ffi::FbResult>,
}

impl fmt::Debug for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Summary")
            .field("personality", &self.personality)
            .field("loops", &self.loops)
            .field("run", &self.run)
            .field("prepare", &self.prepare)
            .field("flowops", &self.flowops)
            .finish_non_exhaustive()
    }
}

impl Summary {
    fn from_raw(personality: Personality, raw: Box<ffi::FbResult>) -> Self {
        let n = (raw.nflowops as usize).min(ffi::MAX_FLOWOPS);
        let flowops = raw.flowops[..n]
            .iter()
            .map(|s| FlowopStats {
                name: c_text(&s.name),
                kind: match s.kind {
                    1 => Kind::Read,
                    2 => Kind::Write,
                    _ => Kind::Other,
                },
                ops: s.ops,
                bytes: s.bytes,
                ns: s.ns,
                min_ns: s.min_ns,
                max_ns: s.max_ns,
            })
            .collect();
        Self {
            personality,
            nthreads: raw.nthreads,
            nfiles: raw.nfiles,
            loops: raw.loops,
            elapsed_ns: raw.elapsed_ns,
            run: Counters::from(&raw.run),
            prepare: Counters::from(&raw.prepare),
            files_at_end: raw.files_at_end,
            bytes_at_end: raw.bytes_at_end,
            flowops,
            raw,
        }
    }

    /// Executions of write flowops and of read-or-write flowops: the measured write share.
    pub fn write_share(&self) -> (u64, u64) {
        let count = |k: Kind| -> u64 {
            self.flowops
                .iter()
                .filter(|s| s.kind == k)
                .map(|s| s.ops)
                .sum()
        };
        let writes = count(Kind::Write);
        (writes, writes + count(Kind::Read))
    }

    fn format(&self, csv: bool) -> String {
        // SAFETY: a valid result; NULL/0 asks for the length only.
        let n = unsafe { ffi::fb_format(&*self.raw, c_int::from(csv), std::ptr::null_mut(), 0) };
        let mut buf = vec![0 as c_char; n + 1];
        // SAFETY: `buf` has n + 1 writable bytes, enough for the text and its NUL.
        unsafe { ffi::fb_format(&*self.raw, c_int::from(csv), buf.as_mut_ptr(), buf.len()) };
        c_text(&buf)
    }

    /// The result as Filebench prints it: a line per flowop (ops, ops/s, mb/s, ms/op), the IO
    /// Summary line, and the PMO counters of the run and the preparation.
    pub fn report(&self) -> String {
        self.format(false)
    }

    /// The result as CSV: a header, a row per flowop, an "IO Summary" and a "prepare" row.
    pub fn csv(&self) -> String {
        self.format(true)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report())
    }
}

/// Modes of [`Fileset::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckMode {
    /// Presence and length must be what the engine left; contents are verified.
    Expect,
    /// Presence and length are learned from the objects (after a crash); contents verified.
    Discover,
}

/// What [`Fileset::check`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckReport {
    /// Names looked at (main fileset and log).
    pub entries: u64,
    /// Objects found.
    pub present: u64,
    /// Found but never written (all-zero header).
    pub empty: u64,
    /// Data bytes verified.
    pub bytes: u64,
    /// Headers that are not ours or not consistent.
    pub bad_header: u64,
    /// Files with a data byte other than written.
    pub bad_data: u64,
    /// Files with a non-zero byte after their length.
    pub bad_tail: u64,
    /// (Expect) files whose length differs from the engine's.
    pub wrong_length: u64,
    /// (Expect) files present that should not be, or missing.
    pub wrong_presence: u64,
    /// Attach or detach failures other than ENOENT.
    pub errors: u64,
}

impl CheckReport {
    /// Nothing wrong found.
    pub fn ok(&self) -> bool {
        self.bad_header == 0
            && self.bad_data == 0
            && self.bad_tail == 0
            && self.wrong_length == 0
            && self.wrong_presence == 0
            && self.errors == 0
    }
}

/// A personality's fileset on a backend: prepare it, run on it, check it, clean it up.
///
/// Files stay on the backend when the `Fileset` is dropped; [`Fileset::cleanup`] destroys them.
pub struct Fileset<'a> {
    raw: NonNull<ffi::FbFileset>,
    bridge: Box<Bridge<'a>>,
    personality: Personality,
    prepared: ffi::FbCounters,
}

impl<'a> Fileset<'a> {
    /// The fileset of `cfg` on `backend` (file sizes drawn from the seed; no I/O yet).
    pub fn new(cfg: &Config, backend: &'a dyn Backend) -> Result<Self> {
        let c = cfg.to_c()?;
        let bridge = Box::new(Bridge::new(backend));
        let ops = bridge.ops();
        // SAFETY: `c` and `ops` are valid for the call (the engine copies both); ops.ctx points
        // into the Box, which stays at its address for the Fileset's life.
        let raw = unsafe { ffi::fb_fileset_new(&c, &ops) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::Engine {
            errno: io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM),
            message: "fileset allocation failed".to_owned(),
        })?;
        Ok(Self {
            raw,
            bridge,
            personality: cfg.personality,
            prepared: ffi::FbCounters::default(),
        })
    }

    /// The engine's answer `rc` as a Result.
    fn outcome(&self, rc: c_int) -> Result<()> {
        if self.bridge.take_panic() {
            return Err(Error::BackendPanicked);
        }
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: the fileset is live; its error text is a NUL-terminated array in it.
        let message = unsafe { CStr::from_ptr(ffi::fb_fileset_error(self.raw.as_ptr())) };
        Err(Error::Engine {
            errno: rc,
            message: message.to_string_lossy().into_owned(),
        })
    }

    /// Creates the prealloc'ed files (and the webserver log) with their sizes, removing
    /// leftovers of an earlier run under the same names.
    pub fn prepare(&mut self) -> Result<Counters> {
        let mut res = Box::new(ffi::FbResult::zeroed());
        // SAFETY: live fileset, writable result; callbacks reach self.bridge (boxed, live).
        let rc = unsafe { ffi::fb_prepare(self.raw.as_ptr(), &mut *res) };
        self.outcome(rc)?;
        self.prepared = res.prepare;
        Ok(Counters::from(&res.prepare))
    }

    /// Runs the personality on the fileset; the summary carries the last preparation's
    /// counters.
    pub fn run(&mut self) -> Result<Summary> {
        let mut res = Box::new(ffi::FbResult::zeroed());
        res.prepare = self.prepared;
        // SAFETY: as in prepare; the engine joins its threads before it returns.
        let rc = unsafe { ffi::fb_run_fileset(self.raw.as_ptr(), &mut *res) };
        self.outcome(rc)?;
        Ok(Summary::from_raw(self.personality, res))
    }

    /// Verifies every file: header, data and the zero tail after the length.
    pub fn check(&mut self, mode: CheckMode) -> Result<CheckReport> {
        let mut r = ffi::FbCheckResult::default();
        let mode = match mode {
            CheckMode::Expect => 0,
            CheckMode::Discover => 1,
        };
        // SAFETY: live fileset, writable result, no per-entry callback.
        let rc = unsafe {
            ffi::fb_check(
                self.raw.as_ptr(),
                mode,
                &mut r,
                None,
                std::ptr::null_mut::<c_void>(),
            )
        };
        self.outcome(rc)?;
        Ok(CheckReport {
            entries: r.entries,
            present: r.present,
            empty: r.empty,
            bytes: r.bytes,
            bad_header: r.bad_header,
            bad_data: r.bad_data,
            bad_tail: r.bad_tail,
            wrong_length: r.wrong_length,
            wrong_presence: r.wrong_presence,
            errors: r.errors,
        })
    }

    /// Destroys every file of the fileset (absent ones are fine).
    pub fn cleanup(&mut self) -> Result<()> {
        // SAFETY: live fileset.
        let rc = unsafe { ffi::fb_cleanup(self.raw.as_ptr()) };
        self.outcome(rc)
    }
}

impl Drop for Fileset<'_> {
    fn drop(&mut self) {
        // SAFETY: allocated by fb_fileset_new, freed once; no engine call is running (they all
        // take &mut self and return after joining their threads).
        unsafe { ffi::fb_fileset_free(self.raw.as_ptr()) };
    }
}

/// Prepares the fileset of `cfg` on `backend` and runs the personality once; the files stay.
pub fn run(cfg: &Config, backend: &dyn Backend) -> Result<Summary> {
    let mut fs = Fileset::new(cfg, backend)?;
    fs.prepare()?;
    fs.run()
}
