//! The device DRAM cache as a pure model: which 4 KiB blocks are resident,
//! which are dirty, and what a miss evicts. No I/O happens here, so the
//! replacement policy can be tested against hand-made traces and measured in
//! benches on its own; the [`crate::expander`] drives it and does the I/O.
//!
//! Policy (seed 003, CMM-H): set-associative, `block % sets` picks the set,
//! LRU replacement with MRU insertion, write-back with a dirty bit per block.

/// Cache block (and DPA page) size.
pub const BLOCK: u64 = 4096;

/// Default associativity.
pub const DEFAULT_WAYS: usize = 8;

/// Errors of the cache geometry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheError {
    /// `ways` was 0: a set needs at least one way.
    #[error("associativity must be at least 1")]
    ZeroWays,
    /// The cache size is smaller than one set (`ways` blocks of 4 KiB), so
    /// it would have no sets at all.
    #[error("cache of {bytes} bytes holds no full set of {ways} 4 KiB blocks")]
    TooSmall {
        /// Requested cache size in bytes.
        bytes: u64,
        /// Requested associativity.
        ways: usize,
    },
    /// The cache size is not a whole number of 4 KiB blocks.
    #[error("cache of {0} bytes is not a multiple of 4 KiB")]
    Unaligned(u64),
    /// The number of line slots (sets times ways) does not fit in `usize`
    /// on this host.
    #[error("cache of {0} bytes is too large for this host")]
    TooLarge(u64),
}

/// Outcome of one access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The block was resident.
    Hit,
    /// The block was filled; `victim` is the block it displaced and whether
    /// that block was dirty (and so must be written back first).
    Miss {
        /// `(block, dirty)` of the evicted line; `None` when the set still
        /// had a free way and nothing was evicted.
        victim: Option<(u64, bool)>,
    },
}

/// Counters of the cache, host-readable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Accesses that found their block resident.
    pub hits: u64,
    /// Accesses that did not.
    pub misses: u64,
    /// Blocks brought in from media (one per miss).
    pub fills: u64,
    /// Dirty blocks written to media (at eviction, flush or drain).
    pub writebacks: u64,
    /// Blocks displaced by a fill.
    pub evictions: u64,
}

impl CacheStats {
    /// Hits over counted accesses; 0 when nothing was counted.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// One way of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Line {
    block: u64,
    dirty: bool,
}

/// The cache model. Each set is a slice of `ways` slots kept in recency
/// order (slot 0 is most recently used); a set with `n` valid lines keeps
/// them in slots `0..n`.
#[derive(Debug, Clone)]
pub struct CacheModel {
    sets: u64,
    ways: usize,
    lines: Vec<Option<Line>>,
    stats: CacheStats,
}

impl CacheModel {
    /// A cache of `bytes` (a multiple of 4 KiB) with `ways`-way sets; blocks
    /// that do not fill a whole set are left unused.
    pub fn new(bytes: u64, ways: usize) -> Result<Self, CacheError> {
        if ways == 0 {
            return Err(CacheError::ZeroWays);
        }
        if !bytes.is_multiple_of(BLOCK) {
            return Err(CacheError::Unaligned(bytes));
        }
        let sets = bytes / BLOCK / ways as u64;
        if sets == 0 {
            return Err(CacheError::TooSmall { bytes, ways });
        }
        let slots = usize::try_from(sets)
            .ok()
            .and_then(|s| s.checked_mul(ways))
            .ok_or(CacheError::TooLarge(bytes))?;
        Ok(Self {
            sets,
            ways,
            lines: vec![None; slots],
            stats: CacheStats::default(),
        })
    }

    /// Number of sets.
    pub fn sets(&self) -> u64 {
        self.sets
    }

    /// Associativity.
    pub fn ways(&self) -> usize {
        self.ways
    }

    /// Blocks the cache can hold.
    pub fn capacity(&self) -> u64 {
        self.sets * self.ways as u64
    }

