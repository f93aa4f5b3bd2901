//! Filebench's fileserver, varmail, webproxy and webserver personalities over files kept in
//! Persistent Memory Objects, one PMO per file.
//!
//! The workload engine is C (`c/`, shared with the guest driver `fb_pmo`); this crate compiles
//! it and drives it through FFI on any [`Backend`]: the host's store and pager, or the test
//! backend of ordinary files, [`FileBackend`]. What each personality does, what is scaled down
//! and how file operations map to PMO operations: `apps/filebench/README.md`.
//!
//! ```no_run
//! use filebench::{run, Config, FileBackend, Personality, Scale};
//! let backend = FileBackend::new("/tmp/fb").unwrap();
//! let summary = run(&Config::new(Personality::Varmail, Scale::Small), &backend).unwrap();
//! println!("{summary}");
//! ```
//!
//! Here: the crate's errors and what it exports. [`Config`] and [`Personality`] are in
//! `config.rs`, the [`Backend`] trait in `backend.rs` (bridged to the engine by `bridge.rs`;
//! [`FileBackend`] in `files.rs`), [`Fileset`] and [`run`] in `fileset.rs`, [`Summary`] in
//! `summary.rs`, the C ABI in `ffi.rs`.

mod backend;
mod bridge;
mod config;
mod ffi;
mod files;
mod fileset;
mod summary;

pub use backend::{Attachment, Backend};
pub use config::{Config, Personality, Scale};
pub use files::FileBackend;
pub use fileset::{run, CheckMode, CheckReport, Fileset};
pub use summary::{Counters, FlowopStats, Kind, Summary};

/// What can go wrong running a personality.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration was refused.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The engine failed: errno and what it was doing.
    #[error("{message} (errno {errno})")]
    Engine {
        /// The errno value (e.g. ENOSPC: createfile found the fileset full).
        errno: i32,
        /// What failed, from the engine.
        message: String,
    },
    /// A [`Backend`] callback panicked; the engine saw `EIO`.
    #[error("a backend callback panicked")]
    BackendPanicked,
    /// An unknown personality name.
    #[error("unknown personality {0:?}")]
    UnknownPersonality(String),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;
