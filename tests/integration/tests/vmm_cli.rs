//! pmovmm's command line errors: no VM needed, so these run on this machine directly.

use std::time::Duration;

use pmo_integration::{run_vmm_on_host, Env};

#[test]
fn missing_kernel_file_is_one_clear_line_and_nonzero_exit() {
    let env = Env::from_env();
    let initrd = env.initrd().expect("guest image");
    let missing = env.repo.join("target/itest-no-such-dir/vmlinuz");
    let initrd = initrd.display().to_string();
    let kernel = missing.display().to_string();
    let run = run_vmm_on_host(
        &env,
        &[
            "run",
            "--kernel",
            &kernel,
            "--initrd",
            &initrd,
            "--cmdline",
            "console=ttyS0",
            "--memory",
            "256M",
            "--cpus",
            "1",
            "--console",
            "stdout",
        ],
        Duration::from_secs(30),
    )
    .expect("run pmovmm");
    assert!(!run.timed_out, "pmovmm hung on a missing kernel file");
    assert_eq!(
        run.exit_code,
        Some(1),
        "expected exit code 1 (VMM error); stderr: {}",
        run.stderr
    );
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "expected one line on stderr, got: {:?}",
        run.stderr
    );
    assert!(
        lines[0].contains(&kernel),
        "the error should name the missing file {kernel}: {:?}",
        lines[0]
    );
    assert!(!lines[0].contains("panicked"), "{:?}", lines[0]);
}
