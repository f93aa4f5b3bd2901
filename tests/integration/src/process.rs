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
    pub timed_out: bool,
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

/// Runs `cmd` (stdin from /dev/null), logging stdout and stderr to the given files, and kills
/// it when `timeout` passes.
pub(crate) fn run_logged(
    cmd: Command,
    timeout: Duration,
    stdout_log: &Path,
    stderr_log: &Path,
    prefix: &'static str,
) -> Result<Captured> {
    run_logged_with(cmd, timeout, stdout_log, stderr_log, prefix, None)
}

/// `run_logged`, and signals the child when its stdout shows `trigger`'s needle.
pub(crate) fn run_logged_with(
    mut cmd: Command,
    timeout: Duration,
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
    let (status, timed_out) = wait_deadline(&mut child, start + timeout)?;
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
        status,
        timed_out,
        stdout: take(out),
        stderr: take(err),
        elapsed,
    })
}

/// Waits for `child` until `deadline`; kills it then.
fn wait_deadline(child: &mut Child, deadline: Instant) -> Result<(Option<ExitStatus>, bool)> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok((Some(status), false)),
            Ok(None) => {}
            Err(e) => return Err(RunnerError::io("wait for child", e)),
        }
        if Instant::now() >= deadline {
            // Already exited in between is fine; the wait below reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
            return Ok((None, true));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// A child that reports a check and then waits forever ends by the signal its line
    /// triggers; the long timeout is only a hang guard.
    #[test]
    fn a_matching_line_signals_the_child() {
        let dir = std::env::temp_dir().join(format!("pmo-trigger-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo boot; echo 'PMOTEST cxl_hold.holding ok waiting'; exec sleep 600",
        ]);
        let trigger = Trigger {
            needle: "PMOTEST cxl_hold.holding ok".into(),
            signal: "KILL",
        };
        let cap = run_logged_with(
            cmd,
            Duration::from_secs(300),
            &dir.join("out"),
            &dir.join("err"),
            "",
            Some(trigger),
        )
        .unwrap();
        assert!(!cap.timed_out);
        assert_eq!(cap.status.and_then(|s| s.signal()), Some(9));
        assert_eq!(cap.stdout.len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
