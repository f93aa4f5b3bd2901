//! virtio-pmo requests against a real PMO service: `proto::parse` and
//! `pmo_virtio::serve::execute` on a store file in a scratch directory (tmpfs) and
//! a real userfaultfd window, with a host thread touching attached slices
//! the way a vCPU would.
//!
//! The first input byte picks the mode:
//!
//! - **structured** (most inputs): a program of mostly-valid requests built
//!   from a few names, keys and the handles the service returned, so inputs
//!   reach attach / write / psync / detach / reattach sequences instead of
//!   stopping at parse errors. A model of the expected state checks every
//!   status and every byte read back from the window.
//! - **raw**: requests from raw bytes (a valid header with a random payload,
//!   or anything at all), each parsed and, if it parses, executed.
//!
//! Oracle: no panic, no hang (a window access that does not complete in
//! [`TOUCH_DEADLINE`] is a failure), every response a status the op can
//! give with the payload length the protocol defines, and in structured mode
//! the model (existence, busy rules, wrong keys, data as of the last psync).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use pmo_pager::{PmoConfig, PmoService};
use pmo_policies::PredictorSpec;
use pmo_store::StoreOptions;
use pmo_virtio::device::PmoDevice;
use pmo_virtio::proto::{self, Request, Status};

use crate::common::{Input, ScratchDir};

const PAGE: u64 = 4096;
/// The window every run gets: room for the model's attachments, small
/// enough that a PMO bigger than it exists among the sizes.
const WINDOW: u64 = 4 << 20;
/// How long one window access may take before the run counts as hung: far
/// above a fault's cost (microseconds), so only a real hang trips it.
pub const TOUCH_DEADLINE: Duration = Duration::from_secs(30);
/// Most steps one input runs (libFuzzer inputs are short anyway; this bounds
/// the stable loops).
const MAX_STEPS: usize = 64;

const NAMES: &[&str] = &[
    "a",
    "b.c",
    "db-main_1",
    "n123456789012345678901234567890123456789012345678901234567890ab",
];
const KEYS: &[&[u8]] = &[
    b"k1",
    b"key-two",
    b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
];
const DESIGNS: &[&str] = &["d", "wedi", "bp-ip", "bp-id", "sp-ip", "sp-id", "", "x"];

/// The one place that builds the service configuration for every run (and
/// for the descriptor-chain target): a fresh store in `dir`, a small window,
/// no predictor. Store parameters that change what an attach costs belong
/// here, so every target that builds a service picks them up.
pub fn service_config(dir: &Path) -> PmoConfig {
    PmoConfig {
        store: dir.join("store.img"),
        // 64 PMO slots: the store formats in ~0.1 ms instead of ~6 ms.
        store_size: Some(16 << 20),
        design: None,
        window_size: WINDOW,
        fault_threads: 1,
        test_kill_in_psync: None,
        predictor: PredictorSpec::None,
        // Real Argon2id at its cheapest: the default cost would make each attach 0.2 s.
        store_options: StoreOptions {
            slots: Some(64),
            kdf: pmo_crypto::KdfParams::INSECURE_FAST,
            ..StoreOptions::default()
        },
        dram_budget: None,
        device_memory_latency_ns: 0,
    }
}

/// A fresh service on a fresh store in `dir`.
pub fn new_service(dir: &Path) -> Arc<PmoService> {
    PmoDevice::new(&service_config(dir))
        .expect("PMO service on a fresh tmpfs store")
        .service()
        .clone()
}

/// One access of the toucher thread: `len` bytes at host address `addr`,
/// written with `write` if given, else read.
struct Touch {
    addr: usize,
    len: usize,
    write: Option<Vec<u8>>,
}

/// A host thread that touches the window on request, like a vCPU: each
/// access faults into the pager's userfaultfd threads the first time.
struct Toucher {
    jobs: mpsc::Sender<Touch>,
    done: mpsc::Receiver<Vec<u8>>,
}

