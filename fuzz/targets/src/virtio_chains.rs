//! Descriptor chains a guest can post on a split queue, served by the
//! devices' own request handlers through the shared `drain_queue`:
//! virtio-pmem's FLUSH (`pmem::serve_flush`, on a tmpfs file) and
//! virtio-pmo's control requests (`serve::serve_chain`, on a real PMO
//! service).
//!
//! The queue lives in guest memory built with virtio-queue's mock driver
//! (`MockSplitQueue`, `test-utils`): descriptors (address, length, NEXT /
//! WRITE / INDIRECT flags, next index) and the available ring come from the
//! input, so chains can be short, looped, out of memory, indirect or
//! write-only; request bytes at the readable buffers are mostly well formed.
//!
//! Oracle: no panic, no hang; `drain_queue` returns; the used ring gets at
//! most one entry per available entry, each naming a descriptor of the
//! table with a length the device can write (4 for pmem, a response header
//! plus at most the largest payload for pmo); where the chain is a plain
//! one, the status written is one the protocol defines; at most one
//! interrupt per drain.

use std::fs::File;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use pmo_pager::PmoService;
use pmo_virtio::proto::{self, Status};
use pmo_virtio::serve::serve_chain;
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_devices::{drain_queue, InterruptKind, VirtioInterrupt};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::common::{Input, ScratchDir};
use crate::pmo_service::new_service;

/// Guest memory: 64 KiB; the rings at 0, buffers from [`DATA`] on.
const MEM_LEN: u64 = 0x1_0000;
const DATA: u64 = 0x1000;
/// The used ring (at most 16 entries: 134 bytes).
const USED_AT: u64 = 0x800;
/// The largest response virtio-pmo writes: header and a STAT payload.
const PMO_MAX_RESPONSE: u32 = (proto::HEADER_LEN + 8 * 30) as u32;
const ROUNDS: usize = 4;

/// Counts interrupts per drain.
#[derive(Default)]
struct Irq(AtomicU32);

