//! DAMON through its sysfs interface: a kdamond on this process, read through a `stat`
//! scheme's tried regions, turned off again by a guard.

use super::*;

/// One region of DAMON's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Region {
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) nr_accesses: u64,
    pub(super) age: u64,
}

/// Per page of the window at `base`, the `nr_accesses` of the region holding its first byte
/// (0 outside every region).
pub(super) fn page_scores(regions: &[Region], base: u64, pages: usize) -> Vec<u64> {
    let mut score = vec![0; pages];
    let end = base + (pages * PAGE) as u64;
    for r in regions {
        if r.end <= base || r.start >= end || r.start >= r.end {
            continue;
        }
        let first = (r.start.max(base) - base).div_ceil(PAGE_SIZE) as usize;
        let last = (r.end.min(end) - base).div_ceil(PAGE_SIZE) as usize;
        for s in &mut score[first.min(pages)..last.min(pages)] {
            *s = r.nr_accesses;
        }
    }
    score
}

/// Reads a DAMON sysfs file, trimmed.
pub(super) fn get(path: &Path) -> Result<String> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("read {}: {e}", path.display()).into())
}

/// Writes a DAMON sysfs file.
pub(super) fn put(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|e| format!("write '{value}' to {}: {e}", path.display()).into())
}

/// The `tried_regions` of a scheme directory: `N/{start,end,nr_accesses,age}`.
pub(super) fn read_regions(dir: &Path) -> Result<Vec<Region>> {
    let mut out = Vec::new();
    let entries = fs::read_dir(dir).map_err(|e| format!("list {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_str().is_none_or(|n| n.parse::<u64>().is_err()) {
            continue;
        }
        let d = entry.path();
        let num = |f: &str| -> Result<u64> {
            let s = get(&d.join(f))?;
            s.parse::<u64>()
                .map_err(|_| format!("{}/{f}: not a number: {s}", d.display()).into())
        };
        out.push(Region {
            start: num("start")?,
            end: num("end")?,
            nr_accesses: num("nr_accesses")?,
            age: num("age")?,
        });
    }
    out.sort_by_key(|r| r.start);
    Ok(out)
}

/// The lines of the running kernel's configuration that name `opts` (from `/proc/config.gz`
/// or `/boot/config-<release>`), for messages.
pub(super) fn kernel_config(opts: &[&str]) -> Vec<String> {
    let text = std::process::Command::new("zcat")
        .arg("/proc/config.gz")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .or_else(|| {
            let release = fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
            fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()
        });
    let Some(text) = text else {
        return vec!["(kernel config not readable)".into()];
    };
    text.lines()
        .filter(|l| {
            opts.iter().any(|o| {
                l.strip_prefix(o).is_some_and(|r| r.starts_with('='))
                    || l.strip_prefix("# ")
                        .and_then(|r| r.strip_prefix(o))
                        .is_some_and(|r| r.starts_with(' '))
            })
        })
        .map(String::from)
        .collect()
}

/// Why a source cannot run here.
pub(super) struct Unavailable(pub(super) String);

/// One kdamond this process created through the DAMON sysfs interface. Dropping it turns the
/// kdamond off and removes it (`nr_kdamonds` = 0), so nothing stays behind on error paths.
pub(super) struct Damon {
    pub(super) admin: PathBuf,
    pub(super) kd: PathBuf,
}

