//! `pmovmm store create|mkpmo|ls|inspect|fsck|verify|destroy`: a PMO store file on the host.
//!
//! Each subcommand maps to one function that takes paths and values, prints human output
//! (with a progress bar for long operations) to the given writers, and returns a typed result,
//! so the VM tests can call them as the command line does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};
use pmo_store::crypto::{KdfParams, Suite, UserKey};
use pmo_store::medium::{FileMedium, Medium, MediumError};
use pmo_store::record::{read_slot, SlotContent};
use pmo_store::superblock::Superblock;
use pmo_store::{
    CreateOptions, Design, FsckReport, OpenOptions, PmoInfo, RecoveryReport, Store, StoreError,
    StoreOptions,
};
use sizes::{parse_size, SizeError};

use super::{
    read_key_file, refuse_overwrite, AnchorArg, KeyArg, KeyFileError, OverwriteError, Progress,
};

/// What a store subcommand can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreCliError {
    /// A size argument did not parse.
    #[error(transparent)]
    Size(#[from] SizeError),
    /// Unknown design name.
    #[error("unknown design {0:?} (wedi, bp-ip, bp-id, sp-ip, sp-id, d)")]
    BadDesign(String),
    /// Unknown suite name.
    #[error("unknown suite {0:?} (xts-blake3, paper, aes-gcm)")]
    BadSuite(String),
    /// An Argon2id cost that does not parse or is out of bounds.
    #[error("--kdf: {0}")]
    Kdf(String),
    /// The key file could not be read or is empty.
    #[error(transparent)]
    Key(#[from] KeyFileError),
    /// The store file would be formatted over.
    #[error(transparent)]
    Overwrite(#[from] OverwriteError),
    /// The store file could not be used.
    #[error(transparent)]
    Medium(#[from] MediumError),
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// fsck or verify found problems.
    #[error("{0} problem(s) found")]
    Unclean(usize),
    /// Writing output failed.
    #[error("output: {0}")]
    Output(#[from] std::io::Error),
}

/// `pmovmm store ...`: a PMO store file on the host (the guest is not involved).
#[derive(Subcommand)]
pub enum StoreCommand {
    /// Format a new store file (refuses to overwrite a non-empty file).
    Create {
        /// The store file.
        file: PathBuf,
        /// Size of the store (sparse on disk): bytes, or K, M, G, T.
        #[arg(long)]
        size: String,
        /// PMO table slots: the most PMOs the store can hold [default: one per 8 KiB of the
        /// store, at most 65536].
        #[arg(long)]
        slots: Option<u32>,
        /// The store's rollback anchor, if it has one.
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// Create a PMO in a store, as the guest's pcreate would.
    Mkpmo {
        /// The store file.
        file: PathBuf,
        /// The PMO's name.
        name: String,
        /// Size of the PMO: bytes, or K, M, G, T.
        size: String,
        /// Where the PMO's key comes from.
        #[command(flatten)]
        key: KeyArg,
        /// Default design of its attach sessions: wedi, bp-ip, bp-id, sp-ip, sp-id, d.
        #[arg(long, default_value = "d")]
        design: String,
        /// Page cipher and tag: xts-blake3, paper, aes-gcm.
        #[arg(long, default_value = "xts-blake3")]
        suite: String,
        /// Argon2id cost of the key derivation: m=SIZE,t=PASSES,p=LANES or fast
        /// [default: m=64M,t=3,p=1].
        #[arg(long, value_name = "m=SIZE,t=N,p=N|fast")]
        kdf: Option<String>,
        /// The store's rollback anchor, if it has one.
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// List the PMOs in a store.
    Ls {
        /// The store file.
        file: PathBuf,
        /// The store's rollback anchor, if it has one.
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// Show the store's on-media layout and every PMO record (no key needed).
    Inspect {
        /// The store file.
        file: PathBuf,
    },
    /// Run recovery and a keyless structural check of every PMO.
    Fsck {
        /// The store file.
        file: PathBuf,
        /// The store's rollback anchor, if it has one.
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// Check every page of one PMO against its keyed MAC (the key holder's offline check).
    Verify(KeyedPmo),
    /// Destroy a PMO: its data is scrubbed and its space reclaimed.
    Destroy(KeyedPmo),
}

/// One PMO of a store file, with its key.
#[derive(Args)]
pub struct KeyedPmo {
    /// The store file.
    file: PathBuf,
    /// The PMO's name.
    name: String,
    /// Where the PMO's key comes from.
    #[command(flatten)]
    key: KeyArg,
    /// The store's rollback anchor, if it has one.
    #[command(flatten)]
    anchor: AnchorArg,
}

/// Runs one store subcommand; human output to stdout, progress bars to stderr.
pub fn run(cmd: StoreCommand) -> Result<(), StoreCliError> {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    match cmd {
        StoreCommand::Create {
            file,
            size,
            slots,
            anchor,
        } => {
            refuse_overwrite(&file)?;
            let size = parse_size(&size)?;
            let sf = anchor.with(&file);
            store_create(sf, size, slots, &mut out, &mut err)?;
        }
        StoreCommand::Mkpmo {
            file,
            name,
            size,
            key,
            design,
            suite,
            kdf,
            anchor,
        } => {
            let opts = CreateOptions {
                design: parse_design(&design)?,
                suite: parse_suite(&suite)?,
                kdf: Some(match kdf {
                    Some(k) => {
                        KdfParams::parse(&k).map_err(|e| StoreCliError::Kdf(e.to_string()))?
                    }
                    None => KdfParams::DEFAULT,
                }),
            };
            let size = parse_size(&size)?;
            let key = read_key_file(&key.key_file)?;
            pmo_create(anchor.with(&file), &name, size, &key, opts, &mut out)?;
        }
        StoreCommand::Ls { file, anchor } => {
            store_ls(anchor.with(&file), &mut out)?;
        }
        StoreCommand::Inspect { file } => {
            store_inspect(&file, &mut out)?;
        }
        StoreCommand::Fsck { file, anchor } => {
            store_fsck(anchor.with(&file), &mut out, &mut err)?;
        }
        StoreCommand::Verify(p) => {
            let key = read_key_file(&p.key.key_file)?;
            store_verify(p.anchor.with(&p.file), &p.name, &key, &mut out, &mut err)?;
        }
        StoreCommand::Destroy(p) => {
            let key = read_key_file(&p.key.key_file)?;
            store_destroy(p.anchor.with(&p.file), &p.name, &key, &mut out)?;
        }
    }
    Ok(())
}

/// Parses a design name.
pub fn parse_design(s: &str) -> Result<Design, StoreCliError> {
    Design::from_name(s).ok_or_else(|| StoreCliError::BadDesign(s.to_string()))
}

/// Parses a suite name.
pub fn parse_suite(s: &str) -> Result<Suite, StoreCliError> {
    Suite::from_name(s).map_err(|_| StoreCliError::BadSuite(s.to_string()))
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

fn open_store(f: StoreFile<'_>) -> Result<(Store, RecoveryReport), StoreCliError> {
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
) -> Result<Superblock, StoreCliError> {
    let path = f.path;
    let m: Arc<dyn Medium> = Arc::new(FileMedium::create(path, size)?);
    let mut bar = Progress::new(err, "format");
    let opts = StoreOptions {
        slots,
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
) -> Result<(), StoreCliError> {
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
pub fn store_ls(f: StoreFile<'_>, out: &mut dyn Write) -> Result<Vec<PmoInfo>, StoreCliError> {
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
pub fn store_inspect(path: &Path, out: &mut dyn Write) -> Result<Inspection, StoreCliError> {
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
) -> Result<FsckReport, StoreCliError> {
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
        Err(StoreCliError::Unclean(f.problems.len()))
    }
}

/// `store verify PATH NAME --key-file F`: keyed check of every page of one PMO.
pub fn store_verify(
    f: StoreFile<'_>,
    name: &str,
    key: &UserKey,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Vec<u64>, StoreCliError> {
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
        Err(StoreCliError::Unclean(bad.len()))
    }
}

/// `store destroy PATH NAME --key-file F`: destroy a PMO (key required; scrubs its space).
pub fn store_destroy(
    f: StoreFile<'_>,
    name: &str,
    key: &UserKey,
    out: &mut dyn Write,
) -> Result<(), StoreCliError> {
    let (s, _) = open_store(f)?;
    s.destroy_pmo(name, key)?;
    writeln!(out, "destroyed PMO {name}")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_store_gets_a_table_that_fits_or_is_told_the_smallest_size() {
        let dir = std::env::temp_dir().join(format!("pmo-cli-small-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let path = dir.join("64m");
        let sb = store_create(StoreFile::plain(&path), 64 << 20, None, &mut out, &mut err).unwrap();
        assert_eq!(sb.slots, 8192, "one slot per 8 KiB of the store");
        let path = dir.join("64m-full-table");
        let e = store_create(
            StoreFile::plain(&path),
            64 << 20,
            Some(65_536),
            &mut out,
            &mut err,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs at least 68 MiB"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
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
            Err(StoreCliError::Unclean(1))
        ));
        assert!(matches!(
            store_destroy(sf, "db", &UserKey::new(b"bad").unwrap(), &mut out),
            Err(StoreCliError::Store(StoreError::WrongKey))
        ));
        store_destroy(sf, "db", &key, &mut out).unwrap();
        assert!(store_ls(sf, &mut out).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
