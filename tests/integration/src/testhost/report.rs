//! Reading L1's console back: one frame per VM, turned into outcomes, and the timings file.

use std::fs;
use std::path::Path;
use std::time::Duration;

use super::{tail, L1Run};
use crate::error::{Result, RunnerError};
use crate::outcome::{parse_checks, Backend, VmOutcome};
use crate::spec::VmSpec;

/// What L1 said about one VM.
#[derive(Default)]
pub(super) struct VmFrame {
    pub(super) begun: Option<Duration>,
    pub(super) ended: Option<Duration>,
    pub(super) console: Vec<String>,
    pub(super) stderr: Vec<String>,
    pub(super) rc: Option<i32>,
    pub(super) guest_elapsed: u64,
    pub(super) timeout: u64,
}

pub(super) fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

pub(super) fn parse_run(
    run: &L1Run,
    specs: &[VmSpec],
    attempts: u32,
    log_dir: &Path,
) -> Result<Vec<VmOutcome>> {
    let lines = &run.captured.stdout;
    let fail = |detail: String| RunnerError::TestHost {
        detail,
        log: run.log.clone(),
        tail: tail(lines, 30),
    };
    run.ready()?;
    let mut frames: Vec<VmFrame> = specs.iter().map(|_| VmFrame::default()).collect();
    let mut current: Option<usize> = None;
    let mut errors = Vec::new();
    for l in lines {
        let t = l.text.as_str();
        if let Some(rest) = t.strip_prefix("@@VM-BEGIN ") {
            current = rest
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|i| *i < frames.len());
            if let Some(i) = current {
                frames[i].begun = Some(l.at);
            }
        } else if let Some(rest) = t.strip_prefix("@@VM-END ") {
            let i = rest
                .split_whitespace()
                .next()
                .and_then(|s| s.parse::<usize>().ok());
            if let Some(f) = i.and_then(|i| frames.get_mut(i)) {
                f.ended = Some(l.at);
                f.rc = field(rest, "rc").and_then(|v| v.parse().ok());
                f.guest_elapsed = field(rest, "elapsed")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                f.timeout = field(rest, "timeout")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                // th_vm prints an empty line to end an unterminated last console line.
                if f.console.last().is_some_and(|s| s.is_empty()) {
                    f.console.pop();
                }
            }
            current = None;
        } else if let Some(rest) = t.strip_prefix("@@VM-STDERR ") {
            if let Some((i, text)) = rest.split_once(' ').or(Some((rest, ""))) {
                if let Some(f) = i.parse::<usize>().ok().and_then(|i| frames.get_mut(i)) {
                    f.stderr.push(text.to_string());
                }
            }
        } else if let Some(rest) = t.strip_prefix("@@TESTHOST-ERROR ") {
            errors.push(rest.to_string());
        } else if let Some(i) = current {
            frames[i].console.push(l.text.clone());
        }
    }
    if !errors.is_empty() {
        return Err(fail(errors.join("; ")));
    }
    // QEMU ended on its own (no host timeout) but L1 never finished the job: L1 crashed
    // (e.g. out of memory, or a kernel panic caused by the VMM), which is no VM timeout.
    if !lines.iter().any(|l| l.text.starts_with("@@TESTHOST-DONE")) && !run.captured.timed_out {
        return Err(fail(format!(
            "L1 stopped before finishing its job (QEMU exit status {:?})",
            run.captured.status.and_then(|s| s.code())
        )));
    }
    let mut outcomes = Vec::new();
    for (i, (spec, f)) in specs.iter().zip(frames).enumerate() {
        if f.begun.is_none() {
            return Err(fail(format!("VM {i} ({}) never started", spec.name)));
        }
        let console = f.console.join("\n") + "\n";
        let _ = fs::write(
            log_dir.join(format!("vm{i}-{}-console.log", spec.name)),
            &console,
        );
        let (checks, done) = parse_checks(&console);
        // The shell reports a process killed by signal N as 128+N; `timeout -s KILL` is 137.
        let killed = f.rc.is_none_or(|rc| rc >= 128);
        let timed_out =
            f.ended.is_none() || (f.rc == Some(137) && f.guest_elapsed + 1 >= f.timeout);
        let elapsed = match (f.begun, f.ended) {
            (Some(b), Some(e)) => e.saturating_sub(b),
            (Some(b), None) => run.captured.elapsed.saturating_sub(b),
            _ => Duration::ZERO,
        };
        outcomes.push(VmOutcome {
            name: spec.name.clone(),
            backend: Backend::Nested,
            exit_code: if killed { None } else { f.rc },
            timed_out,
            console,
            vmm_stderr: f.stderr.join("\n"),
            checks,
            done,
            elapsed,
            attempts,
            log_dir: log_dir.to_path_buf(),
        });
    }
    Ok(outcomes)
}

