//! What a test asks for: one VM to boot, which scenarios its guest runs, which pmem files it
//! gets, and how long it may take.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A pmem device of the VM: a host file, created with `size` bytes by the VMM if missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmemSpec {
    /// The backing file on the host. The test reads it after the run.
    pub path: PathBuf,
    /// Size for the VMM's `--pmem FILE,SIZE`; `None` uses the file's own size.
    pub size: Option<u64>,
}

/// A CXL Type 3 memory expander of the VM (`--cxl-t3`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CxlSpec {
    /// Media file, created with `pmovmm cxl create` before the run when missing (`size`);
    /// moved in and out of the test host like a pmem file.
    pub media: PmemSpec,
    /// Label storage file (created empty with 128 KiB when missing), moved like the media.
    pub lsa: PmemSpec,
    /// Device capacity.
    pub size: u64,
    /// Range key file (read-only, copied into the test host).
    pub key: Option<PathBuf>,
    /// More `--cxl-t3` options, e.g. `cache=16M,latency=0`.
    pub options: String,
}

/// Size of the label storage area the VMM creates.
pub const CXL_LSA_SIZE: u64 = 128 << 10;

/// One VM run: `pmovmm run` with the guest image and these settings.
#[derive(Debug, Clone)]
pub struct VmSpec {
    /// A short label for logs and failure messages (e.g. "write-1cpu").
    pub name: String,
    /// vCPUs (`--cpus`).
    pub cpus: u32,
    /// Guest memory in MiB (`--memory <N>M`).
    pub memory_mib: u64,
    /// Guest scenarios to run, in order (`pmotest=a,b`). Empty: the guest boots, prints
    /// `PMOTEST-DONE` and powers off.
    pub scenarios: Vec<String>,
    /// Scenario parameters, passed as `pmotest.<key>=<value>` (no spaces in either).
    pub params: Vec<(String, String)>,
    /// More kernel command line words, appended last.
    pub cmdline_extra: Vec<String>,
    /// pmem devices in order: the first is the guest's /dev/pmem0.
    pub pmem: Vec<PmemSpec>,
    /// The PMO store (`--pmo-store`): formatted on the host with `pmovmm store create` when
    /// missing (`size` is its size then), and moved in and out of the test host like a pmem file.
    pub pmo_store: Option<PmemSpec>,
    /// CXL memory expanders, in order.
    pub cxl: Vec<CxlSpec>,
    /// The PMO store on the media of the expander with this `id=` (`--pmo-store cxl=ID`), its
    /// extents keyed from the master key file (`--pmo-master-key`, travels like a key file).
    pub pmo_on_cxl: Option<(String, PathBuf)>,
    /// The PMO store's rollback anchor (`--pmo-anchor`): in the nested test host a copy
    /// travels in the payload (what the VMM writes to it there is not brought back).
    pub pmo_anchor: Option<PathBuf>,
    /// More `pmovmm run` arguments, appended last.
    pub extra_args: Vec<String>,
    /// How long the VM may run, from the VMM's start to its exit.
    pub timeout: Duration,
    /// Send the VMM SIGTERM after this long (a shutdown test); SIGKILL follows if it is
    /// still there at `timeout`.
    pub term_after: Option<Duration>,
    /// Send the VMM a signal once the guest reported this check ok (`term_on`, `kill_on`):
    /// the signal follows the guest's progress, not a clock.
    pub signal_on: Option<SignalOn>,
    /// Guest kernel; `None`: the image from guest/build.sh.
    pub kernel: Option<PathBuf>,
    /// Guest initramfs; `None`: the image from guest/build.sh.
    pub initrd: Option<PathBuf>,
    /// Full kernel boot messages on the console. Off by default (`quiet`): in the nested test
    /// host every console byte costs the guest several nested exits, and a full boot log
    /// (~25 KB) doubled a guest boot (23 s instead of 11 s). Errors still print, and the guest
    /// dumps its dmesg tail when a check fails. `PMO_GUEST_VERBOSE=1` turns it on for all VMs.
    pub verbose_console: bool,
    /// An interactive shell instead of scenarios: no `pmotest=` on the command line, so the
    /// guest's /init starts a shell on the console (see `run_shell`).
    pub shell: bool,
}

/// Key-derivation cost of the PMOs VM tests create: real Argon2id, cheap enough for the nested
/// test host (host-side tests cover the default cost).
pub const VM_TEST_KDF: &str = "m=256K,t=1";

