//! Unpacks one layer's tar stream into an empty directory, converting OCI whiteouts to
//! the form overlayfs reads (`.wh.NAME` → 0/0 character device, `.wh..wh..opq` →
//! `trusted.overlay.opaque=y`).
//!
//! Layers are untrusted input. Names are checked lexically first ([`EntryPath`] refuses
//! `..` and absolute names), and every filesystem operation is relative to a directory fd
//! that was opened beneath the layer root without following any symlink, so no entry —
//! and no symlink planted by an earlier entry — can create or change anything outside it.
//! The `tar` crate parses; it never writes.

mod entry_path;
pub mod metadata;
mod records;
mod remove;
mod resolve;
mod unpacker;

pub use entry_path::{EntryPath, PathRejection, shown};
pub use metadata::is_reserved_xattr;
pub use records::{Described, Kind, Member, Pending, Refusal};
pub use unpacker::{UnpackSummary, unpack, unpack_limited, unpack_with};

/// A failed unpack, naming the entry at fault where there is one.
#[derive(Debug, thiserror::Error)]
#[error("{}{message}", entry.as_ref().map(|e| format!("entry `{e}`: ")).unwrap_or_default())]
pub struct UnpackError {
    pub entry: Option<String>,
    pub message: String,
}

impl UnpackError {
    pub(crate) fn entry(raw: &[u8], message: impl Into<String>) -> Self {
        Self {
            entry: Some(shown(raw)),
            message: message.into(),
        }
    }

    pub(crate) fn stream(message: impl Into<String>) -> Self {
        Self {
            entry: None,
            message: message.into(),
        }
    }
}
