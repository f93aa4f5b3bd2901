//! The logic behind `pmovmm store create|mkpmo|ls|inspect|fsck|verify|destroy`.
//!
//! The VMM's `main.rs` owns argument parsing; each subcommand maps to one function here that
//! takes paths and values, prints human output (with a progress bar for long operations) to the
//! given writers, and returns a typed result.

use pmo_store::crypto::{Suite, UserKey};
use pmo_store::medium::{FileMedium, Medium, MediumError};
use pmo_store::record::{read_slot, SlotContent};
use pmo_store::superblock::Superblock;
use pmo_store::{
    CreateOptions, Design, FsckReport, OpenOptions, PmoInfo, RecoveryReport, Store, StoreError,
    StoreOptions,
};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use zeroize::Zeroizing;

/// CLI errors.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A size argument did not parse.
    #[error("invalid size {0:?} (use bytes or a K/M/G/T suffix)")]
    BadSize(String),
    /// Unknown design name.
    #[error("unknown design {0:?} (wedi, bp-ip, bp-id, sp-ip, sp-id, d)")]
    BadDesign(String),
    /// Unknown suite name.
    #[error("unknown suite {0:?} (xts-blake3, paper, aes-gcm)")]
    BadSuite(String),
    /// The key file could not be read or is empty.
    #[error("key file {path}: {why}")]
    Key {
        /// Path.
        path: String,
        /// Why.
        why: String,
    },
    /// The store file could not be used.
    #[error(transparent)]
    Medium(#[from] MediumError),
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// fsck found problems.
    #[error("fsck found {0} problem(s)")]
    Unclean(usize),
    /// Writing output failed.
    #[error("output: {0}")]
    Output(#[from] std::io::Error),
}

/// Parses "4096", "16M", "16MiB", "1G", "64GiB", "2T".
pub fn parse_size(s: &str) -> Result<u64, CliError> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], 1u64 << 10),
        Some('m') => (&stripped[..stripped.len() - 1], 1 << 20),
        Some('g') => (&stripped[..stripped.len() - 1], 1 << 30),
        Some('t') => (&stripped[..stripped.len() - 1], 1 << 40),
        _ => (stripped, 1),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| CliError::BadSize(s.to_string()))
}

/// Parses a design name.
pub fn parse_design(s: &str) -> Result<Design, CliError> {
    Design::from_name(s).ok_or_else(|| CliError::BadDesign(s.to_string()))
}

/// Parses a suite name.
pub fn parse_suite(s: &str) -> Result<Suite, CliError> {
    Suite::from_name(s).map_err(|_| CliError::BadSuite(s.to_string()))
}

/// Reads a key from a file (one trailing newline is dropped). The buffer is zeroized.
pub fn read_key_file(path: &Path) -> Result<UserKey, CliError> {
    let err = |why: String| CliError::Key {
        path: path.display().to_string(),
        why,
    };
    let mut bytes = Zeroizing::new(std::fs::read(path).map_err(|e| err(e.to_string()))?);
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    UserKey::new(&bytes).map_err(|_| err("empty key".into()))
}

/// A text progress bar on a writer (stderr in the CLI).
pub struct Progress<'a> {
    out: &'a mut dyn Write,
    what: &'static str,
    last: u64,
}

impl<'a> Progress<'a> {
    /// Starts a bar labelled `what`.
    pub fn new(out: &'a mut dyn Write, what: &'static str) -> Self {
        Self {
            out,
            what,
            last: u64::MAX,
        }
    }
    /// Updates the bar (redraws only when the percentage changes).
    pub fn update(&mut self, done: u64, total: u64) {
        let pct = done.saturating_mul(100).checked_div(total).unwrap_or(100);
        if pct == self.last {
            return;
        }
        self.last = pct;
        let filled = (pct / 5) as usize;
        let _ = write!(
            self.out,
            "\r{} [{}{}] {:3}%",
            self.what,
            "#".repeat(filled),
            " ".repeat(20 - filled.min(20)),
            pct
        );
        if pct >= 100 {
            let _ = writeln!(self.out);
        }
        let _ = self.out.flush();
    }
}

/// A store file and, optionally, its rollback anchor (`--anchor FILE`).
#[derive(Debug, Clone, Copy)]
pub struct StoreFile<'a> {
    /// The store file.
    pub path: &'a Path,
    /// The anchor file: refuses a store older than it; created from the store if missing.
    pub anchor: Option<&'a Path>,
}

impl<'a> StoreFile<'a> {
    /// A store without an anchor.
    pub fn plain(path: &'a Path) -> Self {
        Self { path, anchor: None }
    }
}

