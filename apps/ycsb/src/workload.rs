//! The six core workloads (the C library's definitions, by letter) and the kinds of
//! operation they mix.

use std::ffi::{c_char, CString};
use std::fmt;
use std::str::FromStr;

use crate::{ffi, Error};

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
    pub(crate) fn raw(self) -> Result<ffi::RawWorkload, Error> {
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
    ///
    /// [`Options::write_all_fields`]: crate::Options::write_all_fields
    Update = 1,
    /// Insert a new record (all fields).
    Insert = 2,
    /// Read up to [`Op::scan_len`] records in key order from the key on.
    ///
    /// [`Op::scan_len`]: crate::Op::scan_len
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

    pub(crate) fn from_raw(ty: u32) -> OpKind {
        match ty {
            1 => OpKind::Update,
            2 => OpKind::Insert,
            3 => OpKind::Scan,
            4 => OpKind::ReadModifyWrite,
            _ => OpKind::Read,
        }
    }
}
