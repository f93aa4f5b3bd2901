//! The PMO device end to end: a guest application uses PMOs through libpmo and the `pmo` CLI,
//! and the hypervisor decrypts and verifies each page on its first access.
//!
//! Two test host boots serve all tests here:
//! 1. VM "pmo" (2 vCPUs) runs the functional scenarios (create/attach/write/psync/detach/read,
//!    wrong key, readers and writers, pdestroy while attached, read-only writes, write-back
//!    mapping, a killed writer, a `p_malloc` linked list, and a PMO for the tamper test); VM
//!    "restart" is a new VMM process on the same store, with a stream predictor prefetching
//!    pages, that checks the linked list.
//! 2. Between the boots the host damages one page of ciphertext in the store file; VM "tamper"
//!    then reads every page: the damaged one kills the reader with SIGBUS, the others read fine,
//!    and the VM lives on. Then a process `write(2)`s straight from the damaged page of its
//!    mapping into a file (the guest kernel reads the page): never silently. The same runs on
//!    2 vCPUs ("tamper-smp") and with a predictor that finds the page bad first
//!    ("tamper-ahead": the copy fails with EFAULT). In the same test host run, VM "stale" opens
//!    another store, prepared on the host, under its rollback anchor: one PMO's old record was
//!    moved to another slot and its own slot damaged; the VMM refuses it at warn and the guest
//!    gets ESTALE for it.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use pmo_crypto::{KdfParams, UserKey, PAGE};
use pmo_integration::{run_vms, unique_pattern, Env, VmOutcome, VmSpec, VM_TEST_KDF};
use pmo_media::{FileMedium, Medium};
use pmo_store::superblock::SLOT_SIZE;
use pmo_store::{Perm, Store, StoreOptions};
use std::sync::Arc;

const STORE_SIZE: u64 = 256 << 20;
const BAD_PAGE: u64 = 3;

struct Group {
    main: Vec<VmOutcome>,
    tamper: Vec<VmOutcome>,
    store: PathBuf,
    marker: String,
    store_before_tamper: Vec<u8>,
}

/// Size of the store VM "stale" opens.
const STALE_STORE: u64 = 64 << 20;

/// The keyless editor's attack of issue 27 on a store made here: `t-stale` psynced twice,
/// its record from after the first psync copied into a never-used slot, its own slot
/// damaged, its extent as of the first psync put back; `t-other` holds `other-PATTERN` at
/// byte 100 of page 0. The anchor is current (it saw both psyncs).
fn prepare_stale_store(
    store: &std::path::Path,
    anchor: &std::path::Path,
    pattern: &str,
) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let _ = std::fs::remove_file(store);
    let _ = std::fs::remove_file(anchor);
    let kdf = KdfParams::parse(VM_TEST_KDF).map_err(|x| e(&x))?;
    let file = FileMedium::create(store, STALE_STORE).map_err(|x| e(&x))?;
    let m: Arc<dyn Medium> = Arc::new(file);
    let s = Store::create(
        m.clone(),
        StoreOptions {
            anchor: Some(anchor.to_owned()),
            kdf,
            ..StoreOptions::default()
        },
    )
    .map_err(|x| e(&x))?;
    let key = UserKey::new(b"pmotest-key-1").map_err(|x| e(&x))?;
    let page = |text: &str| {
        let mut p = [0u8; PAGE];
        p[100..100 + text.len()].copy_from_slice(text.as_bytes());
        p
    };
    let psync = |name: &str, text: &str| -> Result<(), String> {
        let w = s.attach(name, Perm::Write, &key).map_err(|x| e(&x))?;
        w.psync([(0u64, &page(text))]).map_err(|x| e(&x))?;
        w.detach().wait().map_err(|x| e(&x))
    };
    for name in ["t-stale", "t-other"] {
        s.create_pmo(name, 4 * PAGE as u64, &key)
            .map_err(|x| e(&x))?;
    }
    psync("t-other", &format!("other-{pattern}"))?;
    psync("t-stale", "old-data")?;
    let info = s
        .list()
        .into_iter()
        .find(|i| i.name == "t-stale")
        .ok_or("no t-stale")?;
    let slot_at = s.superblock().record_off(info.slot, 0);
    let spare_at = s.superblock().record_off(s.superblock().slots - 1, 0);
    let read = |off: u64, len: u64| -> Result<Vec<u8>, String> {
        let mut b = vec![0u8; len as usize];
        m.read(off, &mut b).map_err(|x| e(&x))?;
        Ok(b)
    };
    let old_slot = read(slot_at, SLOT_SIZE)?;
    let old_extent = read(info.extent.0, info.extent.1)?;
    psync("t-stale", "new-data")?;
    drop(s);
    let put = |off: u64, b: &[u8]| -> Result<(), String> {
        m.write(off, b).map_err(|x| e(&x))?;
        m.persist(off, b.len() as u64).map_err(|x| e(&x))
    };
    put(spare_at, &old_slot)?;
    put(slot_at, &[0x5a; SLOT_SIZE as usize])?;
    put(info.extent.0, &old_extent)?;
    Ok(())
}

