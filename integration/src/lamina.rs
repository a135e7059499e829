//! Running the `lamina` binary as Garden does: a process per call, stdout parsed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The built `lamina` binary: `target/<profile>/lamina`, beside this test's `deps/`.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LAMINA_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let bin = profile_dir.join("lamina");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace` first (scripts/test does)",
        bin.display()
    );
    bin
}

#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The JSON on stdout, asserting the call succeeded.
    /// This output, after asserting the command succeeded: for a call whose failure
    /// would make the rest of a test prove nothing.
    pub fn ok(self) -> Output {
        assert_eq!(self.code, 0, "lamina failed: {self:?}");
        self
    }

    pub fn json(&self) -> serde_json::Value {
        assert_eq!(self.code, 0, "lamina failed: {self:?}");
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self:?}"))
    }
}

/// A store and the CLI pointed at it.
#[derive(Debug, Clone)]
pub struct Lamina {
    pub store: PathBuf,
}

impl Lamina {
    pub fn new(store: &Path) -> Self {
        Self {
            store: store.to_path_buf(),
        }
    }

    /// Runs `lamina --store <store> ARGS...`.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut full = vec!["--store", self.store.to_str().expect("utf-8 store")];
        full.extend_from_slice(args);
        run_raw(&full)
    }

    /// Runs `lamina --store <store> ARGS...` on a pseudo-terminal (util-linux `script`),
    /// as a person at a shell would; returns its exit code and everything it drew there
    /// (stdout and stderr together, escape sequences included).
    pub fn run_on_terminal(&self, args: &[&str]) -> (i32, String) {
        let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
        let mut line = vec![quote(binary().to_str().expect("utf-8 binary path"))];
        line.push("--store".into());
        line.push(quote(self.store.to_str().expect("utf-8 store")));
        line.extend(args.iter().map(|a| quote(a)));
        let out = Command::new("script")
            .args([
                "--quiet",
                "--return",
                "--command",
                &line.join(" "),
                "/dev/null",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("script (util-linux)");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    pub fn init(store: &Path) -> Self {
        let lamina = Self::new(store);
        let out = lamina.run(&["init-store"]);
        assert_eq!(out.code, 0, "{out:?}");
        lamina
    }

    /// `create IMAGE ID`, returning the rootfs path from the printed JSON.
    pub fn create(&self, image: &str, id: &str) -> PathBuf {
        self.create_with(&[], image, id)
    }

    /// `create FLAGS... IMAGE ID`, returning the rootfs path from the printed JSON.
    pub fn create_with(&self, flags: &[&str], image: &str, id: &str) -> PathBuf {
        let mut args = vec!["create"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[image, id]);
        let spec = self.run(&args).json();
        PathBuf::from(spec["root"]["path"].as_str().expect("root.path"))
    }

    /// `delete ID`, then the promise every strategy keeps: once the reaper is done
    /// (`lamina reap` waits for a background reaper, then finishes what is left), the
    /// container has no mount and no directory left, the trash is empty, and when it was
    /// the last container, nothing of lamina's is mounted under the store but pool slots,
    /// composefs metadata images (one mount per image, released by `clean`) and lazy
    /// layers' objects (served while the daemon runs).
    /// `context` names the case in a failure.
    pub fn delete_and_assert_gone(&self, id: &str, context: &str) {
        let dir = self.store.join("images").join(id);
        let out = self.run(&["delete", id]);
        assert_eq!(out.code, 0, "{context}: delete failed: {out:?}");
        assert!(
            !dir.exists(),
            "{context}: still in images/ after delete returned"
        );
        let reaped = self.run(&["reap"]).json();
        assert_eq!(reaped["failed"], 0, "{context}: reaper failed: {reaped}");
        let trash = self.store.join("trash");
        assert_eq!(self.entries("trash"), 0, "{context}: trash left behind");
        let mounts = crate::scratch::mounts_under(&self.store);
        let last = self.entries("images") == 0;
        let pool = self.store.join("pool");
        let composefs = self.store.join("composefs");
        let lazy = self.store.join("lazy");
        // A background refill builds its slot in tmp/pool-* and then renames it into pool/.
        let refilling = |m: &PathBuf| {
            m.strip_prefix(self.store.join("tmp"))
                .ok()
                .and_then(|rel| rel.components().next())
                .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with("pool-"))
        };
        let leaked: Vec<_> = mounts
            .iter()
            .filter(|m| {
                m.starts_with(&dir)
                    || m.starts_with(&trash)
                    || (last
                        && !m.starts_with(&pool)
                        && !m.starts_with(&composefs)
                        && !m.starts_with(&lazy)
                        && !refilling(m))
            })
            .collect();
        assert!(
            leaked.is_empty(),
            "{context}: mounts left behind: {leaked:?}"
        );
        if last {
            self.wait_loop_devices_released(context);
        }
    }

    /// Waits until no loop device outside the pool is attached to the store's image
    /// files: autoclear detaches one shortly after its filesystem's unmount.
    pub fn wait_loop_devices_released(&self, context: &str) {
        crate::wait_until(&format!("{context}: loop devices released"), || {
            self.loop_devices_outside_pool().is_empty()
        });
    }

    /// Loop devices attached to image files in the store, except ready pool slots'.
    pub fn loop_devices_outside_pool(&self) -> Vec<PathBuf> {
        let pool = self.store.join("pool");
        lamina_sys::loop_backing_files()
            .into_iter()
            .filter(|(_, backing)| backing.starts_with(&self.store) && !backing.starts_with(&pool))
            .map(|(device, _)| device)
            .collect()
    }

    /// How many entries the store's `sub` directory holds (0 if it does not exist).
    pub fn entries(&self, sub: &str) -> usize {
        std::fs::read_dir(self.store.join(sub)).map_or(0, |d| d.count())
    }

    /// [`Lamina::run`], failing the test if the command has not finished within `limit`
    /// (it is killed first): for commands a regression could block for ever.
    pub fn run_within(&self, args: &[&str], limit: std::time::Duration) -> Output {
        let mut child = Command::new(binary())
            .arg("--store")
            .arg(&self.store)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running lamina");
        let deadline = std::time::Instant::now() + limit;
        while child.try_wait().expect("waiting for lamina").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("lamina {args:?} blocked for {limit:?}");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("reading lamina's output");
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// `lamina --store <store> --log-level warn ARGS...` to spawn, with stdin closed:
    /// for tests that run many processes at once or kill them.
    pub fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut command = Command::new(binary());
        command
            .arg("--store")
            .arg(&self.store)
            .args(["--log-level", "warn"])
            .args(args)
            .stdin(std::process::Stdio::null());
        command
    }

    pub fn rootfs(&self, id: &str) -> PathBuf {
        self.store.join("images").join(id).join("rootfs")
    }
}

/// Runs the binary with exactly `args`.
pub fn run_raw(args: &[&str]) -> Output {
    let out = Command::new(binary())
        .args(args)
        .output()
        .expect("running lamina");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Bytes of the regular files under `dir` (0 for what cannot be read): how a test sees an
/// import making progress.
pub fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}
