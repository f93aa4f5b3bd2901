//! A PCI(e) function's 4 KiB configuration space: registers, write masks,
//! BARs and capability lists.
//!
//! Every register is stored together with a mask of the bits the guest may
//! change, so sizing a BAR (write all-ones, read back) and the read-only
//! fields fall out of one rule: `new = (old & !mask) | (written & mask)`.

/// Size of PCIe extended configuration space.
pub const CONFIG_SPACE_SIZE: usize = 4096;
const NUM_REGS: usize = CONFIG_SPACE_SIZE / 4;

const COMMAND_REG: usize = 1;
const COMMAND_IO: u32 = 1 << 0;
const COMMAND_MEMORY: u32 = 1 << 1;
const COMMAND_BUS_MASTER: u32 = 1 << 2;
const COMMAND_INTX_DISABLE: u32 = 1 << 10;
const STATUS_CAP_LIST: u32 = 1 << (16 + 4);
const BAR0_REG: usize = 4;
const CAP_PTR_REG: usize = 13;
const INTERRUPT_REG: usize = 15;
const FIRST_CAP: usize = 0x40;
const FIRST_EXT_CAP: usize = 0x100;

/// What a BAR decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// 32-bit memory BAR.
    Mem32,
    /// 64-bit memory BAR; uses the next BAR slot for the high half.
    Mem64 {
        /// Reads have no side effects, so the guest may map it write-combined.
        prefetchable: bool,
    },
}

#[derive(Clone, Copy, Debug)]
struct Bar {
    size: u64,
    kind: BarKind,
}

/// Errors building a configuration space (programming errors in device models).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// BAR index past 5, or already used (also as the upper half of a 64-bit BAR).
    #[error("BAR {0} is out of range or taken")]
    BarSlot(usize),
    /// BAR sizes are powers of two, and at least a page so BARs never share one.
    #[error("BAR size {0:#x} is not a power of two of at least 4 KiB")]
    BarSize(u64),
    /// The capability list (or extended list) has no space left for the capability.
    #[error("no room for a {0}-byte capability")]
    NoRoom(usize),
}

/// Identity of a function, written once into its header.
#[derive(Clone, Copy, Debug)]
pub struct PciIds {
    /// PCI-SIG vendor ID.
    pub vendor: u16,
    /// Device ID under that vendor (what the guest driver matches).
    pub device: u16,
    /// Class code (base << 16 | subclass << 8 | prog-if).
    pub class: u32,
    /// Revision ID.
    pub revision: u8,
    /// Subsystem vendor ID.
    pub subsystem_vendor: u16,
    /// Subsystem ID (virtio: the device type for transitional drivers).
    pub subsystem: u16,
}

/// The configuration space of one PCI function (header type 0).
pub struct PciConfig {
    regs: Box<[u32; NUM_REGS]>,
    wmask: Box<[u32; NUM_REGS]>,
    bars: [Option<Bar>; 6],
    /// Slots holding the upper half of a 64-bit BAR.
    upper_half: [bool; 6],
    next_cap: usize,
    last_cap_next: usize,
    next_ext_cap: usize,
    last_ext_cap: Option<usize>,
}

impl PciConfig {
    /// A type 0 header with `ids`, no BARs and empty capability lists.
    pub fn new(ids: PciIds) -> Self {
        let mut c = PciConfig {
            regs: Box::new([0; NUM_REGS]),
            wmask: Box::new([0; NUM_REGS]),
            bars: [None; 6],
            upper_half: [false; 6],
            next_cap: FIRST_CAP,
            last_cap_next: CAP_PTR_REG * 4,
            next_ext_cap: FIRST_EXT_CAP,
            last_ext_cap: None,
        };
        c.regs[0] = u32::from(ids.vendor) | (u32::from(ids.device) << 16);
        c.regs[2] = (ids.class << 8) | u32::from(ids.revision);
        c.regs[11] = u32::from(ids.subsystem_vendor) | (u32::from(ids.subsystem) << 16);
        c.wmask[COMMAND_REG] =
            COMMAND_IO | COMMAND_MEMORY | COMMAND_BUS_MASTER | COMMAND_INTX_DISABLE;
        // Interrupt line is scratch space for the OS; no INTx pin.
        c.wmask[INTERRUPT_REG] = 0xff;
        c
    }

    /// Declares BAR `index` of `size` bytes.
    pub fn add_bar(&mut self, index: usize, size: u64, kind: BarKind) -> Result<(), ConfigError> {
        let wide = matches!(kind, BarKind::Mem64 { .. });
        let taken = |i: usize| self.bars[i].is_some() || self.upper_half[i];
        if index >= 6 || taken(index) || (wide && index >= 5) {
            return Err(ConfigError::BarSlot(index));
        }
        if wide && taken(index + 1) {
            return Err(ConfigError::BarSlot(index + 1));
        }
        if !size.is_power_of_two() || size < 4096 || (!wide && size > 1 << 31) {
            return Err(ConfigError::BarSize(size));
        }
        let reg = BAR0_REG + index;
        let mask = !(size - 1);
        match kind {
            BarKind::Mem32 => {
                self.regs[reg] = 0;
                self.wmask[reg] = mask as u32 & 0xffff_fff0;
            }
            BarKind::Mem64 { prefetchable } => {
                self.regs[reg] = 0x4 | if prefetchable { 0x8 } else { 0 };
                self.wmask[reg] = mask as u32 & 0xffff_fff0;
                self.wmask[reg + 1] = (mask >> 32) as u32;
                self.upper_half[index + 1] = true;
            }
        }
        self.bars[index] = Some(Bar { size, kind });
        Ok(())
    }

