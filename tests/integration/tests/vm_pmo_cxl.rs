//! A PMO store on a CXL expander the VMM keeps for itself (`--cxl-t3 id=store,guest=off`,
//! `--pmo-store cxl=store`, `--pmo-master-key FILE`): the guest uses PMOs as with a store
//! file, sees no CXL device, and a new VMM process on the same media finds what was psynced.
//!
//! One test host boot: VM "cxl-store" formats the blank media as a store, runs create / write /
//! psync / detach / read back and builds a `p_malloc` list; VM "cxl-store-restart", a new VMM
//! process, checks the list. Then the host lists and fscks the store on the media with the
//! `pmovmm store` commands (the same master key), and scans the media for the guest's
//! plaintext marker.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::OnceLock;

use pmo_integration::{run_vms, unique_pattern, Env, VmOutcome, VmSpec};
use pmo_store::crypto::RangeCipher;
use pmovmm::cli::store::{store_fsck, store_ls, CxlAccess, StoreFile};

const SIZE: u64 = 256 << 20;
/// The expander's options: a small device cache, no media latency (the nested test host is
/// slow enough), kept from the guest.
const OPTS: &str = "id=store,guest=off,cache=16M,latency=0";
const MASTER: [u8; 32] = *b"vm-test master key, 32 bytes ok!";

struct Group {
    vms: Vec<VmOutcome>,
    media: PathBuf,
    master: PathBuf,
    marker: String,
}

fn group() -> &'static Group {
    static G: OnceLock<Result<Group, String>> = OnceLock::new();
    let g = G.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-pmo-cxl").map_err(|e| e.to_string())?;
        let media = dir.join("store-cxl.img");
        for f in [media.clone(), dir.join("store-cxl.img.lsa")] {
            let _ = std::fs::remove_file(f);
        }
        let master = dir.join("master.key");
        std::fs::write(&master, MASTER).map_err(|e| e.to_string())?;
        let marker = unique_pattern("CXLPMOSECRET");
        let vm = |name: &str| {
            VmSpec::new(name)
                .param("pattern", &marker)
                .param("devices", "0")
                .cxl_t3(&media, SIZE, None, OPTS)
                .pmo_store_on_cxl("store", &master)
        };
        let vms = run_vms(&[
            vm("cxl-store").scenarios(["cxl_count", "pmo_basic", "pmo_list_build"]),
            vm("cxl-store-restart").scenarios(["pmo_list_check"]),
        ])
        .map_err(|e| e.to_string())?;
        Ok(Group {
            vms,
            media,
            master,
            marker,
        })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

#[test]
fn the_guest_uses_pmos_on_the_expander_and_sees_no_cxl_device() {
    let g = group();
    g.vms[0].assert_all_ok(&["cxl_count", "pmo_basic", "pmo_list_build"]);
    g.vms[0].assert_exit(0);
}

#[test]
fn a_new_vmm_process_finds_what_was_psynced_on_the_media() {
    let g = group();
    g.vms[1].assert_all_ok(&["pmo_list_check"]);
    g.vms[1].assert_exit(0);
}

#[test]
fn the_media_holds_no_plaintext_and_the_store_on_it_is_consistent() {
    let g = group();
    g.vms[0].assert_ok("pmo_basic.write");
    let media = std::fs::read(&g.media).unwrap();
    let m = g.marker.as_bytes();
    assert!(
        !media.windows(m.len()).any(|w| w == m),
        "the media {} holds the guest's plaintext marker",
        g.media.display()
    );
    // What `pmovmm store ls|fsck MEDIA --master-key FILE` run.
    let store = StoreFile {
        path: &g.media,
        anchor: None,
        cxl: Some(CxlAccess {
            master_key: &g.master,
            cipher: RangeCipher::Xts256,
        }),
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let list = store_ls(store, &mut out).unwrap();
    assert!(
        list.iter().any(|p| p.name == "list1"),
        "the list PMO is in the store"
    );
    let report = store_fsck(store, &mut out, &mut err).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}
