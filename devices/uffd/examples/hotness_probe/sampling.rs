//! Re-fault and write-protect sampling: arm a sample of pages, time their first touch,
//! and score the pages judged hot against the true hot set.

use super::*;

/// The window and its fault server: installs a page on every missing fault, lifts write
/// protection on every write-protect fault, and times the first touch of sampled pages.
pub(super) struct Probe {
    pub(super) uffd: Arc<Uffd>,
    pub(super) map: AnonMap,
    pub(super) epoch: Instant,
    /// Per page, one word the sampler and the fault threads hand over: 0 when not under
    /// sample; when armed, the time the sampler dropped or write-protected it (ns since
    /// `epoch`, at least 1); after the first touch, [`TOUCHED`] | ns from arming to the touch.
    pub(super) armed: Vec<AtomicU64>,
    pub(super) missing_faults: AtomicU64,
    pub(super) missing_ns: AtomicU64,
    pub(super) wp_faults: AtomicU64,
    pub(super) wp_ns: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) server: FaultServer,
}

impl Probe {
    pub(super) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    pub(super) fn addr(&self, page: usize) -> u64 {
        self.map.addr() + (page * PAGE) as u64
    }
}

impl FaultHandler for Probe {
    type Scratch = Vec<u8>;

    fn scratch(&self) -> Vec<u8> {
        vec![0x5a; PAGE]
    }

