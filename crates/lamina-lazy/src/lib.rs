//! Lazy pulling's data path (issue 39): a layer's regular files served by a FUSE
//! filesystem before their bytes have arrived. A read of a range not yet present fetches
//! the chunks that cover it (their members, by byte range), checks each against the digest
//! the layer's verified index gives it, writes it into the file's sparse copy, and only
//! then answers; a chunk that cannot be fetched or checked fails the read with `EIO`.
//!
//! Why FUSE and not fanotify (docs/strategies.md, "Lazy data: what the kernel reports"):
//! pages a mapping faults in through overlay reach FUSE's read path, but raise no
//! fanotify event; and a FUSE filesystem whose server is gone fails reads (`ENOTCONN`),
//! where a dead fanotify listener lets them read the holes as zeros.
//!
//! The filesystem is flat: one read-only file per object, named as the lazy layer's tree
//! redirects to it (`layer::object_name`), so it is mounted as overlay's data-only lower.

mod objects_fs;

pub use objects_fs::{ChunkSource, LazyObject, ObjectsFs};

mod registry_blob;

pub use registry_blob::RegistryBlob;

pub mod complete;
pub mod fetched;
mod prefetch;

pub use prefetch::Prefetched;
pub mod layer;
pub mod serve;
