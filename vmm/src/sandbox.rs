//! The VMM's sandbox (`pmo-sandbox`) fitted to a configuration: installed before the machine
//! is built, so every thread the devices start confines itself, and entered by the main
//! thread once the machine runs.

use pmo_sandbox::{FileRule, Sandbox, SandboxError};

use crate::config::{ConsoleOutput, VmConfig};

/// The installed sandbox and the files the main thread may still open.
pub struct VmSandbox {
    sandbox: Sandbox,
    files: Vec<FileRule>,
}

impl VmSandbox {
    /// Sets the thread start hook for `cfg.sandbox`. Call it before the machine is built: it
    /// fails if a thread was already started without it.
    pub fn install(cfg: &VmConfig) -> Result<Self, SandboxError> {
        let sandbox = Sandbox::install(cfg.sandbox)?;
        Ok(VmSandbox {
            sandbox,
            files: device_files(cfg),
        })
    }

    /// Confines the calling (main) thread: Landlock to the device files, then its seccomp
    /// filter. Call it once the machine is built (every device file exists then).
    pub fn confine_main(&self) -> Result<(), SandboxError> {
        let enforced = self.sandbox.confine_main(&self.files)?;
        log::info!(
            "sandbox: seccomp {:?}, landlock {:?} ({enforced:?})",
            self.sandbox.policy().seccomp,
            self.sandbox.policy().landlock
        );
        Ok(())
    }
}

/// The files the VMM reads and writes while the guest runs: the PMO store and its anchor,
/// pmem files, CXL media and label storage, the console log. The kernel, initrd, key files
/// and the config file are read during setup only and are not among them.
fn device_files(cfg: &VmConfig) -> Vec<FileRule> {
    let mut files = Vec::new();
    if let Some(pmo) = &cfg.pmo {
        files.push(FileRule::read_write(&pmo.store));
        if let Some(anchor) = &pmo.store_options.anchor {
            files.push(FileRule::read_write(anchor));
        }
    }
    for p in &cfg.pmem {
        files.push(FileRule::read_write(&p.path));
    }
    for c in &cfg.cxl_t3 {
        files.push(FileRule::read_write(&c.media));
        files.push(FileRule::read_write(&c.lsa));
    }
    if let ConsoleOutput::File(p) = &cfg.console {
        files.push(FileRule::read_write(p));
    }
    files.dedup();
    files
}
