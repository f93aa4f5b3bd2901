//! The memory device's BAR: the component register block (with the HDM
//! decoder capability) and the device register block (capability array,
//! device status, primary mailbox, memory device status).
//!
//! BAR layout (128 KiB, both blocks 64 KiB aligned as the register locator
//! requires):
//!
//! ```text
//!   0x0_0000  component block   +0x1000 CXL.cache/mem capability array
//!                               +0x1010 HDM decoder capability
//!   0x1_0000  device registers  +0x0000 capability array (3 capabilities)
//!                               +0x0100 device status
//!                               +0x0200 primary mailbox (+ 2 KiB payload)
//!                               +0x1000 memory device status
//! ```
//!
//! Malformed accesses (wrong size or alignment, holes) read as zero and
//! are ignored on write; they never reach the models behind.

use crate::dvsec::{RegBlock, BLOCK_COMPONENT, BLOCK_MEMDEV};
use crate::hdm::{DecoderEvent, HdmDecoders, DECODER_COUNT};
use crate::mailbox::{Commands, Mailbox, MailboxError, MAILBOX_LEN};

/// Size of the BAR holding both register blocks.
pub const BAR_SIZE: u64 = 0x2_0000;
/// BAR offset of the component register block (register locator block id
/// [`BLOCK_COMPONENT`]).
pub const COMPONENT_OFFSET: u64 = 0;
/// BAR offset of the memory device register block (register locator block
/// id [`BLOCK_MEMDEV`]).
pub const DEVICE_OFFSET: u64 = 0x1_0000;
const BLOCK_SIZE: u64 = 0x1_0000;

/// CXL.cache/mem area of the component block and the HDM capability in it.
const CM_OFFSET: u64 = 0x1000;
const CM_CAP_ID: u32 = 1;
const HDM_CAP_ID: u32 = 5;
const HDM_PTR: u64 = 0x10;
const HDM_OFFSET: u64 = CM_OFFSET + HDM_PTR;

/// Device register capabilities: id, offset, length.
const CAP_STATUS: (u16, u64, u64) = (0x0001, 0x100, 0x100);
const CAP_MAILBOX: (u16, u64, u64) = (0x0002, 0x200, MAILBOX_LEN);
const CAP_MEMDEV: (u16, u64, u64) = (0x4000, 0x1000, 0x8);
const DEVICE_CAPS: [(u16, u64, u64); 3] = [CAP_STATUS, CAP_MAILBOX, CAP_MEMDEV];
/// Memory device status: media ready (bits 3:2 = 01) and mailbox ready (bit 4).
const MEMDEV_STATUS: u64 = (1 << 2) | (1 << 4);

/// The register side of one memory device.
pub struct DeviceRegs {
    /// The HDM decoders behind the component block's HDM capability.
    pub hdm: HdmDecoders,
    /// The primary mailbox of the device register block.
    pub mailbox: Mailbox,
}

const _: () = assert!(CAP_MAILBOX.1 + CAP_MAILBOX.2 <= CAP_MEMDEV.1);

impl DeviceRegs {
    /// [`DECODER_COUNT`] HDM decoders over `commands.capacity` bytes and a
    /// mailbox whose commands run on a worker thread.
    pub fn new(commands: Commands) -> Result<Self, MailboxError> {
        Ok(DeviceRegs {
            hdm: HdmDecoders::new(DECODER_COUNT, commands.capacity),
            mailbox: Mailbox::new(commands)?,
        })
    }

    /// The same registers with a manual mailbox: a rung command runs at
    /// [`DeviceRegs::run_pending`]. No threads, so a test or fuzz target
    /// drives the whole BAR deterministically.
    pub fn manual(commands: Commands) -> Self {
        DeviceRegs {
            hdm: HdmDecoders::new(DECODER_COUNT, commands.capacity),
            mailbox: Mailbox::manual(commands),
        }
    }

