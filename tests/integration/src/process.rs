//! Running a child process with a deadline while its output is logged as it comes.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{Result, RunnerError};

/// One line of output and when it arrived, counted from the start of the process.
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub at: Duration,
    pub text: String,
}

/// What a process did before it exited or was killed.
#[derive(Debug)]
pub(crate) struct Captured {
    /// `None` when it was killed at the deadline.
    pub status: Option<ExitStatus>,
    /// Killed at the deadline, or for printing nothing for the quiet limit.
    pub timed_out: bool,
    /// Killed because stdout stayed silent for the quiet limit (a hung test host).
    pub went_quiet: bool,
    /// Killed because it had not exited the grace time after its done line (see
    /// [`Limits::done`]): its output is complete, it only failed to end.
    pub killed_when_done: bool,
    pub stdout: Vec<Line>,
    pub stderr: Vec<Line>,
    pub elapsed: Duration,
}

impl Captured {
    /// Stdout as text, one line each, carriage returns removed.
    pub fn stdout_text(&self) -> String {
        join(&self.stdout)
    }

    /// Stderr as text.
    pub fn stderr_text(&self) -> String {
        join(&self.stderr)
    }
}

fn join(lines: &[Line]) -> String {
    let mut s = String::new();
    for l in lines {
        s.push_str(&l.text);
        s.push('\n');
    }
    s
}

/// Whether to echo child output to our stderr as it comes (`PMO_TEST_VERBOSE=1`), to watch a
/// run with `cargo test -- --nocapture`.
fn verbose() -> bool {
    std::env::var_os("PMO_TEST_VERBOSE").is_some_and(|v| v != "0")
}

/// Send process `pid` the signal `signal` (a `kill -s` name) when an output line contains
/// `needle`; once.
#[derive(Debug, Clone)]
pub(crate) struct Trigger {
    pub needle: String,
    pub signal: &'static str,
}

impl Trigger {
    fn fire(&self, pid: u32) {
        // A child that already exited is no error: the run's outcome tells.
        let _ = std::process::Command::new("kill")
            .args(["-s", self.signal, &pid.to_string()])
            .status();
    }
}

/// Reads `src` line by line into `sink`, appending each line to `log` right away so that a
/// run can be followed with `tail -f` and nothing is lost when the run is killed. With a
/// trigger, signals `pid` at the first line that matches.
fn reader(
    src: impl Read + Send + 'static,
    log: Option<File>,
    sink: Arc<Mutex<Vec<Line>>>,
    start: Instant,
    prefix: &'static str,
    trigger: Option<(Trigger, u32)>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut log = log;
        let mut trigger = trigger;
        let mut r = BufReader::new(src);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&buf);
            let text = text.trim_end_matches(['\n', '\r']).replace('\r', "");
            if let Some(f) = log.as_mut() {
                // A failing log write must not stop the capture the test relies on.
                let _ = writeln!(f, "{text}");
            }
            if verbose() {
                eprintln!("{prefix}{text}");
            }
            if trigger
                .as_ref()
                .is_some_and(|(t, _)| text.contains(&t.needle))
            {
                if let Some((t, pid)) = trigger.take() {
                    t.fire(pid);
                }
            }
            if let Ok(mut v) = sink.lock() {
                v.push(Line {
                    at: start.elapsed(),
                    text,
                });
            }
        }
    })
}

fn create_log(path: &Path) -> Result<File> {
    File::create(path).map_err(|e| RunnerError::io(format!("create {}", path.display()), e))
}

/// When to give up on a child: at `total`, or after `quiet` without a line on stdout (from
/// the start or from its last line), which finds a hung test host in minutes instead of at
/// the end of a budget made for many VMs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub total: Duration,
    pub quiet: Option<Duration>,
    /// A stdout line starting with this prefix says the child's work is done and it is about
    /// to exit; if it is still running the given time after that line, it is killed and its
    /// run counts as complete. (Nested QEMU-TCG has been seen to hang after its guest powered
    /// off: without this, that cost the quiet limit and a rerun of the whole test host.)
    pub done: Option<(&'static str, Duration)>,
}

