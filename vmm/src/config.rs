//! Configuration of `pmovmm run`.
//!
//! The VM is described either by command-line flags ([`RunArgs`]) or by a
//! TOML file with the same field names (`--config vm.toml`); flags given on
//! the command line override the file. [`VmConfig::from_args`] merges both
//! and validates the result against the guest address map, so the rest of
//! the VMM only ever sees a configuration that can boot.
//!
//! ```toml
//! kernel = "bzImage"                 # relative paths: relative to this file
//! initrd = "initrd.gz"
//! cmdline = "console=ttyS0 panic=-1"
//! memory = "1G"                      # or a number of bytes
//! cpus = 2
//! pmem = ["pmem0.img,256M", "pmem1.img"]
//! cxl_t3 = ["media=cxl0.img,size=1G,cache=64M"]
//! console = "stdout"                 # or a file
//! ```
//!
//! Sizes are bytes with an optional binary K, M or G suffix ([`parse_size`]).
//! Device options use one small syntax, `value[,value][,key=value]...`
//! ([`OptionList`]), so later options (`--pmo-store FILE[,SIZE]`,
//! `--cxl-t3 media=FILE,size=SIZE,...`) parse the same way `--pmem` does.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use pmo_store::crypto::KdfParams;
use serde::Deserialize;

use crate::layout;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Guest RAM is mapped with 2 MiB granularity (huge-page friendly, and the
/// boot page tables identity-map with 2 MiB pages).
pub const MEMORY_ALIGN: u64 = 2 * MIB;
/// Below this the Debian kernel and its initramfs do not boot reliably.
pub const MIN_MEMORY: u64 = 64 * MIB;
/// All the RAM the guest address map holds: the low part below the PCI hole
/// plus the high part up to the device-memory range.
pub const MAX_MEMORY: u64 =
    layout::RAM_LOW_END + (layout::DEVICE_MEM_START - layout::RAM_HIGH_START);
/// APIC IDs in the MADT are bytes; 64 is plenty and keeps xAPIC mode.
pub const MAX_CPUS: u8 = 64;
/// virtio-pmem regions are mapped into the guest in 2 MiB units.
pub const PMEM_ALIGN: u64 = 2 * MIB;

/// Used when neither the flags nor the file set them.
pub const DEFAULT_MEMORY: u64 = 512 * MIB;
pub const DEFAULT_CPUS: u8 = 1;
/// Serial console on ttyS0, and a panic ends the VM instead of hanging it.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 panic=-1";

/// Why a configuration was rejected; each message is one line that names
/// the offending value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no kernel given: use --kernel FILE or `kernel` in the config file")]
    MissingKernel,
    /// A file that cannot be used; `what` says which ("kernel file", ...).
    #[error("{what} {}: {reason}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The TOML file does not parse or has unknown or mistyped fields.
    #[error("config file {}: {reason}", path.display())]
    ConfigFile { path: PathBuf, reason: String },
    #[error("invalid size \"{0}\": expected a number with an optional K, M or G suffix")]
    InvalidSize(String),
    #[error("invalid size \"{0}\": more than 2^64 bytes")]
    SizeOverflow(String),
    /// A device option string (`--pmem` ...) that does not parse.
    #[error("invalid {option} \"{text}\": {reason}")]
    InvalidOption {
        option: &'static str,
        text: String,
        reason: String,
    },
    #[error("memory {0}: must be a multiple of 2M")]
    MemoryNotAligned(ByteSize),
    #[error("memory {0}: must be at least {min}", min = ByteSize(MIN_MEMORY))]
    MemoryTooSmall(ByteSize),
    #[error("memory {0}: must be at most {max} (the guest address map)", max = ByteSize(MAX_MEMORY))]
    MemoryTooLarge(ByteSize),
    #[error("cpus \"{0}\": expected a number from 1 to {MAX_CPUS}")]
    InvalidCpus(String),
    #[error("kernel command line is {0} bytes: must be shorter than {max}", max = layout::CMDLINE_MAX_SIZE)]
    CmdlineTooLong(usize),
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    #[error("pmem {}: size {size} is not a multiple of 2M", path.display())]
    PmemNotAligned { path: PathBuf, size: ByteSize },
    #[error("pmem {}: size must not be zero", path.display())]
    PmemZero { path: PathBuf },
    #[error("pmem {}: the file holds {file} but {size} was given", path.display())]
    PmemSizeMismatch {
        path: PathBuf,
        file: ByteSize,
        size: ByteSize,
    },
    #[error("pmem {}: the file does not exist or is empty, give its size as FILE,SIZE", path.display())]
    PmemNeedsSize { path: PathBuf },
    #[error("pmem {}: given twice", path.display())]
    PmemDuplicate { path: PathBuf },
    #[error("pmem devices total {0}: more than the {max} of device memory", max = ByteSize(layout::DEVICE_MEM_SIZE))]
    PmemTooLarge(ByteSize),
    #[error("cxl-t3 media {}: given twice", path.display())]
    CxlDuplicate { path: PathBuf },
    #[error("more than {MAX_CXL_T3} --cxl-t3 devices")]
    CxlTooMany,
    #[error("console \"{0}\": expected a file name or stdout")]
    InvalidConsole(String),
    #[error(
        "--pmo-design, --pmo-window, --pmo-predictor, --pmo-kdf and --pmo-anchor need --pmo-store"
    )]
    PmoWithoutStore,
    #[error("--pmo-kdf: {0}")]
    PmoKdf(String),
    #[error("PMO store {path}: does not exist; give its size to create it (FILE,SIZE)")]
    PmoStoreSize { path: PathBuf },
    #[error("PMO window {0}: must be a non-zero multiple of 2M, at most 64G")]
    PmoWindow(ByteSize),
}

/// A byte count shown the way sizes are written on the command line
/// (`2G`, `3M`, `4097`), so error messages echo the user's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match n {
            0 => write!(f, "0"),
            _ if n.is_multiple_of(GIB) => write!(f, "{}G", n / GIB),
            _ if n.is_multiple_of(MIB) => write!(f, "{}M", n / MIB),
            _ if n.is_multiple_of(KIB) => write!(f, "{}K", n / KIB),
            _ => write!(f, "{n}"),
        }
    }
}

/// Parses a size: decimal bytes with an optional binary suffix `K`, `M` or
/// `G` (either case), e.g. `4096`, `64M`, `1G`.
pub fn parse_size(text: &str) -> Result<u64, ConfigError> {
    let (digits, shift) = match text.as_bytes().last() {
        Some(b'k' | b'K') => (&text[..text.len() - 1], 10),
        Some(b'm' | b'M') => (&text[..text.len() - 1], 20),
        Some(b'g' | b'G') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConfigError::InvalidSize(text.to_string()));
    }
    let overflow = || ConfigError::SizeOverflow(text.to_string());
    let n: u64 = digits.parse().map_err(|_| overflow())?;
    n.checked_mul(1 << shift).ok_or_else(overflow)
}

/// A parsed device option string `value[,value...][,key=value...]`.
///
/// Each option declares its keys; the first `positional` of them may also
/// be given without `key=`, in order and before any `key=value`. So
/// `--pmem img,1G` and `--pmem path=img,size=1G` mean the same, and a
/// later `--cxl-t3 media=FILE,size=SIZE,ways=2` needs no parser of its own.
/// Values cannot contain commas; a positional value containing `=` must be
/// written as `key=value`.
#[derive(Debug)]
pub struct OptionList<'a> {
    option: &'static str,
    text: &'a str,
    values: BTreeMap<&'static str, &'a str>,
}

