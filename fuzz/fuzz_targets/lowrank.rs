#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvslice_fuzz::lowrank(data));
