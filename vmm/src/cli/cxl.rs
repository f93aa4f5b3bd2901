//! `pmovmm cxl create`: the media file of a `--cxl-t3` device, made before a VM starts so its
//! size is settled and its label area formatted.

use std::path::PathBuf;

use clap::Subcommand;
use cxl_t3::expander::{Expander, ExpanderConfig, ExpanderError};
use sizes::{parse_size, SizeError};

use super::{refuse_overwrite, OverwriteError};
use crate::config::{ConfigError, CxlT3Config};

/// `pmovmm cxl ...`: CXL Type 3 media files on the host (the guest is not involved).
#[derive(Subcommand)]
pub enum CxlCommand {
    /// Create the media file of a --cxl-t3 device (refuses to overwrite a non-empty file),
    /// so its final size is known before a VM starts.
    Create {
        /// The media file to create.
        file: PathBuf,
        /// Device capacity: a non-zero multiple of 256M.
        #[arg(long)]
        size: String,
    },
}

/// What a cxl subcommand can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CxlCliError {
    /// The size does not parse.
    #[error(transparent)]
    Size(#[from] SizeError),
    /// The size is not one the decoders can map (the rule `--cxl-t3` checks).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The file holds data.
    #[error(transparent)]
    Overwrite(#[from] OverwriteError),
    /// The expander could not create or flush its media.
    #[error("{}: {source}", file.display())]
    Expander {
        /// The media file.
        file: PathBuf,
        /// Why.
        source: ExpanderError,
    },
}

/// Runs one cxl subcommand.
pub fn run(cmd: CxlCommand) -> Result<(), CxlCliError> {
    match cmd {
        CxlCommand::Create { file, size } => {
            refuse_overwrite(&file)?;
            let size = parse_size(&size)?;
            CxlT3Config::check_size(size)?;
            let expander = |source| CxlCliError::Expander {
                file: file.clone(),
                source,
            };
            let exp = Expander::open(&ExpanderConfig::new(&file, size)).map_err(expander)?;
            exp.shutdown().map_err(expander)?;
        }
    }
    Ok(())
}
