//! The properties lamina's fuzz targets (`fuzz/`, run with cargo-fuzz on nightly) check on
//! every input. They live here, in the workspace, so `cargo test` on stable replays the
//! checked-in corpus (`fuzz/corpus/<target>/`) through exactly the same checks.
//!
//! Each function panics when a property is broken; a returned error is fine (hostile input
//! is expected to be refused).

mod documents;
mod estargz;
mod layer;
mod record;
mod scratch;

pub use documents::{docker_archive, oci_documents};
pub use estargz::{estargz_index, zstd_chunked_manifest};
pub use layer::unpack_layer;
pub use record::container_record;
