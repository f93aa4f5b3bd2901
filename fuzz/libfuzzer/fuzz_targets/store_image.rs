//! libFuzzer entry for the `store_image` body in pmo-fuzz-targets.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pmo_fuzz_targets::store_image::run(data));
