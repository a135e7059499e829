//! The snapshotter as containerd meets it: a `lamina daemon --containerd-socket` process,
//! a blocking client of its gRPC API, and mounts of what it answers, made with mount(8)
//! as containerd's shim makes them, unmounted on drop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use lamina_snapshotter::proto::containerd::services::snapshots::v1 as api;
use lamina_snapshotter::proto::containerd::services::snapshots::v1::snapshots_client::SnapshotsClient;
use lamina_snapshotter::proto::containerd::types::Mount;
use tonic::Status;
use tonic::transport::Channel;

use crate::lamina::binary;

/// The snapshotter on the store at `root`, in this process, as `lamina daemon` opens it
/// with `--strategy classic`: for tests that cut power under it or look at its rows.
pub fn open_in_process(
    root: &Path,
) -> Result<lamina_snapshotter::Snapshotter, lamina_snapshotter::SnapshotError> {
    let store = lamina_store::Store::open(root).expect("opening the store");
    let mounter = std::sync::Arc::new(lamina_sys::RealMounter::new());
    lamina_snapshotter::Snapshotter::open(store, mounter, lamina_mount::Strategies::CLASSIC)
}

/// A running `lamina daemon --containerd-socket`, stopped (SIGTERM) on drop.
#[derive(Debug)]
pub struct Daemon {
    pub store: PathBuf,
    pub socket: PathBuf,
    args: Vec<String>,
    /// Where its stderr goes: beside the store unless a benchmark keeps it off the
    /// filesystem it measures.
    log: PathBuf,
    /// `LAMINA_PAUSE_AT` for the next start only.
    pause_at: Option<String>,
    /// `LAMINA_FAIL_ONCE_AT` for the next start only.
    fail_once_at: Option<String>,
    child: Option<Child>,
}

impl Daemon {
    /// Starts the daemon on `store` (made if missing), serving `socket`, with `extra`
    /// daemon flags; returns once the socket answers.
    pub fn start(store: &Path, socket: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_logging_to(store, socket, extra, &store.with_extension("daemon.log"))
    }

    /// [`Daemon::start`] with its log at `log`: a benchmark keeps it off the filesystem
    /// it measures, as a node's daemon logs to its journal, so that an unmount's sync
    /// there does not write the log's pages back.
    pub fn start_logging_to(store: &Path, socket: &Path, extra: &[&str], log: &Path) -> Daemon {
        let mut daemon = Daemon {
            store: store.to_path_buf(),
            socket: socket.to_path_buf(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            log: log.to_path_buf(),
            pause_at: None,
            fail_once_at: None,
            child: None,
        };
        daemon.spawn();
        daemon
    }

    /// [`Daemon::start`], with the daemon stopping for good at fault point `point`
    /// (`LAMINA_PAUSE_AT`), until [`Daemon::crash_and_restart`].
    pub fn start_paused_at(store: &Path, socket: &Path, point: &str) -> Daemon {
        let mut daemon = Daemon {
            store: store.to_path_buf(),
            socket: socket.to_path_buf(),
            args: Vec::new(),
            log: store.with_extension("daemon.log"),
            pause_at: Some(point.to_string()),
            fail_once_at: None,
            child: None,
        };
        daemon.spawn();
        daemon
    }

    /// [`Daemon::start`], with the step at fault point `point` failing the first time
    /// this daemon reaches it (`LAMINA_FAIL_ONCE_AT`; not after a restart).
    pub fn start_failing_once_at(store: &Path, socket: &Path, point: &str) -> Daemon {
        let mut daemon = Daemon {
            store: store.to_path_buf(),
            socket: socket.to_path_buf(),
            args: Vec::new(),
            log: store.with_extension("daemon.log"),
            pause_at: None,
            fail_once_at: Some(point.to_string()),
            child: None,
        };
        daemon.spawn();
        daemon
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let mut command = Command::new(binary());
        if let Some(point) = self.pause_at.take() {
            command.env("LAMINA_PAUSE_AT", point);
        }
        if let Some(point) = self.fail_once_at.take() {
            command.env("LAMINA_FAIL_ONCE_AT", point);
        }
        let child = command
            .arg("--store")
            .arg(&self.store)
            .args(["daemon", "--containerd-socket"])
            .arg(&self.socket)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting lamina daemon");
        self.child = Some(child);
        crate::wait_until("the snapshotter's socket", || {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("lamina daemon exited ({status}): {}", self.log());
            }
            std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
        });
    }

