//! The C interface of `c/ycsb.h`, declared by hand (no bindgen). Every struct here mirrors its C
//! counterpart field for field with `#[repr(C)]`; `crate::check_layout` compares the sizes and
//! offsets the C side reports for the two structs whose layout has padding or arrays.

use std::ffi::c_char;

/// `struct ycsb_workload`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawWorkload {
    pub name: c_char,
    pub proportion: [f64; 5],
    pub dist: u32,
    pub min_scan: u32,
    pub max_scan: u32,
}

/// `struct ycsb_rng`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawRng {
    pub s: [u64; 4],
}

/// `struct ycsb_zipf`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawZipf {
    pub base: u64,
    pub items: u64,
    pub countforzeta: u64,
    pub theta: f64,
    pub alpha: f64,
    pub zeta2theta: f64,
    pub zetan: f64,
    pub eta: f64,
}

/// `struct ycsb_scrambled`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawScrambled {
    pub z: RawZipf,
    pub min: u64,
    pub itemcount: u64,
}

/// `struct ycsb_opts`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawOpts {
    pub ops: u64,
    pub thread: u32,
    pub threads: u32,
    pub write_all_fields: u32,
    pub reserved: u32,
}

/// `struct ycsb_op`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawOp {
    pub ty: u32,
    pub field: u32,
    pub scan_len: u32,
    pub key_len: u32,
    pub keynum: u64,
    pub version: u64,
    pub seq: u64,
    pub key: [u8; crate::KEY_MAX],
    pub values: [[u8; crate::FIELD_LEN]; crate::FIELDS],
}

impl Default for RawOp {
    fn default() -> Self {
        RawOp {
            ty: 0,
            field: u32::MAX,
            scan_len: 0,
            key_len: 0,
            keynum: 0,
            version: 0,
            seq: 0,
            key: [0; crate::KEY_MAX],
            values: [[0; crate::FIELD_LEN]; crate::FIELDS],
        }
    }
}

/// `struct ycsb`: opaque, sized by `ycsb_sizeof()`.
#[repr(C)]
pub(crate) struct RawYcsb {
    _private: [u8; 0],
}

extern "C" {
    pub fn ycsb_workload_parse(s: *const c_char, out: *mut RawWorkload) -> i32;
    pub fn ycsb_rng_seed(r: *mut RawRng, seed: u64);
    pub fn ycsb_rng_double(r: *mut RawRng) -> f64;
    pub fn ycsb_rng_below(r: *mut RawRng, n: u64) -> u64;
    pub fn ycsb_fnvhash64(val: u64) -> u64;
    pub fn ycsb_key_name(keynum: u64, out: *mut c_char) -> usize;
    pub fn ycsb_zeta(st: u64, n: u64, theta: f64, initial: f64) -> f64;
    pub fn ycsb_zipf_init(z: *mut RawZipf, min: u64, max: u64, theta: f64) -> i32;
    pub fn ycsb_zipf_next(z: *mut RawZipf, r: *mut RawRng) -> u64;
    pub fn ycsb_zipf_next_n(z: *mut RawZipf, r: *mut RawRng, itemcount: u64) -> u64;
    pub fn ycsb_scrambled_init(s: *mut RawScrambled, min: u64, max: u64) -> i32;
    pub fn ycsb_scrambled_next(s: *mut RawScrambled, r: *mut RawRng) -> u64;
    pub fn ycsb_field_value(keynum: u64, field: u32, version: u64, out: *mut u8);
    pub fn ycsb_field_check(
        keynum: u64,
        field: u32,
        val: *const u8,
        len: usize,
        version: *mut u64,
    ) -> i32;
    pub fn ycsb_record_check(
        key: *const c_char,
        keylen: usize,
        rec: *const u8,
        len: usize,
        keynum: *mut u64,
        versions: *mut u64,
    ) -> i32;
    pub fn ycsb_init(
        y: *mut RawYcsb,
        w: *const RawWorkload,
        records: u64,
        seed: u64,
        opts: *const RawOpts,
    ) -> i32;
    pub fn ycsb_next_op(y: *mut RawYcsb, out: *mut RawOp);
    pub fn ycsb_load_op(keynum: u64, out: *mut RawOp);
    pub fn ycsb_last_keynum(y: *const RawYcsb) -> u64;
    pub fn ycsb_sizeof() -> usize;
    pub fn ycsb_alignof() -> usize;
    pub fn ycsb_op_sizeof() -> usize;
    pub fn ycsb_op_key_offset() -> usize;
    pub fn ycsb_op_values_offset() -> usize;
}
