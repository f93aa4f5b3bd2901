//! The guest image under plain QEMU (TCG), no pmovmm involved.
//!
//! Why: it tells a broken guest image apart from a broken VMM. QEMU's virtio-pmem and
//! pvpanic are the reference the image is known to work with; the same scenarios run here.

use std::fs::{self, OpenOptions};
use std::process::Command;

use crate::env::{timeout_scale, which, Env};
use crate::error::{Result, RunnerError};
use crate::outcome::{parse_checks, Backend, VmOutcome};
use crate::process::run_logged;
use crate::spec::VmSpec;

/// Runs each spec's guest under `qemu-system-x86_64 -accel tcg`, in order.
///
/// pmem files are created with the spec's size if missing; `extra_args` are ignored (they
/// are pmovmm arguments). A guest panic makes QEMU exit with 1 (pvpanic), poweroff with 0.
pub fn run_in_qemu(env: &Env, specs: &[VmSpec]) -> Result<Vec<VmOutcome>> {
    let qemu = which(
        "qemu-system-x86_64",
        "install qemu-system-x86 (scripts/setup.sh)",
    )?;
    let label = crate::spec::run_label(specs);
    let log_dir = env.new_log_dir(&format!("qemu-{label}"))?;
    let _lock = env.lock()?;
    let mut outcomes = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        spec.validate().map_err(|detail| RunnerError::InvalidSpec {
            name: spec.name.clone(),
            detail,
        })?;
        let (kernel, initrd) = spec.boot_files(env)?;
        let mut cmd = Command::new(&qemu);
        let mut pmem_total = 0;
        let mut devs = Vec::new();
        for (n, p) in spec.pmem.iter().enumerate() {
            let len = fs::metadata(&p.path).map(|m| m.len()).unwrap_or(0);
            let size = p.size.unwrap_or(len);
            if len < size {
                OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&p.path)
                    .and_then(|f| f.set_len(size))
                    .map_err(|e| RunnerError::io(format!("create {}", p.path.display()), e))?;
            }
            pmem_total += size;
            let file = p.path.display().to_string().replace(',', ",,");
            devs.push(format!(
                "memory-backend-file,id=pm{n},share=on,mem-path={file},size={size}"
            ));
            devs.push(format!("virtio-pmem-pci,memdev=pm{n},id=pmem{n}"));
        }
        let maxmem = spec.memory_mib + (pmem_total >> 20) + 1024;
        cmd.args(["-accel", "tcg", "-M", "q35", "-cpu", "max"])
            .args(["-smp", &spec.cpus.to_string()])
            .arg("-m")
            .arg(format!("{}M,slots=4,maxmem={maxmem}M", spec.memory_mib))
            .args(["-nodefaults", "-no-user-config", "-display", "none"])
            .args(["-serial", "stdio", "-no-reboot"])
            .args(["-device", "pvpanic", "-action", "panic=exit-failure"])
            .arg("-kernel")
            .arg(&kernel)
            .arg("-initrd")
            .arg(&initrd)
            .arg("-append")
            .arg(spec.kernel_cmdline());
        for pair in devs.chunks(2) {
            cmd.arg("-object")
                .arg(&pair[0])
                .arg("-device")
                .arg(&pair[1]);
        }
        let _ = fs::write(log_dir.join(format!("vm{i}-cmd.txt")), format!("{cmd:?}\n"));
        let cap = run_logged(
            cmd,
            spec.timeout.mul_f64(timeout_scale()),
            &log_dir.join(format!("vm{i}-{}-console.log", spec.name)),
            &log_dir.join(format!("vm{i}-{}-stderr.log", spec.name)),
            "QEMU| ",
        )?;
        let console = cap.stdout_text();
        let (checks, done) = parse_checks(&console);
        outcomes.push(VmOutcome {
            name: spec.name.clone(),
            backend: Backend::Qemu,
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
