//! 200 lamina processes at once on one store: creates of three images that share their
//! base layer (with several strategies), deletes racing those creates, and cleans racing
//! both. Every process must succeed, every container a create reported must be whole
//! unless a delete took it, and afterwards `check` finds nothing and nothing is mounted.
//!
//! It must pass on a loaded machine every time. Twenty runs in a row beside two
//! CPU-burning processes (issue 21; run as root from the workspace root):
//!
//! ```sh
//! cargo build -p lamina-cli && cargo test -p lamina-integration --test concurrency --no-run
//! for n in 1 2; do (while :; do :; done) & done
//! for run in $(seq 20); do
//!   cargo test -q -p lamina-integration --test concurrency || { echo "run $run failed"; break; }
//! done
//! kill %1 %2
//! ```

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::process::{Child, Stdio};

use lamina_image::{Compression, Platform};
use lamina_integration::scratch::mounts_under;
use lamina_integration::{FsKind, Lamina, ScratchFs, require_root, sample_image};
use lamina_sample::{Layer, LayerBuilder, build_image, write_oci_layout};

const PROCESSES: usize = 200;
const STRATEGIES: [&str; 4] = ["auto", "classic", "metacopy", "shared-ro"];

/// A third image: the sample's busybox base under a top of its own.
fn sibling_image(dir: &std::path::Path) -> String {
    let busybox = std::fs::read(lamina_sample::DEFAULT_BUSYBOX).unwrap();
    let top = LayerBuilder::new()
        .dir("sibling", 0o755)
        .unwrap()
        .file("sibling/name", 0o644, b"sibling\n")
        .unwrap()
        .finish()
        .unwrap();
    let layers = [
        Layer {
            tar: lamina_sample::base_layer(&busybox).unwrap(),
            compression: Compression::Gzip,
        },
        Layer {
            tar: top,
            compression: Compression::Zstd,
        },
    ];
    let image = build_image(&layers, &[], &Platform::host()).unwrap();
    write_oci_layout(dir, &[&image], &[(image.manifest.clone(), Some("sibling"))]).unwrap();
    format!("oci://{}:sibling", dir.display())
}

