//! MSI-X: the vector table and pending bits a device exposes in a BAR, and
//! delivery of its messages through `KVM_SIGNAL_MSI`.
//!
//! Signalling the MSI directly (instead of routing each vector to an irqfd)
//! keeps the GSI routing table untouched: the in-kernel IOAPIC routes stay as
//! KVM built them, and a vector's address/data are read at delivery time, so
//! a guest reprogramming the table needs no bookkeeping.

use std::sync::{Arc, Mutex};

use kvm_bindings::kvm_msi;
use kvm_ioctls::VmFd;

/// Bytes per table entry.
pub const ENTRY_SIZE: u64 = 16;
/// Message Control bits.
const CTRL_ENABLE: u16 = 1 << 15;
const CTRL_FUNCTION_MASK: u16 = 1 << 14;
/// Vector Control: masked.
const VECTOR_MASKED: u32 = 1;

#[derive(Clone, Copy, Default)]
struct Entry {
    addr_lo: u32,
    addr_hi: u32,
    data: u32,
    ctrl: u32,
}

/// The state behind one function's MSI-X capability.
pub struct Msix {
    entries: Vec<Entry>,
    pending: Vec<bool>,
    enabled: bool,
    function_masked: bool,
    vm: Option<Arc<VmFd>>,
}

impl Msix {
    /// `vm` is where messages go; `None` only in unit tests (messages are then dropped).
    pub fn new(vectors: u16, vm: Option<Arc<VmFd>>) -> Self {
        let n = usize::from(vectors);
        Msix {
            entries: vec![
                Entry {
                    ctrl: VECTOR_MASKED,
                    ..Default::default()
                };
                n
            ],
            pending: vec![false; n],
            enabled: false,
            function_masked: false,
            vm,
        }
    }

    /// Table entries (the capability's Table Size + 1).
    pub fn vectors(&self) -> u16 {
        self.entries.len() as u16
    }

    /// Bytes of table the capability announces.
    pub fn table_size(&self) -> u64 {
        self.entries.len() as u64 * ENTRY_SIZE
    }

    /// The guest wrote Message Control.
    pub fn set_control(&mut self, control: u16) {
        self.enabled = control & CTRL_ENABLE != 0;
        self.function_masked = control & CTRL_FUNCTION_MASK != 0;
        self.deliver_pending();
    }

    /// Guest read of the MSI-X table at byte `offset`; past the table reads zeros.
    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let idx = (offset / ENTRY_SIZE) as usize;
        let Some(e) = self.entries.get(idx) else {
            return;
        };
        let words = [e.addr_lo, e.addr_hi, e.data, e.ctrl];
        let mut bytes = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        let start = (offset % ENTRY_SIZE) as usize;
        let end = (start + data.len()).min(16);
        data[..end - start].copy_from_slice(&bytes[start..end]);
    }

    /// Guest write of the MSI-X table; a vector unmasked with a message pending fires now.
    pub fn write_table(&mut self, offset: u64, data: &[u8]) {
        let idx = (offset / ENTRY_SIZE) as usize;
        let start = (offset % ENTRY_SIZE) as usize;
        let Some(e) = self.entries.get_mut(idx) else {
            return;
        };
        if start + data.len() > 16 {
            return;
        }
        let mut bytes = [0u8; 16];
        for (i, w) in [e.addr_lo, e.addr_hi, e.data, e.ctrl].iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        bytes[start..start + data.len()].copy_from_slice(data);
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        e.addr_lo = word(0);
        e.addr_hi = word(4);
        e.data = word(8);
        e.ctrl = word(12) & VECTOR_MASKED;
        if e.ctrl & VECTOR_MASKED == 0 && self.pending[idx] {
            self.pending[idx] = false;
            self.send(idx);
        }
    }

    /// Pending Bit Array reads: one bit per vector.
    pub fn read_pba(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let base = (offset as usize + i) * 8;
            *b = (0..8)
                .filter(|bit| self.pending.get(base + bit).copied().unwrap_or(false))
                .fold(0u8, |acc, bit| acc | (1 << bit));
        }
    }

    /// Raises `vector`, or marks it pending while masked. Does nothing while
    /// MSI-X is disabled (we offer no INTx fallback).
    pub fn trigger(&mut self, vector: u16) {
        let idx = usize::from(vector);
        if !self.enabled || idx >= self.entries.len() {
            return;
        }
        if self.function_masked || self.entries[idx].ctrl & VECTOR_MASKED != 0 {
            self.pending[idx] = true;
            return;
        }
        self.send(idx);
    }

    fn deliver_pending(&mut self) {
        if !self.enabled || self.function_masked {
            return;
        }
        for idx in 0..self.entries.len() {
            if self.pending[idx] && self.entries[idx].ctrl & VECTOR_MASKED == 0 {
                self.pending[idx] = false;
                self.send(idx);
            }
        }
    }

    fn send(&self, idx: usize) {
        let e = self.entries[idx];
        let Some(vm) = &self.vm else { return };
        let msi = kvm_msi {
            address_lo: e.addr_lo,
            address_hi: e.addr_hi,
            data: e.data,
            ..Default::default()
        };
        if let Err(err) = vm.signal_msi(msi) {
            log::warn!("MSI-X vector {idx}: KVM_SIGNAL_MSI failed: {err}");
        }
    }
}

/// Shared handle: the transport writes the table, device threads trigger.
pub type SharedMsix = Arc<Mutex<Msix>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_vectors_become_pending_and_fire_on_unmask() {
        let mut m = Msix::new(2, None);
        m.set_control(CTRL_ENABLE);
        m.write_table(16, &0xfee0_0000u32.to_le_bytes());
        m.write_table(24, &0x41u32.to_le_bytes());
        m.trigger(1);
        let mut pba = [0u8; 8];
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0b10);
        m.write_table(28, &0u32.to_le_bytes());
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0, "unmasking delivers the pending message");
        let mut e = [0u8; 16];
        m.read_table(16, &mut e);
        assert_eq!(&e[..4], &0xfee0_0000u32.to_le_bytes());
        assert_eq!(&e[8..12], &0x41u32.to_le_bytes());
    }

    #[test]
    fn function_mask_holds_everything() {
        let mut m = Msix::new(1, None);
        m.write_table(12, &0u32.to_le_bytes());
        m.set_control(CTRL_ENABLE | CTRL_FUNCTION_MASK);
        m.trigger(0);
        let mut pba = [0u8; 1];
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 1);
        m.set_control(CTRL_ENABLE);
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0);
    }

    #[test]
    fn out_of_range_accesses_are_ignored() {
        let mut m = Msix::new(1, None);
        m.write_table(4096, &[1, 2, 3, 4]);
        m.write_table(14, &[1, 2, 3, 4]);
        m.trigger(7);
        let mut d = [0xffu8; 4];
        m.read_table(4096, &mut d);
        assert_eq!(d, [0; 4]);
    }
}
