//! Strategy `isolated` on real filesystems: a container writing past its disk limit gets
//! ENOSPC inside runc while its neighbour keeps writing; a create claims a ready upper
//! from the pool instead of formatting one; writes survive `unmount` + `mount` and a
//! simulated host restart (disk), or are refused as lost (memory). The conformance suite
//! (strategies.rs) covers booting, isolation and teardown under both backends.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_integration::proof::fstype;
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root, sample_image};

/// A store and the sample image's reference on a fresh loop-backed ext4.
fn store_with_sample(fs: &ScratchFs) -> (Lamina, String) {
    let image = sample_image(&fs.path().join("image")).references()[0].clone();
    (Lamina::init(&fs.path().join("store")), image)
}

fn upper_fs(lamina: &Lamina, id: &str) -> PathBuf {
    lamina.store.join("images").join(id).join("upperfs")
}

fn unmount(path: &Path) {
    let status = std::process::Command::new("umount")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success(), "umount {}", path.display());
}

#[test]
fn writing_past_the_disk_limit_fails_with_enospc_and_the_neighbour_keeps_writing() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image) = store_with_sample(&fs);
    let limit = [
        "--disk-limit-size-bytes",
        "33554432",
        "--exclude-image-from-quota",
    ];
    let full = lamina.create_with(&limit, &image, "full");
    let neighbour = lamina.create_with(&limit, &image, "neighbour");
    let record = lamina_integration::records::rootfs_of(&lamina.store, "full");
    assert_eq!(record["upper_fs"]["size_bytes"], 33554432, "{record}");
    assert!(record["strategy"].as_str().unwrap().contains("isolated"));

    let bundle = Bundle::new(&full, false);
    let run_id = format!("lamina-limit-{}", std::process::id());
    let out = bundle.run(
        &run_id,
        "dd if=/dev/zero of=/fill bs=1M count=64 2>&1; echo status=$?; ls -l /fill",
    );
    assert!(
        out.stdout.contains("No space left on device"),
        "ENOSPC at the limit: {out:?}"
    );
    assert!(!out.stdout.contains("status=0"), "{out:?}");
    drop(bundle);

    let bundle = Bundle::new(&neighbour, false);
    let out = bundle.run(
        &format!("{run_id}-n"),
        "dd if=/dev/zero of=/data bs=1M count=16 2>&1 && echo neighbour-wrote",
    );
    assert!(out.stdout.contains("neighbour-wrote"), "{out:?}");
    drop(bundle);

    lamina.delete_and_assert_gone("full", "full");
    lamina.delete_and_assert_gone("neighbour", "neighbour");
}

#[test]
fn a_create_claims_a_ready_upper_filesystem_from_the_pool() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image) = store_with_sample(&fs);
    let filled = lamina
        .run(&["pool", "fill", "--strategy", "isolated", "--size", "2"])
        .json();
    assert_eq!(filled["ready"], 2, "{filled}");
    let pooled_images: Vec<u64> = walk_images(&lamina.store.join("pool"));
    assert_eq!(pooled_images.len(), 2);

    let out = lamina.run(&["create", "--strategy", "isolated", &image, "c"]);
    assert_eq!(out.code, 0, "{out:?}");
    let claimed = std::fs::metadata(lamina.store.join("images/c/upper.img"))
        .unwrap()
        .ino();
    assert!(
        pooled_images.contains(&claimed),
        "the container's upper image is one the pool made"
    );
    assert_eq!(fstype(&upper_fs(&lamina, "c")).as_deref(), Some("ext4"));

    // auto takes a pooled upper too, and says why.
    let out = lamina.run(&["--log-level", "info", "create", &image, "auto"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr
            .contains("isolated upper filesystem is ready in a pool"),
        "{}",
        out.stderr
    );

    lamina.delete_and_assert_gone("c", "c");
    lamina.delete_and_assert_gone("auto", "auto");
    // Wait for the refills the claims started, then release the pool.
    lamina
        .run(&["pool", "fill", "--strategy", "isolated"])
        .json();
    assert!(lamina.run(&["pool", "drain"]).json()["released"].as_u64() >= Some(2));
    assert!(lamina.loop_devices_outside_pool().is_empty());
    assert!(
        lamina_sys::loop_backing_files()
            .iter()
            .all(|(_, backing)| !backing.starts_with(&lamina.store)),
        "drain released the pool's loop devices"
    );
}

