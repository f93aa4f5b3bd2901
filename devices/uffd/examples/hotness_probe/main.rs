//! `hotness_probe`: how well can a userfaultfd pager learn which of its resident pages are hot?
//!
//! A window of anonymous memory is registered with a [`Uffd`] (missing and write-protect faults,
//! as the PMO window is) and filled with `UFFDIO_COPY`. Toucher threads run a GUPS-style loop
//! (a share of the accesses to a hot set of pages, uniform inside the hot and the cold set, each
//! access a load and a store of one 8-byte word). One access-information source runs at a time
//! and its idea of "hot" is scored against the true hot set, page by page:
//!
//! - `damon`: a kdamond of the DAMON sysfs interface on this process (`vaddr`/`fvaddr`), results
//!   read through a `stat` scheme's `tried_regions`;
//! - `page_idle`: `/sys/kernel/mm/page_idle/bitmap` over the PFNs from `/proc/self/pagemap`;
//! - `refault`: every period, drop a sample of pages (`MADV_DONTNEED`) and time their re-fault;
//! - `wp`: every period, write-protect a sample (`UFFDIO_WRITEPROTECT`) and time the first write;
//! - `none`: nothing (the baseline).
//!
//! Rounds alternate `none` and the source, so the toucher throughput ratio is measured in one
//! run. `--help` lists the options; `docs/hotness.md` has results and what they mean.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uffd::{AnonMap, Fault, FaultHandler, FaultServer, Install, Uffd, Watch, PAGE_SIZE};

mod args;
mod damon;
mod page_idle;
mod sampling;
mod workload;

use args::*;
use damon::*;
use page_idle::*;
use sampling::*;
use workload::*;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

const PAGE: usize = PAGE_SIZE as usize;
const WORDS_PER_PAGE: usize = PAGE / 8;
/// A sample's result for a page nobody touched before its period ended.
const NOT_TOUCHED: u64 = u64::MAX;
/// In [`Probe::armed`]: the page was touched; the other bits are ns from arming to the touch.
const TOUCHED: u64 = 1 << 63;
/// Samples of a page kept for the vote.
const HISTORY: usize = 3;
/// Accesses between two updates of a toucher's counter.
const BATCH: u64 = 4096;
/// Precision and recall at which the hot set counts as identified.
const IDENTIFIED: f64 = 0.9;

/// Set by SIGINT/SIGTERM: loops end, the DAMON guard turns the kdamond off.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

const USAGE: &str = "\
usage: hotness_probe [options]
  --source none|damon|page_idle|refault|wp   access-information source (default none)
  --pages N             window size in 4 KiB pages (16384 = 64 MiB)
  --threads T           toucher threads (1)
  --hot-layout contiguous|scattered           where the hot pages are (contiguous)
  --hot-pct P           hot set, % of the pages (10)
  --hot-access-pct P    % of the accesses that go to the hot set (90)
  --write-pct P         % of the accesses that also store (100; 0 = loads only)
  --rounds R            none/source round pairs (3)
  --phase-secs S        length of each phase (3)
  --warmup-secs S       touching before the first round (0.5)
  --seed X              workload seed (1)
  --fault-threads F     userfaultfd server threads (1)
 refault, wp, page_idle:
  --period-ms M         sampling period (10)
  --sample S            pages dropped / write-protected per period (256)
 damon:
  --damon-ops fvaddr|vaddr   operations set (fvaddr: the window only, kept fixed)
  --damon-sample-us U   sampling interval (1000)
  --damon-aggr-us U     aggregation interval (50000)
  --damon-update-us U   operations update interval (1000000)
  --damon-regions MIN,MAX|page   region count bounds (10,1000; page = pages,pages)
  --damon-poll-ms M     how often tried_regions is read (250)
  --damon-root DIR      DAMON sysfs admin directory (/sys/kernel/mm/damon/admin)
exit status: 0 measured, 1 error, 2 the source is unavailable on this kernel";

/// What one round measured.
struct Round {
    none_rate: f64,
    source_rate: Option<f64>,
    tracker: Option<Tracker>,
    costs: Vec<Cost>,
}

