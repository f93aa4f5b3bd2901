//! The CXL Type 3 device's register BAR: the component block's HDM
//! decoders and the device block's capability array and primary mailbox,
//! driven with the accesses a guest can make.
//!
//! The first byte picks the device: the register BAR as the VMM builds it
//! (`DeviceRegs`, found the way Linux finds it: through the CXL.cache/mem
//! capability array and the device capability array), or a bare
//! `HdmDecoders` with 1..=10 decoders (the VMM will soon build several).
//! Then a program of steps: raw reads and writes of any size at any offset,
//! decoder programming and commits, mailbox commands (payload, command
//! register, doorbell), and resets.
//!
//! Oracle: no panic; every doorbell ends with the doorbell clear and a
//! return code the mailbox defines, with no output unless it succeeded;
//! SET_LSA / GET_LSA agree with a model of the label area, IDENTIFY reports
//! the capacity; the decoder events (what the VMM maps) agree with the
//! decoders' COMMITTED bits and registers, and committed decoders have
//! aligned, non-empty, pairwise disjoint HPA and DPA ranges inside the
//! device's capacity.

use std::collections::BTreeMap;

use cxl_t3::hdm::{
    DecoderEvent, HdmDecoders, CTRL_COMMIT, CTRL_COMMITTED, CTRL_ERR_NOT_COMMITTED,
    CTRL_LOCK_ON_COMMIT, HDM_ALIGN, HDM_CAP,
};
use cxl_t3::lsa::Lsa;
use cxl_t3::mailbox::{
    Commands, Health, CAPACITY_UNIT, GET_LOG, GET_LSA, GET_SUPPORTED_LOGS, IDENTIFY, IDENTIFY_LEN,
    MAILBOX_LEN, MB_CMD, MB_CTRL, MB_PAYLOAD, MB_STATUS, PAYLOAD_SIZE, RC_INTERNAL_ERROR,
    RC_INVALID_INPUT, RC_SUCCESS, RC_UNSUPPORTED, SET_LSA,
};
use cxl_t3::mailbox::{CEL_UUID, GET_HEALTH_INFO, GET_SHUTDOWN_STATE, SET_SHUTDOWN_STATE};
use cxl_t3::regs::{DeviceRegs, BAR_SIZE, DEVICE_OFFSET};

use crate::common::{Input, ScratchDir};

const MAX_STEPS: usize = 96;
/// Decoder register layout inside the HDM capability (CXL 2.0 8.2.5.12).
const DECODER_BASE: u64 = 0x10;
const DECODER_STRIDE: u64 = 0x20;
const OPCODES: &[u16] = &[
    GET_SUPPORTED_LOGS,
    GET_LOG,
    IDENTIFY,
    GET_LSA,
    SET_LSA,
    GET_HEALTH_INFO,
    GET_SHUTDOWN_STATE,
    SET_SHUTDOWN_STATE,
];

struct NoDirt;
impl Health for NoDirt {
    fn dirty_shutdown_count(&self) -> u32 {
        0
    }
}

/// What the steps act on: the whole BAR or bare decoders.
enum Dev {
    Regs {
        regs: Box<DeviceRegs>,
        /// Offset of the HDM capability in the BAR.
        hdm: u64,
        /// Offset of the mailbox in the BAR.
        mailbox: u64,
    },
    Hdm(HdmDecoders),
}

impl Dev {
    fn hdm_read(&self, rel: u64) -> u32 {
        match self {
            Dev::Regs { regs, hdm, .. } => {
                let mut d = [0u8; 4];
                regs.read(hdm + rel, &mut d);
                u32::from_le_bytes(d)
            }
            Dev::Hdm(h) => h.read(rel),
        }
    }

    fn hdm_write(&mut self, rel: u64, bytes: &[u8]) -> Vec<DecoderEvent> {
        match self {
            Dev::Regs { regs, hdm, .. } => regs.write(*hdm + rel, bytes),
            Dev::Hdm(h) => {
                // The bare decoders take 32-bit registers; a 64-bit access
                // is the low then the high half, as DeviceRegs does it.
                let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                match bytes.len() {
                    4 => h.write(rel, word(bytes)).into_iter().collect(),
                    8 => {
                        let lo = h.write(rel, word(&bytes[..4]));
                        let hi = h.write(rel + 4, word(&bytes[4..]));
                        // Both halves can act; the model needs both.
                        lo.into_iter().chain(hi).collect()
                    }
                    _ => Vec::new(),
                }
            }
        }
    }

