//! Configuration of `pmovmm run`: one validated [`VmConfig`] that the machine takes as it is.
//!
//! The VM is described by command-line flags or by a TOML file with the same field names
//! (`--config vm.toml`), both read into [`RunArgs`]; flags override the file.
//! [`VmConfig::from_args`] picks each setting from its source, parses every device's option
//! string with the device's own parser, and validates the result against the guest address
//! map, so the rest of the VMM only ever sees a configuration that can boot.
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
//! pmo_store = "store.img,1G"
//! pmo_predictor = "adaptive"
//! seccomp = "on"                     # or "log", "off" (docs/sandbox.md)
//! landlock = "on"                    # or "require", "off"
//! ```
//!
//! Sizes are written in the workspace's one grammar (`sizes`: bytes, or K, M, G, T).
//! Device options use one small syntax, `value[,value][,key=value]...` ([`OptionList`]).
//!
//! Files: `args.rs` (the VM as written, and which source wins), `options.rs` (the option-list
//! syntax), `devices.rs` (each device's parser), `error.rs`.

mod args;
mod devices;
mod error;
mod options;

use pmo_crypto::{KdfParams, RangeCipher};
use pmo_pager::{DramBudget, PmoConfig};
use pmo_policies::{PlacementPolicy, PredictorSpec};
use pmo_sandbox::{LandlockMode, Policy, SeccompMode};
use pmo_store::Design;
use pmo_store::StoreOptions;
use sizes::{parse_size, ByteSize};

use crate::layout;
use args::Sources;
use devices::{check_parent_dir, check_readable};

pub use args::RunArgs;
pub use devices::{
    ConsoleOutput, CxlT3Config, PmemConfig, CXL_ALIGN, DEFAULT_CXL_CACHE,
    DEFAULT_CXL_DEVMEM_LATENCY_NS, DEFAULT_CXL_LATENCY_NS, DEFAULT_CXL_WAYS, MAX_CXL_T3,
    MAX_CXL_WAYS, PMEM_ALIGN,
};
pub use error::ConfigError;
pub use options::OptionList;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The PMO page.
const PAGE_BYTES: u64 = 4 * KIB;

/// Guest RAM is mapped with 2 MiB granularity (huge-page friendly, and the boot page tables
/// identity-map with 2 MiB pages).
pub const MEMORY_ALIGN: u64 = 2 * MIB;
/// Below this the Debian kernel and its initramfs do not boot reliably.
pub const MIN_MEMORY: u64 = 64 * MIB;
/// All the RAM the guest address map holds: the low part below the PCI hole plus the high
/// part up to the device-memory range.
pub const MAX_MEMORY: u64 =
    layout::RAM_LOW_END + (layout::DEVICE_MEM_START - layout::RAM_HIGH_START);
/// APIC IDs in the MADT are bytes; 64 is plenty and keeps xAPIC mode.
pub const MAX_CPUS: u8 = 64;
/// Guest RAM when neither the flags nor the file set it.
pub const DEFAULT_MEMORY: u64 = 512 * MIB;
/// vCPUs when neither the flags nor the file set them.
pub const DEFAULT_CPUS: u8 = 1;
/// Serial console on ttyS0, and a panic ends the VM instead of hanging it.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 panic=-1";
/// Default PMO window: room for a few large PMOs attached at once; it is reserved address
/// space, not memory, until pages are touched.
pub const DEFAULT_PMO_WINDOW: u64 = 1 << 30;
/// Smallest store `direct=` leaves on an expander.
pub const MIN_CXL_STORE: u64 = 16 << 20;
/// Largest PMO window: a quarter of the 64-bit MMIO window.
pub const MAX_PMO_WINDOW: u64 = layout::MMIO64_SIZE / 4;
/// Fault-service threads of the PMO window: enough to overlap decryption with a second
/// vCPU's fault, few enough to leave the cores to the vCPUs.
pub const PMO_FAULT_THREADS: usize = 2;

