//! The real containerd running containers on lamina as its proxy snapshotter —
//! Debian's 1.6, and for the lifecycle also the 2.4 scripts/containerd2 builds (with its
//! runc 1.5): `ctr images import` and `ctr run --snapshotter lamina`, two containers at
//! once, the snapshotter killed and restarted while a container runs, and everything
//! removed with nothing left mounted.

// A test that cannot set up must stop loudly.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::process::Stdio;

use lamina_integration::containerd::{Containerd, Release};
use lamina_integration::proof::{EXPECTED as MERGED, SCRIPT as PROOF};
use lamina_integration::scratch::mounts_under;
use lamina_integration::snapshotter::Daemon;
use lamina_integration::{ScratchFs, require_root, sample_image, wait_until};

const IMAGE: &str = "docker.io/lamina/sample:latest";

/// Entries in `dir`, but for the mark of the store's one-time composefs repair
/// (`composefs/snapshot-objects-copied`), which stays for the store's life.
fn entries(dir: &std::path::Path) -> usize {
    fs::read_dir(dir)
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .map_or(true, |e| e.file_name() != "snapshot-objects-copied")
            })
            .count()
        })
        .unwrap_or(0)
}

/// A `ctr run --rm --snapshotter lamina IMAGE ID sh -c SCRIPT` whose script's output is
/// written to a file on a host directory bound into the container, and read from there:
/// ctr's own copy of a short-lived task's stdout lost all but its first line once (a
/// known containerd race), which no assertion on lamina should depend on. IDs must be
/// unique across the tests of this file: they run at once, each with a containerd of its
/// own, but every containerd's runc keeps its state in `/run/containerd/runc/default`, so
/// two `proof` containers at once collided ("container with given ID already exists").
struct CtrRun {
    out: tempfile::TempDir,
    args: Vec<String>,
}

impl CtrRun {
    fn new(image: &str, id: &str, script: &str) -> CtrRun {
        let out = tempfile::Builder::new()
            .prefix("lamina-ctr-out-")
            .tempdir()
            .unwrap();
        let args = [
            "run",
            "--rm",
            "--snapshotter",
            "lamina",
            "--mount",
            &format!(
                "type=bind,src={},dst=/lamina-out,options=rbind:rw",
                out.path().display()
            ),
            image,
            id,
            "sh",
            "-c",
            &format!("{{ {script}\n}} > /lamina-out/stdout"),
        ]
        .map(str::to_string)
        .to_vec();
        CtrRun { out, args }
    }

    /// What the script printed.
    fn stdout(&self) -> String {
        std::fs::read_to_string(self.out.path().join("stdout")).unwrap_or_default()
    }
}

/// Runs `script` in `image` as container `id`; what it printed.
fn run_image(ctd: &Containerd, image: &str, id: &str, script: &str) -> String {
    let run = CtrRun::new(image, id, script);
    let args: Vec<&str> = run.args.iter().map(String::as_str).collect();
    ctd.ctr_ok(&args);
    run.stdout()
}

/// [`run_image`] of the sample image.
fn run_on_lamina(ctd: &Containerd, id: &str, script: &str) -> String {
    run_image(ctd, IMAGE, id, script)
}

/// `ctr images import --snapshotter lamina --base-name NAME ARCHIVE`.
fn import(ctd: &Containerd, name: &str, archive: &std::path::Path) {
    ctd.import("lamina", name, archive);
}

#[test]
fn containerd_1_6_runs_containers_on_lamina_through_a_restart_and_leaves_nothing() {
    containers_through_a_restart(Release::Debian);
}

#[test]
fn containerd_2_4_runs_containers_on_lamina_through_a_restart_and_leaves_nothing() {
    containers_through_a_restart(Release::V2);
}

