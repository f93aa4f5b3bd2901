//! The nested test host itself: it boots and kvm-amd gives it a real /dev/kvm. Needs no
//! pmovmm, so it tells a broken test host apart from a broken VMM. It runs on every machine
//! (QEMU-TCG works everywhere), so the fallback path stays proven on hardware-KVM hosts too.

use pmo_integration::{testhost, Env};

#[test]
fn nested_test_host_boots_with_real_kvm() {
    let info = testhost::probe(&Env::from_env()).expect("nested test host");
    eprintln!(
        "test host ready after {:.1} s, whole run {:.1} s: {}",
        info.ready_after.as_secs_f64(),
        info.elapsed.as_secs_f64(),
        info.ready_line
    );
    assert!(
        info.kvm,
        "no /dev/kvm in the test host: {} (logs in {})",
        info.ready_line,
        info.log_dir.display()
    );
    assert!(info.ready_line.contains("npt=Y"), "{}", info.ready_line);
}
