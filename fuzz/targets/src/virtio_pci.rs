//! The virtio-pci transport (`devices/pci/src/virtio/mod.rs`, `devices/pci/src/msix.rs`) driven as
//! a guest drives it: PCI config space (MSI-X control, BARs), the common
//! configuration, ISR, device configuration and notify regions of BAR0, and
//! the MSI-X table and pending bits, in front of a recording device.
//!
//! The transport runs without a VM ([`VirtioPci::without_vm`]): no KVM is
//! needed, MSI-X messages are dropped after the table lookup. The regions
//! are found the way a driver finds them, through the capability list.
//!
//! Oracle: no panic; the device's contract holds (activated only with
//! enabled queues whose rings lie in guest memory, with power-of-two sizes
//! up to the maximum, never twice without a reset; reset only when active;
//! acked features are a subset of the offered ones); and the registers a
//! driver reads back stay sane (queue count, queue sizes, vectors either
//! "no vector" or one the table has, status 0 after a reset, an ISR read
//! acknowledges).

use locked::Locked;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use pci::virtio::{VirtioPci, NO_VECTOR};
use pci::PciDevice;
use virtio_devices::{
    ActivateContext, ActivateError, InterruptKind, VirtioDevice, VirtioInterrupt,
    VIRTIO_F_VERSION_1,
};
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::common::Input;

const MAX_STEPS: usize = 128;
/// Guest memory: 64 KiB at 0 and 64 KiB at 1 MiB, so ring addresses can
/// be inside, between or beyond the regions.
const MEM: [(u64, usize); 2] = [(0, 0x1_0000), (0x10_0000, 0x1_0000)];

/// Common configuration offsets (virtio 1.2, 4.1.4.3).
const DFSEL: u64 = 0x00;
const DF: u64 = 0x04;
const GFSEL: u64 = 0x08;
const GF: u64 = 0x0c;
const MSIX_CONFIG: u64 = 0x10;
const NUM_QUEUES: u64 = 0x12;
const STATUS: u64 = 0x14;
const Q_SELECT: u64 = 0x16;
const Q_SIZE: u64 = 0x18;
const Q_VECTOR: u64 = 0x1a;
const Q_ENABLE: u64 = 0x1c;
const Q_DESC: u64 = 0x20;
const Q_AVAIL: u64 = 0x28;
const Q_USED: u64 = 0x30;
const COMMON_REGS: &[(u64, usize)] = &[
    (DFSEL, 4),
    (DF, 4),
    (GFSEL, 4),
    (GF, 4),
    (MSIX_CONFIG, 2),
    (NUM_QUEUES, 2),
    (STATUS, 1),
    (0x15, 1),
    (Q_SELECT, 2),
    (Q_SIZE, 2),
    (Q_VECTOR, 2),
    (Q_ENABLE, 2),
    (0x1e, 2),
    (Q_DESC, 4),
    (0x24, 4),
    (Q_AVAIL, 4),
    (0x2c, 4),
    (Q_USED, 4),
    (0x34, 4),
];

const ACK: u8 = 1;
const DRIVER: u8 = 2;
const DRIVER_OK: u8 = 4;
const FEATURES_OK: u8 = 8;
const FAILED: u8 = 0x80;

/// What the recording device saw.
#[derive(Default)]
struct Seen {
    active: bool,
    interrupt: Option<Arc<dyn VirtioInterrupt>>,
}

/// A device that checks the transport keeps the device contract.
struct Recorder {
    sizes: Vec<u16>,
    features: u64,
    config: Vec<u8>,
    fail_activate: bool,
    seen: Arc<Mutex<Seen>>,
}