/// Per-VM timeout unless a spec sets its own: a guest boot takes ~10 s of wall time in the
/// nested test host, the rest is headroom for a slow, shared machine.
pub const DEFAULT_VM_TIMEOUT: Duration = Duration::from_secs(120);

impl VmSpec {
    /// One vCPU, 1 GiB, no scenarios, no pmem, the default timeout.
    pub fn new(name: impl Into<String>) -> Self {
        VmSpec {
            name: name.into(),
            cpus: 1,
            memory_mib: 1024,
            scenarios: Vec::new(),
            params: Vec::new(),
            cmdline_extra: Vec::new(),
            pmem: Vec::new(),
            pmo_store: None,
            pmo_on_cxl: None,
            pmo_anchor: None,
            cxl: Vec::new(),
            extra_args: Vec::new(),
            timeout: DEFAULT_VM_TIMEOUT,
            term_after: None,
            signal_on: None,
            kernel: None,
            initrd: None,
            verbose_console: std::env::var_os("PMO_GUEST_VERBOSE").is_some_and(|v| v != "0"),
            shell: false,
        }
    }

    /// Sets whether the guest prints its full boot log (see `verbose_console`).
    pub fn verbose_console(mut self, on: bool) -> Self {
        self.verbose_console = on;
        self
    }

    /// Sets the vCPU count.
    pub fn cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    /// Sets guest memory in MiB.
    pub fn memory_mib(mut self, mib: u64) -> Self {
        self.memory_mib = mib;
        self
    }

