//! The nested test host: `pmovmm` runs inside a QEMU-TCG machine (L1) whose emulated AMD CPU
//! has SVM, so kvm-amd gives it a real /dev/kvm, since this machine's own /dev/kvm (PVM)
//! cannot run a stock Linux guest. See tests/integration/README.md.
//!
//! One L1 boot runs all the specs of a `run_vms` call in order (an L1 boot costs ~5 s, an L2
//! boot ~10 s). The runner appends a payload archive to L1's base initramfs: the VMM binary
//! with its shared libraries (from `ldd`), the guest kernel and initramfs, and `/job/run.sh`.
//! pmem files travel as virtio-blk disks: L1 copies each into its tmpfs before the first VM
//! that uses it (the VMM maps pmem files `MAP_SHARED`, so it needs a real file) and back to
//! the disk, i.e. the host file, after each VM that used it.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::env::{timeout_scale, which, Env};
use crate::error::{Result, RunnerError};
use crate::outcome::VmOutcome;
use crate::process::{run_logged_with, Captured, Limits, Line};
use crate::spec::VmSpec;

mod payload;
mod report;

use payload::{backup, build_payload, prepare_disks, restore, write_initrd, Disk, Payload};
use report::{parse_run, write_timings};

const QEMU: &str = "qemu-system-x86_64";
const QEMU_HINT: &str = "install qemu-system-x86 (scripts/setup.sh)";

/// Wall time allowed for L1 to boot and to power off, on top of the VMs' own timeouts.
const L1_BUDGET: Duration = Duration::from_secs(90);
/// Per VM on top of its timeout: copying pmem files in and out of L1.
const PER_VM_BUDGET: Duration = Duration::from_secs(30);
/// How long L1 may take to power off after `@@TESTHOST-DONE`. Its pmem disks were written
/// back with `dd conv=fsync` before that line, so its results are complete then; QEMU has
/// been seen to hang after L1's power-off, which then cost the quiet limit and a rerun.
const POWER_OFF_GRACE: Duration = Duration::from_secs(30);
/// L1 memory: the default fits a 1 GiB guest plus its pmem files in L1's tmpfs.
const L1_MEMORY_MIB: u64 = 3072;

/// What the test host reported when it came up.
#[derive(Debug, Clone)]
pub struct TestHostInfo {
    /// /dev/kvm exists in L1.
    pub kvm: bool,
    /// The whole `@@TESTHOST-READY` line (kvm, npt, nested, cpus, memory, L1 uptime).
    pub ready_line: String,
    /// Host wall time from starting QEMU to the READY line.
    pub ready_after: Duration,
    /// Host wall time of the whole L1 run.
    pub elapsed: Duration,
    /// The run's log directory.
    pub log_dir: PathBuf,
}

/// Boots the test host with an empty job: proves L1 comes up with a real /dev/kvm.
pub fn probe(env: &Env) -> Result<TestHostInfo> {
    let _lock = env.lock()?;
    let log_dir = env.new_log_dir("testhost-probe")?;
    let payload = Payload {
        job: "echo \"@@PROBE /dev/kvm: $(ls -l /dev/kvm 2>&1)\"\n".to_string(),
        files: Vec::new(),
    };
    let run = run_l1(
        env,
        &log_dir,
        &payload,
        &[],
        1,
        L1_MEMORY_MIB,
        L1_BUDGET.into(),
    )?;
    let ready = run.ready()?;
    Ok(TestHostInfo {
        kvm: ready.text.contains("kvm=yes"),
        ready_line: ready.text.clone(),
        ready_after: ready.at,
        elapsed: run.captured.elapsed,
        log_dir,
    })
}