    fn reset(&mut self) -> Vec<DecoderEvent> {
        match self {
            Dev::Regs { regs, .. } => regs.reset(),
            Dev::Hdm(h) => h.reset(),
        }
    }
}

/// A committed decoder as the VMM learned it from the events.
#[derive(Clone, Copy, Debug)]
struct Mapped {
    hpa: u64,
    size: u64,
    dpa: u64,
}

struct Run {
    dev: Dev,
    decoders: usize,
    capacity: u64,
    /// What the VMM maps, rebuilt from the events alone.
    mapped: BTreeMap<usize, Mapped>,
    /// The label area as SET_LSA wrote it.
    lsa: Vec<u8>,
    /// False once a command the model did not follow may have written the
    /// label area (a raw write rang the doorbell, or SET_LSA ran on stale
    /// payload bytes): GET_LSA contents are no longer checked.
    lsa_known: bool,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let units = 1 + u64::from(inp.u8() % 16);
    let capacity = units * CAPACITY_UNIT;
    let dir = ScratchDir::new("cxl").expect("scratch dir");
    let lsa_path = dir.path().join("lsa");
    if mode & 0x40 != 0 {
        // A label area of another size than the default.
        let size = 1 + u64::from(inp.u16()) * 4;
        std::fs::File::create(&lsa_path)
            .and_then(|f| f.set_len(size))
            .expect("LSA file");
    }
    let lsa = Lsa::open(&lsa_path).expect("LSA in a scratch dir");
    let lsa_size = lsa.size() as usize;
    let dev = if mode & 0x80 == 0 {
        // Mailbox commands run when `run_pending` says, on this thread: every input is the
        // same program whatever the scheduler does.
        let regs = Box::new(DeviceRegs::manual(Commands::new(
            capacity,
            lsa,
            Box::new(NoDirt),
        )));
        let (hdm, mailbox) = discover(&regs);
        Dev::Regs { regs, hdm, mailbox }
    } else {
        Dev::Hdm(HdmDecoders::new(1 + usize::from(mode & 0xf) % 10, capacity))
    };
    let decoders = match dev.hdm_read(HDM_CAP) & 0xf {
        0 => 1,
        n => 2 * n as usize,
    };
    let mut r = Run {
        dev,
        decoders,
        capacity,
        mapped: BTreeMap::new(),
        lsa: vec![0; lsa_size],
        lsa_known: true,
    };
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        r.step(&mut inp);
        r.check_decoders();
    }
}

fn read32(regs: &DeviceRegs, at: u64) -> u32 {
    let mut d = [0u8; 4];
    regs.read(at, &mut d);
    u32::from_le_bytes(d)
}

/// Finds the HDM decoder capability and the mailbox the way Linux's
/// `cxl_pci` does: through the CXL.cache/mem capability array of the
/// component block and the device block's capability array.
fn discover(regs: &DeviceRegs) -> (u64, u64) {
    const CM: u64 = 0x1000;
    let head = read32(regs, CM);
    assert_eq!(head & 0xffff, 1, "CXL.cache/mem capability array header");
    let hdm = (1..=u64::from(head >> 24))
        .map(|i| read32(regs, CM + 4 * i))
        .find(|h| h & 0xffff == 5)
        .map(|h| CM + u64::from(h >> 20))
        .expect("an HDM decoder capability");
    let mut d = [0u8; 8];
    regs.read(DEVICE_OFFSET, &mut d);
    let count = (u64::from_le_bytes(d) >> 32) & 0xffff;
    let mailbox = (1..=count)
        .map(|i| DEVICE_OFFSET + 0x10 * i)
        .find(|at| read32(regs, *at) & 0xffff == 2)
        .map(|at| DEVICE_OFFSET + u64::from(read32(regs, at + 4)))
        .expect("a primary mailbox capability");
    (hdm, mailbox)
}

