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

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cpio::CpioWriter;
use crate::env::{timeout_scale, which, Env};
use crate::error::{Result, RunnerError};
use crate::outcome::{parse_checks, Backend, VmOutcome};
use crate::process::{run_logged, Captured, Line};
use crate::spec::{vmm_args, VmSpec};

const QEMU: &str = "qemu-system-x86_64";
const QEMU_HINT: &str = "install qemu-system-x86 (scripts/setup.sh)";

/// Wall time allowed for L1 to boot and to power off, on top of the VMs' own timeouts.
const L1_BUDGET: Duration = Duration::from_secs(90);
/// Per VM on top of its timeout: copying pmem files in and out of L1.
const PER_VM_BUDGET: Duration = Duration::from_secs(30);
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
    let run = run_l1(env, &log_dir, &payload, &[], 1, L1_MEMORY_MIB, L1_BUDGET)?;
    let ready = run.ready()?;
    Ok(TestHostInfo {
        kvm: ready.text.contains("kvm=yes"),
        ready_line: ready.text.clone(),
        ready_after: ready.at,
        elapsed: run.captured.elapsed,
        log_dir,
    })
}

/// A pmem host file and how L1 sees it.
struct Disk {
    host: PathBuf,
    serial: String,
    inside: PathBuf,
}

/// A file to put into L1 (host path, path in L1, mode).
type PayloadFile = (PathBuf, String, u32);

