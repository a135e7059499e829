//! See lamina_fuzz_harness::container_record for the property checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    lamina_fuzz_harness::container_record(data);
});
