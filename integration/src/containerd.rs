//! A real containerd of the test's own — Debian's 1.6, or the 2.x that scripts/containerd2
//! builds — its config, root, state and socket all under one directory, lamina registered
//! as a proxy snapshotter, the CRI plugin off unless a test runs a node (see [`crate::cri`]).
//! Stopped (SIGTERM) on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::Output;

/// Where scripts/test puts the directory of scripts/containerd2's build.
pub const CONTAINERD2_ENV: &str = "LAMINA_CONTAINERD2_BIN";

/// Which containerd a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Debian's package (1.6): `containerd`, `ctr`, the shim and runc 1.1 from `PATH`.
    Debian,
    /// containerd 2.4 with its shim, ctr and runc 1.5, from scripts/containerd2's build.
    V2,
}

impl Release {
    /// A short name, for IDs that must not collide between releases running at once.
    pub fn name(self) -> &'static str {
        match self {
            Release::Debian => "v1",
            Release::V2 => "v2",
        }
    }

    /// The directory of containerd 2.x's binaries, put first on containerd's `PATH` so its
    /// shim and runc are found there.
    fn bin_dir(self) -> Option<PathBuf> {
        match self {
            Release::Debian => None,
            Release::V2 => Some(PathBuf::from(std::env::var_os(CONTAINERD2_ENV).unwrap_or_else(
                || {
                    panic!(
                        "{CONTAINERD2_ENV} is unset: run `export {CONTAINERD2_ENV}=$(scripts/containerd2)` (scripts/test does)"
                    )
                },
            ))),
        }
    }

    pub(crate) fn program(self, name: &str) -> PathBuf {
        self.bin_dir()
            .map_or_else(|| PathBuf::from(name), |dir| dir.join(name))
    }

    /// The config file's text for this release.
    fn config(
        self,
        dir: &Path,
        socket: &Path,
        proxies: &[Proxy<'_>],
        cri: Option<&Cri<'_>>,
    ) -> String {
        let (version, cri_plugins) = match self {
            Release::Debian => (2, r#""io.containerd.grpc.v1.cri""#),
            Release::V2 => (
                3,
                r#""io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime""#,
            ),
        };
        let disabled = if cri.is_some() { "" } else { cri_plugins };
        let mut config = format!(
            r#"version = {version}
root = "{root}"
state = "{state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[proxy_plugins]
"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            socket = socket.display(),
        );
        for proxy in proxies {
            config.push_str(&format!(
                "  [proxy_plugins.{}]\n    type = \"snapshot\"\n    address = \"{}\"\n",
                proxy.name,
                proxy.socket.display()
            ));
            if !proxy.capabilities.is_empty() {
                let list: Vec<String> = proxy
                    .capabilities
                    .iter()
                    .map(|c| format!("\"{c}\""))
                    .collect();
                config.push_str(&format!("    capabilities = [{}]\n", list.join(", ")));
            }
            let mut exports = Vec::new();
            if let Some(root) = proxy.exports_root {
                exports.push(format!("root = \"{}\"", root.display()));
            }
            if proxy.remote_snapshots {
                exports.push("enable_remote_snapshot_annotations = \"true\"".into());
            }
            if !exports.is_empty() {
                config.push_str(&format!("    exports = {{ {} }}\n", exports.join(", ")));
            }
        }
        if self == Release::V2 {
            // 2.x's transfer service (`ctr images import`, CRI's pulls) unpacks only for the
            // snapshotters listed with a platform; none listed means overlayfs alone.
            let arch = match std::env::consts::ARCH {
                "x86_64" => "amd64",
                "aarch64" => "arm64",
                other => other,
            };
            for proxy in proxies {
                config.push_str(&format!(
                    "\n[[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]\n  platform = \"linux/{arch}\"\n  snapshotter = \"{}\"\n",
                    proxy.name
                ));
            }
        }
        if let Some(cri) = cri {
            let remote = proxies
                .iter()
                .any(|p| p.remote_snapshots && p.name == cri.snapshotter);
            config.push_str(&self.cri_config(dir, cri, remote));
        }
        config
    }
}

impl Release {
    /// The CRI plugin's sections. Host-network pods need no CNI; snapshot usage is polled
    /// every second, not ten, for tests that read ImageFsInfo; this VM refuses a
    /// container's OOM score below containerd's own unless CRI clamps it
    /// (`restrict_oom_score_adj`). `remote`: 1.6's CRI passes the labels remote
    /// snapshotters read (2.x's pulls through the transfer service, which the proxy's
    /// `enable_remote_snapshot_annotations` export turns them on for; setting
    /// `disable_snapshot_annotations` there would make CRI pull by itself).
    fn cri_config(self, dir: &Path, cri: &Cri<'_>, remote: bool) -> String {
        let annotations = match remote && self == Release::Debian {
            true => "\n    disable_snapshot_annotations = false",
            false => "",
        };
        let registry_config = dir.join("certs.d");
        let registry_config = registry_config.display();
        let (snapshotter, sandbox) = (cri.snapshotter, cri.sandbox_image);
        match self {
            Release::Debian => format!(
                r#"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  restrict_oom_score_adj = true
  stats_collect_period = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter}"{annotations}
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{registry_config}"
"#
            ),
            Release::V2 => {
                // Pull settings go to the transfer service: one CRI takes no transfer for
                // (its own max_concurrent_downloads among them) makes CRI pull by itself.
                let mut text = format!(
                    r#"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{snapshotter}"
  stats_collect_period = 1
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{registry_config}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true

[plugins."io.containerd.transfer.v1.local"]
  max_concurrent_downloads = {downloads}
"#,
                    downloads = cri.max_concurrent_downloads,
                );
                if let Some(unpacks) = cri.max_concurrent_unpacks {
                    text.push_str(&format!("  max_concurrent_unpacks = {unpacks}\n"));
                }
                text
            }
        }
    }
}

