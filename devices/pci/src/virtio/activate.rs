//! DRIVER_OK and reset: handing the configured queues to the device with an interrupt path
//! through this transport's MSI-X vectors, and taking them back.

use super::{VirtioPci, NOTIFY_MULTIPLIER, NOTIFY_OFFSET, NO_VECTOR, STATUS_FAILED};
use crate::msix::SharedMsix;
use locked::Locked;
use std::sync::atomic::{AtomicU16, AtomicU8, Ordering};
use std::sync::Arc;

use kvm_ioctls::{IoEventAddress, NoDatamatch};
use virtio_devices::{ActivateContext, ActiveQueue, InterruptKind, VirtioInterrupt};
use virtio_queue::{Queue, QueueT};

/// Delivers a device's interrupts through this transport's MSI-X vectors.
struct PciInterrupt {
    msix: SharedMsix,
    isr: Arc<AtomicU8>,
    config_vector: Arc<AtomicU16>,
    queue_vectors: Arc<[AtomicU16]>,
}

impl VirtioInterrupt for PciInterrupt {
    fn trigger(&self, kind: InterruptKind) -> std::io::Result<()> {
        let (vector, isr_bit) = match kind {
            InterruptKind::Config => (self.config_vector.load(Ordering::Acquire), 2),
            InterruptKind::Queue(q) => (
                self.queue_vectors
                    .get(usize::from(q))
                    .map_or(NO_VECTOR, |v| v.load(Ordering::Acquire)),
                1,
            ),
        };
        self.isr.fetch_or(isr_bit, Ordering::AcqRel);
        if vector != NO_VECTOR {
            self.msix.locked().trigger(vector);
        }
        Ok(())
    }
}

impl VirtioPci {
    pub(super) fn activate(&mut self) {
        let mut active = Vec::new();
        for (i, qc) in self.queues.iter().enumerate() {
            if !qc.enabled {
                continue;
            }
            let mut q = match Queue::new(qc.max_size) {
                Ok(q) => q,
                Err(e) => {
                    log::error!("virtio-pci: queue {i}: {e:?}");
                    self.status |= STATUS_FAILED;
                    return;
                }
            };
            q.set_size(qc.size);
            q.set_desc_table_address(Some(qc.desc as u32), Some((qc.desc >> 32) as u32));
            q.set_avail_ring_address(Some(qc.avail as u32), Some((qc.avail >> 32) as u32));
            q.set_used_ring_address(Some(qc.used as u32), Some((qc.used >> 32) as u32));
            q.set_ready(true);
            if !q.is_valid(&self.mem) {
                log::error!("virtio-pci: queue {i} rings are outside guest memory");
                self.status |= STATUS_FAILED;
                return;
            }
            let notify = match qc.notify.try_clone() {
                Ok(fd) => fd,
                Err(e) => {
                    log::error!("virtio-pci: queue {i}: {e}");
                    self.status |= STATUS_FAILED;
                    return;
                }
            };
            active.push(ActiveQueue {
                index: i as u16,
                queue: q,
                notify,
            });
        }
        let ctx = ActivateContext {
            mem: self.mem.clone(),
            interrupt: Arc::new(PciInterrupt {
                msix: self.msix.clone(),
                isr: self.isr.clone(),
                config_vector: self.config_vector.clone(),
                queue_vectors: self.queue_vectors.clone(),
            }),
            queues: active,
        };
        match self.dev.activate(ctx) {
            Ok(()) => self.active = true,
            Err(e) => {
                log::error!(
                    "virtio-pci: activate device type {}: {e}",
                    self.dev.device_type()
                );
                self.status |= STATUS_FAILED;
            }
        }
    }

    pub(super) fn reset(&mut self) {
        if self.active {
            self.dev.reset();
            self.active = false;
        }
        self.status = 0;
        self.driver_features = 0;
        self.device_feature_select = 0;
        self.driver_feature_select = 0;
        self.queue_select = 0;
        self.isr.store(0, Ordering::Release);
        self.config_vector.store(NO_VECTOR, Ordering::Release);
        for (q, v) in self.queues.iter_mut().zip(self.queue_vectors.iter()) {
            q.size = q.max_size;
            q.enabled = false;
            q.desc = 0;
            q.avail = 0;
            q.used = 0;
            // Drop a stale notification so a fresh activation starts clean.
            let _ = q.notify.read();
            v.store(NO_VECTOR, Ordering::Release);
        }
    }

    pub(super) fn register_notifiers(&mut self, base: u64) {
        let Some(vm) = self.vm.clone() else {
            self.notify_base = Some(base);
            return;
        };
        if let Some(old) = self.notify_base.take() {
            for (i, q) in self.queues.iter().enumerate() {
                let addr = IoEventAddress::Mmio(
                    old + NOTIFY_OFFSET + i as u64 * u64::from(NOTIFY_MULTIPLIER),
                );
                if let Err(e) = vm.unregister_ioevent(&q.notify, &addr, NoDatamatch) {
                    log::warn!("virtio-pci: unregister ioeventfd: {e}");
                }
            }
        }
        for (i, q) in self.queues.iter().enumerate() {
            let addr = IoEventAddress::Mmio(
                base + NOTIFY_OFFSET + i as u64 * u64::from(NOTIFY_MULTIPLIER),
            );
            if let Err(e) = vm.register_ioevent(&q.notify, &addr, NoDatamatch) {
                log::error!("virtio-pci: register ioeventfd at {base:#x}: {e}");
                return;
            }
        }
        self.notify_base = Some(base);
    }
}
