//! Real applications on PMOs survive a VMM that is SIGKILLed in the middle of their work.
//!
//! One test host boot, four VMM processes, two stores:
//! 1. "ycsb-run" loads 2000 YCSB records into LMDB whose data file is a PMO
//!    (`ycsb_lmdb --pmo KEYFILE`), then runs workload A with one commit per update and
//!    `--log-commits`, each `COMMIT` line on the console. After the N-th logged commit the guest
//!    says `reached` and the runner SIGKILLs the VMM (`VmSpec::kill_on`).
//! 2. "ycsb-check", a new VMM process on the same store, opens the environment and walks it
//!    (`ycsb_lmdb --check --dump`): every record verifies, and the host compares each field's
//!    version with the commit log (the rule is at [`judge_ycsb`]).
//! 3. "varmail-run" runs Filebench's varmail (`fb_pmo`, one PMO per mail file, 4 threads) with
//!    `--log-psyncs`; after the M-th psync of the run the VMM is SIGKILLed.
//! 4. "varmail-check", a new VMM process, lists and verifies every file
//!    (`fb_pmo --check-only --list`); the host applies the crash rule of
//!    `apps/filebench/README.md` (at [`judge_varmail`]).
//!
//! Then `pmovmm store fsck` of both store files is clean.
//!
//! The logs are exact because the guest writes them to `/dev/kmsg` (see the scenarios
//! `guest/scenarios/{ycsb,varmail}_crash_run`): each line is a printk record that the kernel
//! writes to the serial port before the application's `write(2)` returns, so a line is on the
//! VMM's console before the next transaction or call it precedes begins. A tty would return
//! with the line still in its buffer, and a crash could then lose lines of calls that happened.
//!
//! N, M and the applications' seeds come from one seed, printed on stderr; set
//! `PMO_APPS_CRASH_SEED` to repeat a run's kill points. Kill points follow logged lines, never a
//! clock; what the checks accept does not depend on timing.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use pmo_integration::{run_vms, Env, VmOutcome, VmSpec};

/// Each store holds one application's PMOs: LMDB's 16 MiB map, or up to 20 mail files of
/// 100 KiB each.
const STORE_SIZE: u64 = 64 << 20;
/// YCSB records loaded before the run.
const RECORDS: u64 = 2000;
/// Fields of a YCSB record.
const FIELDS: usize = 10;
/// varmail's files.
const MAIL_FILES: u64 = 20;
/// Operations asked for: far more than run before the kill, so both runs are cut by it.
const RUN_OPS: u64 = 100_000;

/// The kill points and application seeds of one run, from one seed.
#[derive(Debug, Clone, Copy)]
struct Plan {
    seed: u64,
    ycsb_seed: u64,
    ycsb_kill_after: u64,
    fb_seed: u64,
    fb_kill_after: u64,
}

/// splitmix64: the next value of the sequence at `state`.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Plan {
    fn from_seed(seed: u64) -> Plan {
        let mut s = seed;
        let mut pick = |lo: u64, hi: u64| lo + splitmix64(&mut s) % (hi - lo + 1);
        Plan {
            seed,
            ycsb_seed: pick(1, 1_000_000),
            ycsb_kill_after: pick(20, 300),
            fb_seed: pick(1, 1_000_000),
            fb_kill_after: pick(5, 150),
        }
    }

    /// `PMO_APPS_CRASH_SEED`, else one from the clock and the process id.
    fn choose() -> Plan {
        let seed = match std::env::var("PMO_APPS_CRASH_SEED") {
            Ok(v) => v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("PMO_APPS_CRASH_SEED={v:?} is not a number")),
            Err(_) => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                let mut s = nanos ^ u64::from(std::process::id()).rotate_left(32);
                splitmix64(&mut s)
            }
        };
        Plan::from_seed(seed)
    }

    fn describe(&self) -> String {
        format!(
            "seed {} (PMO_APPS_CRASH_SEED={} repeats it): YCSB seed {}, kill after {} logged \
             commits; varmail seed {}, kill after {} psyncs of the run",
            self.seed,
            self.seed,
            self.ycsb_seed,
            self.ycsb_kill_after,
            self.fb_seed,
            self.fb_kill_after
        )
    }
}

struct Group {
    plan: Plan,
    vms: Vec<VmOutcome>,
    ycsb_store: PathBuf,
    fb_store: PathBuf,
}

const YCSB_RUN: usize = 0;
const YCSB_CHECK: usize = 1;
const FB_RUN: usize = 2;
const FB_CHECK: usize = 3;

