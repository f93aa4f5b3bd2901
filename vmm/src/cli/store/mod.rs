//! `pmovmm store create|mkpmo|ls|inspect|fsck|verify|destroy`: a PMO store file on the host.
//!
//! The store may also live on the media file of a CXL expander (`pmovmm cxl create`, then
//! `--pmo-store cxl=NAME` in a VM): the commands tell such media by its header and then need
//! `--master-key` (each PMO extent is under its own TEE range key derived from it), except
//! `inspect`, which reads only the keyless metadata.
//!
//! Each subcommand maps to one function that takes paths and values, prints human output
//! (with a progress bar for long operations) to the given writers, and returns a typed result,
//! so the VM tests can call them as the command line does.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};
use cxl_t3::media::{Media, MediaError, HEADER_LEN};
use pmo_crypto::{KdfParams, Suite, UserKey};
use pmo_media::{FileMedium, Medium, MediumError, Part};
use pmo_store::record::{read_slot, SlotContent};
use pmo_store::superblock::Superblock;
use pmo_store::{CreateOptions, Design, FsckReport, PmoInfo, Store, StoreError, StoreOptions};
use sizes::{parse_size, SizeError};

use super::{
    read_key_file, refuse_overwrite, KeyArg, KeyFileError, OverwriteError, Progress, StoreAccessArg,
};
use crate::cxl::CxlError;

mod open;

use open::{open_store, OpenStore};
pub use open::{CxlAccess, StoreFile};

