//! The common configuration structure (virtio 1.x, 4.1.4.3): feature negotiation, device
//! status, queue setup and MSI-X vector assignment, as the driver reads and writes it.

use super::{
    VirtioPci, NO_VECTOR, STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_DRIVER_OK, STATUS_FAILED,
    STATUS_FEATURES_OK,
};
use locked::Locked;
use std::sync::atomic::Ordering;

use virtio_devices::VIRTIO_F_VERSION_1;

impl VirtioPci {
    pub(super) fn read_common(&self, offset: u64, data: &mut [u8]) {
        let q = self.queues.get(usize::from(self.queue_select));
        let features = self.dev.features() | VIRTIO_F_VERSION_1;
        let v: u64 = match offset {
            0x00 => u64::from(self.device_feature_select),
            0x04 => match self.device_feature_select {
                0 => features & 0xffff_ffff,
                1 => features >> 32,
                _ => 0,
            },
            0x08 => u64::from(self.driver_feature_select),
            0x0c => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            0x10 => u64::from(self.config_vector.load(Ordering::Acquire)),
            0x12 => self.queues.len() as u64,
            0x14 => u64::from(self.status),
            0x15 => u64::from(self.config_generation),
            0x16 => u64::from(self.queue_select),
            0x18 => q.map_or(0, |q| u64::from(q.size)),
            0x1a => self
                .queue_vectors
                .get(usize::from(self.queue_select))
                .map_or(u64::from(NO_VECTOR), |v| {
                    u64::from(v.load(Ordering::Acquire))
                }),
            0x1c => q.map_or(0, |q| u64::from(q.enabled)),
            0x1e => q.map_or(0, |_| u64::from(self.queue_select)),
            0x20 => q.map_or(0, |q| q.desc),
            0x24 => q.map_or(0, |q| q.desc >> 32),
            0x28 => q.map_or(0, |q| q.avail),
            0x2c => q.map_or(0, |q| q.avail >> 32),
            0x30 => q.map_or(0, |q| q.used),
            0x34 => q.map_or(0, |q| q.used >> 32),
            _ => 0,
        };
        let bytes = v.to_le_bytes();
        for (i, d) in data.iter_mut().enumerate() {
            *d = bytes.get(i).copied().unwrap_or(0);
        }
    }

    pub(super) fn write_common(&mut self, offset: u64, data: &[u8]) {
        let mut buf = [0u8; 8];
        let n = data.len().min(8);
        buf[..n].copy_from_slice(&data[..n]);
        let v = u64::from_le_bytes(buf);
        let lo32 = |old: u64| (old & !0xffff_ffff) | (v & 0xffff_ffff);
        let hi32 = |old: u64| (old & 0xffff_ffff) | (v << 32);
        // Queue layout may only change while the queue is disabled.
        let queue_writable = !self.active;
        match offset {
            0x00 => self.device_feature_select = v as u32,
            0x08 => self.driver_feature_select = v as u32,
            0x0c => {
                if self.status & STATUS_FEATURES_OK == 0 {
                    let val = v & 0xffff_ffff;
                    match self.driver_feature_select {
                        0 => self.driver_features = (self.driver_features & !0xffff_ffff) | val,
                        1 => {
                            self.driver_features =
                                (self.driver_features & 0xffff_ffff) | (val << 32)
                        }
                        _ => {}
                    }
                }
            }
            0x10 => self
                .config_vector
                .store(self.valid_vector(v as u16), Ordering::Release),
            0x14 => self.write_status(v as u8),
            0x16 => self.queue_select = v as u16,
            0x18 if queue_writable => {
                if let Some(q) = self.selected_queue() {
                    let size = v as u16;
                    // Split queues need a power-of-two size up to the maximum.
                    if size.is_power_of_two() && size <= q.max_size {
                        q.size = size;
                    }
                }
            }
            0x1a => {
                let vector = self.valid_vector(v as u16);
                if let Some(slot) = self.queue_vectors.get(usize::from(self.queue_select)) {
                    slot.store(vector, Ordering::Release);
                }
            }
            0x1c if queue_writable => {
                if let Some(q) = self.selected_queue() {
                    q.enabled = v & 1 == 1;
                }
            }
            0x20 if queue_writable => self
                .selected_queue()
                .into_iter()
                .for_each(|q| q.desc = lo32(q.desc)),
            0x24 if queue_writable => self
                .selected_queue()
                .into_iter()
                .for_each(|q| q.desc = hi32(q.desc)),
            0x28 if queue_writable => self
                .selected_queue()
                .into_iter()
                .for_each(|q| q.avail = lo32(q.avail)),
            0x2c if queue_writable => self
                .selected_queue()
                .into_iter()
                .for_each(|q| q.avail = hi32(q.avail)),
            0x30 if queue_writable => self
                .selected_queue()
                .into_iter()
                .for_each(|q| q.used = lo32(q.used)),
            0x34 if queue_writable => self
                .selected_queue()
                .into_iter()
                .for_each(|q| q.used = hi32(q.used)),
            _ => log::debug!("virtio-pci: ignored common config write at {offset:#x}"),
        }
    }

    /// A vector number the table actually has, else "no vector" (the driver reads it back).
    fn valid_vector(&self, v: u16) -> u16 {
        let n = self.msix.locked().vectors();
        if v < n {
            v
        } else {
            NO_VECTOR
        }
    }

    fn write_status(&mut self, v: u8) {
        if v == 0 {
            self.reset();
            return;
        }
        if self.active {
            // A driver must not clear status bits (virtio 1.2, 2.1.2); a running device only
            // takes new ones (FAILED, say), so its status never reads 0 — "reset" — while its
            // queues are still live. Only a write of 0 resets it.
            self.status |= v;
            return;
        }
        let mut v = v;
        if v & STATUS_FEATURES_OK != 0 && self.status & STATUS_FEATURES_OK == 0 {
            let offered = self.dev.features() | VIRTIO_F_VERSION_1;
            if self.driver_features & !offered != 0
                || self.driver_features & VIRTIO_F_VERSION_1 == 0
            {
                log::warn!(
                    "virtio-pci: driver asked for unsupported features {:#x}",
                    self.driver_features
                );
                v &= !STATUS_FEATURES_OK;
            } else {
                self.dev.ack_features(self.driver_features);
            }
        }
        self.status = v;
        let ready = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK;
        if !self.active && v & ready == ready && v & STATUS_FAILED == 0 {
            self.activate();
        }
    }
}
