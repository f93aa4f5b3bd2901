//! A PCIe root port: the bridge a CXL host bridge's endpoint sits behind
//! (Linux 6.1's CXL core only attaches an endpoint that is below a root
//! port of an ACPI0016 host bridge).
//!
//! Firmware-style, the bus numbers and the memory window are preset, so
//! the guest finds everything configured and keeps it. The port forwards
//! nothing by itself: config cycles are routed by the VMM's root complex from
//! the secondary bus number, and BARs are mapped directly on the MMIO bus.

use super::config::{PciConfig, PciIds};
use super::PciDevice;

/// QEMU's generic PCIe root port identity, which Linux binds no quirks to.
const ROOT_PORT_IDS: PciIds = PciIds {
    vendor: 0x1b36,
    device: 0x000c,
    class: 0x06_04_00,
    revision: 0,
    subsystem_vendor: 0,
    subsystem: 0,
};

const HEADER_TYPE_REG: usize = 3;
const HEADER_TYPE_BRIDGE: u32 = 1 << 16;
const BUS_NUMBERS_REG: usize = 6;
const MEMORY_WINDOW_REG: usize = 8;
const BRIDGE_CONTROL_REG: usize = 15;
/// PCIe capability: version 2, device/port type 4 (root port).
const PCIE_CAP_ID: u8 = 0x10;
const PCIE_CAP_ROOT_PORT_V2: u16 = 0x0042;
/// Link capabilities: 2.5 GT/s, x1, data-link-layer active reporting.
const LNKCAP: u32 = 0x1 | (0x1 << 4) | (1 << 20);
/// Link status: 2.5 GT/s, x1, data link layer active.
const LNKSTA: u16 = 0x1 | (0x1 << 4) | (1 << 13);

/// A root port with its secondary bus and 32-bit memory window preset.
pub struct RootPort {
    config: PciConfig,
}

impl RootPort {
    /// A port on `primary` whose link leads to bus `secondary`, forwarding
    /// memory in `[mem_base, mem_base + mem_size)` (1 MiB granular).
    pub fn new(primary: u8, secondary: u8, mem_base: u32, mem_size: u32) -> Self {
        let mut config = PciConfig::new(ROOT_PORT_IDS);
        config.init_reg(HEADER_TYPE_REG, HEADER_TYPE_BRIDGE, 0);
        let buses = u32::from(primary) | (u32::from(secondary) << 8) | (u32::from(secondary) << 16);
        config.init_reg(BUS_NUMBERS_REG, buses, 0x00ff_ffff);
        let limit = mem_base.saturating_add(mem_size.max(1 << 20) - 1);
        let window = ((mem_base >> 16) & 0xfff0) | (limit & 0xfff0_0000);
        config.init_reg(MEMORY_WINDOW_REG, window, 0xfff0_fff0);
        // Interrupt line plus the bridge control word (parity, SERR, bus reset...).
        config.init_reg(BRIDGE_CONTROL_REG, 0, 0x0fff_00ff);
        let mut body = [0u8; 0x3a];
        let mut wmask = [0u8; 0x3a];
        // Offsets below are from the capability start minus its 2-byte header.
        body[0..2].copy_from_slice(&PCIE_CAP_ROOT_PORT_V2.to_le_bytes());
        // Device control (0x08) and link control (0x10), root control (0x1c): storage.
        wmask[0x06..0x08].copy_from_slice(&0x7fffu16.to_le_bytes());
        body[0x0a..0x0e].copy_from_slice(&LNKCAP.to_le_bytes());
        wmask[0x0e..0x10].copy_from_slice(&0x0ffbu16.to_le_bytes());
        body[0x10..0x12].copy_from_slice(&LNKSTA.to_le_bytes());
        wmask[0x1a..0x1c].copy_from_slice(&0x001fu16.to_le_bytes());
        // A fresh config space always has room for one capability.
        if let Err(e) = config.add_capability(PCIE_CAP_ID, &body, &wmask) {
            log::error!("root port: {e}");
        }
        RootPort { config }
    }
}

impl PciDevice for RootPort {
    fn config(&self) -> &PciConfig {
        &self.config
    }
    fn config_write(&mut self, reg: usize, offset: usize, data: &[u8]) {
        self.config.write_reg(reg, offset, data);
    }
    fn secondary_bus(&self) -> Option<u8> {
        Some((self.config.read_reg(BUS_NUMBERS_REG) >> 8) as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type1_header_with_preset_buses_and_window() {
        let mut p = RootPort::new(0x80, 0x81, 0xd000_0000, 1 << 20);
        assert_eq!((p.config().read_reg(HEADER_TYPE_REG) >> 16) & 0x7f, 1);
        assert_eq!(p.config().read_reg(2) >> 8, 0x06_04_00);
        assert_eq!(p.config().read_reg(BUS_NUMBERS_REG) & 0xff_ffff, 0x81_81_80);
        assert_eq!(p.config().read_reg(MEMORY_WINDOW_REG), 0xd000_d000);
        assert_eq!(p.secondary_bus(), Some(0x81));
        // The guest may renumber; routing follows.
        p.config_write(BUS_NUMBERS_REG, 1, &[0x85]);
        assert_eq!(p.secondary_bus(), Some(0x85));
        // PCIe capability says root port.
        let cap = (p.config().read_reg(13) & 0xff) as usize;
        let hdr = p.config().read_reg(cap / 4);
        assert_eq!(hdr & 0xff, u32::from(PCIE_CAP_ID));
        assert_eq!((hdr >> 16) & 0xf0, 0x40);
        assert_eq!(p.config().read_reg(cap / 4 + 3), LNKCAP);
        // No I/O or prefetchable window: read-only zeros.
        p.config_write(7, 0, &[0xf0, 0xf0]);
        p.config_write(9, 0, &[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(p.config().read_reg(7), 0);
        assert_eq!(p.config().read_reg(9), 0);
    }
}