/// Runs `specs` in one nested test host boot; retries once if the test host itself hangs.
pub(crate) fn run_nested(env: &Env, specs: &[VmSpec]) -> Result<Vec<VmOutcome>> {
    let pmovmm = env.require_pmovmm()?;
    which(QEMU, QEMU_HINT)?;
    let label = crate::spec::run_label(specs);
    let log_dir = env.new_log_dir(&format!("nested-{label}"))?;

    crate::spec::ensure_backing_files(&pmovmm, specs)?;
    let disks = prepare_disks(specs)?;
    let payload = build_payload(env, &pmovmm, specs, &disks)?;
    fs::write(log_dir.join("job.sh"), &payload.job)
        .map_err(|e| RunnerError::io("write job.sh", e))?;

    let scale = timeout_scale();
    let mut budget = L1_BUDGET.mul_f64(scale);
    for s in specs {
        budget += (s.timeout + PER_VM_BUDGET).mul_f64(scale);
    }
    // A live L1 prints at least the framing of each VM, which L1 kills at its own timeout: a
    // longer silence is a hung test host (seen once in nested TCG: 16 minutes of nothing
    // until the whole budget ran out), retried as soon as it shows.
    let longest = specs.iter().map(|s| s.timeout).max().unwrap_or_default();
    let limits = Limits {
        total: budget,
        quiet: Some((L1_BUDGET + longest + PER_VM_BUDGET).mul_f64(scale)),
        done: Some(("@@TESTHOST-DONE", POWER_OFF_GRACE.mul_f64(scale))),
    };
    let max_guest_mib = specs.iter().map(|s| s.memory_mib).max().unwrap_or(0);
    let pmem_mib: u64 = disks
        .iter()
        .map(|d| fs::metadata(&d.host).map(|m| m.len() >> 20).unwrap_or(0))
        .sum();
    let l1_mib = L1_MEMORY_MIB.max(max_guest_mib + pmem_mib + 1024);
    // 1 vCPU for L1 is what the measurements were made with; a 2-vCPU guest still runs.
    let smp = std::env::var("PMO_TESTHOST_SMP")
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .unwrap_or(1);

    // Snapshot the pmem files so that a retry starts from the same state.
    let backups = backup(&disks, &log_dir)?;
    let _lock = env.lock()?;
    let mut attempts = 0;
    let run = loop {
        attempts += 1;
        let attempt_dir = if attempts == 1 {
            log_dir.clone()
        } else {
            let d = log_dir.join(format!("attempt{attempts}"));
            fs::create_dir_all(&d).map_err(|e| RunnerError::io("create attempt dir", e))?;
            d
        };
        let run = run_l1(env, &attempt_dir, &payload, &disks, smp, l1_mib, limits)?;
        if run.captured.killed_when_done {
            eprintln!(
                "pmo-integration: nested test host finished its job but was still running {} s \
                 later; killed, results kept (logs: {})",
                POWER_OFF_GRACE.mul_f64(scale).as_secs(),
                attempt_dir.display()
            );
        }
        if !run.captured.timed_out {
            break run;
        }
        if attempts >= 2 {
            return Err(RunnerError::TestHostTimeout {
                seconds: budget.as_secs(),
                attempts,
                log: attempt_dir.join("l1-console.log"),
                tail: tail(&run.captured.stdout, 30),
            });
        }
        let why = if run.captured.went_quiet {
            format!(
                "printed nothing for {} s",
                limits.quiet.unwrap_or_default().as_secs()
            )
        } else {
            format!("timed out after {} s", budget.as_secs())
        };
        eprintln!(
            "pmo-integration: nested test host {why} (logs: {}); retrying once",
            attempt_dir.display()
        );
        restore(&disks, &backups)?;
    };
    for b in backups.iter().flatten() {
        let _ = fs::remove_file(b);
    }
    let outcomes = parse_run(&run, specs, attempts, &log_dir)?;
    write_timings(&log_dir, &run, &outcomes, attempts);
    Ok(outcomes)
}

/// One L1 run's output.
struct L1Run {
    captured: Captured,
    log: PathBuf,
}

impl L1Run {
    fn ready(&self) -> Result<&Line> {
        self.captured
            .stdout
            .iter()
            .find(|l| l.text.starts_with("@@TESTHOST-READY"))
            .ok_or_else(|| RunnerError::TestHost {
                detail: "L1 never reported ready".into(),
                log: self.log.clone(),
                tail: tail(&self.captured.stdout, 30),
            })
    }
}

