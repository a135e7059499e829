//! Replays the checked-in fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz targets'
//! checks on stable, so CI catches a regression of anything a fuzz run once found.

use std::fs;
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .map(|p| {
            let bytes = fs::read(&p).expect("corpus file");
            (p, bytes)
        })
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} is empty", dir.display());
    inputs
}

fn replay<T>(target: &str, check: fn(&[u8]) -> T) {
    for (path, bytes) in corpus(target) {
        let result = std::panic::catch_unwind(|| {
            check(&bytes);
        });
        assert!(result.is_ok(), "{} broke a property", path.display());
    }
}

#[test]
fn unpack_layer_corpus() {
    replay("unpack_layer", lamina_fuzz_harness::unpack_layer);
}

#[test]
fn oci_documents_corpus() {
    replay("oci_documents", lamina_fuzz_harness::oci_documents);
}

#[test]
fn docker_archive_corpus() {
    replay("docker_archive", lamina_fuzz_harness::docker_archive);
}

#[test]
fn container_record_corpus() {
    replay("container_record", lamina_fuzz_harness::container_record);
}

/// The seeds the fuzzer starts from must reach past parsing, or it explores only errors.
#[test]
fn valid_seeds_resolve() {
    let seed = |t: &str| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus")
            .join(t);
        fs::read(dir.join("valid")).expect("valid seed")
    };
    assert!(lamina_fuzz_harness::oci_documents(&seed("oci_documents")));
    assert!(lamina_fuzz_harness::docker_archive(&seed("docker_archive")));
    assert!(lamina_fuzz_harness::container_record(&seed(
        "container_record"
    )));
    assert!(lamina_fuzz_harness::estargz_index(&seed("estargz_index")));
    assert!(lamina_fuzz_harness::zstd_chunked_manifest(&seed(
        "zstd_chunked_manifest"
    )));
}

#[test]
fn estargz_index_corpus() {
    replay("estargz_index", lamina_fuzz_harness::estargz_index);
}

#[test]
fn zstd_chunked_manifest_corpus() {
    replay(
        "zstd_chunked_manifest",
        lamina_fuzz_harness::zstd_chunked_manifest,
    );
}
