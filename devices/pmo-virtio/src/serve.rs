//! The glue between the wire and the PMO service: one request parsed ([`crate::proto`]),
//! carried out by `pmo-pager`'s [`PmoService`], and its response encoded ([`respond`]); the
//! device's configuration space ([`device_config`]).
//!
//! A front end hands [`respond`] the bytes of a control-queue chain's readable part and writes
//! what it returns into the writable part. [`serve_chain`] does exactly that for chains of the
//! rust-vmm `virtio-queue` 0.18 / `vm-memory` 0.18 crates (pmovmm); a VMM on other versions of
//! them (Cloud Hypervisor v53 is on 0.17) moves the bytes with its own chain types.

use std::sync::atomic::{AtomicU64, Ordering};

use pmo_crypto::{UserKey, PAGE};
use pmo_pager::{AttachmentStat, Failure, Listed, PmoService};

use crate::proto::{self, Request, Status};

impl From<Failure> for Status {
    fn from(f: Failure) -> Self {
        match f {
            Failure::NotPermitted => Status::Perm,
            Failure::NotFound => Status::NoEnt,
            Failure::Io => Status::Io,
            Failure::NoMemory => Status::NoMem,
            Failure::WrongKey => Status::Access,
            Failure::Busy => Status::Busy,
            Failure::Exists => Status::Exist,
            Failure::Invalid => Status::Inval,
            Failure::NoSpace => Status::NoSpc,
            Failure::NameTooLong => Status::NameTooLong,
            Failure::Integrity => Status::BadMsg,
            Failure::Stale => Status::Stale,
        }
    }
}

/// Serves one validated request; returns the status and the response payload.
pub fn execute(service: &PmoService, req: Request) -> (Status, Vec<u8>) {
    match execute_inner(service, req) {
        Ok(payload) => (Status::Ok, payload),
        Err(s) => (s, Vec::new()),
    }
}

fn execute_inner(service: &PmoService, req: Request) -> Result<Vec<u8>, Status> {
    let key = |k: &proto::KeyBytes| UserKey::new(k).map_err(|_| Status::Inval);
    match req {
        Request::Create { name, size, key: k } => {
            service.create(&name, size, &key(&k)?)?;
            Ok(Vec::new())
        }
        Request::Destroy { name, key: k } => {
            service.destroy(&name, &key(&k)?)?;
            Ok(Vec::new())
        }
        Request::Attach { name, perm, key: k } => {
            let a = service.attach(&name, perm, &key(&k)?)?;
            Ok(proto::AttachResponse {
                handle: a.handle,
                window_offset: a.offset,
                size: a.size,
            }
            .encode()
            .to_vec())
        }
        Request::Detach { handle } => {
            service.detach(handle)?;
            Ok(Vec::new())
        }
        Request::Psync { handle } => {
            let pages_written = service.psync(handle)?;
            Ok(proto::PsyncResponse { pages_written }.encode().to_vec())
        }
        Request::Stat { handle } => Ok(stat_response(&service.stat(handle)?).encode().to_vec()),
        Request::SetDesign { design } => {
            service.set_design(design);
            Ok(Vec::new())
        }
        Request::List { index } => {
            let e = service.list(index)?;
            Ok(proto::ListEntry {
                name: e.name,
                size: e.size,
                attached: match e.attached {
                    Listed::Detached => proto::LIST_DETACHED,
                    Listed::Readers => proto::LIST_READERS,
                    Listed::Writer => proto::LIST_WRITER,
                },
                more: u32::from(e.more),
            }
            .encode()
            .to_vec())
        }
    }
}

/// STAT's wire answer from what the service reports: the one place the counters are laid
/// out for the guest.
fn stat_response(a: &AttachmentStat) -> proto::StatResponse {
    const _: () = assert!(pmo_pager::HIST_BUCKETS == proto::HIST_BUCKETS);
    let s = &a.slice;
    let load = |x: &AtomicU64| x.load(Ordering::Relaxed);
    proto::StatResponse {
        size: a.size,
        faults: load(&s.faults),
        fault_ns_total: load(&s.fault_ns_total),
        pages_decrypted: load(&s.pages_decrypted),
        pages_prefetched: load(&s.pages_prefetched),
        psyncs: a.psyncs,
        psync_pages: a.psync_pages,
        psync_ns_total: a.psync_ns_total,
        integrity_failures: load(&s.integrity_failures),
        fault_hist: std::array::from_fn(|i| load(&s.fault_hist[i])),
        triggers: load(&s.triggers),
        trigger_hits: load(&s.trigger_hits),
        trigger_wasted: load(&s.trigger_wasted),
        prefetch_late: load(&s.prefetch_late),
        demand_unpredicted: load(&s.demand_unpredicted),
        tier: match &a.tier {
            None => proto::TierStat::default(),
            Some(vm) => proto::TierStat {
                dram_pages: load(&s.dram_pages),
                cxl_dirty_pages: load(&s.cxl_dirty_pages),
                promotions: load(&s.promotions),
                demotions: load(&s.demotions),
                prefetch_to_cxl: load(&s.prefetch_to_cxl),
                vm_budget_pages: vm.budget_pages,
                vm_dram_pages: vm.resident_pages,
                vm_cxl_dirty_pages: vm.spilled_pages,
                vm_bytes_moved: vm.bytes_moved(),
            },
        },
    }
}

/// The device configuration space (docs/virtio-pmo.md) of a device whose range (the window
/// and, after it, design `c`'s working area) is `range_len` bytes.
pub fn device_config(range_len: u64) -> Vec<u8> {
    proto::DeviceConfig {
        version: u32::from(proto::VERSION),
        page_size: PAGE as u32,
        window_size: range_len,
        max_name_len: proto::MAX_NAME_LEN as u32,
        max_key_len: proto::KEY_FIELD as u32,
        max_pmo_size: pmo_store::MAX_PMO_SIZE,
    }
    .encode()
    .to_vec()
}

/// The response to one request as the guest sent it (at most [`proto::MAX_REQUEST_LEN`] bytes
/// are looked at): status header and payload, to be written into the chain's writable part
/// as far as it has room.
pub fn respond(service: &PmoService, request: &[u8]) -> Vec<u8> {
    let (status, payload) = match proto::parse(request) {
        Ok(r) => {
            log::debug!("virtio-pmo: {}", r.op_name());
            execute(service, r)
        }
        Err(s) => (s, Vec::new()),
    };
    proto::response(status, &payload)
}

/// Reads the request part of a control-queue chain, serves it and writes the response part;
/// returns the bytes written (what the used ring reports).
#[cfg(feature = "device")]
pub fn serve_chain<M>(service: &PmoService, chain: virtio_queue::DescriptorChain<M>) -> u32
where
    M: std::ops::Deref + Clone,
    M::Target: vm_memory::GuestMemory + Sized,
{
    let mem = chain.memory();
    let (Ok(mut reader), Ok(mut writer)) = (chain.clone().reader(mem), chain.clone().writer(mem))
    else {
        log::warn!("virtio-pmo: malformed descriptor chain");
        return 0;
    };
    let n = reader.available_bytes().min(proto::MAX_REQUEST_LEN);
    let mut req = zeroize::Zeroizing::new(vec![0u8; n]);
    let resp = match std::io::Read::read_exact(&mut reader, &mut req) {
        Err(_) => proto::response(Status::Proto, &[]),
        Ok(()) => respond(service, &req),
    };
    let room = writer.available_bytes();
    let out = &resp[..resp.len().min(room)];
    match std::io::Write::write_all(&mut writer, out) {
        Ok(()) => out.len() as u32,
        Err(_) => 0,
    }
}
