//! A VMM killed without GPF leaves a dirty shutdown behind. Its own test
//! binary: the child is forked from it, and a fork in flight would briefly
//! share other tests' media locks.

// Test code: an unwrap that fails is a failed test.
#![allow(clippy::unwrap_used)]

use cxl_t3::cache::BLOCK;
use cxl_t3::expander::{Expander, ExpanderConfig};

fn config(media: std::path::PathBuf) -> ExpanderConfig {
    ExpanderConfig {
        media,
        size: 1 << 20,
        cache_bytes: 16 * BLOCK,
        ways: 8,
        media_latency_ns: 0,
    }
}

/// The child: open, dirty a block, die by SIGKILL.
fn killed_child(path: &str) -> ! {
    let x = Expander::open(&config(path.into())).unwrap();
    // SAFETY: a write inside the DPA mapping; the fault is served.
    unsafe { (x.host_addr() as *mut u8).write_volatile(0x5a) };
    // SAFETY: kills this process, as a crashing VMM would die.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL returned");
}

#[test]
fn dirty_shutdown_counted_when_the_process_is_killed() {
    if let Ok(p) = std::env::var("CXL_KILLED_CHILD_MEDIA") {
        killed_child(&p);
    }
    let path = std::env::temp_dir().join(format!("cxl-killed-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    // A clean run first.
    Expander::open(&config(path.clone()))
        .unwrap()
        .shutdown()
        .unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "dirty_shutdown_counted_when_the_process_is_killed",
            "--test-threads=1",
        ])
        .env("CXL_KILLED_CHILD_MEDIA", &path)
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let x = Expander::open(&config(path.clone())).unwrap();
    assert_eq!(x.dirty_shutdown_count(), 1);
    x.shutdown().unwrap();
    drop(x);
    let x = Expander::open(&config(path.clone())).unwrap();
    assert_eq!(x.dirty_shutdown_count(), 1);
    drop(x);
    let _ = std::fs::remove_file(&path);
}