impl Damon {
    /// Creates and configures (does not start) a kdamond monitoring `[start, end)` of this
    /// process. Refuses to touch a DAMON sysfs tree that already has kdamonds: writing
    /// `nr_kdamonds` fails while any of them runs, and otherwise removes them all with their
    /// configuration.
    pub(super) fn create(
        a: &DamonArgs,
        start: u64,
        end: u64,
    ) -> Result<std::result::Result<Damon, Unavailable>> {
        let admin = a.root.clone();
        let nr_path = admin.join("kdamonds/nr_kdamonds");
        let unavailable = |why: String| {
            let config =
                kernel_config(&["CONFIG_DAMON", "CONFIG_DAMON_VADDR", "CONFIG_DAMON_SYSFS"]);
            Ok(Err(Unavailable(format!(
                "{why}; kernel config: {}",
                config.join(", ")
            ))))
        };
        if !nr_path.exists() {
            return unavailable(format!("{} does not exist", nr_path.display()));
        }
        let nr: u64 = get(&nr_path)?.parse().unwrap_or(u64::MAX);
        if nr != 0 {
            let mut owners = Vec::new();
            for i in 0..nr.min(8) {
                let kd = admin.join(format!("kdamonds/{i}"));
                let ctx = kd.join("contexts/0");
                owners.push(format!(
                    "kdamond {i}: state {}, pid {}, operations {}, avail_operations {}",
                    get(&kd.join("state")).unwrap_or_else(|_| "?".into()),
                    get(&kd.join("pid")).unwrap_or_else(|_| "?".into()),
                    get(&ctx.join("operations")).unwrap_or_else(|_| "?".into()),
                    get(&ctx.join("avail_operations")).unwrap_or_else(|_| "?".into()),
                ));
            }
            return unavailable(format!(
                "DAMON sysfs already holds {nr} kdamond(s) this probe did not create ({}); \
                 adding one means rewriting nr_kdamonds, which fails (EBUSY) while one runs and \
                 otherwise deletes them all, so the probe leaves them alone",
                owners.join("; ")
            ));
        }
        put(&nr_path, "1")?;
        let d = Damon {
            kd: admin.join("kdamonds/0"),
            admin,
        };
        let ctx = d.kd.join("contexts/0");
        put(&d.kd.join("contexts/nr_contexts"), "1")?;
        let avail = get(&ctx.join("avail_operations"))?;
        if !avail.split_whitespace().any(|o| o == a.ops) {
            return unavailable(format!(
                "operations set {} is not available (avail_operations: {avail})",
                a.ops
            ));
        }
        put(&ctx.join("operations"), &a.ops)?;
        let attrs = ctx.join("monitoring_attrs");
        put(&attrs.join("intervals/sample_us"), &a.sample_us.to_string())?;
        put(&attrs.join("intervals/aggr_us"), &a.aggr_us.to_string())?;
        put(&attrs.join("intervals/update_us"), &a.update_us.to_string())?;
        let pages = (end - start) / PAGE_SIZE;
        let (lo, hi) = a.regions.unwrap_or((pages, pages));
        // Max first: the defaults are 10 and 1000, and a min above the max may be refused.
        put(&attrs.join("nr_regions/max"), &hi.to_string())?;
        put(&attrs.join("nr_regions/min"), &lo.to_string())?;
        put(&ctx.join("targets/nr_targets"), "1")?;
        let target = ctx.join("targets/0");
        put(&target.join("pid_target"), &std::process::id().to_string())?;
        put(&target.join("regions/nr_regions"), "1")?;
        put(&target.join("regions/0/start"), &start.to_string())?;
        put(&target.join("regions/0/end"), &end.to_string())?;
        put(&ctx.join("schemes/nr_schemes"), "1")?;
        let scheme = ctx.join("schemes/0");
        put(&scheme.join("action"), "stat")?;
        // Every region matches: the scheme only exposes the monitoring results (the core keeps
        // the nr_accesses and age bounds as 32-bit counts).
        for (what, max) in [
            ("sz", u64::MAX),
            ("nr_accesses", u32::MAX.into()),
            ("age", u32::MAX.into()),
        ] {
            put(
                &scheme.join(format!("access_pattern/{what}/max")),
                &max.to_string(),
            )?;
            put(&scheme.join(format!("access_pattern/{what}/min")), "0")?;
        }
        Ok(Ok(d))
    }

    pub(super) fn on(&self) -> Result<u32> {
        put(&self.kd.join("state"), "on")?;
        let pid = get(&self.kd.join("pid"))?;
        pid.parse()
            .map_err(|_| format!("kdamond pid: not a number: {pid}").into())
    }

    pub(super) fn off(&self) -> Result<()> {
        put(&self.kd.join("state"), "off")
    }

    pub(super) fn regions(&self) -> Result<Vec<Region>> {
        put(&self.kd.join("state"), "update_schemes_tried_regions")?;
        read_regions(&self.kd.join("contexts/0/schemes/0/tried_regions"))
    }
}