    /// The set a block maps to.
    pub fn set_of(&self, block: u64) -> u64 {
        block % self.sets
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    fn set_slice(&self, set: u64) -> &[Option<Line>] {
        let a = set as usize * self.ways;
        &self.lines[a..a + self.ways]
    }

    fn set_slice_mut(&mut self, set: u64) -> &mut [Option<Line>] {
        let a = set as usize * self.ways;
        let w = self.ways;
        &mut self.lines[a..a + w]
    }

    fn position(&self, block: u64) -> Option<usize> {
        self.set_slice(self.set_of(block))
            .iter()
            .position(|l| l.is_some_and(|l| l.block == block))
    }

    /// Accesses a block: a hit moves it to MRU (and dirties it on a write);
    /// a miss inserts it at MRU, displacing the LRU line of a full set.
    pub fn access(&mut self, block: u64, write: bool) -> Access {
        let set = self.set_of(block);
        if let Some(i) = self.position(block) {
            self.stats.hits += 1;
            let s = self.set_slice_mut(set);
            if let Some(l) = s[i].as_mut() {
                l.dirty |= write;
            }
            s[..=i].rotate_right(1);
            return Access::Hit;
        }
        self.stats.misses += 1;
        self.stats.fills += 1;
        let ways = self.ways;
        let s = self.set_slice_mut(set);
        let victim = s[ways - 1].map(|l| (l.block, l.dirty));
        s.rotate_right(1);
        s[0] = Some(Line {
            block,
            dirty: write,
        });
        if let Some((_, dirty)) = victim {
            self.stats.evictions += 1;
            if dirty {
                self.stats.writebacks += 1;
            }
        }
        Access::Miss { victim }
    }

    /// What a miss on `block` would displace right now (nothing if `block`
    /// is resident or its set has a free way). Changes nothing.
    pub fn peek_victim(&self, block: u64) -> Option<(u64, bool)> {
        if self.position(block).is_some() {
            return None;
        }
        self.set_slice(self.set_of(block))[self.ways - 1].map(|l| (l.block, l.dirty))
    }

    /// `Some(dirty)` if the block is resident. Changes nothing (no LRU
    /// update, no counting).
    pub fn lookup(&self, block: u64) -> Option<bool> {
        let i = self.position(block)?;
        self.set_slice(self.set_of(block))[i].map(|l| l.dirty)
    }

    /// Marks a resident block dirty without touching recency or counters
    /// (a write seen through write protection); false if it is not resident.
    pub fn set_dirty(&mut self, block: u64) -> bool {
        let Some(i) = self.position(block) else {
            return false;
        };
        let set = self.set_of(block);
        match self.set_slice_mut(set)[i].as_mut() {
            Some(l) => {
                l.dirty = true;
                true
            }
            None => false,
        }
    }

    /// Sets a resident block's dirty bit to `dirty` without counting
    /// anything; returns the old bit, `None` if the block is not resident.
    pub fn swap_dirty(&mut self, block: u64, dirty: bool) -> Option<bool> {
        let i = self.position(block)?;
        let set = self.set_of(block);
        self.set_slice_mut(set)[i]
            .as_mut()
            .map(|l| std::mem::replace(&mut l.dirty, dirty))
    }

    /// Marks a resident block clean after its write-back; returns whether it
    /// was dirty (and counts that write-back).
    pub fn clean(&mut self, block: u64) -> bool {
        let Some(i) = self.position(block) else {
            return false;
        };
        let set = self.set_of(block);
        let was = match self.set_slice_mut(set)[i].as_mut() {
            Some(l) => std::mem::replace(&mut l.dirty, false),
            None => false,
        };
        if was {
            self.stats.writebacks += 1;
        }
        was
    }

    /// Drops a resident block (after the caller wrote it back if needed);
    /// returns whether it was dirty. Not counted as an eviction.
    pub fn remove(&mut self, block: u64) -> Option<bool> {
        let i = self.position(block)?;
        let set = self.set_of(block);
        let s = self.set_slice_mut(set);
        let dirty = s[i].map(|l| l.dirty);
        s[i] = None;
        // Keep valid lines packed at the front in recency order.
        s[i..].rotate_left(1);
        dirty
    }

    /// Resident blocks of one set with their dirty bits, MRU first.
    pub fn set_lines(&self, set: u64) -> Vec<(u64, bool)> {
        if set >= self.sets {
            return Vec::new();
        }
        self.set_slice(set)
            .iter()
            .flatten()
            .map(|l| (l.block, l.dirty))
            .collect()
    }

    /// Every dirty block, in set order.
    pub fn dirty_blocks(&self) -> Vec<u64> {
        self.lines
            .iter()
            .flatten()
            .filter(|l| l.dirty)
            .map(|l| l.block)
            .collect()
    }

    /// Number of resident blocks.
    pub fn resident(&self) -> u64 {
        self.lines.iter().flatten().count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn miss(v: Option<(u64, bool)>) -> Access {
        Access::Miss { victim: v }
    }

    #[test]
    fn geometry_is_validated() {
        assert_eq!(
            CacheModel::new(4096 * 8, 0).unwrap_err(),
            CacheError::ZeroWays
        );
        assert_eq!(
            CacheModel::new(4096 * 7, 8).unwrap_err(),
            CacheError::TooSmall {
                bytes: 4096 * 7,
                ways: 8
            }
        );
        assert_eq!(
            CacheModel::new(100, 1).unwrap_err(),
            CacheError::Unaligned(100)
        );
        let c = CacheModel::new(4096 * 8 * 16, 8).unwrap();
        assert_eq!((c.sets(), c.ways(), c.capacity()), (16, 8, 128));
        // A partial set's worth of bytes is unused.
        let c = CacheModel::new(4096 * 20, 8).unwrap();
        assert_eq!(c.sets(), 2);
    }

    #[test]
    fn set_mapping_is_block_modulo_sets() {
        let mut c = CacheModel::new(4096 * 2 * 4, 2).unwrap(); // 4 sets, 2 ways
        assert_eq!(c.set_of(0), 0);
        assert_eq!(c.set_of(5), 1);
        assert_eq!(c.set_of(7), 3);
        // Three blocks of set 1 evict within set 1 only; set 0 is untouched.
        assert_eq!(c.access(0, false), miss(None));
        assert_eq!(c.access(1, false), miss(None));
        assert_eq!(c.access(5, false), miss(None));
        assert_eq!(c.access(9, false), miss(Some((1, false))));
        assert_eq!(c.set_lines(1), vec![(9, false), (5, false)]);
        assert_eq!(c.set_lines(0), vec![(0, false)]);
        assert_eq!(c.access(0, false), Access::Hit);
    }

    /// A recorded trace on one 4-way set: exact hit/miss and victim order.
    #[test]
    fn lru_with_mru_insertion_trace() {
        let mut c = CacheModel::new(4096 * 4, 4).unwrap(); // 1 set, 4 ways
        let trace: [(u64, bool, Access); 12] = [
            (1, false, miss(None)),
            (2, false, miss(None)),
            (3, false, miss(None)),
            (4, false, miss(None)),
            (1, false, Access::Hit), // order now 1 4 3 2
            (5, false, miss(Some((2, false)))),
            (3, false, Access::Hit), // 3 5 1 4
            (6, false, miss(Some((4, false)))),
            (7, false, miss(Some((1, false)))),
            (5, false, Access::Hit), // 5 7 6 3
            (8, false, miss(Some((3, false)))),
            (1, false, miss(Some((6, false)))),
        ];
        for (i, (b, w, want)) in trace.into_iter().enumerate() {
            assert_eq!(c.access(b, w), want, "step {i} block {b}");
        }
        assert_eq!(
            c.set_lines(0),
            vec![(1, false), (8, false), (5, false), (7, false)]
        );
        assert_eq!(
            c.stats(),
            CacheStats {
                hits: 3,
                misses: 9,
                fills: 9,
                writebacks: 0,
                evictions: 5
            }
        );
        assert!((c.stats().hit_rate() - 3.0 / 12.0).abs() < 1e-12);
    }

    #[test]
    fn only_written_blocks_are_written_back() {
        let mut c = CacheModel::new(4096 * 2, 2).unwrap(); // 1 set, 2 ways
        assert_eq!(c.access(10, true), miss(None));
        assert_eq!(c.access(11, false), miss(None));
        assert_eq!(c.access(11, false), Access::Hit); // 11 10
        assert_eq!(c.access(12, false), miss(Some((10, true))));
        assert_eq!(c.access(13, false), miss(Some((11, false))));
        // A read hit keeps a block clean, a write hit dirties it.
        assert_eq!(c.access(12, false), Access::Hit); // 12 13
        assert_eq!(c.access(13, true), Access::Hit); // 13 12
        assert_eq!(c.access(14, false), miss(Some((12, false))));
        assert_eq!(c.access(15, false), miss(Some((13, true))));
        assert_eq!(c.stats().writebacks, 2);
        assert_eq!(c.stats().evictions, 4);
    }

    #[test]
    fn dirty_marking_cleaning_and_removal() {
        let mut c = CacheModel::new(4096 * 4, 2).unwrap(); // 2 sets
        c.access(0, false);
        c.access(2, false);
        c.access(1, false);
        assert_eq!(c.lookup(0), Some(false));
        assert_eq!(c.lookup(4), None);
        // set_dirty does not move the block: 0 stays LRU of set 0.
        assert!(c.set_dirty(0));
        assert!(!c.set_dirty(4));
        assert_eq!(c.dirty_blocks(), vec![0]);
        assert_eq!(c.swap_dirty(0, false), Some(true));
        assert_eq!(c.swap_dirty(0, true), Some(false));
        assert_eq!(c.swap_dirty(4, true), None);
        assert_eq!(c.peek_victim(4), Some((0, true)));
        assert_eq!(c.peek_victim(2), None);
        assert_eq!(c.peek_victim(3), None); // set 1 has a free way
        let before = c.stats();
        assert!(c.clean(0));
        assert!(!c.clean(0));
        assert_eq!(c.stats().writebacks, before.writebacks + 1);
        assert_eq!(c.remove(2), Some(false));
        assert_eq!(c.remove(2), None);
        assert_eq!(c.set_lines(0), vec![(0, false)]);
        assert_eq!(c.resident(), 2);
        // The freed way is used before anything is evicted.
        assert_eq!(c.access(4, true), miss(None));
        assert_eq!(c.access(6, false), miss(Some((0, false))));
    }

    #[test]
    fn sequential_scan_larger_than_cache_never_hits() {
        let mut c = CacheModel::new(4096 * 64, 8).unwrap();
        for _ in 0..3 {
            for b in 0..65 * 8 {
                c.access(b, false);
            }
        }
        assert_eq!(c.stats().hits, 0);
        // A loop that fits hits on every pass after the first.
        let mut c = CacheModel::new(4096 * 64, 8).unwrap();
        for _ in 0..3 {
            for b in 0..64 {
                c.access(b, false);
            }
        }
        assert_eq!(c.stats().hits, 128);
        assert_eq!(c.stats().misses, 64);
    }
}
