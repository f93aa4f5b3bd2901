//! The C and Rust sides of the virtio-pmo protocol agree: `c_layout.c` is compiled against
//! `guest/include/uapi/virtio_pmo.h` (the header the guest driver and libpmo use) and prints
//! every constant, and every wire structure filled field by field with distinct values; this
//! test decodes those bytes with `proto` and compares. A field moved, resized or renumbered
//! on either side fails here.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use pmo_store::Perm;
use pmo_virtio::proto::{self, Request, Status};

/// Compiles and runs the C program; returns its constants and structures.
fn c_side() -> (HashMap<String, i64>, HashMap<String, Vec<u8>>) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let uapi = here.join("../../guest/include/uapi");
    // One executable per call: the tests run in parallel.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let exe = std::env::temp_dir().join(format!("pmo-c-layout-{}-{call}", std::process::id()));
    let out = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&uapi)
        .arg(here.join("tests/c_layout.c"))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc) is needed: scripts/setup.sh installs gcc");
    assert!(
        out.status.success(),
        "c_layout.c does not compile against virtio_pmo.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    assert!(run.status.success());
    let (mut consts, mut structs) = (HashMap::new(), HashMap::new());
    for line in String::from_utf8(run.stdout).unwrap().lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["const", name, v] => {
                consts.insert(name.to_string(), v.parse().unwrap());
            }
            ["struct", name, len, hex] => {
                let bytes: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect();
                assert_eq!(bytes.len(), len.parse::<usize>().unwrap());
                structs.insert(name.to_string(), bytes);
            }
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (consts, structs)
}

#[test]
fn every_constant_agrees() {
    let (c, _) = c_side();
    let n = |name: &str| *c.get(name).unwrap_or_else(|| panic!("{name} not printed"));
    assert_eq!(n("VIRTIO_ID_PMO"), i64::from(proto::VIRTIO_ID_PMO));
    assert_eq!(n("VIRTIO_PMO_VERSION"), i64::from(proto::VERSION));
    assert_eq!(n("VIRTIO_PMO_NAME_FIELD"), proto::NAME_FIELD as i64);
    assert_eq!(n("VIRTIO_PMO_NAME_MAX"), proto::MAX_NAME_LEN as i64);
    assert_eq!(
        n("VIRTIO_PMO_NAME_MAX"),
        pmo_store::record::MAX_NAME as i64,
        "the store's name limit is the protocol's"
    );
    assert_eq!(n("VIRTIO_PMO_KEY_FIELD"), proto::KEY_FIELD as i64);
    assert_eq!(n("VIRTIO_PMO_DESIGN_FIELD"), proto::DESIGN_FIELD as i64);
    assert_eq!(n("VIRTIO_PMO_HIST_BUCKETS"), proto::HIST_BUCKETS as i64);
    for (name, op) in [
        ("CREATE", proto::OP_CREATE),
        ("DESTROY", proto::OP_DESTROY),
        ("ATTACH", proto::OP_ATTACH),
        ("DETACH", proto::OP_DETACH),
        ("PSYNC", proto::OP_PSYNC),
        ("STAT", proto::OP_STAT),
        ("SET_DESIGN", proto::OP_SET_DESIGN),
        ("LIST", proto::OP_LIST),
    ] {
        assert_eq!(n(&format!("VIRTIO_PMO_OP_{name}")), i64::from(op), "{name}");
    }
    let c_statuses: Vec<&String> = c
        .keys()
        .filter(|k| k.starts_with("VIRTIO_PMO_S_"))
        .collect();
    assert_eq!(c_statuses.len(), Status::ALL.len(), "{c_statuses:?}");
    for s in Status::ALL {
        let name = match s {
            Status::Ok => "OK",
            Status::Perm => "PERM",
            Status::NoEnt => "NOENT",
            Status::Io => "IO",
            Status::NoMem => "NOMEM",
            Status::Access => "ACCES",
            Status::Busy => "BUSY",
            Status::Exist => "EXIST",
            Status::Inval => "INVAL",
            Status::NoSpc => "NOSPC",
            Status::NameTooLong => "NAMETOOLONG",
            Status::NoSys => "NOSYS",
            Status::Proto => "PROTO",
            Status::BadMsg => "BADMSG",
            Status::Stale => "STALE",
        };
        assert_eq!(n(&format!("VIRTIO_PMO_S_{name}")), s as i64, "{s:?}");
    }
    assert_eq!(
        n("VIRTIO_PMO_LIST_DETACHED"),
        i64::from(proto::LIST_DETACHED)
    );
    assert_eq!(n("VIRTIO_PMO_LIST_READERS"), i64::from(proto::LIST_READERS));
    assert_eq!(n("VIRTIO_PMO_LIST_WRITER"), i64::from(proto::LIST_WRITER));
    assert_eq!(
        n("VIRTIO_PMO_EVENT_PAGE_POISONED"),
        i64::from(proto::EVENT_PAGE_POISONED)
    );
    assert_eq!(
        n("VIRTIO_PMO_EVENT_PAGE_BAD"),
        i64::from(proto::EVENT_PAGE_BAD)
    );
    // The permissions on the wire are what parse() maps to Read and Write.
    assert_eq!(n("VIRTIO_PMO_PERM_READ"), 1);
    assert_eq!(n("VIRTIO_PMO_PERM_WRITE"), 2);
}

