//! `lamina check`: every kind of breakage it knows, made for real in a real store, found
//! by `check` (exit 1, one JSON line), fixed by `check --repair`, and gone afterwards,
//! with the live container untouched.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::process::Command;

use lamina_integration::scratch::mounts_under;
use lamina_integration::{Lamina, ScratchFs, require_root, sample_image};

fn kinds(report: &serde_json::Value) -> BTreeSet<String> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap().to_string())
        .collect()
}

/// The JSON report `check` prints, whatever its exit code.
fn report_of(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.trim()).unwrap()
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Detaches a loop device the test attached, even when an assertion fails first (the
/// repair under test normally has detached it already; then the device may be someone
/// else's, so only one still backed by our file is touched).
struct Detach(String, std::path::PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        let ours = lamina_sys::loop_backing_files()
            .iter()
            .any(|(dev, backing)| dev.to_string_lossy() == self.0 && *backing == self.1);
        if ours {
            let _ = Command::new("losetup").args(["-d", &self.0]).output();
        }
    }
}

#[test]
fn check_finds_and_repairs_every_kind_of_breakage() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let lamina = Lamina::init(&fs.path().join("store"));
    let store = &lamina.store;
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    let rootfs = lamina.create(&image, "live");

    let clean = lamina.run(&["check"]);
    assert_eq!(clean.code, 0, "{clean:?}");
    assert_eq!(report_of(&clean.stdout)["ok"], true);

    // What crashes and host restarts leave behind.
    fs::create_dir_all(store.join("tmp/layer-0000dead/diff/etc")).unwrap();
    fs::create_dir_all(store.join("images/crashed/rootfs")).unwrap();
    let bogus = store.join("layers").join("ab".repeat(32));
    fs::create_dir_all(bogus.join("diff")).unwrap();
    let orphan = store.join("run/orphan");
    fs::create_dir_all(&orphan).unwrap();
    run("mount", &["-t", "tmpfs", "tmpfs", orphan.to_str().unwrap()]);
    let leak = store.join("run/leak.img");
    fs::write(&leak, vec![0u8; 1 << 20]).unwrap();
    let device = run("losetup", &["--find", "--show", leak.to_str().unwrap()]);
    let _detach = Detach(device.clone(), leak.clone());
    run("umount", &[rootfs.to_str().unwrap()]);

    let found = lamina.run(&["check"]);
    assert_eq!(found.code, 1, "{found:?}");
    assert_eq!(found.stdout.lines().count(), 1);
    let report = report_of(&found.stdout);
    assert_eq!(report["ok"], false);
    let expected: BTreeSet<String> = [
        "tmp_abandoned",
        "crashed_create",
        "bad_layer",
        "orphan_mount",
        "leaked_loop_device",
        "rootfs_not_mounted",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(kinds(&report), expected, "{report}");
    assert!(
        store.join("tmp/layer-0000dead").exists(),
        "check alone changes nothing"
    );

    let repaired = lamina.run(&["check", "--repair"]);
    assert_eq!(repaired.code, 0, "{repaired:?}");
    let report = report_of(&repaired.stdout);
    assert!(
        report["problems"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["repaired"] == true),
        "{report}"
    );
    assert!(!store.join("tmp/layer-0000dead").exists());
    assert!(!store.join("images/crashed").exists());
    assert!(!bogus.exists());
    assert!(!mounts_under(store).contains(&orphan));
    let attached = run("losetup", &["--list", "--noheadings", "--output", "NAME"]);
    assert!(!attached.lines().any(|l| l.trim() == device), "{attached}");
    assert!(rootfs.join("bin/busybox").exists(), "rootfs remounted");

    let after = lamina.run(&["check"]);
    assert_eq!(after.code, 0, "{after:?}");
    assert_eq!(
        report_of(&after.stdout)["problems"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    lamina.delete_and_assert_gone("live", "check");
}

#[test]
fn a_missing_layer_is_reported_and_cannot_be_repaired() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    lamina
        .run(&["create", "--without-mount", &image, "orphaned"])
        .ok();
    let layers: Vec<_> = fs::read_dir(lamina.store.join("layers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    fs::remove_dir_all(&layers[0]).unwrap();

    let out = lamina.run(&["check", "--repair"]);
    assert_eq!(out.code, 1, "{out:?}");
    let report = report_of(&out.stdout);
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{report}");
    assert_eq!(problems[0]["kind"], "missing_layer");
    assert_eq!(problems[0]["repaired"], false);
    assert!(
        problems[0]["detail"]
            .as_str()
            .unwrap()
            .contains("container `orphaned`"),
        "{report}"
    );
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("could not be repaired")
    );
}

/// One file that is not what lamina keeps there (a FIFO, a directory; only root can put
/// it there) is answered at once by every command, and fails none of them for the rest of
/// the store (guards against a FIFO `layer.json` hanging `check` and `stats`, and a FIFO
/// lock in one directory failing `clean`, `check` and the delete the docs name as the
/// remedy, for every container).
#[test]
fn a_file_of_the_wrong_type_hangs_no_command_and_fails_none_for_the_rest() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let store = &lamina.store;
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    lamina
        .run(&["create", "--without-mount", &image, "live"])
        .ok();
    let soon = std::time::Duration::from_secs(20);

    // A layer's record.
    let layer = fs::read_dir(store.join("layers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    let record = layer.join("layer.json");
    let saved = fs::read(&record).unwrap();
    fs::remove_file(&record).unwrap();
    fifo_at(&record);
    let found = lamina.run_within(&["check"], soon);
    assert_eq!(found.code, 1, "{found:?}");
    assert!(found.stdout.contains("a FIFO"), "{found:?}");
    let stats = lamina.run_within(&["stats", "live"], soon);
    assert_ne!(stats.code, 0, "{stats:?}");
    assert!(stats.stderr.contains("a FIFO"), "{stats:?}");
    fs::remove_file(&record).unwrap();
    fs::write(&record, saved).unwrap();

    // A crashed create whose lock is a FIFO, beside one whose lock is a directory.
    for (id, lock) in [("fifo-lock", "fifo"), ("dir-lock", "dir")] {
        let dir = store.join("images").join(id);
        fs::create_dir_all(dir.join("rootfs")).unwrap();
        match lock {
            "fifo" => fifo_at(&dir.join("lock")),
            _ => fs::create_dir(dir.join("lock")).unwrap(),
        }
    }
    let found = lamina.run_within(&["check"], soon);
    assert_eq!(found.code, 1, "{found:?}");
    assert!(
        kinds(&report_of(&found.stdout)).contains("crashed_create"),
        "{found:?}"
    );
    let cleaned = lamina.run_within(&["clean"], soon);
    assert_eq!(cleaned.code, 0, "{cleaned:?}");
    assert!(!store.join("images/fifo-lock").exists());
    assert!(!store.join("images/dir-lock").exists());

    // A container whose record and lock are both FIFOs goes with a delete.
    lamina
        .run(&["create", "--without-mount", &image, "broken"])
        .ok();
    let broken = store.join("images/broken");
    for name in ["lock", "container.json"] {
        fs::remove_file(broken.join(name)).unwrap();
        fifo_at(&broken.join(name));
    }
    let deleted = lamina.run_within(&["delete", "broken"], soon);
    assert_eq!(deleted.code, 0, "{deleted:?}");
    assert!(!broken.exists());
    let listed = lamina.run_within(&["list"], soon);
    assert!(!listed.stdout.contains("broken"), "{listed:?}");
    let after = lamina.run_within(&["check"], soon);
    assert_eq!(after.code, 0, "{after:?}");
    lamina.delete_and_assert_gone("live", "check");
}

/// A FIFO at `path`, with nobody at either end.
fn fifo_at(path: &std::path::Path) {
    let mode = rustix::fs::Mode::from_raw_mode(0o600);
    rustix::fs::mknodat(rustix::fs::CWD, path, rustix::fs::FileType::Fifo, mode, 0).unwrap();
}

/// A byte changed in a classic layer's tree — what every classic container of the image
/// runs — is found by `check --verify`, which names the layer and the file; so is a file
/// planted in a layer, and a list removed to hide an edit. Plain `check` does not read
/// layer files, and `--repair` leaves the layer (only a new import makes it again).
#[test]
fn check_verify_names_a_layer_file_changed_or_planted() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("img")).references()[0].clone();
    let rootfs = lamina.create_with(&["--strategy", "classic"], &image, "a");
    let clean = lamina.run(&["check", "--verify"]).json();
    assert_eq!(clean["ok"], true, "{clean}");
    let covered = &clean["verified_layers"];
    assert_eq!(covered["layers"], 2, "{clean}");
    assert_eq!(covered["unlisted_layers"], 0, "{clean}");
    assert!(covered["entries"].as_u64().unwrap() >= 2, "{clean}");

    let busybox = fs::read_dir(lamina.store.join("layers"))
        .unwrap()
        .map(|layer| layer.unwrap().path().join("diff/bin/busybox"))
        .find(|path| path.is_file())
        .unwrap();
    let layer = busybox
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap();
    let chain = layer.file_name().unwrap().to_str().unwrap().to_string();
    let mut bytes = fs::read(&busybox).unwrap();
    let original = bytes.clone();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    fs::write(&busybox, &bytes).unwrap();
    let planted = layer.join("diff/etc-ld.so.preload");
    fs::write(&planted, b"/tmp/evil.so\n").unwrap();
    assert_eq!(
        fs::read(rootfs.join("bin/busybox")).unwrap(),
        bytes,
        "the container reads the changed layer"
    );

    assert_eq!(
        lamina.run(&["check"]).json()["ok"],
        true,
        "plain check reads no layer file"
    );
    let out = lamina.run(&["check", "--verify", "--repair"]);
    assert_eq!(out.code, 1, "{out:?}");
    let report = report_of(&out.stdout);
    let problems = report["problems"].as_array().unwrap();
    let named = |path: &std::path::Path, what: &str| {
        problems.iter().any(|p| {
            p["kind"] == "bad_layer_file"
                && p["path"] == path.to_str().unwrap()
                && p["repaired"] == false
                && p["detail"].as_str().unwrap().contains(&chain)
                && p["detail"].as_str().unwrap().contains(what)
        })
    };
    assert!(named(&busybox, "content changed"), "{report}");
    assert!(named(&planted, "did not have"), "{report}");
    assert_eq!(problems.len(), 2, "{report}");

    fs::write(&busybox, &original).unwrap();
    fs::remove_file(&planted).unwrap();
    assert_eq!(lamina.run(&["check", "--verify"]).json()["ok"], true);

    // Removing the list does not hide an edit: the layer's record says it had one.
    let list = layer.join("file-list");
    let kept = fs::read(&list).unwrap();
    fs::remove_file(&list).unwrap();
    let out = lamina.run(&["check", "--verify"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.contains("bad_file_list") && out.stdout.contains("is gone"),
        "{out:?}"
    );
    fs::write(&list, kept).unwrap();
    assert_eq!(lamina.run(&["check", "--verify"]).json()["ok"], true);

    // A layer whose record names no list (imported by an earlier release) is counted as
    // not verified, not as damage.
    let record = layer.join("layer.json");
    let mut fields: serde_json::Value =
        serde_json::from_slice(&fs::read(&record).unwrap()).unwrap();
    assert_eq!(fields["file_list"], true);
    fields.as_object_mut().unwrap().remove("file_list");
    fs::write(&record, serde_json::to_vec(&fields).unwrap()).unwrap();
    let earlier = lamina.run(&["check", "--verify"]).json();
    assert_eq!(earlier["ok"], true, "{earlier}");
    assert_eq!(
        earlier["verified_layers"]["unlisted_layers"], 1,
        "{earlier}"
    );
    lamina.run(&["delete", "a"]);
}
