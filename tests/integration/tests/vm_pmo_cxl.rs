//! A PMO store on a CXL expander the VMM keeps for itself (`--cxl-t3 id=store,guest=off`,
//! `--pmo-store cxl=store`, `--pmo-master-key FILE`): the guest uses PMOs as with a store
//! file, sees no CXL device, and a new VMM process on the same media finds what was psynced.
//!
//! One test host boot: VM "cxl-store" formats the blank media as a store, runs create / write /
//! psync / detach / read back and builds a `p_malloc` list; VM "cxl-store-restart", a new VMM
//! process, checks the list. Then the host lists and fscks the store on the media with the
//! `pmovmm store` commands (the same master key), and scans the media for the guest's
//! plaintext marker.
//!
//! In the same boot, LPMO's CXL designs (`--pmo-design c|cl|cf`), each on its own media: VM
//! "cxl-DESIGN" runs the same scenarios under the design (its PMOs get the `tee-blake3` suite:
//! the range key is their only cipher), VM "cxl-DESIGN-restart", a new VMM process, reads the
//! list back; then the same media scan, `ls` and `fsck` on the host. Design `c` runs with a
//! working area (`direct=64M`): its working copies live on the expander and are mapped into
//! the guest; afterwards that area of the media holds nothing but zero blocks, and it holds
//! some (the working copies were written there and wiped at detach). Then, on the same media,
//! a design `c` crash: VM "cxl-c-a" psyncs 8 pages of A, VM "cxl-c-kill" writes B into its
//! working copy and is killed in the middle of that psync (before the commit point), and VM
//! "cxl-c-old" (a new VMM process, attaching over what the dead one left in the working
//! area) reads A back.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::OnceLock;

mod common;

use pmo_crypto::{RangeCipher, Suite};
use pmo_integration::{run_vms, unique_pattern, Env, VmOutcome, VmSpec};
use pmo_store::{Design, PmoInfo};
use pmovmm::cli::store::{store_fsck, store_ls, CxlAccess, StoreFile};

const SIZE: u64 = 256 << 20;
/// The expander's options: a small device cache, no media latency (the nested test host is
/// slow enough), kept from the guest.
const OPTS: &str = "id=store,guest=off,cache=16M,latency=0";
const MASTER: [u8; 32] = *b"vm-test master key, 32 bytes ok!";

/// LPMO's CXL designs, each run on its own media after the default design's pair of VMs.
const DESIGNS: [&str; 3] = ["c", "cl", "cf"];
/// Design `c`'s working area at the end of its expander (`--pmo-store cxl=store,direct=`).
const DIRECT: u64 = 64 << 20;

struct Group {
    vms: Vec<VmOutcome>,
    media: PathBuf,
    /// Media of each of [`DESIGNS`], in order.
    design_media: Vec<PathBuf>,
    master: PathBuf,
    marker: String,
}

