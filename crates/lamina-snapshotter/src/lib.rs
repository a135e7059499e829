//! lamina as a containerd proxy snapshotter: containerd's snapshots gRPC service
//! (`containerd.services.snapshots.v1.Snapshots`) over lamina's store and mount
//! strategies. See docs/containerd.md for configuration, labels and how each strategy
//! maps to the mounts containerd receives.
//!
//! [`Snapshotter`] holds the semantics and knows nothing of gRPC; [`Service`] adapts it;
//! [`serve`] puts it on a unix socket; [`metrics`] shows what it and the store are doing
//! to Prometheus.

mod accept_backoff;
mod commit;
mod complete;
mod error;
mod filters;
mod idmap_labels;
mod info;
mod label_bounds;
mod metacopy_origin;
pub mod metrics;
mod metrics_http;
mod observe;
mod one_write;
mod rebase;
mod rebuild;
mod remote;
mod serve;
mod service;
mod snapshotter;
mod usage_cache;

pub use error::SnapshotError;
pub use filters::{Fields, Filters};
pub use info::{Info, Usage};
pub use label_bounds::MAX_LABEL_BYTES;
pub use remote::{REMOTE_LABEL, RemoteSources};
pub use serve::{ServeError, connect, serve, serve_until_signalled};
pub use service::Service;
pub use snapshotter::{
    EPHEMERAL_LABEL, GIDMAPPING_LABEL, MountSpec, REF_LABEL, STRATEGY_LABEL, Snapshotter,
    UIDMAPPING_LABEL,
};

/// Generated from the vendored containerd protos (`proto/`, Apache-2.0, containerd
/// Authors) by `build.rs`.
#[allow(missing_debug_implementations, clippy::all)]
pub mod proto {
    pub mod containerd {
        pub mod types {
            tonic::include_proto!("containerd.types");
        }
        pub mod services {
            pub mod snapshots {
                pub mod v1 {
                    tonic::include_proto!("containerd.services.snapshots.v1");
                }
            }
        }
    }
}