/// A validated VM description: every file checked, every size within the guest address map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmConfig {
    /// bzImage; exists and is a readable regular file.
    pub kernel: std::path::PathBuf,
    /// Initramfs; exists and is a readable regular file when given.
    pub initrd: Option<std::path::PathBuf>,
    /// Shorter than `layout::CMDLINE_MAX_SIZE` and free of NUL bytes.
    pub cmdline: String,
    /// Guest RAM in bytes: a 2 MiB multiple in `MIN_MEMORY..=MAX_MEMORY`
    /// (see `layout::ram_regions` for where it goes).
    pub memory: u64,
    /// vCPUs, `1..=MAX_CPUS`; vCPU `i` has APIC ID `i`.
    pub cpus: u8,
    /// virtio-pmem devices in command-line order; their sizes sum to at most
    /// `layout::DEVICE_MEM_SIZE`.
    pub pmem: Vec<PmemConfig>,
    /// Where the guest's serial console goes.
    pub console: ConsoleOutput,
    /// The PMO device, when a store is given, exactly as the device is built.
    pub pmo: Option<PmoConfig>,
    /// CXL Type 3 memory expanders, in command-line order.
    pub cxl_t3: Vec<CxlT3Config>,
    /// The PMO store lives on an expander's media rather than in `pmo.store`'s file.
    pub pmo_on_cxl: Option<PmoOnCxl>,
    /// The sandbox: seccomp filters per thread kind and Landlock (`crate::sandbox`).
    pub sandbox: Policy,
}

/// A PMO store on the media of a `guest=off` expander (`--pmo-store cxl=NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmoOnCxl {
    /// Index into [`VmConfig::cxl_t3`].
    pub expander: usize,
    /// File with the master key the PMO extents' TEE range keys are derived from.
    pub master_key: std::path::PathBuf,
    /// The ranges' cipher (`cipher=xts-128|xts-256`, XTS-256 by default).
    pub cipher: RangeCipher,
    /// `direct=SIZE`: bytes at the end of the expander kept out of a newly formatted store
    /// for the working copies of design `c`, which the guest maps directly.
    pub direct: Option<u64>,
}

