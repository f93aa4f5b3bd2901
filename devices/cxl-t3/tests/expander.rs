//! Host tests of the expander's memory half: host threads stand in for vCPUs
//! by touching the uffd-backed DPA space directly.

use std::path::PathBuf;

use cxl_t3::cache::BLOCK;
use cxl_t3::expander::{CxlMedium, Expander, ExpanderConfig, ExpanderError};
use cxl_t3::media::{MediaError, HEADER_LEN};
use pmo_media::Medium;

const KEY256: [u8; 64] = [0x3c; 64];
const KEY128: [u8; 32] = [0xa5; 32];

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("cxl-it-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn config(media: PathBuf, size: u64, cache_blocks: u64, ways: usize) -> ExpanderConfig {
    ExpanderConfig {
        media,
        size,
        cache_bytes: cache_blocks * BLOCK,
        ways,
        media_latency_ns: 0,
    }
}

/// Writes `data` at DPA `dpa` through the mapping, as a guest would.
fn poke(x: &Expander, dpa: u64, data: &[u8]) {
    assert!(dpa + data.len() as u64 <= x.size());
    // SAFETY: inside the DPA mapping; faults are served by the expander.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), (x.host_addr() + dpa) as *mut u8, data.len())
    }
}

/// Reads through the mapping.
fn peek(x: &Expander, dpa: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: as in `poke`.
    unsafe {
        std::ptr::copy_nonoverlapping((x.host_addr() + dpa) as *const u8, v.as_mut_ptr(), len)
    }
    v
}

/// Loads one byte through the mapping, a load the compiler must keep (a
/// `peek` whose result is dropped is a dead load that release builds remove).
fn touch(x: &Expander, dpa: u64) -> u8 {
    assert!(dpa < x.size());
    // SAFETY: as in `poke`.
    unsafe { std::ptr::read_volatile((x.host_addr() + dpa) as *const u8) }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

#[test]
fn keyed_ranges_never_reach_media_in_plaintext() {
    for key in [&KEY256[..], &KEY128[..]] {
        let path = tmp(&format!("plain{}", key.len()));
        // 4 MiB device, 32-block cache: the writes below also evict.
        let x = Expander::open(&config(path.clone(), 4 << 20, 32, 8)).unwrap();
        x.set_range_key(1, 0, 1 << 20, key).unwrap();
        let secret = b"SECRET-MARKER-keyed-range-0123456789";
        let control = b"CONTROL-MARKER-open-range-987654321";
        // Host threads write through the mapping: 64 keyed blocks, 64 unkeyed.
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let x = &x;
                s.spawn(move || {
                    for i in 0..32u64 {
                        let b = t * 32 + i;
                        poke(x, b * BLOCK + 100, secret);
                        poke(x, (1 << 20) + b * BLOCK + 100, control);
                    }
                });
            }
        });
        // And through the PMO medium.
        let m = CxlMedium::new(x.clone());
        m.write(200 * 1024 + 7, secret).unwrap();
        m.write((1 << 20) + 200 * 1024 + 7, control).unwrap();
        m.persist(0, 4 << 20).unwrap();
        assert!(x.stats().evictions > 0, "the writes must also evict");
        x.flush().unwrap();
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(count(&raw, secret), 0, "keyed plaintext reached the media");
        assert_eq!(count(&raw, control), 65, "unkeyed control is plain");
        // Through the cache the keyed range still reads as plaintext.
        assert_eq!(peek(&x, 5 * BLOCK + 100, secret.len()), secret);
        let mut b = vec![0u8; secret.len()];
        m.read(200 * 1024 + 7, &mut b).unwrap();
        assert_eq!(b, secret);
        x.shutdown().unwrap();
        drop(m);
        drop(x);
        let _ = std::fs::remove_file(&path);
    }
}