    fn handle(&self, f: Fault, buf: &mut Vec<u8>, _watch: &mut Watch<'_>) {
        let t0 = Instant::now();
        let page = ((f.address - self.map.addr()) / PAGE_SIZE) as usize;
        if let Some(armed) = self.armed.get(page) {
            let now = self.now_ns();
            // Only the first touch of an armed page counts; a fault on a page not (or no
            // longer) under sample leaves the word alone.
            let _ = armed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                (v != 0 && v & TOUCHED == 0).then(|| TOUCHED | now.saturating_sub(v).max(1))
            });
        }
        if f.wp {
            if let Err(e) = self.uffd.write_protect(f.address, PAGE_SIZE, false) {
                eprintln!("hotness_probe: unprotect {:#x}: {e}", f.address);
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            self.wp_faults.fetch_add(1, Ordering::Relaxed);
            self.wp_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        } else {
            match self.uffd.install(f.address, buf, false) {
                Ok(Install::Done) | Ok(Install::AlreadyThere) => {}
                Err(e) => {
                    eprintln!("hotness_probe: install {:#x}: {e}", f.address);
                    self.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            self.missing_faults.fetch_add(1, Ordering::Relaxed);
            self.missing_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// Precision and recall of `predicted` against the true hot set.
pub(super) fn precision_recall(is_hot: &[bool], predicted: impl Fn(usize) -> bool) -> (f64, f64) {
    let (mut tp, mut fp, mut fneg) = (0u64, 0u64, 0u64);
    for (p, &hot) in is_hot.iter().enumerate() {
        match (predicted(p), hot) {
            (true, true) => tp += 1,
            (true, false) => fp += 1,
            (false, true) => fneg += 1,
            (false, false) => {}
        }
    }
    let ratio = |a: u64, b: u64| {
        if a + b == 0 {
            0.0
        } else {
            a as f64 / (a + b) as f64
        }
    };
    (ratio(tp, fp), ratio(tp, fneg))
}

/// The classifications of one phase: the latest precision/recall of each, and when each first
/// reached [`IDENTIFIED`] (seconds since the source started).
pub(super) struct Tracker {
    pub(super) labels: Vec<String>,
    pub(super) last: Vec<(f64, f64)>,
    pub(super) found: Vec<Option<f64>>,
    pub(super) evaluations: u64,
}

impl Tracker {
    pub(super) fn new(labels: Vec<String>) -> Self {
        let n = labels.len();
        Tracker {
            labels,
            last: vec![(0.0, 0.0); n],
            found: vec![None; n],
            evaluations: 0,
        }
    }

    pub(super) fn record(&mut self, i: usize, at: f64, pr: (f64, f64)) {
        self.last[i] = pr;
        if self.found[i].is_none() && pr.0 >= IDENTIFIED && pr.1 >= IDENTIFIED {
            self.found[i] = Some(at);
        }
    }
}

/// A cost figure of one source phase.
pub(super) struct Cost {
    pub(super) name: String,
    pub(super) value: f64,
}

pub(super) fn cost(name: &str, value: f64) -> Cost {
    Cost {
        name: name.into(),
        value,
    }
}

/// Sleeps until `deadline`, waking early on a signal.
pub(super) fn sleep_until(deadline: Instant) -> Result<()> {
    loop {
        if INTERRUPTED.load(Ordering::Relaxed) {
            return Err("interrupted".into());
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(());
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
    }
}

/// Every page once, in a random order, then again in a new order.
pub(super) struct Sweep {
    pub(super) order: Vec<usize>,
    pub(super) next: usize,
    pub(super) rng: Rng,
}

impl Sweep {
    pub(super) fn take(&mut self, n: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n.min(self.order.len()) {
            if self.next == self.order.len() {
                self.rng.shuffle(&mut self.order);
                self.next = 0;
            }
            out.push(self.order[self.next]);
            self.next += 1;
        }
        out
    }
}

pub(super) const DELTAS_US: [u64; 4] = [25, 100, 400, 1600];

/// One `refault` or `wp` phase: sample, wait a period, score; until `end`.
pub(super) fn sampling_phase(
    probe: &Probe,
    args: &Args,
    set: &HotSet,
    sweep: &mut Sweep,
    end: Instant,
) -> Result<(Tracker, Vec<Cost>)> {
    let wp = args.source == Source::Wp;
    let period_ns = args.period.as_nanos() as u64;
    let mut deltas: Vec<u64> = DELTAS_US
        .iter()
        .map(|d| d * 1000)
        .filter(|&d| d < period_ns)
        .collect();
    deltas.push(period_ns);
    let within = |d: u64| {
        if d == period_ns {
            format!("in the period ({} ms)", period_ns as f64 / 1e6)
        } else {
            format!("<= {} us", d / 1000)
        }
    };
    let mut labels: Vec<String> = deltas
        .iter()
        .map(|&d| format!("last sample touched {}", within(d)))
        .collect();
    labels.extend(
        deltas
            .iter()
            .map(|&d| format!("2 of last {HISTORY} samples touched {}", within(d))),
    );
    let mut tr = Tracker::new(labels);
    // Per page, the results of its latest samples, newest first: ns from arming to the first
    // touch, NOT_TOUCHED, or 0 for no sample (yet) in this phase.
    let mut history = vec![[0u64; HISTORY]; set.is_hot.len()];
    let faults0 = (
        probe.missing_faults.load(Ordering::Relaxed),
        probe.missing_ns.load(Ordering::Relaxed),
        probe.wp_faults.load(Ordering::Relaxed),
        probe.wp_ns.load(Ordering::Relaxed),
    );
    let buf = vec![0xa5u8; PAGE];
    let (mut armed, mut arm_ns, mut restored, mut restore_ns, mut periods) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    while Instant::now() + args.period <= end {
        let period_start = Instant::now();
        let batch = sweep.take(args.sample);
        for &p in &batch {
            probe.armed[p].store(probe.now_ns(), Ordering::Release);
            let t = Instant::now();
            if wp {
                probe.uffd.write_protect(probe.addr(p), PAGE_SIZE, true)?;
            } else {
                probe.map.discard(probe.addr(p), PAGE_SIZE)?;
            }
            arm_ns += t.elapsed().as_nanos() as u64;
        }
        armed += batch.len() as u64;
        sleep_until(period_start + args.period)?;
        for &p in &batch {
            let v = probe.armed[p].swap(0, Ordering::AcqRel);
            let result = if v & TOUCHED != 0 {
                v & !TOUCHED
            } else {
                // Untouched: still dropped or protected; put it back as it was.
                let t = Instant::now();
                if wp {
                    probe.uffd.write_protect(probe.addr(p), PAGE_SIZE, false)?;
                } else {
                    probe.uffd.install(probe.addr(p), &buf, false)?;
                }
                restore_ns += t.elapsed().as_nanos() as u64;
                restored += 1;
                NOT_TOUCHED
            };
            let h = &mut history[p];
            h.copy_within(0..HISTORY - 1, 1);
            h[0] = result;
        }
        periods += 1;
        let at = start.elapsed().as_secs_f64();
        let hit = |t: u64, d: u64| t != 0 && t <= d;
        for (i, &d) in deltas.iter().enumerate() {
            let pr = precision_recall(&set.is_hot, |p| hit(history[p][0], d));
            tr.record(i, at, pr);
            let pr = precision_recall(&set.is_hot, |p| {
                history[p].iter().filter(|&&t| hit(t, d)).count() >= 2
            });
            tr.record(deltas.len() + i, at, pr);
        }
        tr.evaluations += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let (mf, mns, wf, wns) = (
        probe.missing_faults.load(Ordering::Relaxed) - faults0.0,
        probe.missing_ns.load(Ordering::Relaxed) - faults0.1,
        probe.wp_faults.load(Ordering::Relaxed) - faults0.2,
        probe.wp_ns.load(Ordering::Relaxed) - faults0.3,
    );
    let per = |ns: u64, n: u64| {
        if n == 0 {
            0.0
        } else {
            ns as f64 / n as f64 / 1000.0
        }
    };
    let (faults, fault_ns) = if wp { (wf, wns) } else { (mf, mns) };
    let verb = if wp { "write-protect" } else { "discard" };
    let costs = vec![
        cost("periods", periods as f64),
        cost("sampled pages/s", armed as f64 / secs),
        cost(&format!("{verb} us/page (sampler)"), per(arm_ns, armed)),
        cost(
            "sampled pages touched in period %",
            100.0 * (armed - restored) as f64 / armed.max(1) as f64,
        ),
        cost("faults/s served", faults as f64 / secs),
        cost(
            if wp {
                "unprotect on fault us (handler)"
            } else {
                "refill on fault us (handler)"
            },
            per(fault_ns, faults),
        ),
        cost(
            if wp {
                "unprotect untouched us/page (sampler)"
            } else {
                "refill untouched us/page (sampler)"
            },
            per(restore_ns, restored),
        ),
    ];
    Ok((tr, costs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_and_recall_count_pages() {
        let hot = [true, true, false, false, false];
        let (p, r) = precision_recall(&hot, |i| i == 0 || i == 2);
        assert_eq!((p, r), (0.5, 0.5));
        assert_eq!(precision_recall(&hot, |_| false), (0.0, 0.0));
        assert_eq!(precision_recall(&hot, |i| i < 2), (1.0, 1.0));
    }

    #[test]
    fn sweep_visits_every_page_before_repeating() {
        let mut s = Sweep {
            order: (0..10).collect(),
            next: 10,
            rng: Rng(3),
        };
        let mut seen: Vec<usize> = s.take(4).into_iter().chain(s.take(6)).collect();
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
    }
}