    /// Appends guest scenarios.
    pub fn scenarios<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.scenarios.extend(names.into_iter().map(Into::into));
        self
    }

    /// Adds a scenario parameter (`pmotest.<key>=<value>`).
    pub fn param(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.push((key.into(), value.into()));
        self
    }

    /// Appends a kernel command line word.
    pub fn cmdline(mut self, word: impl Into<String>) -> Self {
        self.cmdline_extra.push(word.into());
        self
    }

    /// Adds a pmem device backed by `path`.
    pub fn pmem(mut self, path: impl Into<PathBuf>, size: Option<u64>) -> Self {
        self.pmem.push(PmemSpec {
            path: path.into(),
            size,
        });
        self
    }

    /// Gives the VM the PMO device with the store at `path` (created with `size` if missing).
    pub fn pmo_store(mut self, path: impl Into<PathBuf>, size: u64) -> Self {
        self.pmo_store = Some(PmemSpec {
            path: path.into(),
            size: Some(size),
        });
        self
    }

    /// Opens the PMO store under the rollback anchor at `path` (`--pmo-anchor`).
    pub fn pmo_anchor(mut self, path: impl Into<PathBuf>) -> Self {
        self.pmo_anchor = Some(path.into());
        self
    }

    /// Gives the VM the PMO device with its store on the expander `id` (declared with
    /// `cxl_t3(.., "id=ID,guest=off")`), keyed from `master_key`. `id` may carry more
    /// `--pmo-store` options after a comma (`store,direct=64M`).
    pub fn pmo_store_on_cxl(mut self, id: &str, master_key: impl Into<PathBuf>) -> Self {
        self.pmo_on_cxl = Some((id.to_string(), master_key.into()));
        self
    }

    /// Adds a CXL Type 3 expander on `media` (LSA next to it as `<media>.lsa`), with a
    /// range key from `key` if given and more `--cxl-t3` `options` (may be empty).
    pub fn cxl_t3(
        mut self,
        media: impl Into<PathBuf>,
        size: u64,
        key: Option<PathBuf>,
        options: &str,
    ) -> Self {
        let media: PathBuf = media.into();
        let mut lsa = media.clone().into_os_string();
        lsa.push(".lsa");
        self.cxl.push(CxlSpec {
            media: PmemSpec {
                path: media,
                size: None,
            },
            lsa: PmemSpec {
                path: lsa.into(),
                size: Some(CXL_LSA_SIZE),
            },
            size,
            key,
            options: options.to_string(),
        });
        self
    }

    /// Kernel and initrd on this machine: the spec's own, else the built guest image.
    pub(crate) fn boot_files(
        &self,
        env: &crate::env::Env,
    ) -> crate::error::Result<(PathBuf, PathBuf)> {
        let kernel = match &self.kernel {
            Some(k) => k.clone(),
            None => env.kernel()?,
        };
        let initrd = match &self.initrd {
            Some(i) => i.clone(),
            None => env.initrd()?,
        };
        Ok((kernel, initrd))
    }

    /// The `pmovmm` arguments with every file at its path on this machine (direct mode).
    pub(crate) fn host_vmm_args(&self, env: &crate::env::Env) -> crate::error::Result<Vec<String>> {
        let (kernel, initrd) = self.boot_files(env)?;
        let pmem: Vec<_> = self.pmem.iter().map(|p| p.path.clone()).collect();
        let store = self.pmo_store.as_ref().map(|s| s.path.as_path());
        let cxl: Vec<CxlPaths> = self
            .cxl
            .iter()
            .map(|c| (c.media.path.clone(), c.lsa.path.clone(), c.key.clone()))
            .collect();
        let master_key = self.pmo_on_cxl.as_ref().map(|(_, k)| k.as_path());
        let mut args = vmm_args(self, &kernel, &initrd, &pmem, store, master_key, &cxl);
        push_anchor(&mut args, self.pmo_anchor.as_deref());
        Ok(args)
    }

    /// Host files the VM uses: its pmem files, its PMO store, its CXL media and LSA files.
    pub(crate) fn host_files(&self) -> impl Iterator<Item = &PmemSpec> {
        self.pmem
            .iter()
            .chain(self.pmo_store.iter())
            .chain(self.cxl.iter().flat_map(|c| [&c.media, &c.lsa]))
    }

    /// Appends `pmovmm run` arguments.
    pub fn extra_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Sends the VMM SIGTERM after `after` (see `term_after`).
    pub fn term_after(mut self, after: Duration) -> Self {
        self.term_after = Some(after);
        self
    }

    /// Sends the VMM SIGTERM as soon as the guest reports `check` (`scenario.check`) ok; the
    /// timeout still ends a VM that never gets there.
    pub fn term_on(mut self, check: &str) -> Self {
        self.signal_on = Some(SignalOn {
            check: check.to_string(),
            signal: VmSignal::Term,
        });
        self
    }

    /// Sends the VMM SIGKILL as soon as the guest reports `check` ok (a crash test).
    pub fn kill_on(mut self, check: &str) -> Self {
        self.signal_on = Some(SignalOn {
            check: check.to_string(),
            signal: VmSignal::Kill,
        });
        self
    }

    /// Sets the timeout of this VM.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The guest kernel command line the runner passes.
    ///
    /// `panic=-1` makes a panicking guest reboot at once, so the VMM ends instead of hanging.
    pub fn kernel_cmdline(&self) -> String {
        let mut words = vec!["console=ttyS0".to_string(), "panic=-1".to_string()];
        if !self.shell {
            words.push(format!("pmotest={}", self.scenarios.join(",")));
        }
        if !self.verbose_console {
            words.push("quiet".to_string());
        }
        words.extend(self.params.iter().map(|(k, v)| format!("pmotest.{k}={v}")));
        words.extend(self.cmdline_extra.iter().cloned());
        words.join(" ")
    }

    /// Checks what would otherwise break in a confusing way later (e.g. a space inside a
    /// parameter splits it into two kernel command line words).
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.cpus == 0 {
            return Err("cpus must be at least 1".into());
        }
        for s in &self.scenarios {
            if s.is_empty() || s.contains([',', ' ', '/']) {
                return Err(format!("bad scenario name {s:?}"));
            }
        }
        for (k, v) in &self.params {
            if k.is_empty() || k.contains([' ', '=']) || v.contains(char::is_whitespace) {
                return Err(format!(
                    "bad parameter {k:?}={v:?} (no spaces, key without '=')"
                ));
            }
        }
        if self.timeout.is_zero() {
            return Err("timeout must not be zero".into());
        }
        if self
            .term_after
            .is_some_and(|t| t.is_zero() || t >= self.timeout)
        {
            return Err("term_after must be non-zero and shorter than the timeout".into());
        }
        if let Some(on) = &self.signal_on {
            if self.term_after.is_some() {
                return Err("term_after and term_on/kill_on exclude each other".into());
            }
            let (scenario, check) = on.check.split_once('.').unwrap_or(("", ""));
            if scenario.is_empty()
                || check.is_empty()
                || !on
                    .check
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            {
                return Err(format!("bad check {:?} (scenario.check)", on.check));
            }
        }
        Ok(())
    }
}

/// A signal the runner sends the VMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmSignal {
    /// SIGTERM: the VMM shuts down cleanly (flushes what it holds).
    Term,
    /// SIGKILL: the VMM dies at once, as in a host crash.
    Kill,
}

impl VmSignal {
    /// The name `kill -s` takes.
    pub fn name(self) -> &'static str {
        match self {
            VmSignal::Term => "TERM",
            VmSignal::Kill => "KILL",
        }
    }
}

