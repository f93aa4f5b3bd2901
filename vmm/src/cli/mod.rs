//! Host tools of `pmovmm`: the subcommands that work on files without a guest.
//!
//! `store` manages PMO store files, `cxl` the media files of CXL expanders. What they share
//! is here: how a key is read (from a file, never from the command line where `ps` would
//! show it), the rollback anchor option, the refusal to format over data, and the progress
//! bar. Sizes follow the workspace's one grammar (`sizes`).

pub mod cxl;
pub mod store;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use pmo_crypto::{RangeCipher, UserKey};
use zeroize::Zeroizing;

use store::{CxlAccess, StoreCliError, StoreFile};

/// Keys come from a file, never from the command line (where `ps` would show them).
#[derive(Args)]
pub struct KeyArg {
    /// File holding the PMO's key (its bytes, up to 64; a trailing newline is dropped).
    #[arg(long, value_name = "FILE")]
    pub key_file: PathBuf,
}

/// How a store is reached besides its file: its rollback anchor (as `pmovmm run
/// --pmo-anchor` takes it) and, for a store on CXL expander media, the master key and
/// cipher of its extents' TEE range keys (as `--pmo-master-key` and `cipher=` take them).
#[derive(Args)]
pub struct StoreAccessArg {
    /// Rollback anchor kept outside the store: a store older than it is refused; created from
    /// the store when missing.
    #[arg(long, value_name = "FILE")]
    pub anchor: Option<PathBuf>,
    /// For a store on CXL expander media (a file made by `pmovmm cxl create`): the master
    /// key file its PMO extents' TEE range keys are derived from.
    #[arg(long, value_name = "FILE")]
    pub master_key: Option<PathBuf>,
    /// The cipher of those range keys: xts-256 or xts-128 (as the store was written with).
    #[arg(long, value_name = "xts-128|xts-256", requires = "master_key")]
    pub cipher: Option<String>,
}

impl StoreAccessArg {
    /// The store file `file` reached this way.
    pub fn with<'a>(&'a self, file: &'a Path) -> Result<StoreFile<'a>, StoreCliError> {
        let cipher = match &self.cipher {
            Some(c) => {
                RangeCipher::from_name(c).ok_or_else(|| StoreCliError::BadCipher(c.clone()))?
            }
            None => RangeCipher::default(),
        };
        Ok(StoreFile {
            path: file,
            anchor: self.anchor.as_deref(),
            cxl: self
                .master_key
                .as_deref()
                .map(|master_key| CxlAccess { master_key, cipher }),
        })
    }
}

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("key file {}: {why}", path.display())]
pub struct KeyFileError {
    path: PathBuf,
    why: String,
}

/// Reads a key from a file (one trailing newline is dropped). The buffer is zeroized.
pub fn read_key_file(path: &Path) -> Result<UserKey, KeyFileError> {
    let err = |why: String| KeyFileError {
        path: path.to_path_buf(),
        why,
    };
    let mut bytes = Zeroizing::new(std::fs::read(path).map_err(|e| err(e.to_string()))?);
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    UserKey::new(&bytes).map_err(|e| err(e.to_string()))
}

/// A file that holds something, which formatting would destroy.
#[derive(Debug, thiserror::Error)]
#[error("{}: exists and is not empty; refusing to format over it", .0.display())]
pub struct OverwriteError(PathBuf);

/// Formatting truncates: never do it to a file that holds anything.
pub fn refuse_overwrite(file: &Path) -> Result<(), OverwriteError> {
    match std::fs::metadata(file) {
        Ok(m) if m.len() > 0 => Err(OverwriteError(file.to_path_buf())),
        _ => Ok(()),
    }
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