impl Run {
    fn step(&mut self, inp: &mut Input) {
        match inp.u8() % 10 {
            0 => {
                // Any access at all to the BAR (regs) or the capability.
                let size = *inp.pick(&[1usize, 2, 4, 8, 3, 0, 16]);
                let off = match inp.u8() % 4 {
                    0 => inp.u64(),
                    _ => u64::from(inp.u32()) % (BAR_SIZE + 0x100),
                };
                let bytes: Vec<u8> = (0..size).map(|_| inp.u8()).collect();
                match &mut self.dev {
                    Dev::Regs { regs, .. } => {
                        if inp.bool() {
                            let mut buf = vec![0xa5u8; size];
                            regs.read(off, &mut buf);
                            if !matches!(size, 1 | 2 | 4 | 8) {
                                assert!(buf.iter().all(|b| *b == 0), "odd-size read not zero");
                            }
                        } else {
                            let ev = regs.write(off, &bytes);
                            regs.run_pending();
                            if let Dev::Regs { mailbox, .. } = &self.dev {
                                let mb = *mailbox..*mailbox + MAILBOX_LEN;
                                if mb.contains(&off) || mb.contains(&off.saturating_add(7)) {
                                    self.lsa_known = false;
                                }
                            }
                            self.apply(ev);
                        }
                    }
                    Dev::Hdm(h) => {
                        let off = off % 0x200;
                        if inp.bool() {
                            h.read(off);
                        } else {
                            let v = u32::from_le_bytes([inp.u8(), inp.u8(), inp.u8(), inp.u8()]);
                            let ev = h.write(off, v);
                            self.apply(ev.into_iter().collect());
                        }
                    }
                }
            }
            1..=3 => {
                // Program a decoder: base, size, skip (32- or 64-bit writes).
                let i = inp.below(self.decoders + 1) as u64;
                let unit = |inp: &mut Input| -> u64 {
                    match inp.u8() % 8 {
                        0 => inp.u64(),
                        1 => u64::from(inp.u32()) << 12,
                        n => {
                            u64::from(n - 2) * HDM_ALIGN + u64::from(inp.u8() & 1) * 0x20_0000_0000
                        }
                    }
                };
                for reg in [0u64, 8, 0x14] {
                    if inp.u8() & 3 == 0 {
                        continue;
                    }
                    let v = unit(inp);
                    let at = DECODER_BASE + DECODER_STRIDE * i + reg;
                    // The skip register pair starts at 0x14: not 8-aligned.
                    let ev = if inp.bool() && reg != 0x14 {
                        self.dev.hdm_write(at, &v.to_le_bytes())
                    } else {
                        let a = self.dev.hdm_write(at, &(v as u32).to_le_bytes());
                        let b = self
                            .dev
                            .hdm_write(at + 4, &((v >> 32) as u32).to_le_bytes());
                        assert!(
                            a.is_empty() && b.is_empty(),
                            "a range register made an event"
                        );
                        Vec::new()
                    };
                    assert!(ev.is_empty(), "a range register made an event: {ev:?}");
                }
            }
            4 | 5 => {
                // Commit or uncommit (control register).
                let i = inp.below(self.decoders + 1) as u64;
                let mut ctrl = match inp.u8() % 4 {
                    0 => 0,
                    1 => CTRL_COMMIT,
                    2 => CTRL_COMMIT | CTRL_LOCK_ON_COMMIT,
                    _ => inp.u32(),
                };
                if inp.u8() & 7 == 0 {
                    ctrl |= u32::from(inp.u8()) & 0xff;
                }
                let at = DECODER_BASE + DECODER_STRIDE * i + 0x10;
                let ev = self.dev.hdm_write(at, &ctrl.to_le_bytes());
                self.apply(ev);
            }
            6 => {
                let evs = self.dev.reset();
                for ev in evs {
                    assert!(
                        matches!(ev, DecoderEvent::Uncommitted { .. }),
                        "reset made {ev:?}"
                    );
                    self.apply(vec![ev]);
                }
                assert!(self.mapped.is_empty(), "reset left decoders mapped");
            }
            _ => self.mailbox_command(inp),
        }
    }

    /// Applies a decoder event to what the VMM maps.
    fn apply(&mut self, evs: Vec<DecoderEvent>) {
        for ev in evs {
            self.apply_one(ev);
        }
    }

