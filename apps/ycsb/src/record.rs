//! Keys and records: YCSB's key names, the self-describing field bytes, and the checks that
//! verify a field or a stored record without the seed.

use std::ffi::c_char;

use crate::{ffi, Error, FIELDS, FIELD_LEN, KEY_MAX};

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

/// Verifies a stored record (`key` and its [`RECORD_LEN`](crate::RECORD_LEN) bytes), as
/// `ycsb_lmdb --check` does.
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