impl<'a> OptionList<'a> {
    /// Splits `text`, the value of option `option` (used in messages), into
    /// the declared `keys`.
    pub fn parse(
        option: &'static str,
        text: &'a str,
        keys: &[&'static str],
        positional: usize,
    ) -> Result<Self, ConfigError> {
        let mut list = OptionList {
            option,
            text,
            values: BTreeMap::new(),
        };
        let mut next_positional = 0;
        let mut named_seen = false;
        for item in text.split(',') {
            if item.is_empty() {
                return Err(list.error("empty item".to_string()));
            }
            let (key, value) = match item.split_once('=') {
                Some((key, value)) => {
                    named_seen = true;
                    let Some(key) = keys.iter().copied().find(|k| *k == key) else {
                        return Err(list.error(format!(
                            "unknown key \"{key}\" (expected {})",
                            keys.join(", ")
                        )));
                    };
                    (key, value)
                }
                None if named_seen => {
                    return Err(list.error(format!("\"{item}\" must be written as key=value")));
                }
                None if next_positional < positional.min(keys.len()) => {
                    next_positional += 1;
                    (keys[next_positional - 1], item)
                }
                None => return Err(list.error(format!("unexpected value \"{item}\""))),
            };
            if value.is_empty() {
                return Err(list.error(format!("empty value for {key}")));
            }
            if list.values.insert(key, value).is_some() {
                return Err(list.error(format!("{key} given twice")));
            }
        }
        Ok(list)
    }

    /// The value of `key`, if given.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.values.get(key).copied()
    }

    /// The value of `key`, which the option cannot do without.
    pub fn required(&self, key: &str) -> Result<&'a str, ConfigError> {
        self.get(key)
            .ok_or_else(|| self.error(format!("missing {key}")))
    }

    /// The value of `key` as a size ([`parse_size`]).
    pub fn size(&self, key: &str) -> Result<Option<u64>, ConfigError> {
        self.get(key)
            .map(|v| parse_size(v).map_err(|e| self.error(e.to_string())))
            .transpose()
    }

    /// An error about this option string, for checks done by the caller.
    pub fn error(&self, reason: String) -> ConfigError {
        ConfigError::InvalidOption {
            option: self.option,
            text: self.text.to_string(),
            reason,
        }
    }
}

/// Flags of `pmovmm run`. Every field is optional here because it may come
/// from `--config`; [`VmConfig::from_args`] decides what is missing.
#[derive(Debug, Default, Clone, clap::Args)]
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
    pub memory: Option<String>,
    /// Number of vCPUs, 1 to 64 [default: 1].
    #[arg(long, value_name = "N")]
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
    /// (decimal or 0x hex) [default: derived from the media path].
    #[arg(
        long = "cxl-t3",
        value_name = "media=FILE,size=SIZE[,lsa=FILE][,cache=SIZE][,ways=N][,latency=NS][,key=FILE][,serial=N]"
    )]
    pub cxl_t3: Vec<String>,
    /// Where the guest's serial console goes [default: stdout].
    #[arg(long, value_name = "FILE|stdout")]
    pub console: Option<String>,
    /// PMO store file served to the guest through the virtio-pmo device
    /// (created and formatted with SIZE if missing).
    #[arg(long, value_name = "FILE[,SIZE]")]
    pub pmo_store: Option<String>,
    /// PMO design for attach sessions: wedi, bp-ip, bp-id, sp-ip, sp-id, d
    /// [default: each PMO's own].
    #[arg(long, value_name = "NAME")]
    pub pmo_design: Option<String>,
    /// Size of the PMO window (guest-visible space for attached PMOs) [default: 1G].
    #[arg(long, value_name = "SIZE")]
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
    /// Test hook: the VMM kills itself at this persist point of a psync (crash tests).
    #[arg(long, value_name = "N", hide = true)]
    pub pmo_test_kill_in_psync: Option<u64>,
    /// TOML file with the same fields; flags given here override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// A validated VM description: every file checked, every size within the
/// guest address map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// bzImage; exists and is a readable regular file.
    pub kernel: PathBuf,
    /// Initramfs; exists and is a readable regular file when given.
    pub initrd: Option<PathBuf>,
    /// Shorter than `layout::CMDLINE_MAX_SIZE` and free of NUL bytes.
    pub cmdline: String,
    /// Guest RAM in bytes: a 2 MiB multiple in `MIN_MEMORY..=MAX_MEMORY`
    /// (see `layout::ram_regions` for where it goes).
    pub memory: u64,
    /// vCPUs, `1..=MAX_CPUS`; vCPU `i` has APIC ID `i`.
    pub cpus: u8,
    /// virtio-pmem devices in command-line order; their sizes sum to at
    /// most `layout::DEVICE_MEM_SIZE`.
    pub pmem: Vec<PmemConfig>,
    pub console: ConsoleOutput,
    /// The PMO device, when a store is given.
    pub pmo: Option<PmoConfig>,
    /// CXL Type 3 memory expanders, in command-line order.
    pub cxl_t3: Vec<CxlT3Config>,
}

/// One CXL Type 3 memory expander.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CxlT3Config {
    /// Persistent media file; created with `size` bytes when missing.
    pub media: PathBuf,
    /// Capacity: a non-zero multiple of [`CXL_ALIGN`].
    pub size: u64,
    /// Label storage area file.
    pub lsa: PathBuf,
    /// Device DRAM cache in bytes: a non-zero multiple of 4 KiB.
    pub cache: u64,
    /// Cache associativity, `1..=MAX_CXL_WAYS`.
    pub ways: usize,
    /// Media latency charged per miss and per write-back.
    pub latency_ns: u64,
    /// File holding a TEE range key programmed over the whole device.
    pub key: Option<PathBuf>,
    /// Device serial number; `None`: derived from the media path.
    pub serial: Option<u64>,
}

/// CXL decoders and memory windows work in 256 MiB units.
pub const CXL_ALIGN: u64 = 256 * MIB;
pub const DEFAULT_CXL_CACHE: u64 = 64 * MIB;
pub const DEFAULT_CXL_WAYS: usize = 8;
pub const MAX_CXL_WAYS: usize = 64;
/// NAND-like: tens of microseconds per media access.
pub const DEFAULT_CXL_LATENCY_NS: u64 = 25_000;
/// One host bridge per device; the layout has room for this many.
pub const MAX_CXL_T3: usize = layout::CXL_MAX_HOST_BRIDGES;

/// The PMO device's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmoConfig {
    /// Store file; created with `store_size` when it does not exist.
    pub store: PathBuf,
    pub store_size: Option<u64>,
    /// Design override for attach sessions (validated by the device).
    pub design: Option<String>,
    /// Window size: a page multiple, at most `MAX_PMO_WINDOW`.
    pub window: u64,
    /// Test hook (`--pmo-test-kill-in-psync`), command line only.
    pub test_kill_in_psync: Option<u64>,
    /// Predictor spec (validated by the device), command line only.
    pub predictor: Option<String>,
    /// Argon2id cost of PMOs created by the guest.
    pub kdf: KdfParams,
    /// Rollback anchor file.
    pub anchor: Option<PathBuf>,
}