impl Toucher {
    fn touch(&self, t: Touch) -> Vec<u8> {
        self.jobs.send(t).expect("toucher thread alive");
        match self.done.recv_timeout(TOUCH_DEADLINE) {
            Ok(v) => v,
            Err(e) => panic!("window access did not complete: {e}"),
        }
    }
}

fn toucher_loop(jobs: mpsc::Receiver<Touch>, done: mpsc::Sender<Vec<u8>>) {
    for t in jobs {
        let out = match t.write {
            Some(bytes) => {
                for (i, b) in bytes.iter().enumerate() {
                    // SAFETY: the caller only sends ranges inside a slice of
                    // the window that is attached for writing while it waits
                    // for this access; volatile so every byte is a real store.
                    unsafe { std::ptr::write_volatile((t.addr + i) as *mut u8, *b) };
                }
                Vec::new()
            }
            None => (0..t.len)
                // SAFETY: as above, inside an attached slice of the window.
                .map(|i| unsafe { std::ptr::read_volatile((t.addr + i) as *const u8) })
                .collect(),
        };
        if done.send(out).is_err() {
            return;
        }
    }
}

/// Statuses each op may answer with (anything else is a failure).
fn allowed(op: u16, s: Status) -> bool {
    use Status::*;
    match op {
        proto::OP_CREATE => matches!(s, Ok | Inval | Exist | NoSpc | NameTooLong | Io),
        proto::OP_DESTROY => matches!(s, Ok | NoEnt | Access | Busy | Inval | Io | BadMsg),
        proto::OP_ATTACH => matches!(s, Ok | NoEnt | Access | Busy | NoMem | Inval | Io | BadMsg),
        proto::OP_DETACH | proto::OP_STAT => matches!(s, Ok | NoEnt),
        proto::OP_PSYNC => matches!(s, Ok | NoEnt | Perm | Io | BadMsg | NoSpc),
        proto::OP_SET_DESIGN => matches!(s, Ok | Inval),
        proto::OP_LIST => matches!(s, Ok | NoEnt),
        _ => false,
    }
}

/// Payload length of a successful answer to `op`.
fn ok_payload_len(op: u16) -> usize {
    match op {
        proto::OP_ATTACH => proto::AttachResponse::LEN,
        proto::OP_PSYNC => proto::PsyncResponse::LEN,
        proto::OP_STAT => proto::StatResponse::LEN,
        proto::OP_LIST => proto::ListEntry::LEN,
        _ => 0,
    }
}