#[test]
fn requests_built_by_c_parse_to_their_fields() {
    let (_, s) = c_side();
    assert_eq!(s["create"].len(), proto::MAX_REQUEST_LEN);
    match proto::parse(&s["create"]).unwrap() {
        Request::Create { name, size, key } => {
            assert_eq!(name, "layout-create");
            assert_eq!(size, 0x2122_2324_2526_2728);
            assert_eq!(&key[..], b"k3y-create");
        }
        r => panic!("{r:?}"),
    }
    match proto::parse(&s["destroy"]).unwrap() {
        Request::Destroy { name, key } => {
            assert_eq!(name, "layout-destroy");
            assert_eq!(&key[..], b"k3y-destroy");
        }
        r => panic!("{r:?}"),
    }
    match proto::parse(&s["attach"]).unwrap() {
        Request::Attach { name, perm, key } => {
            assert_eq!(name, "layout-attach");
            assert_eq!(perm, Perm::Write);
            assert_eq!(&key[..], b"k3y-attach");
        }
        r => panic!("{r:?}"),
    }
    assert!(matches!(
        proto::parse(&s["psync"]).unwrap(),
        Request::Psync {
            handle: 0x3132_3334_3536_3738
        }
    ));
    assert!(matches!(
        proto::parse(&s["set_design"]).unwrap(),
        Request::SetDesign { design } if design == pmo_store::Design::SpId
    ));
    assert!(matches!(
        proto::parse(&s["list"]).unwrap(),
        Request::List { index: 0x4142_4344 }
    ));
}

#[test]
fn responses_decode_to_what_c_wrote() {
    let (_, s) = c_side();
    assert_eq!(
        proto::DeviceConfig::decode(&s["virtio_pmo_config"]),
        Some(proto::DeviceConfig {
            version: 1,
            page_size: 4096,
            window_size: 0x0102_0304_0506_0708,
            max_name_len: 63,
            max_key_len: 64,
            max_pmo_size: 0x1112_1314_1516_1718,
        })
    );
    assert_eq!(
        &proto::response(Status::BadMsg, &[0; 0x2a])[..proto::HEADER_LEN],
        &s["virtio_pmo_resp_hdr"][..]
    );
    assert_eq!(
        proto::AttachResponse::decode(&s["virtio_pmo_attach_resp"]),
        Some(proto::AttachResponse {
            handle: 0x5152_5354_5556_5758,
            window_offset: 0x6162_6364_6566_6768,
            size: 0x7172_7374_7576_7778,
        })
    );
    assert_eq!(
        proto::PsyncResponse::decode(&s["virtio_pmo_psync_resp"]),
        Some(proto::PsyncResponse {
            pages_written: 0x8182_8384_8586_8788
        })
    );
    let base = 0x9100_0000_0000_0000u64;
    let st = proto::StatResponse::decode(&s["virtio_pmo_stat"]).unwrap();
    assert_eq!(
        [
            st.size,
            st.faults,
            st.fault_ns_total,
            st.pages_decrypted,
            st.pages_prefetched,
            st.psyncs,
            st.psync_pages,
            st.psync_ns_total,
            st.integrity_failures,
        ],
        std::array::from_fn(|i| base + i as u64)
    );
    assert_eq!(st.fault_hist, std::array::from_fn(|i| base + 9 + i as u64));
    assert_eq!(
        [
            st.triggers,
            st.trigger_hits,
            st.trigger_wasted,
            st.prefetch_late,
            st.demand_unpredicted,
        ],
        std::array::from_fn(|i| base + 25 + i as u64)
    );
    let t = st.tier;
    assert_eq!(
        [
            t.dram_pages,
            t.cxl_dirty_pages,
            t.promotions,
            t.demotions,
            t.prefetch_to_cxl,
            t.vm_budget_pages,
            t.vm_dram_pages,
            t.vm_cxl_dirty_pages,
            t.vm_bytes_moved,
        ],
        std::array::from_fn(|i| base + 30 + i as u64)
    );
    assert_eq!(
        proto::ListEntry::decode(&s["virtio_pmo_list_resp"]),
        Some(proto::ListEntry {
            name: "layout-list".into(),
            size: 0xa1a2_a3a4_a5a6_a7a8,
            attached: proto::LIST_READERS,
            more: 1,
        })
    );
    assert_eq!(
        proto::Event::decode(&s["virtio_pmo_event"]),
        Some(proto::Event {
            kind: proto::EVENT_PAGE_BAD,
            handle: 0xb1b2_b3b4_b5b6_b7b8,
            page: 0xc1c2_c3c4_c5c6_c7c8,
        })
    );
    // And the other way: what the device writes is byte for byte what C would.
    assert_eq!(
        proto::Event::decode(&s["virtio_pmo_event"])
            .unwrap()
            .encode()[..],
        s["virtio_pmo_event"][..]
    );
}
