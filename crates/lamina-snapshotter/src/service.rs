//! containerd's `Snapshots` gRPC service over [`Snapshotter`]. Each call runs on tokio's
//! blocking pool: the work is file system and mount syscalls, and the store's snapshot
//! lock serialises what must be serial.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;

use prost_types::Timestamp;
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use crate::proto::containerd::services::snapshots::v1 as api;
use crate::proto::containerd::services::snapshots::v1::snapshots_server::Snapshots;
use crate::proto::containerd::types::Mount;
use crate::{Info, MountSpec, SnapshotError, Snapshotter};
use lamina_snapshot_index::SnapshotKind;

/// How many snapshots one `List` response message carries at most.
const LIST_CHUNK: usize = 100;

/// The most encoded bytes one `List` response message carries (one snapshot's labels are
/// bounded below it, `MAX_LABEL_BYTES`): well under containerd's 16 MiB receive limit for
/// proxy plugins, and small enough that encoding one, on the runtime's one thread, holds
/// other calls back for a moment only.
const LIST_CHUNK_BYTES: usize = 1024 * 1024;

/// How many calls that change snapshots run at once. Past the remote Prepares, which
/// talk to a registry before they take it (at most [`crate::remote::AT_ONCE`]), they wait
/// for the store's snapshot lock one after another anyway, and each holds a blocking
/// thread while it waits — up to the store's lock timeout while a `lamina` command holds
/// the lock. Past this many, a call waits for its turn without a thread, and leaves the
/// queue when containerd gives up on it; reads (Stat, Mounts, List, Usage) keep the rest
/// of the pool.
pub(crate) const CHANGES_AT_ONCE: usize = 16 + crate::remote::AT_ONCE;

/// The gRPC face of a [`Snapshotter`].
#[derive(Debug, Clone)]
pub struct Service {
    snapshotter: Snapshotter,
    changes: Arc<Semaphore>,
}

impl Service {
    pub fn new(snapshotter: Snapshotter) -> Self {
        Service {
            snapshotter,
            changes: Arc::new(Semaphore::new(CHANGES_AT_ONCE)),
        }
    }

    /// Once the daemon is stopping: a change still waiting for its turn is refused
    /// (`UNAVAILABLE`, which containerd passes to its caller) rather than started while
    /// the daemon drains; reads and changes already running go on.
    pub(crate) fn refuse_new_changes(&self) {
        self.changes.close();
    }

    /// [`Service::run`] for a call that changes snapshots, once one of
    /// [`CHANGES_AT_ONCE`] turns is free. The turn goes with the work to its thread, so
    /// a call containerd gave up on keeps it until the work ends.
    async fn run_change<T, F>(&self, call: &'static str, work: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Snapshotter) -> Result<T, SnapshotError> + Send + 'static,
    {
        let turn = (self.changes.clone())
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable(format!("{call}: the snapshotter is stopping")))?;
        self.run(call, move |s| {
            let _turn = turn;
            work(s)
        })
        .await
    }