impl From<Duration> for Limits {
    fn from(total: Duration) -> Self {
        Limits {
            total,
            quiet: None,
            done: None,
        }
    }
}

/// Runs `cmd` (stdin from /dev/null), logging stdout and stderr to the given files, and kills
/// it when `timeout` passes.
pub(crate) fn run_logged(
    cmd: Command,
    timeout: Duration,
    stdout_log: &Path,
    stderr_log: &Path,
    prefix: &'static str,
) -> Result<Captured> {
    run_logged_with(cmd, timeout.into(), stdout_log, stderr_log, prefix, None)
}

/// `run_logged` with both `limits`, and signals the child when its stdout shows `trigger`'s
/// needle.
pub(crate) fn run_logged_with(
    mut cmd: Command,
    limits: Limits,
    stdout_log: &Path,
    stderr_log: &Path,
    prefix: &'static str,
    trigger: Option<Trigger>,
) -> Result<Captured> {
    let program = format!("{:?}", cmd.get_program());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out_log = create_log(stdout_log)?;
    let err_log = create_log(stderr_log)?;
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|source| RunnerError::Spawn { program, source })?;
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    let pid = child.id();
    if let Some(s) = child.stdout.take() {
        let trigger = trigger.map(|t| (t, pid));
        readers.push(reader(
            s,
            Some(out_log),
            out.clone(),
            start,
            prefix,
            trigger,
        ));
    }
    if let Some(s) = child.stderr.take() {
        readers.push(reader(s, Some(err_log), err.clone(), start, prefix, None));
    }
    let watch = Watch {
        start,
        deadline: start + limits.total,
        quiet: limits.quiet,
        done: limits.done,
        lines: &out,
    };
    let end = watch.wait(&mut child)?;
    let elapsed = start.elapsed();
    for r in readers {
        // A reader only ends at EOF; a panic in it would only lose log lines.
        let _ = r.join();
    }
    let take = |v: Arc<Mutex<Vec<Line>>>| {
        v.lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default()
    };
    Ok(Captured {
        status: end.status,
        timed_out: end.timed_out,
        went_quiet: end.went_quiet,
        killed_when_done: end.killed_when_done,
        stdout: take(out),
        stderr: take(err),
        elapsed,
    })
}

/// What ended a child's wait.
#[derive(Debug, Default)]
struct End {
    status: Option<ExitStatus>,
    timed_out: bool,
    went_quiet: bool,
    killed_when_done: bool,
}

/// The limits of one wait and the stdout lines they look at.
struct Watch<'a> {
    start: Instant,
    deadline: Instant,
    quiet: Option<Duration>,
    done: Option<(&'static str, Duration)>,
    lines: &'a Mutex<Vec<Line>>,
}

