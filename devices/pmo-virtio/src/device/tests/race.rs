//! The hostile-guest race: many threads of a guest against one PMO service with a real
//! window, on a store file and on a store on the CXL expander.

use super::direct::Maps;
use super::*;

/// xorshift64 for the race test: deterministic per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// PMOs of the race test; each has its own name and key.
const RACE_PMOS: u64 = 5;
const RACE_PAGE: u64 = 4096;
/// The largest PMO of the race test, in pages.
const RACE_PAGES_MAX: u64 = 12;
/// Page headers: one aligned u64 per page, written in one store, naming the
/// PMO and the page it belongs to. Zero = never written.
const TAG: u64 = 0x5052_0000_0000_0000;

fn race_name(i: u64) -> String {
    format!("race{i}")
}
fn race_key(i: u64) -> Vec<u8> {
    format!("key-of-race{i}").into_bytes()
}
fn tag(pmo: u64, page: u64) -> u64 {
    TAG | (pmo << 32) | page
}

/// One attach session as the race test saw it: what may legitimately show
/// in its window range, and when (logical clock ticks).
#[derive(Clone, Copy)]
struct Seen {
    handle: u64,
    pmo: u64,
    offset: u64,
    npages: u64,
    writable: bool,
    /// Clock before the ATTACH request was sent.
    from: u64,
    /// Clock after the DETACH that ended it returned (u64::MAX while live).
    until: u64,
}

#[derive(Default)]
struct RaceLog {
    sessions: Vec<Seen>,
    /// DETACHes that returned before their ATTACH was logged: handle -> clock.
    early_detach: BTreeMap<u64, u64>,
    /// ATTACHes sent and not logged yet, by the clock when they were sent.
    pending: std::collections::BTreeSet<u64>,
}

struct Race {
    s: Arc<PmoService>,
    clock: AtomicU64,
    log: Mutex<RaceLog>,
    /// Operations completed by all threads: the watchdog's measure of progress.
    progress: AtomicU64,
    stop: std::sync::atomic::AtomicBool,
    /// What the hostile thread's SETDESIGN requests name (some valid, some not).
    designs: &'static [&'static [u8]],
    /// What the device mapped after the window (design `c` on a working area), if anything.
    maps: Option<Maps>,
    /// Pages of the window the guest sees: the pager's, then the working area's.
    window_pages: u64,
    /// The largest handle an ATTACH gave out so far: the hostile thread guesses around it.
    max_handle: AtomicU64,
}

impl Race {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn call(&self, op: u16, payload: &[u8]) -> (Status, Vec<u8>) {
        let r = call(&self.s, op, payload);
        self.progress.fetch_add(1, Ordering::SeqCst);
        r
    }

    fn attach(&self, pmo: u64, write: bool, key: &[u8]) -> Result<Seen, Status> {
        let from = {
            let mut log = self.log.lock().unwrap();
            let from = self.tick();
            log.pending.insert(from);
            from
        };
        let (st, handle, offset, size) = attach(&self.s, &race_name(pmo), write, key);
        self.progress.fetch_add(1, Ordering::SeqCst);
        self.max_handle.fetch_max(handle, Ordering::SeqCst);
        if st != Status::Ok {
            self.log.lock().unwrap().pending.remove(&from);
            return Err(st);
        }
        let mut seen = Seen {
            handle,
            pmo,
            offset,
            npages: size / RACE_PAGE,
            writable: write,
            from,
            until: u64::MAX,
        };
        let mut log = self.log.lock().unwrap();
        if let Some(t) = log.early_detach.remove(&handle) {
            seen.until = t;
        }
        log.sessions.push(seen);
        log.pending.remove(&from);
        Ok(seen)
    }

