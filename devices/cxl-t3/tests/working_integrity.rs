//! Media integrity of working extents: a keyless editor of the media file (outside the trust
//! boundary; the device cache is inside it) who flips bits in a block of a live working
//! extent, puts an older ciphertext of it back, or writes bytes where the extent never wrote
//! back anything, is refused at the next fill of that block: it reads as zeros, through the
//! mapping and the host path, and the refusal is counted. Blocks outside working extents are
//! not checked. Host threads stand in for vCPUs by touching the uffd-backed DPA space
//! directly; the cache is tiny, so blocks really leave it and are filled from the media again.

// Helpers outside `#[test]` functions unwrap too.
#![allow(clippy::unwrap_used)]

mod common;
use common::*;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use cxl_t3::cache::BLOCK;
use cxl_t3::expander::Expander;
use cxl_t3::media::HEADER_LEN;
use cxl_t3::WorkingExtent;

const P: u64 = BLOCK;

/// A page of bytes that differs from page to page and from version to version.
fn pattern(page: u64, version: u8) -> Vec<u8> {
    (0..P)
        .map(|i| (page * 31 + i * 7 + (i >> 8)) as u8 ^ version.wrapping_mul(0x5b))
        .collect()
}

/// Copies one page of the extent out through the mapping, as a guest's loads would, and
/// checks that it was a fill (the block was not in the device cache).
fn peek_filled(x: &Expander, e: &WorkingExtent, page: u64) -> Vec<u8> {
    let fills = x.stats().fills;
    let v = peek(e, page * P, P as usize);
    assert_eq!(
        x.stats().fills,
        fills + 1,
        "page {page} should have been filled from the media"
    );
    v
}

/// Evicts every block of the cache (one pass over each set with fresh blocks).
fn evict_all(x: &Expander, fresh: &mut u64) {
    let (sets, _) = x.geometry();
    for s in 0..sets {
        evict_set_of(x, s, fresh);
    }
}

/// The media file's bytes of DPA block at `dpa`, as the editor reads them.
fn media_block(media: &Path, dpa: u64) -> Vec<u8> {
    let f = OpenOptions::new().read(true).open(media).unwrap();
    let mut b = vec![0u8; P as usize];
    f.read_exact_at(&mut b, HEADER_LEN + dpa).unwrap();
    b
}

/// The keyless editor writes `bytes` at `dpa` of the media file while the expander holds it
/// (its lock is advisory; the expander reads blocks with `pread`, so the next fill sees it).
fn edit_media(media: &Path, dpa: u64, bytes: &[u8]) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(media)
        .unwrap();
    f.write_all_at(bytes, HEADER_LEN + dpa).unwrap();
}

fn failures(x: &Expander) -> u64 {
    x.counters().working_integrity_failures
}

/// Pages written through the mapping and evicted (so written back under the extent's key):
/// one byte flipped in one of them on the media reads as a zero page, the others read back
/// as written, and exactly that fill is counted. A store to the refused page then works as
/// on any page, and its next write-back and fill are accepted.
#[test]
fn a_flipped_bit_in_a_written_back_block_is_refused() {
    let (x, area, media) = setup("flip", 2, 2);
    let e = area.alloc(8 * P).unwrap();
    let mut fresh = 0u64;
    for p in 0..8 {
        poke(&e, p * P, &pattern(p, 1));
    }
    let wb = x.stats().writebacks;
    evict_all(&x, &mut fresh);
    assert!(x.stats().writebacks >= wb + 4, "the dirty blocks left");
    for p in 0..8 {
        let raw = media_block(&media, e.dpa() + p * P);
        assert!(raw.iter().any(|&b| b != 0), "page {p} was written back");
        assert_ne!(raw, pattern(p, 1), "page {p} is ciphertext on the media");
    }
    assert_eq!((e.integrity_failures(), e.first_failed_page()), (0, None));

    let victim = 5u64;
    let at = e.dpa() + victim * P + 1234;
    let mut byte = media_block(&media, at - 1234)[1234];
    byte ^= 0x10;
    edit_media(&media, at, &[byte]);

    for p in 0..8 {
        let got = peek_filled(&x, &e, p);
        if p == victim {
            assert_eq!(got, vec![0u8; P as usize], "the edited page reads as zeros");
        } else {
            assert_eq!(got, pattern(p, 1), "page {p} reads back");
        }
    }
    assert_eq!(e.integrity_failures(), 1);
    assert_eq!(e.first_failed_page(), Some(victim));
    assert_eq!(failures(&x), 1);

    // The guest goes on: a store to the refused page, written back and filled again, reads
    // back and is accepted.
    poke(&e, victim * P, &pattern(victim, 2));
    evict_all(&x, &mut fresh);
    assert_eq!(peek_filled(&x, &e, victim), pattern(victim, 2));
    assert_eq!(e.integrity_failures(), 1);
    assert_eq!(e.first_failed_page(), Some(victim));
    drop(e);
    done(x, area, media);
}

