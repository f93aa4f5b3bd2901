//! The C engine's ABI (c/fb.h): `#[repr(C)]` mirrors of its structs and its functions.
//!
//! The mirrors follow the header field by field; `tests::sizes_match_the_c_structs` compares
//! every size with what the C compiler made of it.

use std::ffi::{c_char, c_int, c_void};

/// Flowops of the longest personality, as `FB_MAX_FLOWOPS`.
pub const MAX_FLOWOPS: usize = 40;
/// Longest name prefix, as `FB_PREFIX_MAX`.
pub const PREFIX_MAX: usize = 47;
/// Bytes of the error message, as `FB_ERROR_MAX`.
pub const ERROR_MAX: usize = 160;

/// `struct fb_pmo_ops`.
#[repr(C)]
pub struct FbPmoOps {
    pub create: extern "C" fn(*mut c_void, *const c_char, usize) -> c_int,
    pub destroy: extern "C" fn(*mut c_void, *const c_char) -> c_int,
    pub attach: extern "C" fn(*mut c_void, *const c_char, c_int, *mut usize) -> *mut c_void,
    pub sync: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    pub detach: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    pub ctx: *mut c_void,
}

/// `struct fb_config`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FbConfig {
    pub personality: u32,
    pub nfiles: u32,
    pub nthreads: u32,
    pub prealloc_pct: u32,
    pub ops: u64,
    pub seconds: u64,
    pub seed: u64,
    pub meanfilesize: u64,
    pub sizegamma_milli: u32,
    pub verify_reads: u32,
    pub iosize: u64,
    pub appendsize: u64,
    pub file_cap: u64,
    pub log_cap: u64,
    pub prefix: [c_char; PREFIX_MAX + 1],
    pub event: Option<extern "C" fn(*mut c_void, u32, *const c_char, u64)>,
    pub event_ctx: *mut c_void,
}

/// `struct fb_flowop_stat`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FbFlowopStat {
    pub name: [c_char; 24],
    pub kind: u32,
    pub op: u32,
    pub ops: u64,
    pub bytes: u64,
    pub ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
}

/// `struct fb_counters`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct FbCounters {
    pub creates: u64,
    pub destroys: u64,
    pub attaches: u64,
    pub detaches: u64,
    pub psyncs: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub truncated_writes: u64,
    pub truncated_bytes: u64,
    pub pick_waits: u64,
    pub verify_errors: u64,
}

/// `struct fb_result`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FbResult {
    pub personality: u32,
    pub nflowops: u32,
    pub nthreads: u32,
    pub nfiles: u32,
    pub loops: u64,
    pub elapsed_ns: u64,
    pub run: FbCounters,
    pub prepare: FbCounters,
    pub files_at_end: u64,
    pub bytes_at_end: u64,
    pub flowops: [FbFlowopStat; MAX_FLOWOPS],
    pub error: [c_char; ERROR_MAX],
}

impl FbResult {
    /// An all-zero result, as the C code expects to fill.
    pub fn zeroed() -> Self {
        Self {
            personality: 0,
            nflowops: 0,
            nthreads: 0,
            nfiles: 0,
            loops: 0,
            elapsed_ns: 0,
            run: FbCounters::default(),
            prepare: FbCounters::default(),
            files_at_end: 0,
            bytes_at_end: 0,
            flowops: [FbFlowopStat {
                name: [0; 24],
                kind: 0,
                op: 0,
                ops: 0,
                bytes: 0,
                ns: 0,
                min_ns: 0,
                max_ns: 0,
            }; MAX_FLOWOPS],
            error: [0; ERROR_MAX],
        }
    }
}

/// `struct fb_check_result`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct FbCheckResult {
    pub entries: u64,
    pub present: u64,
    pub empty: u64,
    pub bytes: u64,
    pub bad_header: u64,
    pub bad_data: u64,
    pub bad_tail: u64,
    pub wrong_length: u64,
    pub wrong_presence: u64,
    pub errors: u64,
}

/// `struct fb_fileset`, opaque.
#[repr(C)]
pub struct FbFileset {
    _private: [u8; 0],
}

/// The text of a NUL-terminated C array (up to its first NUL; lossy UTF-8).
pub fn c_text(a: &[c_char]) -> String {
    let bytes: Vec<u8> = a
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `fb_check()`'s per-entry callback.
pub type CheckEach = extern "C" fn(*mut c_void, *const c_char, c_int, u64, u32);

extern "C" {
    pub fn fb_write_share(p: u32, writes: *mut u32, ios: *mut u32) -> c_int;
    pub fn fb_loop_len(p: u32) -> u32;
    pub fn fb_default_file_cap(meanfilesize: u64, appendsize: u64) -> u64;
    pub fn fb_config_init(cfg: *mut FbConfig, p: u32, scale: u32) -> c_int;
    pub fn fb_config_check(cfg: *const FbConfig, err: *mut c_char, errlen: usize) -> c_int;
    pub fn fb_fileset_new(cfg: *const FbConfig, ops: *const FbPmoOps) -> *mut FbFileset;
    pub fn fb_fileset_free(fs: *mut FbFileset);
    pub fn fb_fileset_error(fs: *const FbFileset) -> *const c_char;
    pub fn fb_prepare(fs: *mut FbFileset, res: *mut FbResult) -> c_int;
    pub fn fb_run_fileset(fs: *mut FbFileset, res: *mut FbResult) -> c_int;
    pub fn fb_check(
        fs: *mut FbFileset,
        mode: u32,
        out: *mut FbCheckResult,
        each: Option<CheckEach>,
        ctx: *mut c_void,
    ) -> c_int;
    pub fn fb_cleanup(fs: *mut FbFileset) -> c_int;
    pub fn fb_format(res: *const FbResult, csv: c_int, buf: *mut c_char, len: usize) -> usize;
    #[cfg(test)]
    pub fn fb_abi_size(which: u32) -> usize;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn sizes_match_the_c_structs() {
        // SAFETY: fb_abi_size only returns sizeof values.
        let c = |which| unsafe { fb_abi_size(which) };
        assert_eq!(c(0), size_of::<FbConfig>());
        assert_eq!(c(1), size_of::<FbResult>());
        assert_eq!(c(2), size_of::<FbCheckResult>());
        assert_eq!(c(3), size_of::<FbPmoOps>());
        assert_eq!(c(4), size_of::<FbFlowopStat>());
        assert_eq!(c(5), size_of::<FbCounters>());
        assert_eq!(c(6), 0);
    }
}
