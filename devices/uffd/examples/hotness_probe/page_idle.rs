//! Idle page tracking: `/sys/kernel/mm/page_idle/bitmap` over the window's PFNs.

use super::*;

/// Idle page tracking over the window's PFNs.
pub(super) struct PageIdle {
    pub(super) bitmap: File,
    pub(super) pagemap: File,
}

impl PageIdle {
    pub(super) const BITMAP: &'static str = "/sys/kernel/mm/page_idle/bitmap";

    pub(super) fn open() -> Result<std::result::Result<PageIdle, Unavailable>> {
        let bitmap = match fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(Self::BITMAP)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let config = kernel_config(&["CONFIG_IDLE_PAGE_TRACKING"]);
                return Ok(Err(Unavailable(format!(
                    "{} does not exist (kernel config: {})",
                    Self::BITMAP,
                    config.join(", ")
                ))));
            }
            Err(e) => return Err(format!("open {}: {e}", Self::BITMAP).into()),
        };
        let pagemap = File::open("/proc/self/pagemap")?;
        Ok(Ok(PageIdle { bitmap, pagemap }))
    }

    /// The PFN of each page of `[base, base + pages * 4 KiB)`, 0 for a page not present.
    pub(super) fn pfns(&self, base: u64, pages: usize) -> Result<Vec<u64>> {
        let mut raw = vec![0u8; pages * 8];
        self.pagemap.read_exact_at(&mut raw, base / PAGE_SIZE * 8)?;
        let pfns: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                let e = u64::from_ne_bytes(b);
                if e >> 63 == 1 {
                    e & ((1 << 55) - 1)
                } else {
                    0
                }
            })
            .collect();
        if pfns.iter().all(|&p| p == 0) {
            return Err("pagemap shows no PFNs (not present, or no CAP_SYS_ADMIN)".into());
        }
        Ok(pfns)
    }

    /// Marks the pages idle: one write per run of nearby bitmap words (zero bits are ignored).
    pub(super) fn mark_idle(&self, pfns: &[u64]) -> Result<()> {
        for (first, words) in bitmap_runs(pfns) {
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
            self.bitmap.write_all_at(&bytes, first * 8)?;
        }
        Ok(())
    }

    /// Per PFN, whether it is still idle.
    pub(super) fn still_idle(&self, pfns: &[u64]) -> Result<Vec<bool>> {
        let mut words = BTreeMap::new();
        for (first, run) in bitmap_runs(pfns) {
            let mut bytes = vec![0u8; run.len() * 8];
            self.bitmap.read_exact_at(&mut bytes, first * 8)?;
            for (i, c) in bytes.chunks_exact(8).enumerate() {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                words.insert(first + i as u64, u64::from_ne_bytes(b));
            }
        }
        Ok(pfns
            .iter()
            .map(|&pfn| {
                pfn != 0
                    && words
                        .get(&(pfn / 64))
                        .is_some_and(|w| w >> (pfn % 64) & 1 == 1)
            })
            .collect())
    }
}

/// The bitmap words holding `pfns` (0 = none), as runs `(first word, words)` with our bits set;
/// words less than 64 apart share a run.
pub(super) fn bitmap_runs(pfns: &[u64]) -> Vec<(u64, Vec<u64>)> {
    let mut words: BTreeMap<u64, u64> = BTreeMap::new();
    for &pfn in pfns.iter().filter(|&&p| p != 0) {
        *words.entry(pfn / 64).or_default() |= 1 << (pfn % 64);
    }
    let mut runs: Vec<(u64, Vec<u64>)> = Vec::new();
    for (w, mask) in words {
        match runs.last_mut() {
            Some((first, run)) if w - (*first + run.len() as u64) < 64 => {
                run.resize((w - *first) as usize, 0);
                run.push(mask);
            }
            _ => runs.push((w, vec![mask])),
        }
    }
    runs
}

/// One `page_idle` phase: mark the window idle, wait a period, read which pages were accessed.
pub(super) fn page_idle_phase(
    pi: &PageIdle,
    base: u64,
    set: &HotSet,
    period: Duration,
    end: Instant,
) -> Result<(Tracker, Vec<Cost>)> {
    let mut tr = Tracker::new(vec![format!(
        "accessed in period ({} ms)",
        period.as_secs_f64() * 1e3
    )]);
    let start = Instant::now();
    let (mut work_ns, mut periods) = (0u64, 0u64);
    while Instant::now() + period <= end {
        let t = Instant::now();
        let pfns = pi.pfns(base, set.is_hot.len())?;
        pi.mark_idle(&pfns)?;
        work_ns += t.elapsed().as_nanos() as u64;
        sleep_until(t + period)?;
        let t2 = Instant::now();
        let idle = pi.still_idle(&pfns)?;
        work_ns += t2.elapsed().as_nanos() as u64;
        periods += 1;
        let at = start.elapsed().as_secs_f64();
        tr.record(
            0,
            at,
            precision_recall(&set.is_hot, |p| pfns[p] != 0 && !idle[p]),
        );
        tr.evaluations += 1;
    }
    let costs = vec![
        cost("periods", periods as f64),
        cost(
            "pagemap + bitmap work ms/period",
            work_ns as f64 / periods.max(1) as f64 / 1e6,
        ),
    ];
    Ok((tr, costs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_runs_cover_each_pfn_once() {
        let pfns = [0, 5, 6, 64 * 10 + 1, 64 * 500, 64 * 500 + 63];
        let runs = bitmap_runs(&pfns);
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0].0, 0);
        assert_eq!(runs[0].1.len(), 11);
        assert_eq!(runs[0].1[0], (1 << 5) | (1 << 6));
        assert_eq!(runs[0].1[10], 1 << 1);
        assert_eq!(runs[1], (500, vec![1 | (1 << 63)]));
    }
}
