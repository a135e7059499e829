//! See lamina_fuzz_harness::estargz_index for the property checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    lamina_fuzz_harness::estargz_index(data);
});
