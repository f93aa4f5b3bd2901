//! The CXL Type 3 memory expander (`pmovmm run --cxl-t3`) end to end, driven by the guest's
//! own CXL drivers and Debian's `cxl`/`ndctl` tools.
//!
//! Four test host boots: one for group 1, two for group 2 (the media file is checked between
//! them), one for group 3:
//! 1. "cxl" (a new media file) lists the memdev (stage 1) and the ports, endpoint and
//!    decoders (stage 2), creates a pmem region and a devdax namespace and writes a pattern
//!    (stage 3); "cxl-restart", a new VMM process on the same media and LSA, creates the
//!    region again, finds the namespace from its labels and reads the pattern back; "crash"
//!    reads a clean health record and is then killed (SIGKILL, no shutdown flush), and
//!    "after-crash" reads a Dirty Shutdown Count of 1 and still the pattern the clean runs
//!    left on the media; "term" writes a second pattern and its VMM gets SIGTERM, and
//!    "after-term" reads that pattern (the SIGTERM shutdown flushed the device cache) and
//!    no new dirty shutdown.
//! 2. "keyed" writes a marker into a device whose whole range is keyed (`key=FILE`); the
//!    media file must not hold it. Then "keyless" (same media, no key) must not read it, and
//!    "rekeyed" (the key again) must.
//! 3. "two": two `--cxl-t3` devices are two memdevs, each with its own host bridge, root
//!    decoder and endpoint; the second has the serial given with `serial=`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pmo_integration::{run_vms, unique_pattern, Env, VmOutcome, VmSpec};

const SIZE: u64 = 256 << 20;
/// Small cache and no media latency: the tests check function, not timing.
const OPTS: &str = "cache=16M,latency=0";

struct Plain {
    vms: Vec<VmOutcome>,
    media: PathBuf,
    pattern: String,
    pattern2: String,
}

struct Keyed {
    first: Vec<VmOutcome>,
    later: Vec<VmOutcome>,
    media_after_keyed_boot: Vec<u8>,
    marker: String,
}

fn fresh(dir: &Path, name: &str) -> PathBuf {
    let media = dir.join(name);
    let _ = std::fs::remove_file(&media);
    let mut lsa = media.clone().into_os_string();
    lsa.push(".lsa");
    let _ = std::fs::remove_file(PathBuf::from(lsa));
    media
}

fn plain() -> &'static Plain {
    static G: OnceLock<Result<Plain, String>> = OnceLock::new();
    let g = G.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-cxl").map_err(|e| e.to_string())?;
        let media = fresh(&dir, "cxl.img");
        let pattern = unique_pattern("CXLDATA");
        let pattern2 = unique_pattern("CXLTERM");
        let vms = run_vms(&[
            VmSpec::new("cxl")
                .scenarios(["cxl_list", "cxl_region_write"])
                .param("pattern", &pattern)
                .cxl_t3(&media, SIZE, None, OPTS),
            VmSpec::new("cxl-restart")
                .scenarios(["cxl_region_read"])
                .param("pattern", &pattern)
                .cxl_t3(&media, SIZE, None, OPTS),
            VmSpec::new("crash")
                .scenarios(["cxl_health", "cxl_hold"])
                .kill_on("cxl_hold.holding")
                .cxl_t3(&media, SIZE, None, OPTS),
            VmSpec::new("after-crash")
                .scenarios(["cxl_health", "cxl_region_read"])
                .param("pattern", &pattern)
                .cxl_t3(&media, SIZE, None, OPTS),
            VmSpec::new("term")
                .scenarios(["cxl_write_hold"])
                .param("pattern", &pattern2)
                .param("offset", "8192")
                .term_on("cxl_write_hold.holding")
                .cxl_t3(&media, SIZE, None, OPTS),
            VmSpec::new("after-term")
                .scenarios(["cxl_health", "cxl_region_read"])
                .param("pattern", &pattern2)
                .param("offset", "8192")
                .cxl_t3(&media, SIZE, None, OPTS),
        ])
        .map_err(|e| e.to_string())?;
        Ok(Plain {
            vms,
            media,
            pattern,
            pattern2,
        })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

fn keyed() -> &'static Keyed {
    static G: OnceLock<Result<Keyed, String>> = OnceLock::new();
    let g = G.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-cxl-keyed").map_err(|e| e.to_string())?;
        let media = fresh(&dir, "cxl-keyed.img");
        let key = dir.join("cxl.key");
        let bytes: Vec<u8> = (0..32u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(11))
            .collect();
        std::fs::write(&key, bytes).map_err(|e| e.to_string())?;
        let marker = unique_pattern("CXLSECRET");
        let first = run_vms(&[VmSpec::new("keyed")
            .scenarios(["cxl_region_write"])
            .param("pattern", &marker)
            .cxl_t3(&media, SIZE, Some(key.clone()), OPTS)])
        .map_err(|e| e.to_string())?;
        let media_after_keyed_boot = std::fs::read(&media).map_err(|e| e.to_string())?;
        let later = run_vms(&[
            VmSpec::new("keyless")
                .scenarios(["cxl_region_read"])
                .param("pattern", &marker)
                .param("expect", "absent")
                .cxl_t3(&media, SIZE, None, OPTS),
            VmSpec::new("rekeyed")
                .scenarios(["cxl_region_read"])
                .param("pattern", &marker)
                .cxl_t3(&media, SIZE, Some(key), OPTS),
        ])
        .map_err(|e| e.to_string())?;
        Ok(Keyed {
            first,
            later,
            media_after_keyed_boot,
            marker,
        })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

