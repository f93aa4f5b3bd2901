//! libFuzzer entry for the `virtio_chains` body in pmo-fuzz-targets.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pmo_fuzz_targets::virtio_chains::run(data));