struct Payload {
    job: String,
    files: Vec<PayloadFile>,
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
        let run = run_l1(env, &attempt_dir, &payload, &disks, smp, l1_mib, budget)?;
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
        eprintln!(
            "pmo-integration: nested test host timed out after {} s (logs: {}); retrying once",
            budget.as_secs(),
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

/// Assigns a virtio-blk disk to each distinct pmem file, creating or growing host files to
/// the size the spec asks for (a disk's size is fixed when L1 starts, so the file must have
/// its final size before; the VMM then sees an existing file of that size).
fn prepare_disks(specs: &[VmSpec]) -> Result<Vec<Disk>> {
    let mut disks: Vec<Disk> = Vec::new();
    for spec in specs {
        spec.validate().map_err(|detail| RunnerError::InvalidSpec {
            name: spec.name.clone(),
            detail,
        })?;
        for p in spec.host_files() {
            let len = fs::metadata(&p.path).map(|m| m.len()).ok();
            let want = p.size.unwrap_or(0).max(len.unwrap_or(0));
            if len.is_none() && p.size.is_none() {
                return Err(RunnerError::InvalidSpec {
                    name: spec.name.clone(),
                    detail: format!(
                        "pmem file {} does not exist and has no size",
                        p.path.display()
                    ),
                });
            }
            if !want.is_multiple_of(512) || want == 0 {
                return Err(RunnerError::InvalidSpec {
                    name: spec.name.clone(),
                    detail: format!(
                        "pmem size {want} of {} is not a multiple of 512",
                        p.path.display()
                    ),
                });
            }
            if len.is_none_or(|l| l < want) {
                let f = OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&p.path)
                    .map_err(|e| RunnerError::io(format!("create {}", p.path.display()), e))?;
                f.set_len(want)
                    .map_err(|e| RunnerError::io(format!("size {}", p.path.display()), e))?;
            }
            if !disks.iter().any(|d| d.host == p.path) {
                let n = disks.len();
                disks.push(Disk {
                    host: p.path.clone(),
                    serial: format!("pmem{n}"),
                    inside: PathBuf::from(format!("/run/pmem/p{n}.img")),
                });
            }
        }
    }
    Ok(disks)
}

fn backup(disks: &[Disk], log_dir: &Path) -> Result<Vec<Option<PathBuf>>> {
    disks
        .iter()
        .map(|d| {
            let b = log_dir.join(format!("{}.backup", d.serial));
            fs::copy(&d.host, &b)
                .map_err(|e| RunnerError::io(format!("back up {}", d.host.display()), e))?;
            Ok(Some(b))
        })
        .collect()
}

fn restore(disks: &[Disk], backups: &[Option<PathBuf>]) -> Result<()> {
    for (d, b) in disks.iter().zip(backups) {
        if let Some(b) = b {
            fs::copy(b, &d.host)
                .map_err(|e| RunnerError::io(format!("restore {}", d.host.display()), e))?;
        }
    }
    Ok(())
}

/// Quotes `s` for the test host's shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The shared libraries and loader of a dynamic executable, from `ldd`.
fn shared_libs(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| RunnerError::Spawn {
            program: "ldd".into(),
            source,
        })?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(RunnerError::Ldd {
            binary: binary.to_path_buf(),
            detail: text.trim().to_string(),
        });
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            return Err(RunnerError::Ldd {
                binary: binary.to_path_buf(),
                detail: format!("missing library: {line}"),
            });
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn build_payload(env: &Env, pmovmm: &Path, specs: &[VmSpec], disks: &[Disk]) -> Result<Payload> {
    let mut files: Vec<PayloadFile> =
        vec![(pmovmm.to_path_buf(), "payload/bin/pmovmm".into(), 0o755)];
    for lib in shared_libs(pmovmm)? {
        let inside = lib.display().to_string();
        files.push((lib, inside, 0o755));
    }
    // A debugging aid: PMO_TESTHOST_EXTRA=DIR adds DIR's tree to L1's root (e.g. strace
    // with its libraries, to look at the VMM inside the test host).
    if let Some(extra) = std::env::var_os("PMO_TESTHOST_EXTRA") {
        add_tree(Path::new(&extra), "", &mut files)?;
    }
    // Distinct guest kernels and initrds, each once.
    let mut images: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut image_path = |host: PathBuf, files: &mut Vec<PayloadFile>| -> String {
        let n = images.len();
        images
            .entry(host.clone())
            .or_insert_with(|| {
                let inside = format!(
                    "payload/l2/{n}-{}",
                    host.file_name()
                        .map(|f| f.to_string_lossy().to_string())
                        .unwrap_or_default()
                );
                files.push((host, inside.clone(), 0o644));
                inside
            })
            .clone()
    };

    let scale = timeout_scale();
    let mut job =
        String::from("# Written by pmo-integration (src/testhost.rs); runs in L1's /init.\n");
    let mut copied_in = vec![false; disks.len()];
    for (i, spec) in specs.iter().enumerate() {
        let (kernel, initrd) = spec.boot_files(env)?;
        for (what, p) in [("kernel", &kernel), ("initrd", &initrd)] {
            if !p.is_file() {
                return Err(RunnerError::InvalidSpec {
                    name: spec.name.clone(),
                    detail: format!("{what} {} does not exist", p.display()),
                });
            }
        }
        let k_in = format!("/{}", image_path(kernel, &mut files));
        let i_in = format!("/{}", image_path(initrd, &mut files));
        let mut used = Vec::new();
        // A host file's path inside L1, copied in before its first VM.
        let mut inside = |path: &Path| -> Option<PathBuf> {
            let d = disks.iter().position(|d| d.host == path)?;
            if !copied_in[d] {
                job += &format!(
                    "th_file_in {} {}\n",
                    disks[d].serial,
                    sh_quote(&disks[d].inside.display().to_string())
                );
                copied_in[d] = true;
            }
            used.push(d);
            Some(disks[d].inside.clone())
        };
        let pmem_in: Vec<PathBuf> = spec.pmem.iter().filter_map(|p| inside(&p.path)).collect();
        let store_in = spec.pmo_store.as_ref().and_then(|p| inside(&p.path));
        let mut cxl_in = Vec::new();
        for (j, c) in spec.cxl.iter().enumerate() {
            let (Some(media), Some(lsa)) = (inside(&c.media.path), inside(&c.lsa.path)) else {
                continue;
            };
            // Key files are read-only: they travel in the payload.
            let key = c.key.as_ref().map(|k| {
                let at = format!("payload/cxl/{i}-{j}.key");
                files.push((k.clone(), at.clone(), 0o600));
                PathBuf::from(format!("/{at}"))
            });
            cxl_in.push((media, lsa, key));
        }
        let args = vmm_args(
            spec,
            Path::new(&k_in),
            Path::new(&i_in),
            &pmem_in,
            store_in.as_deref(),
            &cxl_in,
        );
        let secs = spec.timeout.mul_f64(scale).as_secs().max(1);
        if spec.shell {
            job += &format!("th_shell {i} /payload/bin/pmovmm");
        } else if let Some(on) = &spec.signal_on {
            job += &format!(
                "th_vm_on {i} {secs} {} {} /payload/bin/pmovmm",
                on.signal.name(),
                sh_quote(&on.needle())
            );
        } else if let Some(term) = spec.term_after {
            let term = term.mul_f64(scale).as_secs().max(1);
            job += &format!("th_vm {i} {secs} timeout -s TERM {term} /payload/bin/pmovmm");
        } else {
            job += &format!("th_vm {i} {secs} /payload/bin/pmovmm");
        }
        for a in &args {
            job.push(' ');
            job += &sh_quote(a);
        }
        job.push('\n');
        used.sort_unstable();
        used.dedup();
        for d in used {
            job += &format!(
                "th_file_out {} {}\n",
                disks[d].serial,
                sh_quote(&disks[d].inside.display().to_string())
            );
        }
    }
    Ok(Payload { job, files })
}

/// Adds the files under `dir` (symlinks followed) at `prefix/<relative path>`.
fn add_tree(dir: &Path, prefix: &str, files: &mut Vec<PayloadFile>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let entries =
        fs::read_dir(dir).map_err(|e| RunnerError::io(format!("read {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| RunnerError::io(format!("read {}", dir.display()), e))?;
        let path = entry.path();
        let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        let meta = fs::metadata(&path)
            .map_err(|e| RunnerError::io(format!("stat {}", path.display()), e))?;
        if meta.is_dir() {
            add_tree(&path, &name, files)?;
        } else if meta.is_file() {
            files.push((path, name, meta.permissions().mode() & 0o7777));
        }
    }
    Ok(())
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

fn tail(lines: &[Line], n: usize) -> String {
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
    budget: Duration,
) -> Result<L1Run> {
    let (cmd, initrd) = l1_command(env, log_dir, payload, disks, smp, memory_mib)?;
    let log = log_dir.join("l1-console.log");
    let captured = run_logged(cmd, budget, &log, &log_dir.join("qemu-stderr.log"), "L1| ");
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

fn write_initrd(base: &Path, payload: &Payload, dst: &Path) -> Result<()> {
    let io = |what: &str, e| RunnerError::io(format!("{what} {}", dst.display()), e);
    let mut out = BufWriter::new(File::create(dst).map_err(|e| io("create", e))?);
    let mut b = File::open(base).map_err(|e| io("read base of", e))?;
    let n = std::io::copy(&mut b, &mut out).map_err(|e| io("write", e))?;
    // The kernel finds an uncompressed archive after a compressed one only at a 4-byte
    // boundary; it skips the zero padding.
    let pad = ((4 - n % 4) % 4) as usize;
    out.write_all(&[0u8; 3][..pad])
        .map_err(|e| io("write", e))?;
    let mut w = CpioWriter::new(out);
    w.add_bytes("job/run.sh", 0o644, payload.job.as_bytes())
        .map_err(|e| io("write", e))?;
    for (host, inside, mode) in &payload.files {
        w.add_file(inside, *mode, host).map_err(|e| {
            RunnerError::io(format!("add {} to {}", host.display(), dst.display()), e)
        })?;
    }
    let mut out = w.finish().map_err(|e| io("write", e))?;
    out.flush().map_err(|e| io("write", e))
}

/// What L1 said about one VM.
#[derive(Default)]
struct VmFrame {
    begun: Option<Duration>,
    ended: Option<Duration>,
    console: Vec<String>,
    stderr: Vec<String>,
    rc: Option<i32>,
    guest_elapsed: u64,
    timeout: u64,
}

fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

fn parse_run(
    run: &L1Run,
    specs: &[VmSpec],
    attempts: u32,
    log_dir: &Path,
) -> Result<Vec<VmOutcome>> {
    let lines = &run.captured.stdout;
    let fail = |detail: String| RunnerError::TestHost {
        detail,
        log: run.log.clone(),
        tail: tail(lines, 30),
    };
    run.ready()?;
    let mut frames: Vec<VmFrame> = specs.iter().map(|_| VmFrame::default()).collect();
    let mut current: Option<usize> = None;
    let mut errors = Vec::new();
    for l in lines {
        let t = l.text.as_str();
        if let Some(rest) = t.strip_prefix("@@VM-BEGIN ") {
            current = rest
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|i| *i < frames.len());
            if let Some(i) = current {
                frames[i].begun = Some(l.at);
            }
        } else if let Some(rest) = t.strip_prefix("@@VM-END ") {
            let i = rest
                .split_whitespace()
                .next()
                .and_then(|s| s.parse::<usize>().ok());
            if let Some(f) = i.and_then(|i| frames.get_mut(i)) {
                f.ended = Some(l.at);
                f.rc = field(rest, "rc").and_then(|v| v.parse().ok());
                f.guest_elapsed = field(rest, "elapsed")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                f.timeout = field(rest, "timeout")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                // th_vm prints an empty line to end an unterminated last console line.
                if f.console.last().is_some_and(|s| s.is_empty()) {
                    f.console.pop();
                }
            }
            current = None;
        } else if let Some(rest) = t.strip_prefix("@@VM-STDERR ") {
            if let Some((i, text)) = rest.split_once(' ').or(Some((rest, ""))) {
                if let Some(f) = i.parse::<usize>().ok().and_then(|i| frames.get_mut(i)) {
                    f.stderr.push(text.to_string());
                }
            }
        } else if let Some(rest) = t.strip_prefix("@@TESTHOST-ERROR ") {
            errors.push(rest.to_string());
        } else if let Some(i) = current {
            frames[i].console.push(l.text.clone());
        }
    }
    if !errors.is_empty() {
        return Err(fail(errors.join("; ")));
    }
    // QEMU ended on its own (no host timeout) but L1 never finished the job: L1 crashed
    // (e.g. out of memory, or a kernel panic caused by the VMM), which is no VM timeout.
    if !lines.iter().any(|l| l.text.starts_with("@@TESTHOST-DONE")) && !run.captured.timed_out {
        return Err(fail(format!(
            "L1 stopped before finishing its job (QEMU exit status {:?})",
            run.captured.status.and_then(|s| s.code())
        )));
    }
    let mut outcomes = Vec::new();
    for (i, (spec, f)) in specs.iter().zip(frames).enumerate() {
        if f.begun.is_none() {
            return Err(fail(format!("VM {i} ({}) never started", spec.name)));
        }
        let console = f.console.join("\n") + "\n";
        let _ = fs::write(
            log_dir.join(format!("vm{i}-{}-console.log", spec.name)),
            &console,
        );
        let (checks, done) = parse_checks(&console);
        // The shell reports a process killed by signal N as 128+N; `timeout -s KILL` is 137.
        let killed = f.rc.is_none_or(|rc| rc >= 128);
        let timed_out =
            f.ended.is_none() || (f.rc == Some(137) && f.guest_elapsed + 1 >= f.timeout);
        let elapsed = match (f.begun, f.ended) {
            (Some(b), Some(e)) => e.saturating_sub(b),
            (Some(b), None) => run.captured.elapsed.saturating_sub(b),
            _ => Duration::ZERO,
        };
        outcomes.push(VmOutcome {
            name: spec.name.clone(),
            backend: Backend::Nested,
            exit_code: if killed { None } else { f.rc },
            timed_out,
            console,
            vmm_stderr: f.stderr.join("\n"),
            checks,
            done,
            elapsed,
            attempts,
            log_dir: log_dir.to_path_buf(),
        });
    }
    Ok(outcomes)
}

fn write_timings(log_dir: &Path, run: &L1Run, outcomes: &[VmOutcome], attempts: u32) {
    let mut s = String::new();
    if attempts > 1 {
        s += &format!(
            "test host attempts: {attempts} (earlier ones timed out, logs in attempt*/ and here)\n"
        );
    }
    if let Ok(ready) = run.ready() {
        s += &format!(
            "L1 ready after {:.1} s: {}\n",
            ready.at.as_secs_f64(),
            ready.text
        );
    }
    for o in outcomes {
        s += &format!(
            "VM {}: {:.1} s, exit {:?}{}\n",
            o.name,
            o.elapsed.as_secs_f64(),
            o.exit_code,
            if o.timed_out { " (timed out)" } else { "" }
        );
    }
    s += &format!("L1 total {:.1} s\n", run.captured.elapsed.as_secs_f64());
    eprint!("pmo-integration: {s}");
    let _ = fs::write(log_dir.join("timings.txt"), s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn ldd_of_a_dynamic_binary_lists_the_loader() {
        let libs = shared_libs(Path::new("/bin/sh")).unwrap();
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
    }

    fn line(text: &str, secs: u64) -> Line {
        Line {
            at: Duration::from_secs(secs),
            text: text.into(),
        }
    }

    #[test]
    fn frames_become_outcomes() {
        let lines = vec![
            line("@@TESTHOST-READY kvm=yes", 4),
            line("@@VM-BEGIN 0", 5),
            line("PMOTEST a.b ok 1", 8),
            line("PMOTEST-DONE", 9),
            line("", 9),
            line("@@VM-END 0 rc=0 elapsed=4 timeout=60", 9),
            line("@@VM-BEGIN 1", 10),
            line("booting", 11),
            line("", 70),
            line("@@VM-END 1 rc=137 elapsed=60 timeout=60", 70),
            line("@@VM-STDERR 1 some error", 70),
            line("@@TESTHOST-DONE", 71),
        ];
        let run = L1Run {
            captured: Captured {
                status: None,
                timed_out: false,
                stdout: lines,
                stderr: Vec::new(),
                elapsed: Duration::from_secs(72),
            },
            log: PathBuf::from("/nonexistent/l1.log"),
        };
        let specs = [VmSpec::new("a"), VmSpec::new("b")];
        let o = parse_run(&run, &specs, 1, Path::new("/nonexistent")).unwrap();
        assert_eq!(o[0].exit_code, Some(0));
        assert!(o[0].done && !o[0].timed_out);
        assert_eq!(o[0].console, "PMOTEST a.b ok 1\nPMOTEST-DONE\n");
        assert_eq!(o[0].elapsed, Duration::from_secs(4));
        assert_eq!(o[1].exit_code, None);
        assert!(o[1].timed_out);
        assert_eq!(o[1].vmm_stderr, "some error");
    }

    #[test]
    fn a_test_host_that_dies_midway_is_an_error() {
        let run = L1Run {
            captured: Captured {
                status: None,
                timed_out: false,
                stdout: vec![
                    line("@@TESTHOST-READY kvm=yes", 4),
                    line("@@VM-BEGIN 0", 5),
                    line("Kernel panic - not syncing: Out of memory", 9),
                ],
                stderr: Vec::new(),
                elapsed: Duration::from_secs(10),
            },
            log: PathBuf::from("/nonexistent/l1.log"),
        };
        let err = parse_run(&run, &[VmSpec::new("a")], 1, Path::new("/nonexistent")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("before finishing"), "{msg}");
        assert!(msg.contains("Out of memory"), "{msg}");
    }
}
