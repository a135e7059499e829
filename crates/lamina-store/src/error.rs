use std::path::{Path, PathBuf};

/// What went wrong in the store. Every variant renders as one line naming the thing at
/// fault; the CLI prints it as is.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// GrootFS's text first (operators grep for it), then which store.
    #[error(
        "Store path is not initialized. Please run init-store. (store {0}: run `lamina --store {0} init-store`)"
    )]
    NotInitialised(PathBuf),
    #[error("{0} exists and is not a lamina store")]
    NotAStore(PathBuf),
    #[error("store {}: {why}", store.display())]
    Properties { store: PathBuf, why: String },
    #[error("layer {0} is not in the store (collected by `clean`?); import the image again")]
    LayerMissing(String),
    /// GrootFS's text (`create_test.go`), which operators grep for.
    #[error("image for id `{0}` already exists")]
    AlreadyExists(String),
    /// GrootFS's text for an ID it has no image for (stats, delete).
    #[error("Image `{0}` not found.")]
    NotFound(String),
    /// `id `a/b` contains invalid characters: `/``, as GrootFS words the commonest case.
    #[error("id `{}` {why}", crate::printable(.id))]
    InvalidId { id: String, why: &'static str },
    #[error("{0}")]
    Image(#[from] lamina_image::ImageError),
    #[error("{layer}: {message}")]
    Layer { layer: String, message: String },
    /// A container record that exists but cannot be read as one (empty, truncated,
    /// garbage): one container's problem, never the whole store's.
    #[error("container `{id}`: record {} is unreadable ({why})", path.display())]
    BadRecord {
        id: String,
        path: PathBuf,
        why: String,
    },
    #[error(
        "gave up after {waited_secs} s waiting for store lock `{lock}` ({}): {holders}; \
         retry when it is done, or raise --lock-timeout-seconds",
        path.display()
    )]
    LockTimeout {
        lock: String,
        path: PathBuf,
        waited_secs: u64,
        /// Who holds it, as `held by pid N (`CMD`)`.
        holders: String,
    },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    pub fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + use<> {
        let path = path.to_path_buf();
        move |source| StoreError::Io { op, path, source }
    }

    pub fn errno(
        op: &'static str,
        path: &Path,
    ) -> impl FnOnce(rustix::io::Errno) -> StoreError + use<> {
        let path = path.to_path_buf();
        move |e| StoreError::Io {
            op,
            path,
            source: e.into(),
        }
    }
}