/// A block written back with v1, then with v2: the editor puts the v1 ciphertext back (same
/// key, same DPA, so it would decrypt to v1). The fill is refused (zeros, counted), never v1;
/// so is the all-zero block put back over a written one (a rollback to "never written").
#[test]
fn a_block_rolled_back_to_an_older_write_back_is_refused() {
    let (x, area, media) = setup("rollback", 2, 2);
    let e = area.alloc(4 * P).unwrap();
    let blk = |page: u64| e.dpa() / BLOCK + page;
    let dpa = |page: u64| e.dpa() + page * P;
    let mut fresh = 0u64;

    poke(&e, P, &pattern(1, 1));
    let wb = x.stats().writebacks;
    evict_set_of(&x, blk(1), &mut fresh);
    assert!(x.stats().writebacks > wb, "v1 was written back");
    let v1 = media_block(&media, dpa(1));
    assert!(v1.iter().any(|&b| b != 0));
    // v1 is accepted as long as it is the last write-back.
    assert_eq!(peek_filled(&x, &e, 1), pattern(1, 1));

    poke(&e, P, &pattern(1, 2));
    let wb = x.stats().writebacks;
    evict_set_of(&x, blk(1), &mut fresh);
    assert!(x.stats().writebacks > wb, "v2 was written back");
    let v2 = media_block(&media, dpa(1));
    assert_ne!(v1, v2);

    edit_media(&media, dpa(1), &v1);
    let got = peek_filled(&x, &e, 1);
    assert_ne!(got, pattern(1, 1), "the rolled-back v1 must never be read");
    assert_eq!(got, vec![0u8; P as usize]);
    assert_eq!(
        (e.integrity_failures(), e.first_failed_page()),
        (1, Some(1))
    );
    assert_eq!(failures(&x), 1);

    // v2 put back: accepted again (the refused fill left the block clean, so its eviction
    // wrote nothing over the media).
    evict_set_of(&x, blk(1), &mut fresh);
    edit_media(&media, dpa(1), &v2);
    assert_eq!(peek_filled(&x, &e, 1), pattern(1, 2));
    assert_eq!(e.integrity_failures(), 1);

    // Written back through flush (persist), then evicted clean: the digest is the flush's.
    poke(&e, 2 * P, &pattern(2, 1));
    x.persist(dpa(2), P).unwrap();
    let old = media_block(&media, dpa(2));
    poke(&e, 2 * P, &pattern(2, 2));
    x.flush().unwrap();
    let wb = x.stats().writebacks;
    evict_set_of(&x, blk(2), &mut fresh);
    assert_eq!(x.stats().writebacks, wb, "page 2 left clean");
    assert_eq!(peek_filled(&x, &e, 2), pattern(2, 2));
    evict_set_of(&x, blk(2), &mut fresh);
    edit_media(&media, dpa(2), &old);
    assert_eq!(peek_filled(&x, &e, 2), vec![0u8; P as usize]);
    assert_eq!(e.integrity_failures(), 2);

    // Rolled back to the never-written state.
    evict_set_of(&x, blk(1), &mut fresh);
    edit_media(&media, dpa(1), &[0u8; P as usize]);
    assert_eq!(peek_filled(&x, &e, 1), vec![0u8; P as usize]);
    assert_eq!(e.integrity_failures(), 3);
    assert_eq!(e.first_failed_page(), Some(1), "the first failure stays");
    assert_eq!(failures(&x), 3);
    drop(e);
    done(x, area, media);
}

