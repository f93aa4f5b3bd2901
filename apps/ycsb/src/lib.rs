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

mod ffi;

use std::ffi::{c_char, CString};
use std::fmt;
use std::str::FromStr;

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

/// One of YCSB's core workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Update heavy: 50% read, 50% update, zipfian.
    A,
    /// Read mostly: 95% read, 5% update, zipfian.
    B,
    /// Read only: 100% read, zipfian.
    C,
    /// Read latest: 95% read, 5% insert, latest.
    D,
    /// Short ranges: 95% scan (length uniform 1..=100), 5% insert, zipfian.
    E,
    /// Read-modify-write: 50% read, 50% read-modify-write, zipfian.
    F,
}

impl Workload {
    /// All six, in order.
    pub const ALL: [Workload; 6] = [
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::D,
        Workload::E,
        Workload::F,
    ];

    /// The lower-case letter of the workload file (`workloada` is `'a'`).
    pub fn letter(self) -> char {
        match self {
            Workload::A => 'a',
            Workload::B => 'b',
            Workload::C => 'c',
            Workload::D => 'd',
            Workload::E => 'e',
            Workload::F => 'f',
        }
    }

    /// The C library's definition of this workload.
    fn raw(self) -> Result<ffi::RawWorkload, Error> {
        let name = [self.letter() as u8 as c_char, 0];
        let mut w = ffi::RawWorkload::default();
        // SAFETY: `name` is a NUL-terminated string and `w` a valid, writable RawWorkload.
        let rc = unsafe { ffi::ycsb_workload_parse(name.as_ptr(), &mut w) };
        if rc != 0 {
            return Err(Error::UnknownWorkload(self.letter().to_string()));
        }
        Ok(w)
    }

    /// The share of operations of `kind` in this workload (from the C definition).
    pub fn proportion(self, kind: OpKind) -> f64 {
        self.raw()
            .map(|w| w.proportion[kind as usize])
            .unwrap_or(0.0)
    }
}

impl FromStr for Workload {
    type Err = Error;

    /// `"a"`..`"f"`, upper case, or `"workloada"`..`"workloadf"`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let c = CString::new(s).map_err(|_| Error::UnknownWorkload(s.to_string()))?;
        let mut w = ffi::RawWorkload::default();
        // SAFETY: `c` is a NUL-terminated string and `w` a valid, writable RawWorkload.
        let rc = unsafe { ffi::ycsb_workload_parse(c.as_ptr(), &mut w) };
        if rc != 0 {
            return Err(Error::UnknownWorkload(s.to_string()));
        }
        match w.name as u8 {
            b'a' => Ok(Workload::A),
            b'b' => Ok(Workload::B),
            b'c' => Ok(Workload::C),
            b'd' => Ok(Workload::D),
            b'e' => Ok(Workload::E),
            b'f' => Ok(Workload::F),
            _ => Err(Error::UnknownWorkload(s.to_string())),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "workload{}", self.letter())
    }
}

/// The kind of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Read all fields of one record.
    Read = 0,
    /// Write one field (or all, with [`Options::write_all_fields`]) of an existing record.
    Update = 1,
    /// Insert a new record (all fields).
    Insert = 2,
    /// Read up to [`Op::scan_len`] records in key order from the key on.
    Scan = 3,
    /// Read a record, then update it, in one transaction.
    ReadModifyWrite = 4,
}

impl OpKind {
    /// All kinds, in YCSB's order.
    pub const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Update,
        OpKind::Insert,
        OpKind::Scan,
        OpKind::ReadModifyWrite,
    ];

    /// YCSB's measurement name: `READ`, `UPDATE`, `INSERT`, `SCAN`, `READ-MODIFY-WRITE`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "READ",
            OpKind::Update => "UPDATE",
            OpKind::Insert => "INSERT",
            OpKind::Scan => "SCAN",
            OpKind::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }

    /// Whether the operation writes the record.
    pub fn writes(self) -> bool {
        matches!(
            self,
            OpKind::Update | OpKind::Insert | OpKind::ReadModifyWrite
        )
    }

    fn from_raw(ty: u32) -> OpKind {
        match ty {
            1 => OpKind::Update,
            2 => OpKind::Insert,
            3 => OpKind::Scan,
            4 => OpKind::ReadModifyWrite,
            _ => OpKind::Read,
        }
    }
}

/// One operation of the load or run phase.
#[derive(Clone)]
pub struct Op {
    raw: ffi::RawOp,
}

impl Op {
    /// What to do.
    pub fn kind(&self) -> OpKind {
        OpKind::from_raw(self.raw.ty)
    }

    /// The key number (before hashing into the key string).
    pub fn keynum(&self) -> u64 {
        self.raw.keynum
    }