impl VirtioDevice for Recorder {
    fn device_type(&self) -> u32 {
        0x3f
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn ack_features(&mut self, features: u64) {
        assert_eq!(
            features & !self.features,
            0,
            "acked features {features:#x} beyond the offered {:#x}",
            self.features
        );
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        virtio_devices::read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if let Ok(start) = usize::try_from(offset) {
            for (i, b) in data.iter().enumerate() {
                if let Some(c) = self.config.get_mut(start.saturating_add(i)) {
                    *c = *b;
                }
            }
        }
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let mut seen = self.seen.locked();
        assert!(!seen.active, "activated twice without a reset");
        let mut indices = BTreeSet::new();
        for q in &ctx.queues {
            let i = usize::from(q.index);
            assert!(i < self.sizes.len(), "queue index {i}");
            assert!(indices.insert(i), "queue {i} handed over twice");
            let size = q.queue.size();
            assert!(
                size.is_power_of_two() && size <= self.sizes[i] || size == self.sizes[i],
                "queue {i}: size {size} (max {})",
                self.sizes[i]
            );
            assert!(q.queue.ready(), "queue {i} not ready");
            assert!(
                q.queue.is_valid(&ctx.mem),
                "queue {i}: rings outside guest memory"
            );
        }
        if self.fail_activate {
            return Err(ActivateError::QueueCount {
                expected: self.sizes.len(),
                got: ctx.queues.len(),
            });
        }
        seen.active = true;
        seen.interrupt = Some(ctx.interrupt);
        Ok(())
    }

    fn reset(&mut self) {
        let mut seen = self.seen.locked();
        assert!(seen.active, "reset of a device that is not active");
        seen.active = false;
        seen.interrupt = None;
    }
}

/// BAR0 regions found through the capabilities.
#[derive(Default, Debug)]
struct Layout {
    common: u64,
    isr: u64,
    device: u64,
    notify: u64,
    notify_mul: u64,
    msix_table: u64,
    msix_pba: u64,
    msix_cap: usize,
    vectors: u16,
}

fn cfg8(t: &VirtioPci, at: usize) -> u8 {
    (t.config().read_reg(at / 4) >> (8 * (at % 4))) as u8
}

fn cfg32(t: &VirtioPci, at: usize) -> u32 {
    t.config().read_reg(at / 4)
}

/// Walks the capability list as the Linux virtio-pci driver does.
fn discover(t: &VirtioPci) -> Layout {
    let mut l = Layout::default();
    let mut at = usize::from(cfg8(t, 0x34));
    let mut hops = 0;
    while at != 0 {
        hops += 1;
        assert!(hops < 48, "capability list loops");
        match cfg8(t, at) {
            0x09 => {
                let off = u64::from(cfg32(t, at + 8));
                match cfg8(t, at + 3) {
                    1 => l.common = off,
                    2 => {
                        l.notify = off;
                        l.notify_mul = u64::from(cfg32(t, at + 16));
                    }
                    3 => l.isr = off,
                    4 => l.device = off,
                    _ => {}
                }
            }
            0x11 => {
                l.msix_cap = at;
                l.vectors = (cfg32(t, at) >> 16) as u16 % 2048 + 1;
                l.msix_table = u64::from(cfg32(t, at + 4) & !7);
                l.msix_pba = u64::from(cfg32(t, at + 8) & !7);
            }
            _ => {}
        }
        at = usize::from(cfg8(t, at + 1));
    }
    assert!(l.msix_cap != 0 && l.notify_mul > 0, "capabilities: {l:?}");
    l
}

struct Run {
    t: VirtioPci,
    l: Layout,
    seen: Arc<Mutex<Seen>>,
    sizes: Vec<u16>,
    features: u64,
}

impl Run {
    fn read(&mut self, off: u64, len: usize) -> u64 {
        let mut b = [0u8; 8];
        self.t.bar_read(0, self.l.common + off, &mut b[..len]);
        u64::from_le_bytes(b)
    }

    fn write(&mut self, off: u64, len: usize, v: u64) {
        self.t
            .bar_write(0, self.l.common + off, &v.to_le_bytes()[..len]);
    }

    fn active(&self) -> bool {
        self.seen.locked().active
    }

    /// What a driver reads back is sane.
    fn check(&mut self) {
        let nq = self.sizes.len();
        assert_eq!(self.read(NUM_QUEUES, 2), nq as u64, "num_queues");
        let vectors = u64::from(self.l.vectors);
        let valid_vector = |v: u64| v == u64::from(NO_VECTOR) || v < vectors;
        let cv = self.read(MSIX_CONFIG, 2);
        assert!(valid_vector(cv), "config vector {cv:#x}");
        let status = self.read(STATUS, 1) as u8;
        if self.active() {
            assert_ne!(status, 0, "device active with status 0");
        }
        if status == 0 {
            assert!(!self.active(), "status 0 but the device is active");
        }
        let sel = self.read(Q_SELECT, 2);
        for q in 0..nq + 1 {
            self.write(Q_SELECT, 2, q as u64);
            let size = self.read(Q_SIZE, 2) as u16;
            let vector = self.read(Q_VECTOR, 2);
            match self.sizes.get(q) {
                Some(&max) => {
                    assert!(
                        size == max || size.is_power_of_two() && size <= max,
                        "queue {q}: size {size} of max {max}"
                    );
                    assert!(valid_vector(vector), "queue {q}: vector {vector:#x}");
                }
                None => {
                    assert_eq!(size, 0, "queue {q} beyond num_queues has a size");
                    assert_eq!(vector, u64::from(NO_VECTOR), "queue {q} beyond num_queues");
                }
            }
        }
        self.write(Q_SELECT, 2, sel);
    }

