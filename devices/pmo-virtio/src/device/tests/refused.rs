//! What the guest sees of a PMO the store refused at open (issue 27): a distinct status,
//! ESTALE, for every request that names it; and a store file whose superblock was edited
//! to another length is refused when the device opens it.

use super::*;

fn anchored(dir: &Path) -> PmoConfig {
    PmoConfig {
        store: dir.join("store.img"),
        store_size: Some(64 << 20),
        design: None,
        window_size: 16 << 20,
        fault_threads: 2,
        test_kill_in_psync: None,
        predictor: PredictorSpec::None,
        store_options: StoreOptions {
            anchor: Some(dir.join("anchor")),
            ..fast_store()
        },
        dram_budget: None,
        device_memory_latency_ns: 0,
    }
}

/// Overwrites `len` bytes of the store file at `off` with `byte`.
fn scribble(path: &Path, off: u64, len: usize, byte: u8) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&vec![byte; len], off).unwrap();
}

#[test]
fn a_pmo_refused_at_open_answers_every_request_with_stale() {
    let d = tmp("stale-pmo");
    let cfg = anchored(&d.0);
    let s = PmoDevice::new(&cfg).unwrap();
    assert_eq!(create(&s, "notes", 4 * 4096, b"k1"), Status::Ok);
    assert_eq!(create(&s, "other", 4 * 4096, b"k1"), Status::Ok);
    s.detach_all();
    drop(s);
    // The keyless editor damages slot 0 (both record copies), where "notes" lives.
    let table = 2 * pmo_store::superblock::SB_SIZE;
    scribble(
        &cfg.store,
        table,
        pmo_store::superblock::SLOT_SIZE as usize,
        0x5a,
    );
    let s = PmoDevice::new(&cfg).unwrap();
    assert_eq!(attach(&s, "notes", false, b"k1").0, Status::Stale);
    assert_eq!(attach(&s, "notes", true, b"k1").0, Status::Stale);
    assert_eq!(create(&s, "notes", 4096, b"k1"), Status::Stale);
    let mut p = name_field("notes").to_vec();
    p.extend_from_slice(&key_field(b"k1"));
    assert_eq!(call(&s, OP_DESTROY, &p).0, Status::Stale);
    // The other PMO is untouched.
    let (st, h, _, _) = attach(&s, "other", false, b"k1");
    assert_eq!(st, Status::Ok);
    assert_eq!(call(&s, OP_DETACH, &h.to_le_bytes()).0, Status::Ok);
    s.detach_all();
}

#[test]
fn a_store_file_whose_superblock_says_another_length_is_refused() {
    let d = tmp("sblen");
    let mut cfg = anchored(&d.0);
    cfg.store_options.anchor = None;
    let s = PmoDevice::new(&cfg).unwrap();
    drop(s);
    // Both superblock copies say the store is 4 MiB shorter, checksums recomputed.
    let raw = std::fs::read(&cfg.store).unwrap();
    let mut sb = pmo_store::superblock::Superblock::decode(&raw[..128]).unwrap();
    sb.medium_len -= 4 << 20;
    let enc = sb.encode();
    for copy in 0..2 {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&cfg.store)
            .unwrap();
        f.write_all_at(&enc, copy * pmo_store::superblock::SB_SIZE)
            .unwrap();
    }
    let e = PmoDevice::new(&cfg).err().unwrap();
    assert!(e.to_string().contains("an edited superblock"), "{e}");
}