/// Default PMO window: room for a few large PMOs attached at once; it is
/// reserved address space, not memory, until pages are touched.
pub const DEFAULT_PMO_WINDOW: u64 = 1 << 30;
/// Largest PMO window: a quarter of the 64-bit MMIO window.
pub const MAX_PMO_WINDOW: u64 = layout::MMIO64_SIZE / 4;

/// One virtio-pmem device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmemConfig {
    /// Backing file. It may not exist yet (or be empty): then the device
    /// creates it with `size` bytes. Otherwise it already holds exactly
    /// `size` bytes, so opening it never truncates or pads user data.
    pub path: PathBuf,
    /// Size of the region the guest sees; a non-zero multiple of 2 MiB.
    pub size: u64,
}

/// Where the guest's serial output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleOutput {
    Stdout,
    /// A log file, truncated when the VM starts.
    File(PathBuf),
}

/// The TOML file: the same fields as the flags. Sizes and the CPU count
/// may be strings or integers, so they are taken as raw values.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
    cmdline: Option<String>,
    memory: Option<toml::Value>,
    cpus: Option<toml::Value>,
    pmem: Option<Vec<String>>,
    console: Option<String>,
    pmo_store: Option<String>,
    pmo_design: Option<String>,
    pmo_window: Option<toml::Value>,
    pmo_kdf: Option<String>,
    pmo_anchor: Option<PathBuf>,
    cxl_t3: Option<Vec<String>>,
}

/// A pmem device as written, before its file is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PmemSpec {
    path: PathBuf,
    size: Option<u64>,
}

/// One source of settings (the file or the flags), paths already resolved.
#[derive(Debug, Default)]
struct Settings {
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
    cmdline: Option<String>,
    memory: Option<String>,
    cpus: Option<String>,
    pmem: Option<Vec<PmemSpec>>,
    console: Option<ConsoleOutput>,
    pmo_store: Option<PmemSpec>,
    pmo_design: Option<String>,
    pmo_window: Option<String>,
    pmo_kdf: Option<String>,
    pmo_anchor: Option<PathBuf>,
    cxl_t3: Option<Vec<CxlT3Config>>,
}

impl Settings {
    fn from_args(args: &RunArgs) -> Result<Self, ConfigError> {
        let here = Path::new("");
        Ok(Settings {
            kernel: args.kernel.clone(),
            initrd: args.initrd.clone(),
            cmdline: args.cmdline.clone(),
            memory: args.memory.clone(),
            cpus: args.cpus.clone(),
            pmem: match args.pmem.as_slice() {
                [] => None,
                specs => Some(
                    specs
                        .iter()
                        .map(|s| parse_pmem(s, here))
                        .collect::<Result<_, _>>()?,
                ),
            },
            console: args
                .console
                .as_deref()
                .map(|c| parse_console(c, here))
                .transpose()?,
            pmo_store: args
                .pmo_store
                .as_deref()
                .map(|s| parse_store(s, here))
                .transpose()?,
            pmo_design: args.pmo_design.clone(),
            pmo_window: args.pmo_window.clone(),
            pmo_kdf: args.pmo_kdf.clone(),
            pmo_anchor: args.pmo_anchor.clone(),
            cxl_t3: match args.cxl_t3.as_slice() {
                [] => None,
                specs => Some(
                    specs
                        .iter()
                        .map(|s| parse_cxl_t3(s, here))
                        .collect::<Result<_, _>>()?,
                ),
            },
        })
    }

    /// Parses the TOML `text` of the file at `path`; relative paths in it
    /// are taken relative to the file's directory.
    fn from_toml(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file_error = |reason: String| ConfigError::ConfigFile {
            path: path.to_path_buf(),
            reason,
        };
        let file: FileConfig = toml::from_str(text).map_err(|e| {
            let reason = e.message().trim_end().replace('\n', "; ");
            match e.span() {
                Some(span) => {
                    let before = &text.as_bytes()[..span.start.min(text.len())];
                    let line = 1 + before.iter().filter(|b| **b == b'\n').count();
                    file_error(format!("line {line}: {reason}"))
                }
                None => file_error(reason),
            }
        })?;
        let scalar = |key: &str, value: toml::Value| match value {
            toml::Value::String(s) => Ok(s),
            toml::Value::Integer(n) => Ok(n.to_string()),
            other => Err(file_error(format!(
                "{key}: expected a string or an integer, found {}",
                other.type_str()
            ))),
        };
        let base = path.parent().unwrap_or(Path::new(""));
        Ok(Settings {
            kernel: file.kernel.map(|p| base.join(p)),
            initrd: file.initrd.map(|p| base.join(p)),
            cmdline: file.cmdline,
            memory: file.memory.map(|v| scalar("memory", v)).transpose()?,
            cpus: file.cpus.map(|v| scalar("cpus", v)).transpose()?,
            pmem: file
                .pmem
                .map(|specs| specs.iter().map(|s| parse_pmem(s, base)).collect())
                .transpose()?,
            console: file
                .console
                .as_deref()
                .map(|c| parse_console(c, base))
                .transpose()?,
            pmo_store: file
                .pmo_store
                .as_deref()
                .map(|s| parse_store(s, base))
                .transpose()?,
            pmo_design: file.pmo_design,
            pmo_window: file
                .pmo_window
                .map(|v| scalar("pmo_window", v))
                .transpose()?,
            pmo_kdf: file.pmo_kdf,
            pmo_anchor: file.pmo_anchor.map(|p| base.join(p)),
            cxl_t3: file
                .cxl_t3
                .map(|specs| specs.iter().map(|s| parse_cxl_t3(s, base)).collect())
                .transpose()?,
        })
    }

    /// `self` with every setting that `over` has replaced by its value; a
    /// list (`pmem`) is replaced as a whole, not appended to.
    fn overridden_by(self, over: Settings) -> Settings {
        Settings {
            kernel: over.kernel.or(self.kernel),
            initrd: over.initrd.or(self.initrd),
            cmdline: over.cmdline.or(self.cmdline),
            memory: over.memory.or(self.memory),
            cpus: over.cpus.or(self.cpus),
            pmem: over.pmem.or(self.pmem),
            console: over.console.or(self.console),
            pmo_store: over.pmo_store.or(self.pmo_store),
            pmo_design: over.pmo_design.or(self.pmo_design),
            pmo_window: over.pmo_window.or(self.pmo_window),
            pmo_kdf: over.pmo_kdf.or(self.pmo_kdf),
            pmo_anchor: over.pmo_anchor.or(self.pmo_anchor),
            cxl_t3: over.cxl_t3.or(self.cxl_t3),
        }
    }
}

fn parse_pmem(text: &str, base: &Path) -> Result<PmemSpec, ConfigError> {
    let opts = OptionList::parse("pmem", text, &["path", "size"], 2)?;
    Ok(PmemSpec {
        path: base.join(opts.required("path")?),
        size: opts.size("size")?,
    })
}

fn parse_store(text: &str, base: &Path) -> Result<PmemSpec, ConfigError> {
    let opts = OptionList::parse("pmo-store", text, &["path", "size"], 2)?;
    Ok(PmemSpec {
        path: base.join(opts.required("path")?),
        size: opts.size("size")?,
    })
}

