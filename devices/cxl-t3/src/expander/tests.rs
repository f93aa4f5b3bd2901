use super::*;

pub(crate) fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("cxl-exp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn cfg(name: &str, size: u64, cache_blocks: u64, ways: usize) -> ExpanderConfig {
    ExpanderConfig {
        media: tmp(name),
        size,
        cache_bytes: cache_blocks * BLOCK,
        ways,
        media_latency_ns: 0,
    }
}

#[test]
fn config_defaults_and_validation() {
    let c = ExpanderConfig::new("/x", 1 << 30);
    assert_eq!(c.cache_bytes, 64 << 20);
    assert_eq!(c.ways, 8);
    assert_eq!(c.media_latency_ns, 25_000);
    let mut c = cfg("val", 12345, 8, 8);
    assert!(matches!(
        Expander::open(&c),
        Err(ExpanderError::BadSize(12345))
    ));
    c.size = 1 << 20;
    c.ways = 0;
    assert!(matches!(
        Expander::open(&c),
        Err(ExpanderError::Cache(CacheError::ZeroWays))
    ));
}

#[test]
fn host_path_counts_hits_misses_and_write_backs() {
    let c = cfg("host", 1 << 20, 4, 2); // 2 sets x 2 ways
    let x = Expander::open(&c).unwrap();
    assert_eq!(x.geometry(), (2, 2));
    x.write(0, b"block zero").unwrap(); // miss (set 0)
    x.write(2 * BLOCK, b"block two").unwrap(); // miss (set 0)
    let mut b = [0u8; 10];
    x.read(0, &mut b).unwrap(); // hit
    assert_eq!(&b, b"block zero");
    x.read(4 * BLOCK, &mut b).unwrap(); // miss, evicts block 2 (dirty)
    assert_eq!(b, [0u8; 10]);
    let s = x.stats();
    assert_eq!((s.hits, s.misses, s.evictions, s.writebacks), (1, 3, 1, 1));
    // Block 2 came back from media.
    let mut b = [0u8; 9];
    x.read(2 * BLOCK, &mut b).unwrap();
    assert_eq!(&b, b"block two");
    // An access crossing a block boundary.
    x.write(BLOCK - 3, b"straddle").unwrap();
    let mut b = [0u8; 8];
    x.read(BLOCK - 3, &mut b).unwrap();
    assert_eq!(&b, b"straddle");
    assert!(matches!(
        x.read(1 << 20, &mut [0u8; 1]),
        Err(ExpanderError::OutOfRange { .. })
    ));
    assert!(matches!(
        x.write(u64::MAX, &[0u8; 2]),
        Err(ExpanderError::OutOfRange { .. })
    ));
    x.shutdown().unwrap();
    let _ = std::fs::remove_file(&c.media);
}

#[test]
fn guest_path_faults_fill_and_first_write_marks_dirty() {
    let c = cfg("guest", 1 << 20, 16, 8);
    let x = Expander::open(&c).unwrap();
    let p = x.host_addr() as *mut u8;
    // SAFETY: reads and writes inside the DPA mapping; faults are served.
    let v = unsafe { p.add(5 * BLOCK as usize).read_volatile() };
    assert_eq!(v, 0);
    assert_eq!(x.stats().fills, 1);
    assert_eq!(x.counters().dirty, 0);
    // SAFETY: as above.
    unsafe { p.add(5 * BLOCK as usize + 7).write_volatile(0x77) };
    assert_eq!(x.counters().dirty, 1);
    assert!(x.counters().wp_faults >= 1);
    x.flush().unwrap();
    assert_eq!(x.counters().dirty, 0);
    assert_eq!(x.stats().writebacks, 1);
    // Re-protected: the next write is seen again.
    // SAFETY: as above.
    unsafe { p.add(5 * BLOCK as usize + 8).write_volatile(0x78) };
    assert_eq!(x.counters().dirty, 1);
    let raw = std::fs::read(&c.media).unwrap();
    assert_eq!(
        raw[(crate::media::HEADER_LEN + 5 * BLOCK + 7) as usize],
        0x77
    );
    drop(x);
    let _ = std::fs::remove_file(&c.media);
}