fn spawn(lamina: &Lamina, args: &[String]) -> Child {
    lamina
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn two_hundred_processes_create_delete_and_clean_at_once() {
    require_root();
    let fs = ScratchFs::loop_backed(FsKind::Ext4, 2048, false);
    let lamina = Lamina::init(&fs.path().join("store"));
    let refs = sample_image(&fs.path().join("sample")).references();
    let images = [
        refs[0].clone(),
        refs[3].clone(),
        sibling_image(&fs.path().join("sibling")),
    ];

    // Process i: every 10th a clean, every 10th (offset 5) a delete of a container a
    // create in the same wave is making, the rest creates.
    let mut plan: Vec<(String, Vec<String>)> = Vec::new();
    for i in 0..PROCESSES {
        let args: Vec<String> = match i % 10 {
            0 => vec!["clean".into(), "--threshold-bytes".into(), "0".into()],
            5 => vec!["delete".into(), format!("c{}", i - 4)],
            _ => {
                let strategy = STRATEGIES[i % STRATEGIES.len()];
                let image = &images[i % images.len()];
                vec![
                    "create".into(),
                    "--strategy".into(),
                    strategy.into(),
                    image.clone(),
                    format!("c{i}"),
                ]
            }
        };
        plan.push((format!("process {i}: {}", args.join(" ")), args));
    }
    let children: Vec<(String, Child)> = plan
        .into_iter()
        .map(|(what, args)| (what, spawn(&lamina, &args)))
        .collect();
    let mut failures = Vec::new();
    for (what, child) in children {
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            failures.push(format!(
                "{what}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // Creates nobody raced with a delete are whole.
    for i in (0..PROCESSES).filter(|i| i % 10 != 0 && i % 10 != 5 && i % 10 != 1) {
        let rootfs = lamina.rootfs(&format!("c{i}"));
        assert!(rootfs.join("bin/busybox").exists(), "c{i} incomplete");
    }
    let check = lamina.run(&["check"]);
    assert_eq!(check.code, 0, "after the wave: {check:?}");

    // Tear down the same way, all at once, then nothing may be left.
    let ids: Vec<String> = std::fs::read_dir(lamina.store.join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let deletes: Vec<Child> = ids
        .iter()
        .map(|id| spawn(&lamina, &["delete".into(), id.clone()]))
        .collect();
    for child in deletes {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let report = lamina.run(&["clean"]).json();
    assert_eq!(report["reap_failed"], 0, "{report}");
    let check = lamina.run(&["check"]);
    assert_eq!(check.code, 0, "after teardown: {check:?}");
    assert_eq!(lamina.entries("images"), 0);
    assert_eq!(lamina.entries("layers"), 0, "{report}");
    assert!(mounts_under(&lamina.store).is_empty());
}

/// Starts `create --strategy STRATEGY IMAGE racing` held for 2 s at pause point `point`,
/// and returns once it is there, with the marker file the pause wrote.
fn paused_create(
    lamina: &Lamina,
    strategy: &str,
    image: &str,
    point: &str,
) -> (Child, std::path::PathBuf) {
    paused(
        lamina,
        &["create", "--strategy", strategy, image, "racing"],
        point,
    )
}

/// Starts `lamina ARGS` held for 2 s at pause point `point`, and returns once it is there,
/// with the marker file the pause wrote.
fn paused(lamina: &Lamina, args: &[&str], point: &str) -> (Child, std::path::PathBuf) {
    let child = lamina
        .command(args)
        .env("LAMINA_PAUSE_AT", point)
        .env("LAMINA_PAUSE_SECS", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let paused = lamina
        .store
        .join(format!("run/paused-{point}.{}", child.id()));
    lamina_integration::wait_until("the process to reach its pause point", || paused.exists());
    (child, paused)
}

/// Starts `lamina reap --linger-ms LINGER_MS` and returns once it is at work (holding
/// `locks/reaping.lock`).
fn lingering_reaper(lamina: &Lamina, linger_ms: &str) -> Child {
    let reaper = lamina
        .command(&["reap", "--linger-ms", linger_ms])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let reaping = lamina.store.join("locks/reaping.lock");
    lamina_integration::wait_until("the reaper to be at work", || {
        std::process::Command::new("flock")
            .args(["--nonblock", "--conflict-exit-code", "9"])
            .arg(&reaping)
            .arg("true")
            .status()
            .unwrap()
            .code()
            == Some(9)
    });
    reaper
}

/// Garden deletes a container whose create timed out: the delete arrives while the create
/// imports its layers (nothing of the container exists yet), or while it holds a mounted,
/// unrecorded rootfs (held at either point for 2 s by a pause point). The delete waits for
/// the create, then deletes; neither fails (before: "not found" and a container that
/// appeared after it, EBUSY on the delete, or ENOENT on the create's record), and nothing
/// is left, not even the ID's lock file.
#[test]
fn a_delete_racing_its_create_waits_for_it_then_deletes() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    let cases = [
        ("classic", "create-imported"),
        ("classic", "create-provided"),
        ("shared-ro", "create-provided"),
        ("deferred", "create-provided"),
    ];
    for (strategy, point) in cases {
        let (create, paused) = paused_create(&lamina, strategy, &image, point);
        let delete = lamina.command(&["delete", "racing"]).output().unwrap();
        let create = create.wait_with_output().unwrap();
        assert!(create.status.success(), "{strategy}: create {create:?}");
        assert!(delete.status.success(), "{strategy}: delete {delete:?}");
        let out = String::from_utf8_lossy(&delete.stdout);
        assert!(
            out.contains("deleted container"),
            "{strategy} at {point}: {out}"
        );
        assert!(!lamina.store.join("images/racing").exists(), "{strategy}");
        assert!(
            !lamina.store.join("locks/id-racing.lock").exists(),
            "{strategy}"
        );
        assert_eq!(lamina.run(&["reap"]).code, 0);
        assert!(
            mounts_under(&lamina.store.join("images")).is_empty(),
            "{strategy}"
        );
        let check = lamina.run(&["check"]);
        assert_eq!(check.code, 0, "{strategy}: {check:?}");
        std::fs::remove_file(&paused).unwrap();
    }
}

/// `unmount` (and `mount`) of an ID whose create is still in flight waits for the create,
/// then acts on the finished container (before: "container does not exist", its record
/// not yet written).
#[test]
fn an_unmount_racing_its_create_waits_for_it() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    let (create, _paused) = paused_create(&lamina, "classic", &image, "create-provided");
    let unmount = lamina.command(&["unmount", "racing"]).output().unwrap();
    let create = create.wait_with_output().unwrap();
    assert!(create.status.success(), "create {create:?}");
    assert!(unmount.status.success(), "unmount {unmount:?}");
    assert!(mounts_under(&lamina.store.join("images")).is_empty());
    assert_eq!(lamina.run(&["mount", "racing"]).code, 0);
    lamina.delete_and_assert_gone("racing", "after mount");
    assert!(!lamina.store.join("locks/id-racing.lock").exists());
}

/// A deferred delete that finds a reaper running starts none and leaves its container to
/// it, even when that reaper has already found `trash/` empty and is about to exit (held
/// there for 2 s by a pause point): the reaper looks once more after letting go of its
/// lock, takes it back, and reaps the container itself.
#[test]
fn a_delete_finding_a_reaper_about_to_exit_is_reaped_by_it() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    lamina.run(&["create", "--strategy", "deferred", &image, "late"]);
    let (reaper, paused) = paused(&lamina, &["reap"], "reaper-letting-go");
    let delete = lamina.run(&["delete", "late"]);
    assert!(delete.stdout.contains("deleted container"), "{delete:?}");
    assert_eq!(
        std::fs::read_dir(lamina.store.join("trash"))
            .unwrap()
            .count(),
        1,
        "the container waits in trash for the paused reaper"
    );
    let reaper = reaper.wait_with_output().unwrap();
    assert!(reaper.status.success(), "{reaper:?}");
    let reaped: serde_json::Value = serde_json::from_slice(&reaper.stdout).unwrap();
    assert_eq!(
        reaped["removed"], 1,
        "the paused reaper reaped it: {reaped}"
    );
    assert_eq!(
        std::fs::read_dir(lamina.store.join("trash"))
            .unwrap()
            .count(),
        0
    );
    assert!(mounts_under(&lamina.store.join("trash")).is_empty());
    std::fs::remove_file(&paused).unwrap();
    assert_eq!(lamina.run(&["check"]).code, 0);
}

/// A reaper lingering after it emptied `trash/` reaps the deletes that come meanwhile, and
/// those deletes start no reaper of their own (a process start each saved).
#[test]
fn deletes_while_a_reaper_lingers_start_none_and_it_reaps_them() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    let ids = ["d0", "d1", "d2", "d3"];
    for id in ids {
        lamina.run(&["create", "--strategy", "deferred", &image, id]);
    }
    let reaper = lingering_reaper(&lamina, "3000");
    let log = fs.path().join("deletes.log");
    let log_arg = log.display().to_string();
    for id in ids {
        let delete = lamina.run(&["--log-level", "debug", "--log-file", &log_arg, "delete", id]);
        assert!(delete.stdout.contains("deleted container"), "{delete:?}");
        lamina_integration::wait_until("the lingering reaper to reap it", || {
            std::fs::read_dir(lamina.store.join("trash"))
                .unwrap()
                .count()
                == 0
        });
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        !logged.contains("started background work"),
        "a delete started a reaper beside the lingering one: {logged}"
    );
    let reaper = reaper.wait_with_output().unwrap();
    let reaped: serde_json::Value = serde_json::from_slice(&reaper.stdout).unwrap();
    assert_eq!(reaped["removed"], ids.len(), "{reaped}");
    assert!(mounts_under(&lamina.store.join("trash")).is_empty());
}

/// A lingering reaper that finds a deferred delete's container still held by that delete
/// (held 1 s by a pause point just after the rename into `trash/`) comes back for it: the
/// delete, finding the reaper running, starts none, and the container is still torn down.
#[test]
fn a_container_held_when_the_lingering_reaper_looked_is_reaped_once_let_go() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    lamina.run(&["create", "--strategy", "deferred", &image, "held"]);
    let reaper = lingering_reaper(&lamina, "4000");
    let log = fs.path().join("delete.log");
    let delete = std::process::Command::new(lamina_integration::lamina::binary())
        .arg("--store")
        .arg(&lamina.store)
        .args(["--log-level", "debug", "--log-file"])
        .arg(&log)
        .args(["delete", "held"])
        .env("LAMINA_PAUSE_AT", "delete-trashed")
        .env("LAMINA_PAUSE_SECS", "1")
        .output()
        .unwrap();
    assert!(delete.status.success(), "{delete:?}");
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap()
            .contains("started background work"),
        "the delete found the reaper running"
    );
    let reaper = reaper.wait_with_output().unwrap();
    let reaped: serde_json::Value = serde_json::from_slice(&reaper.stdout).unwrap();
    assert_eq!(reaped["removed"], 1, "{reaped}");
    assert_eq!(
        std::fs::read_dir(lamina.store.join("trash"))
            .unwrap()
            .count(),
        0
    );
    assert!(mounts_under(&lamina.store.join("trash")).is_empty());
}
