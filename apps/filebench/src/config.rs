//! What to run: the four personalities, the scales, and a run's configuration as the engine
//! checks it.

use std::ffi::c_char;
use std::fmt;
use std::str::FromStr;

use crate::ffi::{self, c_text};
use crate::{Error, Result};

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
    pub(crate) fn to_c(&self) -> Result<ffi::FbConfig> {
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
