//! Design `c` with a working area on the expander: attachments bypass the pager and are
//! mapped into the guest as the expander's own memory. A real expander, store and
//! userfaultfd; host threads store through the working copy's host mapping as a vCPU would
//! through its memslot. The mapper records what the device asks the transport to map (the
//! transport's KVM side is tested in `devices/pci/src/virtio/shm.rs`).

use super::*;
use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig};
use cxl_t3::WorkingArea;
use virtio_devices::{ShmMapError, ShmMapper, ShmMapping};

const DEVICE: u64 = 64 << 20;
const AREA: u64 = 8 << 20;
const WINDOW: u64 = 16 << 20;
const PAGE_BYTES: u64 = pmo_crypto::PAGE as u64;

/// (offset in region 0, host address, length, read-only) of each live mapping.
pub(super) type Maps = Arc<Mutex<Vec<(u64, u64, u64, bool)>>>;

/// Stands for the transport: records each mapping until its owner drops it.
#[derive(Default)]
pub(super) struct RecordingMapper {
    pub(super) maps: Maps,
    /// Mappings made so far.
    pub(super) made: Arc<std::sync::atomic::AtomicU64>,
}

struct Unmap {
    maps: Maps,
    offset: u64,
}

impl Drop for Unmap {
    fn drop(&mut self) {
        self.maps.locked().retain(|m| m.0 != self.offset);
    }
}

impl ShmMapper for RecordingMapper {
    unsafe fn map(
        &self,
        region: usize,
        offset: u64,
        host_addr: u64,
        len: u64,
        read_only: bool,
    ) -> Result<ShmMapping, ShmMapError> {
        assert_eq!(region, 0);
        self.made.fetch_add(1, Ordering::Relaxed);
        self.maps.locked().push((offset, host_addr, len, read_only));
        Ok(ShmMapping::new(Box::new(Unmap {
            maps: self.maps.clone(),
            offset,
        })))
    }
}

struct Rig {
    s: Arc<PmoService>,
    events: Arc<EventSink>,
    maps: Maps,
    _x: Arc<Expander>,
}

/// A store on an expander over all but its last `AREA` bytes, those the working area.
fn rig(dir: &Path) -> Rig {
    rig_on(dir, true)
}

/// [`rig`] on the media in `dir`: formatted when `blank`, else opened.
fn rig_on(dir: &Path, blank: bool) -> Rig {
    let media = dir.join("media.img");
    let mut xcfg = ExpanderConfig::new(media.clone(), DEVICE);
    xcfg.cache_bytes = 1 << 20; // smaller than a PMO below: blocks are evicted and refilled
    xcfg.media_latency_ns = 0;
    let x = Expander::open(&xcfg).unwrap();
    let keyring = pmo_crypto::ExtentKeyring::new(&[0x5a; 32]).unwrap();
    let medium = pmo_media::Backing::from(CxlMedium::new(x.clone()).with_keyring(keyring));
    let cfg = PmoConfig {
        store: media,
        store_size: None,
        design: Some(Design::C),
        window_size: WINDOW,
        fault_threads: 2,
        test_kill_in_psync: None,
        predictor: PredictorSpec::None,
        store_options: StoreOptions {
            len: Some(DEVICE - AREA),
            ..fast_store()
        },
        dram_budget: None,
        device_memory_latency_ns: 0,
    };
    let mut dev = PmoDevice::with_medium(&cfg, medium, blank).unwrap();
    assert_eq!(dev.service().store_len(), DEVICE - AREA);
    let area = WorkingArea::new(x.clone(), DEVICE - AREA, DEVICE).unwrap();
    dev.set_working_area(area);
    let mapper = RecordingMapper::default();
    let maps = mapper.maps.clone();
    dev.set_shm_mapper(Arc::new(mapper));
    // The guest sees one window: the pager's, then the area.
    let mut cfg_bytes = [0u8; 8];
    dev.read_config(8, &mut cfg_bytes);
    assert_eq!(u64::from_le_bytes(cfg_bytes), WINDOW + AREA);
    assert_eq!(dev.shared_memory()[0].runtime_len, AREA);
    Rig {
        s: dev.service().clone(),
        events: dev.events.clone(),
        maps,
        _x: x,
    }
}