/// Blocks of the extent never written back must be the all-zero block: bytes the editor put
/// there (after a clean block left the cache, or before the first touch) are refused, while
/// untouched blocks read as zeros with no failure.
#[test]
fn bytes_where_nothing_was_written_back_are_refused() {
    let (x, area, media) = setup("foreign", 2, 2);
    let e = area.alloc(8 * P).unwrap();
    let blk = |page: u64| e.dpa() / BLOCK + page;
    let dpa = |page: u64| e.dpa() + page * P;
    let mut fresh = 0u64;
    let zeros = vec![0u8; P as usize];

    // Page 2 filled clean (zeros) and evicted without a write-back.
    assert_eq!(peek_filled(&x, &e, 2), zeros);
    let wb = x.stats().writebacks;
    evict_set_of(&x, blk(2), &mut fresh);
    assert_eq!(
        x.stats().writebacks,
        wb,
        "a clean block is not written back"
    );
    let garbage: Vec<u8> = (0..P).map(|i| (i * 13 + 1) as u8).collect();
    edit_media(&media, dpa(2), &garbage);
    // Page 4 never touched at all.
    edit_media(&media, dpa(4), &garbage[..100]);

    assert_eq!(peek_filled(&x, &e, 2), zeros);
    assert_eq!(
        (e.integrity_failures(), e.first_failed_page()),
        (1, Some(2))
    );
    assert_eq!(peek_filled(&x, &e, 4), zeros);
    assert_eq!(e.integrity_failures(), 2);
    // Untouched, never written: zeros and no failure.
    for p in [0u64, 6, 7] {
        assert_eq!(peek_filled(&x, &e, p), zeros, "page {p}");
    }
    assert_eq!(e.integrity_failures(), 2);
    assert_eq!(e.first_failed_page(), Some(2));
    assert_eq!(failures(&x), 2);
    drop(e);
    done(x, area, media);
}

/// The host path (`WorkingExtent::read`, as a psync copies written pages out) fills through
/// the same check; a partial host-path write into a refused block keeps zeros around its
/// bytes. A whole-page host-path write uses nothing of the media, so it is not checked: an
/// area holding a crashed run's ciphertext is written over at attach without an alarm.
#[test]
fn host_path_fills_are_checked_and_whole_page_writes_are_not() {
    let (x, area, media) = setup("host", 2, 2);
    // A crashed run's leftovers over the first pages of the area.
    let leftover: Vec<u8> = (0..P).map(|i| (i * 5 + 3) as u8).collect();
    for p in 0..4 {
        edit_media(&media, MIB + p * P, &leftover);
    }
    let e = area.alloc(8 * P).unwrap();
    assert_eq!(e.dpa(), MIB);
    let dpa = |page: u64| e.dpa() + page * P;
    let mut fresh = 0u64;
    // Whole pages over pages 0..3: no failure, the data reads back after eviction.
    for p in 0..3 {
        e.write(p * P, &pattern(p, 1)).unwrap();
    }
    assert_eq!(
        e.integrity_failures(),
        0,
        "whole-page writes are not checked"
    );
    // Page 3's leftover: a partial host write fills it, refused, so the rest is zeros.
    e.write(3 * P + 10, b"partial").unwrap();
    assert_eq!(
        (e.integrity_failures(), e.first_failed_page()),
        (1, Some(3))
    );
    let mut want3 = vec![0u8; P as usize];
    want3[10..17].copy_from_slice(b"partial");
    evict_all(&x, &mut fresh);
    let mut b = vec![0u8; P as usize];
    for p in 0..3 {
        e.read(p * P, &mut b).unwrap();
        assert_eq!(b, pattern(p, 1), "page {p}");
    }
    e.read(3 * P, &mut b).unwrap();
    assert_eq!(b, want3);
    assert_eq!(e.integrity_failures(), 1);

    // Written through the mapping, evicted, edited: the host path's fill reads zeros.
    poke(&e, 5 * P, &pattern(5, 1));
    evict_all(&x, &mut fresh);
    let mut raw = media_block(&media, dpa(5));
    raw[4095] ^= 1;
    edit_media(&media, dpa(5), &raw);
    let fills = x.stats().fills;
    e.read(5 * P, &mut b).unwrap();
    assert_eq!(x.stats().fills, fills + 1);
    assert_eq!(b, vec![0u8; P as usize]);
    assert_eq!(e.integrity_failures(), 2);
    assert_eq!(e.first_failed_page(), Some(3));
    assert_eq!(failures(&x), 2);
    drop(e);
    done(x, area, media);
}

