use std::path::{Path, PathBuf};

/// What went wrong in the store. Every variant renders as one line naming the thing at
/// fault; the CLI prints it as is.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {0} is not initialised: run `lamina --store {0} init-store`")]
    NotInitialised(PathBuf),
    #[error("{0} exists and is not a lamina store")]
    NotAStore(PathBuf),
    #[error("store {}: {why}", store.display())]
    Properties { store: PathBuf, why: String },
    #[error("layer {0} is not in the store (collected by `clean`?); import the image again")]
    LayerMissing(String),
    #[error("container `{0}` already exists")]
    AlreadyExists(String),
    #[error("container `{0}` does not exist")]
    NotFound(String),
    #[error("invalid container ID `{id}`: {why}")]
    InvalidId { id: String, why: &'static str },
    #[error("{0}")]
    Image(#[from] lamina_image::ImageError),
    #[error("{layer}: {message}")]
    Layer { layer: String, message: String },
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
