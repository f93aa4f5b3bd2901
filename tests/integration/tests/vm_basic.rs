//! The VMM boots the stock Debian guest: kernel version and CPU count (1 and 2 vCPUs), a
//! pattern written to /dev/pmem0 reaches the host file and is read back by a second boot, and
//! a guest poweroff ends the VMM with exit code 0; the VMM runs sandboxed.
//!
//! One run of three VMs serves all tests here (a nested test host boot costs ~15 s): VM "write"
//! (1 vCPU) reports boot_info and writes the pattern; VM "read" (2 vCPUs) reports boot_info
//! and reads it back from the same host file; VM "panic" crashes its kernel on purpose, which
//! the VMM learns through pvpanic (exit code 2).

use std::path::PathBuf;
use std::sync::OnceLock;

use pmo_integration::{read_at, run_vms, unique_pattern, Env, VmOutcome, VmSpec};

const OFFSET: u64 = 4096;

struct Group {
    outcomes: Vec<VmOutcome>,
    pmem: PathBuf,
    pattern: String,
    release: String,
}

/// Runs the VMs once for all tests of this file; a runner error fails every test with it.
fn group() -> &'static Group {
    static GROUP: OnceLock<Result<Group, String>> = OnceLock::new();
    let g = GROUP.get_or_init(|| {
        let env = Env::from_env();
        let release = env.kernel_release().map_err(|e| e.to_string())?;
        let dir = env.work_dir("vm-basic").map_err(|e| e.to_string())?;
        let pmem = dir.join("pmem.img");
        let pattern = unique_pattern("PMOVMM");
        let specs = [
            VmSpec::new("write")
                .cpus(1)
                .scenarios(["boot_info", "pmem_write"])
                .param("pattern", &pattern)
                .param("offset", OFFSET.to_string())
                .pmem(&pmem, Some(64 << 20)),
            VmSpec::new("read")
                .cpus(2)
                .scenarios(["boot_info", "pmem_read"])
                .param("pattern", &pattern)
                .param("offset", OFFSET.to_string())
                .pmem(&pmem, Some(64 << 20)),
            VmSpec::new("panic").scenarios(["kernel_panic"]),
        ];
        let outcomes = run_vms(&specs).map_err(|e| e.to_string())?;
        Ok(Group {
            outcomes,
            pmem,
            pattern,
            release,
        })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

#[test]
fn boots_with_1_vcpu_and_reports_kernel_and_cpus() {
    let g = group();
    let vm = &g.outcomes[0];
    vm.assert_all_ok(&["boot_info"]);
    vm.assert_detail("boot_info.kernel", &g.release);
    vm.assert_detail("boot_info.cpus", "1");
}

#[test]
fn boots_with_2_vcpus_and_reports_kernel_and_cpus() {
    let g = group();
    let vm = &g.outcomes[1];
    vm.assert_ok("boot_info.kernel");
    vm.assert_detail("boot_info.kernel", &g.release);
    vm.assert_detail("boot_info.cpus", "2");
    vm.assert_detail("boot_info.cpus_online", "0-1");
}

#[test]
fn guest_poweroff_ends_the_vmm_with_0() {
    let g = group();
    g.outcomes[0].assert_exit(0);
    g.outcomes[1].assert_exit(0);
}

#[test]
fn pmem_write_reaches_the_host_file() {
    let g = group();
    let vm = &g.outcomes[0];
    vm.assert_all_ok(&["pmem_write"]);
    vm.assert_ok("pmem_write.write");
    let bytes = read_at(&g.pmem, OFFSET, g.pattern.len()).expect("read the host pmem file");
    if bytes != g.pattern.as_bytes() {
        panic!(
            "{}",
            vm.report(&format!(
                "host file {} at {OFFSET}: expected {:?}, found {:?}",
                g.pmem.display(),
                g.pattern,
                String::from_utf8_lossy(&bytes)
            ))
        );
    }
}

#[test]
fn second_boot_reads_the_pattern_back() {
    let g = group();
    let vm = &g.outcomes[1];
    vm.assert_all_ok(&["pmem_read"]);
    vm.assert_ok("pmem_read.match");
}

#[test]
fn guest_panic_ends_the_vmm_with_2() {
    let g = group();
    let vm = &g.outcomes[2];
    vm.assert_ok("kernel_panic.trigger");
    vm.assert_exit(2);
}

/// The VMM runs sandboxed by default (no spec here turns it off): a kernel without Landlock
/// would say so on the VMM's stderr (`--landlock on` warns and runs), and a forbidden system
/// call would kill the VMM with a line naming it. Neither happens in the test host's kernel.
#[test]
fn the_vmm_runs_sandboxed_and_the_test_hosts_kernel_has_landlock() {
    let g = group();
    for vm in &g.outcomes {
        if vm.vmm_stderr.contains("sandbox:") {
            panic!("{}", vm.report("the VMM's sandbox complained"));
        }
    }
}
