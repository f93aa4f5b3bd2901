//! What L1 boots with: the payload archive (the VMM and its libraries, the guest image,
//! `/job/run.sh`) appended to its initramfs, and the pmem files that travel as disks.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cpio::CpioWriter;
use crate::env::{timeout_scale, Env};
use crate::error::{Result, RunnerError};
use crate::spec::{push_anchor, vmm_args, VmSpec};

/// A pmem host file and how L1 sees it.
pub(super) struct Disk {
    pub(super) host: PathBuf,
    pub(super) serial: String,
    pub(super) inside: PathBuf,
}

/// A file to put into L1 (host path, path in L1, mode).
type PayloadFile = (PathBuf, String, u32);

pub(super) struct Payload {
    pub(super) job: String,
    pub(super) files: Vec<PayloadFile>,
}

/// Assigns a virtio-blk disk to each distinct pmem file, creating or growing host files to
/// the size the spec asks for (a disk's size is fixed when L1 starts, so the file must have
/// its final size before; the VMM then sees an existing file of that size).
pub(super) fn prepare_disks(specs: &[VmSpec]) -> Result<Vec<Disk>> {
    let mut disks: Vec<Disk> = Vec::new();
    for spec in specs {
        spec.validate().map_err(|detail| RunnerError::InvalidSpec {
            name: spec.name.clone(),
            detail,
        })?;
        for p in spec.host_files() {
            let len = fs::metadata(&p.path).map(|m| m.len()).ok();
            let want = p.size.unwrap_or(0).max(len.unwrap_or(0));
            if len.is_none() && p.size.is_none() {
                return Err(RunnerError::InvalidSpec {
                    name: spec.name.clone(),
                    detail: format!(
                        "pmem file {} does not exist and has no size",
                        p.path.display()
                    ),
                });
            }
            if !want.is_multiple_of(512) || want == 0 {
                return Err(RunnerError::InvalidSpec {
                    name: spec.name.clone(),
                    detail: format!(
                        "pmem size {want} of {} is not a multiple of 512",
                        p.path.display()
                    ),
                });
            }
            if len.is_none_or(|l| l < want) {
                let f = OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&p.path)
                    .map_err(|e| RunnerError::io(format!("create {}", p.path.display()), e))?;
                f.set_len(want)
                    .map_err(|e| RunnerError::io(format!("size {}", p.path.display()), e))?;
            }
            if !disks.iter().any(|d| d.host == p.path) {
                let n = disks.len();
                disks.push(Disk {
                    host: p.path.clone(),
                    serial: format!("pmem{n}"),
                    inside: PathBuf::from(format!("/run/pmem/p{n}.img")),
                });
            }
        }
    }
    Ok(disks)
}

pub(super) fn backup(disks: &[Disk], log_dir: &Path) -> Result<Vec<Option<PathBuf>>> {
    disks
        .iter()
        .map(|d| {
            let b = log_dir.join(format!("{}.backup", d.serial));
            fs::copy(&d.host, &b)
                .map_err(|e| RunnerError::io(format!("back up {}", d.host.display()), e))?;
            Ok(Some(b))
        })
        .collect()
}

pub(super) fn restore(disks: &[Disk], backups: &[Option<PathBuf>]) -> Result<()> {
    for (d, b) in disks.iter().zip(backups) {
        if let Some(b) = b {
            fs::copy(b, &d.host)
                .map_err(|e| RunnerError::io(format!("restore {}", d.host.display()), e))?;
        }
    }
    Ok(())
}

