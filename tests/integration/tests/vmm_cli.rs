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

/// `pmovmm store` with `--anchor`: a store file copied back over its newer self (the keyless
/// editor's rollback) is refused with one line naming both commit counters; the current file
/// passes; without the anchor the old file opens (the documented limit).
#[test]
fn store_commands_refuse_a_store_older_than_its_anchor() {
    let env = Env::from_env();
    let dir = env
        .repo
        .join(format!("target/itest-anchor-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let p = |name: &str| dir.join(name).display().to_string();
    let (store, anchor, keyf) = (p("store.img"), p("anchor"), p("key"));
    std::fs::write(&keyf, b"a tenant key\n").expect("key file");
    let pmovmm = |args: &[&str]| {
        let run = run_vmm_on_host(&env, args, Duration::from_secs(60)).expect("run pmovmm");
        assert!(!run.timed_out, "pmovmm hung: {args:?}");
        run
    };
    let ok = |args: &[&str]| {
        let run = pmovmm(args);
        assert_eq!(run.exit_code, Some(0), "{args:?}: {}", run.stderr);
        run
    };
    ok(&[
        "store", "create", &store, "--size", "64M", "--slots", "16", "--anchor", &anchor,
    ]);
    let mkpmo = |name: &str| {
        ok(&[
            "store",
            "mkpmo",
            &store,
            name,
            "16K",
            "--key-file",
            &keyf,
            "--kdf",
            "fast",
            "--anchor",
            &anchor,
        ])
    };
    mkpmo("first");
    let old = std::fs::read(&store).expect("copy of the store");
    mkpmo("second");
    ok(&["store", "fsck", &store, "--anchor", &anchor]);
    std::fs::write(&store, &old).expect("roll the store back");
    let refused = pmovmm(&["store", "ls", &store, "--anchor", &anchor]);
    assert_eq!(refused.exit_code, Some(1), "{}", refused.stdout);
    let lines: Vec<&str> = refused.stderr.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "{:?}", refused.stderr);
    assert!(
        lines[0].contains("store is older than its anchor")
            && lines[0].contains("store counter 1, anchor counter 2"),
        "{:?}",
        lines[0]
    );
    let listed = ok(&["store", "ls", &store]);
    assert!(listed.stdout.contains("first") && !listed.stdout.contains("second"));
    std::fs::remove_dir_all(&dir).expect("clean up");
}