/// Inode numbers of every `upper.img` under `dir`.
fn walk_images(dir: &Path) -> Vec<u64> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk_images(&path));
        } else if path.file_name().is_some_and(|n| n == "upper.img") {
            found.push(entry.metadata().unwrap().ino());
        }
    }
    found
}

#[test]
fn writes_survive_unmount_and_a_restart_on_disk_and_are_refused_as_lost_in_memory() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image) = store_with_sample(&fs);
    for strategy in ["isolated", "isolated-memory"] {
        let rootfs = lamina.create_with(&["--strategy", strategy], &image, strategy);
        std::fs::write(rootfs.join("kept"), strategy).unwrap();
        assert_eq!(lamina.run(&["unmount", strategy]).code, 0, "{strategy}");
        assert!(!rootfs.join("kept").exists());
        let out = lamina.run(&["mount", strategy]);
        assert_eq!(out.code, 0, "{strategy}: {out:?}");
        assert_eq!(
            std::fs::read_to_string(rootfs.join("kept")).unwrap(),
            strategy
        );

        // A host restart takes every mount away.
        unmount(&rootfs);
        unmount(&upper_fs(&lamina, strategy));
        let out = lamina.run(&["mount", strategy]);
        if strategy == "isolated" {
            assert_eq!(out.code, 0, "{strategy}: {out:?}");
            assert_eq!(
                std::fs::read_to_string(rootfs.join("kept")).unwrap(),
                strategy
            );
        } else {
            assert_eq!(out.code, 1, "{out:?}");
            assert!(out.stdout.contains("tmpfs and is gone"), "{out:?}");
        }
        lamina.delete_and_assert_gone(strategy, strategy);
    }
}

/// A memory-backed upper is bounded by memory, not only by the limit asked: a limit past
/// half the host's memory is refused before anything is mounted.
#[test]
fn a_memory_upper_larger_than_half_the_hosts_memory_is_refused() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, image) = store_with_sample(&fs);
    let mem_total_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    // Just past the bound (six tenths of the host's memory), not a number any bound refuses.
    let limit = (mem_total_kib * 1024 / 10 * 6).to_string();
    let out = lamina.run(&[
        "create",
        "--strategy",
        "isolated-memory",
        "--exclude-image-from-quota",
        "--disk-limit-size-bytes",
        &limit,
        &image,
        "huge",
    ]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.contains("more than half this host's memory"),
        "{out:?}"
    );
    assert_eq!(lamina.run(&["list"]).stdout, "Store empty");
    assert!(lamina_integration::scratch::mounts_under(&lamina.store).is_empty());
}