/// Parses `--cxl-t3`; every value is checked here, the files in `validate`.
fn parse_cxl_t3(text: &str, base: &Path) -> Result<CxlT3Config, ConfigError> {
    let opts = OptionList::parse(
        "cxl-t3",
        text,
        &[
            "media", "size", "lsa", "cache", "ways", "latency", "key", "serial",
        ],
        0,
    )?;
    let media = base.join(opts.required("media")?);
    let size = opts
        .size("size")?
        .ok_or_else(|| opts.error("missing size".into()))?;
    if size == 0 || !size.is_multiple_of(CXL_ALIGN) {
        return Err(opts.error(format!(
            "size {} is not a non-zero multiple of 256M",
            ByteSize(size)
        )));
    }
    let cache = opts.size("cache")?.unwrap_or(DEFAULT_CXL_CACHE);
    if cache == 0 || !cache.is_multiple_of(4 * KIB) {
        return Err(opts.error(format!(
            "cache {} is not a non-zero multiple of 4K",
            ByteSize(cache)
        )));
    }
    let ways = match opts.get("ways") {
        Some(w) => w
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_CXL_WAYS).contains(n))
            .ok_or_else(|| {
                opts.error(format!(
                    "ways \"{w}\" is not a number from 1 to {MAX_CXL_WAYS}"
                ))
            })?,
        None => DEFAULT_CXL_WAYS,
    };
    if !(cache / (4 * KIB)).is_multiple_of(ways as u64) {
        return Err(opts.error(format!(
            "cache {} does not divide into {ways} ways of 4K blocks",
            ByteSize(cache)
        )));
    }
    let latency_ns = match opts.get("latency") {
        Some(l) => l
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= 1_000_000_000)
            .ok_or_else(|| opts.error(format!("latency \"{l}\" is not a number of ns up to 1s")))?,
        None => DEFAULT_CXL_LATENCY_NS,
    };
    let lsa = match opts.get("lsa") {
        Some(l) => base.join(l),
        None => {
            let mut name = media.clone().into_os_string();
            name.push(".lsa");
            PathBuf::from(name)
        }
    };
    let serial = match opts.get("serial") {
        Some(v) => {
            let n = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse::<u64>().ok(),
            };
            Some(n.ok_or_else(|| opts.error(format!("serial \"{v}\" is not a 64-bit number")))?)
        }
        None => None,
    };
    Ok(CxlT3Config {
        media,
        size,
        lsa,
        cache,
        ways,
        latency_ns,
        key: opts.get("key").map(|k| base.join(k)),
        serial,
    })
}

fn parse_console(text: &str, base: &Path) -> Result<ConsoleOutput, ConfigError> {
    match text {
        "" => Err(ConfigError::InvalidConsole(text.to_string())),
        "stdout" => Ok(ConsoleOutput::Stdout),
        path => Ok(ConsoleOutput::File(base.join(path))),
    }
}

impl VmConfig {
    /// Reads `--config` if given, applies the flags over it, fills in the
    /// defaults and validates everything. Creates no files.
    pub fn from_args(args: &RunArgs) -> Result<VmConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| file_error("config file", path, &e))?;
                Settings::from_toml(&text, path)?
            }
            None => Settings::default(),
        };
        let mut cfg = Self::validate(file.overridden_by(Settings::from_args(args)?))?;
        match &mut cfg.pmo {
            Some(p) => {
                p.test_kill_in_psync = args.pmo_test_kill_in_psync;
                p.predictor = args.pmo_predictor.clone();
            }
            None if args.pmo_predictor.is_some() => return Err(ConfigError::PmoWithoutStore),
            None => {}
        }
        Ok(cfg)
    }

    fn validate(s: Settings) -> Result<VmConfig, ConfigError> {
        let kernel = s.kernel.ok_or(ConfigError::MissingKernel)?;
        check_readable("kernel file", &kernel)?;
        if let Some(initrd) = &s.initrd {
            check_readable("initrd file", initrd)?;
        }

        let cmdline = s.cmdline.unwrap_or_else(|| DEFAULT_CMDLINE.to_string());
        if cmdline.len() >= layout::CMDLINE_MAX_SIZE {
            return Err(ConfigError::CmdlineTooLong(cmdline.len()));
        }
        if cmdline.contains('\0') {
            return Err(ConfigError::CmdlineNul);
        }

        let memory = match &s.memory {
            Some(text) => parse_size(text)?,
            None => DEFAULT_MEMORY,
        };
        if memory < MIN_MEMORY {
            return Err(ConfigError::MemoryTooSmall(ByteSize(memory)));
        }
        if !memory.is_multiple_of(MEMORY_ALIGN) {
            return Err(ConfigError::MemoryNotAligned(ByteSize(memory)));
        }
        if memory > MAX_MEMORY {
            return Err(ConfigError::MemoryTooLarge(ByteSize(memory)));
        }

        let cpus = match &s.cpus {
            Some(text) => text
                .parse::<u8>()
                .ok()
                .filter(|n| (1..=MAX_CPUS).contains(n))
                .ok_or_else(|| ConfigError::InvalidCpus(text.clone()))?,
            None => DEFAULT_CPUS,
        };

        let mut pmem: Vec<PmemConfig> = Vec::new();
        for spec in s.pmem.unwrap_or_default() {
            if pmem.iter().any(|p| p.path == spec.path) {
                return Err(ConfigError::PmemDuplicate { path: spec.path });
            }
            pmem.push(check_pmem(spec)?);
        }
        let total = pmem.iter().map(|p| p.size).sum::<u64>();
        if total > layout::DEVICE_MEM_SIZE {
            return Err(ConfigError::PmemTooLarge(ByteSize(total)));
        }

        let console = s.console.unwrap_or(ConsoleOutput::Stdout);
        if let ConsoleOutput::File(path) = &console {
            check_parent_dir("console file", path)?;
        }

        let pmo = match s.pmo_store {
            None => {
                if s.pmo_design.is_some()
                    || s.pmo_window.is_some()
                    || s.pmo_kdf.is_some()
                    || s.pmo_anchor.is_some()
                {
                    return Err(ConfigError::PmoWithoutStore);
                }
                None
            }
            Some(spec) => {
                if !spec.path.exists() && spec.size.is_none() {
                    return Err(ConfigError::PmoStoreSize { path: spec.path });
                }
                check_parent_dir("PMO store", &spec.path)?;
                let window = match &s.pmo_window {
                    Some(text) => parse_size(text)?,
                    None => DEFAULT_PMO_WINDOW,
                };
                if window == 0 || !window.is_multiple_of(PMEM_ALIGN) || window > MAX_PMO_WINDOW {
                    return Err(ConfigError::PmoWindow(ByteSize(window)));
                }
                let kdf = match &s.pmo_kdf {
                    Some(text) => {
                        KdfParams::parse(text).map_err(|e| ConfigError::PmoKdf(e.to_string()))?
                    }
                    None => KdfParams::DEFAULT,
                };
                if let Some(anchor) = &s.pmo_anchor {
                    check_parent_dir("PMO anchor", anchor)?;
                }
                Some(PmoConfig {
                    store: spec.path,
                    store_size: spec.size,
                    design: s.pmo_design,
                    window,
                    test_kill_in_psync: None,
                    predictor: None,
                    kdf,
                    anchor: s.pmo_anchor,
                })
            }
        };

        let cxl_t3 = s.cxl_t3.unwrap_or_default();
        if cxl_t3.len() > MAX_CXL_T3 {
            return Err(ConfigError::CxlTooMany);
        }
        for (i, d) in cxl_t3.iter().enumerate() {
            if cxl_t3[..i].iter().any(|o| o.media == d.media) {
                return Err(ConfigError::CxlDuplicate {
                    path: d.media.clone(),
                });
            }
            check_parent_dir("cxl-t3 media", &d.media)?;
            check_parent_dir("cxl-t3 LSA", &d.lsa)?;
            if let Some(key) = &d.key {
                check_readable("cxl-t3 key file", key)?;
            }
        }

        Ok(VmConfig {
            kernel,
            initrd: s.initrd,
            cmdline,
            memory,
            cpus,
            pmem,
            console,
            pmo,
            cxl_t3,
        })
    }
}