fn group() -> &'static Group {
    static GROUP: OnceLock<Result<Group, String>> = OnceLock::new();
    let g = GROUP.get_or_init(|| {
        let plan = Plan::choose();
        eprintln!("vm_apps_crash: {}", plan.describe());
        let env = Env::from_env();
        let dir = env.work_dir("vm-apps-crash").map_err(|e| e.to_string())?;
        let ycsb_store = dir.join("ycsb-store.img");
        let fb_store = dir.join("varmail-store.img");
        for s in [&ycsb_store, &fb_store] {
            let _ = std::fs::remove_file(s);
        }
        // One vCPU: a printk record is then written out by the CPU of the writer before its
        // write(2) returns (nothing else can hold the console meanwhile).
        let vms = run_vms(&[
            VmSpec::new("ycsb-run")
                .cpus(1)
                .scenarios(["ycsb_crash_run"])
                .param("records", RECORDS.to_string())
                .param("ops", RUN_OPS.to_string())
                .param("seed", plan.ycsb_seed.to_string())
                .param("kill_after", plan.ycsb_kill_after.to_string())
                .pmo_store(&ycsb_store, STORE_SIZE)
                .kill_on("ycsb_crash_run.reached")
                .timeout(Duration::from_secs(240)),
            VmSpec::new("ycsb-check")
                .cpus(1)
                .scenarios(["ycsb_crash_check"])
                .param("records", RECORDS.to_string())
                .pmo_store(&ycsb_store, STORE_SIZE),
            VmSpec::new("varmail-run")
                .cpus(1)
                .scenarios(["varmail_crash_run"])
                .param("files", MAIL_FILES.to_string())
                .param("threads", "4")
                .param("ops", RUN_OPS.to_string())
                .param("seed", plan.fb_seed.to_string())
                .param("kill_after", plan.fb_kill_after.to_string())
                .pmo_store(&fb_store, STORE_SIZE)
                .kill_on("varmail_crash_run.reached")
                .timeout(Duration::from_secs(240)),
            VmSpec::new("varmail-check")
                .cpus(1)
                .scenarios(["varmail_crash_check"])
                .param("files", MAIL_FILES.to_string())
                .pmo_store(&fb_store, STORE_SIZE),
        ])
        .map_err(|e| format!("{e} ({})", plan.describe()))?;
        for vm in &vms {
            eprintln!(
                "vm_apps_crash: VM {} took {:.1} s, exit {:?}",
                vm.name,
                vm.elapsed.as_secs_f64(),
                vm.exit_code
            );
        }
        Ok(Group {
            plan,
            vms,
            ycsb_store,
            fb_store,
        })
    });
    match g {
        Ok(g) => g,
        Err(e) => panic!("VM run failed: {e}"),
    }
}

impl Group {
    /// A failure message for VM `vm`: what, the plan (to repeat the run), the VM's report.
    fn report(&self, vm: usize, what: &str) -> String {
        self.vms[vm].report(&format!("{what}\n  {}", self.plan.describe()))
    }
}

/// The VM of a run scenario got to its kill point and died of the runner's SIGKILL there:
/// it reported `reached`, did not finish, and its VMM has no exit status of its own.
fn assert_killed_at_the_kill_point(g: &Group, vm: usize, scenario: &str) {
    let out = &g.vms[vm];
    let reached = format!("{scenario}.reached");
    let got_there = out.checks.iter().any(|c| c.name == reached && c.ok);
    assert!(
        got_there,
        "{}",
        g.report(vm, &format!("the guest never reported {reached}"))
    );
    assert!(
        out.checks.iter().all(|c| c.ok) && !out.done,
        "{}",
        g.report(
            vm,
            "the run must be cut by the kill, with every check ok until then"
        )
    );
    // Nested: the test host reports 128 + SIGKILL; direct: no exit code (killed by a signal).
    let killed = !out.timed_out && matches!(out.exit_code, Some(137) | None);
    assert!(
        killed,
        "{}",
        g.report(vm, "expected the VMM to die of the runner's SIGKILL")
    );
}

/// The console up to a kernel log dump `/init` appends after a failed check (which repeats
/// recent kmsg lines), as lines without a printk timestamp.
fn console_lines(console: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    for line in console.lines() {
        if line.contains("PMOTEST-DMESG-BEGIN") {
            break;
        }
        lines.push(strip_timestamp(line.trim_end_matches('\r')));
    }
    lines
}

/// `[   12.345678] text` -> `text` (the scenarios turn printk timestamps off; this keeps the
/// parsers right if a kernel ignored that).
fn strip_timestamp(line: &str) -> &str {
    match line.strip_prefix('[').and_then(|r| r.split_once("] ")) {
        Some((ts, rest)) if ts.trim().parse::<f64>().is_ok() => rest,
        _ => line,
    }
}

/// Index of the last line the guest printed: the one a kill may have cut short. The nested
/// test host's shell adds `Killed` when the VMM died of the SIGKILL, after all its output.
fn last_guest_line(lines: &[&str]) -> Option<usize> {
    lines
        .iter()
        .rposition(|l| !l.trim().is_empty() && l.trim() != "Killed")
}

// ---- YCSB on LMDB -------------------------------------------------------------------------

