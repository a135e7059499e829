//! `lamina_store::remove_tree` (the delete, the reaper, collection) against real mounts:
//! a filesystem mounted beneath the tree, empty or not, fails the removal and stays
//! mounted with what it holds, while the empty directories beside it may go.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use lamina_integration::require_root;
use lamina_integration::scratch::mounts_under;

/// A tmpfs mounted at a path, unmounted (lazily, so a failing test leaks nothing) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn at(path: &Path) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs at {}", path.display());
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_mount_beneath_fails_the_removal_and_stays() {
    require_root();
    for holds_a_file in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("tree");
        std::fs::create_dir_all(root.join("a/empty")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        let mounted = Tmpfs::at(&root.join("a/mounted"));
        if holds_a_file {
            std::fs::write(mounted.0.join("kept"), "kept").unwrap();
        }
        let err = lamina_store::remove_tree(&root).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::XDEV.raw_os_error()),
            "{err}"
        );
        assert_eq!(mounts_under(&root), vec![mounted.0.clone()]);
        if holds_a_file {
            assert_eq!(
                std::fs::read_to_string(mounted.0.join("kept")).unwrap(),
                "kept"
            );
        }
        drop(mounted);
        lamina_store::remove_tree(&root).unwrap();
        assert!(!root.exists());
    }
}
