//! libFuzzer entry for the `pmo_service` body in pmo-fuzz-targets.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pmo_fuzz_targets::pmo_service::run(data));
