//! No host user but root reaches anything in the store (the class of Docker's
//! CVE-2021-41091): the sample image ships a setuid-root file, and a user who could walk
//! to it — through a layer, a container's rootfs of any strategy, a shared, flattened or
//! pooled mount — could run it as root. Every copy of it is tried as `nobody`, through a
//! scratch filesystem whose own root any user may enter, so only the store's modes stand
//! in the way. A store that an older lamina (or an operator) left open is tightened by
//! the next command that opens it.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use lamina_integration::{Lamina, ScratchFs, require_root, sample_image};

const SUID_FILE: &str = "suid-tool";

/// Runs `stat PATH` as uid and gid 65534 with no supplementary groups; true if it could.
fn nobody_reaches(path: &Path) -> bool {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "stat"])
        .arg(path)
        .output()
        .unwrap();
    out.status.success()
}

/// Every copy of the setuid file under `store`, found as root.
fn suid_copies(store: &Path) -> Vec<PathBuf> {
    let out = Command::new("find")
        .arg(store)
        .args(["-name", SUID_FILE])
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(PathBuf::from)
        .collect()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().mode() & 0o7777
}

/// A store holding containers of every strategy, a filled pool and a pending delete.
fn busy_store(fs: &ScratchFs) -> (Lamina, Vec<&'static str>) {
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    let cases: [(&str, &[&str]); 6] = [
        ("classic", &["--strategy", "classic"]),
        ("isolated", &["--strategy", "isolated-memory"]),
        ("shared", &["--strategy", "shared-ro"]),
        ("direct", &["--strategy", "direct"]),
        ("default", &[]),
        ("read-only", &["--read-only"]),
    ];
    for (id, flags) in cases {
        lamina.create_with(flags, &image, id);
    }
    let filled = lamina.run(&["pool", "fill", "--size", "1", &image]);
    assert_eq!(filled.code, 0, "{filled:?}");
    (lamina, cases.iter().map(|(id, _)| *id).collect())
}

#[test]
fn no_host_user_reaches_a_setuid_file_through_any_store_path() {
    require_root();
    let fs = ScratchFs::tmpfs();
    assert!(nobody_reaches(fs.path()), "the scratch root is open to all");
    let (lamina, ids) = busy_store(&fs);

    let copies = suid_copies(&lamina.store);
    let under = |dir: &str| copies.iter().any(|c| c.starts_with(lamina.store.join(dir)));
    for kind in ["layers", "shared", "flat", "pool"] {
        assert!(under(kind), "a copy under {kind}/: {copies:?}");
    }
    for id in &ids {
        assert!(under(&format!("images/{id}/rootfs")), "{id}: {copies:?}");
    }
    for copy in &copies {
        assert!(!nobody_reaches(copy), "nobody reached {}", copy.display());
    }
    for dir in [
        "", "layers", "images", "tmp", "trash", "shared", "flat", "pool", "locks", "l",
    ] {
        let path = lamina.store.join(dir);
        assert!(!nobody_reaches(&path.join(".")), "{}", path.display());
        assert_eq!(mode(&path), 0o700, "{}", path.display());
    }
    for id in ids {
        lamina.delete_and_assert_gone(id, "permissions");
    }
    assert_eq!(lamina.run(&["pool", "drain"]).code, 0);
}

#[test]
fn a_store_left_open_is_tightened_by_the_next_command() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    for dir in ["", "layers", "images", "trash"] {
        let path = lamina.store.join(dir);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert!(nobody_reaches(&lamina.store.join("layers/.")));

    let out = lamina.run(&["--log-level", "warn", "list"]);
    assert_eq!(out.code, 0, "{out:?}");
    for dir in ["", "layers", "images", "trash"] {
        let path = lamina.store.join(dir);
        assert_eq!(mode(&path), 0o700, "{}", path.display());
    }
    assert!(
        out.stderr.contains("tightened a store directory's mode"),
        "logged: {}",
        out.stderr
    );
    assert!(!nobody_reaches(&lamina.store.join("layers/.")));
}

#[test]
fn a_mapped_store_lets_only_the_mapped_roots_group_walk_to_rootfses() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let store = fs.path().join("store");
    let init = lamina_integration::lamina::run_raw(&[
        "--store",
        store.to_str().unwrap(),
        "init-store",
        "--uid-mapping",
        "0:100000:65536",
        "--gid-mapping",
        "0:100000:65536",
    ]);
    assert_eq!(init.code, 0, "{init:?}");
    for (dir, want) in [("", 0o710), ("images", 0o710), ("layers", 0o700)] {
        let meta = fs::metadata(store.join(dir)).unwrap();
        assert_eq!(meta.mode() & 0o7777, want, "{dir}");
        if want == 0o710 {
            assert_eq!((meta.uid(), meta.gid()), (0, 100000), "{dir}");
        }
    }
    assert!(!nobody_reaches(&store.join("images/.")));
}

#[test]
fn a_symlinked_store_root_works_and_a_symlinked_top_directory_is_refused_untouched() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let link = fs.path().join("link");
    std::os::unix::fs::symlink(&lamina.store, &link).unwrap();
    let via_link = Lamina::new(&link);
    let out = via_link.run(&["list"]);
    assert_eq!(out.code, 0, "operators link stores elsewhere: {out:?}");
    // Its mounts are found and torn down through the link too: the mount table names
    // them by their real paths.
    let image = lamina_integration::sample_image(&fs.path().join("image")).references()[0].clone();
    for strategy in ["shared-ro", "classic"] {
        via_link.create_with(&["--strategy", strategy], &image, strategy);
        via_link.delete_and_assert_gone(strategy, "through a symlinked store root");
    }
    assert!(lamina_integration::scratch::mounts_under(&lamina.store).is_empty());
    assert_eq!(fs::read_dir(lamina.store.join("trash")).unwrap().count(), 0);

    let victim = fs.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_dir(lamina.store.join("trash")).unwrap();
    std::os::unix::fs::symlink(&victim, lamina.store.join("trash")).unwrap();
    let out = lamina.run(&["list"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.contains("trash: expected a directory"),
        "{out:?}"
    );
    assert_eq!(mode(&victim), 0o755, "the symlink's target is untouched");
}
