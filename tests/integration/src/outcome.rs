//! What a VM run produced, and assertions that fail with the guest's console tail.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// One check a guest scenario reported: `PMOTEST <scenario>.<check> ok|fail <detail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// `<scenario>.<check>`, e.g. `boot_info.cpus`.
    pub name: String,
    /// Whether the guest judged it ok.
    pub ok: bool,
    /// The rest of the line (a value to compare, or why it failed).
    pub detail: String,
}

/// Where a VM ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `pmovmm` on this machine's hardware KVM.
    Direct,
    /// `pmovmm` inside the nested QEMU-TCG test host.
    Nested,
    /// The guest image under plain QEMU (a reference for the image, no pmovmm involved).
    Qemu,
}

/// The result of one VM run.
#[derive(Debug, Clone)]
pub struct VmOutcome {
    /// The spec's name.
    pub name: String,
    /// Where it ran.
    pub backend: Backend,
    /// The VMM's exit code; `None` if it was killed (timeout) or died of a signal.
    pub exit_code: Option<i32>,
    /// The VM hit its timeout and was killed.
    pub timed_out: bool,
    /// The guest's serial console (carriage returns removed).
    pub console: String,
    /// What the VMM wrote to stderr.
    pub vmm_stderr: String,
    /// Every `PMOTEST` line, in order.
    pub checks: Vec<Check>,
    /// The guest printed `PMOTEST-DONE` (all its scenarios ran).
    pub done: bool,
    /// Wall-clock time of the VM as seen from the host.
    pub elapsed: Duration,
    /// Attempts the run took (2 when the nested test host was retried after a timeout).
    pub attempts: u32,
    /// Where the logs of this run are (console, test host console, commands).
    pub log_dir: PathBuf,
}

/// Lines of console shown in failure messages.
const TAIL_LINES: usize = 40;