fn containers_through_a_restart(release: Release) {
    require_root();
    // Dropped last to first: containerd, the snapshotter, then the filesystem.
    let fs = ScratchFs::ext4(1024);
    let files = sample_image(&fs.path().join("image"));
    let store = fs.path().join("store");
    let mut daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
    let ctd = Containerd::start_release(
        release,
        &fs.path().join("containerd"),
        &[("lamina", daemon.socket.as_path())],
    );
    // runc's state of every containerd here is in one place: IDs differ by release.
    let id = |name: &str| format!("{}-{name}", release.name());

    import(&ctd, "docker.io/lamina/sample", &files.oci_archive);
    // Each image layer was committed into the store as a lamina layer, named by chain ID.
    assert_eq!(entries(&store.join("layers")), 2, "{}", daemon.log());
    let snapshots = ctd.ctr_ok(&["snapshots", "--snapshotter", "lamina", "ls"]);
    assert_eq!(snapshots.matches("Committed").count(), 2, "{snapshots}");

    // The merged image: top-layer files, whiteouts and opaque dirs honoured.
    let out = run_on_lamina(&ctd, &id("proof"), PROOF);
    assert_eq!(out, MERGED);

    // Two containers at once, each seeing only its own writes.
    let names = [id("left"), id("right")];
    let runs: Vec<_> = names
        .iter()
        .map(|id| {
            let script =
                format!("echo {id} > /mine; sleep 1; cat /mine; test ! -e /theirs && echo alone");
            let run = CtrRun::new(IMAGE, id, &script);
            let child = ctd
                .ctr_command()
                .args(&run.args)
                .stdin(Stdio::null())
                .output()
                .expect("ctr run");
            (run, child)
        })
        .collect();
    for (id, (run, out)) in names.iter().zip(runs) {
        assert!(out.status.success(), "{id}: {out:?}");
        assert_eq!(run.stdout(), format!("{id}\nalone\n"), "{id}");
    }

    // A running container survives the snapshotter being killed and restarted, and is
    // torn down through the new one.
    let long = id("long");
    ctd.ctr_ok(&[
        "run",
        "-d",
        "--snapshotter",
        "lamina",
        IMAGE,
        &long,
        "sh",
        "-c",
        "echo before > /marker; sleep 300",
    ]);
    daemon.crash_and_restart();
    // containerd redials the snapshotter within its gRPC backoff (a second or so); until
    // then its calls fail as `unavailable`, which kubelet and ctr users retry.
    wait_until("containerd to reconnect to the snapshotter", || {
        ctd.ctr(&["snapshots", "--snapshotter", "lamina", "ls"])
            .code
            == 0
    });
    let out = ctd.ctr_ok(&[
        "task",
        "exec",
        "--exec-id",
        "check",
        &long,
        "cat",
        "/marker",
    ]);
    assert_eq!(out, "before\n");
    ctd.ctr_ok(&["task", "kill", "--signal", "SIGKILL", &long]);
    wait_until("the long container to stop", || {
        ctd.ctr(&["task", "delete", &long]).code == 0
    });
    ctd.ctr_ok(&["containers", "delete", &long]);
    let out = run_on_lamina(&ctd, &id("after"), PROOF);
    assert_eq!(out, MERGED, "containers run after the restart");

    // Removing the image lets containerd's GC remove every snapshot; its Cleanup call
    // collects the layers, and the reaper has torn down every container.
    ctd.ctr_ok(&["images", "rm", "--sync", IMAGE]);
    wait_until("containerd to remove every snapshot", || {
        ctd.ctr_ok(&["snapshots", "--snapshotter", "lamina", "ls"])
            .lines()
            .count()
            <= 1
    });
    wait_until("lamina to remove every container and layer", || {
        entries(&store.join("images")) == 0
            && entries(&store.join("trash")) == 0
            && entries(&store.join("layers")) == 0
    });
    let leaked = mounts_under(&store);
    assert!(leaked.is_empty(), "mounts left: {leaked:?}");
    drop(ctd);
    drop(daemon);
}

/// The composefs metadata images in `store`.
fn metadata_images(store: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(store.join("composefs"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".erofs"))
                .collect()
        })
        .unwrap_or_default()
}