fn min_med_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, f64::NAN, f64::NAN),
        n => (v[0], v[n / 2], v[n - 1]),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hotness_probe: error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<ExitCode> {
    let Some(args) = parse_args()? else {
        return Ok(ExitCode::SUCCESS);
    };
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler) };
    }
    let cmdline: Vec<String> = std::env::args().collect();
    println!("# {}", cmdline.join(" "));

    let pages = args.pages;
    let len = pages * PAGE;
    let map = AnonMap::new(len)?;
    let uffd = Arc::new(Uffd::new()?);
    uffd.register(map.addr(), len as u64)?;
    let base = map.addr();

    // The source's own state, made before any touching so an unavailable one costs nothing.
    let mut damon = None;
    let mut page_idle = None;
    match args.source {
        Source::Damon => match Damon::create(&args.damon, base, base + len as u64)? {
            Ok(d) => damon = Some(d),
            Err(Unavailable(why)) => {
                println!("source damon: UNAVAILABLE: {why}");
                return Ok(ExitCode::from(2));
            }
        },
        Source::PageIdle => match PageIdle::open()? {
            Ok(p) => page_idle = Some(p),
            Err(Unavailable(why)) => {
                println!("source page_idle: UNAVAILABLE: {why}");
                return Ok(ExitCode::from(2));
            }
        },
        _ => {}
    }

    let probe = Arc::new(Probe {
        uffd: Arc::clone(&uffd),
        map,
        epoch: Instant::now(),
        armed: (0..pages).map(|_| AtomicU64::new(0)).collect(),
        missing_faults: AtomicU64::new(0),
        missing_ns: AtomicU64::new(0),
        wp_faults: AtomicU64::new(0),
        wp_ns: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        server: FaultServer::new()?,
    });
    probe.server.start(
        threads::ThreadKind::PmoFault,
        "probe-uffd",
        &uffd,
        Arc::downgrade(&probe),
        args.fault_threads,
    )?;

    // Fill the window as a pager would before the guest runs: UFFDIO_COPY, 256 pages a call.
    let chunk = vec![0x3cu8; 256 * PAGE];
    let t = Instant::now();
    let mut p = 0;
    while p < pages {
        let n = (pages - p).min(256);
        uffd.install(probe.addr(p), &chunk[..n * PAGE], false)?;
        p += n;
    }
    let fill = t.elapsed();

    let mut rng = Rng(args.seed);
    let hot_pages = ((pages as f64 * args.hot_pct / 100.0).round() as usize).clamp(1, pages - 1);
    let set = hot_set(pages, hot_pages, args.layout, &mut rng);
    println!(
        "window {pages} pages ({} MiB) filled by UFFDIO_COPY in {:.1} ms ({:.2} us/page); \
         hot set {hot_pages} pages {:?}, {}% of accesses, {}% stores; {} toucher thread(s); \
         {} rounds x {:.1} s per phase",
        len >> 20,
        fill.as_secs_f64() * 1e3,
        fill.as_secs_f64() * 1e6 / pages as f64,
        args.layout,
        args.hot_access_pct,
        args.write_pct,
        args.threads,
        args.rounds,
        args.phase.as_secs_f64(),
    );

    let stop = AtomicBool::new(false);
    let counters: Vec<AtomicU64> = (0..args.threads).map(|_| AtomicU64::new(0)).collect();
    let hot_per_1024 = (args.hot_access_pct / 100.0 * 1024.0).round() as u64;
    let write_per_128 = (args.write_pct / 100.0 * 128.0).round() as u64;
    let mut sweep = Sweep {
        order: (0..pages).collect(),
        next: pages,
        rng: Rng(args.seed ^ 0x5eed),
    };

    let rounds = std::thread::scope(|s| -> Result<Vec<Round>> {
        for (i, done) in counters.iter().enumerate() {
            let (set, stop) = (&set, &stop);
            std::thread::Builder::new()
                .name(format!("touch{i}"))
                .spawn_scoped(s, move || {
                    toucher(
                        base,
                        set,
                        hot_per_1024,
                        write_per_128,
                        args.seed + i as u64 * 7919,
                        stop,
                        done,
                    )
                })?;
        }
        let measure = (|| -> Result<Vec<Round>> {
            sleep_until(Instant::now() + args.warmup)?;
            let mut rounds = Vec::new();
            for _ in 0..args.rounds {
                let (c, t) = (accesses(&counters), Instant::now());
                sleep_until(t + args.phase)?;
                let none_rate = (accesses(&counters) - c) as f64 / t.elapsed().as_secs_f64();
                let mut round = Round {
                    none_rate,
                    source_rate: None,
                    tracker: None,
                    costs: Vec::new(),
                };
                if args.source != Source::None {
                    let (c, t) = (accesses(&counters), Instant::now());
                    let end = t + args.phase;
                    let (tr, costs) = match (&damon, &page_idle) {
                        (Some(d), _) => damon_phase(d, &args.damon, base, &set, end)?,
                        (_, Some(pi)) => page_idle_phase(pi, base, &set, args.period, end)?,
                        _ => sampling_phase(&probe, &args, &set, &mut sweep, end)?,
                    };
                    round.source_rate =
                        Some((accesses(&counters) - c) as f64 / t.elapsed().as_secs_f64());
                    round.tracker = Some(tr);
                    round.costs = costs;
                }
                rounds.push(round);
            }
            Ok(rounds)
        })();
        stop.store(true, Ordering::Relaxed);
        measure
    })?;
    drop(damon);

    report(&args, &rounds);
    let errors = probe.errors.load(Ordering::Relaxed);
    if errors != 0 {
        return Err(format!("{errors} fault(s) could not be served").into());
    }
    Ok(ExitCode::SUCCESS)
}

