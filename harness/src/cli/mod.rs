//! The command lines of `pmo-compare` ([`compare`]) and `pmo-tiering` ([`tiering`]), parsed by
//! clap as `pmovmm`'s are, and the binaries' output, which never panics.
//!
//! `println!` and `eprintln!` panic when a write fails, and one does as soon as the reader of a
//! pipe has gone (`pmo-compare | head`, a progress log piped into a pager that was quit). With
//! the release profile's `panic = "abort"` that would kill a run of many minutes whose report
//! still has to reach its files. The binaries write through [`outln!`](crate::outln) and
//! [`errln!`](crate::errln) instead: a line nobody can read any more is dropped and the run goes
//! on. (clap's own `--help` and usage errors already ignore a failed write.)

pub mod compare;
pub mod tiering;

use std::io::Write;

/// Writes `text` to stdout; a failed write (the reader has gone) is dropped.
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// Writes `text` to stderr; a failed write is dropped.
pub fn err(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `println!` that never panics: a line for stdout through [`out`].
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::out(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprintln!` that never panics: a line for stderr through [`err`].
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::err(&format!("{}\n", format_args!($($arg)*)))
    };
}
