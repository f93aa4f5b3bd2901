//! The VMM's sandbox: a seccomp filter per thread kind and Landlock file rules.
//!
//! pmovmm holds the store's keys and every attached PMO's key and parses hostile guest input
//! (virtio rings, PMO requests, PCI and CXL registers, mailbox payloads) in-process. The
//! sandbox bounds what a thread can do when one of those parsers is wrong:
//!
//! - [`Sandbox::install`], before the machine is built, compiles one seccomp allowlist per
//!   [`ThreadKind`] and sets the `threads` start hook: every thread our crates start confines
//!   itself first (a Landlock domain that opens no file, then its kind's filter) and a thread
//!   that cannot be confined never runs its work (the spawn fails).
//! - [`Sandbox::confine_main`], once the machine is built and its vCPUs started, confines the
//!   main thread: Landlock to the configured device files, then the main thread's filter.
//!
//! The filters are per thread (no TSYNC): each thread installs its own, and a thread started
//! at run time inherits its creator's (filters stack), which `seccomp::rules` accounts for.
//! `docs/sandbox.md` lists the calls per kind and how to debug a kill (`--seccomp log`);
//! `docs/threat-model.md` says what the sandbox contains and what it does not.
//!
//! Nothing here knows the VMM's configuration: the VMM passes the modes and the files.

pub mod landlock;
pub mod seccomp;

use std::path::PathBuf;
use std::sync::Arc;

pub use crate::landlock::{Enforced, FileRule};
pub use crate::seccomp::Target;
pub use threads::ThreadKind;

/// What the seccomp filters do with a call outside a thread's allowlist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SeccompMode {
    /// Kill the process by SIGSYS after one line on stderr naming the thread's kind and
    /// the call (the call itself never runs).
    #[default]
    On,
    /// Let the call through and log it to the kernel's audit log (for finding what a new
    /// code path needs: `dmesg | grep type=1326`).
    Log,
    /// No filters.
    Off,
}

impl SeccompMode {
    /// Parses `on`, `log` or `off`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "on" => Some(SeccompMode::On),
            "log" => Some(SeccompMode::Log),
            "off" => Some(SeccompMode::Off),
            _ => None,
        }
    }
}

/// Whether Landlock restricts file access, and whether a kernel without it is acceptable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LandlockMode {
    /// Restrict; a kernel without Landlock is logged at warn and the VMM runs on.
    #[default]
    On,
    /// Restrict, and refuse to run on a kernel without Landlock.
    Require,
    /// No Landlock.
    Off,
}

impl LandlockMode {
    /// Parses `on`, `require` or `off`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "on" => Some(LandlockMode::On),
            "require" => Some(LandlockMode::Require),
            "off" => Some(LandlockMode::Off),
            _ => None,
        }
    }
}

/// Both halves of the sandbox's setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// The seccomp filters.
    pub seccomp: SeccompMode,
    /// Landlock.
    pub landlock: LandlockMode,
}

/// Errors setting up or entering the sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A filter cannot be compiled (a bug in the rules).
    #[error("seccomp filter: {0}")]
    Backend(#[from] seccompiler::BackendError),
    /// A filter cannot be installed, or the architecture has none.
    #[error("seccomp: {0}")]
    Seccomp(#[source] seccompiler::Error),
    /// No filter was compiled for this target.
    #[error("no seccomp filter for {0}")]
    NoFilter(Target),
    /// A Landlock ruleset cannot be built or enforced.
    #[error("landlock: {0}")]
    Landlock(#[from] ::landlock::RulesetError),
    /// A configured file cannot be named in a Landlock rule.
    #[error("landlock: {path}: {source}")]
    LandlockPath {
        /// The file.
        path: PathBuf,
        /// Why it cannot be opened as a path.
        source: ::landlock::PathFdError,
    },
    /// `--landlock require` on a kernel without Landlock.
    #[error("landlock: this kernel does not support it (--landlock require)")]
    LandlockUnsupported,
    /// The SIGSYS handler cannot be installed.
    #[error("sandbox: SIGSYS handler: {0}")]
    SigsysHandler(#[source] std::io::Error),
    /// The thread start hook cannot be set.
    #[error("sandbox: {0}")]
    Hook(#[from] threads::ThreadsError),
}

impl From<seccompiler::Error> for SandboxError {
    fn from(e: seccompiler::Error) -> Self {
        SandboxError::Seccomp(e)
    }
}

/// The installed sandbox: the start hook is set; the main thread is confined by
/// [`Sandbox::confine_main`].
pub struct Sandbox {
    policy: Policy,
    filters: Option<Arc<seccomp::Filters>>,
}

impl Sandbox {
    /// Compiles the filters and sets the process-wide thread start hook. Call it before any
    /// thread is started through `threads::spawn` (it fails otherwise), once per process.
    pub fn install(policy: Policy) -> Result<Self, SandboxError> {
        let filters = match policy.seccomp {
            SeccompMode::Off => None,
            mode => Some(Arc::new(seccomp::Filters::new(mode)?)),
        };
        let hook_filters = filters.clone();
        let landlock = policy.landlock;
        threads::set_start_hook(move |kind| {
            confine_thread(landlock, hook_filters.as_deref(), Target::Thread(kind))
                .map_err(|e| Box::new(e) as threads::HookError)
        })?;
        if policy.seccomp == SeccompMode::On {
            seccomp::trap::install_handler().map_err(SandboxError::SigsysHandler)?;
        }
        if policy.seccomp == SeccompMode::Log {
            log::warn!("sandbox: seccomp in log mode: forbidden calls are logged, not stopped");
        }
        Ok(Sandbox { policy, filters })
    }

    /// Confines the calling (main) thread: Landlock to `files`, then the main thread's filter.
    /// Threads it starts afterwards start under both.
    pub fn confine_main(&self, files: &[FileRule]) -> Result<Enforced, SandboxError> {
        let enforced = landlock::restrict(self.policy.landlock, files)?;
        if let Some(f) = &self.filters {
            f.apply(Target::Main)?;
        }
        Ok(enforced)
    }

    /// The policy installed.
    pub fn policy(&self) -> Policy {
        self.policy
    }
}

/// What the start hook does in each new thread: no file may be opened, then the kind's filter.
fn confine_thread(
    landlock: LandlockMode,
    filters: Option<&seccomp::Filters>,
    target: Target,
) -> Result<(), SandboxError> {
    landlock::restrict(landlock, &[])?;
    if let Some(f) = filters {
        f.apply(target)?;
    }
    Ok(())
}
