//! libFuzzer entry for the `cxl_mailbox` body in pmo-fuzz-targets.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pmo_fuzz_targets::cxl_mailbox::run(data));
