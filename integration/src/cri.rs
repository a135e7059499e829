//! containerd run as a Kubernetes node runs it (2.4, or Debian's 1.6): the CRI plugin on, its images and
//! containers in one snapshotter (lamina through the proxy, or containerd's own
//! overlayfs), host-network pods (no CNI), and crictl driving it as the kubelet would.
//! Pods still present when the node drops are stopped and removed first, so no sandbox
//! mount or shim outlives a failing test.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Output;
use crate::containerd::{Containerd, Cri, Proxy, Release};

/// The sandbox image every node here pins: busybox sleeping, as pause does.
pub const PAUSE_IMAGE: &str = "lamina.test/pause:1";

/// Which snapshotter keeps the node's images.
#[derive(Debug, Clone)]
pub enum NodeSnapshotter {
    /// lamina's daemon at `socket`, exporting `store` as the image filesystem, with these
    /// proxy capabilities.
    Lamina {
        socket: PathBuf,
        store: PathBuf,
        capabilities: Vec<&'static str>,
    },
    /// lamina's daemon at `socket` serving remote snapshots (`--remote-snapshots`), with
    /// containerd passing it the labels they need; `store` exported as above.
    LaminaRemote { socket: PathBuf, store: PathBuf },
    /// containerd's built-in overlayfs snapshotter.
    Overlayfs,
    /// Another proxy snapshotter (`name` at `socket`), listing no capabilities: the
    /// benchmarks' containerd overlayfs served by proxy, which containerd then chowns
    /// images for user namespaces on.
    OtherProxy { name: &'static str, socket: PathBuf },
}

impl NodeSnapshotter {
    pub fn name(&self) -> &'static str {
        match self {
            NodeSnapshotter::Lamina { .. } | NodeSnapshotter::LaminaRemote { .. } => "lamina",
            NodeSnapshotter::Overlayfs => "overlayfs",
            NodeSnapshotter::OtherProxy { name, .. } => name,
        }
    }
}

/// A CRI node: containerd with its CRI plugin, and crictl (1.37) pointed at it.
#[derive(Debug)]
pub struct Node {
    pub containerd: Containerd,
    pub snapshotter: NodeSnapshotter,
    crictl_config: PathBuf,
}

/// Concurrency of a node's pulls.
#[derive(Debug, Clone, Copy)]
pub struct Pulls {
    pub downloads: u32,
    pub unpacks: Option<u32>,
}

impl Default for Pulls {
    fn default() -> Self {
        Pulls {
            downloads: 3,
            unpacks: None,
        }
    }
}

impl Node {
    /// Starts containerd 2.4 under `dir` as a node keeping images in `snapshotter`, and
    /// imports the pause image (built from `pause_archive`, see [`pause_image`]).
    pub fn start(dir: &Path, snapshotter: NodeSnapshotter, pause_archive: &Path) -> Node {
        Node::start_with(dir, snapshotter, pause_archive, Pulls::default())
    }

    /// [`Node::start`] with the pull concurrency `pulls`.
    pub fn start_with(
        dir: &Path,
        snapshotter: NodeSnapshotter,
        pause_archive: &Path,
        pulls: Pulls,
    ) -> Node {
        Node::start_release(Release::V2, dir, snapshotter, pause_archive, pulls)
    }

