//! seccomp filters: one compiled BPF program per thread kind and one for the main thread,
//! each installed by the thread it confines (no TSYNC), plus a small errno filter.
//!
//! Every confined thread gets two filters: the errno filter, which makes `openat` fail with
//! `EACCES` and `clone3` with `ENOSYS` (glibc then uses `clone`, whose flags a filter can
//! read), and the kind's allowlist, whose default action is to kill the process by SIGSYS
//! after one line on stderr (`on`, see `trap.rs`) or to log the call to the kernel's audit
//! log and let it through (`log`). The kernel takes the strictest answer of all
//! filters, so the allowlists list those two calls to let the errno answer win.

mod ioctls;
pub mod rules;
pub mod trap;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use threads::ThreadKind;

pub use rules::Target;

use crate::{SandboxError, SeccompMode};

/// The compiled filters of every target, built once before any thread starts.
pub struct Filters {
    /// One program per call: seccompiler gives a filter a single match action.
    errno: Vec<BpfProgram>,
    allow: BTreeMap<Target, BpfProgram>,
}

fn arch() -> Result<TargetArch, SandboxError> {
    Ok(TargetArch::try_from(std::env::consts::ARCH)?)
}

impl Filters {
    /// Compiles the filters for `mode` (not `Off`).
    pub fn new(mode: SeccompMode) -> Result<Self, SandboxError> {
        let mismatch = match mode {
            SeccompMode::Log => SeccompAction::Log,
            SeccompMode::On | SeccompMode::Off => SeccompAction::Trap,
        };
        let pid = std::process::id();
        let mut allow = BTreeMap::new();
        let targets = ThreadKind::ALL
            .iter()
            .map(|k| Target::Thread(*k))
            .chain([Target::Main]);
        for t in targets {
            let rules = rules::allowlist(t, pid)?.into_rules();
            let filter =
                SeccompFilter::new(rules, mismatch.clone(), SeccompAction::Allow, arch()?)?;
            allow.insert(t, BpfProgram::try_from(filter)?);
        }
        let errno = [
            (libc::SYS_clone3, libc::ENOSYS),
            (libc::SYS_openat, libc::EACCES),
        ]
        .into_iter()
        .map(|(call, errno)| {
            let filter = SeccompFilter::new(
                [(call, vec![])].into_iter().collect(),
                SeccompAction::Allow,
                SeccompAction::Errno(errno as u32),
                arch()?,
            )?;
            Ok(BpfProgram::try_from(filter)?)
        })
        .collect::<Result<Vec<BpfProgram>, SandboxError>>()?;
        Ok(Filters { errno, allow })
    }

    /// Installs `target`'s filters on the calling thread (and the threads it starts later).
    pub fn apply(&self, target: Target) -> Result<(), SandboxError> {
        let allow = self
            .allow
            .get(&target)
            .ok_or(SandboxError::NoFilter(target))?;
        trap::set_thread_name(target.name());
        for prog in &self.errno {
            seccompiler::apply_filter(prog).map_err(SandboxError::Seccomp)?;
        }
        seccompiler::apply_filter(allow).map_err(SandboxError::Seccomp)
    }
}
