//! A real containerd (Debian's package) of the test's own: its config, root, state and
//! socket all under one directory, lamina registered as a proxy snapshotter, the CRI
//! plugin off. Stopped (SIGTERM) on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::Output;

#[derive(Debug)]
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    child: Child,
}

impl Containerd {
    /// Starts containerd under `dir` with `[proxy_plugins.lamina]` at `snapshotter`.
    pub fn start(dir: &Path, snapshotter: &Path) -> Containerd {
        Containerd::start_with(dir, &[("lamina", snapshotter)])
    }

    /// Starts containerd under `dir` with a proxy snapshotter for each (name, socket).
    pub fn start_with(dir: &Path, proxies: &[(&str, &Path)]) -> Containerd {
        assert!(
            Command::new("containerd").arg("--version").output().is_ok(),
            "containerd is missing: install Debian's containerd (scripts/test does)"
        );
        std::fs::create_dir_all(dir).expect("containerd dir");
        let socket = dir.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[proxy_plugins]
{proxies}"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            socket = socket.display(),
            proxies = proxies
                .iter()
                .map(|(name, address)| format!(
                    "  [proxy_plugins.{name}]\n    type = \"snapshot\"\n    address = \"{}\"\n",
                    address.display()
                ))
                .collect::<String>(),
        );
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config).expect("containerd config");
        let log = std::fs::File::create(dir.join("containerd.log")).expect("containerd log");
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let containerd = Containerd {
            dir: dir.to_path_buf(),
            socket,
            child,
        };
        crate::wait_until("containerd to answer", || {
            containerd.ctr(&["version"]).code == 0
        });
        containerd
    }

    /// containerd's process ID (for its memory, in benchmarks).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `ctr --address <socket> ARGS...`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
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

    /// `ctr ARGS...`, asserting it succeeded; its stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert_eq!(out.code, 0, "ctr {args:?}: {out:?}\n{}", self.log_tail());
        out.stdout
    }

    /// The end of containerd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}
