//! Where things are: the repository, the guest image, the VMM binary, logs; and which kind of
//! KVM this machine has.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Result, RunnerError};
use crate::outcome::Backend;

const BUILD_HINT: &str = "run guest/build.sh (after scripts/setup.sh as root)";
const PMOVMM_HINT: &str =
    "build it first (cargo build --release -p pmovmm) or point PMOVMM_BIN at the binary";

/// Paths the runner works with. `from_env` reads the overrides.
#[derive(Debug, Clone)]
pub struct Env {
    /// The repository root.
    pub repo: PathBuf,
    /// Output of guest/build.sh (`PMO_GUEST_DIR`, else `<repo>/target/guest`).
    pub guest_dir: PathBuf,
    /// The VMM (`PMOVMM_BIN`, else `$CARGO_TARGET_DIR/release/pmovmm`, else
    /// `<repo>/target/release/pmovmm`).
    pub pmovmm: PathBuf,
    /// Per-run log directories go here (`<repo>/target/itest-logs`).
    pub log_root: PathBuf,
}

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

impl Env {
    /// The default locations, with `PMOVMM_BIN` and `PMO_GUEST_DIR` overrides.
    pub fn from_env() -> Env {
        // This crate lives at <repo>/tests/integration.
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let guest_dir = std::env::var_os("PMO_GUEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join("target/guest"));
        // The test command builds the VMM before the tests, into the same target directory.
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(|d| repo.join(d))
            .unwrap_or_else(|| repo.join("target"));
        let pmovmm = std::env::var_os("PMOVMM_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| target.join("release/pmovmm"));
        let log_root = repo.join("target/itest-logs");
        Env {
            repo,
            guest_dir,
            pmovmm,
            log_root,
        }
    }

    fn guest_file(&self, name: &str, what: &'static str) -> Result<PathBuf> {
        let p = self.guest_dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(RunnerError::Missing {
                what,
                path: p,
                hint: BUILD_HINT,
            })
        }
    }

    /// The guest (and test host) kernel, a bzImage.
    pub fn kernel(&self) -> Result<PathBuf> {
        self.guest_file("vmlinuz", "guest kernel")
    }

    /// The L2 test guest's initramfs.
    pub fn initrd(&self) -> Result<PathBuf> {
        self.guest_file("initramfs.cpio.gz", "guest initramfs")
    }

    /// The nested test host's base initramfs.
    pub fn testhost_initrd(&self) -> Result<PathBuf> {
        self.guest_file("testhost.cpio.gz", "test host initramfs")
    }

    /// The guest kernel's release string (what `uname -r` says in the guest).
    pub fn kernel_release(&self) -> Result<String> {
        let p = self.guest_file("kernel-release", "kernel release file")?;
        let s = fs::read_to_string(&p)
            .map_err(|e| RunnerError::io(format!("read {}", p.display()), e))?;
        Ok(s.trim().to_string())
    }

    /// The VMM binary, which must exist (the runner never builds it).
    pub fn require_pmovmm(&self) -> Result<PathBuf> {
        if self.pmovmm.is_file() {
            Ok(self.pmovmm.clone())
        } else {
            Err(RunnerError::Missing {
                what: "pmovmm binary",
                path: self.pmovmm.clone(),
                hint: PMOVMM_HINT,
            })
        }
    }

    /// A fresh directory under `root` named after `label`, unique across runs and processes.
    fn fresh_dir(root: &Path, label: &str) -> Result<PathBuf> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
        let safe: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(60)
            .collect();
        prune(root, KEEP_RUNS);
        let dir = root.join(format!("{safe}-{secs}-{}-{n}", std::process::id()));
        fs::create_dir_all(&dir)
            .map_err(|e| RunnerError::io(format!("create {}", dir.display()), e))?;
        Ok(dir)
    }

    /// A new log directory for one run.
    pub fn new_log_dir(&self, label: &str) -> Result<PathBuf> {
        Self::fresh_dir(&self.log_root, label)
    }

