//! Each device's configuration, parsed from its option string ([`OptionList`]) and checked
//! against the files it names. Nothing here creates a file.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use sizes::ByteSize;

use super::error::{file_error, file_error_msg};
use super::{ConfigError, OptionList, KIB, MIB};
use crate::layout;

/// One virtio-pmem device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmemConfig {
    /// Backing file. It may not exist yet (or be empty): then the device creates it with
    /// `size` bytes. Otherwise it already holds exactly `size` bytes, so opening it never
    /// truncates or pads user data.
    pub path: PathBuf,
    /// Size of the region the guest sees; a non-zero multiple of [`PMEM_ALIGN`].
    pub size: u64,
}

/// pmem regions are mapped in 2 MiB pages.
pub const PMEM_ALIGN: u64 = 2 * MIB;

impl PmemConfig {
    /// Parses `--pmem FILE[,SIZE]` (or `path=FILE,size=SIZE`) and settles the size: the given
    /// one for a new (or empty) file, the file's own length otherwise.
    pub fn parse(text: &str, base: &Path) -> Result<Self, ConfigError> {
        let opts = OptionList::parse("pmem", text, &["path", "size"], 2)?;
        let path = base.join(opts.required("path")?);
        let size = opts.size("size")?;
        if let Some(size) = size {
            check_pmem_size(&path, size)?;
        }
        let size = match (size, existing_len(&path)?) {
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
        check_pmem_size(&path, size)?;
        Ok(PmemConfig { path, size })
    }
}

fn check_pmem_size(path: &Path, size: u64) -> Result<(), ConfigError> {
    let path = path.to_path_buf();
    if size == 0 {
        return Err(ConfigError::PmemZero { path });
    }
    if !size.is_multiple_of(PMEM_ALIGN) {
        return Err(ConfigError::PmemNotAligned {
            path,
            size: ByteSize(size),
        });
    }
    Ok(())
}

/// The length of an existing pmem file that the device can open read-write (opening changes
/// nothing), or 0 when it does not exist yet and can be created.
fn existing_len(path: &Path) -> Result<u64, ConfigError> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => Err(file_error_msg("pmem file", path, "not a regular file")),
        Ok(meta) => {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| file_error("pmem file", path, &e))?;
            Ok(meta.len())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            check_parent_dir("pmem file", path)?;
            Ok(0)
        }
        Err(e) => Err(file_error("pmem file", path, &e)),
    }
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
    /// Charged per page moved into or out of the device's DRAM by the PMO service (a
    /// working copy of design `cf`, dirty pages demoted under `--pmo-dram`).
    pub devmem_latency_ns: u64,
    /// File holding a TEE range key programmed over the whole device.
    pub key: Option<PathBuf>,
    /// Device serial number; `None`: derived from the media path.
    pub serial: Option<u64>,
    /// Name other options refer to it by (`--pmo-store cxl=NAME`).
    pub id: Option<String>,
    /// Shown to the guest (`guest=on`, the default); `guest=off` keeps it for the VMM: no
    /// host bridge, no PCI function, its memory only the PMO store's medium.
    pub guest: bool,
}

/// Longest `id=` of an expander.
pub const MAX_ID_LEN: usize = 32;

fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// CXL decoders and memory windows work in 256 MiB units.
pub const CXL_ALIGN: u64 = 256 * MIB;
/// Device DRAM cache when `cache=` is not given.
pub const DEFAULT_CXL_CACHE: u64 = 64 * MIB;
/// Cache associativity when `ways=` is not given.
pub const DEFAULT_CXL_WAYS: usize = 8;
/// Most cache ways: a set is searched linearly.
pub const MAX_CXL_WAYS: usize = 64;
/// NAND-like: tens of microseconds per media access.
pub const DEFAULT_CXL_LATENCY_NS: u64 = 25_000;
/// One 4 KiB page into or out of the device's DRAM: about 250 ns of CXL load latency (local
/// DRAM plus the 70-90 ns Pond measured for one CXL hop) and 4 KiB at 25 GB/s (one x8 PCIe 5
/// link, about 165 ns).
pub const DEFAULT_CXL_DEVMEM_LATENCY_NS: u64 = 400;
/// One host bridge per device; the layout has room for this many.
pub const MAX_CXL_T3: usize = layout::CXL_MAX_HOST_BRIDGES;

