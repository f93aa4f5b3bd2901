//! The glue between the wire and the PMO service: one request read from a descriptor chain,
//! parsed ([`crate::proto`]), carried out by `pmo-pager`'s [`PmoService`], and its response
//! written back. A front end that runs its own virtqueues (any VMM on the rust-vmm
//! `virtio-queue` and `vm-memory` crates) calls [`serve_chain`] for each control-queue chain.

use std::sync::atomic::{AtomicU64, Ordering};

use pmo_crypto::UserKey;
use pmo_pager::{AttachmentStat, Failure, Listed, PmoService};
use virtio_queue::DescriptorChain;
use vm_memory::GuestMemory;

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

/// Reads the request part of a control-queue chain, serves it and writes the response part;
/// returns the bytes written (what the used ring reports).
pub fn serve_chain<M>(service: &PmoService, chain: DescriptorChain<M>) -> u32
where
    M: std::ops::Deref + Clone,
    M::Target: GuestMemory + Sized,
{
    let mem = chain.memory();
    let (Ok(mut reader), Ok(mut writer)) = (chain.clone().reader(mem), chain.clone().writer(mem))
    else {
        log::warn!("virtio-pmo: malformed descriptor chain");
        return 0;
    };
    let n = reader.available_bytes().min(proto::MAX_REQUEST_LEN);
    let mut req = zeroize::Zeroizing::new(vec![0u8; n]);
    let (status, payload) = match std::io::Read::read_exact(&mut reader, &mut req) {
        Err(_) => (Status::Proto, Vec::new()),
        Ok(()) => match proto::parse(&req) {
            Ok(r) => {
                log::debug!("virtio-pmo: {}", r.op_name());
                execute(service, r)
            }
            Err(s) => (s, Vec::new()),
        },
    };
    let resp = proto::response(status, &payload);
    let room = writer.available_bytes();
    let out = &resp[..resp.len().min(room)];
    match std::io::Write::write_all(&mut writer, out) {
        Ok(()) => out.len() as u32,
        Err(_) => 0,
    }
}
