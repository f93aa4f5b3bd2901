//! A VMM killed (SIGKILL) in the middle of a psync: after a restart the PMO holds exactly the old
//! or the new psync's data, never a mix, and the store checks clean.
//!
//! One test host boot, five VMs on one store: "a" fills 8 pages with A and psyncs; "kill-early"
//! starts a psync of B and the VMM kills itself at the 2nd persist of that psync (before the
//! commit record); "old" reads A back; "kill-late" does the same but dies at the 4th persist
//! (after the commit record, while pages are copied home); "new" reads B back. The kill comes
//! from the hidden test flag `--pmo-test-kill-in-psync N`.

mod common;

use std::sync::OnceLock;

use pmo_integration::{run_vms, Env, VmOutcome, VmSpec};

const STORE_SIZE: u64 = 256 << 20;

fn group() -> &'static (Vec<VmOutcome>, std::path::PathBuf) {
    static GROUP: OnceLock<Result<(Vec<VmOutcome>, std::path::PathBuf), String>> = OnceLock::new();
    let g = GROUP.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-pmo-crash").map_err(|e| e.to_string())?;
        let store = dir.join("store.img");
        let _ = std::fs::remove_file(&store);
        let vm = |name: &str, scenario: &str| {
            VmSpec::new(name)
                .scenarios([scenario])
                .pmo_store(&store, STORE_SIZE)
        };
        let outcomes = run_vms(&[
            vm("a", "pmo_psync_write")
                .param("create", "1")
                .param("letter", "A"),
            vm("kill-early", "pmo_psync_write")
                .param("letter", "B")
                .extra_arg("--pmo-test-kill-in-psync")
                .extra_arg("2"),
            vm("old", "pmo_psync_check"),
            vm("kill-late", "pmo_psync_write")
                .param("letter", "B")
                .extra_arg("--pmo-test-kill-in-psync")
                .extra_arg("4"),
            vm("new", "pmo_psync_check"),
        ])
        .map_err(|e| e.to_string())?;
        Ok((outcomes, store))
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

#[test]
fn kill_before_the_commit_point_keeps_the_old_psync() {
    let (vms, _) = group();
    vms[0].assert_all_ok(&["pmo_psync_write"]);
    common::assert_killed_by_the_psync_hook(&vms[1]);
    vms[2].assert_detail("pmo_psync_check.uniform", "A");
}

#[test]
fn kill_after_the_commit_point_gives_the_new_psync() {
    let (vms, _) = group();
    common::assert_killed_by_the_psync_hook(&vms[3]);
    vms[4].assert_detail("pmo_psync_check.uniform", "B");
}

#[test]
fn store_checks_clean_after_the_crashes() {
    let (_, store) = group();
    common::assert_store_clean(store, "vm_pmo_crash");
}