    /// The key, `"user"` followed by digits.
    pub fn key(&self) -> &str {
        std::str::from_utf8(self.key_bytes()).unwrap_or("")
    }

    /// The key as bytes (what a store is given).
    pub fn key_bytes(&self) -> &[u8] {
        let len = (self.raw.key_len as usize).min(KEY_MAX - 1);
        &self.raw.key[..len]
    }

    /// Records to scan, for [`OpKind::Scan`].
    pub fn scan_len(&self) -> Option<u32> {
        (self.kind() == OpKind::Scan).then_some(self.raw.scan_len)
    }

    /// The one field an update or read-modify-write writes; `None` when it writes all fields
    /// or is no update.
    pub fn field(&self) -> Option<usize> {
        let f = self.raw.field as usize;
        (f < FIELDS && matches!(self.kind(), OpKind::Update | OpKind::ReadModifyWrite)).then_some(f)
    }

    /// Whether the op writes every field: inserts, and updates with
    /// [`Options::write_all_fields`].
    pub fn writes_all_fields(&self) -> bool {
        self.kind().writes() && self.raw.field == u32::MAX
    }

    /// The version stamped into the fields this op writes (0 = load phase); 0 for reads.
    pub fn version(&self) -> u64 {
        self.raw.version
    }

    /// Index of the op in its generator's run phase (for load ops: the key number).
    pub fn seq(&self) -> u64 {
        self.raw.seq
    }

    /// The new bytes of `field`, if this op writes it.
    pub fn value(&self, field: usize) -> Option<&[u8; FIELD_LEN]> {
        let written = self.writes_all_fields() || self.field() == Some(field);
        if written {
            self.raw.values.get(field)
        } else {
            None
        }
    }

    /// The whole new record, if this op writes all fields.
    pub fn record(&self) -> Option<&[u8]> {
        self.writes_all_fields()
            .then_some(self.raw.values.as_flattened())
    }

    /// The load-phase insert of key number `keynum` (version 0, all fields).
    pub fn load(keynum: u64) -> Op {
        let mut raw = ffi::RawOp::default();
        // SAFETY: `raw` is a valid, writable RawOp with the C layout (check_layout).
        unsafe { ffi::ycsb_load_op(keynum, &mut raw) };
        Op { raw }
    }
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Op")
            .field("kind", &self.kind())
            .field("keynum", &self.keynum())
            .field("key", &self.key())
            .field("scan_len", &self.scan_len())
            .field("field", &self.field())
            .field("version", &self.version())
            .field("seq", &self.seq())
            .finish()
    }
}

/// Options of [`Generator::with_options`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Operations this generator will produce (YCSB's `operationcount`). It sizes the scrambled
    /// zipfian key space (records + 2 × ops × insert share, as YCSB does); 0 means records only,
    /// so keys inserted during the run are then never chosen by zipfian workloads.
    pub ops: u64,
    /// This generator's thread index (< `threads`).
    pub thread: u32,
    /// Number of generators in the run (0 means 1). Generator `t` of `T` inserts the key
    /// numbers `records + t + k·T` and chooses keys among the loaded records and its own
    /// inserts only.
    pub threads: u32,
    /// Updates write all fields (YCSB's `writeallfields=true`) instead of one.
    pub write_all_fields: bool,
}

/// A deterministic operation generator for one workload, one thread.
pub struct Generator {
    /// The C `struct ycsb`, in u64 words (it holds no pointers, so it may move).
    state: Box<[u64]>,
    workload: Workload,
}

impl Generator {
    /// A single-threaded generator over `records` loaded records (key numbers
    /// `0..records`), with `Options::default()` (see [`Options::ops`]).
    pub fn new(workload: Workload, records: u64, seed: u64) -> Result<Generator, Error> {
        Generator::with_options(workload, records, seed, Options::default())
    }

    /// A generator with explicit options.
    pub fn with_options(
        workload: Workload,
        records: u64,
        seed: u64,
        opts: Options,
    ) -> Result<Generator, Error> {
        check_layout()?;
        let raw_w = workload.raw()?;
        // SAFETY: a pure function of the C library.
        let size = unsafe { ffi::ycsb_sizeof() };
        let mut state = vec![0u64; size.div_ceil(8)].into_boxed_slice();
        let raw_opts = ffi::RawOpts {
            ops: opts.ops,
            thread: opts.thread,
            threads: opts.threads,
            write_all_fields: u32::from(opts.write_all_fields),
            reserved: 0,
        };
        // SAFETY: `state` is at least ycsb_sizeof() bytes, 8-byte aligned, which check_layout
        // verified is enough for struct ycsb; the other pointers are valid for reading.
        let rc =
            unsafe { ffi::ycsb_init(state.as_mut_ptr().cast(), &raw_w, records, seed, &raw_opts) };
        if rc != 0 {
            return Err(Error::InvalidParameters);
        }
        Ok(Generator { state, workload })
    }

