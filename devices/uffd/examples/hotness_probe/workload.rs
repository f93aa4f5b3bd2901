//! The GUPS-style touchers and the hot set they favour.

use super::*;

/// splitmix64: small, fast, good enough to spread accesses.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n below 2^32).
    pub(super) fn below(&mut self, n: usize) -> usize {
        (((self.next() >> 32) * n as u64) >> 32) as usize
    }

    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The true hot set.
pub(super) struct HotSet {
    pub(super) is_hot: Vec<bool>,
    pub(super) hot: Vec<u32>,
    pub(super) cold: Vec<u32>,
}

pub(super) fn hot_set(pages: usize, hot_pages: usize, layout: Layout, rng: &mut Rng) -> HotSet {
    let mut is_hot = vec![false; pages];
    match layout {
        // Not at the start of the window, so it is not the edge of DAMON's first region.
        Layout::Contiguous => {
            let start = (pages - hot_pages) / 3;
            is_hot[start..start + hot_pages].fill(true);
        }
        Layout::Scattered => {
            let mut all: Vec<usize> = (0..pages).collect();
            rng.shuffle(&mut all);
            for &p in &all[..hot_pages] {
                is_hot[p] = true;
            }
        }
    }
    let (hot, cold) = (0..pages as u32).partition(|&p| is_hot[p as usize]);
    HotSet { is_hot, hot, cold }
}

/// One toucher thread: GUPS over the window until `stop`, counting its accesses in `done`.
pub(super) fn toucher(
    base: u64,
    set: &HotSet,
    hot_per_1024: u64,
    write_per_128: u64,
    seed: u64,
    stop: &AtomicBool,
    done: &AtomicU64,
) {
    let words = base as *const AtomicU64;
    let mut rng = Rng(seed);
    let mut sink = 0u64;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..BATCH {
            let r = rng.next();
            let list = if (r >> 32) & 1023 < hot_per_1024 {
                &set.hot
            } else {
                &set.cold
            };
            let page = list[(((r & 0xffff_ffff) * list.len() as u64) >> 32) as usize] as usize;
            let word = ((r >> 42) & (WORDS_PER_PAGE as u64 - 1)) as usize;
            // SAFETY: `page` < the window's page count and `word` < words per page, so this is
            // an aligned 8-byte word inside the window, which outlives the touchers (they are
            // joined before it is unmapped). A missing page faults to the fault server, which
            // installs it; the word is only ever accessed atomically by our threads.
            let cell = unsafe { &*words.add(page * WORDS_PER_PAGE + word) };
            let v = cell.load(Ordering::Relaxed);
            if (r >> 51) & 127 < write_per_128 {
                cell.store(v.wrapping_add(1), Ordering::Relaxed);
            } else {
                sink = sink.wrapping_add(v);
            }
        }
        n += BATCH;
        done.store(n, Ordering::Relaxed);
    }
    std::hint::black_box(sink);
}

/// Sum of the touchers' access counters.
pub(super) fn accesses(counters: &[AtomicU64]) -> u64 {
    counters.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}