impl Drop for Damon {
    fn drop(&mut self) {
        if get(&self.kd.join("state")).is_ok_and(|s| s == "on") {
            if let Err(e) = self.off() {
                eprintln!("hotness_probe: turning DAMON off: {e}");
            }
        }
        let nr = self.admin.join("kdamonds/nr_kdamonds");
        for _ in 0..100 {
            match put(&nr, "0") {
                Ok(()) => return,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        eprintln!(
            "hotness_probe: could not remove the kdamond: echo off > {}/state; echo 0 > {}",
            self.kd.display(),
            nr.display()
        );
    }
}

/// User plus system CPU seconds of a thread, from `/proc/<pid>/stat`.
pub(super) fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // After the command come state (field 3) ... utime (14) and stime (15).
    let tick = |i: usize| -> Result<u64> {
        fields
            .get(i - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: no field {i}").into())
    };
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Ok((tick(14)? + tick(15)?) as f64 / hz as f64)
}

/// One `damon` phase: start the kdamond, read its results every poll until `end`, stop it.
pub(super) fn damon_phase(
    d: &Damon,
    a: &DamonArgs,
    base: u64,
    set: &HotSet,
    end: Instant,
) -> Result<(Tracker, Vec<Cost>)> {
    let max = (a.aggr_us / a.sample_us).max(1);
    let mut thresholds: Vec<u64> = vec![1, max / 4, max / 2, 3 * max / 4, max];
    thresholds.retain(|&t| t >= 1);
    thresholds.dedup();
    let mut tr = Tracker::new(
        thresholds
            .iter()
            .map(|t| format!("nr_accesses >= {t} (of {max})"))
            .collect(),
    );
    let start = Instant::now();
    let pid = d.on()?;
    // A fresh kdamond starts near 0; the difference also holds for a reused thread.
    let cpu0 = cpu_seconds(pid);
    let mut polls = 0u64;
    let mut poll_ns = 0u64;
    let mut last_regions = 0usize;
    let mut in_window = 0usize;
    let mut cpu = 0.0;
    let outcome = (|| -> Result<()> {
        while Instant::now() + a.poll <= end {
            sleep_until(Instant::now() + a.poll)?;
            let t = Instant::now();
            let regions = d.regions()?;
            poll_ns += t.elapsed().as_nanos() as u64;
            polls += 1;
            last_regions = regions.len();
            let wend = base + set.is_hot.len() as u64 * PAGE_SIZE;
            in_window = regions
                .iter()
                .filter(|r| r.end > base && r.start < wend)
                .count();
            let score = page_scores(&regions, base, set.is_hot.len());
            let at = start.elapsed().as_secs_f64();
            for (i, &th) in thresholds.iter().enumerate() {
                tr.record(i, at, precision_recall(&set.is_hot, |p| score[p] >= th));
            }
            tr.evaluations += 1;
        }
        cpu = cpu_seconds(pid)? - cpu0?;
        Ok(())
    })();
    let off = d.off();
    outcome?;
    off?;
    let secs = start.elapsed().as_secs_f64();
    let costs = vec![
        cost("kdamond CPU %", 100.0 * cpu / secs),
        cost("polls", polls as f64),
        cost(
            "poll (update + read tried_regions) ms",
            poll_ns as f64 / polls.max(1) as f64 / 1e6,
        ),
        cost("regions at last poll", last_regions as f64),
        cost("regions in the window", in_window as f64),
    ];
    Ok((tr, costs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_score_the_pages_whose_first_byte_they_hold() {
        let base = 0x10_0000;
        let r = |s: u64, e: u64, n| Region {
            start: base + s,
            end: base + e,
            nr_accesses: n,
            age: 0,
        };
        // Before the window, across its start, inside, partly over page 3, past its end.
        let regions = [
            Region {
                start: 0,
                end: base,
                nr_accesses: 9,
                age: 0,
            },
            r(0, 2 * PAGE_SIZE, 5),
            r(2 * PAGE_SIZE, 2 * PAGE_SIZE + 100, 7),
            r(2 * PAGE_SIZE + 100, 4 * PAGE_SIZE, 3),
            r(4 * PAGE_SIZE, 100 * PAGE_SIZE, 1),
        ];
        assert_eq!(page_scores(&regions, base, 6), vec![5, 5, 7, 3, 1, 1]);
    }

    #[test]
    fn tried_regions_are_read_from_numbered_directories() {
        let dir = std::env::temp_dir().join(format!("hotness-probe-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for (i, (s, e, n)) in [(8192u64, 12288u64, 4u64), (4096, 8192, 2)]
            .iter()
            .enumerate()
        {
            let d = dir.join(i.to_string());
            fs::create_dir_all(&d).unwrap();
            for (f, v) in [("start", s), ("end", e), ("nr_accesses", n), ("age", &3)] {
                fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        }
        fs::write(dir.join("total_bytes"), "8192\n").unwrap();
        let regions = read_regions(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            regions,
            vec![
                Region {
                    start: 4096,
                    end: 8192,
                    nr_accesses: 2,
                    age: 3
                },
                Region {
                    start: 8192,
                    end: 12288,
                    nr_accesses: 4,
                    age: 3
                },
            ]
        );
    }

    #[test]
    fn own_thread_cpu_time_parses() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(cpu_seconds(tid).unwrap() >= 0.0);
    }
}