/// YCSB's key of record `keynum`: "user" + Java's `Math.abs` of FNV-1a 64 over the number's
/// 8 little-endian bytes (`Utils.fnvhash64`).
fn ycsb_key(keynum: u64) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in keynum.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Math.abs(Long.MIN_VALUE) is Long.MIN_VALUE; its magnitude prints as 2^63 here.
    format!("user{}", (h as i64).unsigned_abs())
}

/// Which fields a logged write wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    Field(usize),
    All,
}

/// One `COMMIT <OP> <key> <keynum> <version> <field|all>` line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Commit {
    keynum: u64,
    version: u64,
    written: Written,
}

/// A `COMMIT` line, or why it is not one.
fn parse_commit(line: &str) -> Result<Commit, String> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let [_, op, key, keynum, version, field] = w[..] else {
        return Err(format!("not 6 words: {line:?}"));
    };
    if op != "UPDATE" {
        return Err(format!("workload A logs only UPDATE: {line:?}"));
    }
    let num = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("{s:?} is not a number: {line:?}"))
    };
    let keynum = num(keynum)?;
    if keynum >= RECORDS || key != ycsb_key(keynum) {
        return Err(format!(
            "key {key} is not the key of record {keynum}: {line:?}"
        ));
    }
    let written = match field {
        "all" => Written::All,
        f => match f.parse::<usize>() {
            Ok(f) if f < FIELDS => Written::Field(f),
            _ => return Err(format!("bad field {f:?}: {line:?}")),
        },
    };
    Ok(Commit {
        keynum,
        version: num(version)?,
        written,
    })
}

/// The commit log of a killed run's console: every `COMMIT` line, in order. Only the last
/// line of the console may be a cut `COMMIT` line (the kill came while it was written out);
/// it is left out, as a commit whose line never arrived.
fn parse_commit_log(console: &str) -> Result<Vec<Commit>, String> {
    let lines = console_lines(console);
    let last = last_guest_line(&lines);
    let mut log = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("COMMIT ") {
            continue;
        }
        match parse_commit(line) {
            Ok(c) => log.push(c),
            Err(_) if Some(i) == last => {}
            Err(e) => return Err(format!("console line {}: {e}", i + 1)),
        }
    }
    for pair in log.windows(2) {
        if pair[1].version <= pair[0].version {
            return Err(format!(
                "one thread's versions must grow: {:?} after {:?}",
                pair[1], pair[0]
            ));
        }
    }
    Ok(log)
}

/// Field versions of each record that has any above 0, from `YCSBREC <keynum> <f>=<v> ...`.
type Versions = BTreeMap<u64, [u64; FIELDS]>;

