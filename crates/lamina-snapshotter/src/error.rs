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
            // What this host or store cannot give the request now: containerd reports
            // these as its own failed preconditions, not as internal errors.
            SnapshotError::Rootfs(
                RootfsError::Busy { .. }
                | RootfsError::PoolEmpty { .. }
                | RootfsError::Unsupported { .. }
                | RootfsError::UpperNotCommittable { .. }
                | RootfsError::UpperInUse { .. }
                | RootfsError::IdmappedNotCommittable
                | RootfsError::VolatileUnclean { .. },
            ) => tonic::Status::failed_precondition(message),
            // A request that names nothing lamina can provide, whatever the host.
            SnapshotError::Rootfs(
                RootfsError::Refused(_)
                | RootfsError::PoolReadOnly
                | RootfsError::PoolWithoutMount
                | RootfsError::DiskLimitNeedsIsolated { .. }
                | RootfsError::MemoryUpperTooLarge { .. },
            ) => tonic::Status::invalid_argument(message),
            SnapshotError::Rootfs(_) | SnapshotError::Store(_) => tonic::Status::unknown(message),
        }
    }
}