    fn detach(&self, handle: u64) -> Status {
        let (st, _) = self.call(OP_DETACH, &handle.to_le_bytes());
        if st == Status::Ok {
            let t = self.tick();
            let mut log = self.log.lock().unwrap();
            match log.sessions.iter_mut().find(|s| s.handle == handle) {
                Some(s) => s.until = t,
                None => {
                    log.early_detach.insert(handle, t);
                }
            }
        }
        st
    }

    /// Runs `f` on the host address of window page `wpage` as a vCPU would reach it: the
    /// pager's window, or a working copy mapped after it, held mapped while `f` runs (as KVM
    /// holds a memslot during an access). `None`: a hole (nothing mapped there).
    fn with_page<T>(&self, wpage: u64, f: impl FnOnce(*mut u8) -> T) -> Option<T> {
        let off = wpage * RACE_PAGE;
        if off < self.s.pager().size() {
            return Some(f((self.s.pager().host_addr() + off) as *mut u8));
        }
        let maps = self.maps.as_ref()?.locked();
        let m = maps.iter().find(|m| m.0 <= off && off < m.0 + m.2)?;
        Some(f((m.1 + off - m.0) as *mut u8))
    }

    /// Reads the header of window page `wpage`; Err if it names a PMO page
    /// that was not attached there at any time during the read.
    fn check_page(&self, wpage: u64) -> Result<(), String> {
        let t0 = self.tick();
        // SAFETY: a page of the window mapping or of a working copy held mapped: every page
        // is served (data, or zeros outside attachments), none is refused in this test.
        let hdr = self.with_page(wpage, |p| unsafe {
            std::ptr::read_volatile(p as *const u64)
        });
        let Some(hdr) = hdr else {
            return Ok(());
        };
        let t1 = self.tick();
        if hdr == 0 {
            return Ok(());
        }
        if hdr & 0xffff_0000_0000_0000 != TAG {
            return Err(format!("window page {wpage} holds garbage {hdr:#x}"));
        }
        let (pmo, page) = ((hdr >> 32) & 0xffff, hdr & 0xffff_ffff);
        // An ATTACH sent before the read may not be logged yet: wait for it
        // (bounded) before calling the page a leak.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let log = self.log.lock().unwrap();
            let legit = log.sessions.iter().any(|s| {
                s.pmo == pmo
                    && page < s.npages
                    && s.offset / RACE_PAGE + page == wpage
                    && s.from <= t1
                    && s.until >= t0
            });
            if legit {
                return Ok(());
            }
            let unlogged = log.pending.range(..=t1).next().is_some();
            drop(log);
            if !unlogged || std::time::Instant::now() > deadline {
                return Err(format!(
                    "window page {wpage} shows page {page} of {} while no attachment of it was there",
                    race_name(pmo)
                ));
            }
            std::thread::yield_now();
        }
    }
}

/// Status sets the protocol allows per op (docs/virtio-pmo.md).
fn allowed(op: u16, st: Status) -> bool {
    use crate::proto::Status::*;
    match op {
        OP_CREATE => matches!(st, Ok | Exist | Inval | NoSpc | NameTooLong | Io),
        OP_DESTROY => matches!(st, Ok | NoEnt | Access | Busy | Inval | NameTooLong | Io),
        OP_ATTACH => matches!(
            st,
            Ok | NoEnt | Access | Busy | NoMem | Inval | NameTooLong | BadMsg | Io
        ),
        OP_DETACH | OP_STAT => matches!(st, Ok | NoEnt | Inval),
        OP_PSYNC => matches!(st, Ok | NoEnt | Perm | Inval | Io | BadMsg),
        proto::OP_SET_DESIGN => matches!(st, Ok | Inval),
        proto::OP_LIST => matches!(st, Ok | NoEnt | Inval),
        _ => matches!(st, NoSys | Proto | Inval),
    }
}

/// A user's DETACH of its own handle: OK, or ENOENT when the hostile thread
/// detached it first (it only does so to read-only attachments).
fn own_detach_ok(st: Status, writable: bool) -> bool {
    st == Status::Ok || (st == Status::NoEnt && !writable)
}

