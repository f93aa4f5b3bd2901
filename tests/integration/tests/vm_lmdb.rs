//! LMDB with its data file in a PMO (apps/lmdb: `pmo.patch`, the libpmo backend), in the guest.
//!
//! One test host boot, two VMM processes on one store:
//! 1. VM "lmdb" runs LMDB's own mtest .. mtest6, unmodified, each in a fresh directory, then
//!    checks every environment from a new process: the digest at the mtest's close equals
//!    the one found on reopening, no `data.mdb` file ever appears (only `lock.mdb`), the PMO
//!    has the mtests' map size, mdb_stat reads it, 3 commits cost exactly 3 psyncs (counted
//!    by the device), and a writer killed inside its commit's psync leaves the environment as
//!    before that commit.
//! 2. VM "lmdb-restart", a new VMM process, reopens all six environments and must find each
//!    one exactly as VM "lmdb" left it.
//!
//! Afterwards the store checks clean on the host.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use pmo_integration::{run_vms, Env, VmOutcome, VmSpec};

const STORE_SIZE: u64 = 256 << 20;
const MTESTS: [&str; 6] = ["mtest", "mtest2", "mtest3", "mtest4", "mtest5", "mtest6"];

struct Group {
    vms: Vec<VmOutcome>,
    store: PathBuf,
}

fn group() -> &'static Group {
    static GROUP: OnceLock<Result<Group, String>> = OnceLock::new();
    let g = GROUP.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-lmdb").map_err(|e| e.to_string())?;
        let store = dir.join("store.img");
        let _ = std::fs::remove_file(&store);
        let vms = run_vms(&[
            VmSpec::new("lmdb")
                .cpus(2)
                .scenarios(["lmdb_mtest"])
                .pmo_store(&store, STORE_SIZE)
                .timeout(Duration::from_secs(300)),
            VmSpec::new("lmdb-restart")
                .scenarios(["lmdb_mtest_check"])
                .pmo_store(&store, STORE_SIZE)
                .timeout(Duration::from_secs(180)),
        ])
        .map_err(|e| e.to_string())?;
        Ok(Group { vms, store })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

#[test]
fn lmdb_mtests_pass_on_pmos() {
    let vm = &group().vms[0];
    vm.assert_all_ok(&["lmdb_mtest"]);
    vm.assert_exit(0);
    for m in MTESTS {
        vm.assert_ok(&format!("lmdb_mtest.{m}.run"));
    }
    let s = vm.assert_ok("lmdb_mtest.summary");
    assert!(s.starts_with("PASS"), "{}", vm.report(s));
}

#[test]
fn data_file_lives_only_in_the_pmo() {
    let vm = &group().vms[0];
    for m in MTESTS {
        vm.assert_detail(&format!("lmdb_mtest.{m}.no_file"), "testdb: lock.mdb");
        let d = vm.assert_ok(&format!("lmdb_mtest.{m}.pmo"));
        assert!(
            d.starts_with(&format!("lmdb._tmp_lmdbmt_{m}_testdb_data.mdb "))
                && d.contains("size 10485760"),
            "{}",
            vm.report(d)
        );
    }
}

#[test]
fn environments_read_back_exactly_in_a_new_process() {
    let vm = &group().vms[0];
    for m in MTESTS {
        let d = vm.assert_ok(&format!("lmdb_mtest.{m}.reopen"));
        assert!(
            vm.field(d, "dbs").parse::<u32>().is_ok_and(|n| n >= 1),
            "{d}"
        );
        assert_eq!(vm.field(d, "fnv").len(), 16, "{d}");
        vm.assert_ok(&format!("lmdb_mtest.{m}.stat"));
    }
}

#[test]
fn every_commit_is_exactly_one_psync() {
    let vm = &group().vms[0];
    for m in MTESTS {
        let d = vm.assert_ok(&format!("lmdb_mtest.{m}.commits"));
        assert!(
            d.starts_with("3 commits, 3 syncs, 3 psyncs"),
            "{}",
            vm.report(d)
        );
    }
}

#[test]
fn a_writer_killed_in_its_commit_leaves_the_commit_before() {
    let vm = &group().vms[0];
    for m in MTESTS {
        let d = vm.assert_ok(&format!("lmdb_mtest.{m}.crash"));
        assert!(d.contains("exit 75"), "{}", vm.report(d));
    }
}

#[test]
fn environments_survive_a_vmm_restart() {
    let (first, second) = (&group().vms[0], &group().vms[1]);
    second.assert_all_ok(&["lmdb_mtest_check"]);
    second.assert_exit(0);
    second.assert_ok("lmdb_mtest_check.pmos");
    for m in MTESTS {
        let before = first.assert_ok(&format!("lmdb_mtest.{m}.final"));
        let after = second.assert_ok(&format!("lmdb_mtest_check.{m}.reopen"));
        assert_eq!(after, before, "{m}: digest after the VMM restart");
        assert_eq!(first.field(before, "fnv").len(), 16, "{before}");
    }
}

#[test]
fn store_is_consistent_after_the_runs() {
    let g = group();
    g.vms[1].assert_exit(0);
    common::assert_store_clean(&g.store, "vm_lmdb");
}