    /// A ring address: mostly aligned inside guest memory.
    fn ring_addr(inp: &mut Input) -> u64 {
        match inp.u8() % 8 {
            0 => inp.u64(),
            1 => MEM[1].0 + u64::from(inp.u16() & !0xf),
            2 => u64::from(inp.u32()),
            _ => u64::from(inp.u16() & !0xf) % (MEM[0].1 as u64 - 0x1000),
        }
    }

    /// The whole init sequence of a well-behaved driver, with a few of its
    /// values from the input.
    fn driver_init(&mut self, inp: &mut Input) {
        self.write(STATUS, 1, 0);
        assert!(!self.active(), "reset left the device active");
        assert_eq!(self.read(STATUS, 1), 0, "status after reset");
        self.write(STATUS, 1, u64::from(ACK));
        self.write(STATUS, 1, u64::from(ACK | DRIVER));
        let mut offered = 0u64;
        for sel in 0..2 {
            self.write(DFSEL, 4, sel);
            offered |= self.read(DF, 4) << (32 * sel);
        }
        assert_eq!(
            offered,
            self.features | VIRTIO_F_VERSION_1,
            "offered features"
        );
        let want = if inp.u8() & 7 == 0 {
            inp.u64()
        } else {
            offered & (inp.u64() | VIRTIO_F_VERSION_1)
        };
        for sel in 0..2 {
            self.write(GFSEL, 4, sel);
            self.write(GF, 4, want >> (32 * sel) & 0xffff_ffff);
        }
        self.write(STATUS, 1, u64::from(ACK | DRIVER | FEATURES_OK));
        let ok = self.read(STATUS, 1) as u8 & FEATURES_OK != 0;
        assert_eq!(
            ok,
            want & !offered == 0 && want & VIRTIO_F_VERSION_1 != 0,
            "FEATURES_OK for {want:#x} of {offered:#x}"
        );
        if !ok {
            return;
        }
        for q in 0..self.sizes.len() {
            if inp.u8() & 3 == 0 {
                continue;
            }
            self.write(Q_SELECT, 2, q as u64);
            if inp.bool() {
                self.write(Q_SIZE, 2, 1 << (inp.u8() % 10));
            }
            for reg in [Q_DESC, Q_AVAIL, Q_USED] {
                let a = Self::ring_addr(inp);
                self.write(reg, 4, a & 0xffff_ffff);
                self.write(reg + 4, 4, a >> 32);
            }
            self.write(Q_VECTOR, 2, u64::from(inp.u8() % 8));
            self.write(Q_ENABLE, 2, 1);
        }
        self.write(MSIX_CONFIG, 2, u64::from(inp.u8() % 8));
        self.write(STATUS, 1, u64::from(ACK | DRIVER | FEATURES_OK | DRIVER_OK));
    }

