//! The fake's fault injection and records: any seam call fails when a rule says, with
//! the rule's errno, and nothing else changes. Runs as any user.

#![allow(clippy::unwrap_used)]

use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;

use lamina_sys::{
    At, Call, Errno, FakeCall, FakeMounter, HostFs, Mounter, Node, OverlaySpec, When,
};

fn overlay(dir: &Path) -> OverlaySpec {
    std::fs::create_dir_all(dir.join("lower")).unwrap();
    std::fs::create_dir_all(dir.join("merged")).unwrap();
    OverlaySpec {
        lowers: vec![dir.join("lower")],
        read_only: true,
        ..OverlaySpec::default()
    }
}

#[test]
fn nth_fails_that_call_only() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let spec = overlay(tmp.path());
    let merged = tmp.path().join("merged");
    fake.fail(Call::Unmount, When::Nth(2), Errno::BUSY);
    fake.mount_overlay(&spec, &merged).unwrap();
    assert!(fake.unmount(&merged).unwrap());
    fake.mount_overlay(&spec, &merged).unwrap();
    let err = fake.unmount(&merged).unwrap_err();
    assert_eq!(err.errno, Errno::BUSY);
    assert!(
        fake.is_mountpoint(&merged).unwrap(),
        "a failed unmount unmounts nothing"
    );
    assert!(fake.unmount(&merged).unwrap());
}

#[test]
fn always_fails_every_call_of_the_kind_and_no_other() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    fake.fail(Call::Sync, When::Always, Errno::IO);
    for _ in 0..3 {
        assert_eq!(
            fake.sync_filesystem(tmp.path()).unwrap_err().errno,
            Errno::IO
        );
    }
    let spec = overlay(tmp.path());
    fake.mount_overlay(&spec, &tmp.path().join("merged"))
        .unwrap();
}

#[test]
fn a_path_rule_fails_only_matching_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    fake.fail(Call::Write, When::path_contains("record"), Errno::NOSPC);
    let (a, b) = (tmp.path().join("record.json"), tmp.path().join("other"));
    let file = File::create(&a).unwrap();
    assert_eq!(fake.write_all(&file, &a, b"x").unwrap_err(), Errno::NOSPC);
    let file = File::create(&b).unwrap();
    fake.write_all(&file, &b, b"x").unwrap();
    assert_eq!(std::fs::read(&b).unwrap(), b"x");
    assert_eq!(std::fs::read(&a).unwrap(), b"");
}

#[test]
fn the_legacy_next_mount_fails_one_mount_of_either_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let spec = overlay(tmp.path());
    let merged = tmp.path().join("merged");
    fake.fail_next_mount(Errno::INVAL);
    let upper = lamina_sys::UpperFs::Memory {
        size_bytes: 1 << 20,
    };
    assert_eq!(
        fake.mount_upper_fs(&upper, &merged).unwrap_err().errno,
        Errno::INVAL
    );
    fake.mount_overlay(&spec, &merged).unwrap();
}

#[test]
fn calls_are_recorded_and_ownership_is_kept_in_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let file = tmp.path().join("f");
    std::fs::write(&file, b"").unwrap();
    fake.chown(At::Path(&file), 1000, 2000).unwrap();
    assert_eq!(fake.owner_of(&file), Some((1000, 2000)));
    assert_eq!(fake.stat(At::Path(&file)).unwrap().st_uid, 1000);
    fake.set_xattr(At::Path(&file), OsStr::new("security.capability"), b"cap")
        .unwrap();
    assert_eq!(fake.xattr_of(&file, "security.capability").unwrap(), b"cap");
    // Like the kernel, a chown drops file capabilities.
    fake.chown(At::Path(&file), 1, 1).unwrap();
    assert_eq!(fake.xattr_of(&file, "security.capability"), None);

    let dir = File::open(tmp.path()).unwrap();
    let dir = std::os::fd::AsFd::as_fd(&dir);
    fake.mknod(
        dir,
        OsStr::new("null"),
        Node::Char { major: 1, minor: 3 },
        0o666,
    )
    .unwrap();
    let null = tmp.path().join("null");
    assert!(null.is_file(), "a regular stand-in on disk");
    assert_eq!(fake.node_of(&null), Some(Node::Char { major: 1, minor: 3 }));
    let st = fake.stat(At::Path(&null)).unwrap();
    assert_eq!(st.st_rdev, rustix::fs::makedev(1, 3));

    fake.fail(Call::Mknod, When::Always, Errno::PERM);
    let err = fake
        .mknod(dir, OsStr::new("zero"), Node::Fifo, 0o600)
        .unwrap_err();
    assert_eq!(err, Errno::PERM);
    assert!(!tmp.path().join("zero").exists());

    let calls = fake.calls();
    assert_eq!(
        calls[0],
        FakeCall::Chown {
            path: file.clone(),
            uid: 1000,
            gid: 2000
        }
    );
    assert!(matches!(&calls[1], FakeCall::SetXattr { path, .. } if *path == file));
    assert!(matches!(&calls[3], FakeCall::Mknod { path, .. } if *path == null));
    assert_eq!(calls.len(), 5, "{calls:?}");
}

#[test]
fn probes_report_the_fake_kernel_unless_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeMounter::new();
    let maps = lamina_sys::UserNsMaps::default();
    assert!(fake.probe_mount_api().lowerdir_plus);
    assert!(fake.probe_idmapped_layers(tmp.path(), tmp.path(), &maps));
    fake.fail(Call::ProbeIdmappedLayers, When::Always, Errno::PERM);
    fake.fail(Call::ProbeMountApi, When::Nth(1), Errno::NOSYS);
    assert!(!fake.probe_idmapped_layers(tmp.path(), tmp.path(), &maps));
    assert!(!fake.probe_mount_api().new_mount_api);
    assert!(fake.probe_mount_api().new_mount_api);
    fake.fail(Call::DetachLoopDevice, When::Always, Errno::NXIO);
    let err = fake
        .detach_loop_device(Path::new("/dev/loop9"))
        .unwrap_err();
    assert_eq!(err.errno, Errno::NXIO);
}
