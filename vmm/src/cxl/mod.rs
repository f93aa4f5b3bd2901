//! CXL Type 3 memory expanders in the machine: for each device a host
//! bridge (`ACPI0016`) with one root port and the memory device behind it,
//! a CEDT that describes the bridge's component block (CHBS) and a fixed
//! memory window (CFMWS) the guest's region lands in, and the `ACPI0017`
//! device that makes `cxl_acpi` look at all of it.
//!
//! The device model (registers, mailbox, decoders) is `cxl_t3`; the memory
//! is a `cxl_t3::expander::Expander`. This file is the glue: it exposes the
//! model as a PCI function and, when the guest commits an HDM decoder, maps
//! the decoded HPA range as a KVM memslot onto the expander's host mapping,
//! so the guest reads and writes it at memory speed (cache misses are
//! served by the expander's userfaultfd threads, not by MMIO exits).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use acpi_tables::aml;
use acpi_tables::sdt::Sdt;
use acpi_tables::Aml;
use cxl_t3::dvsec;
use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig, ExpanderError};
use cxl_t3::lsa::{Lsa, LsaError};
use cxl_t3::mailbox::{Commands, Health, MailboxError};
use cxl_t3::regs::{self, DeviceRegs};
use cxl_t3::WorkingArea;
use pci::config::{BarKind, ConfigError, PciConfig, PciIds};
use pci::root_port::RootPort;
use pci::PciDevice;
use pmo_crypto::{ExtentKeyring, RangeCipher};
use pmo_media::Backing;
use zeroize::Zeroizing;

use crate::config::{CxlT3Config, PmoOnCxl};
use crate::layout;
use crate::pci_root::{PciError, PciRoot};
use crate::vm::SlotMapper;

mod decoders;
use decoders::DecoderMaps;

