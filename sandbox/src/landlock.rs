//! Landlock: what files the VMM may open once its machine is built.
//!
//! Every file the configuration names is opened while the machine is built, before any
//! guest code runs; nothing opens a file afterwards. So the main thread, once set up, may
//! open only its configured device files (store, anchor, pmem, CXL media and LSA, console)
//! for reading and writing, and nothing else: not the key files or the kernel it read during
//! setup, not another VM's store, not `/etc`. Every thread started through
//! `threads::spawn` gets a domain that allows no file at all (its start hook installs it,
//! since a Landlock domain, like a seccomp filter, binds the calling thread and the threads
//! it starts later, never threads already running).
//!
//! Rules bind at open: descriptors opened before (the store, `/dev/kvm`, the vCPUs) keep
//! working. A kernel without Landlock (before 5.13, or not in its LSM list) is logged once
//! at warn and the VMM goes on (`--landlock on`), or refuses to run (`--landlock require`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, ABI,
};

use crate::{LandlockMode, SandboxError};

/// The newest Landlock ABI whose file rights the VMM asks for; older kernels enforce the
/// subset they know (Debian 12's 6.1 knows ABI 2: no truncate or device-ioctl rights).
const ABI_WANTED: ABI = ABI::V5;

/// A configured file the main thread may still open after setup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRule {
    /// The file (it exists: the machine created it).
    pub path: PathBuf,
    /// Whether it may be opened for writing as well as reading.
    pub write: bool,
}

impl FileRule {
    /// A file opened for reading and writing (store, anchor, pmem, media, LSA, console).
    pub fn read_write(path: impl Into<PathBuf>) -> Self {
        FileRule {
            path: path.into(),
            write: true,
        }
    }

    /// A file opened for reading only.
    pub fn read_only(path: impl Into<PathBuf>) -> Self {
        FileRule {
            path: path.into(),
            write: false,
        }
    }
}

/// What Landlock did for the calling thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enforced {
    /// Every right asked for is enforced.
    Fully,
    /// The kernel's older ABI enforces a subset (e.g. no truncate right on 6.1).
    Partially,
    /// The kernel has no Landlock.
    Not,
    /// `--landlock off`.
    Off,
}

static WARNED: AtomicBool = AtomicBool::new(false);

/// Restricts the calling thread (and the threads it starts later) to opening the files of
/// `rules`; an empty list allows no file at all.
pub fn restrict(mode: LandlockMode, rules: &[FileRule]) -> Result<Enforced, SandboxError> {
    if mode == LandlockMode::Off {
        return Ok(Enforced::Off);
    }
    let handled = AccessFs::from_all(ABI_WANTED);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled)?
        .create()?;
    for rule in rules {
        let fd = PathFd::new(&rule.path).map_err(|source| SandboxError::LandlockPath {
            path: rule.path.clone(),
            source,
        })?;
        let mut access: BitFlags<AccessFs> = AccessFs::ReadFile.into();
        if rule.write {
            access |= AccessFs::WriteFile | AccessFs::Truncate;
        }
        ruleset = ruleset.add_rule(PathBeneath::new(fd, access))?;
    }
    let status = ruleset.restrict_self()?;
    let enforced = match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partially,
        RulesetStatus::NotEnforced => Enforced::Not,
    };
    if enforced == Enforced::Not {
        if mode == LandlockMode::Require {
            return Err(SandboxError::LandlockUnsupported);
        }
        if !WARNED.swap(true, Ordering::Relaxed) {
            log::warn!(
                "sandbox: this kernel has no Landlock; file access is not restricted (seccomp still is)"
            );
        }
    }
    Ok(enforced)
}