    /// Kills the daemon (SIGKILL: no chance to tidy up) and starts it again.
    pub fn crash_and_restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    /// The daemon's process ID (for its memory, in benchmarks).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the daemon, runs `between` (the daemon is not running), and starts it again.
    pub fn stop_and_restart(&mut self, between: impl FnOnce()) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        between();
        self.spawn();
    }

    /// Stops the daemon as systemd does (SIGTERM), waiting at most `bound` for it to
    /// exit; false if it had not, and then it is killed.
    pub fn stop_within(&mut self, bound: std::time::Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill").arg(child.id().to_string()).status();
        let started = std::time::Instant::now();
        while started.elapsed() < bound {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// The daemon's log so far (stderr), for assertion messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }
}

/// A blocking client of the snapshots API.
#[derive(Debug)]
pub struct Api {
    runtime: tokio::runtime::Runtime,
    client: SnapshotsClient<Channel>,
    /// The snapshotter named in requests, and the containerd namespace they carry: what
    /// containerd's own snapshots service needs (lamina's socket ignores both).
    snapshotter: String,
    namespace: Option<String>,
}

pub type Labels = HashMap<String, String>;

/// Labels from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Api {
    pub fn connect(socket: &Path) -> Api {
        Api::connect_as(socket, "lamina", None)
    }

    /// A client of containerd's own snapshots service (its main socket), for snapshotter
    /// `snapshotter` in containerd namespace `namespace`.
    pub fn via_containerd(socket: &Path, snapshotter: &str, namespace: &str) -> Api {
        Api::connect_as(socket, snapshotter, Some(namespace))
    }

    fn connect_as(socket: &Path, snapshotter: &str, namespace: Option<&str>) -> Api {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let client = runtime
            .block_on(lamina_snapshotter::connect(socket))
            .expect("connecting to the snapshotter");
        Api {
            runtime,
            client,
            snapshotter: snapshotter.to_string(),
            namespace: namespace.map(str::to_string),
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(ns) = &self.namespace {
            request
                .metadata_mut()
                .insert("containerd-namespace", ns.parse().expect("ascii namespace"));
        }
        request
    }

    pub fn prepare(&self, key: &str, parent: &str, labels: Labels) -> Result<Vec<Mount>, Status> {
        let request = api::PrepareSnapshotRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.into(),
            parent: parent.into(),
            labels,
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.prepare(self.request(request)))
            .map(|r| r.into_inner().mounts)
    }

    pub fn view(&self, key: &str, parent: &str) -> Result<Vec<Mount>, Status> {
        self.view_with(key, parent, Labels::new())
    }

    /// View, with labels.
    pub fn view_with(&self, key: &str, parent: &str, labels: Labels) -> Result<Vec<Mount>, Status> {
        let request = api::ViewSnapshotRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.into(),
            parent: parent.into(),
            labels,
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.view(self.request(request)))
            .map(|r| r.into_inner().mounts)
    }

    pub fn mounts(&self, key: &str) -> Result<Vec<Mount>, Status> {
        let request = api::MountsRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.into(),
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.mounts(self.request(request)))
            .map(|r| r.into_inner().mounts)
    }

    pub fn commit(&self, name: &str, key: &str, labels: Labels) -> Result<(), Status> {
        self.commit_onto(name, key, "", labels)
    }

    /// Commit with containerd 2.x's `parent` (a rebase), `""` for none.
    pub fn commit_onto(
        &self,
        name: &str,
        key: &str,
        parent: &str,
        labels: Labels,
    ) -> Result<(), Status> {
        let request = api::CommitSnapshotRequest {
            snapshotter: self.snapshotter.clone(),
            name: name.into(),
            key: key.into(),
            labels,
            parent: parent.into(),
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.commit(self.request(request)))
            .map(|_| ())
    }

    pub fn remove(&self, key: &str) -> Result<(), Status> {
        let request = api::RemoveSnapshotRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.into(),
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.remove(self.request(request)))
            .map(|_| ())
    }

    pub fn stat(&self, key: &str) -> Result<api::Info, Status> {
        let request = api::StatSnapshotRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.into(),
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.stat(self.request(request)))
            .map(|r| r.into_inner().info.expect("stat answers info"))
    }

    pub fn update(&self, info: api::Info, paths: &[&str]) -> Result<api::Info, Status> {
        let request = api::UpdateSnapshotRequest {
            snapshotter: self.snapshotter.clone(),
            info: Some(info),
            update_mask: Some(prost_types::FieldMask {
                paths: paths.iter().map(|p| p.to_string()).collect(),
            }),
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.update(self.request(request)))
            .map(|r| r.into_inner().info.expect("update answers info"))
    }

    /// Names of the snapshots `filters` select, sorted.
    pub fn list(&self, filters: &[&str]) -> Result<Vec<String>, Status> {
        let request = api::ListSnapshotsRequest {
            snapshotter: self.snapshotter.clone(),
            filters: filters.iter().map(|f| f.to_string()).collect(),
        };
        let mut client = self.client.clone();
        self.runtime.block_on(async {
            let mut stream = client.list(self.request(request)).await?.into_inner();
            let mut names = Vec::new();
            while let Some(chunk) = stream.message().await? {
                names.extend(chunk.info.into_iter().map(|i| i.name));
            }
            names.sort();
            Ok(names)
        })
    }

    /// (bytes, inodes)
    pub fn usage(&self, key: &str) -> Result<(i64, i64), Status> {
        let request = api::UsageRequest {
            snapshotter: self.snapshotter.clone(),
            key: key.into(),
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.usage(self.request(request)))
            .map(|r| r.into_inner())
            .map(|u| (u.size, u.inodes))
    }

    pub fn cleanup(&self) -> Result<(), Status> {
        let request = api::CleanupRequest {
            snapshotter: self.snapshotter.clone(),
        };
        let mut client = self.client.clone();
        self.runtime
            .block_on(client.cleanup(self.request(request)))
            .map(|_| ())
    }
}

/// Snapshot mounts mounted on a fresh directory, as containerd's shim mounts them;
/// unmounted (and the directory removed) on drop.
#[derive(Debug)]
pub struct Mounted {
    dir: tempfile::TempDir,
}

impl Mounted {
    pub fn new(mounts: &[Mount]) -> Mounted {
        let dir = tempfile::Builder::new()
            .prefix("lamina-snapshot-")
            .tempdir()
            .expect("temp dir");
        assert_eq!(mounts.len(), 1, "lamina answers one mount: {mounts:?}");
        let m = &mounts[0];
        let mut command = Command::new("mount");
        if m.r#type == "bind" {
            command.args(["-o", &m.options.join(",")]);
        } else {
            command.args(["-t", &m.r#type, "-o", &m.options.join(",")]);
        }
        let status = command
            .arg(&m.source)
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(status.success(), "mounting {m:?} failed");
        Mounted { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}