/// A deleted isolated container's own upper filesystem is shut down before its unmount
/// (the reaper's discard), so nothing it wrote is written back or unlinked file by file.
/// The shutdown is taken only where the filesystem is that container's own: asked of the
/// store's filesystem, or of the container's with another image named, it does nothing.
/// Once taken, the container's writes fail and the store's go on; teardown then leaves
/// nothing behind.
#[test]
fn only_a_containers_own_upper_filesystem_is_shut_down_and_teardown_follows() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image) = store_with_sample(&fs);
    let rootfs = lamina.create_with(&["--strategy", "isolated"], &image, "gone");
    let own = upper_fs(&lamina, "gone");
    let image_file = lamina.store.join("images/gone/upper.img");
    for i in 0..200 {
        std::fs::write(rootfs.join(format!("f{i}")), [7u8; 4096]).unwrap();
    }

    assert!(!lamina_sys::shut_down_own_fs(fs.path(), &image_file));
    assert!(!lamina_sys::shut_down_own_fs(&lamina.store, &image_file));
    assert!(!lamina_sys::shut_down_own_fs(
        &own,
        &fs.path().join("other.img")
    ));
    std::fs::write(rootfs.join("still"), "written").unwrap();

    // In use while a file in it is open; idle once it is closed (asked once: a second
    // idle answer would unmount it).
    let open = std::fs::File::open(rootfs.join("f0")).unwrap();
    assert!(lamina_sys::mount_in_use(&rootfs));
    drop(open);
    assert!(!lamina_sys::mount_in_use(&rootfs));
    assert!(lamina_sys::shut_down_own_fs(&own, &image_file));
    assert!(std::fs::write(rootfs.join("after"), "refused").is_err());
    std::fs::write(fs.path().join("store-fs"), "written").unwrap();
    assert_eq!(
        std::fs::read(fs.path().join("store-fs")).unwrap(),
        b"written"
    );

    lamina.delete_and_assert_gone("gone", "shut down");
    assert_eq!(lamina.run(&["check"]).code, 0);
}

/// The reaper tears containers with upper filesystems of their own down a few at once,
/// beside three on the store's filesystem (their files unlinked two at once on ext4, all
/// three unmounted before any is removed), in one pass: every one goes, with its mounts
/// and loop device. One still in use among them stays in `trash/`, untouched (nothing it
/// wrote is unlinked under its process), without keeping the others, and the next reaper
/// takes it once it is free.
#[test]
fn isolated_containers_are_reaped_together_and_a_busy_one_waits_alone() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let (lamina, image) = store_with_sample(&fs);
    let ids = [
        "disk-0", "disk-1", "disk-2", "disk-3", "disk-4", "memory", "shared-0", "shared-1",
        "shared-2", "busy",
    ];
    for id in ids {
        let strategy = match id {
            "memory" => "isolated-memory",
            _ if id.starts_with("shared") => "deferred",
            _ => "isolated",
        };
        let rootfs = lamina.create_with(&["--strategy", strategy], &image, id);
        for i in 0..100 {
            std::fs::write(rootfs.join(format!("f{i}")), [7u8; 4096]).unwrap();
        }
    }
    assert_eq!(
        loop_devices_under(&lamina.store),
        6,
        "five disk uppers and busy's"
    );
    let busy = std::fs::File::open(lamina.store.join("images/busy/rootfs/f0")).unwrap();
    // The reaper's locks, held while all are deleted: they pile up in `trash/`, no
    // delete starts a reaper of its own, and the one this test runs takes them in one pass.
    let held: Vec<std::fs::File> = ["reaper", "reaping"]
        .iter()
        .map(|lock| {
            let file = std::fs::File::create(lamina.store.join(format!("locks/{lock}.lock")));
            let file = file.unwrap();
            rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).unwrap();
            file
        })
        .collect();
    for id in ids {
        let out = lamina.run(&["delete", id]);
        assert_eq!(out.code, 0, "{id}: {out:?}");
    }
    assert_eq!(lamina.entries("trash"), ids.len());
    drop(held);

    let log = fs.path().join("reap.log");
    let log_arg = log.display().to_string();
    let reaped = lamina
        .run(&["--log-level", "debug", "--log-file", &log_arg, "reap"])
        .json();
    assert_eq!(reaped["failed"], 1, "only the busy one stays: {reaped}");
    // Every container on the store's filesystem had its 100 files unlinked before the
    // first unmount, not written back by it.
    let logged = std::fs::read_to_string(&log).unwrap();
    let discarded: Vec<serde_json::Value> = logged
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["message"] == "lamina.reap.unlinked written files before unmount")
        .map(|l| l["data"]["discarded"].clone())
        .collect();
    assert_eq!(discarded, vec![serde_json::json!(100); 3], "{logged}");
    assert_eq!(lamina.entries("trash"), 1);
    let trash = lamina.store.join("trash");
    let left = lamina_integration::scratch::mounts_under(&lamina.store);
    let busy_entry = std::fs::read_dir(&trash)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(
        !left.is_empty() && left.iter().all(|m| m.starts_with(&busy_entry)),
        "only the busy container's mounts are left: {left:?}"
    );
    assert_eq!(
        loop_devices_under(&lamina.store),
        1,
        "only busy's loop device"
    );
    // Left untouched while in use: nothing it wrote was unlinked under its process.
    assert_eq!(
        std::fs::read(busy_entry.join("rootfs/f99")).unwrap(),
        [7u8; 4096],
        "a busy container's files are kept until it is free"
    );

    drop(busy);
    let reaped = lamina.run(&["reap"]).json();
    assert_eq!(reaped["failed"], 0, "{reaped}");
    assert_eq!(lamina.entries("trash"), 0);
    assert!(lamina_integration::scratch::mounts_under(&lamina.store).is_empty());
    assert_eq!(loop_devices_under(&lamina.store), 0);
    assert_eq!(lamina.run(&["check"]).code, 0);
}

