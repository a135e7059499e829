//! Mounts real overlays (needs root). Each test unmounts through a guard, so a failed
//! assertion never leaks a mount.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};

use lamina_sys::{Mounter, OverlaySpec, RealMounter};

struct Unmount<'a>(&'a RealMounter, PathBuf);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = self.0.unmount(&self.1);
    }
}

fn layers(root: &Path, names: &[&str]) -> OverlaySpec {
    let mut spec = OverlaySpec::default();
    for (i, name) in names.iter().enumerate() {
        let dir = root.join(name);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("shared.txt"), name).unwrap();
        fs::write(dir.join(format!("only-{i}.txt")), name).unwrap();
        spec.lowers.push(dir);
    }
    for d in ["upper", "work", "merged"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    spec.upper = Some(root.join("upper"));
    spec.work = Some(root.join("work"));
    spec
}

fn check_merged(mounter: RealMounter, root: &Path, spec: &OverlaySpec) {
    let merged = root.join("merged");
    mounter.mount_overlay(spec, &merged).unwrap();
    let guard = Unmount(&mounter, merged.clone());
    assert!(mounter.is_mountpoint(&merged).unwrap());
    // The first lower is the top-most: its copy of a shared name wins.
    let top = spec.lowers[0].file_name().unwrap().to_str().unwrap();
    assert_eq!(fs::read_to_string(merged.join("shared.txt")).unwrap(), top);
    for i in 0..spec.lowers.len() {
        assert!(merged.join(format!("only-{i}.txt")).exists());
    }
    fs::write(merged.join("new.txt"), "w").unwrap();
    assert_eq!(fs::read_to_string(root.join("upper/new.txt")).unwrap(), "w");
    drop(guard);
    assert!(!mounter.is_mountpoint(&merged).unwrap());
    assert!(
        !mounter.unmount(&merged).unwrap(),
        "second unmount reports not mounted"
    );
}

#[test]
fn new_api_mounts_layers_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = layers(tmp.path(), &["top", "mid", "base"]);
    check_merged(RealMounter::new(), tmp.path(), &spec);
}

#[test]
fn layer_paths_past_fsconfig_limit_are_passed_as_fds() {
    let tmp = tempfile::tempdir().unwrap();
    let deep = tmp.path().join("d".repeat(200)).join("e".repeat(100));
    let spec = layers(&deep, &["top", "base"]);
    assert!(spec.lowers[0].as_os_str().len() > 255);
    check_merged(RealMounter::new(), &deep, &spec);
}

#[test]
fn legacy_mount_fallback_works() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = layers(tmp.path(), &["top", "base"]);
    check_merged(RealMounter { force_legacy: true }, tmp.path(), &spec);
}

#[test]
fn kernel_refusal_names_target_and_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let mut spec = layers(tmp.path(), &["top"]);
    spec.lowers.push(tmp.path().join("missing-layer"));
    let err = RealMounter::new()
        .mount_overlay(&spec, &tmp.path().join("merged"))
        .unwrap_err();
    // The missing layer is the reason, not a lack of privilege (EPERM would name the
    // target too, and pass for a caller who is not root).
    assert_eq!(err.errno, lamina_sys::Errno::NOENT, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("merged"), "{msg}");
    assert!(
        !RealMounter::new()
            .is_mountpoint(&tmp.path().join("merged"))
            .unwrap()
    );
}

#[test]
fn read_only_bind_shares_the_source_and_refuses_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut spec = layers(root, &["a", "b"]);
    spec.upper = None;
    spec.work = None;
    spec.read_only = true;
    let mounter = RealMounter::new();
    let shared = root.join("merged");
    mounter.mount_overlay(&spec, &shared).unwrap();
    let _shared_guard = Unmount(&mounter, shared.clone());

    let bind = root.join("bind");
    fs::create_dir(&bind).unwrap();
    mounter.bind_read_only(&shared, &bind).unwrap();
    let bind_guard = Unmount(&mounter, bind.clone());
    assert!(mounter.is_mountpoint(&bind).unwrap());
    assert_eq!(fs::read_to_string(bind.join("shared.txt")).unwrap(), "a");
    let err = fs::write(bind.join("new.txt"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(30), "EROFS expected, got {err}");
    // Same superblock: the bind made none of its own.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        fs::metadata(&bind).unwrap().dev(),
        fs::metadata(&shared).unwrap().dev()
    );
    drop(bind_guard);
    assert!(!mounter.is_mountpoint(&bind).unwrap());
    mounter.sync_filesystem(&shared).unwrap();
}