impl VirtioInterrupt for Irq {
    fn trigger(&self, kind: InterruptKind) -> std::io::Result<()> {
        assert_eq!(kind, InterruptKind::Queue(0), "interrupt for another queue");
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

enum Device {
    Pmem(File),
    Pmo(Arc<PmoService>),
}

/// A request for the device, mostly well formed.
fn request(dev: &Device, inp: &mut Input) -> Vec<u8> {
    match dev {
        Device::Pmem(_) => match inp.u8() % 4 {
            0 => inp.bytes(8),
            _ => 0u32.to_le_bytes().to_vec(),
        },
        Device::Pmo(_) => match inp.u8() % 6 {
            0 => inp.bytes(proto::MAX_REQUEST_LEN),
            1 => {
                let mut p = proto::name_field("q").to_vec();
                p.extend_from_slice(&4096u64.to_le_bytes());
                p.extend_from_slice(&proto::key_field(b"k"));
                proto::request(proto::OP_CREATE, &p)
            }
            2 => {
                let mut p = proto::name_field("q").to_vec();
                p.extend_from_slice(&(1 + u32::from(inp.bool())).to_le_bytes());
                p.extend_from_slice(&proto::key_field(b"k"));
                proto::request(proto::OP_ATTACH, &p)
            }
            3 => proto::request(proto::OP_STAT, &u64::from(inp.u8() % 4).to_le_bytes()),
            4 => proto::request(proto::OP_LIST, &0u32.to_le_bytes()),
            _ => {
                let op = u16::from(inp.u8() % 10);
                let payload = inp.bytes(proto::MAX_REQUEST_LEN);
                proto::request(op, &payload)
            }
        },
    }
}

/// Runs one input.
pub fn run(data: &[u8]) {
    run_counted(data);
}

/// Runs one input; returns the used entries checked (tests use it to show
/// that well-formed chains are really served).
fn run_counted(data: &[u8]) -> usize {
    let _one_at_a_time = crate::common::service_lock();
    let mut checked = 0;
    let mut inp = Input::new(data);
    let dir = ScratchDir::new("chains").expect("scratch dir");
    let dev = if inp.u8() & 1 == 0 {
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("pmem.img"))
            .expect("pmem file");
        f.set_len(2 << 20).expect("pmem size");
        Device::Pmem(f)
    } else {
        Device::Pmo(new_service(dir.path()))
    };
    let qsize = 1u16 << (inp.u8() % 5);
    let mem =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_LEN as usize)]).expect("guest memory");
    let mock = MockSplitQueue::create(&mem, GuestAddress(0), qsize);
    let mut queue: Queue = mock.create_queue().expect("queue");
    // The mock places the used ring at the avail ring's start plus its
    // element count (not its byte length), on top of the avail entries for
    // any size above 1: the used ring goes to its own place instead.
    queue.set_used_ring_address(Some(USED_AT as u32), Some(0));
    let used_idx_at = GuestAddress(USED_AT + 2);
    mem.write_obj(0u16, used_idx_at).expect("used idx");
    let irq = Irq::default();
    let mut avail_idx = 0u16;
    let mut used_seen = 0u16;
    let mut rings_clobbered = false;
    for _ in 0..ROUNDS {
        if inp.is_empty() {
            break;
        }
        // The descriptor table.
        let mut descs = Vec::with_capacity(usize::from(qsize));
        for i in 0..qsize {
            let addr = match inp.u8() % 8 {
                0 => inp.u64(),
                1 => MEM_LEN - u64::from(inp.u8()),
                _ => DATA + u64::from(inp.u16()) % (MEM_LEN - DATA),
            };
            let len = match inp.u8() % 8 {
                0 => inp.u32(),
                1 => 0,
                _ => u32::from(inp.u16() % 0x200),
            };
            let f = inp.u8();
            let mut flags = 0u16;
            if f & 3 != 0 {
                flags |= VRING_DESC_F_NEXT as u16;
            }
            if f & 4 != 0 {
                flags |= VRING_DESC_F_WRITE as u16;
            }
            if f & 0xf8 == 0x08 {
                flags |= VRING_DESC_F_INDIRECT as u16;
            }
            let next = match inp.u8() % 4 {
                0 => inp.u16(),
                _ => (i + 1) % qsize,
            };
            let d = Descriptor::new(addr, len, flags, next);
            mock.desc_table()
                .store(i, RawDescriptor::from(d))
                .expect("descriptor slot");
            descs.push((addr, len, flags, next));
            // A buffer over the rings lets the device's own writes (or the
            // request bytes below) rewrite them: the guest's doing, legal,
            // but the used-ring checks below no longer apply.
            if addr < DATA {
                rings_clobbered = true;
            }
            // Request bytes in readable buffers.
            if flags & VRING_DESC_F_WRITE as u16 == 0 && inp.u8() & 3 != 0 {
                let req = request(&dev, &mut inp);
                let _ = mem.write_slice(&req, GuestAddress(addr));
            }
        }
        // New available entries.
        let heads = inp.below(usize::from(qsize) + 1) as u16;
        for k in 0..heads {
            let head = match inp.u8() % 8 {
                0 => inp.u16(),
                _ => u16::from(inp.u8()) % qsize,
            };
            let slot = usize::from(avail_idx.wrapping_add(k) % qsize);
            mock.avail()
                .ring()
                .ref_at(slot)
                .expect("avail slot")
                .store(head);
        }
        let published = if inp.u8() & 15 == 0 {
            inp.u16()
        } else {
            avail_idx.wrapping_add(heads)
        };
        mock.avail().idx().store(published);
        irq.0.store(0, Ordering::Relaxed);
        let res = drain_queue(&mut queue, &mem, &irq, 0, |chain| match &dev {
            Device::Pmem(f) => virtio_devices::pmem::serve_flush(f, chain),
            Device::Pmo(s) => serve_chain(s, chain),
        });
        assert!(
            irq.0.load(Ordering::Relaxed) <= 1,
            "more than one interrupt per drain"
        );

        if rings_clobbered {
            if res.is_err() {
                break;
            }
            continue;
        }
        // What the device returned.
        let used_idx: u16 = mem.read_obj(used_idx_at).expect("used idx");
        let new = used_idx.wrapping_sub(used_seen);
        let offered = published.wrapping_sub(avail_idx);
        if res.is_ok() && offered <= qsize {
            assert!(
                new <= offered,
                "{new} used entries for {offered} available ones"
            );
        }
        assert!(new <= qsize, "{new} used entries in a ring of {qsize}");
        for k in 0..new {
            let at = USED_AT + 4 + 8 * u64::from(used_seen.wrapping_add(k) % qsize);
            let id: u32 = mem.read_obj(GuestAddress(at)).expect("used id");
            let len: u32 = mem.read_obj(GuestAddress(at + 4)).expect("used len");
            assert!(id < u32::from(qsize), "used id {id} of {qsize}");
            match &dev {
                Device::Pmem(_) => assert!(len == 0 || len == 4, "pmem wrote {len} bytes"),
                Device::Pmo(_) => assert!(len <= PMO_MAX_RESPONSE, "pmo wrote {len} bytes"),
            }
            if len >= 4 {
                check_status(&dev, &mem, &descs, id as u16);
            }
            checked += 1;
        }
        used_seen = used_idx;
        avail_idx = published;
        if res.is_err() {
            // A broken ring stays broken for the worker too; stop here.
            break;
        }
    }
    if let Device::Pmo(s) = &dev {
        s.detach_all();
    }
    drop(dev);
    crate::common::wait_threads_gone("pmo-");
    checked
}

