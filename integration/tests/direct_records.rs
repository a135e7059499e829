//! A create's first record skips the device flush only where the filesystem's journal
//! puts a direct write ahead of everything after it (docs/store.md, "Durability of
//! records"; `lamina-sys/src/ordered_journal.rs`). Each configuration here is made for
//! real and asked; where the answer is no, nothing is left behind and the caller's fsync
//! path runs. Found by review: ext2-style ext4 without a journal, `journal_async_commit`,
//! ext4's silent fallback to buffered I/O (`data=journal` stands for encrypted files and
//! inline data, which take the same fallback) and sectors larger than the record's blocks;
//! and the ones a second device makes: an external ext4 journal, an xfs log of its own.
//! (An xfs realtime section, also refused, cannot be mounted here: no CONFIG_XFS_RT.)

#![allow(clippy::unwrap_used)]

use std::fs;

use lamina_integration::{FsKind, LoopOptions, ScratchFs, SecondDevice, require_root};
use lamina_sys::{HostFs, RealHost};

/// Asks for a direct write of a small record into `fs` and checks what was left.
fn direct(fs: &ScratchFs) -> bool {
    let path = fs.path().join("record.tmp");
    let wrote = RealHost
        .write_new_direct(&path, b"{\"id\":\"c\"}")
        .unwrap_or_else(|e| panic!("{}: {e}", fs.path().display()));
    if wrote {
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.starts_with(b"{\"id\":\"c\"}"));
    } else {
        assert!(!path.exists(), "a refused direct write left its file");
    }
    wrote
}

/// Asks for a small record as a symlink's target in `fs` and checks what was left.
fn symlinked(fs: &ScratchFs) -> bool {
    let path = fs.path().join("record.link");
    let wrote = RealHost
        .write_new_symlink(&path, b"{\"id\":\"c\"}")
        .unwrap_or_else(|e| panic!("{}: {e}", fs.path().display()));
    if wrote {
        assert_eq!(fs::read_link(&path).unwrap().as_os_str(), "{\"id\":\"c\"}");
    } else {
        assert!(
            path.symlink_metadata().is_err(),
            "a refused symlink record left its symlink"
        );
    }
    wrote
}

fn made(kind: FsKind, options: LoopOptions) -> ScratchFs {
    ScratchFs::loop_backed_with(kind, 512, &options)
}

#[test]
fn journaled_ext4_and_xfs_take_the_direct_write() {
    require_root();
    for kind in [FsKind::Ext4, FsKind::Xfs] {
        let fs = made(kind, LoopOptions::default());
        assert!(direct(&fs), "{kind:?}");
        assert!(symlinked(&fs), "{kind:?}");
    }
    let direct_io = LoopOptions {
        direct_io: true,
        ..LoopOptions::default()
    };
    assert!(direct(&made(FsKind::Xfs, direct_io)));
}

#[test]
fn filesystems_without_an_ordered_journal_take_the_fsync_path() {
    require_root();
    let cases = [
        (
            "ext4 without a journal",
            FsKind::Ext4,
            LoopOptions {
                mkfs: vec!["-O", "^has_journal"],
                ..LoopOptions::default()
            },
        ),
        (
            "ext4 journal_async_commit",
            FsKind::Ext4,
            LoopOptions {
                mount: Some("data=writeback,journal_async_commit"),
                ..LoopOptions::default()
            },
        ),
        (
            "ext4 data=journal (buffered despite O_DIRECT)",
            FsKind::Ext4,
            LoopOptions {
                mount: Some("data=journal"),
                ..LoopOptions::default()
            },
        ),
        (
            "xfs on 16 KiB sectors",
            FsKind::Xfs,
            LoopOptions {
                sector_size: Some(16384),
                mkfs: vec!["-b", "size=16384", "-s", "size=16384"],
                ..LoopOptions::default()
            },
        ),
        (
            "ext4 nobarrier (commits without flush or FUA)",
            FsKind::Ext4,
            LoopOptions {
                mount: Some("nobarrier"),
                ..LoopOptions::default()
            },
        ),
        (
            "ext4 mounted noload (no journal replayed or written)",
            FsKind::Ext4,
            LoopOptions {
                mount: Some("ro,noload"),
                ..LoopOptions::default()
            },
        ),
        (
            "ext4 with an external journal",
            FsKind::Ext4,
            LoopOptions {
                second_device: Some(SecondDevice::Ext4Journal),
                ..LoopOptions::default()
            },
        ),
        (
            "xfs with an external log",
            FsKind::Xfs,
            LoopOptions {
                second_device: Some(SecondDevice::XfsLog),
                ..LoopOptions::default()
            },
        ),
        ("btrfs", FsKind::Btrfs, LoopOptions::default()),
    ];
    for (case, kind, options) in cases {
        let fs = made(kind, options);
        assert!(!direct(&fs), "{case}");
        // A symlink's target is journaled wherever a journal runs: only the direct
        // write's own limits (buffered fallback, sector size) leave it a choice.
        let journal_in_order = case.contains("data=journal") || case.contains("sectors");
        if !journal_in_order {
            assert!(!symlinked(&fs), "{case}: a symlink record");
        }
    }
    assert!(!direct(&ScratchFs::tmpfs()), "tmpfs");
    assert!(!symlinked(&ScratchFs::tmpfs()), "tmpfs: a symlink record");
}

/// What a process learnt of one mount is not carried to the next: a filesystem made after
/// another is gone most often gets its loop device and, from `STATX_MNT_ID`, its mount ID
/// too. Answers are kept per mount by the kernel's unique mount ID.
#[test]
fn the_next_mount_on_a_freed_device_is_asked_again() {
    require_root();
    let async_commit = LoopOptions {
        mount: Some("data=writeback,journal_async_commit"),
        ..LoopOptions::default()
    };
    for _ in 0..3 {
        let journaled = made(FsKind::Ext4, LoopOptions::default());
        assert!(direct(&journaled));
        drop(journaled);
        let unordered = made(FsKind::Ext4, async_commit.clone());
        assert!(!direct(&unordered), "the mount before it was answered for");
    }
}