/// Outside working extents nothing changes: a keyed range (a PMO extent of the store) and an
/// unkeyed region (the store's metadata) are filled with whatever the media holds, unchecked
/// and uncounted, while an extent is live. Those pages belong to the PMO store, whose pages
/// carry their own keyed tags (checked by the store at every read), and whose records carry
/// their MACs.
#[test]
fn media_edits_outside_working_extents_are_not_checked() {
    let (x, area, media) = setup("untracked", 2, 2);
    let e = area.alloc(4 * P).unwrap();
    poke(&e, 0, &pattern(0, 1));
    let mut fresh = 64u64;
    x.set_range_key(1, 0, 32 * P, &[7u8; 64]).unwrap();
    let (keyed, plain) = (8 * P, 200 * P);
    x.write(keyed, &pattern(8, 1)).unwrap();
    x.write(plain, &pattern(200, 1)).unwrap();
    x.flush().unwrap();
    evict_all(&x, &mut fresh);
    assert!(
        fresh < 200,
        "the eviction stayed clear of the unkeyed block"
    );

    let mut raw = media_block(&media, keyed);
    assert_ne!(raw, pattern(8, 1), "keyed on the media");
    raw[0] ^= 0x80;
    edit_media(&media, keyed, &raw);
    edit_media(&media, plain + 16, b"EDITED");

    let fills = x.stats().fills;
    let mut b = vec![0u8; P as usize];
    x.read(keyed, &mut b).unwrap();
    assert_ne!(b, pattern(8, 1), "the edit decrypts to other bytes");
    assert_ne!(b, vec![0u8; P as usize], "and is not refused");
    x.read(plain, &mut b).unwrap();
    let mut want = pattern(200, 1);
    want[16..22].copy_from_slice(b"EDITED");
    assert_eq!(b, want, "the unkeyed edit reads as written");
    // A block never written, outside any extent, with bytes on it: read as they are.
    edit_media(&media, 300 * P, b"NOT-CHECKED");
    x.read(300 * P, &mut b[..11]).unwrap();
    assert_eq!(&b[..11], b"NOT-CHECKED");
    assert_eq!(x.stats().fills, fills + 3);
    assert_eq!(failures(&x), 0);
    assert_eq!(e.integrity_failures(), 0);
    // The extent itself is fine.
    assert_eq!(peek(&e, 0, P as usize), pattern(0, 1));
    assert_eq!(e.integrity_failures(), 0);
    drop(e);
    done(x, area, media);
}

/// Without an editor there is never an alarm: stores, takes, host writes, flushes and
/// persists over four times the cache, with blocks evicted dirty and clean, written back and
/// filled again many times, and an extent dropped and made again over the same run.
#[test]
fn no_false_alarm_under_churn() {
    let (x, area, media) = setup("churn", 2, 2);
    for round in 0..2u8 {
        let e = area.alloc(16 * P).unwrap();
        let mut want: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; P as usize]).collect();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(round);
        for i in 0..600u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let p = rng % 16;
            let off = (rng >> 8) % (P - 8);
            let v = (i as u8).wrapping_add(round);
            match (rng >> 40) % 8 {
                0 => e.write(p * P + off, &[v; 8]).unwrap(),
                1 => {
                    let mut b = [0u8; 8];
                    e.read(p * P + off, &mut b).unwrap();
                    assert_eq!(&b[..], &want[p as usize][off as usize..off as usize + 8]);
                    continue;
                }
                2 => {
                    e.take_written().unwrap();
                    continue;
                }
                3 if i % 50 == 0 => {
                    x.persist(e.dpa(), e.len()).unwrap();
                    continue;
                }
                4 => {
                    assert_eq!(
                        peek(&e, p * P + off, 8),
                        &want[p as usize][off as usize..off as usize + 8]
                    );
                    continue;
                }
                _ => poke(&e, p * P + off, &[v; 8]),
            }
            want[p as usize][off as usize..off as usize + 8].copy_from_slice(&[v; 8]);
        }
        for p in 0..16 {
            assert_eq!(peek(&e, p * P, P as usize), want[p as usize], "page {p}");
        }
        assert!(x.stats().evictions > 100 && x.stats().writebacks > 50);
        assert_eq!(e.integrity_failures(), 0);
        assert_eq!(e.first_failed_page(), None);
        // Zeroed on the media (every block written back before): read as zeros, no alarm.
        x.flush().unwrap();
        x.zero(e.dpa(), e.len()).unwrap();
        for p in 0..16 {
            assert_eq!(
                peek(&e, p * P, P as usize),
                vec![0u8; P as usize],
                "page {p}"
            );
        }
        assert_eq!(e.integrity_failures(), 0);
        drop(e);
    }
    assert_eq!(failures(&x), 0);
    done(x, area, media);
}