/// Offset of the first data page of PMO `name` in the store file (data pages come first in a
/// PMO's extent; `pmovmm store inspect` reads it without a key).
fn data_offset(store: &std::path::Path, name: &str) -> Result<u64, String> {
    let insp = pmovmm::cli::store::store_inspect(store, &mut std::io::sink())
        .map_err(|e| e.to_string())?;
    insp.records
        .iter()
        .find(|r| r.1 == name)
        .map(|r| r.4)
        .ok_or_else(|| format!("no PMO {name} in {}", store.display()))
}

fn group() -> &'static Group {
    static GROUP: OnceLock<Result<Group, String>> = OnceLock::new();
    let g = GROUP.get_or_init(|| {
        let env = Env::from_env();
        let dir = env.work_dir("vm-pmo").map_err(|e| e.to_string())?;
        let store = dir.join("store.img");
        let _ = std::fs::remove_file(&store);
        let marker = unique_pattern("PMOSECRET");
        let main = run_vms(&[
            VmSpec::new("pmo")
                .cpus(2)
                .scenarios([
                    "pmo_basic",
                    "pmo_wrong_key",
                    "pmo_readers",
                    "pmo_writer_excl",
                    "pmo_destroy_busy",
                    "pmo_ro_write",
                    "pmo_wb",
                    "pmo_crash",
                    "pmo_list_build",
                    "pmo_tamper_prep",
                ])
                .param("pattern", &marker)
                .pmo_store(&store, STORE_SIZE),
            // The new VMM process also runs a stream predictor: prefetched pages
            // must read exactly like demand-faulted ones.
            VmSpec::new("restart")
                .scenarios(["pmo_list_check"])
                .pmo_store(&store, STORE_SIZE)
                .extra_arg("--pmo-predictor")
                .extra_arg("stream:4"),
        ])
        .map_err(|e| e.to_string())?;
        let store_before_tamper = std::fs::read(&store).map_err(|e| e.to_string())?;

        // Damage one byte of page BAD_PAGE's ciphertext, as an attacker with the file would.
        let at = data_offset(&store, "t-tamper")? + BAD_PAGE * 4096 + 100;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&store)
            .map_err(|e| e.to_string())?;
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).map_err(|e| e.to_string())?;
        b[0] ^= 0x55;
        f.write_all_at(&b, at).map_err(|e| e.to_string())?;
        drop(f);

        let tamper_vm = |name: &str, cpus: u32| {
            VmSpec::new(name)
                .cpus(cpus)
                .param("pattern", &marker)
                .param("bad", BAD_PAGE.to_string())
                .pmo_store(&store, STORE_SIZE)
        };
        let (stale_store, stale_anchor) = (dir.join("stale.img"), dir.join("stale.anchor"));
        prepare_stale_store(&stale_store, &stale_anchor, &marker)?;
        let tamper = run_vms(&[
            tamper_vm("tamper", 1).scenarios(["pmo_tamper_read", "pmo_tamper_write"]),
            tamper_vm("tamper-smp", 2).scenarios(["pmo_tamper_write"]),
            tamper_vm("tamper-ahead", 1)
                .scenarios(["pmo_tamper_write"])
                .param("ahead", "1")
                .extra_arg("--pmo-predictor")
                .extra_arg("stream:4"),
            VmSpec::new("stale")
                .scenarios(["pmo_stale"])
                .param("pattern", &marker)
                .pmo_store(&stale_store, STALE_STORE)
                .pmo_anchor(&stale_anchor),
        ])
        .map_err(|e| e.to_string())?;
        Ok(Group {
            main,
            tamper,
            store,
            marker,
            store_before_tamper,
        })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

#[test]
fn write_psync_detach_then_read_back() {
    let vm = &group().main[0];
    vm.assert_all_ok(&["pmo_basic"]);
    vm.assert_exit(0);
}

#[test]
fn wrong_key_is_eacces_and_maps_nothing() {
    group().main[0].assert_all_ok(&["pmo_wrong_key"]);
}