/// A proxy snapshotter containerd is told of: its name, socket, the capabilities its
/// config entry lists (`remap-ids`, `rebase`) and the root it exports (CRI's image
/// filesystem).
#[derive(Debug, Clone, Copy)]
pub struct Proxy<'a> {
    pub name: &'a str,
    pub socket: &'a Path,
    pub capabilities: &'a [&'a str],
    pub exports_root: Option<&'a Path>,
    /// containerd passes it the labels remote snapshotters read (2.x's transfer service
    /// `enable_remote_snapshot_annotations` export; CRI's snapshot annotations).
    pub remote_snapshots: bool,
}

impl<'a> Proxy<'a> {
    /// A proxy with no capabilities and no exports.
    pub fn plain(name: &'a str, socket: &'a Path) -> Proxy<'a> {
        Proxy {
            name,
            socket,
            capabilities: &[],
            exports_root: None,
            remote_snapshots: false,
        }
    }
}

/// The CRI plugin's settings, for a containerd run as a Kubernetes node runs it.
#[derive(Debug, Clone, Copy)]
pub struct Cri<'a> {
    /// The snapshotter CRI keeps images and containers in (`lamina`, `overlayfs`).
    pub snapshotter: &'a str,
    /// The pinned sandbox (pause) image, imported before pods run.
    pub sandbox_image: &'a str,
    pub max_concurrent_downloads: u32,
    /// The transfer service's unpack concurrency; `None` keeps containerd's default.
    pub max_concurrent_unpacks: Option<u32>,
}

#[derive(Debug)]
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub release: Release,
    child: Child,
}

impl Containerd {
    /// Starts Debian's containerd under `dir` with `[proxy_plugins.lamina]` at `snapshotter`.
    pub fn start(dir: &Path, snapshotter: &Path) -> Containerd {
        Containerd::start_with(dir, &[("lamina", snapshotter)])
    }

    /// Starts Debian's containerd under `dir` with a proxy snapshotter for each (name, socket).
    pub fn start_with(dir: &Path, proxies: &[(&str, &Path)]) -> Containerd {
        Containerd::start_release(Release::Debian, dir, proxies)
    }