/// Settles a pmem device's size: the given one for a new (or empty) file,
/// the file's own length otherwise; both must be 2 MiB multiples.
fn check_pmem(spec: PmemSpec) -> Result<PmemConfig, ConfigError> {
    let path = spec.path;
    if let Some(size) = spec.size {
        if size == 0 {
            return Err(ConfigError::PmemZero { path });
        }
        if !size.is_multiple_of(PMEM_ALIGN) {
            return Err(ConfigError::PmemNotAligned {
                path,
                size: ByteSize(size),
            });
        }
    }
    let file_len = match std::fs::metadata(&path) {
        Ok(meta) if !meta.is_file() => {
            return Err(file_error_msg("pmem file", &path, "not a regular file"));
        }
        Ok(meta) => {
            // Read-write access is what the device needs; opening an
            // existing file changes nothing.
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| file_error("pmem file", &path, &e))?;
            meta.len()
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            check_parent_dir("pmem file", &path)?;
            0
        }
        Err(e) => return Err(file_error("pmem file", &path, &e)),
    };
    let size = match (spec.size, file_len) {
        (None, 0) => return Err(ConfigError::PmemNeedsSize { path }),
        (None, len) => len,
        (Some(size), 0) => size,
        (Some(size), len) if size == len => size,
        (Some(size), len) => {
            return Err(ConfigError::PmemSizeMismatch {
                path,
                file: ByteSize(len),
                size: ByteSize(size),
            })
        }
    };
    if !size.is_multiple_of(PMEM_ALIGN) {
        return Err(ConfigError::PmemNotAligned {
            path,
            size: ByteSize(size),
        });
    }
    Ok(PmemConfig { path, size })
}

/// The file exists, is a regular file and can be opened for reading.
fn check_readable(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    let file = File::open(path).map_err(|e| file_error(what, path, &e))?;
    let meta = file.metadata().map_err(|e| file_error(what, path, &e))?;
    if !meta.is_file() {
        return Err(file_error_msg(what, path, "not a regular file"));
    }
    Ok(())
}

/// A file we will create later has a directory to go into.
fn check_parent_dir(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => Err(file_error_msg(
            what,
            path,
            &format!("directory {} does not exist", dir.display()),
        )),
        _ => Ok(()),
    }
}

fn file_error(what: &'static str, path: &Path, e: &io::Error) -> ConfigError {
    // "No such file or directory (os error 2)" -> "No such file or directory"
    let text = e.to_string();
    let reason = match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    };
    file_error_msg(what, path, &reason)
}

