//! See lamina_fuzz_harness::zstd_chunked_manifest for the property checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    lamina_fuzz_harness::zstd_chunked_manifest(data);
});