/// What a store subcommand can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreCliError {
    /// A size argument did not parse.
    #[error(transparent)]
    Size(#[from] SizeError),
    /// Unknown design name.
    #[error("unknown design {0:?} (wedi, bp-ip, bp-id, sp-ip, sp-id, d, cl, c, cf)")]
    BadDesign(String),
    /// Unknown suite name.
    #[error("unknown suite {0:?} (xts-blake3, aes-gcm, tee-blake3)")]
    BadSuite(String),
    /// Unknown range cipher name.
    #[error("unknown cipher {0:?} (xts-256, xts-128)")]
    BadCipher(String),
    /// The file is CXL expander media but no master key was given.
    #[error("{}: CXL expander media; its store needs --master-key FILE", .0.display())]
    NeedsMasterKey(PathBuf),
    /// A master key was given for a file that is not CXL expander media.
    #[error("{}: not CXL expander media; --master-key is for a store on one (pmovmm cxl create)", .0.display())]
    NotMedia(PathBuf),
    /// `store create` on expander media that already holds data.
    #[error("{}: the expander media holds data; refusing to format over it", .0.display())]
    MediaNotBlank(PathBuf),
    /// `store create --size` that is not the media's size.
    #[error("--size {size} is not the expander media's size {media} (leave --size out)")]
    MediaSize {
        /// The size given.
        size: u64,
        /// The media's device size.
        media: u64,
    },
    /// `store create` of a store file without a size.
    #[error("--size is needed for a new store file")]
    NoSize,
    /// The expander media could not be read or opened.
    #[error("{}: {source}", path.display())]
    Media {
        /// The media file.
        path: PathBuf,
        /// Why.
        source: MediaError,
    },
    /// The expander under the store could not be opened or shut down.
    #[error(transparent)]
    Cxl(#[from] CxlError),
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
        /// Size of the store (sparse on disk): bytes, or K, M, G, T [on expander media: the
        /// media's size].
        #[arg(long)]
        size: Option<String>,
        /// PMO table slots: the most PMOs the store can hold [default: one per 8 KiB of the
        /// store, at most 65536].
        #[arg(long)]
        slots: Option<u32>,
        /// The store's rollback anchor and expander keys, if it has them.
        #[command(flatten)]
        access: StoreAccessArg,
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
        /// Default design of its attach sessions: wedi, bp-ip, bp-id, sp-ip, sp-id, d; on an
        /// expander also cl, c and cf (LPMO's CXL designs).
        #[arg(long, default_value = "d")]
        design: String,
        /// Page cipher and tag: xts-blake3, aes-gcm; tee-blake3 (no software cipher, the
        /// expander's range key encrypts) only on an expander [default: tee-blake3 for designs
        /// cl, c and cf, xts-blake3 for bp-id and sp-id, else aes-gcm]. The benchmark suites
        /// the design comparison compares with are not offered here.
        #[arg(long)]
        suite: Option<String>,
        /// Argon2id cost of the key derivation: m=SIZE,t=PASSES,p=LANES or fast
        /// [default: m=64M,t=3,p=1].
        #[arg(long, value_name = "m=SIZE,t=N,p=N|fast")]
        kdf: Option<String>,
        /// The store's rollback anchor and expander keys, if it has them.
        #[command(flatten)]
        access: StoreAccessArg,
    },
    /// List the PMOs in a store.
    Ls {
        /// The store file.
        file: PathBuf,
        /// The store's rollback anchor and expander keys, if it has them.
        #[command(flatten)]
        access: StoreAccessArg,
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
        /// The store's rollback anchor and expander keys, if it has them.
        #[command(flatten)]
        access: StoreAccessArg,
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
    /// The store's rollback anchor and expander keys, if it has them.
    #[command(flatten)]
    access: StoreAccessArg,
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
            access,
        } => {
            let size = size.as_deref().map(parse_size).transpose()?;
            store_create(access.with(&file)?, size, slots, &mut out, &mut err)?;
        }
        StoreCommand::Mkpmo {
            file,
            name,
            size,
            key,
            design,
            suite,
            kdf,
            access,
        } => {
            let design = parse_design(&design)?;
            let opts = CreateOptions {
                design,
                suite: suite.as_deref().map(parse_suite).transpose()?,
                kdf: Some(match kdf {
                    Some(k) => {
                        KdfParams::parse(&k).map_err(|e| StoreCliError::Kdf(e.to_string()))?
                    }
                    None => KdfParams::DEFAULT,
                }),
            };
            let size = parse_size(&size)?;
            let key = read_key_file(&key.key_file)?;
            pmo_create(access.with(&file)?, &name, size, &key, opts, &mut out)?;
        }
        StoreCommand::Ls { file, access } => {
            store_ls(access.with(&file)?, &mut out)?;
        }
        StoreCommand::Inspect { file } => {
            store_inspect(&file, &mut out)?;
        }
        StoreCommand::Fsck { file, access } => {
            store_fsck(access.with(&file)?, &mut out, &mut err)?;
        }
        StoreCommand::Verify(p) => {
            let key = read_key_file(&p.key.key_file)?;
            store_verify(p.access.with(&p.file)?, &p.name, &key, &mut out, &mut err)?;
        }
        StoreCommand::Destroy(p) => {
            let key = read_key_file(&p.key.key_file)?;
            store_destroy(p.access.with(&p.file)?, &p.name, &key, &mut out)?;
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

/// `store create PATH --size SIZE [--slots N] [--anchor A] [--master-key K]`: a new sparse
/// store file, or a store on blank expander media (its size is the media's).
pub fn store_create(
    f: StoreFile<'_>,
    size: Option<u64>,
    slots: Option<u32>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<Superblock, StoreCliError> {
    let path = f.path;
    let len = match f.media_size()? {
        Some(media) => {
            if size.is_some_and(|s| s != media) {
                return Err(StoreCliError::MediaSize {
                    size: size.unwrap_or_default(),
                    media,
                });
            }
            None
        }
        None => {
            refuse_overwrite(path)?;
            Some(size.ok_or(StoreCliError::NoSize)?)
        }
    };
    let m = f.medium(len)?;
    if !m.blank {
        return Err(StoreCliError::MediaNotBlank(path.to_path_buf()));
    }
    let mut bar = Progress::new(err, "format");
    let opts = StoreOptions {
        slots,
        anchor: f.anchor.map(Path::to_path_buf),
        ..StoreOptions::default()
    };
    let store = Store::create_with_progress(m.medium, opts, &mut |d, t| bar.update(d, t))?;
    let sb = store.superblock().clone();
    OpenStore {
        store,
        expander: m.expander,
    }
    .close()?;
    writeln!(
        out,
        "created store {}{} ({} bytes, {} PMO slots, data area at {:#x})",
        path.display(),
        if f.cxl.is_some() {
            " on expander media"
        } else {
            ""
        },
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
    let (open, _) = open_store(f)?;
    open.store.create_pmo_with(name, size, key, opts)?;
    open.close()?;
    writeln!(
        out,
        "created PMO {name} ({size} bytes, design {}, suite {}, key derivation {})",
        opts.design.name(),
        opts.suite().name(),
        opts.kdf.unwrap_or_default()
    )?;
    Ok(())
}

/// `store ls PATH`: one line per PMO, then one per PMO the store refused at open (and why).
pub fn store_ls(f: StoreFile<'_>, out: &mut dyn Write) -> Result<Vec<PmoInfo>, StoreCliError> {
    let (open, _) = open_store(f)?;
    let list = open.store.list();
    let refused = open.store.refused();
    open.close()?;
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
            p.suite.to_string(),
            p.design.name(),
            p.epoch
        )?;
    }
    // Refused PMOs are not in the list, but their names are not free either.
    for (name, why) in &refused {
        writeln!(out, "{name:<32} refused: {why}")?;
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
    // Read-only and unlocked: inspect works while a VMM owns the store. On expander media the
    // store's metadata is keyless (only PMO extents are under range keys): it is read from the
    // DPA space behind the media header, as last written back (a running VMM's device cache
    // may hold newer lines).
    let file = Arc::new(FileMedium::open_readonly(path)?);
    let media = Media::probe(path).map_err(|source| StoreCliError::Media {
        path: path.to_path_buf(),
        source,
    })?;
    let m: Arc<dyn Medium> = match media {
        Some(size) => Arc::new(Part::new(file, HEADER_LEN, size)?),
        None => file,
    };
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
                    rec.keys.suite,
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
    let (open, rep) = open_store(f)?;
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
    let f = open.store.fsck_with_progress(&mut |d, t| bar.update(d, t));
    open.close()?;
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
    let (open, _) = open_store(f)?;
    let mut bar = Progress::new(err, "verify");
    let bad = open
        .store
        .verify_pmo(name, key, &mut |d, t| bar.update(d, t))?;
    let npages = open
        .store
        .list()
        .iter()
        .find(|p| p.name == name)
        .map_or(0, |p| p.size / pmo_crypto::PAGE as u64);
    open.close()?;
    // Runs of failed pages, one line each: a wrong key fails them all.
    let mut i = 0;
    while i < bad.len() {
        let mut j = i;
        while j + 1 < bad.len() && bad[j + 1] == bad[j] + 1 {
            j += 1;
        }
        match j - i {
            0 => writeln!(out, "page {}: failed integrity verification", bad[i])?,
            _ => writeln!(
                out,
                "pages {}-{}: failed integrity verification",
                bad[i], bad[j]
            )?,
        }
        i = j + 1;
    }
    writeln!(out, "{name}: {} page(s) failed", bad.len())?;
    if f.cxl.is_some() && !bad.is_empty() && bad.len() as u64 == npages {
        writeln!(
            out,
            "every page failed: is it the master key and cipher the store was written with?"
        )?;
    }
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
    let (open, _) = open_store(f)?;
    open.store.destroy_pmo(name, key)?;
    open.close()?;
    writeln!(out, "destroyed PMO {name}")?;
    Ok(())
}

#[cfg(test)]
mod tests;
