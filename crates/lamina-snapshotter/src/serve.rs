//! Serving the snapshots service on a unix socket, as containerd's `proxy_plugins` expect,
//! and a client for the same socket (tests, benchmarks, tools).

use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};

use crate::accept_backoff::Incoming;
use crate::observe::ObserveLayer;
use crate::proto::containerd::services::snapshots::v1::snapshots_client::SnapshotsClient;
use crate::proto::containerd::services::snapshots::v1::snapshots_server::SnapshotsServer;
use crate::{Service, Snapshotter};

/// How long calls in flight may take to finish once the daemon is told to stop: with
/// [`THREADS_AFTER_DRAIN`], inside the 30 s the packaged unit gives a stop
/// (`TimeoutStopSec`, packaging/lamina.service) before it kills the daemon.
const DRAIN: Duration = Duration::from_secs(20);

/// How long the calls' threads are waited for after that, before the process exits
/// without them.
const THREADS_AFTER_DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("socket {}: another process is serving it", .0.display())]
    InUse(PathBuf),
    #[error("socket {}: {source}", path.display())]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics address {address}: {source}")]
    Metrics {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("serving {}: {source}", path.display())]
    Transport {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Serves `snapshotter` on `socket` until `shutdown` completes and the calls in flight
/// have finished — for at most [`DRAIN`], or until `hurry` completes — then removes the
/// socket.
/// A stale socket (its server died) is replaced; a live one is refused. `ready` runs once
/// the socket accepts connections (a client connecting from then on is served).
pub async fn serve(
    snapshotter: Snapshotter,
    socket: &Path,
    ready: impl FnOnce(),
    shutdown: impl Future<Output = ()>,
    hurry: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listener = listen(socket).await?;
    tracing::info!(socket = %socket.display(), store = %snapshotter.store().root().display(), "serving containerd snapshots");
    ready();
    let stopping = Arc::new(Notify::new());
    let told = stopping.clone();
    let service = Service::new(snapshotter.clone());
    let server = service.clone();
    let served = Server::builder()
        .layer(ObserveLayer::new(snapshotter.activity.clone()))
        .add_service(SnapshotsServer::new(server))
        .serve_with_incoming_shutdown(
            Incoming::new(UnixListenerStream::new(listener)),
            async move {
                shutdown.await;
                service.refuse_new_changes();
                told.notify_one();
            },
        );
    // Once told to stop, calls in flight get DRAIN to finish: one waiting for a store
    // lock a `lamina` command holds would otherwise keep the daemon up for the lock's
    // timeout. What is cut short is left as a crash leaves it, for the next start.
    let served = tokio::select! {
        served = served => served,
        () = async {
            stopping.notified().await;
            tokio::select! {
                () = tokio::time::sleep(DRAIN) => {}
                () = hurry => {}
            }
        } => {
            tracing::warn!(drain_s = DRAIN.as_secs(), "calls still in flight: stopping without them");
            Ok(())
        }
    };
    let _ = std::fs::remove_file(socket);
    served.map_err(|source| ServeError::Transport {
        path: socket.to_path_buf(),
        source,
    })
}

async fn listen(socket: &Path) -> Result<UnixListener, ServeError> {
    let fail = |source| ServeError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        if !meta.file_type().is_socket() {
            return Err(fail(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a socket",
            )));
        }
        if UnixStream::connect(socket).await.is_ok() {
            return Err(ServeError::InUse(socket.to_path_buf()));
        }
        std::fs::remove_file(socket).map_err(fail)?;
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    let listener = UnixListener::bind(socket).map_err(fail)?;
    // Whoever can talk to the snapshotter can make root mount things: root only.
    lamina_sys::HostFs::set_mode(&lamina_sys::RealHost, lamina_sys::At::Path(socket), 0o600)
        .map_err(|e| fail(e.into()))?;
    Ok(listener)
}

/// A client of the snapshots service on `socket`.
pub async fn connect(socket: &Path) -> Result<SnapshotsClient<Channel>, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    // The URI is required by the API and ignored: every connection goes to the socket.
    let channel = Endpoint::from_static("http://[::]:0")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await?;
    Ok(SnapshotsClient::new(channel))
}

/// [`serve`] on a runtime of its own until SIGTERM or SIGINT: what `lamina daemon
/// --containerd-socket` runs.
pub fn serve_until_signalled(
    snapshotter: Snapshotter,
    socket: &Path,
    ready: impl FnOnce(),
) -> Result<(), ServeError> {
    // One thread does the gRPC I/O: every call's work runs on the blocking pool
    // (`Service::run`, List's chunks too), so the runtime only frames and routes. A
    // multi-thread runtime woke a second worker on every call, between the one that read
    // it and the one that answered (docs/benchmarks.md, issue 40's eighth stop).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| ServeError::Socket {
            path: socket.to_path_buf(),
            source,
        })?;
    let served = runtime.block_on(async {
        // Handlers in place before the socket is served and readiness is told: a SIGTERM
        // right after READY=1 must stop the daemon cleanly, not kill it.
        let signal = |kind| {
            tokio::signal::unix::signal(kind).map_err(|source| ServeError::Socket {
                path: socket.to_path_buf(),
                source,
            })
        };
        let mut term = signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
        // The first signal stops the daemon; a second ends the drain: an operator who
        // signals again does not want to wait for the calls in flight.
        let (stop, hurry) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let (stop_told, hurry_told) = (stop.clone(), hurry.clone());
        tokio::spawn(async move {
            for told in [stop_told, hurry_told] {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = interrupt.recv() => {}
                }
                told.notify_one();
            }
        });
        let shutdown = async move {
            stop.notified().await;
            tracing::info!("signalled: stopping");
        };
        let hurry = async move {
            hurry.notified().await;
            tracing::info!("signalled again: stopping now");
        };
        serve(snapshotter, socket, ready, shutdown, hurry).await
    });
    // A call past DRAIN still holds its blocking thread (a lock wait): dropping the
    // runtime would wait for it without end.
    runtime.shutdown_timeout(THREADS_AFTER_DRAIN);
    served
}