pub(super) fn tail(lines: &[Line], n: usize) -> String {
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    | {}", l.text))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes L1's initramfs (base + payload) and the QEMU command that boots it.
fn l1_command(
    env: &Env,
    log_dir: &Path,
    payload: &Payload,
    disks: &[Disk],
    smp: u32,
    memory_mib: u64,
) -> Result<(Command, PathBuf)> {
    let base = env.testhost_initrd()?;
    let kernel = env.kernel()?;
    let initrd = log_dir.join("l1-initrd.img");
    write_initrd(&base, payload, &initrd)?;

    let mut cmd = Command::new(QEMU);
    cmd.args(["-accel", "tcg", "-cpu", "EPYC"])
        .args(["-m", &memory_mib.to_string(), "-smp", &smp.to_string()])
        .args(["-nodefaults", "-no-user-config", "-display", "none"])
        .args(["-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"]);
    for d in disks {
        // QEMU option values escape ',' as ",,".
        let file = d.host.display().to_string().replace(',', ",,");
        cmd.arg("-drive")
            .arg(format!(
                "file={file},format=raw,if=none,id={},cache=writeback",
                d.serial
            ))
            .arg("-device")
            .arg(format!("virtio-blk-pci,drive={0},serial={0}", d.serial));
    }
    let _ = fs::write(log_dir.join("qemu-cmd.txt"), format!("{cmd:?}\n"));
    Ok((cmd, initrd))
}

/// The assembled initramfs is large and can be rebuilt from the logs' job.sh.
fn drop_initrd(initrd: &Path) {
    if std::env::var_os("PMO_TEST_KEEP_INITRD").is_none() {
        let _ = fs::remove_file(initrd);
    }
}

/// Boots L1 with the payload and captures its console, killing it after `budget`.
fn run_l1(
    env: &Env,
    log_dir: &Path,
    payload: &Payload,
    disks: &[Disk],
    smp: u32,
    memory_mib: u64,
    limits: Limits,
) -> Result<L1Run> {
    let (cmd, initrd) = l1_command(env, log_dir, payload, disks, smp, memory_mib)?;
    let log = log_dir.join("l1-console.log");
    let err_log = log_dir.join("qemu-stderr.log");
    let captured = run_logged_with(cmd, limits, &log, &err_log, "L1| ", None);
    drop_initrd(&initrd);
    Ok(L1Run {
        captured: captured?,
        log,
    })
}

/// Runs one VM with the terminal attached: the guest's console is this process's stdin and
/// stdout, through L1's serial line (L1 puts it in raw mode for the VMM). No timeout; Ctrl-C
/// ends QEMU. Returns the exit status of QEMU (the VMM's own status is in the L1 output).
pub(crate) fn run_shell_nested(env: &Env, spec: &VmSpec) -> Result<Option<i32>> {
    let pmovmm = env.require_pmovmm()?;
    which(QEMU, QEMU_HINT)?;
    let specs = std::slice::from_ref(spec);
    let log_dir = env.new_log_dir(&format!("shell-{}", spec.name))?;
    crate::spec::ensure_backing_files(&pmovmm, specs)?;
    let disks = prepare_disks(specs)?;
    let payload = build_payload(env, &pmovmm, specs, &disks)?;
    fs::write(log_dir.join("job.sh"), &payload.job)
        .map_err(|e| RunnerError::io("write job.sh", e))?;
    let _lock = env.lock()?;
    let (mut cmd, initrd) = l1_command(
        env,
        &log_dir,
        &payload,
        &disks,
        1,
        L1_MEMORY_MIB.max(spec.memory_mib + 2048),
    )?;
    // QEMU's warnings (TCG lacks some EPYC features) would clutter the terminal.
    let qemu_err = log_dir.join("qemu-stderr.log");
    let err = File::create(&qemu_err)
        .map_err(|e| RunnerError::io(format!("create {}", qemu_err.display()), e))?;
    cmd.stderr(err);
    let status = cmd.status().map_err(|source| RunnerError::Spawn {
        program: QEMU.into(),
        source,
    });
    drop_initrd(&initrd);
    Ok(status?.code())
}