    /// The workload this generator produces.
    pub fn workload(&self) -> Workload {
        self.workload
    }

    /// The next run-phase operation. An insert's key counts as present from the next call
    /// on: perform each op before asking for the next.
    pub fn next_op(&mut self) -> Op {
        let mut raw = ffi::RawOp::default();
        // SAFETY: `state` holds a struct ycsb initialized by ycsb_init (with_options), and
        // `raw` is a valid, writable RawOp with the C layout.
        unsafe { ffi::ycsb_next_op(self.state.as_mut_ptr().cast(), &mut raw) };
        Op { raw }
    }

    /// The key number of the newest key this generator knows to exist (YCSB's `lastValue`
    /// of the insert key sequence): `records - 1` until its first insert.
    pub fn last_keynum(&self) -> u64 {
        // SAFETY: `state` holds a struct ycsb initialized by ycsb_init; the call only reads.
        unsafe { ffi::ycsb_last_keynum(self.state.as_ptr().cast()) }
    }
}

impl Iterator for Generator {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        Some(self.next_op())
    }
}

/// Checks that the C structs have the layout of `ffi`.
fn check_layout() -> Result<(), Error> {
    // SAFETY: pure functions of the C library.
    let (align, op_size, key_off, values_off) = unsafe {
        (
            ffi::ycsb_alignof(),
            ffi::ycsb_op_sizeof(),
            ffi::ycsb_op_key_offset(),
            ffi::ycsb_op_values_offset(),
        )
    };
    if align > std::mem::align_of::<u64>() {
        return Err(Error::Layout(
            "struct ycsb needs more than 8-byte alignment",
        ));
    }
    if op_size != std::mem::size_of::<ffi::RawOp>()
        || key_off != std::mem::offset_of!(ffi::RawOp, key)
        || values_off != std::mem::offset_of!(ffi::RawOp, values)
    {
        return Err(Error::Layout("struct ycsb_op"));
    }
    Ok(())
}

/// YCSB's `ZipfianGenerator` (Gray et al.), unscrambled: item `min` is the most popular,
/// `min + 1` the next, and so on. Seeded by its own xoshiro256** stream.
#[derive(Clone, Debug)]
pub struct Zipfian {
    z: ffi::RawZipf,
    rng: ffi::RawRng,
}

impl Zipfian {
    /// Items `min..=max` with zipfian constant `theta` (0 < theta < 1); sums zeta over the
    /// item count, O(max - min).
    pub fn new(min: u64, max: u64, theta: f64, seed: u64) -> Result<Zipfian, Error> {
        let mut z = ffi::RawZipf::default();
        // SAFETY: `z` is a valid, writable RawZipf (all 8-byte fields, as in C).
        let rc = unsafe { ffi::ycsb_zipf_init(&mut z, min, max, theta) };
        if rc != 0 {
            return Err(Error::InvalidParameters);
        }
        Ok(Zipfian { z, rng: rng(seed) })
    }

    /// The next item.
    pub fn next_item(&mut self) -> u64 {
        // SAFETY: both are valid, initialized RawZipf / RawRng values.
        unsafe { ffi::ycsb_zipf_next(&mut self.z, &mut self.rng) }
    }

    /// The next item over `itemcount` items (`min..min + itemcount`); a larger count than
    /// before extends zeta incrementally.
    pub fn next_item_of(&mut self, itemcount: u64) -> u64 {
        // SAFETY: both are valid, initialized RawZipf / RawRng values.
        unsafe { ffi::ycsb_zipf_next_n(&mut self.z, &mut self.rng, itemcount) }
    }
}

/// YCSB's `ScrambledZipfianGenerator(min, max)`: a zipfian value over [`SCRAMBLED_ITEMS`]
/// items, FNV-hashed and taken modulo the item count, so the popular items are spread over
/// the range.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    s: ffi::RawScrambled,
    rng: ffi::RawRng,
}

impl ScrambledZipfian {
    /// Items `min..=max`.
    pub fn new(min: u64, max: u64, seed: u64) -> Result<ScrambledZipfian, Error> {
        let mut s = ffi::RawScrambled::default();
        // SAFETY: `s` is a valid, writable RawScrambled (all 8-byte fields, as in C).
        let rc = unsafe { ffi::ycsb_scrambled_init(&mut s, min, max) };
        if rc != 0 {
            return Err(Error::InvalidParameters);
        }
        Ok(ScrambledZipfian { s, rng: rng(seed) })
    }

