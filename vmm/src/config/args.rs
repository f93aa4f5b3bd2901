//! The VM as written: flags and the `--config` file, and which of them a setting comes from.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::error::file_error;
use super::ConfigError;

/// The VM as written: the flags of `pmovmm run`, and the same fields in a `--config` TOML
/// file. Every field is optional here because it may come from the other source;
/// [`VmConfig::from_args`](super::VmConfig::from_args) decides what is missing and validates.
#[derive(Debug, Default, Clone, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunArgs {
    /// Linux kernel to boot (bzImage, 64-bit boot protocol).
    #[arg(long, value_name = "FILE")]
    pub kernel: Option<PathBuf>,
    /// Initramfs to load next to the kernel.
    #[arg(long, value_name = "FILE")]
    pub initrd: Option<PathBuf>,
    /// Kernel command line [default: "console=ttyS0 panic=-1"].
    #[arg(long, value_name = "STRING", allow_hyphen_values = true)]
    pub cmdline: Option<String>,
    /// Guest RAM, bytes or with a K/M/G suffix, a multiple of 2M [default: 512M].
    #[arg(long, value_name = "SIZE")]
    #[serde(deserialize_with = "string_or_integer")]
    pub memory: Option<String>,
    /// Number of vCPUs, 1 to 64 [default: 1].
    #[arg(long, value_name = "N")]
    #[serde(deserialize_with = "string_or_integer")]
    pub cpus: Option<String>,
    /// virtio-pmem device backed by FILE (created with SIZE if missing);
    /// repeat for more devices.
    #[arg(long, value_name = "FILE[,SIZE]")]
    pub pmem: Vec<String>,
    /// CXL Type 3 memory expander with persistent media in FILE (created
    /// with SIZE, a multiple of 256M, if missing); repeat for more devices.
    /// lsa: label storage file [default: MEDIA.lsa]; cache: device DRAM
    /// cache [default: 64M]; ways: its associativity [default: 8]; latency:
    /// media latency in ns per miss or write-back [default: 25000]; key:
    /// file with a TEE range key for the whole device; serial: the device's serial number
    /// (decimal or 0x hex) [default: derived from the media path]; id: a name for
    /// `--pmo-store cxl=NAME`; guest=off: the VMM keeps the device (no PCI function).
    #[arg(
        long = "cxl-t3",
        value_name = "media=FILE,size=SIZE[,lsa=FILE][,cache=SIZE][,ways=N][,latency=NS][,key=FILE][,serial=N][,id=NAME][,guest=on|off]"
    )]
    pub cxl_t3: Vec<String>,
    /// Where the guest's serial console goes [default: stdout].
    #[arg(long, value_name = "FILE|stdout")]
    pub console: Option<String>,
    /// PMO store file served to the guest through the virtio-pmo device
    /// (created and formatted with SIZE if missing), or `cxl=NAME`: on the media of the
    /// `--cxl-t3 id=NAME,guest=off` expander (formatted when the media file is new), each PMO
    /// extent under its own TEE range key (cipher: xts-256 [default] or xts-128).
    #[arg(long, value_name = "FILE[,SIZE]|cxl=NAME[,cipher=xts-128|xts-256]")]
    pub pmo_store: Option<String>,
    /// PMO design for attach sessions: wedi, bp-ip, bp-id, sp-ip, sp-id, d; with a store on an
    /// expander also cl, c and cf (LPMO's CXL designs)
    /// [default: each PMO's own].
    #[arg(long, value_name = "NAME")]
    pub pmo_design: Option<String>,
    /// Size of the PMO window (guest-visible space for attached PMOs) [default: 1G].
    #[arg(long, value_name = "SIZE")]
    #[serde(deserialize_with = "string_or_integer")]
    pub pmo_window: Option<String>,
    /// Prefetch predictor for PMO pages: none, stream[:N], stride[:N], markov[:N], adaptive[:MAX].
    #[arg(long, value_name = "NAME")]
    pub pmo_predictor: Option<String>,
    /// Argon2id cost of PMOs the guest creates: m=SIZE,t=PASSES,p=LANES [default:
    /// m=64M,t=3,p=1]; `fast` is the cheapest (for tests, no protection against offline
    /// guessing). Each PMO keeps its own cost in its record.
    #[arg(long, value_name = "m=SIZE,t=N,p=N|fast")]
    pub pmo_kdf: Option<String>,
    /// Rollback anchor of the PMO store, kept outside it: a store older than its anchor is
    /// refused; the file is created from the store when missing.
    #[arg(long, value_name = "FILE")]
    pub pmo_anchor: Option<PathBuf>,
    /// File holding the VMM's master key (32 or 64 bytes) for a PMO store on an expander
    /// (`--pmo-store cxl=NAME`): each PMO's extent gets a TEE range key derived from it. The
    /// key itself is never on the command line and never logged.
    #[arg(long, value_name = "FILE")]
    pub pmo_master_key: Option<PathBuf>,
    /// Local-DRAM budget for PMO plaintext across all attachments, for a store on an
    /// expander: above it, cold pages are demoted to the CXL tier (clean ones dropped, dirty
    /// ones sealed into the expander's device memory) and promoted back on access. policy:
    /// hotness [default] or fifo.
    #[arg(long, value_name = "SIZE[,policy=hotness|fifo]")]
    pub pmo_dram: Option<String>,
    /// The sandbox's seccomp filters, one per thread kind: on (a forbidden system call
    /// kills the VMM with SIGSYS), log (it is logged to the kernel's audit log and allowed;
    /// for debugging), off [default: on]. See docs/sandbox.md.
    #[arg(long, value_name = "on|log|off")]
    pub seccomp: Option<String>,
    /// Landlock: once the machine is built the VMM may open only its configured device files;
    /// require: refuse to run on a kernel without Landlock (on warns and runs) [default: on].
    #[arg(long, value_name = "on|require|off")]
    pub landlock: Option<String>,
    /// Test hook: the VMM kills itself at this persist point of a psync (crash tests).
    #[arg(long, value_name = "N", hide = true)]
    #[serde(skip)]
    pub pmo_test_kill_in_psync: Option<u64>,
    /// TOML file with the same fields; flags given here override it.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// Sizes and counts in the file may be strings (`"1G"`) or integers (bytes, CPUs).