/// A key change on a range smaller than the cache's set count (a PMO extent) looks each
/// block up in its own set: the range's dirty blocks are still written back under the old
/// key and dropped, and blocks outside the range keep their data.
#[test]
fn a_key_change_on_a_small_range_drains_exactly_its_blocks() {
    let path = tmp("small-range");
    // 64 sets of one way: a 4-block range spans 4 of them.
    let x = Expander::open(&config(path.clone(), 2 << 20, 64, 1)).unwrap();
    x.set_range_key(3, 4 * BLOCK, 8 * BLOCK, &KEY256).unwrap();
    let (inside, outside) = (
        b"inside-the-small-range-marker",
        b"outside-the-range-marker-xyz!",
    );
    for b in 4..8 {
        poke(&x, b * BLOCK, inside);
    }
    for b in [2u64, 9, 68] {
        poke(&x, b * BLOCK, outside);
    }
    x.clear_range_key(3).unwrap();
    for b in 4..8 {
        let mut got = vec![0u8; inside.len()];
        x.read(b * BLOCK, &mut got).unwrap();
        assert_ne!(got, inside, "block {b} was not drained under its key");
    }
    for b in [2u64, 9, 68] {
        assert_eq!(peek(&x, b * BLOCK, outside.len()), outside, "block {b}");
    }
    x.set_range_key(4, 4 * BLOCK, 8 * BLOCK, &KEY256).unwrap();
    for b in 4..8 {
        assert_eq!(peek(&x, b * BLOCK, inside.len()), inside, "block {b}");
    }
    x.shutdown().unwrap();
    drop(x);
    let _ = std::fs::remove_file(&path);
}