impl CxlT3Config {
    /// Parses `--cxl-t3 media=FILE,size=SIZE[,lsa=FILE][,cache=SIZE][,ways=N][,latency=NS]
    /// [,devmem-latency=NS]
    /// [,key=FILE][,serial=N][,id=NAME][,guest=on|off]` and checks every value and the files
    /// it names.
    pub fn parse(text: &str, base: &Path) -> Result<Self, ConfigError> {
        let opts = OptionList::parse(
            "cxl-t3",
            text,
            &[
                "media",
                "size",
                "lsa",
                "cache",
                "ways",
                "latency",
                "devmem-latency",
                "key",
                "serial",
                "id",
                "guest",
            ],
            0,
        )?;
        let media = base.join(opts.required("media")?);
        let size = opts
            .size("size")?
            .ok_or_else(|| opts.error("missing size".into()))?;
        Self::check_size(size).map_err(|e| opts.error(e.to_string()))?;
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
        let ns = |name: &str, default: u64| match opts.get(name) {
            Some(l) => l
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= 1_000_000_000)
                .ok_or_else(|| {
                    opts.error(format!("{name} \"{l}\" is not a number of ns up to 1s"))
                }),
            None => Ok(default),
        };
        let latency_ns = ns("latency", DEFAULT_CXL_LATENCY_NS)?;
        let devmem_latency_ns = ns("devmem-latency", DEFAULT_CXL_DEVMEM_LATENCY_NS)?;
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
        let key = opts.get("key").map(|k| base.join(k));
        let id = match opts.get("id") {
            Some(id) if valid_id(id) => Some(id.to_string()),
            Some(id) => {
                return Err(opts.error(format!(
                    "id \"{id}\" is not 1 to {MAX_ID_LEN} letters, digits, '-' or '_'"
                )))
            }
            None => None,
        };
        let guest = match opts.get("guest") {
            None | Some("on") => true,
            Some("off") => false,
            Some(g) => return Err(opts.error(format!("guest \"{g}\" is not on or off"))),
        };
        if !guest && key.is_some() {
            return Err(opts.error(
                "key= keys the guest's view; an expander kept from the guest takes its keys \
                 from --pmo-master-key"
                    .into(),
            ));
        }
        check_parent_dir("cxl-t3 media", &media)?;
        check_parent_dir("cxl-t3 LSA", &lsa)?;
        if let Some(key) = &key {
            check_readable("cxl-t3 key file", key)?;
        }
        Ok(CxlT3Config {
            media,
            size,
            lsa,
            cache,
            ways,
            latency_ns,
            devmem_latency_ns,
            key,
            serial,
            id,
            guest,
        })
    }

    /// The capacity rule, shared with `pmovmm cxl create`: HDM decoders map 256 MiB units.
    pub fn check_size(size: u64) -> Result<(), ConfigError> {
        if size == 0 || !size.is_multiple_of(CXL_ALIGN) {
            return Err(ConfigError::CxlSize(ByteSize(size)));
        }
        Ok(())
    }
}

/// Where the guest's serial output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleOutput {
    /// The VMM's standard output (interactive when it is a terminal).
    Stdout,
    /// A log file, truncated when the VM starts.
    File(PathBuf),
}

impl ConsoleOutput {
    /// Parses `--console FILE|stdout`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, ConfigError> {
        match text {
            "" => Err(ConfigError::InvalidConsole(text.to_string())),
            "stdout" => Ok(ConsoleOutput::Stdout),
            path => {
                let path = base.join(path);
                check_parent_dir("console file", &path)?;
                Ok(ConsoleOutput::File(path))
            }
        }
    }
}

/// The file exists, is a regular file and can be opened for reading.
pub(super) fn check_readable(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    let file = File::open(path).map_err(|e| file_error(what, path, &e))?;
    let meta = file.metadata().map_err(|e| file_error(what, path, &e))?;
    if !meta.is_file() {
        return Err(file_error_msg(what, path, "not a regular file"));
    }
    Ok(())
}

/// A file we will create later has a directory to go into.
pub(super) fn check_parent_dir(what: &'static str, path: &Path) -> Result<(), ConfigError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => Err(file_error_msg(
            what,
            path,
            &format!("directory {} does not exist", dir.display()),
        )),
        _ => Ok(()),
    }
}