    /// Sets a BAR's address, as firmware would before the OS looks.
    pub fn set_bar_addr(&mut self, index: usize, addr: u64) {
        let Some(bar) = self.bars.get(index).copied().flatten() else {
            return;
        };
        let reg = BAR0_REG + index;
        self.regs[reg] = (self.regs[reg] & 0xf) | (addr as u32 & 0xffff_fff0);
        if matches!(bar.kind, BarKind::Mem64 { .. }) {
            self.regs[reg + 1] = (addr >> 32) as u32;
        }
    }

    /// The BAR's size, if it exists.
    pub fn bar_size(&self, index: usize) -> Option<u64> {
        self.bars.get(index).copied().flatten().map(|b| b.size)
    }

    /// The address the BAR decodes now, or `None` if the BAR does not exist,
    /// memory decoding is off, or the address is not usable (mid-sizing).
    pub fn bar_addr(&self, index: usize) -> Option<u64> {
        let bar = self.bars.get(index).copied().flatten()?;
        if self.regs[COMMAND_REG] & COMMAND_MEMORY == 0 {
            return None;
        }
        let reg = BAR0_REG + index;
        let mut addr = u64::from(self.regs[reg] & 0xffff_fff0);
        if matches!(bar.kind, BarKind::Mem64 { .. }) {
            addr |= u64::from(self.regs[reg + 1]) << 32;
        }
        (addr != 0 && addr.checked_add(bar.size).is_some()).then_some(addr)
    }