    fn apply_one(&mut self, ev: DecoderEvent) {
        match ev {
            DecoderEvent::Committed {
                index,
                hpa,
                size,
                dpa,
            } => {
                assert!(index < self.decoders, "event for decoder {index}");
                let old = self.mapped.insert(index, Mapped { hpa, size, dpa });
                assert!(old.is_none(), "decoder {index} committed twice: {old:?}");
            }
            DecoderEvent::Uncommitted { index } => {
                assert!(
                    self.mapped.remove(&index).is_some(),
                    "uncommit of decoder {index}, which was not committed"
                );
            }
            DecoderEvent::Refused { index, .. } => {
                assert!(index < self.decoders, "event for decoder {index}");
                assert!(
                    !self.mapped.contains_key(&index),
                    "refused a committed decoder"
                );
                let ctrl = self
                    .dev
                    .hdm_read(DECODER_BASE + DECODER_STRIDE * index as u64 + 0x10);
                assert_ne!(
                    ctrl & CTRL_ERR_NOT_COMMITTED,
                    0,
                    "refused without the error bit"
                );
            }
        }
    }

    /// The events agree with the registers, and what is mapped is sane.
    fn check_decoders(&self) {
        for i in 0..self.decoders {
            let reg = |r: u64| {
                self.dev
                    .hdm_read(DECODER_BASE + DECODER_STRIDE * i as u64 + r)
            };
            let committed = reg(0x10) & CTRL_COMMITTED != 0;
            let mapped = self.mapped.get(&i);
            assert_eq!(
                committed,
                mapped.is_some(),
                "decoder {i}: COMMITTED bit vs what the VMM was told"
            );
            if let Some(m) = mapped {
                let base = u64::from(reg(0)) | (u64::from(reg(4)) << 32);
                let size = u64::from(reg(8)) | (u64::from(reg(0xc)) << 32);
                assert_eq!(
                    (base, size),
                    (m.hpa, m.size),
                    "decoder {i}: registers moved"
                );
            }
        }
        let all: Vec<(usize, Mapped)> = self.mapped.iter().map(|(i, m)| (*i, *m)).collect();
        for (i, m) in &all {
            // Size 0 may commit (the spec allows it) and decodes nothing.
            assert!(m.size % HDM_ALIGN == 0, "decoder {i}: size {m:?}");
            assert!(m.hpa % HDM_ALIGN == 0, "decoder {i}: base {m:?}");
            assert!(
                m.hpa.checked_add(m.size).is_some(),
                "decoder {i}: HPA wraps"
            );
            let end = m.dpa.checked_add(m.size).expect("DPA end");
            assert!(
                end <= self.capacity,
                "decoder {i}: DPA past the capacity: {m:?}"
            );
            for (j, o) in &all {
                if j <= i || m.size == 0 || o.size == 0 {
                    continue;
                }
                assert!(
                    m.hpa + m.size <= o.hpa || o.hpa + o.size <= m.hpa,
                    "decoders {i} and {j}: HPA ranges overlap: {m:?} {o:?}"
                );
                assert!(
                    m.dpa + m.size <= o.dpa || o.dpa + o.size <= m.dpa,
                    "decoders {i} and {j}: DPA ranges overlap: {m:?} {o:?}"
                );
            }
        }
    }