fn parse_dump(console: &str) -> Result<Versions, String> {
    let mut dump = Versions::new();
    for line in console_lines(console) {
        let Some(rest) = line.strip_prefix("YCSBREC ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let keynum: u64 = words
            .next()
            .and_then(|k| k.parse().ok())
            .ok_or_else(|| format!("bad YCSBREC line {line:?}"))?;
        let mut v = [0u64; FIELDS];
        for w in words {
            let parsed = w
                .split_once('=')
                .and_then(|(f, ver)| Some((f.parse::<usize>().ok()?, ver.parse::<u64>().ok()?)));
            match parsed {
                Some((f, ver)) if f < FIELDS && ver > 0 => v[f] = ver,
                _ => return Err(format!("bad field {w:?} in {line:?}")),
            }
        }
        if dump.insert(keynum, v).is_some() {
            return Err(format!("record {keynum} dumped twice"));
        }
    }
    Ok(dump)
}

/// What the YCSB rule found.
#[derive(Debug, PartialEq, Eq)]
struct YcsbVerdict {
    /// Commits in the log.
    logged: usize,
    /// The one durable commit without a complete log line, if the store has it:
    /// (key number, version, fields it wrote).
    in_flight: Option<(u64, u64, usize)>,
}

/// The crash rule for YCSB workload A with one commit per update, one thread.
///
/// `ycsb_lmdb --log-commits` prints a commit's line after `mdb_txn_commit` (one atomic psync)
/// returned, and the line is on the console before the next transaction begins. So when the
/// VMM is killed the store holds exactly the logged commits, plus possibly the one commit after
/// them whose line had not (completely) come out. Hence, for every field of every record:
/// its version is that of the last logged commit that wrote it (0, the load, if none did),
/// except for the fields of that one unlogged commit: those all carry one version, greater than
/// every logged version, in one record, and are one field (an update) or all ten.
/// Anything else - a logged commit missing or rolled back, a field at a version nothing logged
/// wrote, two unlogged commits - is a failure.
fn judge_ycsb(log: &[Commit], dump: &Versions) -> Result<YcsbVerdict, String> {
    let mut want = Versions::new();
    for c in log {
        let v = want.entry(c.keynum).or_insert([0; FIELDS]);
        match c.written {
            Written::Field(f) => v[f] = c.version,
            Written::All => *v = [c.version; FIELDS],
        }
    }
    let last = log.last().map_or(0, |c| c.version);
    let keys: std::collections::BTreeSet<u64> = want.keys().chain(dump.keys()).copied().collect();
    let mut off = Vec::new();
    for keynum in keys {
        let w = want.get(&keynum).copied().unwrap_or([0; FIELDS]);
        let d = dump.get(&keynum).copied().unwrap_or([0; FIELDS]);
        for f in 0..FIELDS {
            if w[f] != d[f] {
                off.push((keynum, f, w[f], d[f]));
            }
        }
    }
    let Some(&(keynum, _, _, version)) = off.first() else {
        return Ok(YcsbVerdict {
            logged: log.len(),
            in_flight: None,
        });
    };
    let one_commit = off.iter().all(|o| o.0 == keynum && o.3 == version)
        && version > last
        && (off.len() == 1 || off.len() == FIELDS);
    if one_commit {
        return Ok(YcsbVerdict {
            logged: log.len(),
            in_flight: Some((keynum, version, off.len())),
        });
    }
    let shown: Vec<String> = off
        .iter()
        .take(10)
        .map(|(k, f, w, d)| format!("record {k} field {f}: logged {w}, store {d}"))
        .collect();
    Err(format!(
        "{} fields differ from the {} logged commits (last version {last}), more than one \
         unlogged commit explains: {}",
        off.len(),
        log.len(),
        shown.join("; ")
    ))
}

/// The commit log and dump of the real run, after the guests' own checks passed.
fn ycsb_data(g: &Group) -> (Vec<Commit>, Versions) {
    let log = parse_commit_log(&g.vms[YCSB_RUN].console)
        .unwrap_or_else(|e| panic!("{}", g.report(YCSB_RUN, &format!("commit log: {e}"))));
    let check = &g.vms[YCSB_CHECK];
    let detail = check.assert_ok("ycsb_crash_check.check");
    let dump = parse_dump(&check.console)
        .unwrap_or_else(|e| panic!("{}", g.report(YCSB_CHECK, &format!("dump: {e}"))));
    assert_eq!(
        check.num(detail, "records"),
        RECORDS,
        "{}",
        g.report(YCSB_CHECK, "records")
    );
    assert_eq!(
        check.num(detail, "corrupt"),
        0,
        "{}",
        g.report(YCSB_CHECK, "corrupt")
    );
    assert_eq!(
        check.num(detail, "dumped"),
        RECORDS,
        "{}",
        g.report(YCSB_CHECK, "records dumped")
    );
    assert_eq!(
        check.num(detail, "in_range"),
        RECORDS,
        "{}",
        g.report(YCSB_CHECK, "key numbers")
    );
    assert_eq!(
        check.num(detail, "changed"),
        dump.len() as u64,
        "{}",
        g.report(YCSB_CHECK, "every changed record must be on the console")
    );
    (log, dump)
}

#[test]
fn ycsb_on_lmdb_keeps_every_logged_commit_when_the_vmm_is_killed() {
    let g = group();
    let run = &g.vms[YCSB_RUN];
    run.assert_ok("ycsb_crash_run.loaded");
    run.assert_ok("ycsb_crash_run.console");
    assert_killed_at_the_kill_point(g, YCSB_RUN, "ycsb_crash_run");
    let check = &g.vms[YCSB_CHECK];
    check.assert_all_ok(&["ycsb_crash_check"]);
    check.assert_exit(0);

    let (log, dump) = ycsb_data(g);
    assert!(
        log.len() as u64 >= g.plan.ycsb_kill_after,
        "{}",
        g.report(
            YCSB_RUN,
            &format!(
                "{} commits logged, but the guest said it reached {}",
                log.len(),
                g.plan.ycsb_kill_after
            )
        )
    );
    match judge_ycsb(&log, &dump) {
        Ok(v) => eprintln!(
            "vm_apps_crash: YCSB: {} logged commits all in the store; the commit in flight \
             at the kill: {}",
            v.logged,
            v.in_flight.map_or_else(
                || "not durable (or none)".to_string(),
                |(k, ver, n)| format!("durable (record {k}, version {ver}, {n} field)")
            )
        ),
        Err(e) => panic!("{}", g.report(YCSB_CHECK, &format!("YCSB crash rule: {e}"))),
    }
}

#[test]
fn ycsb_store_checks_clean_after_the_kill() {
    let g = group();
    g.vms[YCSB_CHECK].assert_exit(0);
    fsck_clean(g, &g.ycsb_store);
}

// ---- varmail ------------------------------------------------------------------------------

/// One line of `fb_pmo --log-psyncs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FbEvent {
    Creating,
    Create,
    Syncing(u64),
    Psync(u64),
    Destroying,
    Destroy,
}