    /// Indices of declared BARs.
    pub fn bar_indices(&self) -> impl Iterator<Item = usize> + '_ {
        (0..6).filter(|i| self.bars[*i].is_some())
    }

    /// Appends a standard capability. `body` starts after the ID and next
    /// pointer; `wmask` (same length as `body`, or empty for read-only)
    /// marks writable bits. Returns the capability's offset.
    pub fn add_capability(
        &mut self,
        id: u8,
        body: &[u8],
        wmask: &[u8],
    ) -> Result<usize, ConfigError> {
        let len = (body.len() + 2).next_multiple_of(4);
        if self.next_cap + len > FIRST_EXT_CAP {
            return Err(ConfigError::NoRoom(len));
        }
        let off = self.next_cap;
        self.put_byte(off, id);
        self.put_byte(off + 1, 0);
        for (i, b) in body.iter().enumerate() {
            self.put_byte(off + 2 + i, *b);
        }
        for (i, m) in wmask.iter().enumerate() {
            self.put_mask_byte(off + 2 + i, *m);
        }
        self.put_byte(self.last_cap_next, off as u8);
        self.last_cap_next = off + 1;
        self.next_cap = off + len;
        self.regs[COMMAND_REG] |= STATUS_CAP_LIST;
        Ok(off)
    }

    /// Appends a PCIe extended capability (`body` follows the 4-byte header).
    pub fn add_ext_capability(
        &mut self,
        id: u16,
        version: u8,
        body: &[u8],
        wmask: &[u8],
    ) -> Result<usize, ConfigError> {
        let len = (body.len() + 4).next_multiple_of(4);
        if self.next_ext_cap + len > CONFIG_SPACE_SIZE {
            return Err(ConfigError::NoRoom(len));
        }
        let off = self.next_ext_cap;
        self.regs[off / 4] = u32::from(id) | (u32::from(version & 0xf) << 16);
        for (i, b) in body.iter().enumerate() {
            self.put_byte(off + 4 + i, *b);
        }
        for (i, m) in wmask.iter().enumerate() {
            self.put_mask_byte(off + 4 + i, *m);
        }
        if let Some(prev) = self.last_ext_cap {
            self.regs[prev / 4] = (self.regs[prev / 4] & 0x000f_ffff) | ((off as u32) << 20);
        }
        self.last_ext_cap = Some(off);
        self.next_ext_cap = off + len;
        Ok(off)
    }

    /// Sets register `reg` and the mask of its guest-writable bits, for
    /// headers this type does not build itself (a bridge's type-1 header).
    pub fn init_reg(&mut self, reg: usize, value: u32, wmask: u32) {
        if let (Some(r), Some(m)) = (self.regs.get_mut(reg), self.wmask.get_mut(reg)) {
            *r = value;
            *m = wmask;
        }
    }

    fn put_byte(&mut self, off: usize, v: u8) {
        let shift = (off % 4) * 8;
        let r = &mut self.regs[off / 4];
        *r = (*r & !(0xff << shift)) | (u32::from(v) << shift);
    }

    fn put_mask_byte(&mut self, off: usize, v: u8) {
        let shift = (off % 4) * 8;
        let r = &mut self.wmask[off / 4];
        *r = (*r & !(0xff << shift)) | (u32::from(v) << shift);
    }

    /// Reads the 32-bit register `reg` (0..1024); out of range reads as all-ones.
    pub fn read_reg(&self, reg: usize) -> u32 {
        self.regs.get(reg).copied().unwrap_or(0xffff_ffff)
    }

    /// Writes `data` (1, 2 or 4 bytes) at byte `offset` within register `reg`,
    /// honouring the write mask. Malformed accesses are ignored.
    pub fn write_reg(&mut self, reg: usize, offset: usize, data: &[u8]) {
        if reg >= NUM_REGS || offset + data.len() > 4 || data.is_empty() {
            return;
        }
        for (i, b) in data.iter().enumerate() {
            let shift = (offset + i) * 8;
            let m = (self.wmask[reg] >> shift) & 0xff;
            let old = (self.regs[reg] >> shift) & 0xff;
            let new = (old & !m) | (u32::from(*b) & m);
            self.regs[reg] = (self.regs[reg] & !(0xff << shift)) | (new << shift);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PciConfig {
        PciConfig::new(PciIds {
            vendor: 0x1af4,
            device: 0x105b,
            class: 0x018000,
            revision: 1,
            subsystem_vendor: 0x1af4,
            subsystem: 0x40,
        })
    }

    #[test]
    fn header_is_read_only_except_command() {
        let mut c = cfg();
        assert_eq!(c.read_reg(0), 0x105b_1af4);
        c.write_reg(0, 0, &[0, 0, 0, 0]);
        assert_eq!(c.read_reg(0), 0x105b_1af4);
        c.write_reg(1, 0, &[0xff, 0xff]);
        assert_eq!(c.read_reg(1) & 0xffff, 0x0407);
        assert_eq!(c.read_reg(2), 0x0180_0001);
        assert_eq!(c.read_reg(2000), 0xffff_ffff);
    }

    #[test]
    fn bar_sizing_and_decoding() {
        let mut c = cfg();
        c.add_bar(0, 0x8000, BarKind::Mem32).unwrap();
        c.add_bar(2, 1 << 32, BarKind::Mem64 { prefetchable: true })
            .unwrap();
        assert_eq!(
            c.add_bar(3, 0x1000, BarKind::Mem32),
            Err(ConfigError::BarSlot(3))
        );
        assert_eq!(
            c.add_bar(4, 0x1800, BarKind::Mem32),
            Err(ConfigError::BarSize(0x1800))
        );
        c.set_bar_addr(0, 0xc000_0000);
        c.set_bar_addr(2, 0x40_0000_0000);
        assert_eq!(
            c.bar_addr(0),
            None,
            "decoding is off until the OS enables it"
        );
        c.write_reg(1, 0, &[0x2]);
        assert_eq!(c.bar_addr(0), Some(0xc000_0000));
        assert_eq!(c.bar_addr(2), Some(0x40_0000_0000));
        c.write_reg(4, 0, &0xffff_ffffu32.to_le_bytes());
        assert_eq!(c.read_reg(4), 0xffff_8000);
        c.write_reg(6, 0, &0xffff_ffffu32.to_le_bytes());
        c.write_reg(7, 0, &0xffff_ffffu32.to_le_bytes());
        assert_eq!(c.read_reg(6), 0x0000_000c);
        assert_eq!(c.read_reg(7), 0xffff_ffff);
        c.write_reg(4, 0, &0xc001_0000u32.to_le_bytes());
        assert_eq!(c.bar_addr(0), Some(0xc001_0000));
    }

    #[test]
    fn capability_lists_chain() {
        let mut c = cfg();
        let a = c.add_capability(0x09, &[16, 1, 0, 0], &[]).unwrap();
        let b = c
            .add_capability(0x11, &[0x03, 0x00, 0, 0, 0, 0, 0, 0, 0, 0], &[0, 0xc0])
            .unwrap();
        assert_eq!(a, 0x40);
        assert_eq!(c.read_reg(CAP_PTR_REG) & 0xff, 0x40);
        assert_eq!((c.read_reg(a / 4) >> 8) & 0xff, b as u32);
        assert_ne!(c.read_reg(1) & STATUS_CAP_LIST, 0);
        // MSI-X control: only enable and function-mask are writable.
        c.write_reg(b / 4, 2, &[0xff, 0xff]);
        assert_eq!(c.read_reg(b / 4) >> 16, 0xc003);
        let e1 = c.add_ext_capability(0x23, 1, &[1, 2, 3, 4], &[]).unwrap();
        let e2 = c.add_ext_capability(0x23, 1, &[5, 6, 7, 8], &[]).unwrap();
        assert_eq!(e1, 0x100);
        assert_eq!(c.read_reg(e1 / 4) >> 20, e2 as u32);
        assert_eq!(c.read_reg(e2 / 4 + 1), 0x0807_0605);
    }
}