/// Written files of containers on the store's filesystem are unlinked two containers at
/// once on ext4 (given two CPUs) and one at a time on xfs (two walks there wait on one
/// allocation group's inode buffer) or anything else.
#[test]
fn unlinks_go_two_at_once_on_ext4_only() {
    require_root();
    let ext4 = ScratchFs::ext4(64);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    assert_eq!(lamina_sys::unlinks_at_once(ext4.path()), cpus.min(2));
    let xfs = ScratchFs::loop_backed(lamina_integration::FsKind::Xfs, 320, false);
    assert_eq!(lamina_sys::unlinks_at_once(xfs.path()), 1);
    let tmpfs = ScratchFs::tmpfs();
    assert_eq!(lamina_sys::unlinks_at_once(tmpfs.path()), 1);
    assert_eq!(lamina_sys::unlinks_at_once(&ext4.path().join("absent")), 1);
}

/// How many loop devices have a backing file under `dir`.
fn loop_devices_under(dir: &Path) -> usize {
    let dir = dir.canonicalize().unwrap();
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|d| std::fs::read_to_string(d.path().join("loop/backing_file")).ok())
        .filter(|backing| Path::new(backing.trim_end()).starts_with(&dir))
        .count()
}

/// `mount_in_use` marks an idle mount the first time it is asked. Asked again with nobody
/// in it since (a reaper's next try after a teardown that failed), the kernel unmounts it,
/// and that answers idle too. A mount with an open file in it is in use, and stays.
#[test]
fn an_idle_mount_asked_twice_is_unmounted_and_answers_idle() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let target = fs.path().join("m");
    std::fs::create_dir(&target).unwrap();
    // From the mount table: a path walk into the mount would clear its mark.
    let mounted = |p: &Path| {
        lamina_sys::mounts_under(fs.path())
            .unwrap()
            .contains(&p.to_path_buf())
    };
    let mount = || {
        rustix::mount::mount(
            "tmpfs",
            &target,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .unwrap();
    };

    mount();
    assert!(!lamina_sys::mount_in_use(&target));
    assert!(mounted(&target), "the first ask only marks it");
    assert!(!lamina_sys::mount_in_use(&target));
    assert!(!mounted(&target), "the second ask unmounted it");

    mount();
    std::fs::write(target.join("f"), "x").unwrap();
    let open = std::fs::File::open(target.join("f")).unwrap();
    assert!(lamina_sys::mount_in_use(&target));
    assert!(lamina_sys::mount_in_use(&target));
    assert!(mounted(&target), "in use: never unmounted");
    drop(open);
    unmount(&target);
}