/// Quotes `s` for the test host's shell.
pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The shared libraries and loader of a dynamic executable, from `ldd`.
pub(super) fn shared_libs(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|source| RunnerError::Spawn {
            program: "ldd".into(),
            source,
        })?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(RunnerError::Ldd {
            binary: binary.to_path_buf(),
            detail: text.trim().to_string(),
        });
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.contains("not found") {
            return Err(RunnerError::Ldd {
                binary: binary.to_path_buf(),
                detail: format!("missing library: {line}"),
            });
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

pub(super) fn build_payload(
    env: &Env,
    pmovmm: &Path,
    specs: &[VmSpec],
    disks: &[Disk],
) -> Result<Payload> {
    let mut files: Vec<PayloadFile> =
        vec![(pmovmm.to_path_buf(), "payload/bin/pmovmm".into(), 0o755)];
    for lib in shared_libs(pmovmm)? {
        let inside = lib.display().to_string();
        files.push((lib, inside, 0o755));
    }
    // A debugging aid: PMO_TESTHOST_EXTRA=DIR adds DIR's tree to L1's root (e.g. strace
    // with its libraries, to look at the VMM inside the test host).
    if let Some(extra) = std::env::var_os("PMO_TESTHOST_EXTRA") {
        add_tree(Path::new(&extra), "", &mut files)?;
    }
    // Distinct guest kernels and initrds, each once.
    let mut images: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut image_path = |host: PathBuf, files: &mut Vec<PayloadFile>| -> String {
        let n = images.len();
        images
            .entry(host.clone())
            .or_insert_with(|| {
                let inside = format!(
                    "payload/l2/{n}-{}",
                    host.file_name()
                        .map(|f| f.to_string_lossy().to_string())
                        .unwrap_or_default()
                );
                files.push((host, inside.clone(), 0o644));
                inside
            })
            .clone()
    };

    let scale = timeout_scale();
    let mut job =
        String::from("# Written by pmo-integration (src/testhost.rs); runs in L1's /init.\n");
    let mut copied_in = vec![false; disks.len()];
    for (i, spec) in specs.iter().enumerate() {
        let (kernel, initrd) = spec.boot_files(env)?;
        for (what, p) in [("kernel", &kernel), ("initrd", &initrd)] {
            if !p.is_file() {
                return Err(RunnerError::InvalidSpec {
                    name: spec.name.clone(),
                    detail: format!("{what} {} does not exist", p.display()),
                });
            }
        }
        let k_in = format!("/{}", image_path(kernel, &mut files));
        let i_in = format!("/{}", image_path(initrd, &mut files));
        let mut used = Vec::new();
        // A host file's path inside L1, copied in before its first VM.
        let mut inside = |path: &Path| -> Option<PathBuf> {
            let d = disks.iter().position(|d| d.host == path)?;
            if !copied_in[d] {
                job += &format!(
                    "th_file_in {} {}\n",
                    disks[d].serial,
                    sh_quote(&disks[d].inside.display().to_string())
                );
                copied_in[d] = true;
            }
            used.push(d);
            Some(disks[d].inside.clone())
        };
        let pmem_in: Vec<PathBuf> = spec.pmem.iter().filter_map(|p| inside(&p.path)).collect();
        let store_in = spec.pmo_store.as_ref().and_then(|p| inside(&p.path));
        let mut cxl_in = Vec::new();
        for (j, c) in spec.cxl.iter().enumerate() {
            let (Some(media), Some(lsa)) = (inside(&c.media.path), inside(&c.lsa.path)) else {
                continue;
            };
            // Key files are read-only: they travel in the payload.
            let key = c.key.as_ref().map(|k| {
                let at = format!("payload/cxl/{i}-{j}.key");
                files.push((k.clone(), at.clone(), 0o600));
                PathBuf::from(format!("/{at}"))
            });
            cxl_in.push((media, lsa, key));
        }
        let master_key = spec.pmo_on_cxl.as_ref().map(|(_, k)| {
            let at = format!("payload/pmo/{i}.key");
            files.push((k.clone(), at.clone(), 0o600));
            PathBuf::from(format!("/{at}"))
        });
        let mut args = vmm_args(
            spec,
            Path::new(&k_in),
            Path::new(&i_in),
            &pmem_in,
            store_in.as_deref(),
            master_key.as_deref(),
            &cxl_in,
        );
        // The anchor travels in the payload, writable by the VMM there.
        let anchor = spec.pmo_anchor.as_ref().map(|a| {
            let at = format!("payload/pmo/{i}.anchor");
            files.push((a.clone(), at.clone(), 0o600));
            PathBuf::from(format!("/{at}"))
        });
        push_anchor(&mut args, anchor.as_deref());
        let secs = spec.timeout.mul_f64(scale).as_secs().max(1);
        if spec.shell {
            job += &format!("th_shell {i} /payload/bin/pmovmm");
        } else if let Some(on) = &spec.signal_on {
            job += &format!(
                "th_vm_on {i} {secs} {} {} /payload/bin/pmovmm",
                on.signal.name(),
                sh_quote(&on.needle())
            );
        } else if let Some(term) = spec.term_after {
            let term = term.mul_f64(scale).as_secs().max(1);
            job += &format!("th_vm {i} {secs} timeout -s TERM {term} /payload/bin/pmovmm");
        } else {
            job += &format!("th_vm {i} {secs} /payload/bin/pmovmm");
        }
        for a in &args {
            job.push(' ');
            job += &sh_quote(a);
        }
        job.push('\n');
        used.sort_unstable();
        used.dedup();
        for d in used {
            job += &format!(
                "th_file_out {} {}\n",
                disks[d].serial,
                sh_quote(&disks[d].inside.display().to_string())
            );
        }
    }
    Ok(Payload { job, files })
}

/// Adds the files under `dir` (symlinks followed) at `prefix/<relative path>`.
pub(super) fn add_tree(dir: &Path, prefix: &str, files: &mut Vec<PayloadFile>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let entries =
        fs::read_dir(dir).map_err(|e| RunnerError::io(format!("read {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| RunnerError::io(format!("read {}", dir.display()), e))?;
        let path = entry.path();
        let name = format!("{prefix}/{}", entry.file_name().to_string_lossy());
        let meta = fs::metadata(&path)
            .map_err(|e| RunnerError::io(format!("stat {}", path.display()), e))?;
        if meta.is_dir() {
            add_tree(&path, &name, files)?;
        } else if meta.is_file() {
            files.push((path, name, meta.permissions().mode() & 0o7777));
        }
    }
    Ok(())
}

pub(super) fn write_initrd(base: &Path, payload: &Payload, dst: &Path) -> Result<()> {
    let io = |what: &str, e| RunnerError::io(format!("{what} {}", dst.display()), e);
    let mut out = BufWriter::new(File::create(dst).map_err(|e| io("create", e))?);
    let mut b = File::open(base).map_err(|e| io("read base of", e))?;
    let n = std::io::copy(&mut b, &mut out).map_err(|e| io("write", e))?;
    // The kernel finds an uncompressed archive after a compressed one only at a 4-byte
    // boundary; it skips the zero padding.
    let pad = ((4 - n % 4) % 4) as usize;
    out.write_all(&[0u8; 3][..pad])
        .map_err(|e| io("write", e))?;
    let mut w = CpioWriter::new(out);
    w.add_bytes("job/run.sh", 0o644, payload.job.as_bytes())
        .map_err(|e| io("write", e))?;
    for (host, inside, mode) in &payload.files {
        w.add_file(inside, *mode, host).map_err(|e| {
            RunnerError::io(format!("add {} to {}", host.display(), dst.display()), e)
        })?;
    }
    let mut out = w.finish().map_err(|e| io("write", e))?;
    out.flush().map_err(|e| io("write", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn ldd_of_a_dynamic_binary_lists_the_loader() {
        let libs = shared_libs(Path::new("/bin/sh")).unwrap();
        assert!(
            libs.iter()
                .any(|l| l.to_string_lossy().contains("ld-linux")),
            "{libs:?}"
        );
    }
}