/// The JSON field `"name":value` of a `cxl list` detail (spaces removed by the scenario).
fn field<'a>(detail: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":");
    let rest = &detail[detail.find(&key)? + key.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

#[test]
fn stage1_memdev_shows_serial_and_pmem_size() {
    let vm = &plain().vms[0];
    let m = vm.assert_ok("cxl_list.memdev");
    assert_eq!(
        field(m, "pmem_size"),
        Some(SIZE.to_string().as_str()),
        "{m}"
    );
    let serial = field(m, "serial").unwrap_or_else(|| panic!("no serial in {m}"));
    assert!(
        serial != "0" && serial.parse::<u64>().is_ok(),
        "serial {serial} in {m}"
    );
}

#[test]
fn stage2_ports_decoders_and_root_decoder() {
    let vm = &plain().vms[0];
    vm.assert_ok("cxl_list.ports");
    vm.assert_ok("cxl_list.endpoint");
    let r = vm.assert_ok("cxl_list.root_decoder");
    assert_eq!(field(r, "size"), Some(SIZE.to_string().as_str()), "{r}");
    let e = vm.assert_ok("cxl_list.endpoint_decoder");
    assert!(e.contains("\"decoder\":\"decoder"), "{e}");
    vm.assert_ok("cxl_list.decoders");
}

#[test]
fn stage3_region_namespace_write_read() {
    let vm = &plain().vms[0];
    vm.assert_all_ok(&["cxl_region_write"]);
    vm.assert_exit(0);
}

#[test]
fn stage3_data_survives_a_vmm_restart() {
    let g = plain();
    g.vms[1].assert_all_ok(&["cxl_region_read"]);
    g.vms[1].assert_exit(0);
    // The clean shutdown wrote the pattern through to the media file.
    let media = std::fs::read(&g.media).unwrap();
    let p = g.pattern.as_bytes();
    assert!(
        media.windows(p.len()).any(|w| w == p),
        "pattern not in {}",
        g.media.display()
    );
}

#[test]
fn keyed_range_media_never_holds_the_marker() {
    let g = keyed();
    g.first[0].assert_all_ok(&["cxl_region_write"]);
    let m = g.marker.as_bytes();
    assert!(
        !g.media_after_keyed_boot.windows(m.len()).any(|w| w == m),
        "the media file holds the plaintext marker"
    );
}

#[test]
fn keyless_boot_does_not_see_the_marker_and_the_key_brings_it_back() {
    let g = keyed();
    g.later[0].assert_all_ok(&["cxl_region_read"]);
    g.later[1].assert_all_ok(&["cxl_region_read"]);
}

#[test]
fn a_killed_vmm_is_a_dirty_shutdown_the_guest_sees() {
    let g = plain();
    let crash = &g.vms[2];
    let before = crash.assert_ok("cxl_health.health");
    assert_eq!(field(before, "dirty_shutdowns"), Some("0"), "{before}");
    crash.assert_ok("cxl_hold.holding");
    // Killed when it reported holding, not at the timeout. Nested: the test host reports
    // 128 + SIGKILL; direct: no exit code (ended by a signal).
    assert!(
        !crash.timed_out && matches!(crash.exit_code, Some(137) | None),
        "{}",
        crash.report("the crash VM must have been killed with SIGKILL when it held")
    );
    let after = g.vms[3].assert_ok("cxl_health.health");
    assert_eq!(field(after, "dirty_shutdowns"), Some("1"), "{after}");
    // What the clean runs flushed is still there.
    g.vms[3].assert_all_ok(&["cxl_health", "cxl_region_read"]);
}

#[test]
fn sigterm_flushes_the_device_cache() {
    let g = plain();
    let term = &g.vms[4];
    term.assert_ok("cxl_write_hold.write");
    term.assert_ok("cxl_write_hold.holding");
    assert!(
        !term.timed_out,
        "the VMM must end on SIGTERM, not at the timeout"
    );
    assert!(
        term.vmm_stderr.contains("terminated by SIGTERM"),
        "{}",
        term.vmm_stderr
    );
    let after = &g.vms[5];
    after.assert_all_ok(&["cxl_health", "cxl_region_read"]);
    let h = after.assert_ok("cxl_health.health");
    assert_eq!(
        field(h, "dirty_shutdowns"),
        Some("1"),
        "no new dirty shutdown: {h}"
    );
    let media = std::fs::read(&g.media).unwrap();
    let p = g.pattern2.as_bytes();
    assert!(
        media.windows(p.len()).any(|w| w == p),
        "second pattern not on the media"
    );
}

#[test]
fn two_devices_two_host_bridges() {
    static G: OnceLock<Result<Vec<VmOutcome>, String>> = OnceLock::new();
    let vms = G.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-cxl-two").map_err(|e| e.to_string())?;
        let a = fresh(&dir, "a.img");
        let b = fresh(&dir, "b.img");
        run_vms(&[VmSpec::new("two")
            .scenarios(["cxl_count"])
            .param("devices", "2")
            .cxl_t3(&a, SIZE, None, OPTS)
            .cxl_t3(&b, 2 * SIZE, None, &format!("{OPTS},serial=0x5eed"))])
        .map_err(|e| e.to_string())
    });
    let vms = match vms {
        Ok(v) => v,
        Err(e) => panic!("VM run failed: {e}"),
    };
    vms[0].assert_all_ok(&["cxl_count"]);
    let m = vms[0].assert_ok("cxl_count.memdevs");
    assert!(
        m.contains(&format!("\"pmem_size\":{},\"serial\":{}", 2 * SIZE, 0x5eed)),
        "the second device has its size and the serial given with serial=: {m}"
    );
}