    /// Starts `release` under `dir` with a proxy snapshotter for each (name, socket).
    pub fn start_release(release: Release, dir: &Path, proxies: &[(&str, &Path)]) -> Containerd {
        let proxies: Vec<Proxy<'_>> = proxies
            .iter()
            .map(|(name, socket)| Proxy::plain(name, socket))
            .collect();
        Containerd::start_configured(release, dir, &proxies, None)
    }

    /// Starts `release` under `dir` with `proxies`, and with the CRI plugin as `cri` says
    /// (off when `None`).
    pub fn start_configured(
        release: Release,
        dir: &Path,
        proxies: &[Proxy<'_>],
        cri: Option<&Cri<'_>>,
    ) -> Containerd {
        let containerd = release.program("containerd");
        assert!(
            Command::new(&containerd).arg("--version").output().is_ok(),
            "{} is missing: install Debian's containerd, or build 2.x with scripts/containerd2 (scripts/test does both)",
            containerd.display()
        );
        std::fs::create_dir_all(dir).expect("containerd dir");
        let socket = dir.join("containerd.sock");
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, release.config(dir, &socket, proxies, cri))
            .expect("containerd config");
        let containerd = Containerd {
            dir: dir.to_path_buf(),
            socket,
            release,
            child: spawn(release, dir),
        };
        crate::wait_until("containerd to answer", || {
            containerd.ctr(&["version"]).code == 0
        });
        containerd
    }

    /// Stops containerd (SIGTERM; its shims and containers keep running, as under
    /// systemd's restart) and starts it again on the same config and root.
    pub fn restart(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        self.child = spawn(self.release, &self.dir);
        crate::wait_until("containerd to answer after a restart", || {
            self.ctr(&["version"]).code == 0
        });
    }

    /// containerd's process ID (for its memory, in benchmarks).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `ctr --address <socket>` of this release, to add arguments to.
    pub fn ctr_command(&self) -> Command {
        let mut command = Command::new(self.release.program("ctr"));
        command.arg("--address").arg(&self.socket);
        command
    }

    /// `ctr --address <socket> ARGS...`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        let out = self
            .ctr_command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("running ctr");
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `ctr images import --snapshotter SNAPSHOTTER --base-name NAME ARCHIVE`, asserting
    /// it succeeded.
    pub fn import(&self, snapshotter: &str, name: &str, archive: &Path) {
        self.ctr_ok(&[
            "images",
            "import",
            "--snapshotter",
            snapshotter,
            "--base-name",
            name,
            archive.to_str().expect("utf-8 archive path"),
        ]);
    }

    /// `ctr ARGS...`, asserting it succeeded; its stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert_eq!(out.code, 0, "ctr {args:?}: {out:?}\n{}", self.log_tail());
        out.stdout
    }

    /// Runs containerd's garbage collector to the end, now: a lease made and deleted with
    /// `--sync`. Afterwards no snapshotter is marked for collection until containerd's
    /// metadata changes again, so snapshots made straight on a snapshotter's socket (which
    /// containerd's collector removes, as it does not know them) are safe from it.
    pub fn collect_garbage(&self, namespace: &str) {
        let lease = self.ctr_ok(&["--namespace", namespace, "leases", "create"]);
        let lease = lease.trim();
        assert!(!lease.is_empty(), "ctr leases create printed no lease ID");
        self.ctr_ok(&["--namespace", namespace, "leases", "rm", "--sync", lease]);
    }

    /// The end of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// Starts `release`'s containerd on `dir/config.toml`, its log appended to
/// `dir/containerd.log`.
fn spawn(release: Release, dir: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("containerd.log"))
        .expect("containerd log");
    let mut command = Command::new(release.program("containerd"));
    if let Some(bin) = release.bin_dir() {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![bin];
        dirs.extend(std::env::split_paths(&path));
        command.env("PATH", std::env::join_paths(dirs).expect("PATH"));
    }
    command
        .arg("--config")
        .arg(dir.join("config.toml"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting containerd")
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}