/// A `--log-psyncs` line: (file, event), or `None` for any other line.
fn parse_fb_event(line: &str) -> Option<(String, FbEvent)> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let file = |name: &str| {
        let index = name.strip_prefix("fb.varmail.")?;
        // A canonical index below the file count: a cut name ("fb.varmail.1" of ".12") may
        // still pass, and is handled as the possibly cut last line.
        let i: u64 = index.parse().ok()?;
        (i < MAIL_FILES && i.to_string() == index).then(|| name.to_string())
    };
    let ev = match w[..] {
        ["creating", n] => (file(n)?, FbEvent::Creating),
        ["create", n] => (file(n)?, FbEvent::Create),
        ["destroying", n] => (file(n)?, FbEvent::Destroying),
        ["destroy", n] => (file(n)?, FbEvent::Destroy),
        ["syncing", n, l] => (file(n)?, FbEvent::Syncing(l.parse().ok()?)),
        ["psync", n, l] => (file(n)?, FbEvent::Psync(l.parse().ok()?)),
        _ => return None,
    };
    Some(ev)
}

/// The psync log of a killed varmail run.
#[derive(Debug, Clone)]
struct FbLog {
    events: Vec<(String, FbEvent)>,
    /// The console's last line is the last event: the kill may have cut it short.
    last_maybe_cut: bool,
    /// `psync` lines after `Prepared`.
    run_psyncs: u64,
}

fn parse_fb_log(console: &str) -> Result<FbLog, String> {
    let lines = console_lines(console);
    let last = last_guest_line(&lines);
    let mut log = FbLog {
        events: Vec::new(),
        last_maybe_cut: false,
        run_psyncs: 0,
    };
    let mut prepared = false;
    let mut header = false;
    for (i, line) in lines.iter().enumerate() {
        header |= line.starts_with(&format!("Filebench varmail on PMOs: {MAIL_FILES} files"));
        prepared |= line.starts_with("Prepared ");
        if let Some(ev) = parse_fb_event(line) {
            if prepared && matches!(ev.1, FbEvent::Psync(_)) {
                log.run_psyncs += 1;
            }
            log.events.push(ev);
            log.last_maybe_cut = Some(i) == last;
        }
    }
    if !header || !prepared {
        return Err(format!(
            "fb_pmo's header ({header}) and `Prepared` line ({prepared}) must both be there"
        ));
    }
    Ok(log)
}

/// One `FBCHECK <name> present|absent <len> <status>` line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    present: bool,
    len: u64,
    status: String,
}

fn parse_fb_check(console: &str) -> Result<BTreeMap<String, Found>, String> {
    let mut found = BTreeMap::new();
    for line in console_lines(console) {
        let Some(rest) = line.strip_prefix("FBCHECK ") else {
            continue;
        };
        let w: Vec<&str> = rest.split_whitespace().collect();
        let [name, presence, len, status] = w[..] else {
            return Err(format!("bad FBCHECK line {line:?}"));
        };
        let present = match presence {
            "present" => true,
            "absent" => false,
            _ => return Err(format!("bad presence in {line:?}")),
        };
        let len = len.parse().map_err(|_| format!("bad length in {line:?}"))?;
        let f = Found {
            present,
            len,
            status: status.to_string(),
        };
        if found.insert(name.to_string(), f).is_some() {
            return Err(format!("{name} listed twice"));
        }
    }
    let want: Vec<String> = (0..MAIL_FILES).map(|i| format!("fb.varmail.{i}")).collect();
    let got: Vec<&String> = found.keys().collect();
    if got.len() != want.len() || want.iter().any(|w| !found.contains_key(w)) {
        return Err(format!(
            "the check must list exactly {want:?}, listed {got:?}"
        ));
    }
    Ok(found)
}

/// What the log says about one file: its last line, and the length of its last `psync` since
/// its last `create` (0 if none).
#[derive(Debug, Clone, Copy, Default)]
struct FileLog {
    last: Option<FbEvent>,
    synced: u64,
}

fn file_logs(events: &[(String, FbEvent)]) -> BTreeMap<&str, FileLog> {
    let mut files: BTreeMap<&str, FileLog> = BTreeMap::new();
    for (name, ev) in events {
        let f = files.entry(name.as_str()).or_default();
        match *ev {
            FbEvent::Create => f.synced = 0,
            FbEvent::Psync(len) => f.synced = len,
            _ => {}
        }
        f.last = Some(*ev);
    }
    files
}

