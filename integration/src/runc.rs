//! A runc bundle around a rootfs lamina made. Dropping it force-deletes the container,
//! so a failed assertion leaves no runc state or mount behind.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug)]
pub struct Bundle {
    dir: tempfile::TempDir,
    ids: std::cell::RefCell<Vec<String>>,
}

/// What a `runc run` printed and returned.
#[derive(Debug)]
pub struct RunOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Bundle {
    /// A bundle whose config.json (from `runc spec`) boots `rootfs`.
    pub fn new(rootfs: &Path, read_only: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lamina-bundle-")
            .tempdir()
            .expect("bundle dir");
        let out = Command::new("runc")
            .arg("spec")
            .current_dir(dir.path())
            .output()
            .expect("runc (install Debian's runc)");
        assert!(
            out.status.success(),
            "runc spec: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bundle = Self {
            dir,
            ids: Default::default(),
        };
        bundle.edit_config(|config| {
            config["root"] = serde_json::json!({ "path": rootfs, "readonly": read_only });
            config["process"]["terminal"] = false.into();
        });
        bundle
    }

    /// Runs the container in a user namespace mapping `size` ids from 0 to `host` (uids
    /// and gids alike), as Garden runs unprivileged containers.
    pub fn in_user_namespace(&self, host: u32, size: u32) {
        self.edit_config(|config| {
            let linux = &mut config["linux"];
            linux["namespaces"]
                .as_array_mut()
                .expect("namespaces")
                .push(serde_json::json!({ "type": "user" }));
            let map = serde_json::json!([{ "containerID": 0, "hostID": host, "size": size }]);
            linux["uidMappings"] = map.clone();
            linux["gidMappings"] = map;
        });
    }

    /// `runc run` with `sh -c SCRIPT` as the container's process.
    pub fn run(&self, id: &str, script: &str) -> RunOutput {
        self.edit_config(|config| {
            config["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
        });
        self.ids.borrow_mut().push(id.to_string());
        let out = Command::new("timeout")
            .args(["60", "runc", "run", "--bundle"])
            .arg(self.dir.path())
            .arg(id)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("runc run");
        RunOutput {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Reads config.json, lets `edit` change it, writes it back.
    fn edit_config(&self, edit: impl FnOnce(&mut serde_json::Value)) {
        let path = self.dir.path().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("config.json")).expect("json");
        edit(&mut config);
        std::fs::write(&path, serde_json::to_vec(&config).expect("json"))
            .expect("writing config.json");
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Bundle {
    fn drop(&mut self) {
        for id in self.ids.borrow().iter() {
            let _ = Command::new("runc")
                .args(["delete", "--force", id])
                .output();
        }
    }
}