fn report(args: &Args, rounds: &[Round]) {
    let src = args.source.name();
    println!();
    if args.source == Source::None {
        println!("| round | none Macc/s |");
        println!("|---|---|");
        for (i, r) in rounds.iter().enumerate() {
            println!("| {} | {:.2} |", i + 1, r.none_rate / 1e6);
        }
        let (a, b, c) = min_med_max(rounds.iter().map(|r| r.none_rate).collect());
        println!(
            "| min/med/max | {:.2} / {:.2} / {:.2} |",
            a / 1e6,
            b / 1e6,
            c / 1e6
        );
        return;
    }
    println!("| round | none Macc/s | {src} Macc/s | ratio |");
    println!("|---|---|---|---|");
    let mut ratios = Vec::new();
    for (i, r) in rounds.iter().enumerate() {
        let (s, ratio) = match r.source_rate {
            Some(s) => {
                ratios.push(s / r.none_rate);
                (format!("{:.2}", s / 1e6), format!("{:.3}", s / r.none_rate))
            }
            None => ("-".into(), "-".into()),
        };
        println!("| {} | {:.2} | {s} | {ratio} |", i + 1, r.none_rate / 1e6);
    }
    let fmt = |(a, b, c): (f64, f64, f64), scale: f64| {
        format!("{:.3} / {:.3} / {:.3}", a / scale, b / scale, c / scale)
    };
    println!(
        "| min/med/max | {} | {} | {} |",
        fmt(
            min_med_max(rounds.iter().map(|r| r.none_rate).collect()),
            1e6
        ),
        fmt(
            min_med_max(rounds.iter().filter_map(|r| r.source_rate).collect()),
            1e6
        ),
        fmt(min_med_max(ratios), 1.0),
    );
    let trackers: Vec<&Tracker> = rounds.iter().filter_map(|r| r.tracker.as_ref()).collect();
    let Some(first) = trackers.first() else {
        return;
    };
    println!();
    let heads: Vec<String> = (1..=trackers.len()).map(|i| format!("r{i} P/R")).collect();
    let found: Vec<String> = (1..=trackers.len())
        .map(|i| format!("r{i} found (s)"))
        .collect();
    println!(
        "| classification (hot if ...) | {} | {} |",
        heads.join(" | "),
        found.join(" | ")
    );
    println!("|---|{}", "---|".repeat(2 * trackers.len()));
    for (i, label) in first.labels.iter().enumerate() {
        let pr: Vec<String> = trackers
            .iter()
            .map(|t| format!("{:.2}/{:.2}", t.last[i].0, t.last[i].1))
            .collect();
        let at: Vec<String> = trackers
            .iter()
            .map(|t| t.found[i].map_or("-".into(), |s| format!("{s:.2}")))
            .collect();
        println!("| {label} | {} | {} |", pr.join(" | "), at.join(" | "));
    }
    let evals: Vec<String> = trackers.iter().map(|t| t.evaluations.to_string()).collect();
    println!(
        "(P/R: precision/recall at the phase's last evaluation; found: first evaluation with both \
         >= {IDENTIFIED}, seconds after the source started; evaluations per round: {})",
        evals.join(", ")
    );
    println!();
    println!(
        "| cost | {} |",
        (1..=rounds.len())
            .map(|i| format!("r{i}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(rounds.len()));
    for (i, c) in rounds[0].costs.iter().enumerate() {
        let vals: Vec<String> = rounds
            .iter()
            .map(|r| {
                r.costs
                    .get(i)
                    .map_or("-".into(), |c| format!("{:.2}", c.value))
            })
            .collect();
        println!("| {} | {} |", c.name, vals.join(" | "));
    }
}