/// Signal the VMM once the guest reported a check ok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalOn {
    /// `scenario.check`.
    pub check: String,
    /// Which signal.
    pub signal: VmSignal,
}

impl SignalOn {
    /// The console text that triggers it: the check's ok line, as `guest/lib/pmotest.sh`
    /// prints it.
    pub fn needle(&self) -> String {
        format!("PMOTEST {} ok", self.check)
    }
}

/// A run's name for its log directory: the VM names joined with '+'.
pub(crate) fn run_label(specs: &[VmSpec]) -> String {
    specs
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join("+")
}

/// Formats every missing PMO store and CXL media file of `specs` (`pmovmm store create`,
/// `pmovmm cxl create`), on this machine, before any VM starts: the file then has its final
/// size (the test host's disks need that) and the VMM opens an existing one.
pub(crate) fn ensure_backing_files(pmovmm: &Path, specs: &[VmSpec]) -> crate::error::Result<()> {
    use crate::error::RunnerError;
    for spec in specs {
        if let Some(store) = &spec.pmo_store {
            if !store.path.exists() {
                let size = store.size.ok_or_else(|| RunnerError::InvalidSpec {
                    name: spec.name.clone(),
                    detail: format!(
                        "PMO store {} does not exist and has no size",
                        store.path.display()
                    ),
                })?;
                create_file(pmovmm, spec, "store", &store.path, size)?;
            }
        }
        for c in &spec.cxl {
            if !c.media.path.exists() {
                create_file(pmovmm, spec, "cxl", &c.media.path, c.size)?;
            }
        }
    }
    Ok(())
}

