//! The YCSB core workloads A-F for host-side harnesses.
//!
//! There is one implementation of the workloads: the C library `c/ycsb.c` (`c/ycsb.h`), which
//! the guest driver `ycsb_lmdb` links too. This crate compiles it with the `cc` crate and wraps
//! it safely, so a host-side run and a guest run with the same parameters and seed produce the
//! same operations, keys and field bytes.
//!
//! What is generated follows YCSB's `CoreWorkload` (see `apps/ycsb/README.md`):
//!
//! * records: key `"user"` + the decimal FNV-64 hash of the key number ([`key_name`]), ten
//!   fields of 100 bytes;
//! * operation mix per workload file `workloads/workload[a-f]` ([`Workload`]);
//! * request distribution `zipfian` (YCSB's scrambled zipfian, constant 0.99) or `latest` (D);
//! * scan lengths uniform in 1..=100 (E);
//! * field bytes in a self-describing deterministic format ([`field_value`], [`check_field`],
//!   [`check_record`]), so whoever reads a record back can verify it without the seed.
//!
//! ```
//! use ycsb::{Generator, OpKind, Options, Workload};
//!
//! let mut g = Generator::with_options(Workload::A, 1000, 42, Options { ops: 100, ..Options::default() })?;
//! let op = g.next_op();
//! assert!(matches!(op.kind(), OpKind::Read | OpKind::Update));
//! assert!(op.key().starts_with("user"));
//! # Ok::<(), ycsb::Error>(())
//! ```
//!
//! Here: the record constants, the errors and what the crate exports. [`Workload`] and
//! [`OpKind`] are in `workload.rs`, [`Generator`] and its [`Op`]s in `generator.rs`, the
//! distributions and random numbers in `distributions.rs`, keys, field values and their
//! checkers in `record.rs`, the C ABI in `ffi.rs`.

mod distributions;
mod ffi;
mod generator;
mod record;
mod workload;

pub use distributions::{zeta, Rng, ScrambledZipfian, Zipfian};
pub use generator::{Generator, Op, Options};
pub use record::{check_field, check_record, field_value, fnv_hash64, key_name, RecordInfo};
pub use workload::{OpKind, Workload};

/// Fields per record (YCSB's `fieldcount`).
pub const FIELDS: usize = 10;
/// Bytes per field (YCSB's `fieldlength`, constant).
pub const FIELD_LEN: usize = 100;
/// Bytes of a whole record: the fields one after the other.
pub const RECORD_LEN: usize = FIELDS * FIELD_LEN;
/// Size of the C key buffer; keys are at most `KEY_MAX - 1` bytes.
pub const KEY_MAX: usize = 32;
/// YCSB's `ZipfianGenerator.ZIPFIAN_CONSTANT`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// `ScrambledZipfianGenerator.ITEM_COUNT`: the scrambled generator's underlying item count.
pub const SCRAMBLED_ITEMS: u64 = 10_000_000_000;
/// `ScrambledZipfianGenerator.ZETAN`: zeta(`SCRAMBLED_ITEMS`, 0.99), precomputed by YCSB.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// Errors of this crate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The name is not one of the core workloads.
    #[error("unknown workload {0:?} (a..f)")]
    UnknownWorkload(String),
    /// The C library refused the generator's parameters.
    #[error("invalid generator parameters")]
    InvalidParameters,
    /// The C structs do not have the layout this crate was written for.
    #[error("C layout mismatch: {0}")]
    Layout(&'static str),
    /// A field's bytes are not what its header says they must be.
    #[error("field does not verify")]
    BadField,
    /// A record does not verify (length, key or one of its fields).
    #[error("record does not verify")]
    BadRecord,
}

#[cfg(test)]
mod tests;
