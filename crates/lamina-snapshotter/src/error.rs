use lamina_mount::RootfsError;
use lamina_store::StoreError;

/// Why a snapshot call failed; each variant maps to the gRPC code containerd turns into
/// its own error kind (`errdefs`), so containerd reacts as it would to its own snapshotters.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot `{0}` does not exist")]
    NotFound(String),
    /// Also the answer to a `Prepare` whose `containerd.io/snapshot.ref` layer lamina has.
    #[error("snapshot `{0}` already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<SnapshotError> for tonic::Status {
    fn from(e: SnapshotError) -> Self {
        let message = e.to_string();
        match e {
            SnapshotError::NotFound(_) => tonic::Status::not_found(message),
            SnapshotError::AlreadyExists(_) => tonic::Status::already_exists(message),
            SnapshotError::FailedPrecondition(_) => tonic::Status::failed_precondition(message),
            SnapshotError::InvalidArgument(_) => tonic::Status::invalid_argument(message),
            SnapshotError::Rootfs(RootfsError::Busy { .. }) => {
                tonic::Status::failed_precondition(message)
            }
            SnapshotError::Rootfs(_) | SnapshotError::Store(_) => tonic::Status::unknown(message),
        }
    }
}