fn open_store(f: StoreFile<'_>) -> Result<(Store, RecoveryReport), CliError> {
    let m: Arc<dyn Medium> = Arc::new(FileMedium::open(f.path)?);
    let opts = OpenOptions {
        anchor: f.anchor.map(Path::to_path_buf),
        ..OpenOptions::default()
    };
    Ok(Store::open_with(m, &opts)?)
}

/// `store create PATH SIZE [--slots N] [--anchor A]`: a new sparse store file.
pub fn store_create(
    f: StoreFile<'_>,
    size: u64,
    slots: Option<u32>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Superblock, CliError> {
    let path = f.path;
    let m: Arc<dyn Medium> = Arc::new(FileMedium::create(path, size)?);
    let mut bar = Progress::new(err, "format");
    let opts = StoreOptions {
        slots: slots.unwrap_or(StoreOptions::default().slots),
        anchor: f.anchor.map(Path::to_path_buf),
        ..StoreOptions::default()
    };
    let s = Store::create_with_progress(m, opts, &mut |d, t| bar.update(d, t))?;
    let sb = s.superblock().clone();
    writeln!(
        out,
        "created store {} ({} bytes, {} PMO slots, data area at {:#x})",
        path.display(),
        sb.medium_len,
        sb.slots,
        sb.data_off
    )?;
    Ok(sb)
}

/// `store mkpmo PATH NAME SIZE --key-file F [--design D] [--suite S] [--kdf K]`: a new PMO.
pub fn pmo_create(
    f: StoreFile<'_>,
    name: &str,
    size: u64,
    key: &UserKey,
    opts: CreateOptions,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let (s, _) = open_store(f)?;
    s.create_pmo_with(name, size, key, opts)?;
    writeln!(
        out,
        "created PMO {name} ({size} bytes, design {}, suite {}, key derivation {})",
        opts.design.name(),
        opts.suite.name(),
        opts.kdf.unwrap_or_default()
    )?;
    Ok(())
}

/// `store ls PATH`: one line per PMO.
pub fn store_ls(f: StoreFile<'_>, out: &mut dyn Write) -> Result<Vec<PmoInfo>, CliError> {
    let (s, _) = open_store(f)?;
    let list = s.list();
    writeln!(
        out,
        "{:<32} {:>14} {:>6} {:>10} {:>8} {:>8}",
        "NAME", "SIZE", "STATE", "SUITE", "DESIGN", "EPOCH"
    )?;
    for p in &list {
        writeln!(
            out,
            "{:<32} {:>14} {:>6} {:>10} {:>8} {:>8}",
            p.name,
            p.size,
            p.state.name(),
            p.suite.name(),
            p.design.name(),
            p.epoch
        )?;
    }
    Ok(list)
}

/// What `inspect` reads, without running recovery or writing anything.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The superblock.
    pub superblock: Superblock,
    /// Live records: (slot, name, state, npages, extent offset, extent length, epoch).
    pub records: Vec<(u32, String, &'static str, u64, u64, u64, u64)>,
    /// Damaged slots.
    pub damaged: Vec<u32>,
}

/// `store inspect PATH`: superblock and raw table, read-only, without the owner lock (so it also
/// works while a VMM has the store open; it may then show a record mid-update).
pub fn store_inspect(path: &Path, out: &mut dyn Write) -> Result<Inspection, CliError> {
    // Read-only and unlocked: inspect works while a VMM owns the store.
    let m = FileMedium::open_readonly(path)?;
    let sb = Superblock::read(&m).map_err(StoreError::from)?;
    writeln!(
        out,
        "store uuid {} len {} slots {} table {:#x} data {:#x}",
        sb.uuid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
        sb.medium_len,
        sb.slots,
        sb.table_off,
        sb.data_off
    )?;
    let mut records = Vec::new();
    let mut damaged = Vec::new();
    for slot in 0..sb.slots {
        match read_slot(&m, &sb, slot)? {
            SlotContent::Blank => {}
            SlotContent::Damaged => {
                writeln!(out, "slot {slot}: DAMAGED")?;
                damaged.push(slot);
            }
            SlotContent::Valid { rec, copy } => {
                if rec.state == pmo_store::PmoState::Free {
                    continue;
                }
                writeln!(
                    out,
                    "slot {slot} (copy {copy}, seq {}): {:?} state {} pages {} extent {:#x}+{:#x} epoch {} suite {} design {}",
                    rec.seq,
                    rec.name,
                    rec.state.name(),
                    rec.npages,
                    rec.ext_off,
                    rec.ext_len,
                    rec.epoch,
                    rec.keys.suite.name(),
                    rec.design.name()
                )?;
                records.push((
                    slot,
                    rec.name.clone(),
                    rec.state.name(),
                    rec.npages,
                    rec.ext_off,
                    rec.ext_len,
                    rec.epoch,
                ));
            }
        }
    }
    Ok(Inspection {
        superblock: sb,
        records,
        damaged,
    })
}

/// `store fsck PATH`: open (runs recovery), then the keyless structural check.
pub fn store_fsck(
    f: StoreFile<'_>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<FsckReport, CliError> {
    let (s, rep) = open_store(f)?;
    for (name, state, action) in &rep.actions {
        writeln!(
            out,
            "recovered {name}: found in {} -> {action:?}",
            state.name()
        )?;
    }
    for (slot, why) in &rep.bad_slots {
        writeln!(out, "slot {slot}: {why}")?;
    }
    let mut bar = Progress::new(err, "fsck");
    let f = s.fsck_with_progress(&mut |d, t| bar.update(d, t));
    for p in &f.problems {
        writeln!(out, "problem: {p}")?;
    }
    writeln!(
        out,
        "{} PMOs checked, {} problem(s)",
        f.pmos,
        f.problems.len()
    )?;
    if f.problems.is_empty() {
        Ok(f)
    } else {
        Err(CliError::Unclean(f.problems.len()))
    }
}

/// `store verify PATH NAME --key-file F`: keyed check of every page of one PMO.
pub fn store_verify(
    f: StoreFile<'_>,
    name: &str,
    key: &UserKey,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Vec<u64>, CliError> {
    let (s, _) = open_store(f)?;
    let mut bar = Progress::new(err, "verify");
    let bad = s.verify_pmo(name, key, &mut |d, t| bar.update(d, t))?;
    for p in &bad {
        writeln!(out, "page {p}: failed integrity verification")?;
    }
    writeln!(out, "{name}: {} page(s) failed", bad.len())?;
    if bad.is_empty() {
        Ok(bad)
    } else {
        Err(CliError::Unclean(bad.len()))
    }
}

/// `store destroy PATH NAME --key-file F`: destroy a PMO (key required; scrubs its space).
pub fn store_destroy(
    f: StoreFile<'_>,
    name: &str,
    key: &UserKey,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let (s, _) = open_store(f)?;
    s.destroy_pmo(name, key)?;
    writeln!(out, "destroyed PMO {name}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("16M").unwrap(), 16 << 20);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("64G").unwrap(), 64 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn cli_flow_on_a_sparse_file() {
        let dir = std::env::temp_dir().join(format!("pmo-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("store");
        let keyf = dir.join("key");
        std::fs::write(&keyf, b"cli-key\n").unwrap();
        let key = read_key_file(&keyf).unwrap();
        let sf = StoreFile::plain(&path);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        store_create(sf, 1 << 30, Some(1024), &mut out, &mut err).unwrap();
        assert!(String::from_utf8_lossy(&err).contains("100%"));
        pmo_create(
            sf,
            "db",
            16 << 20,
            &key,
            CreateOptions {
                kdf: Some(pmo_store::crypto::KdfParams::INSECURE_FAST),
                ..CreateOptions::default()
            },
            &mut out,
        )
        .unwrap();
        let list = store_ls(sf, &mut out).unwrap();
        assert_eq!(list.len(), 1);
        let ins = store_inspect(&path, &mut out).unwrap();
        assert_eq!(ins.records.len(), 1);
        store_fsck(sf, &mut out, &mut err).unwrap();
        assert!(store_verify(sf, "db", &key, &mut out, &mut err)
            .unwrap()
            .is_empty());
        // Tamper with the file: one byte of the PMO's first page, after writing it.
        {
            let (s, _) = open_store(sf).unwrap();
            let w = s.attach("db", pmo_store::Perm::Write, &key).unwrap();
            w.psync([(0u64, &[9u8; pmo_store::crypto::PAGE])]).unwrap();
            w.detach().wait().unwrap();
            let off = s.list()[0].extent.0 + 100;
            let mut b = [0u8; 1];
            s.medium().read(off, &mut b).unwrap();
            s.medium().write(off, &[b[0] ^ 0xff]).unwrap();
            s.medium().persist(off, 1).unwrap();
        }
        assert!(matches!(
            store_verify(sf, "db", &key, &mut out, &mut err),
            Err(CliError::Unclean(1))
        ));
        assert!(matches!(
            store_destroy(sf, "db", &UserKey::new(b"bad").unwrap(), &mut out),
            Err(CliError::Store(StoreError::WrongKey))
        ));
        store_destroy(sf, "db", &key, &mut out).unwrap();
        assert!(store_ls(sf, &mut out).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