/// The crash rule of apps/filebench/README.md for one file.
fn judge_file(log: FileLog, found: &Found) -> Result<(), String> {
    let (present, len) = (found.present, found.len);
    let ok = match log.last {
        None | Some(FbEvent::Destroy) => !present,
        Some(FbEvent::Creating) => !present || len == 0,
        Some(FbEvent::Create) => present && len == 0,
        Some(FbEvent::Syncing(l)) => present && (len == l || len == log.synced),
        Some(FbEvent::Psync(l)) => present && len == l,
        Some(FbEvent::Destroying) => !present || len == log.synced,
    };
    let status_ok = found.status == if present { "ok" } else { "absent" };
    if ok && status_ok {
        Ok(())
    } else {
        Err(format!(
            "last line {:?} (last psync since create: {}), but the check found {found:?}",
            log.last, log.synced
        ))
    }
}

/// What the varmail rule found.
#[derive(Debug, PartialEq, Eq)]
struct FbVerdict {
    present: usize,
    /// The last line was taken as cut short by the kill (its call never began).
    dropped_last: bool,
}

/// The crash rule of `apps/filebench/README.md` for every file: the last line the log shows
/// for a file says what the store may hold (`none`/`destroy`: absent; `creating`: absent or
/// empty; `create`: empty; `syncing L`: L or its last psync's length; `psync L`: exactly L;
/// `destroying`: absent or its last psync's length), and the check must find every present
/// file consistent.
///
/// A kill can cut the console's last line, which may then read as another line (`psync
/// fb.varmail.1 29` of `psync fb.varmail.12 2933`). Its call never began (a line is out before
/// its call starts) or its `...ing` line is in the log, so the log without it is right then;
/// a last line that may be cut is therefore judged both ways and must pass one.
fn judge_varmail(log: &FbLog, found: &BTreeMap<String, Found>) -> Result<FbVerdict, String> {
    let judge = |events: &[(String, FbEvent)]| -> Result<usize, String> {
        let logs = file_logs(events);
        let mut bad = Vec::new();
        for (name, f) in found {
            let l = logs.get(name.as_str()).copied().unwrap_or_default();
            if let Err(e) = judge_file(l, f) {
                bad.push(format!("{name}: {e}"));
            }
        }
        if bad.is_empty() {
            Ok(found.values().filter(|f| f.present).count())
        } else {
            Err(bad.join("; "))
        }
    };
    match judge(&log.events) {
        Ok(present) => Ok(FbVerdict {
            present,
            dropped_last: false,
        }),
        Err(e) if log.last_maybe_cut => {
            let shorter = &log.events[..log.events.len() - 1];
            match judge(shorter) {
                Ok(present) => Ok(FbVerdict {
                    present,
                    dropped_last: true,
                }),
                Err(e2) => Err(format!("{e} (without the last line, maybe cut: {e2})")),
            }
        }
        Err(e) => Err(e),
    }
}

fn fb_data(g: &Group) -> (FbLog, BTreeMap<String, Found>) {
    let log = parse_fb_log(&g.vms[FB_RUN].console)
        .unwrap_or_else(|e| panic!("{}", g.report(FB_RUN, &format!("psync log: {e}"))));
    let found = parse_fb_check(&g.vms[FB_CHECK].console)
        .unwrap_or_else(|e| panic!("{}", g.report(FB_CHECK, &format!("check lines: {e}"))));
    (log, found)
}

#[test]
fn varmail_keeps_every_psynced_mail_when_the_vmm_is_killed() {
    let g = group();
    g.vms[FB_RUN].assert_ok("varmail_crash_run.console");
    assert_killed_at_the_kill_point(g, FB_RUN, "varmail_crash_run");
    let check = &g.vms[FB_CHECK];
    check.assert_all_ok(&["varmail_crash_check"]);
    check.assert_exit(0);
    let summary = check.assert_ok("varmail_crash_check.check");
    assert!(
        summary.starts_with("Check (discover): OK: 20 entries"),
        "{}",
        g.report(FB_CHECK, summary)
    );

    let (log, found) = fb_data(g);
    assert!(
        log.run_psyncs >= g.plan.fb_kill_after,
        "{}",
        g.report(
            FB_RUN,
            &format!(
                "{} psyncs of the run logged, but the guest said it reached {}",
                log.run_psyncs, g.plan.fb_kill_after
            )
        )
    );
    match judge_varmail(&log, &found) {
        Ok(v) => eprintln!(
            "vm_apps_crash: varmail: {} log lines ({} psyncs in the run), {} of {MAIL_FILES} \
             files present, all as the log says{}",
            log.events.len(),
            log.run_psyncs,
            v.present,
            if v.dropped_last {
                " (the last line taken as cut by the kill)"
            } else {
                ""
            }
        ),
        Err(e) => panic!(
            "{}",
            g.report(FB_CHECK, &format!("varmail crash rule: {e}"))
        ),
    }
}

#[test]
fn varmail_store_checks_clean_after_the_kill() {
    let g = group();
    g.vms[FB_CHECK].assert_exit(0);
    fsck_clean(g, &g.fb_store);
}

fn fsck_clean(g: &Group, store: &std::path::Path) {
    common::assert_store_clean(store, &g.plan.describe());
}