/// Images deeper than one page of mount options used to fail under containerd ("mount
/// options is too long" past ~50 layers): `Mounts` now names each layer by its short link
/// in `l/`, which containerd mounts from inside that directory. 128 and 300 layers run;
/// every layer's file is there. Then, as `auto` does for deep chains, through the
/// composefs metadata image built meanwhile: one lower.
#[test]
fn ctr_runs_images_of_128_and_300_layers_on_lamina() {
    require_root();
    let fs = ScratchFs::ext4(2048);
    let store = fs.path().join("store");
    let daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
    let ctd = Containerd::start(&fs.path().join("containerd"), &daemon.socket);
    for depth in [128, 300] {
        let files = lamina_integration::deep_image(&fs.path().join(format!("deep{depth}")), depth);
        let name = format!("docker.io/lamina/deep{depth}");
        import(&ctd, &name, &files.oci_archive);
        let image = format!("{name}:latest");
        let id = format!("deep{depth}");
        let before = metadata_images(&store);
        let out = run_image(
            &ctd,
            &image,
            &id,
            "ls /deep | wc -l; cat /deep/1 /deep/$(ls /deep | sort -n | tail -1)",
        );
        let last = depth - 1;
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            [last.to_string(), "1".into(), last.to_string()],
            "{depth} layers: {out}\n{}",
            daemon.log()
        );
        // auto served that container from the layers and built the chain's composefs
        // metadata image on a thread of its own: the next container mounts it as the
        // one lower.
        wait_until("the chain's composefs metadata image", || {
            metadata_images(&store).difference(&before).count() == 1
        });
        let out = run_image(
            &ctd,
            &image,
            &id,
            "ls /deep | wc -l; grep -o 'lowerdir[^,]*' /proc/self/mountinfo | head -1",
        );
        assert!(
            out.starts_with(&format!("{last}\n")) && out.contains(".mnt/rootfs"),
            "{depth} layers through composefs: {out}\n{}",
            daemon.log()
        );
        ctd.ctr_ok(&["images", "rm", "--sync", &image]);
    }
    drop(ctd);
    drop(daemon);
}

/// lamina's composefs strategy under containerd: the daemon's default for container
/// snapshots. An unpack commits classic layers; a container snapshot on them is one
/// composefs overlay (its metadata image built from the committed chain), which lamina
/// mounts and answers as a bind. runc boots the merged image, a 300-layer image runs with
/// one lower, and removing the images lets `clean`'s collection take images and objects.
#[test]
fn ctr_runs_containers_on_composefs_snapshots() {
    require_root();
    let fs = ScratchFs::ext4(2048);
    let files = sample_image(&fs.path().join("image"));
    let store = fs.path().join("store");
    let daemon = Daemon::start(
        &store,
        &fs.path().join("lamina.sock"),
        &["--snapshot-strategy", "composefs"],
    );
    let ctd = Containerd::start(&fs.path().join("containerd"), &daemon.socket);
    import(&ctd, "docker.io/lamina/sample", &files.oci_archive);
    let out = run_on_lamina(&ctd, "proof-composefs", PROOF);
    assert_eq!(out, MERGED, "{}", daemon.log());
    assert_eq!(
        entries(&store.join("composefs")),
        3,
        "an image, its digest and its mount"
    );

    let deep = lamina_integration::deep_image(&fs.path().join("deep"), 300);
    import(&ctd, "docker.io/lamina/deep", &deep.oci_archive);
    let out = ctd.ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "lamina",
        "docker.io/lamina/deep:latest",
        "deep",
        "sh",
        "-c",
        "ls /deep | wc -l; grep -o 'lowerdir[^,]*' /proc/self/mountinfo | head -1",
    ]);
    assert!(out.starts_with("299\n"), "{out}\n{}", daemon.log());

    for image in [IMAGE, "docker.io/lamina/deep:latest"] {
        ctd.ctr_ok(&["images", "rm", "--sync", image]);
    }
    wait_until(
        "lamina to remove every container, layer and composefs image",
        || {
            entries(&store.join("images")) == 0
                && entries(&store.join("trash")) == 0
                && entries(&store.join("layers")) == 0
                && entries(&store.join("composefs")) == 0
        },
    );
    let leaked = mounts_under(&store);
    assert!(leaked.is_empty(), "mounts left: {leaked:?}");
    drop(ctd);
    drop(daemon);
}