impl Watch<'_> {
    /// Waits for `child` until it exits, the deadline passes, stdout stays silent for the
    /// quiet limit, or the done grace runs out; kills it in the last three cases.
    fn wait(&self, child: &mut Child) -> Result<End> {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    return Ok(End {
                        status: Some(status),
                        ..End::default()
                    })
                }
                Ok(None) => {}
                Err(e) => return Err(RunnerError::io("wait for child", e)),
            }
            let (last, done_at) = self.scan();
            let now = self.start.elapsed();
            let went_quiet = self.quiet.is_some_and(|q| now.saturating_sub(last) >= q);
            let killed_when_done = self
                .done
                .zip(done_at)
                .is_some_and(|((_, grace), at)| now.saturating_sub(at) >= grace);
            let timed_out = Instant::now() >= self.deadline;
            if went_quiet || killed_when_done || timed_out {
                // Already exited in between is fine; the wait below reaps it either way.
                let _ = child.kill();
                let _ = child.wait();
                return Ok(End {
                    status: None,
                    // A child past its done line finished its work: not a timeout.
                    timed_out: !killed_when_done,
                    went_quiet: went_quiet && !killed_when_done,
                    killed_when_done,
                });
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// When the last stdout line came, and when the done line did (if it did).
    fn scan(&self) -> (Duration, Option<Duration>) {
        let Ok(v) = self.lines.lock() else {
            return (Duration::ZERO, None);
        };
        let last = v.last().map(|l| l.at).unwrap_or_default();
        let done_at = self.done.and_then(|(prefix, _)| {
            v.iter()
                .rev()
                .find(|l| l.text.starts_with(prefix))
                .map(|l| l.at)
        });
        (last, done_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// Runs `sh -c script` under `limits`, logging into `dir`.
    fn run_sh(dir: &Path, script: &str, limits: Limits, trigger: Option<Trigger>) -> Captured {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        run_logged_with(cmd, limits, &dir.join("out"), &dir.join("err"), "", trigger).unwrap()
    }

    /// A child that reports a check and then waits forever ends by the signal its line
    /// triggers; the long timeout is only a hang guard.
    #[test]
    fn a_matching_line_signals_the_child() {
        let dir = std::env::temp_dir().join(format!("pmo-trigger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trigger = Trigger {
            needle: "PMOTEST cxl_hold.holding ok".into(),
            signal: "KILL",
        };
        let cap = run_sh(
            &dir,
            "echo boot; echo 'PMOTEST cxl_hold.holding ok waiting'; exec sleep 600",
            Duration::from_secs(300).into(),
            Some(trigger),
        );
        assert!(!cap.timed_out);
        assert_eq!(cap.status.and_then(|s| s.signal()), Some(9));
        assert_eq!(cap.stdout.len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A child that stops printing is killed after the quiet limit, long before its timeout;
    /// one that keeps printing more often than the limit runs to its end.
    #[test]
    fn a_silent_child_is_killed_at_the_quiet_limit() {
        let dir = std::env::temp_dir().join(format!("pmo-quiet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let limits = Limits {
            total: Duration::from_secs(300),
            quiet: Some(Duration::from_secs(2)),
            done: None,
        };
        let run = |script: &str| run_sh(&dir, script, limits, None);
        let hung = run("echo booted; exec sleep 600");
        assert!(hung.timed_out && hung.went_quiet);
        assert!(hung.elapsed < Duration::from_secs(60), "{:?}", hung.elapsed);
        assert_eq!(hung.stdout.len(), 1);

        let busy = run("for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.5; done");
        assert!(!busy.timed_out && !busy.went_quiet);
        assert!(busy.status.is_some_and(|s| s.success()));
        assert_eq!(busy.stdout.len(), 8);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A child that prints its done line and then does not exit is killed after the grace
    /// time, and its run counts as complete (not a timeout); one that exits by itself after
    /// its done line is not killed.
    #[test]
    fn a_child_that_hangs_after_its_done_line_is_ended_as_complete() {
        let dir = std::env::temp_dir().join(format!("pmo-done-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let limits = Limits {
            total: Duration::from_secs(300),
            quiet: Some(Duration::from_secs(200)),
            done: Some(("@@DONE", Duration::from_secs(1))),
        };
        let run = |script: &str| run_sh(&dir, script, limits, None);
        let hung = run("echo work; echo '@@DONE uptime=1'; exec sleep 600");
        assert!(hung.killed_when_done, "{hung:?}");
        assert!(!hung.timed_out && !hung.went_quiet);
        assert!(hung.elapsed < Duration::from_secs(60), "{:?}", hung.elapsed);
        assert_eq!(hung.stdout.len(), 2);

        let clean = run("echo '@@DONE'; sleep 0.2; echo bye");
        assert!(!clean.killed_when_done && !clean.timed_out);
        assert!(clean.status.is_some_and(|s| s.success()));
        assert_eq!(clean.stdout.len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