    fn step(&mut self, inp: &mut Input) {
        match inp.u8() % 12 {
            0 | 1 => {
                let (off, len) = *inp.pick(COMMON_REGS);
                let v = match (off, inp.u8() % 4) {
                    (STATUS, 0..=2) => u64::from(*inp.pick(&[
                        0,
                        ACK,
                        ACK | DRIVER,
                        ACK | DRIVER | FEATURES_OK,
                        0x0f,
                        FAILED,
                    ])),
                    (Q_DESC | Q_AVAIL | Q_USED, 0..=2) => Self::ring_addr(inp) & 0xffff_ffff,
                    (Q_SIZE, 0..=2) => 1 << (inp.u8() % 16),
                    _ => inp.u64(),
                };
                self.write(off, len, v);
            }
            2 => self.driver_init(inp),
            3 => {
                // Reading the ISR acknowledges it.
                let mut b = [0u8; 1];
                self.t.bar_read(0, self.l.isr, &mut b);
                assert_eq!(b[0] & !3, 0, "ISR {:#x}", b[0]);
                self.t.bar_read(0, self.l.isr, &mut b);
                assert_eq!(b[0], 0, "ISR read twice");
            }
            4 => {
                let off = self.l.device + u64::from(inp.u16() % 0x1100);
                let len = *inp.pick(&[1usize, 2, 4, 8]);
                if inp.bool() {
                    let mut b = [0u8; 8];
                    self.t.bar_read(0, off, &mut b[..len]);
                } else {
                    let v = inp.u64().to_le_bytes();
                    self.t.bar_write(0, off, &v[..len]);
                }
            }
            5 => {
                let q = u64::from(inp.u16() % 1100);
                let off = self.l.notify + q * self.l.notify_mul;
                self.t.bar_write(0, off, &inp.u16().to_le_bytes());
            }
            6 | 7 => {
                // MSI-X table: any entry (or past the table), any width.
                let off = self.l.msix_table + u64::from(inp.u16() % 0x2100);
                let len = *inp.pick(&[4usize, 8, 1, 2, 16]);
                let mut b = [0u8; 16];
                if inp.bool() {
                    self.t.bar_read(0, off, &mut b[..len]);
                } else {
                    let e = match inp.u8() % 3 {
                        0 => 0u32,
                        1 => 1,
                        _ => inp.u32(),
                    };
                    b[..4].copy_from_slice(&e.to_le_bytes());
                    b[4..12].copy_from_slice(&inp.u64().to_le_bytes());
                    self.t.bar_write(0, off, &b[..len]);
                }
                let mut pba = [0u8; 8];
                self.t.bar_read(0, self.l.msix_pba, &mut pba);
                let pending = u64::from_le_bytes(pba);
                assert_eq!(
                    pending >> self.l.vectors.min(63),
                    0,
                    "pending bit beyond the vectors: {pending:#x}"
                );
            }
            8 => {
                // MSI-X message control: enable and function mask.
                let ctl = [0u16, 0x8000, 0xc000, 0x4000, inp.u16()];
                let v = *inp.pick(&ctl);
                let at = self.l.msix_cap + 2;
                self.t.config_write(at / 4, at % 4, &v.to_le_bytes());
            }
            9 => {
                // Any config space write the root complex passes on.
                let reg = inp.below(1024 + 4);
                let byte = inp.below(4);
                let len = *inp.pick(&[1usize, 2, 4]);
                if byte + len <= 4 {
                    let v = inp.u32().to_le_bytes();
                    self.t.config_write(reg, byte, &v[..len]);
                }
            }
            10 => {
                // The device raises an interrupt (from its worker, in real life).
                let irq = self.seen.locked().interrupt.clone();
                if let Some(irq) = irq {
                    let kind = match inp.u8() % 4 {
                        0 => InterruptKind::Config,
                        _ => InterruptKind::Queue(u16::from(inp.u8() % 5)),
                    };
                    irq.trigger(kind).expect("interrupt");
                }
            }
            _ => {
                // Raw BAR access: any BAR, any offset, any width.
                let bar = inp.below(7);
                let off = match inp.u8() % 3 {
                    0 => inp.u64(),
                    _ => u64::from(inp.u16()),
                };
                let len = inp.below(9);
                let mut b = [0u8; 8];
                if inp.bool() {
                    self.t.bar_read(bar, off, &mut b[..len]);
                } else {
                    let v = inp.u64().to_le_bytes();
                    self.t.bar_write(bar, off, &v[..len]);
                }
                if inp.u8() & 7 == 0 {
                    let new = (inp.u8() & 1 == 0).then(|| u64::from(inp.u32()) << 12);
                    self.t.bar_moved(inp.below(3), None, new);
                }
            }
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let mut r = setup(&mut inp);
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        r.step(&mut inp);
        r.check();
    }
}

/// The device and transport an input asks for.
fn setup(inp: &mut Input) -> Run {
    let nq = 1 + inp.below(4);
    let sizes: Vec<u16> = (0..nq)
        .map(|_| *inp.pick(&[128u16, 256, 1, 2, 16, 100, 32768]))
        .collect();
    let features = VIRTIO_F_VERSION_1 | (u64::from(inp.u32()) & !(1 << 32));
    let config = inp.bytes(64);
    let fail_activate = inp.u8() & 15 == 0;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let dev = Recorder {
        sizes: sizes.clone(),
        features,
        config,
        fail_activate,
        seen: seen.clone(),
    };
    let ranges: Vec<(GuestAddress, usize)> =
        MEM.iter().map(|(a, l)| (GuestAddress(*a), *l)).collect();
    let mem = GuestMemoryMmap::from_ranges(&ranges).expect("guest memory");
    let t = VirtioPci::without_vm(Box::new(dev), mem).expect("transport");
    let l = discover(&t);
    assert_eq!(
        l.vectors as usize,
        nq + 1,
        "one vector per queue and one for config"
    );
    Run {
        t,
        l,
        seen,
        sizes,
        features,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle is alive: a well-behaved init activates the recorder, and
    /// a reset through the status register resets it.
    #[test]
    fn a_driver_init_activates_and_a_reset_resets() {
        // One queue of 128, no extra features, no config, activation works.
        let mut r = setup(&mut Input::new(&[0, 0, 0, 0, 0, 0, 0, 1]));
        // Features as offered; queue 0 programmed with its rings at 0,
        // 0x4000 and 0x8000, vector 0; config vector 0.
        let init = [
            1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 3, 0, 0, 3, 0, 0x40, 3, 0, 0x80, 0, 0,
        ];
        r.driver_init(&mut Input::new(&init));
        assert!(r.active(), "init did not activate the device");
        r.check();
        r.write(STATUS, 1, 0);
        assert!(!r.active());
        r.check();
    }
}