impl VmOutcome {
    /// The last `n` lines of the guest console.
    pub fn console_tail(&self, n: usize) -> String {
        let lines: Vec<&str> = self.console.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// A failure message: what went wrong, then everything needed to see why.
    pub fn report(&self, what: &str) -> String {
        let mut s = format!(
            "VM {:?} ({:?}): {what}\n  exit code: {}{}; attempts: {}; elapsed {:.1} s; logs: {}\n",
            self.name,
            self.backend,
            self.exit_code
                .map_or_else(|| "none (killed)".to_string(), |c| c.to_string()),
            if self.timed_out { " (timed out)" } else { "" },
            self.attempts,
            self.elapsed.as_secs_f64(),
            self.log_dir.display()
        );
        if !self.vmm_stderr.trim().is_empty() {
            let _ = writeln!(s, "  VMM stderr:\n{}", indent(self.vmm_stderr.trim_end()));
        }
        let failed: Vec<&Check> = self.checks.iter().filter(|c| !c.ok).collect();
        if !failed.is_empty() {
            let _ = writeln!(s, "  failed checks:");
            for c in failed {
                let _ = writeln!(s, "    {} {}", c.name, c.detail);
            }
        }
        let _ = write!(
            s,
            "  guest console, last {TAIL_LINES} lines:\n{}",
            indent(&self.console_tail(TAIL_LINES))
        );
        s
    }

    /// The value of `key=` in a check's detail (`a=1 b=x ...`), or a panic with the report.
    #[track_caller]
    pub fn field<'a>(&self, detail: &'a str, key: &str) -> &'a str {
        let prefix = format!("{key}=");
        match detail
            .split_whitespace()
            .find_map(|w| w.strip_prefix(prefix.as_str()))
        {
            Some(v) => v,
            None => panic!(
                "{}",
                self.report(&format!("no {key}= in the guest's detail {detail:?}"))
            ),
        }
    }

    /// [`VmOutcome::field`] as a number, or a panic with the report.
    #[track_caller]
    pub fn num(&self, detail: &str, key: &str) -> u64 {
        let v = self.field(detail, key);
        v.parse().unwrap_or_else(|_| {
            panic!(
                "{}",
                self.report(&format!("{key}={v} is not a number in {detail:?}"))
            )
        })
    }

    /// The check called `name`, or a panic listing what the guest did report.
    #[track_caller]
    pub fn check(&self, name: &str) -> &Check {
        match self.checks.iter().find(|c| c.name == name) {
            Some(c) => c,
            None => {
                let seen: Vec<&str> = self.checks.iter().map(|c| c.name.as_str()).collect();
                panic!(
                    "{}",
                    self.report(&format!("no check {name:?} reported (saw {seen:?})"))
                )
            }
        }
    }

    /// Asserts that check `name` is ok and returns its detail.
    #[track_caller]
    pub fn assert_ok(&self, name: &str) -> &str {
        let c = self.check(name);
        if !c.ok {
            panic!(
                "{}",
                self.report(&format!("check {name} failed: {}", c.detail))
            );
        }
        &c.detail
    }

    /// Asserts that check `name` is ok and its detail is `expected`.
    #[track_caller]
    pub fn assert_detail(&self, name: &str, expected: &str) {
        let got = self.assert_ok(name);
        if got != expected {
            panic!(
                "{}",
                self.report(&format!(
                    "check {name}: expected {expected:?}, guest said {got:?}"
                ))
            );
        }
    }

    /// Asserts that the VMM exited on its own with `code`.
    #[track_caller]
    pub fn assert_exit(&self, code: i32) {
        if self.timed_out || self.exit_code != Some(code) {
            panic!("{}", self.report(&format!("expected VMM exit code {code}")));
        }
    }

    /// Asserts that the guest ran all its scenarios (`PMOTEST-DONE`), every check is ok, and
    /// each scenario reported at least one check.
    #[track_caller]
    pub fn assert_all_ok(&self, scenarios: &[&str]) {
        if !self.done {
            panic!("{}", self.report("the guest never printed PMOTEST-DONE"));
        }
        if self.checks.iter().any(|c| !c.ok) {
            panic!("{}", self.report("a guest check failed"));
        }
        for s in scenarios {
            let prefix = format!("{s}.");
            if !self.checks.iter().any(|c| c.name.starts_with(&prefix)) {
                panic!(
                    "{}",
                    self.report(&format!("scenario {s} reported no check"))
                );
            }
        }
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parses the guest console: the checks, and whether `PMOTEST-DONE` came.
///
/// A `PMOTEST` line is found anywhere in a console line, since a kernel message can be
/// printed in front of it on the shared serial line.
pub fn parse_checks(console: &str) -> (Vec<Check>, bool) {
    let mut checks = Vec::new();
    let mut done = false;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if line.contains("PMOTEST-DONE") {
            done = true;
            continue;
        }
        let Some(pos) = line.find("PMOTEST ") else {
            continue;
        };
        let mut parts = line[pos + "PMOTEST ".len()..].splitn(3, ' ');
        let (Some(name), Some(verdict)) = (parts.next(), parts.next()) else {
            continue;
        };
        let ok = match verdict {
            "ok" => true,
            "fail" => false,
            _ => continue,
        };
        checks.push(Check {
            name: name.to_string(),
            ok,
            detail: parts.next().unwrap_or("").trim().to_string(),
        });
    }
    (checks, done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_checks_anywhere_in_a_line() {
        let console = "boot\r\nPMOTEST boot_info.cpus ok 2\r\n[ 1.0] x PMOTEST pmem_read.match fail want=41 got=00\nPMOTEST bad line\nPMOTEST a.b ok\nPMOTEST-DONE\n";
        let (checks, done) = parse_checks(console);
        assert!(done);
        assert_eq!(checks.len(), 3);
        assert_eq!(
            checks[0],
            Check {
                name: "boot_info.cpus".into(),
                ok: true,
                detail: "2".into()
            }
        );
        assert!(!checks[1].ok);
        assert_eq!(checks[1].detail, "want=41 got=00");
        assert_eq!(checks[2].detail, "");
    }

    fn outcome(console: &str) -> VmOutcome {
        let (checks, done) = parse_checks(console);
        VmOutcome {
            name: "t".into(),
            backend: Backend::Direct,
            exit_code: Some(0),
            timed_out: false,
            console: console.into(),
            vmm_stderr: String::new(),
            checks,
            done,
            elapsed: Duration::from_secs(1),
            attempts: 1,
            log_dir: PathBuf::from("/tmp/x"),
        }
    }

    #[test]
    fn assertions_pass_and_fail_with_the_console_tail() {
        let o = outcome("hello\nPMOTEST s.c ok 7\nPMOTEST-DONE\n");
        o.assert_all_ok(&["s"]);
        o.assert_detail("s.c", "7");
        o.assert_exit(0);
        let err = std::panic::catch_unwind(|| o.assert_detail("s.c", "8")).unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.contains("expected \"8\""), "{msg}");
        assert!(msg.contains("| hello"), "{msg}");
        assert!(std::panic::catch_unwind(|| o.assert_all_ok(&["other"])).is_err());
        assert!(std::panic::catch_unwind(|| o.check("s.missing")).is_err());
    }
}
