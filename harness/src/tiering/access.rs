//! The two access patterns of the tiering evaluation, as page-index generators.

/// Which pages a workload touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// HeMem's GUPS hot set: 90 % of updates go to 10 % of the pages (scattered over the
    /// PMO), uniform inside each set.
    HotSet,
    /// A key-value store with zipfian key popularity (exponent 0.99, YCSB's); ranks scattered
    /// over the pages; one access in ten writes.
    Zipfian,
}

impl Pattern {
    /// Name in reports and on the command line (`crate::cli::tiering` parses it).
    pub fn name(self) -> &'static str {
        match self {
            Pattern::HotSet => "hotset",
            Pattern::Zipfian => "zipfian",
        }
    }
}

/// Deterministic SplitMix64: the same seed gives the same accesses in every variant.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        crate::workloads::splitmix(&mut self.0)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Page indices for one pattern over `npages` pages, with the order that scatters hot pages
/// or popular ranks.
pub struct Pages {
    pattern: Pattern,
    order: Vec<u64>,
    /// Zipfian: cumulative weights of ranks 1..=npages.
    cdf: Vec<f64>,
}

impl Pages {
    /// The generator for `pattern` on `npages` (> 0) pages; `seed` fixes the scattering.
    pub fn new(pattern: Pattern, npages: u64, seed: u64) -> Self {
        let mut rng = Rng(seed);
        let mut order: Vec<u64> = (0..npages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let cdf = match pattern {
            Pattern::HotSet => Vec::new(),
            Pattern::Zipfian => {
                let mut sum = 0.0;
                (1..=npages)
                    .map(|rank| {
                        sum += 1.0 / (rank as f64).powf(0.99);
                        sum
                    })
                    .collect()
            }
        };
        Self {
            pattern,
            order,
            cdf,
        }
    }

    /// The hot set of [`Pattern::HotSet`] (the first tenth of the order).
    pub fn hot_pages(&self) -> usize {
        (self.order.len() / 10).max(1)
    }

    /// One access: (page, whether it writes).
    pub fn next(&self, rng: &mut Rng) -> (u64, bool) {
        let n = self.order.len() as u64;
        match self.pattern {
            Pattern::HotSet => {
                let hot = self.hot_pages() as u64;
                let i = if rng.below(10) < 9 || hot == n {
                    rng.below(hot)
                } else {
                    hot + rng.below(n - hot)
                };
                (self.order[i as usize], true)
            }
            Pattern::Zipfian => {
                let total = self.cdf.last().copied().unwrap_or(1.0);
                let x = (rng.next_u64() as f64 / u64::MAX as f64) * total;
                let rank = self.cdf.partition_point(|&c| c < x).min(n as usize - 1);
                (self.order[rank], rng.below(10) == 0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_set_takes_nine_tenths_of_the_accesses() {
        let pages = Pages::new(Pattern::HotSet, 1000, 1);
        let hot: std::collections::HashSet<u64> = pages.order[..100].iter().copied().collect();
        let mut rng = Rng(2);
        let n = 100_000;
        let in_hot = (0..n)
            .filter(|_| hot.contains(&pages.next(&mut rng).0))
            .count();
        let share = in_hot as f64 / n as f64;
        assert!((0.88..0.92).contains(&share), "{share}");
    }

    #[test]
    fn zipfian_favours_low_ranks_and_writes_a_tenth() {
        let pages = Pages::new(Pattern::Zipfian, 1000, 1);
        let mut rng = Rng(3);
        let n = 100_000;
        let (mut top, mut writes) = (0, 0);
        for _ in 0..n {
            let (p, w) = pages.next(&mut rng);
            assert!(p < 1000);
            top += usize::from(p == pages.order[0]);
            writes += usize::from(w);
        }
        // Rank 1 of 1000 at exponent 0.99 draws about 13 % of the accesses.
        assert!((0.10..0.16).contains(&(top as f64 / n as f64)), "{top}");
        assert!(
            (0.09..0.11).contains(&(writes as f64 / n as f64)),
            "{writes}"
        );
    }
}