    /// One mailbox command as a driver sends it, and its answer checked.
    fn mailbox_command(&mut self, inp: &mut Input) {
        let Dev::Regs { regs, mailbox, .. } = &mut self.dev else {
            return;
        };
        let mb = *mailbox;
        let opcode = match inp.u8() % 8 {
            0 => inp.u16(),
            _ => *inp.pick(OPCODES),
        };
        // Inputs the commands understand, most of the time.
        let input: Vec<u8> = match (opcode, inp.u8() % 4) {
            (GET_LOG, 0..=2) => {
                let mut v = CEL_UUID.to_vec();
                v.extend_from_slice(&u32::from(inp.u8() % 40).to_le_bytes());
                v.extend_from_slice(&u32::from(inp.u8() % 40).to_le_bytes());
                v
            }
            (GET_LSA, 0..=2) => {
                let mut v = lsa_offset(inp, self.lsa.len()).to_le_bytes().to_vec();
                v.extend_from_slice(&u32::from(inp.u16() % 2100).to_le_bytes());
                v
            }
            (SET_LSA, 0..=2) => {
                let mut v = lsa_offset(inp, self.lsa.len()).to_le_bytes().to_vec();
                v.extend_from_slice(&[0; 4]);
                v.extend(inp.bytes(64));
                v
            }
            (SET_SHUTDOWN_STATE, 0..=2) => vec![inp.u8()],
            (_, 0) => Vec::new(),
            _ => inp.bytes(PAYLOAD_SIZE),
        };
        // 8-byte MMIO writes (the BAR ignores 3-byte ones), the last one
        // padded with zeros.
        for (k, chunk) in input.chunks(8).enumerate() {
            let mut q = [0u8; 8];
            q[..chunk.len()].copy_from_slice(chunk);
            regs.write(mb + MB_PAYLOAD + 8 * k as u64, &q);
        }
        let mut len = input.len() as u64;
        if inp.u8() & 15 == 0 {
            len = u64::from(inp.u32()) & 0x1f_ffff;
        }
        let cmd = u64::from(opcode) | (len << 16);
        regs.write(mb + MB_CMD, &cmd.to_le_bytes());
        let bell: &[u8] = if inp.bool() { &[1] } else { &[1, 0, 0, 0] };
        regs.write(mb + MB_CTRL, bell);
        regs.run_pending();
        assert_eq!(
            read32(regs, mb + MB_CTRL) & 1,
            0,
            "opcode {opcode:#x}: doorbell still set after the command ran"
        );
        let mut s = [0u8; 8];
        regs.read(mb + MB_STATUS, &mut s);
        let rc = (u64::from_le_bytes(s) >> 32) as u16;
        assert!(
            matches!(
                rc,
                RC_SUCCESS | RC_INVALID_INPUT | RC_UNSUPPORTED | RC_INTERNAL_ERROR
            ),
            "opcode {opcode:#x}: return code {rc:#x}"
        );
        let mut c = [0u8; 8];
        regs.read(mb + MB_CMD, &mut c);
        let c = u64::from_le_bytes(c);
        assert_eq!(c as u16, opcode, "command register lost the opcode");
        let out_len = ((c >> 16) & 0x1f_ffff) as usize;
        assert!(
            out_len <= PAYLOAD_SIZE,
            "opcode {opcode:#x}: output {out_len}"
        );
        if rc != RC_SUCCESS {
            assert_eq!(out_len, 0, "opcode {opcode:#x}: rc {rc:#x} with output");
        }
        if !OPCODES.contains(&opcode) && len as usize <= PAYLOAD_SIZE {
            assert_eq!(rc, RC_UNSUPPORTED, "unknown opcode {opcode:#x}");
        }
        let mut out = vec![0u8; out_len];
        for (k, chunk) in out.chunks_mut(8).enumerate() {
            let mut q = [0u8; 8];
            regs.read(mb + MB_PAYLOAD + 8 * k as u64, &mut q);
            chunk.copy_from_slice(&q[..chunk.len()]);
        }
        let sent = &input[..(len as usize).min(input.len())];

        let whole = len as usize == input.len();
        match (opcode, rc) {
            (SET_LSA, RC_SUCCESS) if !whole => self.lsa_known = false,
            (SET_LSA, RC_SUCCESS) => {
                let off = le32(sent, 0) as usize;
                let data = &sent[8..];
                self.lsa[off..off + data.len()].copy_from_slice(data);
            }
            (GET_LSA, RC_SUCCESS) if whole && self.lsa_known => {
                let (off, n) = (le32(sent, 0) as usize, le32(sent, 4) as usize);
                let want = &self.lsa[off..off + n];
                if let Some(i) = (0..n).find(|i| out[*i] != want[*i]) {
                    panic!(
                        "GET_LSA {off:#x}+{n:#x}: byte {:#x} is {:#04x}, SET_LSA wrote {:#04x}",
                        off + i,
                        out[i],
                        want[i]
                    );
                }
            }
            (GET_LSA, RC_INVALID_INPUT) if whole && sent.len() == 8 => {
                let (off, n) = (le32(sent, 0) as usize, le32(sent, 4) as usize);
                assert!(
                    off + n > self.lsa.len() || n > PAYLOAD_SIZE,
                    "GET_LSA {off:#x}+{n:#x} refused inside the area"
                );
            }
            (IDENTIFY, RC_SUCCESS) => {
                assert_eq!(out_len, IDENTIFY_LEN);
                let units = u64::from_le_bytes(out[0x10..0x18].try_into().expect("8 bytes"));
                assert_eq!(units * CAPACITY_UNIT, self.capacity, "IDENTIFY capacity");
                assert_eq!(
                    le32(&out, 0x38) as usize,
                    self.lsa.len(),
                    "IDENTIFY LSA size"
                );
            }
            _ => {}
        }
    }
}

fn lsa_offset(inp: &mut Input, size: usize) -> u32 {
    match inp.u8() % 4 {
        0 => inp.u32(),
        _ => (usize::from(inp.u16()) % (size + 8)) as u32,
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