fn string_or_integer<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct StringOrInteger;
    impl Visitor<'_> for StringOrInteger {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or an integer")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
    }
    d.deserialize_any(StringOrInteger)
}

/// Where each setting comes from: a flag wins over the file; relative paths in the file are
/// relative to the file's directory, those on the command line to the working directory.
pub(super) struct Sources<'a> {
    flags: &'a RunArgs,
    file: Option<(RunArgs, PathBuf)>,
}

impl<'a> Sources<'a> {
    /// The flags, and the file they name with `--config` (read and parsed here).
    pub(super) fn read(flags: &'a RunArgs) -> Result<Self, ConfigError> {
        let file = match &flags.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| file_error("config file", path, &e))?;
                let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
                Some((parse_toml(&text, path)?, dir))
            }
            None => None,
        };
        Ok(Sources { flags, file })
    }

    /// The winning value of one setting, with the directory its relative paths start from.
    pub(super) fn pick<T: ?Sized>(
        &self,
        get: impl Fn(&RunArgs) -> Option<&T>,
    ) -> Option<(&T, &Path)> {
        if let Some(v) = get(self.flags) {
            return Some((v, Path::new("")));
        }
        let (file, dir) = self.file.as_ref()?;
        get(file).map(|v| (v, dir.as_path()))
    }

    /// A repeatable setting: the flags' list replaces the file's as a whole, never appends.
    pub(super) fn pick_list(&self, get: impl Fn(&RunArgs) -> &[String]) -> (&[String], &Path) {
        match &self.file {
            Some((file, dir)) if get(self.flags).is_empty() => (get(file), dir.as_path()),
            _ => (get(self.flags), Path::new("")),
        }
    }

    /// Test hooks exist only on the command line.
    pub(super) fn flags(&self) -> &RunArgs {
        self.flags
    }
}

/// Parses the TOML `text` of the file at `path`; errors name the line.
fn parse_toml(text: &str, path: &Path) -> Result<RunArgs, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let reason = e.message().trim_end().replace('\n', "; ");
        let reason = match e.span() {
            Some(span) => {
                let before = &text.as_bytes()[..span.start.min(text.len())];
                let line = 1 + before.iter().filter(|b| **b == b'\n').count();
                format!("line {line}: {reason}")
            }
            None => reason,
        };
        ConfigError::ConfigFile {
            path: path.to_path_buf(),
            reason,
        }
    })
}