// ---- the rules must be able to fail --------------------------------------------------------

/// The real run's data, each changed in a way the rules must refuse.
#[test]
fn the_rules_refuse_the_real_runs_data_when_it_is_wrong() {
    let g = group();
    let (log, dump) = ycsb_data(g);
    assert!(judge_ycsb(&log, &dump).is_ok(), "the unchanged data passes");
    let last = log.last().expect("commits were logged");
    let Written::Field(f) = last.written else {
        panic!("workload A writes one field")
    };

    // The last logged commit lost: its field back at the version before it.
    let before = log[..log.len() - 1]
        .iter()
        .rev()
        .find(|c| c.keynum == last.keynum && c.written == last.written)
        .map_or(0, |c| c.version);
    let mut lost = dump.clone();
    lost.entry(last.keynum).or_insert([0; FIELDS])[f] = before;
    assert!(judge_ycsb(&log, &lost).is_err(), "a lost logged commit");

    // A logged commit the store never saw (a version above all).
    let top = dump
        .values()
        .flatten()
        .max()
        .copied()
        .unwrap_or(0)
        .max(last.version);
    let mut more = log.clone();
    more.push(Commit {
        keynum: (last.keynum + 1) % RECORDS,
        version: top + 1,
        written: Written::Field((f + 1) % FIELDS),
    });
    assert!(judge_ycsb(&more, &dump).is_err(), "a logged commit missing");

    // Two unlogged commits in the store.
    let mut two = dump.clone();
    for (i, k) in [(1, RECORDS - 1), (2, RECORDS - 2)] {
        two.entry(k).or_insert([0; FIELDS])[0] = top + i;
    }
    assert!(judge_ycsb(&log, &two).is_err(), "two unlogged commits");

    let (fb_log, found) = fb_data(g);
    let verdict = judge_varmail(&fb_log, &found).expect("the unchanged data passes");
    // Judge without the cut-line leniency (the log as the real verdict read it), so each
    // change is seen as it is.
    let mut strict = FbLog {
        last_maybe_cut: false,
        ..fb_log.clone()
    };
    if verdict.dropped_last {
        strict.events.pop();
    }
    assert!(judge_varmail(&strict, &found).is_ok());
    let logs = file_logs(&strict.events);
    let mut shown = 0;
    for (name, f) in &found {
        let l = logs.get(name.as_str()).copied().unwrap_or_default();
        let mut wrong = found.clone();
        let w = wrong.get_mut(name).expect("listed");
        if f.present {
            // One byte more than any length the log allows.
            let logged = match l.last {
                Some(FbEvent::Syncing(n) | FbEvent::Psync(n)) => n,
                _ => 0,
            };
            w.len = f.len.max(l.synced).max(logged) + 1;
        } else {
            // Present, and damaged.
            *w = Found {
                present: true,
                len: 0,
                status: "bad-header".into(),
            };
        }
        assert!(
            judge_varmail(&strict, &wrong).is_err(),
            "{name}: {f:?} changed to {:?} must fail",
            wrong[name]
        );
        shown += 1;
    }
    assert_eq!(shown, MAIL_FILES as usize);
}

