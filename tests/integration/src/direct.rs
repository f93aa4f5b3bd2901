//! Direct mode: `pmovmm` on this machine's hardware KVM, one VM after the other.

use std::process::Command;

use crate::env::{timeout_scale, Env};
use crate::error::{Result, RunnerError};
use crate::outcome::{parse_checks, Backend, VmOutcome};
use crate::process::{run_logged_with, Trigger};
use crate::spec::VmSpec;

pub(crate) fn run_direct(env: &Env, specs: &[VmSpec]) -> Result<Vec<VmOutcome>> {
    let pmovmm = env.require_pmovmm()?;
    let label = crate::spec::run_label(specs);
    let log_dir = env.new_log_dir(&format!("direct-{label}"))?;
    let _lock = env.lock()?;
    crate::spec::ensure_backing_files(&pmovmm, specs)?;
    let mut outcomes = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        spec.validate().map_err(|detail| RunnerError::InvalidSpec {
            name: spec.name.clone(),
            detail,
        })?;
        let args = spec.host_vmm_args(env)?;
        let mut cmd = match spec.term_after {
            // SIGTERM after `term_after`; run_logged's kill still ends it at the timeout.
            Some(term) => {
                let mut c = Command::new("timeout");
                c.args(["-s", "TERM"])
                    .arg(term.mul_f64(timeout_scale()).as_secs().max(1).to_string())
                    .arg(&pmovmm);
                c
            }
            None => Command::new(&pmovmm),
        };
        cmd.args(&args);
        let _ = std::fs::write(log_dir.join(format!("vm{i}-cmd.txt")), format!("{cmd:?}\n"));
        // The VMM itself is the child (no `timeout` wrapper with signal_on), so the signal
        // reaches it.
        let trigger = spec.signal_on.as_ref().map(|on| Trigger {
            needle: on.needle(),
            signal: on.signal.name(),
        });
        let cap = run_logged_with(
            cmd,
            spec.timeout.mul_f64(timeout_scale()).into(),
            &log_dir.join(format!("vm{i}-{}-console.log", spec.name)),
            &log_dir.join(format!("vm{i}-{}-stderr.log", spec.name)),
            "VM| ",
            trigger,
        )?;
        let console = cap.stdout_text();
        let (checks, done) = parse_checks(&console);
        eprintln!(
            "pmo-integration: VM {}: {:.1} s, exit {:?}{}",
            spec.name,
            cap.elapsed.as_secs_f64(),
            cap.status.and_then(|s| s.code()),
            if cap.timed_out { " (timed out)" } else { "" }
        );
        outcomes.push(VmOutcome {
            name: spec.name.clone(),
            backend: Backend::Direct,
            exit_code: cap.status.and_then(|s| s.code()),
            timed_out: cap.timed_out,
            vmm_stderr: cap.stderr_text(),
            console,
            checks,
            done,
            elapsed: cap.elapsed,
            attempts: 1,
            log_dir: log_dir.clone(),
        });
    }
    Ok(outcomes)
}
