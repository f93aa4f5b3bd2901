//! A PCIe root complex: one segment reached through ECAM and the legacy
//! 0xCF8/0xCFC mechanism, with BARs routed onto the MMIO bus.
//!
//! Functions sit on a root bus (bus 0, or the root bus of a CXL host
//! bridge) or behind a root port; a config cycle for a bus that is no root
//! bus goes to the function behind the port whose secondary bus it is, as
//! the guest has programmed it.
//!
//! The functions themselves (config space, MSI-X, the root port, the virtio-pci transport) are
//! the `pci` crate's; this is the machine's side: where config cycles and BAR accesses arrive
//! on its buses and which function they go to.

use locked::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::bus::{Bus, BusDevice, BusError};
use pci::config::{PciConfig, PciIds};
use pci::PciDevice;

/// Errors building the PCI topology.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    /// All 32 device numbers of bus 0 are used.
    #[error("no free PCI slot on bus 0")]
    NoSlot,
    /// A function was placed at a bus:device.function already in use.
    #[error("PCI function {0:02x}:{1:02x}.{2} is taken")]
    Taken(u8, u8, u8),
    /// A function was to go behind a bridge that is not there.
    #[error("no bridge at {0:02x}:{1:02x}.{2} to plug a function behind")]
    NoBridge(u8, u8, u8),
    /// The address window has no aligned room of that size left.
    #[error("PCI window exhausted allocating {0:#x} bytes")]
    NoSpace(u64),
    /// A BAR overlaps another device's range on the MMIO bus.
    #[error("map BAR: {0}")]
    Bus(#[from] BusError),
}

/// The host bridge at 00.0: identity only.
struct HostBridge {
    config: PciConfig,
}

impl PciDevice for HostBridge {
    fn config(&self) -> &PciConfig {
        &self.config
    }
    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
        self.config.write_reg(reg, offset, data);
    }
}

/// Forwards MMIO within one BAR to its device.
struct BarRoute {
    dev: Arc<Mutex<dyn PciDevice>>,
    bar: usize,
}

impl BusDevice for BarRoute {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.dev.locked().bar_read(self.bar, offset, data);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        self.dev.locked().bar_write(self.bar, offset, data);
    }
}

/// Bump allocator for a BAR window; every BAR is naturally aligned.
pub struct Window {
    next: u64,
    end: u64,
}

impl Window {
    /// The window `[start, start + size)`, all free.
    pub fn new(start: u64, size: u64) -> Self {
        Window {
            next: start,
            end: start + size,
        }
    }

    /// The next `size` bytes aligned to `align` (a power of two); never freed.
    pub fn alloc(&mut self, size: u64, align: u64) -> Result<u64, PciError> {
        let base = self
            .next
            .checked_next_multiple_of(align.max(1))
            .ok_or(PciError::NoSpace(size))?;
        let end = base.checked_add(size).ok_or(PciError::NoSpace(size))?;
        if end > self.end {
            return Err(PciError::NoSpace(size));
        }
        self.next = end;
        Ok(base)
    }
}

struct Slot {
    dev: Arc<Mutex<dyn PciDevice>>,
    /// Where each BAR is mapped on the MMIO bus now.
    mapped: BTreeMap<usize, u64>,
}

/// Segment 0: functions on root buses, keyed by (bus, devfn), and the one
/// function (device 0) behind each root port, keyed by the port's address.
pub struct PciRoot {
    slots: BTreeMap<(u8, u8), Slot>,
    behind: BTreeMap<(u8, u8), Slot>,
    mmio: Arc<Bus>,
}

/// Vendor/device of the host bridge: QEMU's generic PCIe host, which Linux
/// treats as a plain bridge without quirks.
const HOST_BRIDGE_IDS: PciIds = PciIds {
    vendor: 0x1b36,
    device: 0x0008,
    class: 0x06_00_00,
    revision: 0,
    subsystem_vendor: 0x1b36,
    subsystem: 0x0008,
};

impl PciRoot {
    /// Bus 0 with its host bridge at 00.0; BARs are mapped on `mmio` as the guest enables
    /// them.
    pub fn new(mmio: Arc<Bus>) -> Self {
        let mut root = PciRoot {
            slots: BTreeMap::new(),
            behind: BTreeMap::new(),
            mmio,
        };
        root.slots.insert(
            (0, 0),
            Slot {
                dev: Arc::new(Mutex::new(HostBridge {
                    config: PciConfig::new(HOST_BRIDGE_IDS),
                })),
                mapped: BTreeMap::new(),
            },
        );
        root
    }