/// Runs `pmovmm <kind> create PATH --size SIZE` for `spec`.
fn create_file(
    pmovmm: &Path,
    spec: &VmSpec,
    kind: &str,
    path: &Path,
    size: u64,
) -> crate::error::Result<()> {
    use crate::error::RunnerError;
    let out = std::process::Command::new(pmovmm)
        .args([kind, "create"])
        .arg(path)
        .args(["--size", &format_size(size)])
        .output()
        .map_err(|source| RunnerError::Spawn {
            program: pmovmm.display().to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(RunnerError::InvalidSpec {
            name: spec.name.clone(),
            detail: format!(
                "pmovmm {kind} create {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

/// Where a CXL device's media, LSA and key files are as the VMM sees them.
pub(crate) type CxlPaths = (PathBuf, PathBuf, Option<PathBuf>);

/// Formats a byte count the way `pmovmm --pmem FILE,SIZE` and `--memory` take it.
pub fn format_size(bytes: u64) -> String {
    const K: u64 = 1024;
    if bytes != 0 && bytes.is_multiple_of(K * K * K) {
        format!("{}G", bytes / (K * K * K))
    } else if bytes != 0 && bytes.is_multiple_of(K * K) {
        format!("{}M", bytes / (K * K))
    } else if bytes != 0 && bytes.is_multiple_of(K) {
        format!("{}K", bytes / K)
    } else {
        bytes.to_string()
    }
}

/// Appends `--pmo-anchor PATH` if there is an anchor (`PATH` as the VMM sees it).
pub(crate) fn push_anchor(args: &mut Vec<String>, anchor: Option<&Path>) {
    if let Some(a) = anchor {
        args.push("--pmo-anchor".to_string());
        args.push(a.display().to_string());
    }
}

/// The `pmovmm` arguments for one VM, given where kernel, initrd and pmem files are as the
/// VMM sees them (host paths in direct mode, paths inside the test host when nested).
pub(crate) fn vmm_args(
    spec: &VmSpec,
    kernel: &Path,
    initrd: &Path,
    pmem: &[PathBuf],
    pmo_store: Option<&Path>,
    master_key: Option<&Path>,
    cxl: &[CxlPaths],
) -> Vec<String> {
    let mut args = vec![
        "run".to_string(),
        "--kernel".to_string(),
        kernel.display().to_string(),
        "--initrd".to_string(),
        initrd.display().to_string(),
        "--cmdline".to_string(),
        spec.kernel_cmdline(),
        "--memory".to_string(),
        format_size(spec.memory_mib * 1024 * 1024),
        "--cpus".to_string(),
        spec.cpus.to_string(),
    ];
    for (p, dev) in pmem.iter().zip(&spec.pmem) {
        args.push("--pmem".to_string());
        match dev.size {
            Some(size) => args.push(format!("{},{}", p.display(), format_size(size))),
            None => args.push(p.display().to_string()),
        }
    }
    if let Some(store) = pmo_store {
        // Formatted before the run (see `ensure_backing_files`), so no size here.
        args.push("--pmo-store".to_string());
        args.push(store.display().to_string());
        // Argon2id at its default cost (64 MiB, 3 passes) takes seconds per attach in the
        // nested software-emulated test host; the tests attach hundreds of times.
        args.push("--pmo-kdf".to_string());
        args.push(VM_TEST_KDF.to_string());
    }
    if let (Some((id, _)), Some(key)) = (&spec.pmo_on_cxl, master_key) {
        args.push("--pmo-store".to_string());
        args.push(format!("cxl={id}"));
        args.push("--pmo-master-key".to_string());
        args.push(key.display().to_string());
        args.push("--pmo-kdf".to_string());
        args.push(VM_TEST_KDF.to_string());
    }
    for ((media, lsa, key), dev) in cxl.iter().zip(&spec.cxl) {
        let mut opt = format!(
            "media={},size={},lsa={}",
            media.display(),
            format_size(dev.size),
            lsa.display()
        );
        if let Some(k) = key {
            opt += &format!(",key={}", k.display());
        }
        if !dev.options.is_empty() {
            opt += ",";
            opt += &dev.options;
        }
        args.push("--cxl-t3".to_string());
        args.push(opt);
    }
    args.push("--console".to_string());
    args.push("stdout".to_string());
    args.extend(spec.extra_args.iter().cloned());
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_use_the_largest_exact_unit() {
        assert_eq!(format_size(64 << 20), "64M");
        assert_eq!(format_size(1 << 30), "1G");
        assert_eq!(format_size(1536 << 20), "1536M");
        assert_eq!(format_size(4096), "4K");
        assert_eq!(format_size(1000), "1000");
        assert_eq!(format_size(0), "0");
    }

    #[test]
    fn cmdline_and_args() {
        let spec = VmSpec::new("t")
            .verbose_console(true)
            .cpus(2)
            .scenarios(["boot_info", "pmem_write"])
            .param("pattern", "abc")
            .cmdline("quiet")
            .pmem("/x/p.img", Some(64 << 20))
            .pmem("/x/q.img", None);
        assert_eq!(
            spec.kernel_cmdline(),
            "console=ttyS0 panic=-1 pmotest=boot_info,pmem_write pmotest.pattern=abc quiet"
        );
        assert!(VmSpec::new("q")
            .verbose_console(false)
            .kernel_cmdline()
            .ends_with("pmotest= quiet"));
        let args = vmm_args(
            &spec,
            Path::new("/k"),
            Path::new("/i"),
            &[PathBuf::from("/a"), PathBuf::from("/b")],
            Some(Path::new("/s")),
            None,
            &[],
        );
        let joined = args.join("|");
        assert!(joined.contains("|--pmo-store|/s|"));
        assert!(joined.starts_with("run|--kernel|/k|--initrd|/i|--cmdline|console=ttyS0 "));
        assert!(joined.contains(
            "|--memory|1G|--cpus|2|--pmem|/a,64M|--pmem|/b|--pmo-store|/s|--pmo-kdf|m=256K,t=1|--console|stdout"
        ));
    }

    #[test]
    fn validation_rejects_spaces() {
        assert!(VmSpec::new("t").param("p", "a b").validate().is_err());
        assert!(VmSpec::new("t").scenarios(["a,b"]).validate().is_err());
        assert!(VmSpec::new("t").cpus(0).validate().is_err());
        assert!(VmSpec::new("t").scenarios(["boot_info"]).validate().is_ok());
    }

    #[test]
    fn signals_follow_a_guest_check() {
        let on = VmSpec::new("t").kill_on("cxl_hold.holding");
        assert!(on.validate().is_ok());
        let s = on.signal_on.as_ref().unwrap();
        assert_eq!(
            (s.signal.name(), s.needle().as_str()),
            ("KILL", "PMOTEST cxl_hold.holding ok")
        );
        assert_eq!(
            VmSpec::new("t").term_on("a.b").signal_on.unwrap().signal,
            VmSignal::Term
        );
        for bad in ["holding", ".x", "a.", "a.b c", "a.b'", "a.b;kill"] {
            assert!(VmSpec::new("t").term_on(bad).validate().is_err(), "{bad}");
        }
        let both = VmSpec::new("t")
            .term_on("a.b")
            .term_after(Duration::from_secs(5));
        assert!(both.validate().is_err());
    }
}