/// On a plain chain (direct descriptors, the first writable one holding at
/// least 4 bytes inside memory, no other writable buffer of the table over
/// those 4 bytes, no writable descriptor leading to it), the first 4 bytes
/// written are a status the device defines. Buffers the guest made overlap can hold any bytes the device
/// wrote later (a payload of this or another chain): that is not checked.
fn check_status(dev: &Device, mem: &GuestMemoryMmap, descs: &[(u64, u32, u16, u16)], head: u16) {
    if descs
        .iter()
        .any(|d| d.2 & VRING_DESC_F_INDIRECT as u16 != 0)
    {
        return;
    }
    let mut i = head;
    for _ in 0..descs.len() {
        let Some(&(addr, len, flags, next)) = descs.get(usize::from(i)) else {
            return;
        };
        if flags & VRING_DESC_F_INDIRECT as u16 != 0 {
            return;
        }
        if flags & VRING_DESC_F_WRITE as u16 != 0 {
            if len < 4 || addr.checked_add(4).is_none_or(|e| e > MEM_LEN) {
                return;
            }
            let aliased = descs.iter().enumerate().any(|(j, d)| {
                j != usize::from(i)
                    && d.2 & VRING_DESC_F_WRITE as u16 != 0
                    && d.0 < addr + 4
                    && addr < d.0.saturating_add(u64::from(d.1))
            });
            // Another chain may reach this buffer after a writable one of
            // its own and put payload bytes in it.
            let follows_writable = descs.iter().any(|d| {
                d.2 & VRING_DESC_F_WRITE as u16 != 0
                    && d.2 & VRING_DESC_F_NEXT as u16 != 0
                    && d.3 == i
            });
            if aliased || follows_writable {
                return;
            }
            let v: u32 = mem.read_obj(GuestAddress(addr)).expect("status word");
            match dev {
                Device::Pmem(_) => assert!(v <= 1, "pmem status {v}"),
                Device::Pmo(_) => {
                    let known = [
                        Status::Ok,
                        Status::Perm,
                        Status::NoEnt,
                        Status::Io,
                        Status::NoMem,
                        Status::Access,
                        Status::Busy,
                        Status::Exist,
                        Status::Inval,
                        Status::NoSpc,
                        Status::NameTooLong,
                        Status::NoSys,
                        Status::Proto,
                        Status::BadMsg,
                    ];
                    assert!(known.iter().any(|s| *s as u32 == v), "pmo status {v}");
                }
            }
            return;
        }
        if flags & VRING_DESC_F_NEXT as u16 == 0 {
            return;
        }
        i = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle is alive: a FLUSH chain (request, then a writable status
    /// buffer) on a 2-entry queue is served and its used entry checked.
    #[test]
    fn a_flush_chain_is_served() {
        let input = [
            0, 1, // pmem, queue size 2
            2, 0, 0, 2, 4, 0, 1, 1, 1, 1, // desc 0: DATA, 4 bytes, NEXT -> 1, a FLUSH
            2, 0, 1, 2, 4, 0, 4, 1, // desc 1: DATA + 0x100, 4 bytes, WRITE
            1, 1, 0, 1, // one head (descriptor 0), published
        ];
        assert_eq!(run_counted(&input), 1);
    }
}
