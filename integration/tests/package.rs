//! The Debian package (scripts/package), built from this build's binaries: installed with
//! dpkg, its unit checked by systemd-analyze, its daemon started as the unit starts it
//! (`Type=notify`: READY=1 once the snapshotter socket accepts) and running a container
//! for containerd (`ctr run`), stopped and started again
//! with the store's mounts intact, and purged with nothing of it left.
//!
//! It installs into the host's /usr, /lib and /etc, so it refuses to run where a lamina
//! package is already installed rather than replace and then purge it.

#![allow(clippy::unwrap_used)]

use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lamina_integration::containerd::Containerd;
use lamina_integration::scratch::mounts_under;
use lamina_integration::{ScratchFs, require_root, sample_image};

const UNIT: &str = "/lib/systemd/system/lamina.service";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds integration/")
        .to_path_buf()
}

fn run(program: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "lamina"])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("ok installed"))
}

/// Purges the package on drop, so a failing test leaves the host as it found it.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "lamina"]).status();
    }
}

/// The daemon as the unit runs it, with `NOTIFY_SOCKET` at a socket this test reads.
struct Service {
    child: Child,
    notify: UnixDatagram,
}

impl Service {
    /// The unit's `ExecStart`, on `store` and `socket` instead of the host's (flags win
    /// over the packaged config).
    fn start(dir: &Path, store: &Path, socket: &Path) -> Service {
        let unit = std::fs::read_to_string(UNIT).expect("the installed unit");
        assert!(unit.lines().any(|l| l == "Type=notify"), "{unit}");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart");
        let argv: Vec<&str> = exec.split_whitespace().collect();
        let notify_path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&notify_path);
        let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
        notify
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let log = std::fs::File::create(dir.join("service.log")).unwrap();
        let child = Command::new(argv[0])
            .args(&argv[1..])
            .arg("--store")
            .arg(store)
            .arg("--containerd-socket")
            .arg(socket)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting the service's command");
        Service { child, notify }
    }

    /// The next state the daemon tells its manager, e.g. `READY=1`.
    fn told(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .notify
            .recv(&mut buf)
            .expect("the daemon tells the service manager its state within 60 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// SIGTERM, as `systemctl stop` sends; the daemon says STOPPING=1 and exits 0.
    fn stop(mut self) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .expect("SIGTERM");
        assert!(self.told().contains("STOPPING=1"));
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not exit on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the daemon exited with {status}");
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lamina(store: &Path, args: &[&str]) -> String {
    let out = run(
        "/usr/bin/lamina",
        &[&["--store", store.to_str().unwrap()], args].concat(),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn package_installs_runs_as_its_unit_and_purges_clean() {
    require_root();
    assert!(
        !installed(),
        "a lamina package is installed on this machine; this test installs and purges its own, so it will not run here (if a killed run of this test left it, `dpkg --purge lamina`)"
    );
    let fs = ScratchFs::ext4(512);
    let profile = lamina_integration::lamina::binary()
        .parent()
        .unwrap()
        .to_path_buf();
    let out_dir = fs.path().join("deb");
    let built = run(
        workspace().join("scripts/package").to_str().unwrap(),
        &[
            "--bin-dir",
            profile.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
            // The debug binaries are large and xz slow; what is packed is the same.
            "--compression",
            "none",
        ],
    );
    let deb = String::from_utf8_lossy(&built.stdout).trim().to_string();
    let listing = String::from_utf8_lossy(&run("dpkg-deb", &["-c", &deb]).stdout).into_owned();
    let files: Vec<PathBuf> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| PathBuf::from(p.trim_start_matches('.')))
        .collect();
    for expected in [
        "/usr/bin/lamina",
        "/usr/bin/lamina-daemon",
        UNIT,
        "/etc/lamina/config.yaml",
        "/usr/share/man/man1/lamina.1.gz",
        "/usr/share/man/man1/lamina-create.1.gz",
        "/usr/share/bash-completion/completions/lamina",
        "/usr/share/doc/lamina/containerd/config-1.x.toml",
        "/usr/share/doc/lamina/containerd/config-2.x.toml",
    ] {
        assert!(
            files.contains(&PathBuf::from(expected)),
            "{expected} in {listing}"
        );
    }

    // Nothing of an operator's own lamina may be in the way: dpkg would overwrite it, take
    // its config as the package's, and the purge would then remove it.
    for path in files.iter().map(PathBuf::as_path).chain([
        Path::new("/etc/lamina"),
        Path::new("/etc/systemd/system/lamina.service"),
    ]) {
        assert!(
            !path.exists(),
            "{} exists: this test installs and purges a lamina package, and will not run over a lamina installed by other means",
            path.display()
        );
    }
    let guard = Installed;
    run("dpkg", &["-i", &deb]);
    // Again: the maintainer scripts' upgrade path (prerm upgrade, postinst configure OLD).
    run("dpkg", &["-i", &deb]);
    run("systemd-analyze", &["verify", UNIT]);
    let version =
        String::from_utf8_lossy(&run("/usr/bin/lamina", &["--version"]).stdout).into_owned();
    assert!(version.starts_with("lamina 0."), "{version}");
    // containerd reads the packaged snippet for its version (1.6 here) with lamina in it.
    let dump = run(
        "containerd",
        &[
            "--config",
            "/usr/share/doc/lamina/containerd/config-1.x.toml",
            "config",
            "dump",
        ],
    );
    assert!(
        String::from_utf8_lossy(&dump.stdout).contains("[proxy_plugins.lamina]"),
        "containerd does not read the packaged snippet"
    );
    let v2 = std::fs::read_to_string("/usr/share/doc/lamina/containerd/config-2.x.toml").unwrap();
    assert!(
        v2.contains("platform = \"linux/") && !v2.contains('@'),
        "the 2.x snippet names this machine's platform: {v2}"
    );
    // And containerd 2.4 reads the 2.x one, capabilities and parallel unpack included.
    let containerd2 = std::env::var(lamina_integration::containerd::CONTAINERD2_ENV)
        .map(|dir| Path::new(&dir).join("containerd"))
        .expect("LAMINA_CONTAINERD2_BIN (scripts/test exports it)");
    let dump = run(
        containerd2.to_str().unwrap(),
        &[
            "--config",
            "/usr/share/doc/lamina/containerd/config-2.x.toml",
            "config",
            "dump",
        ],
    );
    let dump = String::from_utf8_lossy(&dump.stdout);
    for expected in [
        "[proxy_plugins.lamina]",
        "capabilities = ['remap-ids', 'rebase']",
        "max_concurrent_unpacks = 4",
        "snapshotter = 'lamina'",
    ] {
        assert!(
            dump.contains(expected),
            "containerd 2.4 reads no {expected}: {dump}"
        );
    }

    let store = fs.path().join("store");
    let socket = fs.path().join("run/snapshotter.sock");
    let service = Service::start(fs.path(), &store, &socket);
    assert_eq!(service.told().trim(), "READY=1");
    UnixStream::connect(&socket).expect("the socket accepts once READY=1 is sent");

    // A container the per-call binary makes while the service runs.
    let image = sample_image(&fs.path().join("image"));
    let [oci, ..] = image.references();
    lamina(&store, &["create", "--strategy", "classic", &oci, "kept"]);
    let rootfs = store.join("images/kept/rootfs");
    let mounted = || mounts_under(&store).contains(&rootfs);
    assert!(mounted());

    // containerd with lamina as its proxy snapshotter, as the packaged snippet registers
    // it, runs a container on the service.
    {
        let ctd = Containerd::start(&fs.path().join("containerd"), &socket);
        ctd.import("lamina", "docker.io/lamina/sample", &image.oci_archive);
        let out = ctd.ctr_ok(&[
            "run",
            "--rm",
            "--snapshotter",
            "lamina",
            "docker.io/lamina/sample:latest",
            "package-test",
            "sh",
            "-c",
            "echo hi from the package",
        ]);
        assert_eq!(out, "hi from the package\n");
        ctd.ctr_ok(&["images", "rm", "--sync", "docker.io/lamina/sample:latest"]);
    }

    service.stop();
    assert!(mounted(), "a stopped service keeps the store's mounts");
    let service = Service::start(fs.path(), &store, &socket);
    assert_eq!(service.told().trim(), "READY=1");
    assert!(mounted(), "a restarted service keeps the store's mounts");
    assert!(rootfs.join("bin/busybox").exists());
    service.stop();

    lamina(&store, &["delete-store"]);
    assert!(mounts_under(&store).is_empty());
    run("dpkg", &["--purge", "lamina"]);
    std::mem::forget(guard);
    assert!(!installed());
    for file in &files {
        assert!(!file.exists(), "{} is left after purge", file.display());
    }
    assert!(
        !Path::new("/etc/lamina").exists(),
        "/etc/lamina is left after purge"
    );
}
