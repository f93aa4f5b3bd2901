//! The operation stream of one workload and one thread: the C generator's state, the
//! [`Op`]s it draws, and the check that the C structs have the layout this crate mirrors.

use std::fmt;

use crate::{ffi, Error, OpKind, Workload, FIELDS, FIELD_LEN, KEY_MAX};

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
pub(crate) fn check_layout() -> Result<(), Error> {
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