#[test]
fn readers_share_and_a_writer_excludes() {
    group().main[0].assert_all_ok(&["pmo_readers", "pmo_writer_excl"]);
}

#[test]
fn pdestroy_of_an_attached_pmo_is_ebusy() {
    group().main[0].assert_all_ok(&["pmo_destroy_busy"]);
}

#[test]
fn read_only_attachment_write_is_sigsegv() {
    group().main[0].assert_all_ok(&["pmo_ro_write"]);
}

#[test]
fn window_is_write_back_cacheable() {
    group().main[0].assert_all_ok(&["pmo_wb"]);
}

#[test]
fn killed_writer_leaves_the_last_psync() {
    group().main[0].assert_all_ok(&["pmo_crash"]);
}

#[test]
fn p_malloc_list_survives_vmm_restart() {
    let g = group();
    g.main[0].assert_all_ok(&["pmo_list_build"]);
    g.main[1].assert_all_ok(&["pmo_list_check"]);
    g.main[1].assert_exit(0);
}

#[test]
fn store_file_never_holds_guest_plaintext() {
    let g = group();
    g.main[0].assert_ok("pmo_basic.write");
    let hay = &g.store_before_tamper;
    let needle = g.marker.as_bytes();
    assert!(
        !hay.windows(needle.len()).any(|w| w == needle),
        "the store file {} contains the guest's plaintext marker {}",
        g.store.display(),
        g.marker
    );
}

#[test]
fn store_is_consistent_after_the_sessions() {
    let g = group();
    common::assert_store_clean(&g.store, "vm_pmo");
}

#[test]
fn tampered_page_is_sigbus_other_pages_fine_vm_lives() {
    let g = group();
    g.main[0].assert_all_ok(&["pmo_tamper_prep"]);
    let vm = &g.tamper[0];
    vm.assert_all_ok(&["pmo_tamper_read"]);
    vm.assert_exit(0);
}

/// A process `write(2)`s from the tampered page of its mapping into a file, then a pipe, so
/// the guest kernel reads it: the copy fails with EFAULT or the process has its SIGBUS before
/// `write(2)` returns, the file never gets the page's plaintext (and zeros only with that
/// SIGBUS), psync and detach report EBADMSG, and the VM lives on. One vCPU (stuck in the copy
/// until the host serves zeros) and two (the other vCPU runs the driver's unmap).
#[test]
fn kernel_copy_of_a_tampered_page_is_never_silent() {
    let g = group();
    g.main[0].assert_all_ok(&["pmo_tamper_prep"]);
    for vm in &g.tamper[..2] {
        vm.assert_all_ok(&["pmo_tamper_write"]);
        for check in ["kernel_write", "kernel_write_pipe"] {
            let how = vm.assert_ok(&format!("pmo_tamper_write.{check}"));
            assert!(
                how.contains("EFAULT") || how.contains("SIGBUS before it returned"),
                "{how}"
            );
        }
        vm.assert_ok("pmo_tamper_write.alive");
        vm.assert_exit(0);
    }
}

/// With a predictor, the host finds the tampered page bad before anything touches it and
/// announces it; the driver unmaps it, so the kernel's copy fails with EFAULT (no page is
/// refused, no SIGBUS), and the attachment still reports EBADMSG at psync and detach.
#[test]
fn page_found_bad_ahead_makes_the_kernel_copy_fail_with_efault() {
    let vm = &group().tamper[2];
    vm.assert_all_ok(&["pmo_tamper_write"]);
    for check in ["kernel_write", "kernel_write_pipe"] {
        let how = vm.assert_ok(&format!("pmo_tamper_write.{check}"));
        assert!(how.contains("EFAULT, no SIGBUS"), "{how}");
    }
    assert!(
        vm.assert_ok("pmo_tamper_write.guest_log")
            .contains("found before any access"),
        "the driver saw PAGE_BAD"
    );
    vm.assert_exit(0);
}

/// Issue 27 seen by the guest: a PMO the VMM refused at open (its record moved to another
/// slot, its own slot damaged, under the rollback anchor) answers ESTALE to read, rm and
/// create, which the `pmo` CLI prints as a refusal by the host; the VMM said so at warn; the
/// store's other PMO reads back.
#[test]
fn a_pmo_refused_under_the_anchor_is_estale_in_the_guest() {
    let vm = &group().tamper[3];
    vm.assert_all_ok(&["pmo_stale"]);
    assert!(
        vm.vmm_stderr
            .contains("PMO \"t-stale\" refused (the guest gets ESTALE): its table slot"),
        "no warning from the VMM: {}",
        vm.vmm_stderr
    );
    vm.assert_exit(0);
}
