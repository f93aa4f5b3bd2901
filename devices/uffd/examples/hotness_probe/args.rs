//! The command line: which source, what workload, how long.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    None,
    Damon,
    PageIdle,
    Refault,
    Wp,
}

impl Source {
    pub(super) fn name(self) -> &'static str {
        match self {
            Source::None => "none",
            Source::Damon => "damon",
            Source::PageIdle => "page_idle",
            Source::Refault => "refault",
            Source::Wp => "wp",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    Contiguous,
    Scattered,
}

pub(super) struct DamonArgs {
    pub(super) ops: String,
    pub(super) sample_us: u64,
    pub(super) aggr_us: u64,
    pub(super) update_us: u64,
    /// `None`: one region per page of the window.
    pub(super) regions: Option<(u64, u64)>,
    pub(super) poll: Duration,
    pub(super) root: PathBuf,
}

pub(super) struct Args {
    pub(super) source: Source,
    pub(super) pages: usize,
    pub(super) threads: usize,
    pub(super) layout: Layout,
    pub(super) hot_pct: f64,
    pub(super) hot_access_pct: f64,
    pub(super) write_pct: f64,
    pub(super) rounds: usize,
    pub(super) phase: Duration,
    pub(super) warmup: Duration,
    pub(super) seed: u64,
    pub(super) fault_threads: usize,
    pub(super) period: Duration,
    pub(super) sample: usize,
    pub(super) damon: DamonArgs,
}

pub(super) fn parse_args() -> Result<Option<Args>> {
    let mut a = Args {
        source: Source::None,
        pages: 16384,
        threads: 1,
        layout: Layout::Contiguous,
        hot_pct: 10.0,
        hot_access_pct: 90.0,
        write_pct: 100.0,
        rounds: 3,
        phase: Duration::from_secs(3),
        warmup: Duration::from_millis(500),
        seed: 1,
        fault_threads: 1,
        period: Duration::from_millis(10),
        sample: 256,
        damon: DamonArgs {
            ops: "fvaddr".into(),
            sample_us: 1000,
            aggr_us: 50_000,
            update_us: 1_000_000,
            regions: Some((10, 1000)),
            poll: Duration::from_millis(250),
            root: PathBuf::from("/sys/kernel/mm/damon/admin"),
        },
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            return Ok(None);
        }
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        let v = match inline.or_else(|| it.next()) {
            Some(v) => v,
            None => return Err(format!("{key} needs a value\n{USAGE}").into()),
        };
        let num = |v: &str| -> Result<f64> {
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{key}: not a number: {v}").into())
        };
        let int = |v: &str| -> Result<u64> {
            v.parse::<u64>()
                .map_err(|_| format!("{key}: not an integer: {v}").into())
        };
        match key.as_str() {
            "--source" => {
                a.source = match v.as_str() {
                    "none" => Source::None,
                    "damon" => Source::Damon,
                    "page_idle" => Source::PageIdle,
                    "refault" => Source::Refault,
                    "wp" => Source::Wp,
                    _ => return Err(format!("--source: unknown source {v}").into()),
                }
            }
            "--pages" => a.pages = int(&v)? as usize,
            "--threads" => a.threads = int(&v)? as usize,
            "--hot-layout" => {
                a.layout = match v.as_str() {
                    "contiguous" => Layout::Contiguous,
                    "scattered" => Layout::Scattered,
                    _ => return Err(format!("--hot-layout: unknown layout {v}").into()),
                }
            }
            "--hot-pct" => a.hot_pct = num(&v)?,
            "--hot-access-pct" => a.hot_access_pct = num(&v)?,
            "--write-pct" => a.write_pct = num(&v)?,
            "--rounds" => a.rounds = int(&v)? as usize,
            "--phase-secs" => a.phase = Duration::from_secs_f64(num(&v)?),
            "--warmup-secs" => a.warmup = Duration::from_secs_f64(num(&v)?),
            "--seed" => a.seed = int(&v)?,
            "--fault-threads" => a.fault_threads = int(&v)? as usize,
            "--period-ms" => a.period = Duration::from_secs_f64(num(&v)? / 1000.0),
            "--sample" => a.sample = int(&v)? as usize,
            "--damon-ops" => a.damon.ops = v,
            "--damon-sample-us" => a.damon.sample_us = int(&v)?,
            "--damon-aggr-us" => a.damon.aggr_us = int(&v)?,
            "--damon-update-us" => a.damon.update_us = int(&v)?,
            "--damon-regions" => {
                a.damon.regions = if v == "page" {
                    None
                } else {
                    let (lo, hi) = v
                        .split_once(',')
                        .ok_or_else(|| format!("--damon-regions: MIN,MAX or page, not {v}"))?;
                    Some((int(lo)?, int(hi)?))
                }
            }
            "--damon-poll-ms" => a.damon.poll = Duration::from_secs_f64(num(&v)? / 1000.0),
            "--damon-root" => a.damon.root = PathBuf::from(v),
            _ => return Err(format!("unknown option {key}\n{USAGE}").into()),
        }
    }
    if a.pages < 16 || a.pages > (1 << 26) {
        return Err("--pages must be in 16..=2^26".into());
    }
    if a.hot_pct <= 0.0 || a.hot_pct >= 100.0 || a.hot_access_pct > 100.0 || a.write_pct > 100.0 {
        return Err("--hot-pct must be in (0, 100), the other percentages at most 100".into());
    }
    if a.threads == 0 || a.rounds == 0 || a.sample == 0 || a.period.is_zero() {
        return Err("--threads, --rounds, --sample and --period-ms must be positive".into());
    }
    if a.damon.sample_us == 0 || a.damon.aggr_us < a.damon.sample_us {
        return Err("--damon-aggr-us must be at least --damon-sample-us, which is positive".into());
    }
    Ok(Some(a))
}