    /// [`Node::start_with`] on containerd `release` (1.6's CRI takes no pull settings, no
    /// capabilities, no exports, no user namespaces and no image volumes).
    pub fn start_release(
        release: Release,
        dir: &Path,
        snapshotter: NodeSnapshotter,
        pause_archive: &Path,
        pulls: Pulls,
    ) -> Node {
        let cri = Cri {
            snapshotter: snapshotter.name(),
            sandbox_image: PAUSE_IMAGE,
            max_concurrent_downloads: pulls.downloads,
            max_concurrent_unpacks: pulls.unpacks,
        };
        let containerd = match &snapshotter {
            NodeSnapshotter::Lamina {
                socket,
                store,
                capabilities,
            } => {
                let proxy = Proxy {
                    name: "lamina",
                    socket,
                    capabilities,
                    exports_root: Some(store),
                    remote_snapshots: false,
                };
                Containerd::start_configured(release, dir, &[proxy], Some(&cri))
            }
            NodeSnapshotter::LaminaRemote { socket, store } => {
                let proxy = Proxy {
                    name: "lamina",
                    socket,
                    capabilities: &[],
                    exports_root: Some(store),
                    remote_snapshots: true,
                };
                Containerd::start_configured(release, dir, &[proxy], Some(&cri))
            }
            NodeSnapshotter::Overlayfs => {
                Containerd::start_configured(release, dir, &[], Some(&cri))
            }
            NodeSnapshotter::OtherProxy { name, socket } => {
                let proxy = Proxy::plain(name, socket);
                Containerd::start_configured(release, dir, &[proxy], Some(&cri))
            }
        };
        let crictl_config = dir.join("crictl.yaml");
        let endpoint = format!("unix://{}", containerd.socket.display());
        std::fs::write(
            &crictl_config,
            format!("runtime-endpoint: {endpoint}\nimage-endpoint: {endpoint}\ntimeout: 60\n"),
        )
        .expect("crictl config");
        let node = Node {
            containerd,
            snapshotter,
            crictl_config,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while node.crictl(&["info"]).code != 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "CRI did not answer in 30 s:\n{}",
                node.containerd.log_tail()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        node.import(pause_archive);
        node
    }

    /// Has the node pull from `host` (a test registry) over plain HTTP, as a
    /// `certs.d/HOST/hosts.toml` would for a node's own mirror.
    pub fn trust_registry(&self, host: &str) {
        let dir = self.containerd.dir.join("certs.d").join(host);
        std::fs::create_dir_all(&dir).expect("certs.d");
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{host}\"\n\n[host.\"http://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .expect("hosts.toml");
    }

    /// `ctr -n k8s.io images import` into the node's snapshotter, as images a node was
    /// given are.
    pub fn import(&self, archive: &Path) {
        let out = self
            .containerd
            .ctr_command()
            .args(["-n", "k8s.io", "images", "import", "--snapshotter"])
            .arg(self.snapshotter.name())
            .arg(archive)
            .stdin(Stdio::null())
            .output()
            .expect("ctr images import");
        assert!(
            out.status.success(),
            "import {}: {out:?}\n{}",
            archive.display(),
            self.containerd.log_tail()
        );
    }

    /// `crictl ARGS...` against this node.
    pub fn crictl(&self, args: &[&str]) -> Output {
        let out = Command::new(Release::V2.program("crictl"))
            .arg("--config")
            .arg(&self.crictl_config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running crictl");
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `crictl ARGS...`, asserting it succeeded; its stdout, trimmed.
    pub fn crictl_ok(&self, args: &[&str]) -> String {
        let out = self.crictl(args);
        assert_eq!(
            out.code,
            0,
            "crictl {args:?} on {}: {out:?}\n{}",
            self.snapshotter.name(),
            self.containerd.log_tail()
        );
        out.stdout.trim().to_string()
    }

    /// The kinds (`Active`, `Committed`, ...) of the snapshots the node's snapshotter holds
    /// in CRI's namespace, sorted.
    pub fn snapshot_kinds(&self) -> Vec<String> {
        let out = self.containerd.ctr_ok(&[
            "-n",
            "k8s.io",
            "snapshots",
            "--snapshotter",
            self.snapshotter.name(),
            "ls",
        ]);
        let mut kinds: Vec<String> = out
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().last().map(str::to_string))
            .collect();
        kinds.sort();
        kinds
    }

    /// Runs a host-network pod from `pod` (a PodSandboxConfig as JSON, see [`pod_config`]);
    /// its ID.
    pub fn run_pod(&self, pod: &serde_json::Value) -> String {
        let file = self.write_config("pod", pod);
        self.crictl_ok(&["runp", file.to_str().expect("utf-8 path")])
    }

    /// Creates and starts a container from `container` in pod `pod_id`; its ID.
    pub fn start_container(
        &self,
        pod_id: &str,
        pod: &serde_json::Value,
        container: &serde_json::Value,
    ) -> String {
        let pod_file = self.write_config("pod", pod);
        let file = self.write_config("container", container);
        let id = self.crictl_ok(&[
            "create",
            pod_id,
            file.to_str().expect("utf-8 path"),
            pod_file.to_str().expect("utf-8 path"),
        ]);
        self.crictl_ok(&["start", &id]);
        id
    }

    /// `crictl exec ID sh -c SCRIPT`'s stdout.
    pub fn exec(&self, id: &str, script: &str) -> String {
        self.crictl_ok(&["exec", id, "sh", "-c", script])
    }

    /// Stops and removes pod `id` and its containers.
    pub fn remove_pod(&self, id: &str) {
        self.crictl_ok(&["stopp", id]);
        self.crictl_ok(&["rmp", id]);
    }

    fn write_config(&self, kind: &str, value: &serde_json::Value) -> PathBuf {
        let name = value["metadata"]["name"].as_str().unwrap_or("unnamed");
        let path = self.containerd.dir.join(format!("{kind}-{name}.json"));
        std::fs::write(&path, value.to_string()).expect("writing a CRI config");
        path
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Pods first, while containerd still runs: their shims, sandbox mounts and
        // snapshots go with them.
        let pods = self.crictl(&["pods", "-q"]);
        for id in pods.stdout.lines().filter(|l| !l.is_empty()) {
            let _ = self.crictl(&["stopp", id]);
            let _ = self.crictl(&["rmp", "-f", id]);
        }
    }
}

/// A host-network pod's config; with `userns`, in a user namespace mapping container
/// IDs 0..65536 to host IDs from `userns`.
pub fn pod_config(name: &str, log_dir: &Path, userns: Option<u32>) -> serde_json::Value {
    let mut namespaces = serde_json::json!({ "network": 2 });
    if let Some(host) = userns {
        let map = serde_json::json!([{ "host_id": host, "container_id": 0, "length": 65536 }]);
        namespaces["userns_options"] = serde_json::json!({ "mode": 0, "uids": map, "gids": map });
    }
    serde_json::json!({
        "metadata": { "name": name, "namespace": "lamina", "uid": format!("uid-{name}"), "attempt": 0 },
        "log_directory": log_dir,
        "linux": { "security_context": { "namespace_options": namespaces } },
    })
}

/// A container's config running `script` under `sh -c` in `image`, its namespaces as
/// `pod`'s (CRI wants them repeated).
pub fn container_config(
    name: &str,
    image: &str,
    script: &str,
    pod: &serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "name": name },
        "image": { "image": image },
        "command": ["sh", "-c", script],
        "log_path": format!("{name}.log"),
        "linux": { "security_context": {
            "namespace_options": pod["linux"]["security_context"]["namespace_options"].clone(),
        } },
    })
}