/// A user process of the guest: creates, attaches, reads, writes, psyncs,
/// detaches and destroys its PMOs, with the right key mostly.
fn race_user(r: &Race, seed: u64, ops: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let mut held: Option<Seen> = None;
    for _ in 0..ops {
        if r.stop.load(Ordering::SeqCst) {
            break;
        }
        if let Some(a) = held {
            match rng.below(6) {
                0 | 1 => {
                    // Read every page, like a process walking its PMO.
                    for p in 0..a.npages {
                        r.check_page(a.offset / RACE_PAGE + p)?;
                    }
                }
                2 if a.writable => {
                    for p in 0..a.npages {
                        if rng.below(2) == 0 {
                            let (t, x) = (tag(a.pmo, p), rng.next());
                            // SAFETY: a page of our live, writable attachment (nobody else
                            // detaches writable ones in this test), held mapped meanwhile.
                            let stored = r.with_page(a.offset / RACE_PAGE + p, |w| unsafe {
                                std::ptr::write_volatile(w.cast::<u64>(), t);
                                std::ptr::write_volatile(w.add(64).cast::<u64>(), x);
                            });
                            if stored.is_none() {
                                return Err(format!(
                                    "own attachment at {:#x} not mapped",
                                    a.offset
                                ));
                            }
                        }
                    }
                }
                3 => {
                    let (st, _) = r.call(OP_PSYNC, &a.handle.to_le_bytes());
                    let want_ok = a.writable;
                    if !allowed(OP_PSYNC, st)
                        || (want_ok && st != Status::Ok && st != Status::NoEnt)
                    {
                        return Err(format!("psync of own handle: {st:?}"));
                    }
                }
                4 => {
                    let (st, resp) = r.call(OP_STAT, &a.handle.to_le_bytes());
                    if st == Status::Ok {
                        let size = u64::from_le_bytes(resp[..8].try_into().unwrap());
                        if size != a.npages * RACE_PAGE {
                            return Err(format!("stat of own handle: size {size}"));
                        }
                    } else if st != Status::NoEnt {
                        return Err(format!("stat of own handle: {st:?}"));
                    }
                }
                _ => {
                    let st = r.detach(a.handle);
                    if !own_detach_ok(st, a.writable) {
                        return Err(format!("detach of own handle: {st:?}"));
                    }
                    held = None;
                }
            }
            continue;
        }
        let pmo = rng.below(RACE_PMOS);
        let right = race_key(pmo);
        let wrong = race_key((pmo + 1 + rng.below(RACE_PMOS - 1)) % RACE_PMOS);
        match rng.below(8) {
            0 => {
                let size = match rng.below(8) {
                    0 => rng.below(3 * RACE_PAGE),
                    _ => (1 + rng.below(RACE_PAGES_MAX)) * RACE_PAGE,
                };
                let st = create(&r.s, &race_name(pmo), size, &right);
                r.progress.fetch_add(1, Ordering::SeqCst);
                if !allowed(OP_CREATE, st) {
                    return Err(format!("create: {st:?}"));
                }
            }
            1 => {
                let mut p = name_field(&race_name(pmo)).to_vec();
                let use_right = rng.below(3) == 0;
                p.extend_from_slice(&key_field(if use_right { &right } else { &wrong }));
                let (st, _) = r.call(OP_DESTROY, &p);
                if !allowed(OP_DESTROY, st) || (!use_right && st == Status::Ok) {
                    return Err(format!("destroy (right key {use_right}): {st:?}"));
                }
            }
            2 => {
                let (st, _) = r.call(proto::OP_LIST, &(rng.below(8) as u32).to_le_bytes());
                if !allowed(proto::OP_LIST, st) {
                    return Err(format!("list: {st:?}"));
                }
            }
            3 => match r.attach(pmo, rng.below(2) == 0, &wrong) {
                Ok(_) => return Err(format!("{} attached with a wrong key", race_name(pmo))),
                Err(Status::Access | Status::NoEnt) => {}
                Err(st) => return Err(format!("attach with a wrong key: {st:?}")),
            },
            _ => match r.attach(pmo, rng.below(2) == 0, &right) {
                Ok(a) => {
                    held = Some(a);
                    for p in 0..a.npages {
                        r.check_page(a.offset / RACE_PAGE + p)?;
                    }
                }
                Err(st) if allowed(OP_ATTACH, st) && st != Status::Access => {}
                Err(st) => return Err(format!("attach with the right key: {st:?}")),
            },
        }
    }
    if let Some(a) = held {
        let st = r.detach(a.handle);
        if !own_detach_ok(st, a.writable) {
            return Err(format!("final detach of own handle: {st:?}"));
        }
    }
    Ok(())
}