    /// Plugs a function into the next free device number (function 0); returns its devfn.
    pub fn add(&mut self, dev: Arc<Mutex<dyn PciDevice>>) -> Result<u8, PciError> {
        let devfn = (1..32u8)
            .map(|d| d << 3)
            .find(|df| !self.slots.contains_key(&(0, *df)))
            .ok_or(PciError::NoSlot)?;
        self.add_at(0, devfn, dev)?;
        Ok(devfn)
    }

    /// Plugs a function at `bus`/`devfn` of a root bus.
    pub fn add_at(
        &mut self,
        bus: u8,
        devfn: u8,
        dev: Arc<Mutex<dyn PciDevice>>,
    ) -> Result<(), PciError> {
        if self.slots.contains_key(&(bus, devfn)) {
            return Err(PciError::Taken(bus, devfn >> 3, devfn & 7));
        }
        self.slots.insert(
            (bus, devfn),
            Slot {
                dev,
                mapped: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Plugs a function as device 0 behind the bridge at `bus`/`devfn`.
    pub fn add_behind(
        &mut self,
        bus: u8,
        devfn: u8,
        dev: Arc<Mutex<dyn PciDevice>>,
    ) -> Result<(), PciError> {
        if !self.slots.contains_key(&(bus, devfn)) {
            return Err(PciError::NoBridge(bus, devfn >> 3, devfn & 7));
        }
        if self.behind.contains_key(&(bus, devfn)) {
            return Err(PciError::Taken(bus, devfn >> 3, devfn & 7));
        }
        self.behind.insert(
            (bus, devfn),
            Slot {
                dev,
                mapped: BTreeMap::new(),
            },
        );
        Ok(())
    }

    /// Where a config cycle for `bus`/`devfn` goes: a root-bus function, or
    /// device 0 behind the bridge whose secondary bus is `bus`.
    fn route(&self, bus: u8, devfn: u8) -> Option<Route> {
        if self.slots.contains_key(&(bus, devfn)) {
            return Some(Route::Root(bus, devfn));
        }
        if devfn != 0 {
            return None;
        }
        self.behind
            .keys()
            .find(|key| {
                self.slots
                    .get(key)
                    .is_some_and(|bridge| bridge.dev.locked().secondary_bus() == Some(bus))
            })
            .map(|key| Route::Behind(key.0, key.1))
    }

    fn slot(&self, bus: u8, devfn: u8) -> Option<&Slot> {
        match self.route(bus, devfn)? {
            Route::Root(b, d) => self.slots.get(&(b, d)),
            Route::Behind(b, d) => self.behind.get(&(b, d)),
        }
    }

    /// Config read of register `reg` of bus/devfn; absent functions read all-ones.
    pub fn config_read(&self, bus: u8, devfn: u8, reg: usize) -> u32 {
        match self.slot(bus, devfn) {
            Some(s) => s.dev.locked().config().read_reg(reg),
            None => 0xffff_ffff,
        }
    }

    /// Config write of `data` at byte `offset` of register `reg` of bus/devfn; BAR moves are
    /// applied to the MMIO bus. Writes to absent functions are dropped.
    pub fn config_write(&mut self, bus: u8, devfn: u8, reg: usize, offset: usize, data: &[u8]) {
        let slot = match self.route(bus, devfn) {
            Some(Route::Root(b, d)) => self.slots.get_mut(&(b, d)),
            Some(Route::Behind(b, d)) => self.behind.get_mut(&(b, d)),
            None => None,
        };
        let Some(slot) = slot else {
            return;
        };
        let mut dev = slot.dev.locked();
        dev.config_write(reg, offset, data);
        // Re-map any BAR whose decoded address changed.
        let bars: Vec<usize> = dev.config().bar_indices().collect();
        for bar in bars {
            let now = dev.config().bar_addr(bar);
            let before = slot.mapped.get(&bar).copied();
            if now == before {
                continue;
            }
            if let Some(old) = before {
                if let Err(e) = self.mmio.remove(old) {
                    log::warn!("PCI {devfn:#x} BAR{bar}: {e}");
                }
                slot.mapped.remove(&bar);
            }
            let (Some(new), Some(size)) = (now, dev.config().bar_size(bar)) else {
                dev.bar_moved(bar, before, None);
                continue;
            };
            let route = Arc::new(Mutex::new(BarRoute {
                dev: slot.dev.clone(),
                bar,
            }));
            match self.mmio.insert(new, size, route) {
                Ok(()) => {
                    slot.mapped.insert(bar, new);
                    dev.bar_moved(bar, before, Some(new));
                }
                Err(e) => log::warn!("PCI {devfn:#x} BAR{bar} at {new:#x}: {e}"),
            }
        }
    }
}

/// Which map holds the target of a config cycle.
enum Route {
    Root(u8, u8),
    Behind(u8, u8),
}

/// Splits an ECAM offset into (bus, devfn, register, byte offset).
fn ecam_decode(offset: u64) -> (u8, u8, usize, usize) {
    (
        (offset >> 20) as u8,
        (offset >> 12) as u8,
        ((offset & 0xfff) >> 2) as usize,
        (offset & 3) as usize,
    )
}

/// The ECAM window on the MMIO bus.
pub struct Ecam(pub Arc<Mutex<PciRoot>>);

impl BusDevice for Ecam {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let (bus, devfn, reg, byte) = ecam_decode(offset);
        let v = self.0.locked().config_read(bus, devfn, reg);
        read_bytes(v, byte, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (bus, devfn, reg, byte) = ecam_decode(offset);
        if byte + data.len() > 4 {
            return;
        }
        self.0.locked().config_write(bus, devfn, reg, byte, data);
    }
}

fn read_bytes(v: u32, byte: usize, data: &mut [u8]) {
    let bytes = v.to_le_bytes();
    for (i, d) in data.iter_mut().enumerate() {
        *d = bytes.get(byte + i).copied().unwrap_or(0xff);
    }
}

/// Configuration mechanism #1: address at 0xCF8, data at 0xCFC..0xCFF.
/// A byte write to 0xCF9 is the chipset's reset control register instead.
pub struct PioConfig {
    root: Arc<Mutex<PciRoot>>,
    address: u32,
    on_reset: Box<dyn Fn() + Send>,
}

/// Reset control (0xCF9): bit 2 starts the reset.
const RESET_CONTROL_RST_CPU: u8 = 1 << 2;

impl PioConfig {
    /// Ports 0xCF8-0xCFF over `root`; `on_reset` runs when the guest resets through 0xCF9.
    pub fn new(root: Arc<Mutex<PciRoot>>, on_reset: Box<dyn Fn() + Send>) -> Self {
        PioConfig {
            root,
            address: 0,
            on_reset,
        }
    }

    fn target(&self) -> Option<(u8, u8, usize)> {
        (self.address & 0x8000_0000 != 0).then_some((
            (self.address >> 16) as u8,
            (self.address >> 8) as u8,
            ((self.address >> 2) & 0x3f) as usize,
        ))
    }
}

impl BusDevice for PioConfig {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset < 4 {
            read_bytes(self.address, offset as usize, data);
            return;
        }
        let v = match self.target() {
            Some((bus, devfn, reg)) => self.root.locked().config_read(bus, devfn, reg),
            None => 0xffff_ffff,
        };
        read_bytes(v, (offset - 4) as usize, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset < 4 {
            match (offset, data) {
                (0, &[a, b, c, d]) => self.address = u32::from_le_bytes([a, b, c, d]),
                (1, &[v]) if v & RESET_CONTROL_RST_CPU != 0 => (self.on_reset)(),
                _ => {}
            }
            return;
        }
        let byte = (offset - 4) as usize;
        if byte + data.len() > 4 {
            return;
        }
        if let Some((bus, devfn, reg)) = self.target() {
            self.root.locked().config_write(bus, devfn, reg, byte, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pci::config::BarKind;

    struct Probe {
        config: PciConfig,
        moved: Vec<(usize, Option<u64>, u64)>,
        last_write: Option<(usize, u64, Vec<u8>)>,
    }

    impl PciDevice for Probe {
        fn config(&self) -> &PciConfig {
            &self.config
        }
        fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
            self.config.write_reg(reg, offset, data);
        }
        fn bar_read(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill((bar as u8) << 4 | offset as u8);
        }
        fn bar_write(&mut self, bar: usize, offset: u64, data: &[u8]) {
            self.last_write = Some((bar, offset, data.to_vec()));
        }
        fn bar_moved(&mut self, bar: usize, old: Option<u64>, new: Option<u64>) {
            if let Some(new) = new {
                self.moved.push((bar, old, new));
            }
        }
    }

    #[test]
    fn bars_follow_the_guest_and_route_mmio() {
        let mmio = Arc::new(Bus::new());
        let root = Arc::new(Mutex::new(PciRoot::new(mmio.clone())));
        let mut cfg = PciConfig::new(HOST_BRIDGE_IDS);
        cfg.add_bar(0, 0x1000, BarKind::Mem32).unwrap();
        cfg.set_bar_addr(0, 0xc000_0000);
        let probe = Arc::new(Mutex::new(Probe {
            config: cfg,
            moved: vec![],
            last_write: None,
        }));
        let devfn = root.lock().unwrap().add(probe.clone()).unwrap();
        assert_eq!(devfn, 8);

        let resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = resets.clone();
        let mut cf8 = PioConfig::new(
            root.clone(),
            Box::new(move || {
                r.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }),
        );
        cf8.write(1, &[0x02]);
        assert_eq!(resets.load(std::sync::atomic::Ordering::Relaxed), 0);
        cf8.write(1, &[0x06]);
        assert_eq!(resets.load(std::sync::atomic::Ordering::Relaxed), 1);
        let addr = 0x8000_0000u32 | (u32::from(devfn) << 8) | (1 << 2);
        cf8.write(0, &addr.to_le_bytes());
        cf8.write(4, &[0x02, 0x00]); // memory decode on
        assert_eq!(probe.lock().unwrap().moved, vec![(0, None, 0xc000_0000)]);
        let mut b = [0u8; 1];
        assert!(mmio.read(0xc000_0003, &mut b));
        assert_eq!(b[0], 0x03);

        // Move the BAR through ECAM.
        let mut ecam = Ecam(root.clone());
        ecam.write(u64::from(devfn) << 12 | 0x10, &0xc010_0000u32.to_le_bytes());
        assert_eq!(
            probe.lock().unwrap().moved.last(),
            Some(&(0, Some(0xc000_0000), 0xc010_0000))
        );
        assert!(!mmio.read(0xc000_0003, &mut b));
        assert!(mmio.write(0xc010_0008, &[7]));
        assert_eq!(probe.lock().unwrap().last_write, Some((0, 8, vec![7])));

        // Absent functions and buses read all-ones.
        let mut d = [0u8; 4];
        ecam.read(3 << 15, &mut d);
        assert_eq!(d, [0xff; 4]);
        ecam.read(1 << 20, &mut d);
        assert_eq!(d, [0xff; 4]);
        // The host bridge answers at 00.0.
        ecam.read(0, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0x0008_1b36);
    }

    #[test]
    fn config_cycles_reach_functions_behind_a_root_port() {
        let mmio = Arc::new(Bus::new());
        let mut root = PciRoot::new(mmio.clone());
        let port = Arc::new(Mutex::new(pci::root_port::RootPort::new(
            0x80,
            0x81,
            0xd000_0000,
            1 << 20,
        )));
        root.add_at(0x80, 0, port).unwrap();
        let mut cfg = PciConfig::new(HOST_BRIDGE_IDS);
        cfg.add_bar(0, 0x1000, BarKind::Mem32).unwrap();
        cfg.set_bar_addr(0, 0xd000_0000);
        let probe = Arc::new(Mutex::new(Probe {
            config: cfg,
            moved: vec![],
            last_write: None,
        }));
        assert!(matches!(
            root.add_behind(0x90, 0, probe.clone()),
            Err(PciError::NoBridge(0x90, 0, 0))
        ));
        root.add_behind(0x80, 0, probe.clone()).unwrap();
        assert!(matches!(
            root.add_behind(0x80, 0, probe.clone()),
            Err(PciError::Taken(..))
        ));
        // The port answers on its root bus, the function on the secondary bus, device 0 only.
        assert_eq!(root.config_read(0x80, 0, 2) >> 8, 0x06_04_00);
        assert_eq!(root.config_read(0x81, 0, 0), 0x0008_1b36);
        assert_eq!(root.config_read(0x81, 8, 0), 0xffff_ffff);
        assert_eq!(root.config_read(0x82, 0, 0), 0xffff_ffff);
        // Memory decode on through the secondary bus maps the BAR.
        root.config_write(0x81, 0, 1, 0, &[0x02]);
        assert_eq!(probe.lock().unwrap().moved, vec![(0, None, 0xd000_0000)]);
        // The guest renumbers the secondary bus: routing follows.
        root.config_write(0x80, 0, 6, 1, &[0x85]);
        assert_eq!(root.config_read(0x81, 0, 0), 0xffff_ffff);
        assert_eq!(root.config_read(0x85, 0, 0), 0x0008_1b36);
    }

    #[test]
    fn window_aligns_and_runs_out() {
        let mut w = Window::new(0x1000, 0x10000);
        assert_eq!(w.alloc(0x100, 0x100).unwrap(), 0x1000);
        assert_eq!(w.alloc(0x4000, 0x4000).unwrap(), 0x4000);
        assert!(matches!(
            w.alloc(0x10000, 0x10000),
            Err(PciError::NoSpace(_))
        ));
    }
}