/// Zeroing a range: whole blocks go to the media as zero blocks without a fill (cached ones,
/// dirty or clean, are dropped, not written back), partial ends through the cache; the range
/// reads as zeros, keyed or not, also after a reopen; its neighbours keep their bytes.
#[test]
fn zeroing_a_range_drops_its_blocks_and_reads_as_zeros_after_a_reopen() {
    let path = tmp("zero");
    let marker = b"zero-test-marker-0123456789abcdef";
    let size = 2 << 20;
    {
        let x = Expander::open(&config(path.clone(), size, 64, 8)).unwrap();
        x.set_range_key(1, 8 * BLOCK, 24 * BLOCK, &KEY256).unwrap();
        for b in 0..32 {
            poke(&x, b * BLOCK, marker);
            poke(&x, b * BLOCK + BLOCK - 64, marker);
        }
        // Some on media only, some dirty in the cache.
        x.flush().unwrap();
        for b in 10..14 {
            poke(&x, b * BLOCK + 100, marker);
        }
        let fills = x.stats().fills;
        // From the middle of block 4 to the middle of block 20.
        let (start, end) = (4 * BLOCK + 2048, 20 * BLOCK + 2048);
        x.zero(start, end - start).unwrap();
        assert!(
            x.stats().fills - fills <= 2,
            "whole blocks were zeroed without fills"
        );
        x.persist(start, end - start).unwrap();
        let mut got = vec![0xffu8; (end - start) as usize];
        x.read(start, &mut got).unwrap();
        assert!(
            got.iter().all(|b| *b == 0),
            "the zeroed range reads as zeros"
        );
        assert_eq!(
            peek(&x, 4 * BLOCK, marker.len()),
            marker,
            "head of block 4 kept"
        );
        assert_eq!(peek(&x, 21 * BLOCK, marker.len()), marker, "block 21 kept");
        x.shutdown().unwrap();
    }
    let x = Expander::open(&config(path.clone(), size, 64, 8)).unwrap();
    x.set_range_key(1, 8 * BLOCK, 24 * BLOCK, &KEY256).unwrap();
    for b in 5..20 {
        assert_eq!(peek(&x, b * BLOCK + 100, 64), vec![0u8; 64], "block {b}");
    }
    assert_eq!(peek(&x, 3 * BLOCK, marker.len()), marker);
    assert_eq!(
        peek(&x, 22 * BLOCK, marker.len()),
        marker,
        "keyed neighbour"
    );
    assert!(matches!(
        x.zero(size - BLOCK, 2 * BLOCK),
        Err(ExpanderError::OutOfRange { .. })
    ));
    x.shutdown().unwrap();
    drop(x);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn cleared_key_reads_as_ciphertext_and_the_key_brings_it_back() {
    let path = tmp("clear");
    let x = Expander::open(&config(path.clone(), 2 << 20, 64, 8)).unwrap();
    x.set_range_key(9, BLOCK, 9 * BLOCK, &KEY256).unwrap();
    let marker = b"cleared-key-marker-ABCDEFGHIJ";
    for b in 1..9 {
        poke(&x, b * BLOCK, marker);
    }
    // An unwritten block of the range reads as zeros while keyed.
    x.write(8 * BLOCK + 2048, &[0u8; 16]).unwrap();
    x.clear_range_key(9).unwrap();
    for b in 1..9 {
        let mut got = vec![0u8; marker.len()];
        x.read(b * BLOCK, &mut got).unwrap();
        assert_ne!(got, marker, "block {b} must read as ciphertext");
        assert_ne!(got, vec![0u8; marker.len()]);
        // Through the mapping too.
        assert_ne!(peek(&x, b * BLOCK, marker.len()), marker);
    }
    assert!(matches!(
        x.clear_range_key(9),
        Err(ExpanderError::Tee(cxl_t3::tee::TeeError::NoSuchId(9)))
    ));
    // Programming the same key again makes the range plaintext again.
    x.set_range_key(10, BLOCK, 9 * BLOCK, &KEY256).unwrap();
    for b in 1..9 {
        assert_eq!(peek(&x, b * BLOCK, marker.len()), marker);
    }
    // Overlaps and a key for the other algorithm are refused.
    assert!(matches!(
        x.set_range_key(11, 0, 2 * BLOCK, &KEY256),
        Err(ExpanderError::Tee(cxl_t3::tee::TeeError::Overlap { .. }))
    ));
    assert!(matches!(
        x.set_range_key(11, 20 * BLOCK, 30 * BLOCK, &KEY128),
        Err(ExpanderError::Tee(
            cxl_t3::tee::TeeError::AlgorithmMismatch(_)
        ))
    ));
    x.shutdown().unwrap();
    drop(x);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn data_survives_close_and_reopen() {
    let path = tmp("reopen");
    let cfg = config(path.clone(), 8 << 20, 16, 4);
    let x = Expander::open(&cfg).unwrap();
    x.set_range_key(1, 4 << 20, 8 << 20, &KEY128).unwrap();
    for b in (0..2048u64).step_by(37) {
        poke(&x, b * BLOCK + (b % 4000), &b.to_le_bytes());
    }
    x.shutdown().unwrap();
    x.shutdown().unwrap(); // idempotent
    drop(x);
    let x = Expander::open(&cfg).unwrap();
    assert_eq!(x.dirty_shutdown_count(), 0);
    x.set_range_key(1, 4 << 20, 8 << 20, &KEY128).unwrap();
    for b in (0..2048u64).step_by(37) {
        assert_eq!(
            peek(&x, b * BLOCK + (b % 4000), 8),
            b.to_le_bytes(),
            "block {b}"
        );
    }
    drop(x);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn dirty_shutdown_counted_on_drop_without_shutdown_only() {
    let path = tmp("dsc");
    let cfg = config(path.clone(), 1 << 20, 16, 8);
    let x = Expander::open(&cfg).unwrap();
    poke(&x, 0, b"x");
    drop(x); // no GPF
    let x = Expander::open(&cfg).unwrap();
    assert_eq!(x.dirty_shutdown_count(), 1);
    x.shutdown().unwrap();
    drop(x);
    let x = Expander::open(&cfg).unwrap();
    assert_eq!(x.dirty_shutdown_count(), 1);
    // A write after a clean shutdown makes the run live again.
    x.shutdown().unwrap();
    poke(&x, BLOCK, b"y");
    drop(x);
    let x = Expander::open(&cfg).unwrap();
    assert_eq!(x.dirty_shutdown_count(), 2);
    drop(x);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn foreign_or_corrupt_media_is_refused() {
    let path = tmp("corrupt");
    let cfg = config(path.clone(), 1 << 20, 16, 8);
    Expander::open(&cfg).unwrap().shutdown().unwrap();
    let mut raw = std::fs::read(&path).unwrap();
    raw[17] ^= 0x40; // inside the size field: checksum no longer matches
    std::fs::write(&path, &raw).unwrap();
    assert!(matches!(
        Expander::open(&cfg),
        Err(ExpanderError::Media(MediaError::Corrupt))
    ));
    raw[0] = b'X';
    std::fs::write(&path, &raw).unwrap();
    assert!(matches!(
        Expander::open(&cfg),
        Err(ExpanderError::Media(MediaError::Foreign))
    ));
    let _ = std::fs::remove_file(&path);
}

/// Host threads write patterns over 4x the cache, in shared blocks, so
/// evictions race with writes; every byte must survive.
#[test]
fn evictions_under_concurrent_writers_keep_every_byte() {
    const THREADS: u64 = 4;
    const CACHE: u64 = 32;
    const BLOCKS: u64 = 4 * CACHE;
    const ROUNDS: u64 = 6;
    let path = tmp("evict");
    // Media latency widens the window between copying a victim out and dropping it.
    let mut cfg = config(path.clone(), BLOCKS * BLOCK, CACHE, 8);
    cfg.media_latency_ns = 30_000;
    let x = Expander::open(&cfg).unwrap();
    x.set_range_key(1, 0, BLOCKS / 2 * BLOCK, &KEY256).unwrap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let x = &x;
            s.spawn(move || {
                for r in 0..ROUNDS {
                    // Each thread owns one u64 slot per 512-byte line of every block.
                    for i in 0..BLOCKS {
                        let b = (i * 7 + t * 13 + r) % BLOCKS;
                        for line in 0..8u64 {
                            let v = (r << 48) | (t << 40) | (b << 8) | line;
                            poke(x, b * BLOCK + line * 512 + t * 8, &v.to_le_bytes());
                        }
                    }
                }
            });
        }
    });
    let check = |x: &Expander| {
        for b in 0..BLOCKS {
            for t in 0..THREADS {
                for line in 0..8u64 {
                    let want = ((ROUNDS - 1) << 48) | (t << 40) | (b << 8) | line;
                    let got = peek(x, b * BLOCK + line * 512 + t * 8, 8);
                    assert_eq!(got, want.to_le_bytes(), "block {b} thread {t} line {line}");
                }
            }
        }
    };
    check(&x);
    let st = x.stats();
    assert!(st.evictions >= BLOCKS, "{st:?}");
    assert!(st.writebacks > 0);
    x.shutdown().unwrap();
    drop(x);
    let x = Expander::open(&config(path.clone(), BLOCKS * BLOCK, CACHE, 8)).unwrap();
    x.set_range_key(1, 0, BLOCKS / 2 * BLOCK, &KEY256).unwrap();
    check(&x);
    // The unkeyed half is on media as written.
    let raw = std::fs::read(&path).unwrap();
    let b = BLOCKS - 1;
    let off = (HEADER_LEN + b * BLOCK) as usize;
    let want = ((ROUNDS - 1) << 48) | (b << 8);
    assert_eq!(raw[off..off + 8], want.to_le_bytes());
    drop(x);
    let _ = std::fs::remove_file(&path);
}

/// Hang guard for tests that wait for another thread's progress: passing
/// never depends on it, it only turns a stuck thread into a failure.
const WATCHDOG: std::time::Duration = std::time::Duration::from_secs(120);

/// A writer hammers one block that another thread keeps evicting (one
/// 2-way set): a store that lands between copying the victim out and
/// dropping it would be lost unless the victim is write-protected first.
///
/// The race is driven until it has happened, not for a fixed time. The
/// writer never pauses: store `n` goes to slot `n % SLOTS` of the block,
/// after checking that the slot still holds what store `n - SLOTS` put
/// there (a lost store shows at its slot's next turn). The reader's every
/// access is a miss (16 blocks cycling through a 2-block set) that evicts
/// the least recently filled block, so the hammered block is evicted every
/// other miss, dirty, while the writer is storing into it: its next store
/// meets the eviction's write-protect, which the expander counts as
/// `raced_evictions`. The reader starts a miss only after the writer made
/// progress since its last one, so the writer, whose fault waits for the
/// set lock, is not starved by a stream of reader faults. The run ends when that count reaches the target; it
/// is bounded by reader misses (events that should each race), not by time
/// or by the writer's speed. The watchdog only turns a hang (no progress
/// at all) into a failure.
///
/// (It used to spin a fixed 200 times between stores and assert that more
/// than 32 evictions happened meanwhile: it failed every release run,
/// whose optimizer dropped the evicting thread's unused loads, and its
/// debug passes depended on how fast the two threads ran.)
#[test]
fn writes_racing_evictions_are_not_lost() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    /// 8-byte slots of the hammered block (block 0).
    const SLOTS: u64 = BLOCK / 8;
    const TARGET_RACES: u64 = 32;
    /// Bound on the drive: the target took 65-1187 reader misses in ten
    /// runs here (release and debug), so reaching this means the race
    /// does not happen.
    const MAX_MISSES: u64 = 50_000;
    let path = tmp("race");
    let mut cfg = config(path.clone(), 64 * BLOCK, 2, 2);
    cfg.media_latency_ns = 30_000;
    let x = Expander::open(&cfg).unwrap();
    assert_eq!(x.geometry(), (1, 2), "one 2-way set");
    let base = x.host_addr() as *mut u64;
    let done = AtomicBool::new(false);
    let misses = AtomicU64::new(0);
    let stores = AtomicU64::new(0);
    let lost = AtomicU64::new(0);
    std::thread::scope(|s| {
        let (x, done, misses, stores, lost) = (&x, &done, &misses, &stores, &lost);
        s.spawn(move || {
            let mut b = 0;
            let mut seen = u64::MAX;
            while !done.load(Ordering::Acquire) {
                // One miss per step of the writer's progress: a writer
                // waiting for the set lock is not starved by our faults.
                let now = stores.load(Ordering::Acquire);
                if now == seen {
                    std::hint::spin_loop();
                    continue;
                }
                seen = now;
                touch(x, (16 + b % 16) * BLOCK);
                misses.fetch_add(1, Ordering::Release);
                b += 1;
            }
        });
        let base = base as usize;
        s.spawn(move || {
            let slot = |n: u64| (base as *mut u64).wrapping_add((n % SLOTS) as usize);
            let mut n = 0u64;
            loop {
                let want = if n >= SLOTS { n - SLOTS + 1 } else { 0 };
                // SAFETY: inside the DPA mapping; faults are served.
                let got = unsafe { std::ptr::read_volatile(slot(n)) };
                if got != want {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
                // SAFETY: as above.
                unsafe { std::ptr::write_volatile(slot(n), n + 1) };
                n += 1;
                if n.is_multiple_of(256) {
                    stores.store(n, Ordering::Release);
                    // Every slot written at least once before a normal end.
                    let enough = n >= SLOTS
                        && (x.counters().raced_evictions >= TARGET_RACES
                            || misses.load(Ordering::Acquire) >= MAX_MISSES);
                    if enough || lost.load(Ordering::Relaxed) > 0 {
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            done.store(true, Ordering::Release);
        });
        // Hang guard: abort if neither thread moves for the watchdog's span.
        let mut last = (0, 0);
        let mut since = std::time::Instant::now();
        while !done.load(Ordering::Acquire) {
            let now = (
                stores.load(Ordering::Acquire),
                misses.load(Ordering::Acquire),
            );
            if now != last {
                last = now;
                since = std::time::Instant::now();
            } else if since.elapsed() > WATCHDOG {
                eprintln!("hang guard: no store and no miss for {WATCHDOG:?} ({now:?})");
                std::process::abort();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    });
    let (st, c) = (x.stats(), x.counters());
    let n = stores.load(Ordering::Acquire);
    eprintln!(
        "raced evictions: {} after {} reader misses, {n} stores; {st:?}",
        c.raced_evictions,
        misses.load(Ordering::Acquire)
    );
    let lost = lost.load(Ordering::Relaxed);
    assert_eq!(lost, 0, "stores lost under eviction ({st:?})");
    assert!(
        c.raced_evictions >= TARGET_RACES,
        "the race was not driven: {} raced evictions in {} reader misses ({st:?})",
        c.raced_evictions,
        misses.load(Ordering::Acquire)
    );
    // The final contents: each slot holds its last store (n >= SLOTS here).
    for k in 0..SLOTS {
        let last = (n - 1 - (n - 1 + SLOTS - k) % SLOTS) + 1;
        assert_eq!(peek(&x, k * 8, 8), last.to_le_bytes(), "slot {k}");
    }
    drop(x);
    let _ = std::fs::remove_file(&path);
}

/// Key changes drain ranges while host threads keep faulting and writing
/// elsewhere: nothing deadlocks and every write is kept.
#[test]
fn key_changes_under_concurrent_writers() {
    const BLOCKS: u64 = 256;
    let path = tmp("rekey");
    let x = Expander::open(&config(path.clone(), BLOCKS * BLOCK, 32, 8)).unwrap();
    x.set_range_key(1, 0, 128 * BLOCK, &KEY256).unwrap();
    let finished = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        let (x, finished) = (&x, &finished);
        for t in 0..2u64 {
            s.spawn(move || {
                // Writers stay in blocks 0..128 (keyed, never re-keyed).
                for r in 0..4u64 {
                    for b in 0..128u64 {
                        let v = (r << 32) | (t << 16) | b;
                        poke(x, b * BLOCK + t * 8, &v.to_le_bytes());
                    }
                }
                finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
        }
        s.spawn(move || {
            // Re-key blocks 128..256 over and over, with host writes in between.
            let mut i = 0u16;
            while i < 3 || (finished.load(std::sync::atomic::Ordering::Relaxed) < 2 && i < 1000) {
                x.set_range_key(2, 128 * BLOCK, 256 * BLOCK, &KEY256)
                    .unwrap();
                x.write(200 * BLOCK, &[i as u8; 16]).unwrap();
                x.clear_range_key(2).unwrap();
                i += 1;
            }
        });
    });
    for b in 0..128u64 {
        for t in 0..2u64 {
            let want = (3u64 << 32) | (t << 16) | b;
            assert_eq!(
                peek(&x, b * BLOCK + t * 8, 8),
                want.to_le_bytes(),
                "block {b}"
            );
        }
    }
    x.shutdown().unwrap();
    drop(x);
    let _ = std::fs::remove_file(&path);
}

/// `persist` makes exactly the covered writes durable; a drop without
/// `shutdown` loses the rest (as a VMM crash would) and counts as dirty.
#[test]
fn persist_covers_its_range_and_a_drop_does_not_flush() {
    let path = tmp("persist");
    let cfg = config(path.clone(), 1 << 20, 64, 8);
    let x = Expander::open(&cfg).unwrap();
    let m = CxlMedium::new(x.clone());
    m.write(BLOCK + 10, b"persisted-A").unwrap();
    m.write(10 * BLOCK + 10, b"volatile-B").unwrap();
    m.persist(BLOCK, BLOCK).unwrap();
    let raw = std::fs::read(&path).unwrap();
    assert_eq!(count(&raw, b"persisted-A"), 1);
    assert_eq!(count(&raw, b"volatile-B"), 0);
    assert!(m.persist(1 << 20, 1).is_err());
    drop(m);
    drop(x);
    let x = Expander::open(&cfg).unwrap();
    assert_eq!(x.dirty_shutdown_count(), 1);
    let mut a = [0u8; 11];
    x.read(BLOCK + 10, &mut a).unwrap();
    assert_eq!(&a, b"persisted-A");
    let mut b = [0u8; 10];
    x.read(10 * BLOCK + 10, &mut b).unwrap();
    assert_eq!(b, [0u8; 10]);
    drop(x);
    let _ = std::fs::remove_file(&path);
}

/// An extent is keyed for its owner: announced again for the same owner it stays as keyed;
/// announced for another owner (a later PMO in the same slot and place) it gets that owner's
/// key and reads the earlier owner's bytes only as ciphertext; `extent_encrypted` holds only
/// for the owner it is keyed for. A second medium over the same expander knows no owner and
/// keys afresh (with the same key for the same owner, so the bytes stay readable).
#[test]
fn extents_are_keyed_for_their_owner() {
    use pmo_media::{Extent, ExtentKeys};
    let path = tmp("owner");
    let x = Expander::open(&config(path.clone(), 4 << 20, 64, 8)).unwrap();
    let keyed = || {
        CxlMedium::new(x.clone()).with_extent_keys(std::sync::Arc::new(|e: &Extent| {
            Some(zeroize::Zeroizing::new(vec![e.owner[0]; 64]))
        }))
    };
    let m = keyed();
    let owned = |owner: u8| Extent {
        slot: 3,
        off: 1 << 20,
        len: 1 << 20,
        owner: [owner; 32],
    };
    let data = [0x5au8; 64];
    let read = |m: &CxlMedium| {
        let mut b = [0u8; 64];
        m.read((1 << 20) + 4096, &mut b).unwrap();
        b
    };
    m.extent_in_use(&owned(1)).unwrap();
    m.write((1 << 20) + 4096, &data).unwrap();
    m.persist(1 << 20, 1 << 20).unwrap();
    assert!(m.extent_encrypted(&owned(1)));
    assert!(!m.extent_encrypted(&owned(2)), "keyed for owner 1 only");
    m.extent_in_use(&owned(1)).unwrap();
    assert_eq!(read(&m), data, "announced again: as keyed");
    m.extent_in_use(&owned(2)).unwrap();
    assert!(m.extent_encrypted(&owned(2)) && !m.extent_encrypted(&owned(1)));
    assert_ne!(read(&m), data, "another owner's key reads ciphertext");
    m.extent_in_use(&owned(1)).unwrap();
    assert_eq!(read(&m), data);
    let fresh = keyed();
    assert!(
        !fresh.extent_encrypted(&owned(1)),
        "a new medium knows no owner"
    );
    fresh.extent_in_use(&owned(1)).unwrap();
    assert!(fresh.extent_encrypted(&owned(1)));
    assert_eq!(read(&fresh), data);
    fresh.extent_released(3).unwrap();
    assert!(!fresh.extent_encrypted(&owned(1)));
    assert_eq!(x.range_key(3), None);
    drop((m, fresh));
    drop(x);
    let _ = std::fs::remove_file(&path);
}
