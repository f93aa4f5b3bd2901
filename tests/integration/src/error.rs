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
        /// What the file is (e.g. "guest kernel").
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// The command that makes it.
        hint: &'static str,
    },
    /// A program the run needs is not installed.
    #[error("{program} not found in PATH: {hint}")]
    ProgramMissing {
        /// The program's name.
        program: &'static str,
        /// How to install it.
        hint: &'static str,
    },
    /// An I/O operation on a host file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and to which file.
        context: String,
        /// The error the OS returned.
        #[source]
        source: std::io::Error,
    },
    /// A program could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error the OS returned.
        #[source]
        source: std::io::Error,
    },
    /// `ldd` on the VMM binary failed or said something we cannot use.
    #[error("ldd {binary}: {detail}")]
    Ldd {
        /// The binary `ldd` was run on.
        binary: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The nested test host did not finish its job in time, on every attempt.
    #[error(
        "the nested test host timed out after {seconds} s ({attempts} attempt(s)); \
         L1 console in {log}; its last lines:\n{tail}"
    )]
    TestHostTimeout {
        /// The time allowed per attempt.
        seconds: u64,
        /// How many boots were tried.
        attempts: u32,
        /// L1's console log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// The nested test host ran but reported a problem of its own (not of a VM).
    #[error("the nested test host failed: {detail}; L1 console in {log}; its last lines:\n{tail}")]
    TestHost {
        /// What it reported.
        detail: String,
        /// L1's console log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// A spec asks for something the runner cannot do.
    #[error("invalid VM spec {name:?}: {detail}")]
    InvalidSpec {
        /// The spec's name.
        name: String,
        /// What is wrong with it.
        detail: String,
    },
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
