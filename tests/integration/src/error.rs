//! Errors of the VM test runner.
//!
//! A runner error means the test could not be carried out as asked (a prerequisite is missing,
//! the test host did not come up, a run timed out twice). Tests turn it into a failure with
//! this message: a VM test is never skipped silently.

use std::path::PathBuf;

/// Why a VM run could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// A file the run needs is not there; the message says how to make it.
    #[error("missing {what} at {path}: {hint}")]
    Missing {
        what: &'static str,
        path: PathBuf,
        hint: &'static str,
    },
    /// A program the run needs is not installed.
    #[error("{program} not found in PATH: {hint}")]
    ProgramMissing {
        program: &'static str,
        hint: &'static str,
    },
    /// An I/O operation on a host file failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// `ldd` on the VMM binary failed or said something we cannot use.
    #[error("ldd {binary}: {detail}")]
    Ldd { binary: PathBuf, detail: String },
    /// The nested test host did not finish its job in time, on every attempt.
    #[error(
        "the nested test host timed out after {seconds} s ({attempts} attempt(s)); \
         L1 console in {log}; its last lines:\n{tail}"
    )]
    TestHostTimeout {
        seconds: u64,
        attempts: u32,
        log: PathBuf,
        tail: String,
    },
    /// The nested test host ran but reported a problem of its own (not of a VM).
    #[error("the nested test host failed: {detail}; L1 console in {log}; its last lines:\n{tail}")]
    TestHost {
        detail: String,
        log: PathBuf,
        tail: String,
    },
    /// A spec asks for something the runner cannot do.
    #[error("invalid VM spec {name:?}: {detail}")]
    InvalidSpec { name: String, detail: String },
}

impl RunnerError {
    /// An I/O error with the operation and path it happened on.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        RunnerError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result of runner operations.
pub type Result<T> = std::result::Result<T, RunnerError>;
