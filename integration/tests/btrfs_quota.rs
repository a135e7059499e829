//! Strategy `isolated-quota` on a real btrfs with quotas enabled: a disk limit under
//! `auto` becomes a subvolume per container with a qgroup limit. Writing past it inside
//! runc fails (EDQUOT) while the neighbour keeps writing; `lamina stats` reads the usage
//! from the qgroup; delete leaves no subvolume, no qgroup, no mount and no loop device.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use lamina_integration::{Bundle, Lamina, ScratchFs, require_root, sample_image};

const LIMIT: u64 = 32 << 20;

fn btrfs(args: &[&str]) -> String {
    let out = Command::new("btrfs")
        .args(args)
        .output()
        .expect("btrfs (btrfs-progs)");
    assert!(
        out.status.success(),
        "btrfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Subvolume paths on the filesystem at `root` (live ones, not those being dropped).
fn subvolumes(root: &Path) -> Vec<String> {
    btrfs(&["subvolume", "list", "-o", root.to_str().unwrap()])
        .lines()
        .filter_map(|l| l.split(" path ").nth(1).map(str::to_string))
        .collect()
}

/// Waits for the kernel's cleaner to drop deleted subvolumes, then for the commit that
/// removes their emptied qgroups (Linux 6.9+). A commit wakes the cleaner; unprompted,
/// both wait for the commit interval (30 s).
fn wait_dropped(root: &Path) {
    let root = root.to_str().unwrap();
    btrfs(&["filesystem", "sync", root]);
    btrfs(&["subvolume", "sync", root]);
    btrfs(&["filesystem", "sync", root]);
}

/// Level-0 qgroups other than the top-level subvolume's (0/5).
fn qgroups(root: &Path) -> Vec<String> {
    btrfs(&["qgroup", "show", "--raw", root.to_str().unwrap()])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|id| id.starts_with("0/") && *id != "0/5")
        .map(str::to_string)
        .collect()
}

fn exclusive_bytes(lamina: &Lamina, id: &str) -> u64 {
    let out = lamina.run(&["stats", id]);
    assert_eq!(out.code, 0, "{out:?}");
    let stats = out.json();
    assert_eq!(
        stats["disk_usage"]["committed_space_bytes"], LIMIT,
        "{stats}"
    );
    stats["disk_usage"]["exclusive_bytes_used"]
        .as_u64()
        .unwrap()
}

/// delete-store takes a live quota container's subvolume, and its qgroup, with it.
fn delete_store_takes_a_live_subvolume(lamina: &Lamina, image: &str, fs: &Path) {
    lamina.create_with(&["--strategy", "isolated-quota"], image, "last");
    let out = lamina.run(&["delete-store"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!lamina.store.exists());
    assert_eq!(subvolumes(fs), Vec::<String>::new(), "delete-store");
    wait_dropped(fs);
    assert_eq!(qgroups(fs), Vec::<String>::new(), "no qgroup left");
}

#[test]
fn a_disk_limit_on_btrfs_is_a_qgroup_that_stops_the_writer_and_spares_the_neighbour() {
    require_root();
    let fs = ScratchFs::btrfs_with_quotas(1024);
    let image = sample_image(&fs.path().join("image")).references()[0].clone();
    let lamina = Lamina::init(&fs.path().join("store"));
    let limit = LIMIT.to_string();
    let flags = [
        "--disk-limit-size-bytes",
        &limit,
        "--exclude-image-from-quota",
    ];
    let full = lamina.create_with(&flags, &image, "full");
    let neighbour = lamina.create_with(&flags, &image, "neighbour");
    for id in ["full", "neighbour"] {
        let record = lamina_integration::records::rootfs_of(&lamina.store, id);
        assert!(
            record["strategy"]
                .as_str()
                .unwrap()
                .contains("isolated-quota"),
            "auto with a disk limit on a btrfs store with quotas: {record}"
        );
        assert_eq!(
            record["upper_fs"]["filesystem"], "btrfs-subvolume",
            "{record}"
        );
        assert_eq!(record["upper_fs"]["size_bytes"], LIMIT, "{record}");
    }
    assert_eq!(
        subvolumes(fs.path()).len(),
        2,
        "one subvolume per container"
    );
    assert!(
        lamina.loop_devices_outside_pool().is_empty(),
        "no loop device per container"
    );

    let run_id = format!("lamina-qgroup-{}", std::process::id());
    let bundle = Bundle::new(&full, false);
    let out = bundle.run(
        &run_id,
        "dd if=/dev/zero of=/fill bs=1M count=64 conv=fsync 2>&1; echo status=$?",
    );
    assert!(
        out.stdout.contains("Disk quota exceeded") || out.stdout.contains("No space left"),
        "EDQUOT at the limit: {out:?}"
    );
    assert!(!out.stdout.contains("status=0"), "{out:?}");
    drop(bundle);

    let bundle = Bundle::new(&neighbour, false);
    let out = bundle.run(
        &format!("{run_id}-n"),
        "dd if=/dev/zero of=/data bs=1M count=16 conv=fsync 2>&1 && echo neighbour-wrote",
    );
    assert!(out.stdout.contains("neighbour-wrote"), "{out:?}");
    drop(bundle);

    // The qgroup counts at transaction commit.
    btrfs(&["filesystem", "sync", fs.path().to_str().unwrap()]);
    let full_bytes = exclusive_bytes(&lamina, "full");
    assert!(
        full_bytes > LIMIT - (4 << 20) && full_bytes <= LIMIT,
        "the writer used its limit: {full_bytes}"
    );
    let neighbour_bytes = exclusive_bytes(&lamina, "neighbour");
    assert!(
        (16 << 20..LIMIT).contains(&neighbour_bytes),
        "the neighbour's 16 MiB: {neighbour_bytes}"
    );

    // Quotas turned off and on drop every qgroup's limit; mounting the container again
    // sets its own, and the writer is stopped at it once more.
    let root = fs.path().to_str().unwrap();
    btrfs(&["quota", "disable", root]);
    btrfs(&["quota", "enable", root]);
    btrfs(&["quota", "rescan", "-w", root]);
    for step in ["unmount", "mount"] {
        let out = lamina.run(&[step, "neighbour"]);
        assert_eq!(out.code, 0, "{step}: {out:?}");
    }
    let bundle = Bundle::new(&neighbour, false);
    let out = bundle.run(
        &format!("{run_id}-again"),
        "dd if=/dev/zero of=/more bs=1M count=64 conv=fsync 2>&1; echo status=$?",
    );
    assert!(!out.stdout.contains("status=0"), "limit set again: {out:?}");
    drop(bundle);

    lamina.delete_and_assert_gone("full", "full");
    lamina.delete_and_assert_gone("neighbour", "neighbour");
    assert_eq!(subvolumes(fs.path()), Vec::<String>::new());
    wait_dropped(fs.path());
    assert_eq!(qgroups(fs.path()), Vec::<String>::new(), "no qgroup left");
    assert!(lamina_integration::scratch::mounts_under(&lamina.store).is_empty());

    delete_store_takes_a_live_subvolume(&lamina, &image, fs.path());
}

#[test]
fn inline_delete_clean_and_delete_store_leave_no_subvolume_and_no_qgroup() {
    require_root();
    let fs = ScratchFs::btrfs_with_quotas(1024);
    let image = sample_image(&fs.path().join("image")).references()[0].clone();
    let lamina = Lamina::init(&fs.path().join("store"));
    // A named, inline `isolated-quota` container, deleted inline.
    lamina.create_with(&["--strategy", "isolated-quota"], &image, "inline");
    let record = lamina_integration::records::rootfs_of(&lamina.store, "inline");
    assert_eq!(record["strategy"], "isolated-quota", "{record}");
    let out = lamina.run(&["delete", "inline"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(subvolumes(fs.path()), Vec::<String>::new(), "inline delete");

    // A create killed after making its subvolume: the directory has no record.
    lamina.create_with(&["--strategy", "isolated-quota"], &image, "crashed");
    let dir = lamina.store.join("images").join("crashed");
    let out = Command::new("umount")
        .arg(dir.join("rootfs"))
        .status()
        .unwrap();
    assert!(out.success());
    std::fs::remove_file(dir.join("container.json")).unwrap();
    assert_eq!(subvolumes(fs.path()).len(), 1);
    let check = lamina.run(&["check"]);
    assert_ne!(check.code, 0, "check reports the crashed create: {check:?}");
    let out = lamina.run(&["clean"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!dir.exists());
    assert_eq!(subvolumes(fs.path()), Vec::<String>::new(), "clean");
    wait_dropped(fs.path());
    assert_eq!(qgroups(fs.path()), Vec::<String>::new(), "no qgroup left");
    assert!(lamina_integration::scratch::mounts_under(&lamina.store).is_empty());

    delete_store_takes_a_live_subvolume(&lamina, &image, fs.path());
}
