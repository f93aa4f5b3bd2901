//! A DRAM budget a quarter of the PMO (`--pmo-dram 1M` for a 4 MiB PMO, store on a
//! `guest=off` expander): a guest program writes, psyncs and reads the whole PMO back round
//! after round, so pages move between local DRAM and the CXL tier all the time.
//!
//! One test host boot, four VMM processes on the same media: "tier-run" runs three rounds
//! and reports the tier counters of its attachment; "tier-check" (a new VMM) finds every
//! page of round 3; "tier-kill" runs many rounds and is SIGKILLed as soon as round 2 was
//! psynced; "tier-after-kill" finds every page of one and the same round, 2 or later (a
//! psync is atomic, and nothing psynced is lost). Then the host scans the media for a
//! page's plaintext, and fscks the store with `pmovmm store fsck`.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use pmo_crypto::RangeCipher;
use pmo_integration::{run_vms, Env, VmOutcome, VmSpec};
use pmovmm::cli::store::{store_fsck, CxlAccess, StoreFile};

const SIZE: u64 = 256 << 20;
const OPTS: &str = "id=store,guest=off,cache=16M,latency=0";
const MASTER: [u8; 32] = *b"tiering test master key, 32 byte";
/// The PMO: 1024 pages; the budget: 256 of them.
const PAGES: u64 = 1024;
const BUDGET: &str = "1M";
const BUDGET_PAGES: u64 = 256;

struct Group {
    vms: Vec<VmOutcome>,
    media: PathBuf,
    master: PathBuf,
}

fn group() -> &'static Group {
    static G: OnceLock<Result<Group, String>> = OnceLock::new();
    let g = G.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-pmo-tier").map_err(|e| e.to_string())?;
        let media = dir.join("store-tier.img");
        for f in [media.clone(), dir.join("store-tier.img.lsa")] {
            let _ = std::fs::remove_file(f);
        }
        let master = dir.join("master.key");
        std::fs::write(&master, MASTER).map_err(|e| e.to_string())?;
        let vm = |name: &str| {
            VmSpec::new(name)
                .param("devices", "0")
                .param("pages", PAGES.to_string())
                .cxl_t3(&media, SIZE, None, OPTS)
                .pmo_store_on_cxl("store", &master)
                .extra_arg("--pmo-dram")
                .extra_arg(BUDGET)
        };
        let vms = run_vms(&[
            vm("tier-run")
                .param("rounds", "3")
                .scenarios(["pmo_tier_run"]),
            vm("tier-check").scenarios(["pmo_tier_check"]),
            vm("tier-kill")
                .param("rounds", "1000")
                .scenarios(["pmo_tier_run"])
                .kill_on("pmo_tier_run.psynced")
                .timeout(Duration::from_secs(600)),
            vm("tier-after-kill").scenarios(["pmo_tier_check"]),
        ])
        .map_err(|e| e.to_string())?;
        Ok(Group { vms, media, master })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

#[test]
fn pages_move_between_tiers_and_read_back_exactly() {
    let g = group();
    let run = &g.vms[0];
    run.assert_all_ok(&["pmo_tier_run"]);
    let done = run.assert_ok("pmo_tier_run.done");
    assert_eq!(run.num(done, "rounds"), 3);
    assert_eq!(run.num(done, "vm_budget_pages"), BUDGET_PAGES);
    // Two fault threads may each have one page in flight above the budget.
    assert!(run.num(done, "vm_dram_pages") <= BUDGET_PAGES + 2, "{done}");
    assert!(run.num(done, "dram_pages") <= BUDGET_PAGES + 2, "{done}");
    // Every round writes 1024 pages through a window of 256: most are demoted, and reading
    // them back promotes them.
    assert!(
        run.num(done, "demotions") >= 2 * (PAGES - BUDGET_PAGES),
        "{done}"
    );
    assert!(
        run.num(done, "promotions") >= 2 * (PAGES - BUDGET_PAGES),
        "{done}"
    );
    assert!(run.num(done, "vm_bytes_moved") > 0, "{done}");
    // A psync right after the last read-back writes nothing: the reads arrived as write
    // faults (KVM's async page fault worker), but no page changed (docs/pmo-device.md).
    assert_eq!(run.num(done, "reread_psync_pages"), 0, "{done}");
    run.assert_exit(0);
    let check = &g.vms[1];
    check.assert_all_ok(&["pmo_tier_check"]);
    assert_eq!(
        check.num(check.assert_ok("pmo_tier_check.uniform"), "round"),
        3
    );
}

#[test]
fn a_vmm_killed_mid_run_keeps_the_last_psync() {
    let g = group();
    let killed = &g.vms[2];
    killed.assert_ok("pmo_tier_run.psynced");
    let after = &g.vms[3];
    after.assert_all_ok(&["pmo_tier_check"]);
    let round = after.num(after.assert_ok("pmo_tier_check.uniform"), "round");
    assert!(round >= 2, "round {round}: a psync that returned was lost");
}

#[test]
fn the_media_holds_no_page_plaintext_and_the_store_is_consistent() {
    let g = group();
    g.vms[1].assert_ok("pmo_tier_check.uniform");
    // Words 2 and 3 of every page of rounds 1 to 8 as the guest program fills them: no
    // 8-byte-aligned 16 bytes of the media may be one of them.
    let words: std::collections::HashSet<[u8; 16]> = (1..=8u64)
        .flat_map(|r| (0..PAGES).map(move |p| (r, p)))
        .map(|(r, p)| {
            let mut w = [0u8; 16];
            w[..8].copy_from_slice(&mix(r << 40 ^ p << 12 ^ 2).to_le_bytes());
            w[8..].copy_from_slice(&mix(r << 40 ^ p << 12 ^ 3).to_le_bytes());
            w
        })
        .collect();
    let media = std::fs::read(&g.media).unwrap();
    let found = media
        .chunks_exact(8)
        .zip(media.chunks_exact(8).skip(1))
        .position(|(a, b)| {
            let mut w = [0u8; 16];
            w[..8].copy_from_slice(a);
            w[8..].copy_from_slice(b);
            words.contains(&w)
        });
    assert_eq!(
        found, None,
        "the media holds a page's plaintext (at 8-byte word {found:?})"
    );
    let store = StoreFile {
        path: &g.media,
        anchor: None,
        cxl: Some(CxlAccess {
            master_key: &g.master,
            cipher: RangeCipher::Xts256,
        }),
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let report = store_fsck(store, &mut out, &mut err).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

/// `mix` of guest/tools/pmo_tier.c.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
