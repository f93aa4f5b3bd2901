//! A personality's fileset on a backend: prepare, run, check, clean up, each an engine call
//! whose errno and message become an [`Error`].

use std::ffi::{c_int, c_void, CStr};
use std::io;
use std::ptr::NonNull;

use crate::bridge::Bridge;
use crate::config::{Config, Personality};
use crate::ffi;
use crate::summary::{Counters, Summary};
use crate::{Backend, Error, Result};

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