/// A hostile guest kernel: malformed requests, any handle, design changes,
/// psyncs of other processes' attachments, detaches of read-only ones.
fn race_hostile(r: &Race, seed: u64, ops: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    for _ in 0..ops {
        if r.stop.load(Ordering::SeqCst) {
            break;
        }
        match rng.below(6) {
            0 => {
                // Random bytes with a plausible header.
                let mut req = vec![0u8; rng.below(proto::MAX_REQUEST_LEN as u64 + 16) as usize];
                for b in req.iter_mut() {
                    *b = rng.next() as u8;
                }
                if req.len() >= 8 && rng.below(2) == 0 {
                    req[..2].copy_from_slice(&proto::VERSION.to_le_bytes());
                    let op = rng.below(10) as u16;
                    req[2..4].copy_from_slice(&op.to_le_bytes());
                    let len = (req.len() - 8) as u32;
                    req[4..8].copy_from_slice(&len.to_le_bytes());
                }
                let op = if req.len() >= 4 {
                    u16::from_le_bytes([req[2], req[3]])
                } else {
                    0
                };
                let st = match proto::parse(&req) {
                    // A parsed destroy/detach could hit a user's PMO or
                    // attachment; those are covered below with known handles.
                    Ok(Request::Detach { .. } | Request::Destroy { .. }) => continue,
                    Ok(q) => crate::serve::execute(&r.s, q).0,
                    Err(st) => st,
                };
                r.progress.fetch_add(1, Ordering::SeqCst);
                if !allowed(op, st) && !matches!(st, Status::Proto | Status::Inval | Status::NoSys)
                {
                    return Err(format!("random request op {op}: {st:?}"));
                }
            }
            1 => {
                let handle = 1 + rng.below(r.max_handle.load(Ordering::SeqCst) + 2);
                let (st, _) = r.call(OP_PSYNC, &handle.to_le_bytes());
                if !allowed(OP_PSYNC, st) {
                    return Err(format!("psync of handle {handle}: {st:?}"));
                }
            }
            2 => {
                let handle = 1 + rng.below(r.max_handle.load(Ordering::SeqCst) + 2);
                let (st, _) = r.call(OP_STAT, &handle.to_le_bytes());
                if !allowed(OP_STAT, st) {
                    return Err(format!("stat of handle {handle}: {st:?}"));
                }
            }
            3 => {
                // Detach a logged read-only attachment, or a handle never given out.
                let target = {
                    let log = r.log.lock().unwrap();
                    let live: Vec<u64> = log
                        .sessions
                        .iter()
                        .filter(|s| !s.writable && s.until == u64::MAX)
                        .map(|s| s.handle)
                        .collect();
                    if live.is_empty() || rng.below(4) == 0 {
                        (1 << 40) + rng.below(1 << 20)
                    } else {
                        live[rng.below(live.len() as u64) as usize]
                    }
                };
                let st = r.detach(target);
                if !matches!(st, Status::Ok | Status::NoEnt)
                    || (target >= 1 << 40 && st == Status::Ok)
                {
                    return Err(format!("detach of handle {target}: {st:?}"));
                }
            }
            4 => {
                let mut f = [0u8; proto::DESIGN_FIELD];
                let n = r.designs[rng.below(r.designs.len() as u64) as usize];
                f[..n.len()].copy_from_slice(n);
                let (st, _) = r.call(proto::OP_SET_DESIGN, &f);
                if !allowed(proto::OP_SET_DESIGN, st) {
                    return Err(format!("set design: {st:?}"));
                }
            }
            _ => {
                // Its own short attach session with the right key.
                let pmo = rng.below(RACE_PMOS);
                if let Ok(a) = r.attach(pmo, false, &race_key(pmo)) {
                    let st = r.detach(a.handle);
                    if !matches!(st, Status::Ok | Status::NoEnt) {
                        return Err(format!("detach of own read-only handle: {st:?}"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The race test's service configuration: a small window (ranges are reused all the time, and
/// ATTACH sees ENOMEM) and a predictor deep enough that its predictions go out as runs of
/// several pages, which faults of the toucher and the users then wait on.
fn race_config(dir: &Path) -> PmoConfig {
    PmoConfig {
        store: dir.join("store.img"),
        store_size: Some(256 << 20),
        design: None,
        window_size: 40 * RACE_PAGE,
        fault_threads: 2,
        test_kill_in_psync: None,
        predictor: PredictorSpec::Stream(8),
        store_options: fast_store(),
        dram_budget: None,
        device_memory_latency_ns: 0,
    }
}

#[test]
fn hostile_guest_threads_race_requests_and_touches_without_crossing_pmos() {
    let d = tmp("race");
    let s = PmoDevice::new(&race_config(&d.0))
        .unwrap()
        .service()
        .clone();
    race(s, &[b"d", b"sp-id", b"wedi", b"psychic", b"\xff\xfe"]);
}

/// The race on a store on the CXL expander (range keys from a master key), where the hostile
/// thread switches between file designs and the CXL designs `c`, `cl`, `cf` while users
/// create, attach, write and psync: a PMO made under any design attaches and reads back under
/// any other, nothing crosses PMOs, and afterwards the media holds no page header of any PMO
/// in plaintext.
#[test]
fn hostile_guest_races_switches_to_cxl_designs_on_an_expander_store() {
    use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig};
    let d = tmp("race-cxl");
    let media = d.0.join("media.img");
    let mut xcfg = ExpanderConfig::new(&media, 64 << 20);
    xcfg.cache_bytes = 1 << 20;
    xcfg.media_latency_ns = 0;
    let x = Expander::open(&xcfg).unwrap();
    let keyring = pmo_crypto::ExtentKeyring::new(&[0x4d; 32]).unwrap();
    let medium = pmo_media::Backing::from(CxlMedium::new(x.clone()).with_keyring(keyring));
    let s = PmoDevice::with_medium(&race_config(&d.0), medium, true)
        .unwrap()
        .service()
        .clone();
    let s = race(s, &[b"c", b"cl", b"cf", b"d", b"sp-id", b"cx"]);
    let suites: Vec<_> = s.store().list().iter().map(|i| i.suite.name()).collect();
    eprintln!("suites of the PMOs left: {suites:?}");
    // After the race both kinds are still made as asked: a CXL design's PMO has only the
    // range key as its cipher, a file design's its own.
    for (design, suite) in [
        ("c", "tee-blake3"),
        ("d", "aes-gcm"),
        ("sp-id", "xts-blake3"),
    ] {
        let mut f = [0u8; proto::DESIGN_FIELD];
        f[..design.len()].copy_from_slice(design.as_bytes());
        assert_eq!(call(&s, proto::OP_SET_DESIGN, &f).0, Status::Ok);
        let name = format!("after-{design}");
        assert_eq!(create(&s, &name, 2 * RACE_PAGE, b"k"), Status::Ok);
        let info = s
            .store()
            .list()
            .into_iter()
            .find(|i| i.name == name)
            .unwrap();
        assert_eq!(info.suite.name(), suite, "{name}");
        let (st, h, _, _) = attach(&s, &name, true, b"k");
        assert_eq!(st, Status::Ok, "attach {name}");
        assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
    }
    drop(s);
    // Every dirty block of the device cache reaches the media with the last owner.
    drop(x);
    assert_no_page_header_on(&media);
}

/// No page header of any race PMO on the media file, in plaintext.
fn assert_no_page_header_on(media: &Path) {
    let bytes = std::fs::read(media).unwrap();
    for pmo in 0..RACE_PMOS {
        for p in 0..RACE_PAGES_MAX {
            assert!(
                !contains(&bytes, &tag(pmo, p).to_le_bytes()),
                "page {p} of {} is on the media in plaintext",
                race_name(pmo)
            );
        }
    }
}

/// The race with design `c` attachments mapped from the expander's memory: the hostile thread
/// switches between `c` (a working copy in the working area, mapped after the window) and
/// window designs while users attach, store, psync and detach and the toucher reads the pager's
/// window and the working area alike (through whatever is mapped there, held mapped during the
/// read as KVM holds a memslot). Nothing crosses PMOs, every working copy is unmapped by the
/// end, and the media holds no page header in plaintext.
#[test]
fn hostile_guest_races_design_c_attachments_mapped_from_the_expander() {
    use super::direct::RecordingMapper;
    use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig};
    let d = tmp("race-direct");
    let media = d.0.join("media.img");
    let (size, area) = (64u64 << 20, 8u64 << 20);
    let mut xcfg = ExpanderConfig::new(&media, size);
    xcfg.cache_bytes = 1 << 20;
    xcfg.media_latency_ns = 0;
    let x = Expander::open(&xcfg).unwrap();
    let keyring = pmo_crypto::ExtentKeyring::new(&[0x4e; 32]).unwrap();
    let medium = pmo_media::Backing::from(CxlMedium::new(x.clone()).with_keyring(keyring));
    let mut cfg = race_config(&d.0);
    cfg.store_options.len = Some(size - area);
    let mut dev = PmoDevice::with_medium(&cfg, medium, true).unwrap();
    dev.set_working_area(cxl_t3::WorkingArea::new(x.clone(), size - area, size).unwrap());
    let mapper = RecordingMapper::default();
    let (maps, made) = (mapper.maps.clone(), mapper.made.clone());
    dev.set_shm_mapper(Arc::new(mapper));
    let s = dev.service().clone();
    drop(dev);
    let s = race_with(s, &[b"c", b"cl", b"d", b"c", b"cx"], Some(maps), area);
    let made = made.load(Ordering::Relaxed);
    eprintln!("{made} design c attachments mapped from the expander");
    assert!(
        made >= 10,
        "only {made} attachments went to the working area"
    );
    drop(s);
    x.shutdown().unwrap();
    drop(x);
    assert_no_page_header_on(&media);
}

/// Many threads of a hostile guest against one PMO service with a real
/// window: user processes attaching, writing, psyncing and detaching their
/// PMOs; a hostile kernel sending malformed requests, guessing handles,
/// psyncing others' attachments, detaching read-only ones and switching the
/// design among `designs`; a toucher reading the whole window like a vCPU.
/// No panic, no hang (a watchdog aborts the test when no request completes
/// for a long time), every status one the protocol allows for the op, and a
/// PMO's pages never show where no attachment of that PMO was, nor end up in
/// another PMO.
fn race(s: Arc<PmoService>, designs: &'static [&'static [u8]]) -> Arc<PmoService> {
    race_with(s, designs, None, 0)
}

/// [`race`] on a service whose design `c` attachments are mapped after the window through a
/// recording mapper (`maps`), over a working area of `area` bytes.
fn race_with(
    s: Arc<PmoService>,
    designs: &'static [&'static [u8]],
    maps: Option<Maps>,
    area: u64,
) -> Arc<PmoService> {
    let window_pages = (s.pager().size() + area) / RACE_PAGE;
    let r = Race {
        s,
        clock: AtomicU64::new(1),
        log: Mutex::new(RaceLog::default()),
        progress: AtomicU64::new(0),
        stop: std::sync::atomic::AtomicBool::new(false),
        designs,
        maps,
        window_pages,
        max_handle: AtomicU64::new(0),
    };
    let ops: u64 = std::env::var("PMO_RACE_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1500);
    let finished = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<Result<(), String>> = std::thread::scope(|sc| {
        let r = &r;
        let finished = &finished;
        // Watchdog: the test fails (the process aborts) if no request
        // completes for a whole minute; a healthy run completes thousands a second.
        sc.spawn(move || {
            let mut last = (r.progress.load(Ordering::SeqCst), std::time::Instant::now());
            while !finished.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let now = r.progress.load(Ordering::SeqCst);
                if now != last.0 {
                    last = (now, std::time::Instant::now());
                } else if last.1.elapsed() > std::time::Duration::from_secs(60) {
                    eprintln!("watchdog: no request completed for 60 s after {now}: hang");
                    std::process::abort();
                }
            }
        });
        let toucher = sc.spawn(move || -> Result<(), String> {
            let mut rng = Rng(0xfeed);
            let pages = r.window_pages;
            while !r.stop.load(Ordering::SeqCst) {
                r.check_page(rng.below(pages))?;
            }
            Ok(())
        });
        let mut workers = Vec::new();
        for u in 0..3u64 {
            workers.push(sc.spawn(move || {
                let res = race_user(r, 0x1000 + u, ops);
                if res.is_err() {
                    r.stop.store(true, Ordering::SeqCst);
                }
                res
            }));
        }
        workers.push(sc.spawn(move || {
            let res = race_hostile(r, 0x2000, ops);
            if res.is_err() {
                r.stop.store(true, Ordering::SeqCst);
            }
            res
        }));
        let mut results: Vec<_> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect();
        r.stop.store(true, Ordering::SeqCst);
        results.push(
            toucher
                .join()
                .unwrap_or_else(|_| Err("toucher panicked".into())),
        );
        finished.store(true, Ordering::SeqCst);
        results
    });
    for res in &results {
        if let Err(e) = res {
            panic!("{e}");
        }
    }
    // Nothing is attached any more; every PMO that exists holds only its own pages.
    r.s.detach_all();
    if let Some(m) = &r.maps {
        assert!(
            m.locked().is_empty(),
            "mapped after detach_all: {:?}",
            m.locked()
        );
    }
    let mut checked = 0;
    for pmo in 0..RACE_PMOS {
        let (st, h, off, size) = attach(&r.s, &race_name(pmo), false, &race_key(pmo));
        if st == Status::NoEnt {
            continue;
        }
        assert_eq!(st, Status::Ok, "final attach of {}", race_name(pmo));
        for p in 0..size / RACE_PAGE {
            // SAFETY: inside the attached slice, held mapped.
            let hdr = r
                .with_page(off / RACE_PAGE + p, |w| unsafe {
                    std::ptr::read_volatile(w.cast::<u64>())
                })
                .expect("the final attachment is mapped");
            assert!(
                hdr == 0 || hdr == tag(pmo, p),
                "page {p} of {} holds {hdr:#x} after the race",
                race_name(pmo)
            );
            checked += 1;
        }
        assert_eq!(call(&r.s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
    }
    let sessions = r.log.lock().unwrap().sessions.len();
    eprintln!(
        "{} requests, {sessions} attach sessions, {checked} pages checked at the end",
        r.progress.load(Ordering::SeqCst)
    );
    assert!(
        sessions > 50,
        "only {sessions} attach sessions: the race barely ran"
    );
    r.s
}