    /// A new scratch directory for a test's host files (e.g. pmem files), under
    /// `<repo>/target/itest-work`. Left in place after the run for inspection.
    pub fn work_dir(&self, label: &str) -> Result<PathBuf> {
        Self::fresh_dir(&self.repo.join("target/itest-work"), label)
    }

    /// Takes the machine-wide VM test lock: only one VM run at a time, across test threads
    /// and test binaries, since the 2 shared cores make parallel nested hosts slow enough to
    /// hit timeouts. Released when the returned file is dropped.
    pub(crate) fn lock(&self) -> Result<File> {
        fs::create_dir_all(&self.log_root)
            .map_err(|e| RunnerError::io(format!("create {}", self.log_root.display()), e))?;
        let path = self.log_root.join(".vm.lock");
        let f = File::create(&path)
            .map_err(|e| RunnerError::io(format!("create {}", path.display()), e))?;
        f.lock()
            .map_err(|e| RunnerError::io(format!("lock {}", path.display()), e))?;
        Ok(f)
    }
}

/// Run directories kept under `target/itest-logs` and `target/itest-work` (each pmem image is
/// tens of MB, so they must not pile up forever).
const KEEP_RUNS: usize = 30;

/// Deletes all but the `keep` newest directories under `root` (best effort).
fn prune(root: &Path, keep: usize) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let mut dirs: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let t = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(UNIX_EPOCH);
            (t, e.path())
        })
        .collect();
    if dirs.len() <= keep {
        return;
    }
    dirs.sort();
    for (_, d) in &dirs[..dirs.len() - keep] {
        let _ = fs::remove_dir_all(d);
    }
}

/// What this machine's /dev/kvm is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmKind {
    /// Hardware virtualization (VMX or SVM) and a regular KVM module: run the VMM directly.
    Hardware,
    /// No usable hardware KVM (PVM backend, no VMX/SVM, or no /dev/kvm); the reason says which.
    /// The VMM runs inside the nested test host.
    NotHardware(String),
}

/// Detects the kind of KVM from /proc/cpuinfo, /sys/module and /dev/kvm.
pub fn detect_kvm() -> KvmKind {
    if Path::new("/sys/module/kvm_pvm").exists() {
        return KvmKind::NotHardware("/dev/kvm is the PVM backend (kvm_pvm loaded)".into());
    }
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has_virt = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if !has_virt {
        return KvmKind::NotHardware("the CPU shows no vmx/svm flag".into());
    }
    if !Path::new("/dev/kvm").exists() {
        return KvmKind::NotHardware("no /dev/kvm (kvm modules not loaded?)".into());
    }
    KvmKind::Hardware
}

/// Where VMs run: `PMO_VM_MODE=direct|nested` forces it, otherwise hardware KVM means direct.
pub fn backend() -> Result<Backend> {
    match std::env::var("PMO_VM_MODE").ok().as_deref() {
        Some("direct") => Ok(Backend::Direct),
        Some("nested") => Ok(Backend::Nested),
        Some("") | None => Ok(match detect_kvm() {
            KvmKind::Hardware => Backend::Direct,
            KvmKind::NotHardware(_) => Backend::Nested,
        }),
        Some(other) => Err(RunnerError::InvalidSpec {
            name: "PMO_VM_MODE".into(),
            detail: format!("{other:?} is neither direct nor nested"),
        }),
    }
}

/// Finds `program` in PATH.
pub(crate) fn which(program: &'static str, hint: &'static str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or(RunnerError::ProgramMissing { program, hint })
}

/// Scales timeouts on slow machines: `PMO_TEST_TIMEOUT_SCALE=2` doubles every timeout.
pub(crate) fn timeout_scale() -> f64 {
    std::env::var("PMO_TEST_TIMEOUT_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f > 0.0)
        .unwrap_or(1.0)
}