/// Writes the pause image (the sample's busybox layer alone, its command a long sleep)
/// as a docker archive tagged [`PAUSE_IMAGE`] under `dir`; its path. It shares the
/// sample's base layer, not its top one, which a test's pull must unpack itself.
pub fn pause_image(dir: &Path) -> PathBuf {
    write_archive(dir, PAUSE_IMAGE, &["/bin/sleep", "2147483647"], false)
}

/// Writes the sample image's two layers with command `cmd`, tagged `tag`, as a docker
/// archive under `dir`; its path.
pub fn image_archive(dir: &Path, tag: &str, cmd: &[&str]) -> PathBuf {
    write_archive(dir, tag, cmd, true)
}

fn write_archive(dir: &Path, tag: &str, cmd: &[&str], with_top: bool) -> PathBuf {
    let busybox = std::fs::read(lamina_sample::DEFAULT_BUSYBOX)
        .expect("Debian's busybox-static (scripts/test installs it)");
    let mut layers = vec![lamina_sample::Layer {
        tar: lamina_sample::base_layer(&busybox).expect("base layer"),
        compression: lamina_image::Compression::Gzip,
    }];
    if with_top {
        layers.push(lamina_sample::Layer {
            tar: lamina_sample::top_layer().expect("top layer"),
            compression: lamina_image::Compression::Zstd,
        });
    }
    let image = lamina_sample::build_image_with_cmd(
        &layers,
        &["PATH=/bin"],
        cmd,
        &lamina_image::Platform::host(),
    )
    .expect("building an image");
    std::fs::create_dir_all(dir).expect("image dir");
    let file = tag.replace(['/', ':'], "_");
    let path = dir.join(format!("{file}.docker.tar"));
    lamina_sample::write_docker_archive(&image, tag, &path).expect("writing an image");
    path
}

/// Writes a one-layer image holding only `/volume.txt` (no shell: it is mounted, never
/// run), tagged `tag`, as a docker archive under `dir`; its path.
pub fn volume_image(dir: &Path, tag: &str) -> PathBuf {
    let tar = lamina_sample::LayerBuilder::new()
        .file("volume.txt", 0o644, b"from the volume image\n")
        .and_then(lamina_sample::LayerBuilder::finish)
        .expect("volume layer");
    let layers = [lamina_sample::Layer {
        tar,
        compression: lamina_image::Compression::Gzip,
    }];
    let image = lamina_sample::build_image_with_cmd(
        &layers,
        &[],
        &["/none"],
        &lamina_image::Platform::host(),
    )
    .expect("building an image");
    std::fs::create_dir_all(dir).expect("image dir");
    let path = dir.join(format!("{}.docker.tar", tag.replace(['/', ':'], "_")));
    lamina_sample::write_docker_archive(&image, tag, &path).expect("writing an image");
    path
}