pub(super) fn write_timings(log_dir: &Path, run: &L1Run, outcomes: &[VmOutcome], attempts: u32) {
    let mut s = String::new();
    if attempts > 1 {
        s += &format!(
            "test host attempts: {attempts} (earlier ones timed out, logs in attempt*/ and here)\n"
        );
    }
    if let Ok(ready) = run.ready() {
        s += &format!(
            "L1 ready after {:.1} s: {}\n",
            ready.at.as_secs_f64(),
            ready.text
        );
    }
    for o in outcomes {
        s += &format!(
            "VM {}: {:.1} s, exit {:?}{}\n",
            o.name,
            o.elapsed.as_secs_f64(),
            o.exit_code,
            if o.timed_out { " (timed out)" } else { "" }
        );
    }
    if run.captured.killed_when_done {
        s += "L1 did not power off after @@TESTHOST-DONE: killed, results kept\n";
    }
    s += &format!("L1 total {:.1} s\n", run.captured.elapsed.as_secs_f64());
    eprint!("pmo-integration: {s}");
    let _ = fs::write(log_dir.join("timings.txt"), s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{Captured, Line};
    use std::path::PathBuf;

    fn line(text: &str, secs: u64) -> Line {
        Line {
            at: Duration::from_secs(secs),
            text: text.into(),
        }
    }

    #[test]
    fn frames_become_outcomes() {
        let lines = vec![
            line("@@TESTHOST-READY kvm=yes", 4),
            line("@@VM-BEGIN 0", 5),
            line("PMOTEST a.b ok 1", 8),
            line("PMOTEST-DONE", 9),
            line("", 9),
            line("@@VM-END 0 rc=0 elapsed=4 timeout=60", 9),
            line("@@VM-BEGIN 1", 10),
            line("booting", 11),
            line("", 70),
            line("@@VM-END 1 rc=137 elapsed=60 timeout=60", 70),
            line("@@VM-STDERR 1 some error", 70),
            line("@@TESTHOST-DONE", 71),
        ];
        let run = L1Run {
            captured: Captured {
                status: None,
                timed_out: false,
                went_quiet: false,
                killed_when_done: false,
                stdout: lines,
                stderr: Vec::new(),
                elapsed: Duration::from_secs(72),
            },
            log: PathBuf::from("/nonexistent/l1.log"),
        };
        let specs = [VmSpec::new("a"), VmSpec::new("b")];
        let o = parse_run(&run, &specs, 1, Path::new("/nonexistent")).unwrap();
        assert_eq!(o[0].exit_code, Some(0));
        assert!(o[0].done && !o[0].timed_out);
        assert_eq!(o[0].console, "PMOTEST a.b ok 1\nPMOTEST-DONE\n");
        assert_eq!(o[0].elapsed, Duration::from_secs(4));
        assert_eq!(o[1].exit_code, None);
        assert!(o[1].timed_out);
        assert_eq!(o[1].vmm_stderr, "some error");
    }

    #[test]
    fn a_test_host_that_dies_midway_is_an_error() {
        let run = L1Run {
            captured: Captured {
                status: None,
                timed_out: false,
                went_quiet: false,
                killed_when_done: false,
                stdout: vec![
                    line("@@TESTHOST-READY kvm=yes", 4),
                    line("@@VM-BEGIN 0", 5),
                    line("Kernel panic - not syncing: Out of memory", 9),
                ],
                stderr: Vec::new(),
                elapsed: Duration::from_secs(10),
            },
            log: PathBuf::from("/nonexistent/l1.log"),
        };
        let err = parse_run(&run, &[VmSpec::new("a")], 1, Path::new("/nonexistent")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("before finishing"), "{msg}");
        assert!(msg.contains("Out of memory"), "{msg}");
    }
}