/// Errors building a CXL device.
#[derive(Debug, thiserror::Error)]
pub enum CxlError {
    #[error("cxl-t3 {media}: {source}")]
    Expander {
        media: String,
        source: ExpanderError,
    },
    #[error("cxl-t3: {0}")]
    Lsa(#[from] LsaError),
    #[error("cxl-t3 key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("cxl-t3 config space: {0}")]
    Config(#[from] ConfigError),
    #[error("cxl-t3: {0}")]
    Pci(#[from] PciError),
    #[error("cxl-t3: {0}")]
    Mailbox(#[from] MailboxError),
    #[error("cxl-t3: at most {} devices", layout::CXL_MAX_HOST_BRIDGES)]
    TooMany,
    #[error("cxl-t3 {media}: the PMO store takes {store} of {device} bytes, no room for direct={direct} (the store was formatted without it)")]
    NoWorkingArea {
        media: String,
        store: u64,
        device: u64,
        direct: u64,
    },
}

/// Class code the guest's `cxl_pci` binds to: memory controller, CXL, CXL 2.0 memory device.
const CXL_MEMDEV_CLASS: u32 = 0x05_02_10;
const MEMDEV_IDS: PciIds = PciIds {
    vendor: 0x1b36,
    device: 0x00c3,
    class: CXL_MEMDEV_CLASS,
    revision: 1,
    subsystem_vendor: 0x1b36,
    subsystem: 0x00c3,
};
/// PCIe capability of an endpoint: version 2, device/port type 0.
const PCIE_CAP_ID: u8 = 0x10;
const PCIE_CAP_ENDPOINT_V2: u16 = 0x0002;
/// The register BAR.
const REGS_BAR: usize = 0;
/// Range key id the VMM uses for a whole-device `key=FILE`.
const WHOLE_DEVICE_KEY_ID: u16 = 1;

/// Where one device's host bridge lives in the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostBridge {
    /// `_UID`, also the CHBS and CFMWS target.
    pub uid: u32,
    /// Root bus (`_BBN`); the root port's secondary bus is the next one.
    pub bus: u8,
    /// 32-bit MMIO slice for BARs below the bridge.
    pub mmio32: u64,
    /// Component register block announced in the CHBS.
    pub chbs: u64,
    /// Fixed memory window (HPA) for the device's region.
    pub window: u64,
    pub window_size: u64,
}

impl HostBridge {
    /// The bridge of device `index` with its memory window at `window`.
    pub fn new(index: usize, window: u64, window_size: u64) -> Result<Self, CxlError> {
        if index >= layout::CXL_MAX_HOST_BRIDGES {
            return Err(CxlError::TooMany);
        }
        let i = index as u64;
        Ok(HostBridge {
            // PCI0 is _UID 0.
            uid: index as u32 + 1,
            bus: layout::CXL_BUS_START + index as u8 * layout::CXL_BUSES_PER_BRIDGE,
            mmio32: layout::CXL_MMIO32_START + i * layout::CXL_MMIO32_PER_BRIDGE,
            chbs: layout::CXL_CHBS_START + i * layout::CXL_CHBS_SIZE,
            window,
            window_size,
        })
    }

    fn bus_end(&self) -> u8 {
        self.bus + (layout::CXL_BUSES_PER_BRIDGE - 1)
    }
}

/// Dirty shutdowns, as the expander counted them at open.
struct ExpanderHealth(Arc<Expander>);

impl Health for ExpanderHealth {
    fn dirty_shutdown_count(&self) -> u32 {
        self.0.dirty_shutdown_count()
    }
}

/// The memory device as a PCI function.
pub struct CxlMemdev {
    config: PciConfig,
    regs: DeviceRegs,
    /// Guest mappings of committed decoders; dropped before `expander`.
    maps: DecoderMaps<SlotMapper>,
    expander: Arc<Expander>,
}

/// A stable serial number for the media file, so the guest sees the same
/// device across VMM restarts (FNV-1a of its canonical path).
fn serial_for(media: &Path) -> u64 {
    let path = media.canonicalize().unwrap_or_else(|_| media.to_path_buf());
    path.as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// Reads a range key: 32 bytes (XTS-AES-128) or 64 (XTS-AES-256), a
/// trailing newline dropped. The buffer is wiped when dropped.
fn read_key(path: &Path) -> Result<Zeroizing<Vec<u8>>, CxlError> {
    let err = |reason: String| CxlError::Key {
        path: path.display().to_string(),
        reason,
    };
    let mut key = Zeroizing::new(Vec::with_capacity(72));
    std::fs::File::open(path)
        .and_then(|f| f.take(72).read_to_end(&mut key))
        .map_err(|e| err(e.to_string()))?;
    if key.last() == Some(&b'\n') {
        key.pop();
    }
    if key.len() != 32 && key.len() != 64 {
        return Err(err(format!(
            "{} bytes; a key is 32 (XTS-AES-128) or 64 (XTS-AES-256) bytes",
            key.len()
        )));
    }
    Ok(key)
}

/// The expander part of a `--cxl-t3` device.
fn expander_config(cfg: &CxlT3Config) -> ExpanderConfig {
    ExpanderConfig {
        media: cfg.media.clone(),
        size: cfg.size,
        cache_bytes: cfg.cache,
        ways: cfg.ways,
        media_latency_ns: cfg.latency_ns,
    }
}

/// Opens the expander `cfg` describes (its media created when missing).
fn open_expander(cfg: &CxlT3Config) -> Result<Arc<Expander>, CxlError> {
    open_expander_with(&expander_config(cfg))
}

fn open_expander_with(cfg: &ExpanderConfig) -> Result<Arc<Expander>, CxlError> {
    Expander::open(cfg).map_err(|source| CxlError::Expander {
        media: cfg.media.display().to_string(),
        source,
    })
}

/// A PMO store's medium on a `guest=off` expander.
pub struct PmoStoreMedium {
    /// The expander: the machine flushes it and marks it clean at exit.
    pub expander: Arc<Expander>,
    /// Its whole DPA space with its extent keys: each PMO extent under its own TEE range key.
    pub medium: Backing,
    /// The media held nothing yet: the store is formatted on it.
    pub blank: bool,
}

/// Opens the expander `cfg` for the PMO store `on` describes: its extents keyed from the
/// master key file (read here; this copy is wiped on return, the keyring's when it goes).
pub fn pmo_store_medium(cfg: &CxlT3Config, on: &PmoOnCxl) -> Result<PmoStoreMedium, CxlError> {
    keyed_store_medium(&expander_config(cfg), &on.master_key, on.cipher)
}

/// Opens the expander `cfg` as a PMO store's medium whose extents are keyed with `cipher`
/// from the master key in `master_key` (the VMM's `--pmo-store cxl=` and the host's `pmovmm
/// store` commands on expander media).
pub fn keyed_store_medium(
    cfg: &ExpanderConfig,
    master_key: &Path,
    cipher: RangeCipher,
) -> Result<PmoStoreMedium, CxlError> {
    let master = read_key(master_key)?;
    let keyring = ExtentKeyring::new(&master)
        .map_err(|e| CxlError::Key {
            path: master_key.display().to_string(),
            reason: e.to_string(),
        })?
        .with_cipher(cipher);
    let blank = media_is_blank(&cfg.media).map_err(|e| CxlError::Expander {
        media: cfg.media.display().to_string(),
        source: ExpanderError::Os {
            what: "read media",
            source: e,
        },
    })?;
    let expander = open_expander_with(cfg)?;
    let medium = Backing::from(CxlMedium::new(expander.clone()).with_keyring(keyring));
    Ok(PmoStoreMedium {
        expander,
        medium,
        blank,
    })
}

/// The working area of design `c` on the PMO store's expander: whatever of the DPA space
/// the store (`store_len` bytes from the start) leaves, if anything. `direct=` asks for at
/// least that much; a store formatted with a working area keeps it without asking again.
pub fn working_area(
    cfg: &CxlT3Config,
    expander: &Arc<Expander>,
    store_len: u64,
    on: &PmoOnCxl,
) -> Result<Option<Arc<WorkingArea>>, CxlError> {
    let device = expander.size();
    let left = device.saturating_sub(store_len);
    if let Some(direct) = on.direct {
        if left < direct {
            return Err(CxlError::NoWorkingArea {
                media: cfg.media.display().to_string(),
                store: store_len,
                device,
                direct,
            });
        }
    }
    if left == 0 {
        return Ok(None);
    }
    WorkingArea::new(expander.clone(), store_len, device)
        .map(Some)
        .map_err(|source| CxlError::Expander {
            media: cfg.media.display().to_string(),
            source,
        })
}

/// Whether the media file holds nothing yet: missing, or every DPA byte zero (as `pmovmm cxl
/// create` leaves it). Only such media is formatted as a PMO store; anything else must open
/// as one, so a damaged store is an error rather than silently replaced. Holes are skipped
/// (`SEEK_DATA`): new media is all hole past its header, so this reads almost nothing.
pub fn media_is_blank(media: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let f = match std::fs::File::open(media) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = cxl_t3::media::HEADER_LEN;
    while at < len {
        let off = libc::off_t::try_from(at).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: lseek on a descriptor this function owns; no memory is touched.
        let data = unsafe { libc::lseek(f.as_raw_fd(), off, libc::SEEK_DATA) };
        if data < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                return Ok(true); // no data past `at`
            }
            return Err(e);
        }
        // Read on from the data: a chunk at a time, up to the end (a hole reads as zeros).
        at = data as u64;
        let want = usize::try_from((len - at).min(buf.len() as u64)).unwrap_or(buf.len());
        let n = f.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Ok(true);
        }
        // An OR over the chunk vectorizes; an early-exit scan does not.
        if buf[..n].iter().fold(0u8, |acc, &b| acc | b) != 0 {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

impl CxlMemdev {
    /// Opens the device's expander and LSA and builds its function for the
    /// host bridge `bridge`.
    pub fn new(
        cfg: &CxlT3Config,
        bridge: HostBridge,
        mapper: SlotMapper,
    ) -> Result<Self, CxlError> {
        let expander = open_expander(cfg)?;
        if let Some(path) = &cfg.key {
            let key = read_key(path)?;
            expander
                .set_range_key(WHOLE_DEVICE_KEY_ID, 0, cfg.size, &key)
                .map_err(|source| CxlError::Expander {
                    media: cfg.media.display().to_string(),
                    source,
                })?;
        }
        let lsa = Lsa::open(&cfg.lsa)?;
        let health = Box::new(ExpanderHealth(expander.clone()));
        let regs = DeviceRegs::new(Commands::new(cfg.size, lsa, health))?;

        let mut config = PciConfig::new(MEMDEV_IDS);
        config.add_bar(REGS_BAR, regs::BAR_SIZE, BarKind::Mem32)?;
        config.set_bar_addr(REGS_BAR, bridge.mmio32);
        let mut pcie = [0u8; 0x3a];
        pcie[0..2].copy_from_slice(&PCIE_CAP_ENDPOINT_V2.to_le_bytes());
        let mut pcie_mask = [0u8; 0x3a];
        pcie_mask[0x06..0x08].copy_from_slice(&0x7fffu16.to_le_bytes());
        config.add_capability(PCIE_CAP_ID, &pcie, &pcie_mask)?;
        let dsn = dvsec::serial_number(cfg.serial.unwrap_or_else(|| serial_for(&cfg.media)));
        config.add_ext_capability(dvsec::DSN_CAP_ID, 1, &dsn.body, &dsn.wmask)?;
        let dev = dvsec::device_dvsec(cfg.size);
        config.add_ext_capability(dvsec::DVSEC_CAP_ID, 1, &dev.body, &dev.wmask)?;
        let loc = dvsec::register_locator(&DeviceRegs::blocks(REGS_BAR as u8));
        config.add_ext_capability(dvsec::DVSEC_CAP_ID, 1, &loc.body, &loc.wmask)?;

        // SAFETY: the DPA space is the expander's mapping, which lives as
        // long as `self.expander`; `maps` is cleared before it can go
        // (`Drop for CxlMemdev`, and field order).
        let maps = unsafe {
            DecoderMaps::new(
                mapper,
                regs.hdm.count(),
                bridge.window,
                bridge.window_size,
                expander.host_addr(),
                expander.size(),
            )
        };
        Ok(CxlMemdev {
            config,
            regs,
            maps,
            expander,
        })
    }

    pub fn expander(&self) -> &Arc<Expander> {
        &self.expander
    }

    /// GPF at VMM shutdown: the decoded ranges leave the guest's memory map
    /// (a vCPU still running cannot store into the device any more), then
    /// the expander writes its dirty blocks back and marks the media clean.
    pub fn shutdown(&mut self) -> Result<(), ExpanderError> {
        self.maps.stop();
        self.expander.shutdown()
    }
}

impl Drop for CxlMemdev {
    fn drop(&mut self) {
        // Guest mappings go before the expander's memory can.
        self.maps.clear();
    }
}

impl PciDevice for CxlMemdev {
    fn config(&self) -> &PciConfig {
        &self.config
    }
    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
        self.config.write_reg(reg, offset, data);
    }
    fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        if bar == REGS_BAR {
            self.regs.read(offset, data);
        } else {
            data.fill(0xff);
        }
    }
    fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar != REGS_BAR {
            return;
        }
        for ev in self.regs.write(offset, data) {
            self.maps.on_event(ev);
        }
    }
}

/// Plugs a root port on `bridge`'s root bus and `dev` behind it.
pub fn plug(
    root: &mut PciRoot,
    bridge: &HostBridge,
    dev: Arc<std::sync::Mutex<CxlMemdev>>,
) -> Result<(), CxlError> {
    let port = RootPort::new(
        bridge.bus,
        bridge.bus + 1,
        bridge.mmio32 as u32,
        layout::CXL_MMIO32_PER_BRIDGE as u32,
    );
    root.add_at(bridge.bus, 0, Arc::new(std::sync::Mutex::new(port)))?;
    root.add_behind(bridge.bus, 0, dev)?;
    Ok(())
}

/// AML or a table already serialised.
pub struct RawAml(Vec<u8>);

impl Aml for RawAml {
    fn to_aml_bytes(&self, sink: &mut dyn acpi_tables::AmlSink) {
        sink.vec(&self.0);
    }
}

fn bytes(a: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    a.to_aml_bytes(&mut v);
    v
}

/// `Scope(\_SB)` with `ACPI0017` and one `ACPI0016` host bridge per device.
pub fn dsdt(bridges: &[HostBridge]) -> RawAml {
    let hid = aml::Name::new("_HID".into(), &"ACPI0017");
    let cxlm = RawAml(bytes(&aml::Device::new("CXLM".into(), vec![&hid])));
    let devices: Vec<RawAml> = bridges
        .iter()
        .enumerate()
        .map(|(i, b)| host_bridge(i, b))
        .collect();
    let mut children: Vec<&dyn Aml> = vec![&cxlm];
    children.extend(devices.iter().map(|d| d as &dyn Aml));
    RawAml(bytes(&aml::Scope::new("\\_SB_".into(), children)))
}

fn host_bridge(index: usize, b: &HostBridge) -> RawAml {
    let bus = aml::AddressSpace::<u16>::new_bus_number(b.bus.into(), b.bus_end().into());
    let mmio = aml::AddressSpace::<u32>::new_memory(
        aml::AddressSpaceCacheable::NotCacheable,
        true,
        b.mmio32 as u32,
        (b.mmio32 + layout::CXL_MMIO32_PER_BRIDGE - 1) as u32,
        None,
    );
    let crs = aml::ResourceTemplate::new(vec![&bus, &mmio]);
    let hid = aml::Name::new("_HID".into(), &"ACPI0016");
    let pnp0a08 = aml::EISAName::new("PNP0A08");
    let pnp0a03 = aml::EISAName::new("PNP0A03");
    let cid_pkg = aml::Package::new(vec![&pnp0a08, &pnp0a03]);
    let cid = aml::Name::new("_CID".into(), &cid_pkg);
    let adr = aml::Name::new("_ADR".into(), &aml::ZERO);
    let seg = aml::Name::new("_SEG".into(), &aml::ZERO);
    let uid = aml::Name::new("_UID".into(), &b.uid);
    let bbn_v = u32::from(b.bus);
    let bbn = aml::Name::new("_BBN".into(), &bbn_v);
    let crs = aml::Name::new("_CRS".into(), &crs);
    let name = format!("CXL{:X}", index & 0xf);
    RawAml(bytes(&aml::Device::new(
        name.as_str().into(),
        vec![&hid, &cid, &adr, &seg, &uid, &bbn, &crs],
    )))
}

/// CEDT structure types and their fixed fields.
const CEDT_CHBS: u8 = 0;
const CEDT_CFMWS: u8 = 1;
const CHBS_CXL_2_0: u32 = 1;
/// CFMWS restrictions: device coherent, host-only coherent, volatile, persistent.
const CFMWS_RESTRICTIONS: u16 = 0x0f;

/// The CEDT: a CHBS and a one-way CFMWS per host bridge.
pub fn cedt(bridges: &[HostBridge]) -> RawAml {
    let mut t = Sdt::new(*b"CEDT", 36, 1, *b"PMOVMM", *b"PMOVMMVM", 1);
    for b in bridges {
        let mut chbs = [0u8; 32];
        chbs[0] = CEDT_CHBS;
        chbs[2..4].copy_from_slice(&32u16.to_le_bytes());
        chbs[4..8].copy_from_slice(&b.uid.to_le_bytes());
        chbs[8..12].copy_from_slice(&CHBS_CXL_2_0.to_le_bytes());
        chbs[16..24].copy_from_slice(&b.chbs.to_le_bytes());
        chbs[24..32].copy_from_slice(&layout::CXL_CHBS_SIZE.to_le_bytes());
        t.append_slice(&chbs);
        let mut cfmws = [0u8; 40];
        cfmws[0] = CEDT_CFMWS;
        cfmws[2..4].copy_from_slice(&40u16.to_le_bytes());
        cfmws[8..16].copy_from_slice(&b.window.to_le_bytes());
        cfmws[16..24].copy_from_slice(&b.window_size.to_le_bytes());
        // ENIW 0 (one way), modulo arithmetic, HBIG 0 (256 bytes).
        cfmws[32..34].copy_from_slice(&CFMWS_RESTRICTIONS.to_le_bytes());
        // QTG 0, then the target list: this bridge.
        cfmws[36..40].copy_from_slice(&b.uid.to_le_bytes());
        t.append_slice(&cfmws);
    }
    RawAml(t.as_slice().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridges_take_their_own_buses_windows_and_blocks() {
        let a = HostBridge::new(0, 0x20_0000_0000, 1 << 30).unwrap();
        let b = HostBridge::new(1, 0x20_4000_0000, 1 << 28).unwrap();
        assert_eq!((a.uid, a.bus, a.bus_end()), (1, 0x80, 0x87));
        assert_eq!((b.uid, b.bus), (2, 0x88));
        assert_eq!(b.mmio32 - a.mmio32, layout::CXL_MMIO32_PER_BRIDGE);
        assert_eq!(b.chbs - a.chbs, layout::CXL_CHBS_SIZE);
        assert!(HostBridge::new(layout::CXL_MAX_HOST_BRIDGES, 0, 0).is_err());
    }

    #[test]
    fn cedt_layout() {
        let a = HostBridge::new(0, 0x20_0000_0000, 1 << 30).unwrap();
        let t = cedt(&[a]).0;
        assert_eq!(&t[0..4], b"CEDT");
        assert_eq!(
            u32::from_le_bytes(t[4..8].try_into().unwrap()) as usize,
            t.len()
        );
        assert_eq!(t.len(), 36 + 32 + 40);
        assert_eq!(t.iter().fold(0u8, |s, b| s.wrapping_add(*b)), 0);
        let chbs = &t[36..68];
        assert_eq!(chbs[0], 0);
        assert_eq!(u32::from_le_bytes(chbs[4..8].try_into().unwrap()), 1);
        assert_eq!(
            u64::from_le_bytes(chbs[16..24].try_into().unwrap()),
            layout::CXL_CHBS_START
        );
        let cfmws = &t[68..];
        assert_eq!(cfmws[0], 1);
        assert_eq!(
            u64::from_le_bytes(cfmws[8..16].try_into().unwrap()),
            0x20_0000_0000
        );
        assert_eq!(
            u64::from_le_bytes(cfmws[16..24].try_into().unwrap()),
            1 << 30
        );
        assert_eq!(u16::from_le_bytes(cfmws[32..34].try_into().unwrap()), 0x0f);
        assert_eq!(u32::from_le_bytes(cfmws[36..40].try_into().unwrap()), 1);
    }

    #[test]
    fn dsdt_names_the_devices() {
        let a = HostBridge::new(0, 0x20_0000_0000, 1 << 30).unwrap();
        let d = dsdt(&[a]).0;
        let has = |s: &[u8]| d.windows(s.len()).any(|w| w == s);
        assert!(has(b"ACPI0017"));
        assert!(has(b"ACPI0016"));
        assert!(has(b"CXL0"));
        assert!(has(b"_BBN"));
    }

    #[test]
    fn keys_are_32_or_64_bytes() {
        let dir = std::env::temp_dir().join(format!("cxl-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        std::fs::write(&p, [7u8; 32]).unwrap();
        assert_eq!(read_key(&p).unwrap().len(), 32);
        let mut nl = vec![7u8; 64];
        nl.push(b'\n');
        std::fs::write(&p, &nl).unwrap();
        assert_eq!(read_key(&p).unwrap().len(), 64);
        std::fs::write(&p, [7u8; 16]).unwrap();
        assert!(read_key(&p).unwrap_err().to_string().contains("16 bytes"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Only media with no DPA byte written is formatted as a PMO store; a store (or anything
    /// else) on it must open as one, and a PMO store on an expander works across reopens with
    /// the master key, formatted once.
    #[test]
    fn only_blank_media_is_formatted_as_a_pmo_store() {
        let dir = std::env::temp_dir().join(format!("cxl-pmo-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let media = dir.join("m.img");
        let key = dir.join("master");
        std::fs::write(&key, [9u8; 32]).unwrap();
        let cfg = CxlT3Config {
            media: media.clone(),
            size: 256 << 20,
            lsa: dir.join("m.img.lsa"),
            cache: 1 << 20,
            ways: 8,
            latency_ns: 0,
            devmem_latency_ns: 0,
            key: None,
            serial: None,
            id: Some("s".into()),
            guest: false,
        };
        assert!(media_is_blank(&media).unwrap(), "missing media");
        let on = PmoOnCxl {
            expander: 0,
            master_key: key.clone(),
            cipher: RangeCipher::default(),
            direct: None,
        };
        let m = pmo_store_medium(&cfg, &on).unwrap();
        assert!(m.blank);
        let opts = pmo_store::StoreOptions {
            kdf: pmo_crypto::KdfParams::INSECURE_FAST,
            ..Default::default()
        };
        let store = pmo_store::Store::open_or_format(m.medium, m.blank, opts.clone()).unwrap();
        drop(store);
        m.expander.shutdown().unwrap();
        drop(m.expander);
        assert!(!media_is_blank(&media).unwrap(), "a store was written");
        let m = pmo_store_medium(&cfg, &on).unwrap();
        assert!(!m.blank);
        pmo_store::Store::open_or_format(m.medium, m.blank, opts).unwrap();
        drop(m.expander);

        // A header and zero DPA bytes is blank; one byte past the header is not.
        std::fs::write(&media, vec![0u8; 4096 + 8192]).unwrap();
        assert!(media_is_blank(&media).unwrap());
        let mut b = vec![0u8; 4096 + 8192];
        b[4096 + 5000] = 1;
        std::fs::write(&media, b).unwrap();
        assert!(!media_is_blank(&media).unwrap());
        let mut b = vec![0u8; 4096 + 8192];
        b[100] = 1;
        std::fs::write(&media, b).unwrap();
        assert!(media_is_blank(&media).unwrap(), "the header is not DPA");
        std::fs::write(&key, [9u8; 16]).unwrap();
        assert!(pmo_store_medium(&cfg, &on).is_err(), "a short master key");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn serial_is_stable_per_path() {
        let a = serial_for(Path::new("/no/such/a.img"));
        assert_eq!(a, serial_for(Path::new("/no/such/a.img")));
        assert_ne!(a, serial_for(Path::new("/no/such/b.img")));
    }
}