    /// Runs a mailbox command queued on a manual mailbox; see
    /// [`Mailbox::run_pending`].
    pub fn run_pending(&mut self) -> bool {
        self.mailbox.run_pending()
    }

    /// Where the register locator says the blocks are, in BAR `bar`.
    pub fn blocks(bar: u8) -> [RegBlock; 2] {
        [
            RegBlock {
                bar,
                block_id: BLOCK_COMPONENT,
                offset: COMPONENT_OFFSET,
            },
            RegBlock {
                bar,
                block_id: BLOCK_MEMDEV,
                offset: DEVICE_OFFSET,
            },
        ]
    }

    /// Back to power-on state; returns decoders that stopped decoding.
    pub fn reset(&mut self) -> Vec<DecoderEvent> {
        self.hdm.reset()
    }

    /// A read of 1, 2, 4 or 8 bytes at `offset` in the BAR.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if !matches!(data.len(), 1 | 2 | 4 | 8) || offset.checked_add(data.len() as u64).is_none() {
            return;
        }
        if (DEVICE_OFFSET..DEVICE_OFFSET + BLOCK_SIZE).contains(&offset) {
            self.device_read(offset - DEVICE_OFFSET, data);
        } else if offset < BLOCK_SIZE {
            self.component_read(offset - COMPONENT_OFFSET, data);
        }
    }

    /// A write of 1, 2, 4 or 8 bytes at `offset` in the BAR; returns the
    /// decoder changes the VMM must act on, in order (a 64-bit write is two
    /// 32-bit ones, so there can be two).
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Vec<DecoderEvent> {
        let mut events = Vec::new();
        if !matches!(data.len(), 1 | 2 | 4 | 8) || offset.checked_add(data.len() as u64).is_none() {
            return events;
        }
        if (DEVICE_OFFSET..DEVICE_OFFSET + BLOCK_SIZE).contains(&offset) {
            let o = offset - DEVICE_OFFSET;
            let (_, mb, len) = CAP_MAILBOX;
            if (mb..mb + len).contains(&o) && o + data.len() as u64 <= mb + len {
                self.mailbox.write(o - mb, data);
            }
            return events;
        }
        if offset >= BLOCK_SIZE {
            return events;
        }
        // Component registers: 32-bit accesses (a 64-bit one is two).
        let o = offset - COMPONENT_OFFSET;
        if !(HDM_OFFSET..HDM_OFFSET + self.hdm.len()).contains(&o) || !o.is_multiple_of(4) {
            return events;
        }
        let rel = o - HDM_OFFSET;
        let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        match data.len() {
            4 => events.extend(self.hdm.write(rel, word(data))),
            8 if rel.is_multiple_of(8) => {
                events.extend(self.hdm.write(rel, word(&data[..4])));
                events.extend(self.hdm.write(rel + 4, word(&data[4..])));
            }
            _ => {}
        }
        events
    }

    fn component_read(&self, o: u64, data: &mut [u8]) {
        if !o.is_multiple_of(4) || !matches!(data.len(), 4 | 8) {
            return;
        }
        let reg = |o: u64| -> u32 {
            match o {
                CM_OFFSET => CM_CAP_ID | (1 << 16) | (1 << 20) | (1 << 24),
                x if x == CM_OFFSET + 4 => HDM_CAP_ID | (1 << 16) | ((HDM_PTR as u32) << 20),
                x if (HDM_OFFSET..HDM_OFFSET + self.hdm.len()).contains(&x) => {
                    self.hdm.read(x - HDM_OFFSET)
                }
                _ => 0,
            }
        };
        data[..4].copy_from_slice(&reg(o).to_le_bytes());
        if data.len() == 8 {
            data[4..].copy_from_slice(&reg(o + 4).to_le_bytes());
        }
    }

    fn device_read(&self, o: u64, data: &mut [u8]) {
        let (_, mb, len) = CAP_MAILBOX;
        if (mb..mb + len).contains(&o) {
            self.mailbox.read(o - mb, data);
            return;
        }
        for (i, d) in data.iter_mut().enumerate() {
            *d = self.device_byte(o + i as u64);
        }
    }

    /// One byte of the device block outside the mailbox.
    fn device_byte(&self, o: u64) -> u8 {
        let byte = |v: u64, at: u64| (v >> (8 * at)) as u8;
        match o {
            // Capability array register: id 0, version 1, count.
            0..=7 => byte((1 << 16) | ((DEVICE_CAPS.len() as u64) << 32), o),
            0x10..=0x3f => {
                let i = (o / 0x10 - 1) as usize;
                let Some((id, off, len)) = DEVICE_CAPS.get(i) else {
                    return 0;
                };
                let hdr = u64::from(*id) | (1 << 16);
                match o % 0x10 {
                    r @ 0..=3 => byte(hdr, r),
                    r @ 4..=7 => byte(*off, r - 4),
                    r @ 8..=11 => byte(*len, r - 8),
                    _ => 0,
                }
            }
            x if (CAP_MEMDEV.1..CAP_MEMDEV.1 + 8).contains(&x) => {
                byte(MEMDEV_STATUS, x - CAP_MEMDEV.1)
            }
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hdm::{CTRL_COMMIT, CTRL_COMMITTED};
    use crate::lsa::MemLsa;
    use crate::mailbox::{FixedHealth, GET_LSA, MB_CMD, MB_CTRL, MB_PAYLOAD, MB_STATUS, SET_LSA};
    use proptest::prelude::*;

    /// A 1 GiB device with a manual mailbox over a memory LSA.
    fn regs() -> DeviceRegs {
        DeviceRegs::manual(Commands::new(
            1 << 30,
            MemLsa::new(4096),
            Box::new(FixedHealth(0)),
        ))
    }

    fn r32(r: &DeviceRegs, o: u64) -> u32 {
        let mut d = [0u8; 4];
        r.read(o, &mut d);
        u32::from_le_bytes(d)
    }

    fn r64(r: &DeviceRegs, o: u64) -> u64 {
        let mut d = [0u8; 8];
        r.read(o, &mut d);
        u64::from_le_bytes(d)
    }

    #[test]
    fn device_capability_array_as_linux_walks_it() {
        let r = regs();
        let arr = r64(&r, DEVICE_OFFSET);
        assert_eq!(arr & 0xffff, 0, "capability array id");
        assert_eq!((arr >> 32) & 0xffff, 3);
        let mut found = vec![];
        for cap in 1..=3u64 {
            let h = DEVICE_OFFSET + cap * 0x10;
            found.push((r32(&r, h) & 0xffff, r32(&r, h + 4), r32(&r, h + 8)));
        }
        assert_eq!(
            found,
            vec![
                (1, 0x100, 0x100),
                (2, 0x200, MAILBOX_LEN as u32),
                (0x4000, 0x1000, 8)
            ]
        );
        let status = r64(&r, DEVICE_OFFSET + 0x1000);
        assert_eq!((status >> 2) & 3, 1, "media ready");
        assert_ne!(status & (1 << 4), 0, "mailbox ready");
        assert_eq!(
            r32(&r, DEVICE_OFFSET + 0x200) & 0x1f,
            11,
            "mailbox payload 2 KiB"
        );
    }

    #[test]
    fn component_block_leads_to_the_hdm_decoder() {
        let mut r = regs();
        let cm = r32(&r, CM_OFFSET);
        assert_eq!(cm & 0xffff, 1);
        assert_eq!(cm >> 24, 1, "one capability");
        let h = r32(&r, CM_OFFSET + 4);
        assert_eq!(h & 0xffff, 5);
        let hdm = CM_OFFSET + u64::from(h >> 20);
        assert_eq!(hdm, HDM_OFFSET);
        // Program decoder 0 with 32-bit writes and a 64-bit one, then commit.
        r.write(hdm + 0x10, &0u32.to_le_bytes());
        r.write(hdm + 0x14, &0x20u32.to_le_bytes());
        r.write(hdm + 0x18, &(1u64 << 30).to_le_bytes());
        let ev = r.write(hdm + 0x20, &CTRL_COMMIT.to_le_bytes());
        assert_eq!(
            ev,
            vec![DecoderEvent::Committed {
                index: 0,
                hpa: 0x20_0000_0000,
                size: 1 << 30,
                dpa: 0
            }]
        );
        assert_eq!(r.reset(), vec![DecoderEvent::Uncommitted { index: 0 }]);
    }

    #[test]
    fn bad_sizes_and_offsets_are_ignored() {
        let mut r = regs();
        let hdm = HDM_OFFSET;
        // Misaligned, odd-sized and out-of-BAR writes change nothing.
        assert_eq!(r.write(hdm + 0x21, &[0xff; 4]), vec![]);
        assert_eq!(r.write(hdm + 0x20, &[0xff; 3]), vec![]);
        assert_eq!(r.write(hdm + 0x20, &[0xff; 2]), vec![]);
        assert_eq!(r.write(BAR_SIZE + 4, &[0xff; 4]), vec![]);
        assert_eq!(r.write(u64::MAX - 1, &[0xff; 4]), vec![]);
        assert_eq!(r32(&r, hdm + 0x20), 0);
        // Read-only device registers stay put; holes read zero.
        r.write(DEVICE_OFFSET, &[0xff; 8]);
        assert_eq!((r64(&r, DEVICE_OFFSET) >> 32) & 0xffff, 3);
        assert_eq!(r32(&r, DEVICE_OFFSET + 0x8000), 0);
        let mut odd = [0xaau8; 3];
        r.read(hdm, &mut odd);
        assert_eq!(odd, [0; 3]);
        assert_eq!(r32(&r, hdm + 1), 0);
    }

    #[test]
    fn four_decoders_behind_the_bar_and_64_bit_control_writes() {
        let mut r = regs();
        assert_eq!(r32(&r, HDM_OFFSET) & 0xf, 2, "decoder count field: 4");
        assert_eq!(r.hdm.count(), 4);
        // Decoder 3's registers are in the BAR; past them is a hole.
        let d3 = HDM_OFFSET + crate::hdm::decoder_reg(3, 0);
        r.write(d3 + 4, &0x21u32.to_le_bytes());
        assert_eq!(r32(&r, d3 + 4), 0x21);
        let past = HDM_OFFSET + crate::hdm::decoder_reg(4, 0);
        assert_eq!(r.write(past + 4, &1u32.to_le_bytes()), vec![]);
        assert_eq!(r32(&r, past + 4), 0);
        // Decoder 0 programmed, then control and skip-low in one 64-bit write.
        r.write(HDM_OFFSET + 0x14, &0x20u32.to_le_bytes());
        r.write(HDM_OFFSET + 0x18, &(1u64 << 28).to_le_bytes());
        let ev = r.write(
            HDM_OFFSET + 0x20,
            &(u64::from(CTRL_COMMIT) | (1 << 60)).to_le_bytes(),
        );
        assert_eq!(
            ev,
            vec![DecoderEvent::Committed {
                index: 0,
                hpa: 0x20_0000_0000,
                size: 1 << 28,
                dpa: 0
            }]
        );
        assert_eq!(
            r32(&r, HDM_OFFSET + 0x24),
            0,
            "skip is frozen once committed"
        );
    }

    #[test]
    fn mailbox_through_the_bar() {
        let mut r = regs();
        let mb = DEVICE_OFFSET + 0x200;
        let mut set = 8u32.to_le_bytes().to_vec();
        set.extend_from_slice(&[0; 4]);
        set.extend_from_slice(b"label");
        // Accesses of 1, 2, 4 or 8 bytes only.
        r.write(mb + MB_PAYLOAD, &set[..8]);
        r.write(mb + MB_PAYLOAD + 8, &set[8..12]);
        r.write(mb + MB_PAYLOAD + 12, &set[12..]);
        r.write(
            mb + MB_CMD,
            &(u64::from(SET_LSA) | (13 << 16)).to_le_bytes(),
        );
        r.write(mb + MB_CTRL, &1u32.to_le_bytes());
        assert_eq!(r32(&r, mb + MB_CTRL) & 1, 1, "busy until it runs");
        assert!(r.run_pending());
        assert_eq!(r32(&r, mb + MB_CTRL) & 1, 0);
        assert_eq!(r64(&r, mb + MB_STATUS) >> 32, 0);
        let mut get = 8u32.to_le_bytes().to_vec();
        get.extend_from_slice(&5u32.to_le_bytes());
        r.write(mb + MB_PAYLOAD, &get);
        r.write(mb + MB_CMD, &(u64::from(GET_LSA) | (8 << 16)).to_le_bytes());
        r.write(mb + MB_CTRL, &1u32.to_le_bytes());
        assert!(r.run_pending());
        assert_eq!((r64(&r, mb + MB_CMD) >> 16) & 0x1f_ffff, 5);
        let mut out = [0u8; 8];
        r.read(mb + MB_PAYLOAD, &mut out);
        assert_eq!(&out[..5], b"label");
    }

    /// One guest access to the BAR.
    #[derive(Debug, Clone)]
    enum Access {
        Write(u64, Vec<u8>),
        Read(u64, usize),
        Run,
    }

    /// Offsets where the registers are, and anywhere else.
    fn offset() -> impl Strategy<Value = u64> {
        prop_oneof![
            (0u64..0xa0).prop_map(|o| HDM_OFFSET + o),
            (0u64..0x30).prop_map(|o| DEVICE_OFFSET + 0x200 + o),
            (0u64..0x40).prop_map(|o| DEVICE_OFFSET + 0x200 + MB_PAYLOAD + o),
            0u64..BAR_SIZE + 0x10,
            any::<u64>(),
        ]
    }

    fn access() -> impl Strategy<Value = Access> {
        prop_oneof![
            6 => (offset(), proptest::collection::vec(any::<u8>(), 0..10)).prop_map(|(o, d)| Access::Write(o, d)),
            2 => (offset(), 0usize..10).prop_map(|(o, n)| Access::Read(o, n)),
            1 => Just(Access::Run),
        ]
    }

    proptest! {
        /// Whatever the guest writes and reads in the BAR, nothing panics,
        /// and the committed decoders never overlap in HPA or DPA.
        #[test]
        fn hostile_bar_accesses(accesses in proptest::collection::vec(access(), 1..200)) {
            let mut r = regs();
            for a in accesses {
                match a {
                    Access::Write(o, d) => {
                        for ev in r.write(o, &d) {
                            if let DecoderEvent::Committed { dpa, size, .. } = ev {
                                prop_assert!(dpa.checked_add(size).is_some_and(|e| e <= 1 << 30));
                            }
                        }
                    }
                    Access::Read(o, n) => {
                        let mut b = vec![0xaau8; n];
                        r.read(o, &mut b);
                        if !matches!(n, 1 | 2 | 4 | 8) {
                            prop_assert!(b.iter().all(|x| *x == 0));
                        }
                    }
                    Access::Run => {
                        r.run_pending();
                    }
                }
                let c = r.hdm.committed();
                for (k, a) in c.iter().enumerate() {
                    prop_assert_ne!(r32(&r, HDM_OFFSET + crate::hdm::decoder_reg(a.index, 0x10)) & CTRL_COMMITTED, 0);
                    for b in &c[k + 1..] {
                        prop_assert!(a.dpa + a.size <= b.dpa && a.hpa + a.size <= b.hpa, "{:?} {:?}", a, b);
                    }
                }
            }
        }
    }
}
