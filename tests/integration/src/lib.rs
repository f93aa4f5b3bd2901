//! The VM test runner: boots the guest image under `pmovmm`, runs named guest scenarios, and
//! turns the guest's `PMOTEST` console lines into checks a test asserts on.
//!
//! On a machine with hardware KVM the VMM runs directly. On this project's machines
//! `/dev/kvm` is the PVM backend, which cannot run a stock Linux kernel, so the VMM runs
//! inside a nested QEMU-TCG test host with real KVM (see `testhost`). The tests are the same
//! either way; missing prerequisites are errors, never a silent skip.
//!
//! ```no_run
//! use pmo_integration::{run_vms, VmSpec};
//! let out = run_vms(&[VmSpec::new("boot").cpus(2).scenarios(["boot_info"])]).unwrap();
//! out[0].assert_exit(0);
//! out[0].assert_detail("boot_info.cpus", "2");
//! ```

mod cpio;
mod direct;
mod env;
mod error;
mod outcome;
mod process;
mod qemu;
mod spec;
pub mod testhost;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub use env::{backend, detect_kvm, Env, KvmKind};
pub use error::{Result, RunnerError};
pub use outcome::{parse_checks, Backend, Check, VmOutcome};
pub use qemu::run_in_qemu;
pub use spec::{
    format_size, CxlSpec, PmemSpec, SignalOn, VmSignal, VmSpec, DEFAULT_VM_TIMEOUT, VM_TEST_KDF,
};

/// Runs the VMs in order, where this machine can: directly on hardware KVM, else in one boot
/// of the nested test host. Host pmem files hold the guests' writes afterwards.
pub fn run_vms(specs: &[VmSpec]) -> Result<Vec<VmOutcome>> {
    run_vms_with(&Env::from_env(), specs)
}

/// `run_vms` with explicit paths.
pub fn run_vms_with(env: &Env, specs: &[VmSpec]) -> Result<Vec<VmOutcome>> {
    match backend()? {
        Backend::Direct => direct::run_direct(env, specs),
        Backend::Nested | Backend::Qemu => testhost::run_nested(env, specs),
    }
}

/// Boots one VM with an interactive shell on the guest console, attached to this terminal
/// (the demo): directly on hardware KVM, else through the nested test host. Returns the exit
/// code of the VMM (direct) or of the test host's QEMU (nested).
pub fn run_shell(spec: &VmSpec) -> Result<Option<i32>> {
    let env = Env::from_env();
    let mut spec = spec.clone();
    spec.shell = true;
    match backend()? {
        Backend::Direct => {
            let pmovmm = env.require_pmovmm()?;
            spec::ensure_backing_files(&pmovmm, std::slice::from_ref(&spec))?;
            let status = Command::new(&pmovmm)
                .args(spec.host_vmm_args(&env)?)
                .status()
                .map_err(|source| RunnerError::Spawn {
                    program: pmovmm.display().to_string(),
                    source,
                })?;
            Ok(status.code())
        }
        Backend::Nested | Backend::Qemu => testhost::run_shell_nested(&env, &spec),
    }
}

/// What `pmovmm` did when run on this machine without a VM coming up (argument and file
/// errors need no guest, so no test host either).
#[derive(Debug)]
pub struct HostRun {
    /// Exit code; `None` if killed (timeout) or by a signal.
    pub exit_code: Option<i32>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
    /// It was killed because it outran the timeout.
    pub timed_out: bool,
}

/// Runs `pmovmm ARGS` on this machine with a timeout.
pub fn run_vmm_on_host(env: &Env, args: &[&str], timeout: Duration) -> Result<HostRun> {
    let pmovmm = env.require_pmovmm()?;
    let log_dir = env.new_log_dir("host-pmovmm")?;
    let mut cmd = Command::new(pmovmm);
    cmd.args(args);
    let cap = process::run_logged(
        cmd,
        timeout,
        &log_dir.join("stdout.log"),
        &log_dir.join("stderr.log"),
        "VMM| ",
    )?;
    Ok(HostRun {
        exit_code: cap.status.and_then(|s| s.code()),
        stdout: cap.stdout_text(),
        stderr: cap.stderr_text(),
        timed_out: cap.timed_out,
    })
}

/// A byte pattern unique to this run, safe on the kernel command line: pmem tests write it so
/// that a stale file from an earlier run cannot pass.
pub fn unique_pattern(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{:x}", std::process::id(), nanos & 0xffff_ffff)
}

/// Reads `len` bytes at `offset` of a host file.
pub fn read_at(path: &Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path)
        .map_err(|e| RunnerError::io(format!("open {}", path.display()), e))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)
        .map_err(|e| RunnerError::io(format!("read {}", path.display()), e))?;
    Ok(buf)
}