/// The rules on made-up logs, one case per row of each rule (no VM).
#[test]
fn the_rules_on_made_up_logs() {
    assert_eq!(ycsb_key(0), "user6284781860667377211");
    assert_eq!(ycsb_key(1), "user8517097267634966620");
    assert_eq!(ycsb_key(2), "user1820151046732198393");
    let c = |keynum, version, f| Commit {
        keynum,
        version,
        written: Written::Field(f),
    };
    let line = |c: &Commit| {
        let Written::Field(f) = c.written else {
            unreachable!()
        };
        format!(
            "COMMIT UPDATE {} {} {} {f}",
            ycsb_key(c.keynum),
            c.keynum,
            c.version
        )
    };
    let log = vec![c(5, 2, 3), c(7, 4, 0), c(5, 9, 3), c(5, 11, 1)];
    let console: String = log.iter().map(|c| line(c) + "\n").collect::<String>()
        + "COMMIT UPDATE user6284781860667377211 0 1";
    assert_eq!(
        parse_commit_log(&console),
        Ok(log.clone()),
        "a cut last line is left out"
    );
    let mut bad = console.clone();
    bad.insert_str(0, "COMMIT UPDATE user1 0 1 2\n");
    assert!(
        parse_commit_log(&bad).is_err(),
        "a key that is not its record's"
    );
    let mut dump = Versions::new();
    dump.insert(5, [0, 11, 0, 9, 0, 0, 0, 0, 0, 0]);
    dump.insert(7, [4, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(
        judge_ycsb(&log, &dump),
        Ok(YcsbVerdict {
            logged: 4,
            in_flight: None
        })
    );
    let mut flight = dump.clone();
    flight.insert(9, [0, 0, 0, 0, 0, 0, 0, 0, 0, 12]);
    assert_eq!(
        judge_ycsb(&log, &flight).map(|v| v.in_flight),
        Ok(Some((9, 12, 1)))
    );
    flight.get_mut(&7).expect("there")[0] = 0;
    assert!(
        judge_ycsb(&log, &flight).is_err(),
        "in flight, and one lost"
    );
    let mut old = dump.clone();
    old.get_mut(&5).expect("there")[3] = 2;
    assert!(
        judge_ycsb(&log, &old).is_err(),
        "rolled back to an older commit"
    );
    let mut early = dump.clone();
    early.insert(9, [0, 0, 0, 0, 0, 0, 0, 0, 0, 10]);
    assert!(
        judge_ycsb(&log, &early).is_err(),
        "unlogged, below the last version"
    );
    let mut two_fields = dump.clone();
    two_fields.insert(9, [12, 12, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert!(
        judge_ycsb(&log, &two_fields).is_err(),
        "two fields of one update"
    );

    // varmail: each row of the crash rule.
    let found = |present: bool, len: u64| Found {
        present,
        len,
        status: if present { "ok" } else { "absent" }.into(),
    };
    let fl = |last, synced| FileLog {
        last: Some(last),
        synced,
    };
    let cases = [
        (FileLog::default(), found(false, 0), true),
        (FileLog::default(), found(true, 0), false),
        (fl(FbEvent::Destroy, 0), found(false, 0), true),
        (fl(FbEvent::Destroy, 7), found(true, 7), false),
        (fl(FbEvent::Creating, 0), found(false, 0), true),
        (fl(FbEvent::Creating, 0), found(true, 0), true),
        (fl(FbEvent::Creating, 0), found(true, 5), false),
        (fl(FbEvent::Create, 0), found(true, 0), true),
        (fl(FbEvent::Create, 0), found(false, 0), false),
        (fl(FbEvent::Syncing(9), 4), found(true, 9), true),
        (fl(FbEvent::Syncing(9), 4), found(true, 4), true),
        (fl(FbEvent::Syncing(9), 4), found(true, 5), false),
        (fl(FbEvent::Syncing(9), 4), found(false, 0), false),
        (fl(FbEvent::Psync(9), 9), found(true, 9), true),
        (fl(FbEvent::Psync(9), 9), found(true, 4), false),
        (fl(FbEvent::Destroying, 6), found(false, 0), true),
        (fl(FbEvent::Destroying, 6), found(true, 6), true),
        (fl(FbEvent::Destroying, 6), found(true, 0), false),
    ];
    for (log, f, ok) in cases {
        assert_eq!(judge_file(log, &f).is_ok(), ok, "{log:?} {f:?}");
    }
    let damaged = Found {
        status: "bad-data".into(),
        ..found(true, 9)
    };
    assert!(judge_file(fl(FbEvent::Psync(9), 9), &damaged).is_err());

    // A psync line cut by the kill reads as another length; without it the log is right.
    let mut console = String::from("Filebench varmail on PMOs: 20 files (...)\nPrepared 1 files\n");
    console += "creating fb.varmail.12\ncreate fb.varmail.12\nsyncing fb.varmail.12 2933\n";
    console += "psync fb.varmail.12 2933\nsyncing fb.varmail.12 4000\npsync fb.varmail.12 40";
    let log = parse_fb_log(&console).expect("parses");
    assert!(log.last_maybe_cut);
    assert_eq!(log.run_psyncs, 2);
    let mut listed: BTreeMap<String, Found> = (0..MAIL_FILES)
        .map(|i| (format!("fb.varmail.{i}"), found(false, 0)))
        .collect();
    listed.insert("fb.varmail.12".into(), found(true, 4000));
    assert_eq!(
        judge_varmail(&log, &listed),
        Ok(FbVerdict {
            present: 1,
            dropped_last: true
        })
    );
    listed.insert("fb.varmail.12".into(), found(true, 2933));
    assert!(
        judge_varmail(&log, &listed).is_ok(),
        "syncing: the old length"
    );
    listed.insert("fb.varmail.12".into(), found(true, 40));
    assert!(
        judge_varmail(&log, &listed).is_ok(),
        "read as the cut line says"
    );
    listed.insert("fb.varmail.12".into(), found(true, 3000));
    assert!(judge_varmail(&log, &listed).is_err(), "neither");
    let killed = console.clone() + "\nKilled\n\n";
    assert!(parse_fb_log(&killed).expect("parses").last_maybe_cut);
    console += "\nPMOTEST x.reached ok\nKilled\n";
    let whole = parse_fb_log(&console).expect("parses");
    assert!(!whole.last_maybe_cut);
    listed.insert("fb.varmail.12".into(), found(true, 4000));
    assert!(
        judge_varmail(&whole, &listed).is_err(),
        "a line followed by more output is whole: psync 40 means 40"
    );
}
