//! The guest image under plain QEMU: its modules load, /dev/pmem0 appears, the scenarios
//! work and a write persists across boots. No pmovmm: when this passes and the VM tests fail,
//! look at the VMM, not at guest/.

use pmo_integration::{read_at, run_in_qemu, unique_pattern, Env, VmSpec};

#[test]
fn guest_image_runs_its_scenarios_under_qemu() {
    let env = Env::from_env();
    let release = env.kernel_release().expect("guest image");
    let dir = env.work_dir("guest-image").expect("work dir");
    let pmem = dir.join("pmem.img");
    let pattern = unique_pattern("QEMU");
    let offset = 8192u64;
    let specs = [
        VmSpec::new("write")
            .cpus(2)
            .scenarios(["boot_info", "pmem_write"])
            .param("pattern", &pattern)
            .param("offset", offset.to_string())
            .pmem(&pmem, Some(64 << 20)),
        VmSpec::new("read")
            .scenarios(["pmem_read"])
            .param("pattern", &pattern)
            .param("offset", offset.to_string())
            .pmem(&pmem, Some(64 << 20)),
    ];
    let out = run_in_qemu(&env, &specs).expect("qemu run");
    out[0].assert_exit(0);
    out[0].assert_all_ok(&["boot_info", "pmem_write"]);
    out[0].assert_detail("boot_info.kernel", &release);
    out[0].assert_detail("boot_info.cpus", "2");
    let on_host = read_at(&pmem, offset, pattern.len()).expect("read pmem file");
    assert_eq!(
        String::from_utf8_lossy(&on_host),
        pattern,
        "{}",
        out[0].report("pattern not in the host file")
    );
    out[1].assert_exit(0);
    out[1].assert_all_ok(&["pmem_read"]);
}