fn group() -> &'static Group {
    static G: OnceLock<Result<Group, String>> = OnceLock::new();
    let g = G.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-pmo-cxl").map_err(|e| e.to_string())?;
        let media = dir.join("store-cxl.img");
        let design_media: Vec<PathBuf> = DESIGNS
            .iter()
            .map(|d| dir.join(format!("store-cxl-{d}.img")))
            .collect();
        for m in std::iter::once(&media).chain(&design_media) {
            let _ = std::fs::remove_file(m);
            let _ = std::fs::remove_file(m.with_extension("img.lsa"));
        }
        let master = dir.join("master.key");
        std::fs::write(&master, MASTER).map_err(|e| e.to_string())?;
        let marker = unique_pattern("CXLPMOSECRET");
        let vm_with = |name: &str, media: &PathBuf, store: &str| {
            VmSpec::new(name)
                .param("pattern", &marker)
                .param("devices", "0")
                .cxl_t3(media, SIZE, None, OPTS)
                .pmo_store_on_cxl(store, &master)
        };
        let vm = |name: &str, media: &PathBuf| vm_with(name, media, "store");
        let mut specs = vec![
            vm("cxl-store", &media).scenarios(["cxl_count", "pmo_basic", "pmo_list_build"]),
            vm("cxl-store-restart", &media).scenarios(["pmo_list_check"]),
        ];
        for (d, m) in DESIGNS.iter().zip(&design_media) {
            let store = match *d {
                "c" => format!("store,direct={}M", DIRECT >> 20),
                _ => "store".to_string(),
            };
            let with_design = |name: String| {
                vm_with(&name, m, &store)
                    .param("direct", if *d == "c" { "1" } else { "0" })
                    .extra_arg("--pmo-design")
                    .extra_arg(*d)
            };
            specs.push(with_design(format!("cxl-{d}")).scenarios(["pmo_basic", "pmo_list_build"]));
            specs.push(with_design(format!("cxl-{d}-restart")).scenarios(["pmo_list_check"]));
        }
        let c = |name: &str| {
            vm_with(
                name,
                &design_media[0],
                &format!("store,direct={}M", DIRECT >> 20),
            )
            .extra_arg("--pmo-design")
            .extra_arg("c")
        };
        specs.push(
            c("cxl-c-a")
                .scenarios(["pmo_psync_write"])
                .param("create", "1")
                .param("letter", "A"),
        );
        specs.push(
            c("cxl-c-kill")
                .scenarios(["pmo_psync_write"])
                .param("letter", "B")
                .extra_arg("--pmo-test-kill-in-psync")
                .extra_arg("2"),
        );
        specs.push(c("cxl-c-old").scenarios(["pmo_psync_check"]));
        let vms = run_vms(&specs).map_err(|e| e.to_string())?;
        Ok(Group {
            vms,
            media,
            design_media,
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

/// Scans `media` for the guest's marker, then lists and fscks the store on it as
/// `pmovmm store ls|fsck MEDIA --master-key FILE` do; returns the list PMO's entry.
fn check_media(g: &Group, media: &PathBuf) -> PmoInfo {
    let bytes = std::fs::read(media).unwrap();
    let m = g.marker.as_bytes();
    assert!(
        !bytes.windows(m.len()).any(|w| w == m),
        "the media {} holds the guest's plaintext marker",
        media.display()
    );
    let store = StoreFile {
        path: media,
        anchor: None,
        cxl: Some(CxlAccess {
            master_key: &g.master,
            cipher: RangeCipher::Xts256,
        }),
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let list = store_ls(store, &mut out).unwrap();
    let report = store_fsck(store, &mut out, &mut err).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    list.into_iter()
        .find(|p| p.name == "list1")
        .expect("the list PMO is in the store")
}

#[test]
fn the_media_holds_no_plaintext_and_the_store_on_it_is_consistent() {
    let g = group();
    g.vms[0].assert_ok("pmo_basic.write");
    let list = check_media(g, &g.media);
    assert_eq!((list.design, list.suite), (Design::D, Suite::AesGcm));
}

/// Designs c and cl: the guest's PMOs round-trip through a new VMM process, their only
/// cipher is the expander's range key (suite `tee-blake3`), and still no byte of the guest's
/// marker reaches the media; each store passes fsck.
#[test]
fn lpmo_cxl_designs_round_trip_with_the_range_key_as_their_only_cipher() {
    let g = group();
    for (i, (d, media)) in DESIGNS.iter().zip(&g.design_media).enumerate() {
        let (run, restart) = (&g.vms[2 + 2 * i], &g.vms[3 + 2 * i]);
        run.assert_all_ok(&["pmo_basic", "pmo_list_build"]);
        run.assert_exit(0);
        restart.assert_all_ok(&["pmo_list_check"]);
        restart.assert_exit(0);
        let list = check_media(g, media);
        let design = Design::from_name(d).unwrap();
        assert_eq!((list.design, list.suite), (design, Suite::TeeBlake3), "{d}");
    }
}

/// Design `c` with a working area, killed in the middle of a psync: a new VMM process attaches
/// over what the dead one left in the working area and reads the last completed psync.
#[test]
fn a_design_c_vmm_killed_in_psync_keeps_the_last_psync() {
    let g = group();
    let base = 2 + 2 * DESIGNS.len();
    g.vms[base].assert_all_ok(&["pmo_psync_write"]);
    common::assert_killed_by_the_psync_hook(&g.vms[base + 1]);
    g.vms[base + 2].assert_detail("pmo_psync_check.uniform", "A");
}

/// Design `c` with a working area: the guest's working copies were written to the expander
/// (the area's media blocks are allocated) and wiped at detach (they are all zero), and the
/// store kept out of the area.
#[test]
fn design_c_working_copies_live_on_the_expander_and_are_wiped() {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::io::AsRawFd;
    let g = group();
    g.vms[2].assert_all_ok(&["pmo_basic", "pmo_list_build"]);
    let media = &g.design_media[0];
    let area = cxl_t3::media::HEADER_LEN + SIZE - DIRECT;
    let mut f = std::fs::File::open(media).unwrap();
    // SAFETY: lseek on a descriptor this test owns; no memory is touched.
    let data = unsafe { libc::lseek(f.as_raw_fd(), area as libc::off_t, libc::SEEK_DATA) };
    assert!(
        data >= 0 && (data as u64) < area + DIRECT,
        "no block of the working area was ever written: the working copies were not on the expander"
    );
    f.seek(SeekFrom::Start(area)).unwrap();
    let mut bytes = Vec::new();
    f.take(DIRECT).read_to_end(&mut bytes).unwrap();
    assert_eq!(bytes.len() as u64, DIRECT);
    assert!(
        bytes.iter().all(|&b| b == 0),
        "the working area holds data after every PMO was detached"
    );
}