    async fn run<T, F>(&self, call: &'static str, work: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&Snapshotter) -> Result<T, SnapshotError> + Send + 'static,
    {
        let snapshotter = self.snapshotter.clone();
        // A failure is logged on the blocking thread too: a log sink that stalls (a full
        // stderr pipe) must not hold a runtime worker, which serves other connections.
        let answered = tokio::task::spawn_blocking(move || {
            work(&snapshotter).map_err(|e| {
                match &e {
                    SnapshotError::NotFound(_) | SnapshotError::AlreadyExists(_) => {
                        tracing::debug!(call, error = %e, "snapshot call answered")
                    }
                    _ => tracing::warn!(call, error = %e, "snapshot call failed"),
                }
                Status::from(e)
            })
        })
        .await;
        answered.map_err(|e| Status::internal(format!("{call}: {e}")))?
    }
}

fn labels(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

fn mounts(specs: Vec<MountSpec>) -> Vec<Mount> {
    specs
        .into_iter()
        .map(|m| Mount {
            r#type: m.kind,
            source: m.source,
            target: String::new(),
            options: m.options,
        })
        .collect()
}

fn timestamp(ns: u128) -> Option<Timestamp> {
    Some(Timestamp {
        seconds: (ns / 1_000_000_000) as i64,
        nanos: (ns % 1_000_000_000) as i32,
    })
}

fn to_api(info: Info) -> api::Info {
    api::Info {
        name: info.name,
        parent: info.parent,
        kind: match info.kind {
            SnapshotKind::View => api::Kind::View,
            SnapshotKind::Active => api::Kind::Active,
            SnapshotKind::Committed => api::Kind::Committed,
        } as i32,
        created_at: timestamp(info.created_ns),
        updated_at: timestamp(info.updated_ns),
        labels: info.labels.into_iter().collect(),
    }
}

fn from_api(info: api::Info) -> Info {
    Info {
        name: info.name,
        parent: info.parent,
        kind: match api::Kind::try_from(info.kind) {
            Ok(api::Kind::View) => SnapshotKind::View,
            Ok(api::Kind::Committed) => SnapshotKind::Committed,
            _ => SnapshotKind::Active,
        },
        labels: labels(info.labels),
        created_ns: 0,
        updated_ns: 0,
    }
}

type ListStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<api::ListSnapshotsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Snapshots for Service {
    async fn prepare(
        &self,
        request: Request<api::PrepareSnapshotRequest>,
    ) -> Result<Response<api::PrepareSnapshotResponse>, Status> {
        let r = request.into_inner();
        let specs = self
            .run_change("prepare", move |s| {
                s.prepare(&r.key, &r.parent, labels(r.labels))
            })
            .await?;
        Ok(Response::new(api::PrepareSnapshotResponse {
            mounts: mounts(specs),
        }))
    }

    async fn view(
        &self,
        request: Request<api::ViewSnapshotRequest>,
    ) -> Result<Response<api::ViewSnapshotResponse>, Status> {
        let r = request.into_inner();
        let specs = self
            .run_change("view", move |s| s.view(&r.key, &r.parent, labels(r.labels)))
            .await?;
        Ok(Response::new(api::ViewSnapshotResponse {
            mounts: mounts(specs),
        }))
    }

    async fn mounts(
        &self,
        request: Request<api::MountsRequest>,
    ) -> Result<Response<api::MountsResponse>, Status> {
        let key = request.into_inner().key;
        let specs = self.run("mounts", move |s| s.mounts(&key)).await?;
        Ok(Response::new(api::MountsResponse {
            mounts: mounts(specs),
        }))
    }

    async fn commit(
        &self,
        request: Request<api::CommitSnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        let r = request.into_inner();
        self.run_change("commit", move |s| {
            s.commit_onto(&r.name, &r.key, labels(r.labels), &r.parent)
        })
        .await?;
        Ok(Response::new(()))
    }

    async fn remove(
        &self,
        request: Request<api::RemoveSnapshotRequest>,
    ) -> Result<Response<()>, Status> {
        let key = request.into_inner().key;
        self.run_change("remove", move |s| s.remove(&key)).await?;
        Ok(Response::new(()))
    }

    async fn stat(
        &self,
        request: Request<api::StatSnapshotRequest>,
    ) -> Result<Response<api::StatSnapshotResponse>, Status> {
        let key = request.into_inner().key;
        let info = self.run("stat", move |s| s.stat(&key)).await?;
        Ok(Response::new(api::StatSnapshotResponse {
            info: Some(to_api(info)),
        }))
    }

    async fn update(
        &self,
        request: Request<api::UpdateSnapshotRequest>,
    ) -> Result<Response<api::UpdateSnapshotResponse>, Status> {
        let r = request.into_inner();
        let info = r
            .info
            .ok_or_else(|| Status::invalid_argument("update: no snapshot info given"))?;
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        let info = self
            .run_change("update", move |s| s.update(&from_api(info), &paths))
            .await?;
        Ok(Response::new(api::UpdateSnapshotResponse {
            info: Some(to_api(info)),
        }))
    }

    type ListStream = ListStream;

    async fn list(
        &self,
        request: Request<api::ListSnapshotsRequest>,
    ) -> Result<Response<Self::ListStream>, Status> {
        let filters = request.into_inner().filters;
        // Converted and split on the blocking pool too: a List of many snapshots is
        // milliseconds of work, which a runtime worker would spend away from other
        // connections.
        let chunks = self
            .run("list", move |s| {
                let infos = s.list(&filters)?;
                Ok(list_chunks(infos.into_iter().map(to_api)))
            })
            .await?;
        Ok(Response::new(Box::pin(tokio_stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    async fn usage(
        &self,
        request: Request<api::UsageRequest>,
    ) -> Result<Response<api::UsageResponse>, Status> {
        let key = request.into_inner().key;
        let usage = self.run("usage", move |s| s.usage(&key)).await?;
        Ok(Response::new(api::UsageResponse {
            size: i64::try_from(usage.bytes).unwrap_or(i64::MAX),
            inodes: i64::try_from(usage.inodes).unwrap_or(i64::MAX),
        }))
    }

    async fn cleanup(
        &self,
        _request: Request<api::CleanupRequest>,
    ) -> Result<Response<()>, Status> {
        self.run_change("cleanup", |s| s.cleanup().map(|_| ()))
            .await?;
        Ok(Response::new(()))
    }
}

/// `infos` as `List` messages of at most [`LIST_CHUNK`] snapshots and, but for a single
/// snapshot larger than it, [`LIST_CHUNK_BYTES`] encoded.
fn list_chunks(infos: impl Iterator<Item = api::Info>) -> Vec<api::ListSnapshotsResponse> {
    use prost::Message;
    let mut chunks = Vec::new();
    let mut info = Vec::new();
    let mut bytes = 0;
    for one in infos {
        // A field of a message: its tag and length prefix besides its own bytes.
        let size = one.encoded_len() + 8;
        if !info.is_empty() && (info.len() == LIST_CHUNK || bytes + size > LIST_CHUNK_BYTES) {
            chunks.push(api::ListSnapshotsResponse {
                info: std::mem::take(&mut info),
            });
            bytes = 0;
        }
        bytes += size;
        info.push(one);
    }
    if !info.is_empty() {
        chunks.push(api::ListSnapshotsResponse { info });
    }
    chunks
}

#[cfg(test)]
mod list_tests {
    use super::*;

    fn info(name: &str, label_bytes: usize) -> api::Info {
        api::Info {
            name: name.into(),
            labels: [("l".to_string(), "x".repeat(label_bytes))].into(),
            ..Default::default()
        }
    }

    #[test]
    fn list_messages_are_bounded_by_count_and_by_bytes() {
        use prost::Message;
        let small = list_chunks((0..250).map(|n| info(&n.to_string(), 10)));
        assert_eq!(
            small.iter().map(|c| c.info.len()).collect::<Vec<_>>(),
            [100, 100, 50]
        );
        let large = list_chunks((0..100).map(|n| info(&n.to_string(), 200 * 1024)));
        assert!(large.len() >= 5, "{}", large.len());
        assert_eq!(large.iter().map(|c| c.info.len()).sum::<usize>(), 100);
        for chunk in &large {
            assert!(
                chunk.encoded_len() <= LIST_CHUNK_BYTES,
                "{}",
                chunk.encoded_len()
            );
        }
    }
}
