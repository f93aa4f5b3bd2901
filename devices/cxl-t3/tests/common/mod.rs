//! Helpers of the working-extent tests: an expander on a scratch media file with its working
//! area, and host threads' loads and stores through the extent's part of the DPA mapping (as
//! a vCPU's through its memslot).

// Not every test file uses every helper.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;

use cxl_t3::cache::BLOCK;
use cxl_t3::expander::{Expander, ExpanderConfig};
use cxl_t3::{WorkingArea, WorkingExtent};

pub const MIB: u64 = 1 << 20;

/// A scratch media path unique to this test binary, process and `name`.
pub fn tmp(name: &str) -> PathBuf {
    let bin = module_path!().replace("::", "-");
    let p = std::env::temp_dir().join(format!("cxl-{bin}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// A 2 MiB expander with a cache of `sets` x `ways` blocks and its working area over the
/// upper MiB.
pub fn setup(name: &str, sets: u64, ways: usize) -> (Arc<Expander>, Arc<WorkingArea>, PathBuf) {
    let media = tmp(name);
    let x = Expander::open(&ExpanderConfig {
        media: media.clone(),
        size: 2 * MIB,
        cache_bytes: sets * ways as u64 * BLOCK,
        ways,
        media_latency_ns: 0,
    })
    .unwrap();
    assert_eq!(x.geometry(), (sets, ways));
    let area = WorkingArea::new(x.clone(), MIB, 2 * MIB).unwrap();
    (x, area, media)
}

/// Evicts whatever the set of DPA block `block` holds by reading `ways` blocks of that set
/// that were never touched (below the working area, from `*fresh` on).
pub fn evict_set_of(x: &Expander, block: u64, fresh: &mut u64) {
    let (sets, ways) = x.geometry();
    let mut n = 0;
    while n < ways {
        let b = *fresh;
        *fresh += 1;
        assert!(b < MIB / BLOCK, "out of fresh blocks");
        if b % sets == block % sets {
            // SAFETY: inside the DPA mapping.
            unsafe { std::ptr::read_volatile((x.host_addr() + b * BLOCK) as *const u8) };
            n += 1;
        }
    }
}

/// Copies `len` bytes at `off` of the extent out through the mapping.
pub fn peek(e: &WorkingExtent, off: u64, len: usize) -> Vec<u8> {
    assert!(off + len as u64 <= e.len());
    let mut v = vec![0u8; len];
    // SAFETY: inside the extent's part of the DPA mapping, which lives as long as `e`;
    // faults are served by the expander.
    unsafe {
        std::ptr::copy_nonoverlapping((e.host_addr() + off) as *const u8, v.as_mut_ptr(), len)
    }
    v
}

/// Copies `data` in at `off` of the extent through the mapping, as a guest's stores would.
pub fn poke(e: &WorkingExtent, off: u64, data: &[u8]) {
    assert!(off + data.len() as u64 <= e.len());
    // SAFETY: as in `peek`.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), (e.host_addr() + off) as *mut u8, data.len())
    }
}

/// Drops the area and then the expander, and removes the media file.
pub fn done(x: Arc<Expander>, area: Arc<WorkingArea>, media: PathBuf) {
    drop(area);
    drop(x);
    let _ = std::fs::remove_file(&media);
}
