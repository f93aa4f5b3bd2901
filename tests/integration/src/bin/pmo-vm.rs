//! `pmo-vm`: boot the test guest under pmovmm from the command line, where this machine can
//! (directly on hardware KVM, else in the nested test host), and show what it reported.
//!
//! ```text
//! pmo-vm [--cpus N] [--memory MIB] [--pmem FILE[,SIZE]]... [--param KEY=VALUE]...
//!        [--timeout SECS] [--verbose] --boot SCENARIO[,SCENARIO...] [--boot ...]
//! pmo-vm [--cpus N] [--memory MIB] [--pmem FILE[,SIZE]]... --shell
//! ```
//! `--shell` boots one VM with an interactive shell on its console, attached to this terminal;
//! exit the shell to power the guest off (in the nested test host, Ctrl-C ends QEMU).
//! Each `--boot` is one VM (all share the other options), run in order in one test host boot,
//! e.g. write a pattern to pmem, then read it back after a reboot. Exit status 0 when every VM
//! exited 0 and every check was ok.

use std::process::ExitCode;
use std::time::Duration;

use pmo_integration::{backend, run_shell, run_vms, VmOutcome, VmSpec};

const USAGE: &str = "usage: pmo-vm [--cpus N] [--memory MIB] [--pmem FILE[,SIZE]]... \
[--pmo-store FILE[,SIZE]] [--param KEY=VALUE]... [--timeout SECS] [--verbose] \
--boot SCENARIO[,SCENARIO...] [--boot ...]\n   \
or: pmo-vm [--cpus N] [--memory MIB] [--pmem FILE[,SIZE]]... [--pmo-store FILE[,SIZE]] --shell";

/// Size of a PMO store the runner formats when `--pmo-store` names a missing file without one.
const DEFAULT_STORE_SIZE: u64 = 256 << 20;

/// What the command line asks for.
struct Request {
    specs: Vec<VmSpec>,
    shell: bool,
}

fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

fn parse(args: &[String]) -> Result<Request, String> {
    let mut template = VmSpec::new("vm");
    let mut boots: Vec<String> = Vec::new();
    let mut shell = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "--cpus" => {
                template.cpus = value(a)?.parse().map_err(|_| "bad --cpus".to_string())?;
            }
            "--memory" => {
                template.memory_mib = value(a)?
                    .parse()
                    .map_err(|_| "bad --memory (MiB)".to_string())?;
            }
            "--pmem" => {
                let v = value(a)?;
                let (file, size) = match v.rsplit_once(',') {
                    Some((f, s)) => (
                        f.to_string(),
                        Some(parse_size(s).ok_or(format!("bad size in --pmem {v}"))?),
                    ),
                    None => (v.clone(), None),
                };
                template = template.pmem(file, size);
            }
            "--pmo-store" => {
                let v = value(a)?;
                let (file, size) = match v.rsplit_once(',') {
                    Some((f, s)) => (
                        f.to_string(),
                        parse_size(s).ok_or(format!("bad size in --pmo-store {v}"))?,
                    ),
                    None => (v.clone(), DEFAULT_STORE_SIZE),
                };
                template = template.pmo_store(file, size);
            }
            "--param" => {
                let v = value(a)?;
                let (k, val) = v
                    .split_once('=')
                    .ok_or(format!("--param {v}: want KEY=VALUE"))?;
                template = template.param(k, val);
            }
            "--timeout" => {
                let secs: u64 = value(a)?.parse().map_err(|_| "bad --timeout".to_string())?;
                template = template.timeout(Duration::from_secs(secs));
            }
            "--verbose" => template = template.verbose_console(true),
            "--boot" => boots.push(value(a)?),
            "--shell" => shell = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if shell {
        if !boots.is_empty() {
            return Err(format!("--shell and --boot exclude each other\n{USAGE}"));
        }
        template.name = "shell".into();
        return Ok(Request {
            specs: vec![template],
            shell: true,
        });
    }
    if boots.is_empty() {
        return Err(format!("no --boot given\n{USAGE}"));
    }
    let specs = boots
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut spec = template.clone();
            spec.name = format!("vm{i}");
            spec.scenarios = b
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            spec
        })
        .collect();
    Ok(Request {
        specs,
        shell: false,
    })
}

fn show(o: &VmOutcome) -> bool {
    println!("===== {} ({:?}) console =====", o.name, o.backend);
    print!("{}", o.console);
    println!("===== {} summary =====", o.name);
    println!(
        "exit code: {}{}; {:.1} s; logs: {}",
        o.exit_code
            .map_or_else(|| "none (killed)".into(), |c| c.to_string()),
        if o.timed_out { " (timed out)" } else { "" },
        o.elapsed.as_secs_f64(),
        o.log_dir.display()
    );
    for c in &o.checks {
        println!(
            "  {:<28} {:<4} {}",
            c.name,
            if c.ok { "ok" } else { "FAIL" },
            c.detail
        );
    }
    o.exit_code == Some(0) && o.done && o.checks.iter().all(|c| c.ok)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let req = match parse(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pmo-vm: {e}");
            return ExitCode::from(2);
        }
    };
    let specs = req.specs;
    match backend() {
        Ok(b) => eprintln!("pmo-vm: running {} VM(s), {b:?}", specs.len()),
        Err(e) => {
            eprintln!("pmo-vm: {e}");
            return ExitCode::from(2);
        }
    }
    if req.shell {
        return match run_shell(&specs[0]) {
            Ok(Some(0)) => ExitCode::SUCCESS,
            Ok(code) => {
                eprintln!("pmo-vm: exit status {code:?}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("pmo-vm: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match run_vms(&specs) {
        Ok(outcomes) => {
            let mut all = true;
            for o in &outcomes {
                all &= show(o);
            }
            if all {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("pmo-vm: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_boots_and_options() {
        let specs = parse(&args(
            "--cpus 2 --pmem /tmp/p.img,64M --param pattern=X --boot boot_info,pmem_write --boot pmem_read",
        ))
        .unwrap()
        .specs;
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].cpus, 2);
        assert_eq!(specs[0].scenarios, ["boot_info", "pmem_write"]);
        assert_eq!(specs[1].scenarios, ["pmem_read"]);
        assert_eq!(specs[1].pmem[0].size, Some(64 << 20));
        assert_eq!(specs[1].params, [("pattern".to_string(), "X".to_string())]);
        assert!(parse(&args("--cpus 2")).is_err());
        assert!(parse(&args("--bogus")).is_err());
        let r = parse(&args("--pmem /tmp/p.img,64M --shell")).unwrap();
        assert!(r.shell && r.specs.len() == 1);
        assert!(parse(&args("--shell --boot x")).is_err());
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
    }
}