fn op_of(req: &Request) -> u16 {
    match req {
        Request::Create { .. } => proto::OP_CREATE,
        Request::Destroy { .. } => proto::OP_DESTROY,
        Request::Attach { .. } => proto::OP_ATTACH,
        Request::Detach { .. } => proto::OP_DETACH,
        Request::Psync { .. } => proto::OP_PSYNC,
        Request::Stat { .. } => proto::OP_STAT,
        Request::SetDesign { .. } => proto::OP_SET_DESIGN,
        Request::List { .. } => proto::OP_LIST,
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A live attachment as the model knows it.
struct Att {
    name: String,
    write: bool,
    offset: u64,
    size: u64,
    /// Writer only: bytes written since attach, over the durable content.
    working: BTreeMap<u64, u8>,
    /// Writer only: pages written since the last psync.
    dirty: BTreeSet<u64>,
}

/// A PMO as the model knows it.
struct Pmo {
    size: u64,
    key: Vec<u8>,
    /// Bytes as of the last psync (absent = zero).
    durable: BTreeMap<u64, u8>,
}

/// The expected state of the service.
#[derive(Default)]
struct Model {
    pmos: BTreeMap<String, Pmo>,
    atts: BTreeMap<u64, Att>,
}

impl Model {
    fn attached(&self, name: &str) -> (bool, bool) {
        let mut writer = false;
        let mut reader = false;
        for a in self.atts.values().filter(|a| a.name == name) {
            if a.write {
                writer = true;
            } else {
                reader = true;
            }
        }
        (writer, reader)
    }

    /// The largest free run of the window: the pager gives each attachment
    /// one contiguous slice and merges freed slices, so an attach fits iff
    /// its size is at most this.
    fn largest_gap(&self) -> u64 {
        let mut slices: Vec<(u64, u64)> = self.atts.values().map(|a| (a.offset, a.size)).collect();
        slices.sort_unstable();
        let mut gap = 0;
        let mut end = 0;
        for (off, size) in slices {
            gap = gap.max(off - end);
            end = off + size;
        }
        gap.max(WINDOW - end)
    }

    /// The byte at `at` as an access through attachment `a` must see it.
    fn expected(&self, a: &Att, at: u64) -> u8 {
        if a.write {
            if let Some(b) = a.working.get(&at) {
                return *b;
            }
        }
        self.pmos
            .get(&a.name)
            .and_then(|p| p.durable.get(&at).copied())
            .unwrap_or(0)
    }
}

/// Sends `bytes` through parse and execute; checks the answer is a status
/// the op may give with the right payload length; returns it.
fn call(svc: &PmoService, bytes: &[u8]) -> (Status, Vec<u8>) {
    let (status, payload, op) = match proto::parse(bytes) {
        Ok(req) => {
            if let Request::Create { name, .. }
            | Request::Destroy { name, .. }
            | Request::Attach { name, .. } = &req
            {
                assert!(
                    proto::parse_name(&proto::name_field(name)).as_deref() == Ok(name.as_str()),
                    "parse let through a name that is not valid: {name:?}"
                );
            }
            let op = op_of(&req);
            let (s, p) = pmo_virtio::serve::execute(svc, req);
            (s, p, op)
        }
        Err(s) => {
            assert!(
                matches!(
                    s,
                    Status::Proto | Status::NoSys | Status::Inval | Status::NameTooLong
                ),
                "parse error status {s:?}"
            );
            return (s, Vec::new());
        }
    };
    assert!(allowed(op, status), "op {op}: status {status:?}");
    if status == Status::Ok {
        assert_eq!(payload.len(), ok_payload_len(op), "op {op}: payload length");
    } else {
        assert!(
            payload.is_empty(),
            "op {op}: error {status:?} with a payload"
        );
    }
    let resp = proto::response(status, &payload);
    assert_eq!(resp.len(), proto::HEADER_LEN + payload.len());
    assert_eq!(le32(&resp, 0), status as u32);
    assert_eq!(le32(&resp, 4) as usize, payload.len());
    (status, payload)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn create_req(name: &str, size: u64, key: &[u8]) -> Vec<u8> {
    let mut p = proto::name_field(name).to_vec();
    p.extend_from_slice(&size.to_le_bytes());
    p.extend_from_slice(&proto::key_field(key));
    proto::request(proto::OP_CREATE, &p)
}

fn destroy_req(name: &str, key: &[u8]) -> Vec<u8> {
    let mut p = proto::name_field(name).to_vec();
    p.extend_from_slice(&proto::key_field(key));
    proto::request(proto::OP_DESTROY, &p)
}

fn attach_req(name: &str, write: bool, key: &[u8]) -> Vec<u8> {
    let mut p = proto::name_field(name).to_vec();
    p.extend_from_slice(&(if write { 2u32 } else { 1 }).to_le_bytes());
    p.extend_from_slice(&proto::key_field(key));
    proto::request(proto::OP_ATTACH, &p)
}

/// Runs one input.
pub fn run(data: &[u8]) {
    run_counted(data);
}

/// Runs one input; returns how many requests succeeded and window accesses
/// completed in structured mode (tests use it to show programs get deep).
fn run_counted(data: &[u8]) -> usize {
    let _one_at_a_time = crate::common::service_lock();
    let mut done = 0;
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let dir = ScratchDir::new("pmo").expect("scratch dir");
    let svc = new_service(dir.path());
    let (job_tx, job_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::scope(|sc| {
        sc.spawn(move || toucher_loop(job_rx, done_tx));
        let toucher = Toucher {
            jobs: job_tx,
            done: done_rx,
        };
        if mode < 0xe0 {
            done = structured(&svc, &toucher, &mut inp);
        } else {
            raw(&svc, &mut inp);
        }
        // Dropping the sender ends the toucher thread.
        drop(toucher);
    });
    svc.detach_all();
    drop(svc);
    crate::common::wait_threads_gone("pmo-");
    done
}

/// Requests from raw bytes; each one that parses is executed.
fn raw(svc: &PmoService, inp: &mut Input) {
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        let bytes = if inp.u8() < 0x40 {
            inp.bytes(proto::MAX_REQUEST_LEN + 8)
        } else {
            let op = (inp.u8() % 10) as u16;
            let payload = inp.bytes(proto::MAX_REQUEST_LEN);
            proto::request(op, &payload)
        };
        call(svc, &bytes);
    }
}

/// A program of mostly-valid requests checked against the model.
fn structured(svc: &PmoService, toucher: &Toucher, inp: &mut Input) -> usize {
    let mut m = Model::default();
    let base = svc.pager().host_addr() as usize;
    let mut done = 0;
    for _ in 0..MAX_STEPS {
        if inp.is_empty() {
            break;
        }
        match inp.u8() % 12 {
            0 => {
                let name = *inp.pick(NAMES);
                let key = *inp.pick(KEYS);
                let size = match inp.u8() % 16 {
                    0 => 0,
                    1 => PAGE - 1,
                    2 => WINDOW + PAGE, // exists, but can never be attached
                    3 => 1 << 50,
                    n => u64::from(n) * PAGE,
                };
                let (st, _) = call(svc, &create_req(name, size, key));
                let valid = size > 0 && size % PAGE == 0 && size <= 64 << 30;
                let exists = m.pmos.contains_key(name);
                match st {
                    Status::Ok => {
                        assert!(valid && !exists, "create {name} {size}: Ok");
                        done += 1;
                        m.pmos.insert(
                            name.to_string(),
                            Pmo {
                                size,
                                key: key.to_vec(),
                                durable: BTreeMap::new(),
                            },
                        );
                    }
                    Status::Exist => assert!(valid && exists, "create {name} {size}: Exist"),
                    Status::Inval => assert!(!valid, "create {name} {size}: Inval"),
                    // The store may run out of room for a big one.
                    Status::NoSpc => assert!(size > PAGE * 16, "create {name} {size}: NoSpc"),
                    s => panic!("create {name} {size}: {s:?}"),
                }
            }
            1 => {
                let name = *inp.pick(NAMES);
                let key = *inp.pick(KEYS);
                let (st, _) = call(svc, &destroy_req(name, key));
                let (w, r) = m.attached(name);
                match (m.pmos.get(name), st) {
                    (None, s) => assert_eq!(s, Status::NoEnt, "destroy of missing {name}"),
                    (Some(_), Status::Busy) => assert!(w || r, "destroy {name}: Busy, unattached"),
                    (Some(p), Status::Access) => {
                        assert!(p.key != key, "destroy {name}: Access with the right key")
                    }
                    (Some(p), Status::Ok) => {
                        assert!(!w && !r, "destroy of attached {name}");
                        assert_eq!(p.key, key, "destroy {name}: Ok with a wrong key");
                        done += 1;
                        m.pmos.remove(name);
                    }
                    (Some(_), s) => panic!("destroy {name}: {s:?}"),
                }
            }
            2 | 3 => {
                let name = *inp.pick(NAMES);
                let key = *inp.pick(KEYS);
                let write = inp.bool();
                let (st, r) = call(svc, &attach_req(name, write, key));
                let (w, rd) = m.attached(name);
                let conflict = w || (write && rd);
                let Some(p) = m.pmos.get(name) else {
                    assert_eq!(st, Status::NoEnt, "attach of missing {name}");
                    continue;
                };
                if p.key != key {
                    assert_eq!(st, Status::Access, "attach {name} with a wrong key");
                    continue;
                }
                match st {
                    Status::Busy => assert!(conflict, "attach {name} w={write}: Busy"),
                    Status::NoMem => {
                        let gap = m.largest_gap();
                        assert!(
                            !conflict && p.size > gap,
                            "attach {name} of {} bytes: NoMem with a {gap}-byte gap",
                            p.size
                        );
                    }
                    Status::Ok => {
                        assert!(!conflict, "attach {name} w={write}: Ok despite a conflict");
                        done += 1;
                        let (h, off, size) = (le64(&r, 0), le64(&r, 8), le64(&r, 16));
                        assert_eq!(size, p.size, "attach {name}: size");
                        assert_eq!(off % PAGE, 0, "attach {name}: offset {off:#x}");
                        assert!(off + size <= WINDOW, "attach {name}: slice past the window");
                        for a in m.atts.values() {
                            assert!(
                                off + size <= a.offset || a.offset + a.size <= off,
                                "attach {name}: slice overlaps another"
                            );
                        }
                        assert!(!m.atts.contains_key(&h), "attach {name}: handle reused");
                        m.atts.insert(
                            h,
                            Att {
                                name: name.to_string(),
                                write,
                                offset: off,
                                size,
                                working: BTreeMap::new(),
                                dirty: BTreeSet::new(),
                            },
                        );
                    }
                    s => panic!("attach {name}: {s:?}"),
                }
            }
            4 => {
                let h = pick_handle(&m, inp);
                let (st, _) = call(svc, &proto::request(proto::OP_DETACH, &h.to_le_bytes()));
                match m.atts.remove(&h) {
                    Some(_) => {
                        assert_eq!(st, Status::Ok, "detach {h}");
                        done += 1;
                    }
                    None => assert_eq!(st, Status::NoEnt, "detach of unknown {h}"),
                }
            }
            5 => {
                let h = pick_handle(&m, inp);
                let (st, r) = call(svc, &proto::request(proto::OP_PSYNC, &h.to_le_bytes()));
                match m.atts.get_mut(&h) {
                    None => assert_eq!(st, Status::NoEnt, "psync of unknown {h}"),
                    Some(a) if !a.write => assert_eq!(st, Status::Perm, "psync of a reader"),
                    Some(a) => {
                        assert_eq!(st, Status::Ok, "psync {h}");
                        done += 1;
                        assert_eq!(
                            le64(&r, 0),
                            a.dirty.len() as u64,
                            "psync {h}: pages written since the last psync"
                        );
                        a.dirty.clear();
                        let working = a.working.clone();
                        let p = m.pmos.get_mut(&a.name).expect("attached PMO exists");
                        p.durable.extend(working);
                    }
                }
            }
            6 => {
                let h = pick_handle(&m, inp);
                let (st, r) = call(svc, &proto::request(proto::OP_STAT, &h.to_le_bytes()));
                match m.atts.get(&h) {
                    None => assert_eq!(st, Status::NoEnt, "stat of unknown {h}"),
                    Some(a) => {
                        assert_eq!(st, Status::Ok, "stat {h}");
                        assert_eq!(le64(&r, 0), a.size, "stat {h}: size");
                    }
                }
            }
            7 => {
                let d = *inp.pick(DESIGNS);
                let mut f = [0u8; proto::DESIGN_FIELD];
                f[..d.len()].copy_from_slice(d.as_bytes());
                let (st, _) = call(svc, &proto::request(proto::OP_SET_DESIGN, &f));
                let valid = !d.is_empty() && d != "x";
                assert_eq!(st == Status::Ok, valid, "set design {d:?}: {st:?}");
            }
            8 => {
                let index = u32::from(inp.u8() % 8);
                let (st, r) = call(svc, &proto::request(proto::OP_LIST, &index.to_le_bytes()));
                let n = m.pmos.len();
                if (index as usize) < n {
                    assert_eq!(st, Status::Ok, "list {index} of {n}");
                    let name = proto::parse_name(&r[..proto::NAME_FIELD]).expect("listed name");
                    let p = m.pmos.get(&name).expect("listed PMO exists in the model");
                    assert_eq!(le64(&r, proto::NAME_FIELD), p.size, "list {name}: size");
                    let (w, rd) = m.attached(&name);
                    let want = if w { 2 } else { u32::from(rd) };
                    assert_eq!(
                        le32(&r, proto::NAME_FIELD + 8),
                        want,
                        "list {name}: attached"
                    );
                    let more = le32(&r, proto::NAME_FIELD + 12);
                    assert_eq!(more == 1, (index as usize) + 1 < n, "list {index}: more");
                } else {
                    assert_eq!(st, Status::NoEnt, "list {index} of {n}");
                }
            }
            9..=11 => {
                // Touch an attached slice from the host thread.
                let Some(&h) = pick_live(&m, inp) else {
                    continue;
                };
                let a = &m.atts[&h];
                let page = inp.below((a.size / PAGE) as usize) as u64;
                let len = 1 + inp.below(16);
                let at = page * PAGE + inp.below(PAGE as usize - len) as u64;
                let addr = base + (a.offset + at) as usize;
                if a.write && inp.bool() {
                    let bytes: Vec<u8> = (0..len).map(|_| inp.u8()).collect();
                    toucher.touch(Touch {
                        addr,
                        len,
                        write: Some(bytes.clone()),
                    });
                    let a = m.atts.get_mut(&h).expect("live handle");
                    for (i, b) in bytes.into_iter().enumerate() {
                        a.working.insert(at + i as u64, b);
                    }
                    a.dirty.insert(page);
                    done += 1;
                } else {
                    let got = toucher.touch(Touch {
                        addr,
                        len,
                        write: None,
                    });
                    let want: Vec<u8> = (0..len as u64).map(|i| m.expected(a, at + i)).collect();
                    assert_eq!(got, want, "read of {} at {at:#x}", a.name);
                    done += 1;
                }
            }
            _ => unreachable!("op selector is below 12"),
        }
    }
    done
}

/// A live handle most of the time, else an arbitrary one.
fn pick_handle(m: &Model, inp: &mut Input) -> u64 {
    if inp.u8() < 0xe0 {
        if let Some(h) = pick_live(m, inp) {
            return *h;
        }
    }
    match inp.u8() % 3 {
        0 => 0,
        1 => u64::MAX,
        _ => u64::from(inp.u8()),
    }
}

fn pick_live<'m>(m: &'m Model, inp: &mut Input) -> Option<&'m u64> {
    if m.atts.is_empty() {
        return None;
    }
    let i = inp.below(m.atts.len());
    m.atts.keys().nth(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle is alive: create, attach for writing, write 4 bytes from
    /// the host thread, psync (one page), detach, attach for reading, read
    /// them back: seven successes, every one checked against the model.
    #[test]
    fn a_program_reaches_psync_and_reads_back() {
        let input = [
            0, // structured
            0, 0, 0, 4, // create "a", key "k1", 4 pages
            2, 0, 0, 1, // attach "a" for writing
            9, 0, 0, 3, 16, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, // write 4 bytes at 16
            5, 0, 0, // psync
            4, 0, 0, // detach
            2, 0, 0, 0, // attach for reading
            9, 0, 0, 3, 16, 0, 0, 0, 0, // read them back
        ];
        assert_eq!(run_counted(&input), 7);
    }
}