impl VmConfig {
    /// Reads `--config` if given, applies the flags over it, fills in the defaults and
    /// validates everything. Creates no files.
    pub fn from_args(args: &RunArgs) -> Result<VmConfig, ConfigError> {
        let src = Sources::read(args)?;

        let (kernel, base) = src
            .pick(|a| a.kernel.as_deref())
            .ok_or(ConfigError::MissingKernel)?;
        let kernel = base.join(kernel);
        check_readable("kernel file", &kernel)?;
        let initrd = src.pick(|a| a.initrd.as_deref()).map(|(p, b)| b.join(p));
        if let Some(initrd) = &initrd {
            check_readable("initrd file", initrd)?;
        }

        let cmdline = src
            .pick(|a| a.cmdline.as_deref())
            .map_or(DEFAULT_CMDLINE, |(c, _)| c)
            .to_string();
        if cmdline.len() >= layout::CMDLINE_MAX_SIZE {
            return Err(ConfigError::CmdlineTooLong(cmdline.len()));
        }
        if cmdline.contains('\0') {
            return Err(ConfigError::CmdlineNul);
        }

        let memory = match src.pick(|a| a.memory.as_deref()) {
            Some((text, _)) => parse_size(text)?,
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

        let cpus = match src.pick(|a| a.cpus.as_deref()) {
            Some((text, _)) => text
                .parse::<u8>()
                .ok()
                .filter(|n| (1..=MAX_CPUS).contains(n))
                .ok_or_else(|| ConfigError::InvalidCpus(text.to_string()))?,
            None => DEFAULT_CPUS,
        };

        let (specs, base) = src.pick_list(|a| &a.pmem);
        let mut pmem: Vec<PmemConfig> = Vec::new();
        for spec in specs {
            let p = PmemConfig::parse(spec, base)?;
            if pmem.iter().any(|q| q.path == p.path) {
                return Err(ConfigError::PmemDuplicate { path: p.path });
            }
            pmem.push(p);
        }
        let total = pmem.iter().map(|p| p.size).sum::<u64>();
        if total > layout::DEVICE_MEM_SIZE {
            return Err(ConfigError::PmemTooLarge(ByteSize(total)));
        }

        let console = match src.pick(|a| a.console.as_deref()) {
            Some((text, base)) => ConsoleOutput::parse(text, base)?,
            None => ConsoleOutput::Stdout,
        };

        let (specs, base) = src.pick_list(|a| &a.cxl_t3);
        let mut cxl_t3: Vec<CxlT3Config> = Vec::new();
        for spec in specs {
            let d = CxlT3Config::parse(spec, base)?;
            if cxl_t3.iter().any(|o| o.media == d.media) {
                return Err(ConfigError::CxlDuplicate { path: d.media });
            }
            if let Some(id) =
                d.id.as_ref()
                    .filter(|id| cxl_t3.iter().any(|o| o.id.as_ref() == Some(*id)))
            {
                return Err(ConfigError::CxlIdDuplicate(id.clone()));
            }
            cxl_t3.push(d);
        }
        if cxl_t3.iter().filter(|d| d.guest).count() > MAX_CXL_T3 {
            return Err(ConfigError::CxlTooMany);
        }

        let (pmo, pmo_on_cxl) = pmo_config(&src, &cxl_t3)?;
        let sandbox = sandbox_policy(&src)?;
        if let Some(d) = cxl_t3
            .iter()
            .enumerate()
            .find(|(i, d)| !d.guest && pmo_on_cxl.as_ref().is_none_or(|p| p.expander != *i))
        {
            return Err(ConfigError::CxlUnused {
                path: d.1.media.clone(),
            });
        }

        Ok(VmConfig {
            kernel,
            initrd,
            cmdline,
            memory,
            cpus,
            pmem,
            console,
            pmo,
            cxl_t3,
            pmo_on_cxl,
            sandbox,
        })
    }
}

/// `--seccomp` and `--landlock`: both on unless the flags or the file say otherwise.
fn sandbox_policy(src: &Sources<'_>) -> Result<Policy, ConfigError> {
    let seccomp = match src.pick(|a| a.seccomp.as_deref()) {
        Some((text, _)) => SeccompMode::from_name(text)
            .ok_or_else(|| ConfigError::InvalidSeccomp(text.to_string()))?,
        None => SeccompMode::default(),
    };
    let landlock = match src.pick(|a| a.landlock.as_deref()) {
        Some((text, _)) => LandlockMode::from_name(text)
            .ok_or_else(|| ConfigError::InvalidLandlock(text.to_string()))?,
        None => LandlockMode::default(),
    };
    Ok(Policy { seccomp, landlock })
}

/// The PMO device: `--pmo-store FILE[,SIZE]|cxl=NAME[,cipher=C][,direct=SIZE]` and the `--pmo-*` settings that need
/// it; with `cxl=NAME`, the expander it lives on (`cxl_t3`: the parsed `--cxl-t3` devices).
fn pmo_config(
    src: &Sources<'_>,
    cxl_t3: &[CxlT3Config],
) -> Result<(Option<PmoConfig>, Option<PmoOnCxl>), ConfigError> {
    let design = src.pick(|a| a.pmo_design.as_deref()).map(|(d, _)| d);
    let window = src.pick(|a| a.pmo_window.as_deref()).map(|(w, _)| w);
    let predictor = src.pick(|a| a.pmo_predictor.as_deref()).map(|(p, _)| p);
    let kdf = src.pick(|a| a.pmo_kdf.as_deref()).map(|(k, _)| k);
    let anchor = src
        .pick(|a| a.pmo_anchor.as_deref())
        .map(|(p, base)| base.join(p));
    let master_key = src
        .pick(|a| a.pmo_master_key.as_deref())
        .map(|(p, base)| base.join(p));
    let dram = src.pick(|a| a.pmo_dram.as_deref()).map(|(d, _)| d);
    let Some((store, base)) = src.pick(|a| a.pmo_store.as_deref()) else {
        if design.is_some()
            || window.is_some()
            || predictor.is_some()
            || kdf.is_some()
            || anchor.is_some()
            || master_key.is_some()
            || dram.is_some()
        {
            return Err(ConfigError::PmoWithoutStore);
        }
        return Ok((None, None));
    };
    let opts = OptionList::parse(
        "pmo-store",
        store,
        &["path", "size", "cxl", "cipher", "direct"],
        2,
    )?;
    let (store, store_size, on_cxl) = match opts.get("cxl") {
        Some(name) => {
            if opts.get("path").is_some() || opts.get("size").is_some() {
                return Err(opts.error(
                    "cxl=NAME takes the expander's media and size; no file or size".into(),
                ));
            }
            let (index, dev) = cxl_t3
                .iter()
                .enumerate()
                .find(|(_, d)| d.id.as_deref() == Some(name))
                .ok_or_else(|| ConfigError::PmoCxlUnknown(name.to_string()))?;
            if dev.guest {
                return Err(ConfigError::PmoCxlGuest(name.to_string()));
            }
            let cipher = match opts.get("cipher") {
                Some(c) => RangeCipher::from_name(c)
                    .ok_or_else(|| opts.error(format!("cipher {c:?} is not xts-128 or xts-256")))?,
                None => RangeCipher::default(),
            };
            let direct = opts.size("direct")?;
            if let Some(d) = direct {
                // The store needs room for its table and at least one PMO besides.
                if d == 0
                    || !d.is_multiple_of(PMEM_ALIGN)
                    || d.saturating_add(MIN_CXL_STORE) > dev.size
                {
                    return Err(ConfigError::PmoDirect {
                        direct: ByteSize(d),
                        device: ByteSize(dev.size),
                    });
                }
            }
            let master_key = master_key.clone().ok_or(ConfigError::PmoNoMasterKey)?;
            check_readable("PMO master key file", &master_key)?;
            let on = PmoOnCxl {
                expander: index,
                master_key,
                cipher,
                direct,
            };
            (dev.media.clone(), None, Some(on))
        }
        None => {
            if master_key.is_some() {
                return Err(ConfigError::PmoMasterKeyUnused);
            }
            if opts.get("direct").is_some() {
                return Err(opts.error(
                    "direct= is for a store on an expander (cxl=NAME): it keeps part of the expander for design c's working copies".into(),
                ));
            }
            if opts.get("cipher").is_some() {
                return Err(opts.error(
                    "cipher= is for a store on an expander (cxl=NAME); a file store's pages are sealed by the store itself".into(),
                ));
            }
            let store = base.join(opts.required("path")?);
            let store_size = opts.size("size")?;
            if !store.exists() && store_size.is_none() {
                return Err(ConfigError::PmoStoreSize { path: store });
            }
            check_parent_dir("PMO store", &store)?;
            (store, store_size, None)
        }
    };
    let window_size = match window {
        Some(text) => parse_size(text)?,
        None => DEFAULT_PMO_WINDOW,
    };
    if window_size == 0 || !window_size.is_multiple_of(PMEM_ALIGN) || window_size > MAX_PMO_WINDOW {
        return Err(ConfigError::PmoWindow(ByteSize(window_size)));
    }
    let kdf = match kdf {
        Some(text) => KdfParams::parse(text).map_err(|e| ConfigError::PmoKdf(e.to_string()))?,
        None => KdfParams::DEFAULT,
    };
    if let Some(anchor) = &anchor {
        check_parent_dir("PMO anchor", anchor)?;
    }
    let design = design.map(str::parse::<Design>).transpose()?;
    if let Some(d) = design {
        if d.needs_range_encryption() && on_cxl.is_none() {
            return Err(ConfigError::PmoDesignWithoutCxl(d.to_string()));
        }
    }
    let predictor = predictor
        .map(str::parse::<PredictorSpec>)
        .transpose()?
        .unwrap_or_default();
    let dram_budget = match dram {
        Some(text) => {
            if on_cxl.is_none() {
                return Err(ConfigError::PmoDramWithoutCxl);
            }
            let opts = OptionList::parse("pmo-dram", text, &["size", "policy"], 1)?;
            let bytes = opts.size("size")?.unwrap_or(0);
            if bytes < PAGE_BYTES || !bytes.is_multiple_of(PAGE_BYTES) || bytes > window_size {
                return Err(ConfigError::PmoDram(ByteSize(bytes)));
            }
            let placement = match opts.get("policy") {
                Some(p) => p
                    .parse::<PlacementPolicy>()
                    .map_err(|e| opts.error(e.to_string()))?,
                None => PlacementPolicy::default(),
            };
            Some(DramBudget { bytes, placement })
        }
        None => None,
    };
    let device = PmoConfig {
        store,
        store_size,
        design,
        window_size,
        fault_threads: PMO_FAULT_THREADS,
        test_kill_in_psync: src.flags().pmo_test_kill_in_psync,
        predictor,
        store_options: StoreOptions {
            kdf,
            anchor,
            // A store formatted on the expander leaves the working area out.
            len: on_cxl.as_ref().and_then(|on| {
                let dev = cxl_t3.get(on.expander)?;
                Some(dev.size - on.direct?)
            }),
            ..StoreOptions::default()
        },
        dram_budget,
        device_memory_latency_ns: on_cxl
            .as_ref()
            .and_then(|on| cxl_t3.get(on.expander))
            .map_or(0, |dev| dev.devmem_latency_ns),
    };
    Ok((Some(device), on_cxl))
}

#[cfg(test)]
mod tests;