fn store_at(host: u64, off: u64, bytes: &[u8]) {
    // SAFETY: inside a live working copy's mapping (checked by the caller against the
    // recorded mapping), which nothing else frees while the test holds the attachment.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (host + off) as *mut u8, bytes.len()) };
}

fn load_at(host: u64, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: as in `store_at`.
    unsafe { std::ptr::copy_nonoverlapping((host + off) as *const u8, v.as_mut_ptr(), len) };
    v
}

/// The mapping the device made for an attachment at `offset`: (host address, read-only).
fn mapping(r: &Rig, offset: u64, size: u64) -> (u64, bool) {
    let maps = r.maps.locked();
    let m = maps
        .iter()
        .find(|m| m.0 == offset)
        .unwrap_or_else(|| panic!("nothing mapped at {offset:#x}: {maps:?}"));
    assert_eq!(m.2, size);
    (m.1, m.3)
}

/// Stores through the mapping reach the store at psync and only there: psync persists
/// exactly the pages written since the last one, a new attachment reads them back, the pager
/// never served a fault, and the media holds no plaintext.
#[test]
fn design_c_attachments_live_on_the_expander_and_psync_what_the_guest_wrote() {
    let d = tmp("direct");
    let r = rig(&d.0);
    let pages = 512u64; // 2 MiB: twice the device cache
    assert_eq!(create(&r.s, "db", pages * PAGE_BYTES, b"k"), Status::Ok);
    let (st, h, off, size) = attach(&r.s, "db", true, b"k");
    assert_eq!((st, size), (Status::Ok, pages * PAGE_BYTES));
    assert!(off >= WINDOW && off + size <= WINDOW + AREA, "{off:#x}");
    let (host, ro) = mapping(&r, off, size);
    assert!(!ro);
    let fills_before = r._x.stats().fills;
    // Two threads store like two vCPUs, over more pages than the cache holds.
    let marker = |p: u64| format!("DIRECT-C-SECRET page {p:04} ");
    std::thread::scope(|sc| {
        for t in 0..2u64 {
            let marker = &marker;
            sc.spawn(move || {
                for p in (t..pages).step_by(2) {
                    store_at(host, p * PAGE_BYTES + 64, marker(p).as_bytes());
                }
            });
        }
    });
    // The stores went through the expander's own fault path: over twice the device cache,
    // every page was filled again after the copy-in evicted it.
    let fills = r._x.stats().fills - fills_before;
    assert!(
        fills >= pages / 2,
        "{fills} fills for {pages} pages stored to"
    );
    let psync = |h: u64| {
        let (st, resp) = call(&r.s, OP_PSYNC, &h.to_le_bytes());
        assert_eq!(st, Status::Ok);
        u64::from_le_bytes(resp[..8].try_into().unwrap())
    };
    assert_eq!(psync(h), pages);
    assert_eq!(psync(h), 0, "nothing written since");
    for p in [3u64, 200, 511] {
        store_at(host, p * PAGE_BYTES + 2048, b"second");
    }
    assert_eq!(psync(h), 3);
    // Written after the last psync: lost at detach.
    store_at(host, 7 * PAGE_BYTES + 64, b"UNSYNCED");
    assert_eq!(call(&r.s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
    assert!(r.maps.locked().is_empty(), "still mapped after detach");
    r.s.detach_all();

    let (st, h2, off2, _) = attach(&r.s, "db", false, b"k");
    assert_eq!(st, Status::Ok);
    let (host2, ro) = mapping(&r, off2, size);
    assert!(ro, "a reader's mapping is read-only");
    for p in 0..pages {
        let got = load_at(host2, p * PAGE_BYTES + 64, marker(p).len());
        assert_eq!(got, marker(p).as_bytes(), "page {p}");
    }
    assert_eq!(load_at(host2, 200 * PAGE_BYTES + 2048, 6), b"second");
    assert_eq!(
        load_at(host2, 7 * PAGE_BYTES + 64, 8),
        marker(7).as_bytes()[..8]
    );
    assert_eq!(call(&r.s, OP_PSYNC, &h2.to_le_bytes()).0, Status::Perm);
    assert_eq!(call(&r.s, OP_DETACH, &h2.to_le_bytes()).0, Status::Ok);
    r.s.detach_all();
    r._x.shutdown().unwrap();
    drop(r);
    let bytes = std::fs::read(d.0.join("media.img")).unwrap();
    assert!(
        !contains(&bytes, b"DIRECT-C-SECRET"),
        "plaintext on the media"
    );
    assert!(!contains(&bytes, b"UNSYNCED"), "plaintext on the media");
}

/// The area is shared first-fit by attachments; when it is full an attach answers ENOMEM
/// and leaves the PMO as it was; a detach makes room again. Other designs still use the pager.
#[test]
fn a_full_working_area_refuses_attach_and_other_designs_use_the_window() {
    let d = tmp("direct-full");
    let r = rig(&d.0);
    let half = AREA / 2;
    for n in ["a", "b", "c"] {
        assert_eq!(create(&r.s, n, half, b"k"), Status::Ok);
    }
    let (st, ha, offa, _) = attach(&r.s, "a", true, b"k");
    assert_eq!(st, Status::Ok);
    let (st, _hb, offb, _) = attach(&r.s, "b", true, b"k");
    assert_eq!(st, Status::Ok);
    assert_ne!(offa, offb);
    assert_eq!(attach(&r.s, "c", true, b"k").0, Status::NoMem);
    assert_eq!(call(&r.s, OP_DETACH, &ha.to_le_bytes()).0, Status::Ok);
    let (st, _, offc, _) = attach(&r.s, "c", true, b"k");
    assert_eq!(
        (st, offc),
        (Status::Ok, offa),
        "first fit reuses the freed range"
    );
    // A PMO of another design attaches into the pager's window as before.
    let mut f = [0u8; proto::DESIGN_FIELD];
    f[..2].copy_from_slice(b"cl");
    assert_eq!(call(&r.s, proto::OP_SET_DESIGN, &f).0, Status::Ok);
    assert_eq!(create(&r.s, "w", 4 * PAGE_BYTES, b"k"), Status::Ok);
    let (st, hw, offw, _) = attach(&r.s, "w", true, b"k");
    assert_eq!(st, Status::Ok);
    assert!(offw < WINDOW, "{offw:#x}");
    // SAFETY: inside the attached slice of the window.
    unsafe { *window(&r.s, offw) = 1 };
    assert_eq!(call(&r.s, OP_PSYNC, &hw.to_le_bytes()).0, Status::Ok);
    assert_eq!(
        r.maps.locked().len(),
        2,
        "only the two design c attachments are mapped"
    );
    r.s.detach_all();
    assert!(r.maps.locked().is_empty());
}

/// A keyless editor who flips a byte of a design c PMO on the media: the attach is refused
/// before anything is mapped, and no working copy is left behind.
#[test]
fn a_tampered_page_refuses_a_direct_attach_before_anything_is_mapped() {
    let d = tmp("direct-tamper");
    let r = rig(&d.0);
    assert_eq!(create(&r.s, "t", 8 * PAGE_BYTES, b"k"), Status::Ok);
    let (st, h, off, size) = attach(&r.s, "t", true, b"k");
    assert_eq!(st, Status::Ok);
    let (host, _) = mapping(&r, off, size);
    for p in 0..8 {
        store_at(host, p * PAGE_BYTES, &[0x77; 512]);
    }
    assert_eq!(call(&r.s, OP_PSYNC, &h.to_le_bytes()).0, Status::Ok);
    assert_eq!(call(&r.s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
    let extent =
        r.s.store()
            .list()
            .into_iter()
            .find(|i| i.name == "t")
            .unwrap()
            .extent;
    r.s.detach_all();
    drop(r);
    // Flip one byte of page 5 of the PMO's primary copy, as stored on the media.
    let at = cxl_t3::media::HEADER_LEN + extent.0 + 5 * PAGE_BYTES + 100;
    let mut bytes = std::fs::read(d.0.join("media.img")).unwrap();
    bytes[at as usize] ^= 1;
    std::fs::write(d.0.join("media.img"), &bytes).unwrap();

    let r = rig_on(&d.0, false);
    assert_eq!(attach(&r.s, "t", true, b"k").0, Status::BadMsg);
    assert!(
        r.maps.locked().is_empty(),
        "a refused attach left a mapping"
    );
    // The area has all its room: nothing of the refused attach stayed.
    assert_eq!(create(&r.s, "whole", AREA, b"k"), Status::Ok);
    let (st, h, _, _) = attach(&r.s, "whole", true, b"k");
    assert_eq!(st, Status::Ok);
    assert_eq!(call(&r.s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
    r.s.detach_all();
}

/// A keyless editor who changes a block of a live working copy on the media (after the
/// expander wrote it back): the expander serves that page as zeros, the attachment fails
/// (the guest hears of the page, psync and detach answer EBADMSG and persist nothing), and
/// the PMO stays as of its last good psync.
#[test]
fn a_working_copy_block_changed_on_the_media_fails_the_attachment() {
    use std::os::unix::fs::FileExt;
    let d = tmp("direct-edit");
    let r = rig(&d.0);
    let pages = 512u64; // twice the device cache: early pages are written back and evicted
    assert_eq!(create(&r.s, "e", pages * PAGE_BYTES, b"k"), Status::Ok);
    let (st, h, off, size) = attach(&r.s, "e", true, b"k");
    assert_eq!(st, Status::Ok);
    let (host, _) = mapping(&r, off, size);
    for p in 0..pages {
        store_at(host, p * PAGE_BYTES, format!("good {p:04}").as_bytes());
    }
    assert_eq!(call(&r.s, OP_PSYNC, &h.to_le_bytes()).0, Status::Ok);
    for p in 0..pages {
        store_at(host, p * PAGE_BYTES, format!("next {p:04}").as_bytes());
    }
    // Page 0 of the working copy, as the expander last wrote it back.
    let media = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(d.0.join("media.img"))
        .unwrap();
    let at = cxl_t3::media::HEADER_LEN + (DEVICE - AREA) + (off - WINDOW) + 10;
    let mut b = [0u8; 1];
    media.read_exact_at(&mut b, at).unwrap();
    media.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    let fills = r._x.stats().fills;
    assert_eq!(call(&r.s, OP_PSYNC, &h.to_le_bytes()).0, Status::BadMsg);
    assert!(
        r._x.stats().fills > fills,
        "page 0 was still cached: the edit was never read"
    );
    assert_eq!(r._x.counters().working_integrity_failures, 1);
    let events: Vec<_> = r.events.pending();
    assert!(
        events.contains(&(proto::EVENT_PAGE_BAD, h, 0)),
        "the guest was not told: {events:?}"
    );
    assert_eq!(call(&r.s, OP_PSYNC, &h.to_le_bytes()).0, Status::BadMsg);
    assert_eq!(call(&r.s, OP_DETACH, &h.to_le_bytes()).0, Status::BadMsg);
    r.s.detach_all();
    let (st, h2, off2, _) = attach(&r.s, "e", false, b"k");
    assert_eq!(st, Status::Ok);
    let (host2, _) = mapping(&r, off2, size);
    for p in [0u64, 1, 300, 511] {
        assert_eq!(
            load_at(host2, p * PAGE_BYTES, 9),
            format!("good {p:04}").as_bytes()
        );
    }
    assert_eq!(call(&r.s, OP_DETACH, &h2.to_le_bytes()).0, Status::Ok);
}