    /// The next item.
    pub fn next_item(&mut self) -> u64 {
        // SAFETY: both are valid, initialized RawScrambled / RawRng values.
        unsafe { ffi::ycsb_scrambled_next(&mut self.s, &mut self.rng) }
    }
}

/// The C library's random generator, seeded.
fn rng(seed: u64) -> ffi::RawRng {
    let mut r = ffi::RawRng::default();
    // SAFETY: `r` is a valid, writable RawRng.
    unsafe { ffi::ycsb_rng_seed(&mut r, seed) };
    r
}

/// The C library's random numbers (xoshiro256** seeded through splitmix64).
#[derive(Clone, Debug)]
pub struct Rng {
    r: ffi::RawRng,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { r: rng(seed) }
    }

    /// Uniform in [0, 1), 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        // SAFETY: `r` is a valid, initialized RawRng.
        unsafe { ffi::ycsb_rng_double(&mut self.r) }
    }

    /// Uniform in `0..n`, unbiased (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        // SAFETY: `r` is a valid, initialized RawRng.
        unsafe { ffi::ycsb_rng_below(&mut self.r, n) }
    }
}

/// zeta(n, theta) = sum of 1/i^theta for i in 1..=n, as the generators compute it.
pub fn zeta(n: u64, theta: f64) -> f64 {
    // SAFETY: a pure function of the C library.
    unsafe { ffi::ycsb_zeta(0, n, theta, 0.0) }
}

/// YCSB's `Utils.fnvhash64`: FNV-1a over the value's 8 little-endian bytes, then the absolute
/// value of the signed result.
pub fn fnv_hash64(val: u64) -> u64 {
    // SAFETY: a pure function of the C library.
    unsafe { ffi::ycsb_fnvhash64(val) }
}

/// YCSB's key for key number `keynum`: `"user"` + decimal [`fnv_hash64`]`(keynum)`.
pub fn key_name(keynum: u64) -> String {
    let mut buf = [0 as c_char; KEY_MAX];
    // SAFETY: `buf` has the KEY_MAX bytes the C function may write.
    let len = unsafe { ffi::ycsb_key_name(keynum, buf.as_mut_ptr()) };
    buf[..len.min(KEY_MAX)]
        .iter()
        .map(|&c| char::from(c as u8))
        .collect()
}

/// The bytes of field `field` of key number `keynum` as written at `version` (0 = load).
///
/// Layout (printable ASCII): 16 hex digits of the key number, `:`, 16 hex digits of the
/// version, `:`, the field digit, `:`, then 64 characters of `[A-Za-z0-9+/]` drawn from a
/// generator seeded by (keynum, field, version).
pub fn field_value(keynum: u64, field: usize, version: u64) -> [u8; FIELD_LEN] {
    let mut out = [0u8; FIELD_LEN];
    let field = u32::try_from(field.min(FIELDS - 1)).unwrap_or(0);
    // SAFETY: `out` has the FIELD_LEN bytes the C function writes.
    unsafe { ffi::ycsb_field_value(keynum, field, version, out.as_mut_ptr()) };
    out
}

/// Verifies `bytes` as field `field` of key number `keynum`; returns the version they carry.
pub fn check_field(keynum: u64, field: usize, bytes: &[u8]) -> Result<u64, Error> {
    let field = u32::try_from(field).map_err(|_| Error::BadField)?;
    let mut version = 0u64;
    // SAFETY: `bytes` is valid for `bytes.len()` bytes; `version` is writable.
    let rc =
        unsafe { ffi::ycsb_field_check(keynum, field, bytes.as_ptr(), bytes.len(), &mut version) };
    if rc != 0 {
        return Err(Error::BadField);
    }
    Ok(version)
}

/// A verified record: the key number its key stands for and each field's version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordInfo {
    /// The key number.
    pub keynum: u64,
    /// The version of each field.
    pub versions: [u64; FIELDS],
}

/// Verifies a stored record (`key` and its [`RECORD_LEN`] bytes), as `ycsb_lmdb --check` does.
pub fn check_record(key: &[u8], record: &[u8]) -> Result<RecordInfo, Error> {
    let mut info = RecordInfo {
        keynum: 0,
        versions: [0; FIELDS],
    };
    // SAFETY: `key` and `record` are valid for their lengths; the outputs are writable and
    // `versions` has the FIELDS entries the C function fills.
    let rc = unsafe {
        ffi::ycsb_record_check(
            key.as_ptr().cast(),
            key.len(),
            record.as_ptr(),
            record.len(),
            &mut info.keynum,
            info.versions.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(Error::BadRecord);
    }
    Ok(info)
}

#[cfg(test)]
mod tests;