fn file_error_msg(what: &'static str, path: &Path, reason: &str) -> ConfigError {
    ConfigError::File {
        what,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `pmovmm run` as the binary will define it.
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn args(argv: &[&str]) -> RunArgs {
        Cli::try_parse_from(std::iter::once("run").chain(argv.iter().copied()))
            .expect("flags parse")
            .run
    }

    /// A scratch directory with a kernel and an initrd, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("pmovmm-config-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("bzImage"), b"kernel").unwrap();
            std::fs::write(dir.join("initrd.gz"), b"initrd").unwrap();
            Scratch(dir)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }

        fn arg(&self, name: &str) -> String {
            self.path(name).display().to_string()
        }

        fn file(&self, name: &str, len: u64) -> String {
            let f = File::create(self.path(name)).unwrap();
            f.set_len(len).unwrap();
            self.arg(name)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn err(argv: &[&str]) -> String {
        VmConfig::from_args(&args(argv))
            .expect_err("config must be rejected")
            .to_string()
    }

    #[test]
    fn sizes() {
        for (text, want) in [
            ("0", 0),
            ("4096", 4096),
            ("4K", 4 * KIB),
            ("4k", 4 * KIB),
            ("64M", 64 * MIB),
            ("64m", 64 * MIB),
            ("1G", GIB),
            ("127g", 127 * GIB),
            ("17179869183G", 17179869183 * GIB),
        ] {
            assert_eq!(parse_size(text).unwrap(), want, "{text}");
        }
        for text in [
            "", "G", "12Q", "1.5G", " 1G", "1G ", "-1", "+1", "1GB", "0x10", "1 G",
        ] {
            let e = parse_size(text).unwrap_err().to_string();
            assert_eq!(
                e,
                format!(
                    "invalid size \"{text}\": expected a number with an optional K, M or G suffix"
                )
            );
        }
        for text in ["17179869184G", "18446744073709551616"] {
            let e = parse_size(text).unwrap_err().to_string();
            assert_eq!(e, format!("invalid size \"{text}\": more than 2^64 bytes"));
        }
    }

    #[test]
    fn byte_size_display_uses_the_largest_exact_unit() {
        assert_eq!(ByteSize(0).to_string(), "0");
        assert_eq!(ByteSize(3 * GIB).to_string(), "3G");
        assert_eq!(ByteSize(3 * MIB).to_string(), "3M");
        assert_eq!(ByteSize(GIB + MIB).to_string(), "1025M");
        assert_eq!(ByteSize(12 * KIB).to_string(), "12K");
        assert_eq!(ByteSize(4097).to_string(), "4097");
    }

    #[test]
    fn option_lists() {
        let keys = &["media", "size", "lsa", "ways"];
        let o = OptionList::parse("cxl-t3", "m.img,1G,lsa=l.img,ways=2", keys, 2).unwrap();
        assert_eq!(o.get("media"), Some("m.img"));
        assert_eq!(o.size("size").unwrap(), Some(GIB));
        assert_eq!(o.get("lsa"), Some("l.img"));
        assert_eq!(o.get("ways"), Some("2"));
        assert_eq!(o.size("lsa").unwrap_err().to_string(),
            "invalid cxl-t3 \"m.img,1G,lsa=l.img,ways=2\": invalid size \"l.img\": expected a number with an optional K, M or G suffix");

        let o = OptionList::parse("cxl-t3", "size=2M,media=x", keys, 0).unwrap();
        assert_eq!(o.required("media").unwrap(), "x");
        assert_eq!(o.get("lsa"), None);
        assert_eq!(o.size("size").unwrap(), Some(2 * MIB));
        assert_eq!(o.size("lsa").unwrap(), None);
        assert_eq!(
            o.required("lsa").unwrap_err().to_string(),
            "invalid cxl-t3 \"size=2M,media=x\": missing lsa"
        );

        for (text, positional, reason) in [
            ("", 2, "empty item"),
            ("a,,b", 2, "empty item"),
            ("a,", 2, "empty item"),
            ("a,b,c", 2, "unexpected value \"c\""),
            ("a", 0, "unexpected value \"a\""),
            ("media=a,b", 2, "\"b\" must be written as key=value"),
            (
                "a,colour=red",
                2,
                "unknown key \"colour\" (expected media, size, lsa, ways)",
            ),
            ("a,media=b", 2, "media given twice"),
            ("a,size=", 2, "empty value for size"),
            (
                "=x",
                2,
                "unknown key \"\" (expected media, size, lsa, ways)",
            ),
        ] {
            let e = OptionList::parse("cxl-t3", text, keys, positional).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("invalid cxl-t3 \"{text}\": {reason}")
            );
        }
        let o = OptionList::parse("x", "ways=lots", keys, 0).unwrap();
        assert_eq!(
            o.error("ways must be a number".into()).to_string(),
            "invalid x \"ways=lots\": ways must be a number"
        );
    }

    #[test]
    fn full_command_line() {
        let s = Scratch::new("cli");
        let pmem1 = s.file("existing.img", 4 * MIB);
        let argv = [
            "--kernel",
            &s.arg("bzImage"),
            "--initrd",
            &s.arg("initrd.gz"),
            "--cmdline",
            "console=ttyS0 quiet",
            "--memory",
            "1G",
            "--cpus",
            "2",
            "--pmem",
            &format!("{},64M", s.arg("new.img")),
            "--pmem",
            &pmem1,
            "--pmem",
            &format!("path={},size=4M", s.arg("empty.img")),
            "--console",
            &s.arg("console.log"),
        ];
        s.file("empty.img", 0);
        let cfg = VmConfig::from_args(&args(&argv)).unwrap();
        assert_eq!(
            cfg,
            VmConfig {
                kernel: s.path("bzImage"),
                initrd: Some(s.path("initrd.gz")),
                cmdline: "console=ttyS0 quiet".into(),
                memory: GIB,
                cpus: 2,
                pmem: vec![
                    PmemConfig {
                        path: s.path("new.img"),
                        size: 64 * MIB
                    },
                    PmemConfig {
                        path: s.path("existing.img"),
                        size: 4 * MIB
                    },
                    PmemConfig {
                        path: s.path("empty.img"),
                        size: 4 * MIB
                    },
                ],
                console: ConsoleOutput::File(s.path("console.log")),
                pmo: None,
                cxl_t3: vec![],
            }
        );
        // Validation created nothing.
        assert!(!s.path("new.img").exists());
        assert!(!s.path("console.log").exists());
    }

    #[test]
    fn defaults() {
        let s = Scratch::new("defaults");
        let cfg = VmConfig::from_args(&args(&["--kernel", &s.arg("bzImage")])).unwrap();
        assert_eq!(cfg.initrd, None);
        assert_eq!(cfg.cmdline, DEFAULT_CMDLINE);
        assert_eq!(cfg.memory, DEFAULT_MEMORY);
        assert_eq!(cfg.cpus, DEFAULT_CPUS);
        assert!(cfg.pmem.is_empty());
        assert_eq!(cfg.console, ConsoleOutput::Stdout);
        let cfg = VmConfig::from_args(&args(&[
            "--kernel",
            &s.arg("bzImage"),
            "--console",
            "stdout",
        ]))
        .unwrap();
        assert_eq!(cfg.console, ConsoleOutput::Stdout);
    }

    #[test]
    fn memory_limits() {
        let s = Scratch::new("memory");
        let k = s.arg("bzImage");
        let ok = |m: &str| {
            VmConfig::from_args(&args(&["--kernel", &k, "--memory", m])).map(|c| c.memory)
        };
        assert_eq!(ok("64M").unwrap(), 64 * MIB);
        assert_eq!(ok("67108864").unwrap(), 64 * MIB);
        assert_eq!(ok("6G").unwrap(), 6 * GIB, "RAM above 4 GiB");
        assert_eq!(ok("127G").unwrap(), MAX_MEMORY);
        let e = |m: &str| err(&["--kernel", &k, "--memory", m]);
        assert_eq!(e("65M"), "memory 65M: must be a multiple of 2M");
        assert_eq!(e("1025K"), "memory 1025K: must be at least 64M");
        assert_eq!(e("62M"), "memory 62M: must be at least 64M");
        assert_eq!(
            e("128G"),
            "memory 128G: must be at most 127G (the guest address map)"
        );
        assert_eq!(
            e("1T"),
            "invalid size \"1T\": expected a number with an optional K, M or G suffix"
        );
        // The layout really has room for MAX_MEMORY of RAM.
        let end = layout::ram_regions(MAX_MEMORY)
            .last()
            .map(|r| r.0 + r.1)
            .unwrap();
        assert_eq!(end, layout::DEVICE_MEM_START);
    }

    #[test]
    fn cpu_limits() {
        let s = Scratch::new("cpus");
        let k = s.arg("bzImage");
        for (n, want) in [("1", 1u8), ("64", 64)] {
            let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--cpus", n])).unwrap();
            assert_eq!(cfg.cpus, want);
        }
        for n in ["0", "65", "256", "-1", "two", ""] {
            assert_eq!(
                err(&["--kernel", &k, &format!("--cpus={n}")]),
                format!("cpus \"{n}\": expected a number from 1 to 64")
            );
        }
    }

    #[test]
    fn kernel_and_initrd_must_be_readable_files() {
        let s = Scratch::new("files");
        assert_eq!(
            err(&[]),
            "no kernel given: use --kernel FILE or `kernel` in the config file"
        );
        assert_eq!(
            err(&["--kernel", "/x/bzImage"]),
            "kernel file /x/bzImage: No such file or directory"
        );
        assert_eq!(
            err(&["--kernel", &s.arg("")]),
            format!("kernel file {}: not a regular file", s.arg(""))
        );
        assert_eq!(
            err(&["--kernel", &s.arg("bzImage"), "--initrd", "/x/initrd"]),
            "initrd file /x/initrd: No such file or directory"
        );
    }

    #[test]
    fn cmdline_limits() {
        let s = Scratch::new("cmdline");
        let k = s.arg("bzImage");
        let longest = "x".repeat(layout::CMDLINE_MAX_SIZE - 1);
        let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--cmdline", &longest])).unwrap();
        assert_eq!(cfg.cmdline, longest);
        let too_long = "x".repeat(layout::CMDLINE_MAX_SIZE);
        assert_eq!(
            err(&["--kernel", &k, "--cmdline", &too_long]),
            "kernel command line is 2048 bytes: must be shorter than 2048"
        );
        let mut a = args(&["--kernel", &k]);
        a.cmdline = Some("a\0b".into());
        assert_eq!(
            VmConfig::from_args(&a).unwrap_err().to_string(),
            "kernel command line contains a NUL byte"
        );
        // A command line that starts with a dash is a value, not a flag.
        let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--cmdline", "-b"])).unwrap();
        assert_eq!(cfg.cmdline, "-b");
    }

    #[test]
    fn pmem_errors() {
        let s = Scratch::new("pmem");
        let k = s.arg("bzImage");
        let odd = s.file("odd.img", 3 * MIB);
        let four = s.file("four.img", 4 * MIB);
        s.file("empty.img", 0);
        let e = |p: &str| err(&["--kernel", &k, "--pmem", p]);
        let new = s.arg("new.img");
        assert_eq!(
            e(&format!("{new},3M")),
            format!("pmem {new}: size 3M is not a multiple of 2M")
        );
        assert_eq!(
            e(&format!("{new},0")),
            format!("pmem {new}: size must not be zero")
        );
        assert_eq!(e(&format!("{new},1Q")),
            format!("invalid pmem \"{new},1Q\": invalid size \"1Q\": expected a number with an optional K, M or G suffix"));
        assert_eq!(
            e(&format!("{new},2M,x")),
            format!("invalid pmem \"{new},2M,x\": unexpected value \"x\"")
        );
        assert_eq!(
            e(&new),
            format!("pmem {new}: the file does not exist or is empty, give its size as FILE,SIZE")
        );
        assert_eq!(
            e(&s.arg("empty.img")),
            format!(
                "pmem {}: the file does not exist or is empty, give its size as FILE,SIZE",
                s.arg("empty.img")
            )
        );
        assert_eq!(
            e(&odd),
            format!("pmem {odd}: size 3M is not a multiple of 2M")
        );
        assert_eq!(
            e(&format!("{four},8M")),
            format!("pmem {four}: the file holds 4M but 8M was given")
        );
        assert_eq!(
            e("/no/such/dir/p.img,2M"),
            "pmem file /no/such/dir/p.img: directory /no/such/dir does not exist"
        );
        assert_eq!(
            e(&s.arg("")),
            format!("pmem file {}: not a regular file", s.arg(""))
        );
        assert_eq!(
            err(&[
                "--kernel",
                &k,
                "--pmem",
                &four,
                "--pmem",
                &format!("path={four}")
            ]),
            format!("pmem {four}: given twice")
        );
        let big = |n: &str| format!("{},100G", s.arg(n));
        assert_eq!(
            err(&[
                "--kernel",
                &k,
                "--pmem",
                &big("a.img"),
                "--pmem",
                &big("b.img")
            ]),
            "pmem devices total 200G: more than the 128G of device memory"
        );
        assert!(!s.path("a.img").exists());
    }

    #[test]
    fn console_output() {
        let s = Scratch::new("console");
        let k = s.arg("bzImage");
        assert_eq!(
            err(&["--kernel", &k, "--console", ""]),
            "console \"\": expected a file name or stdout"
        );
        assert_eq!(
            err(&["--kernel", &k, "--console", "/no/such/dir/log"]),
            "console file /no/such/dir/log: directory /no/such/dir does not exist"
        );
        let cfg = VmConfig::from_args(&args(&["--kernel", &k, "--console", "log"])).unwrap();
        assert_eq!(
            cfg.console,
            ConsoleOutput::File("log".into()),
            "relative to the cwd"
        );
    }

    #[test]
    fn toml_file_is_equivalent_to_the_flags() {
        let s = Scratch::new("toml");
        s.file("p.img", 4 * MIB);
        let toml = r#"
            kernel = "bzImage"
            initrd = "initrd.gz"
            cmdline = "console=ttyS0 quiet"
            memory = "1G"
            cpus = 2
            pmem = ["p.img", "q.img,2M"]
            console = "console.log"
        "#;
        std::fs::write(s.path("vm.toml"), toml).unwrap();
        let from_file = VmConfig::from_args(&args(&["--config", &s.arg("vm.toml")])).unwrap();
        let from_flags = VmConfig::from_args(&args(&[
            "--kernel",
            &s.arg("bzImage"),
            "--initrd",
            &s.arg("initrd.gz"),
            "--cmdline",
            "console=ttyS0 quiet",
            "--memory",
            "1G",
            "--cpus",
            "2",
            "--pmem",
            &s.arg("p.img"),
            "--pmem",
            &format!("{},2M", s.arg("q.img")),
            "--console",
            &s.arg("console.log"),
        ]))
        .unwrap();
        assert_eq!(from_file, from_flags);

        // Integers are bytes, like on the command line; cpus may be a string.
        std::fs::write(
            s.path("int.toml"),
            "kernel = \"bzImage\"\nmemory = 134217728\ncpus = \"3\"\n",
        )
        .unwrap();
        let cfg = VmConfig::from_args(&args(&["--config", &s.arg("int.toml")])).unwrap();
        assert_eq!((cfg.memory, cfg.cpus), (128 * MIB, 3));
    }

    #[test]
    fn flags_override_the_file() {
        let s = Scratch::new("override");
        s.file("a.img", 2 * MIB);
        s.file("b.img", 4 * MIB);
        std::fs::write(s.path("other-kernel"), b"k2").unwrap();
        let toml = "kernel = \"bzImage\"\nmemory = \"1G\"\ncpus = 4\ncmdline = \"from file\"\n\
                    pmem = [\"a.img\"]\nconsole = \"file.log\"\n";
        std::fs::write(s.path("vm.toml"), toml).unwrap();
        let cfg = VmConfig::from_args(&args(&[
            "--config",
            &s.arg("vm.toml"),
            "--kernel",
            &s.arg("other-kernel"),
            "--cpus",
            "1",
            "--pmem",
            &s.arg("b.img"),
            "--console",
            "stdout",
        ]))
        .unwrap();
        assert_eq!(cfg.kernel, s.path("other-kernel"));
        assert_eq!(cfg.cpus, 1);
        assert_eq!(cfg.memory, GIB, "kept from the file");
        assert_eq!(cfg.cmdline, "from file", "kept from the file");
        assert_eq!(
            cfg.pmem,
            vec![PmemConfig {
                path: s.path("b.img"),
                size: 4 * MIB
            }],
            "replaced, not appended"
        );
        assert_eq!(cfg.console, ConsoleOutput::Stdout);
    }

    #[test]
    fn toml_errors() {
        let s = Scratch::new("toml-errors");
        let run = |name: &str, text: &str| {
            std::fs::write(s.path(name), text).unwrap();
            err(&["--config", &s.arg(name)])
        };
        let p = |name: &str| s.arg(name);
        assert_eq!(
            err(&["--config", "/no/vm.toml"]),
            "config file /no/vm.toml: No such file or directory"
        );
        let e = run("typo.toml", "kernel = \"bzImage\"\nmemroy = \"1G\"\n");
        assert!(
            e.starts_with(&format!(
                "config file {}: line 2: unknown field `memroy`",
                p("typo.toml")
            )),
            "{e}"
        );
        let e = run("syntax.toml", "kernel = \"bzImage\"\n\ncpus = = 2\n");
        assert!(
            e.starts_with(&format!("config file {}: line 3: ", p("syntax.toml"))),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        let e = run("type.toml", "kernel = 5\n");
        assert!(
            e.starts_with(&format!("config file {}: line 1: ", p("type.toml"))),
            "{e}"
        );
        assert_eq!(
            run("float.toml", "kernel = \"bzImage\"\nmemory = 1.5\n"),
            format!(
                "config file {}: memory: expected a string or an integer, found float",
                p("float.toml")
            )
        );
        assert_eq!(
            run("neg.toml", "kernel = \"bzImage\"\nmemory = -1\n"),
            "invalid size \"-1\": expected a number with an optional K, M or G suffix"
        );
        assert_eq!(
            run("cpus.toml", "kernel = \"bzImage\"\ncpus = 100\n"),
            "cpus \"100\": expected a number from 1 to 64"
        );
        assert_eq!(
            run("pmem.toml", "kernel = \"bzImage\"\npmem = [\"x.img,huge\"]\n"),
            format!("invalid pmem \"x.img,huge\": invalid size \"huge\": expected a number with an optional K, M or G suffix")
        );
        assert_eq!(
            run("nokernel.toml", "memory = \"1G\"\n"),
            "no kernel given: use --kernel FILE or `kernel` in the config file"
        );
        assert_eq!(
            run("missing.toml", "kernel = \"nope\"\n"),
            format!("kernel file {}: No such file or directory", p("nope"))
        );
    }

    #[test]
    fn pmo_store_settings() {
        let s = Scratch::new("pmo");
        let kernel = s.arg("bzImage");
        let store = s.arg("store.img");
        let base = ["--kernel", kernel.as_str()];
        let with = |extra: &[&str]| {
            let mut v: Vec<&str> = base.to_vec();
            v.extend_from_slice(extra);
            VmConfig::from_args(&args(&v))
        };
        let cfg = with(&["--pmo-store", &format!("{store},1G"), "--pmo-design", "d"]).unwrap();
        assert_eq!(
            cfg.pmo,
            Some(PmoConfig {
                store: s.path("store.img"),
                store_size: Some(GIB),
                design: Some("d".into()),
                window: DEFAULT_PMO_WINDOW,
                test_kill_in_psync: None,
                predictor: None,
                kdf: KdfParams::DEFAULT,
                anchor: None,
            })
        );
        assert_eq!(with(&[]).unwrap().pmo, None);
        assert_eq!(
            with(&["--pmo-store", &store]).unwrap_err().to_string(),
            format!("PMO store {store}: does not exist; give its size to create it (FILE,SIZE)")
        );
        assert!(matches!(
            with(&["--pmo-design", "d"]).unwrap_err(),
            ConfigError::PmoWithoutStore
        ));
        assert!(matches!(
            with(&["--pmo-store", &format!("{store},1G"), "--pmo-window", "3M"]).unwrap_err(),
            ConfigError::PmoWindow(_)
        ));
        assert!(matches!(
            with(&[
                "--pmo-store",
                &format!("{store},1G"),
                "--pmo-window",
                "128G"
            ])
            .unwrap_err(),
            ConfigError::PmoWindow(_)
        ));
        let w = with(&["--pmo-store", &format!("{store},1G"), "--pmo-window", "64M"]).unwrap();
        assert_eq!(w.pmo.unwrap().window, 64 * MIB);
        assert!(matches!(
            with(&["--pmo-predictor", "stream:4"]).unwrap_err(),
            ConfigError::PmoWithoutStore
        ));
        let p = with(&[
            "--pmo-store",
            &format!("{store},1G"),
            "--pmo-predictor",
            "stride:8",
        ])
        .unwrap();
        assert_eq!(p.pmo.unwrap().predictor.as_deref(), Some("stride:8"));
        let anchor = s.arg("anchor");
        let k = with(&[
            "--pmo-store",
            &format!("{store},1G"),
            "--pmo-kdf",
            "m=8M,t=1",
            "--pmo-anchor",
            &anchor,
        ])
        .unwrap()
        .pmo
        .unwrap();
        assert_eq!(
            k.kdf,
            KdfParams {
                m_kib: 8192,
                t: 1,
                p: 1
            }
        );
        assert_eq!(k.anchor, Some(s.path("anchor")));
        assert!(matches!(
            with(&["--pmo-store", &format!("{store},1G"), "--pmo-kdf", "t=99"]).unwrap_err(),
            ConfigError::PmoKdf(_)
        ));
        assert!(matches!(
            with(&["--pmo-kdf", "fast"]).unwrap_err(),
            ConfigError::PmoWithoutStore
        ));
    }

    #[test]
    fn cxl_t3_options() {
        let s = Scratch::new("cxl");
        let k = s.arg("bzImage");
        s.file("key", 32);
        let ok = VmConfig::from_args(&args(&[
            "--kernel",
            &k,
            "--cxl-t3",
            &format!("media={},size=1G", s.arg("a.img")),
            "--cxl-t3",
            &format!(
                "media={},size=512M,lsa={},cache=8M,ways=4,latency=0,key={},serial=0x1f",
                s.arg("b.img"),
                s.arg("b.labels"),
                s.arg("key")
            ),
        ]))
        .unwrap();
        assert_eq!(
            ok.cxl_t3,
            vec![
                CxlT3Config {
                    media: s.path("a.img"),
                    size: GIB,
                    lsa: s.path("a.img.lsa"),
                    cache: DEFAULT_CXL_CACHE,
                    ways: DEFAULT_CXL_WAYS,
                    latency_ns: DEFAULT_CXL_LATENCY_NS,
                    key: None,
                    serial: None,
                },
                CxlT3Config {
                    media: s.path("b.img"),
                    size: 512 * MIB,
                    lsa: s.path("b.labels"),
                    cache: 8 * MIB,
                    ways: 4,
                    latency_ns: 0,
                    key: Some(s.path("key")),
                    serial: Some(0x1f),
                },
            ]
        );
        let media = s.arg("c.img");
        let e = |opt: &str| err(&["--kernel", &k, "--cxl-t3", opt]);
        assert_eq!(
            e(&format!("media={media},size=100M")),
            format!("invalid cxl-t3 \"media={media},size=100M\": size 100M is not a non-zero multiple of 256M")
        );
        assert_eq!(
            e(&format!("media={media}")),
            format!("invalid cxl-t3 \"media={media}\": missing size")
        );
        assert!(e(&format!("media={media},size=1G,colour=red")).contains("unknown key \"colour\""));
        assert!(e(&format!("media={media},size=1G,ways=0")).contains("ways \"0\""));
        assert!(e(&format!("media={media},size=1G,cache=6K")).contains("cache 6K"));
        assert!(e(&format!("media={media},size=1G,cache=12K,ways=8")).contains("does not divide"));
        assert!(e(&format!("media={media},size=1G,latency=x")).contains("latency \"x\""));
        assert!(e(&format!("media={media},size=1G,serial=0xg")).contains("serial \"0xg\""));
        assert!(e(&format!("media={media},size=1G,key={}", s.arg("nokey")))
            .starts_with("cxl-t3 key file"));
        assert!(e("size=1G").contains("missing media"));
        let twice = format!("media={media},size=1G");
        assert_eq!(
            err(&["--kernel", &k, "--cxl-t3", &twice, "--cxl-t3", &twice]),
            format!("cxl-t3 media {media}: given twice")
        );
        // The TOML file takes the same strings, paths relative to it.
        std::fs::write(
            s.path("vm.toml"),
            "kernel = \"bzImage\"\ncxl_t3 = [\"media=a.img,size=1G\"]\n",
        )
        .unwrap();
        let t = VmConfig::from_args(&args(&["--config", &s.arg("vm.toml")])).unwrap();
        assert_eq!(t.cxl_t3, ok.cxl_t3[..1].to_vec());
    }
}
