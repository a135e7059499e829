//! Unpacks hand-built tars as root and reads the results back from disk.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use lamina_unpack::unpack;
use tar::{EntryType, Header};

/// Writes tar entries with raw names, bypassing the `tar` crate's own path checks so
/// hostile names reach the unpacker exactly as an attacker would write them.
struct Tar(tar::Builder<Vec<u8>>);

impl Tar {
    fn new() -> Self {
        Tar(tar::Builder::new(Vec::new()))
    }

    fn entry(
        &mut self,
        kind: EntryType,
        name: &str,
        mode: u32,
        data: &[u8],
        link: Option<&str>,
    ) -> &mut Self {
        let mut h = Header::new_ustar();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(link) = link {
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(1000);
        h.set_gid(1001);
        h.set_mtime(1_600_000_000);
        h.set_size(data.len() as u64);
        h.set_cksum();
        self.0.append(&h, data).unwrap();
        self
    }

    fn dir(&mut self, name: &str) -> &mut Self {
        self.entry(EntryType::Directory, name, 0o755, b"", None)
    }

    fn file(&mut self, name: &str, data: &str) -> &mut Self {
        self.entry(EntryType::Regular, name, 0o644, data.as_bytes(), None)
    }

    fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.entry(EntryType::Symlink, name, 0o777, b"", Some(target))
    }

    fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.entry(EntryType::Link, name, 0o644, b"", Some(target))
    }

    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        self.0
            .append_pax_extensions(records.iter().copied())
            .unwrap();
        self
    }

    fn bytes(&mut self) -> Vec<u8> {
        std::mem::replace(&mut self.0, tar::Builder::new(Vec::new()))
            .into_inner()
            .unwrap()
    }
}

/// A scratch dir with the layer dir inside it, so escapes would land in `outside`.
fn scratch() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let layer = tmp.path().join("layer");
    fs::create_dir(&layer).unwrap();
    (tmp, layer)
}

fn outside_entries(tmp: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn regular_entries_keep_content_mode_owner_and_times() {
    let (_tmp, layer) = scratch();
    let tar = Tar::new()
        .dir("./bin/")
        .file("./bin/tool", "#!/bin/sh\n")
        .entry(EntryType::Regular, "bin/suid", 0o4755, b"x", None)
        .entry(EntryType::Directory, "tmp", 0o1777, b"", None)
        .symlink("bin/sh", "tool")
        .hardlink("bin/tool-link", "bin/tool")
        .entry(EntryType::Fifo, "run.fifo", 0o600, b"", None)
        .bytes();
    let summary = unpack(tar.as_slice(), &layer).unwrap();
    assert_eq!(summary.entries, 7);

    let tool = fs::metadata(layer.join("bin/tool")).unwrap();
    assert_eq!(
        fs::read_to_string(layer.join("bin/tool")).unwrap(),
        "#!/bin/sh\n"
    );
    assert_eq!(
        (tool.uid(), tool.gid(), tool.mtime()),
        (1000, 1001, 1_600_000_000)
    );
    assert_eq!(tool.permissions().mode() & 0o7777, 0o644);
    assert_eq!(tool.nlink(), 2, "hardlink shares the inode");
    assert_eq!(
        fs::metadata(layer.join("bin/suid"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o4755
    );
    assert_eq!(
        fs::metadata(layer.join("tmp"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o1777
    );
    assert_eq!(
        fs::read_link(layer.join("bin/sh")).unwrap(),
        Path::new("tool")
    );
    assert_eq!(
        fs::symlink_metadata(layer.join("bin/sh")).unwrap().uid(),
        1000
    );
    assert!(
        fs::metadata(layer.join("run.fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // Directory times are set after their children were created.
    assert_eq!(
        fs::metadata(layer.join("bin")).unwrap().mtime(),
        1_600_000_000
    );
}

#[test]
fn whiteouts_become_overlay_whiteouts_and_opaque_xattrs() {
    let (_tmp, layer) = scratch();
    let tar = Tar::new()
        .file("etc/.wh.gone", "")
        .dir("opq")
        .file("opq/.wh..wh..opq", "")
        .file("opq/new", "n")
        .file(".wh..wh.plnk", "")
        .bytes();
    unpack(tar.as_slice(), &layer).unwrap();

    let whiteout = fs::symlink_metadata(layer.join("etc/gone")).unwrap();
    assert!(whiteout.file_type().is_char_device());
    assert_eq!(whiteout.rdev(), 0);
    assert!(!layer.join("etc/.wh.gone").exists());
    assert_eq!(
        xattr(&layer.join("opq"), "trusted.overlay.opaque"),
        Some(b"y".to_vec())
    );
    assert!(!layer.join("opq/.wh..wh..opq").exists());
    assert!(!layer.join(".wh..wh.plnk").exists());
}

#[test]
fn pax_xattrs_are_applied_but_overlay_xattrs_are_dropped() {
    let (_tmp, layer) = scratch();
    let tar = Tar::new()
        .pax(&[
            ("SCHILY.xattr.user.lamina", b"hello"),
            ("SCHILY.xattr.trusted.overlay.redirect", b"/etc"),
        ])
        .file("data", "d")
        .bytes();
    unpack(tar.as_slice(), &layer).unwrap();
    assert_eq!(
        xattr(&layer.join("data"), "user.lamina"),
        Some(b"hello".to_vec())
    );
    assert_eq!(xattr(&layer.join("data"), "trusted.overlay.redirect"), None);
}

#[test]
fn dot_dot_entries_are_refused_and_write_nothing_outside() {
    let (tmp, layer) = scratch();
    let tar = Tar::new()
        .file("ok", "fine")
        .file("../escaped", "pwned")
        .bytes();
    let err = unpack(tar.as_slice(), &layer).unwrap_err().to_string();
    assert!(err.contains("`../escaped`") && err.contains(".."), "{err}");
    assert_eq!(outside_entries(tmp.path()), ["layer"]);

    let tar = Tar::new().file("a/../../escaped", "pwned").bytes();
    assert!(unpack(tar.as_slice(), &layer).is_err());
    let tar = Tar::new().file("/abs-escaped", "pwned").bytes();
    let err = unpack(tar.as_slice(), &layer).unwrap_err().to_string();
    assert!(err.contains("absolute"), "{err}");
    assert_eq!(outside_entries(tmp.path()), ["layer"]);
}

#[test]
fn writing_through_a_planted_symlink_is_refused() {
    for target in ["..", "/tmp", "../target-dir", "sub/../.."] {
        let (tmp, layer) = scratch();
        fs::create_dir(tmp.path().join("target-dir")).unwrap();
        let tar = Tar::new()
            .symlink("evil", target)
            .file("evil/pwned", "x")
            .bytes();
        let err = unpack(tar.as_slice(), &layer).unwrap_err().to_string();
        assert!(
            err.contains("`evil/pwned`") && err.contains("symlink"),
            "{target}: {err}"
        );
        assert_eq!(
            outside_entries(tmp.path()),
            ["layer", "target-dir"],
            "{target}"
        );
        assert_eq!(
            fs::read_dir(tmp.path().join("target-dir")).unwrap().count(),
            0
        );
    }
}

#[test]
fn whiteout_and_hardlink_through_symlinks_are_refused() {
    let (tmp, layer) = scratch();
    fs::write(tmp.path().join("victim"), "keep").unwrap();
    let tar = Tar::new()
        .symlink("up", "..")
        .file("up/.wh.victim", "")
        .bytes();
    assert!(unpack(tar.as_slice(), &layer).is_err());
    assert_eq!(
        fs::read_to_string(tmp.path().join("victim")).unwrap(),
        "keep"
    );

    let (tmp, layer) = scratch();
    fs::write(tmp.path().join("victim"), "keep").unwrap();
    let tar = Tar::new()
        .symlink("up", "..")
        .hardlink("stolen", "up/victim")
        .bytes();
    let err = unpack(tar.as_slice(), &layer).unwrap_err().to_string();
    assert!(err.contains("symlink"), "{err}");
    assert!(!layer.join("stolen").exists());
}

#[test]
fn escaping_and_missing_hardlinks_are_refused() {
    for (target, expect) in [
        ("../victim", ".."),
        ("/etc/passwd", "absolute"),
        ("nowhere", "does not exist"),
    ] {
        let (_tmp, layer) = scratch();
        let tar = Tar::new().hardlink("link", target).bytes();
        let err = unpack(tar.as_slice(), &layer).unwrap_err().to_string();
        assert!(
            err.contains("`link`") && err.contains(expect),
            "{target}: {err}"
        );
        assert!(!layer.join("link").exists());
    }
}

#[test]
fn later_entries_replace_earlier_ones() {
    let (_tmp, layer) = scratch();
    let tar = Tar::new()
        .file("x", "first")
        .file("x", "second")
        .symlink("y", "x")
        .file("y", "now a file")
        .dir("d")
        .dir("d")
        .bytes();
    unpack(tar.as_slice(), &layer).unwrap();
    assert_eq!(fs::read_to_string(layer.join("x")).unwrap(), "second");
    assert!(fs::symlink_metadata(layer.join("y")).unwrap().is_file());
    assert!(layer.join("d").is_dir());
}

#[test]
fn a_duplicate_that_changes_directory_into_file_is_refused() {
    let (_tmp, layer) = scratch();
    let tar = Tar::new()
        .dir("x")
        .file("x/inner", "i")
        .file("x", "now a file")
        .bytes();
    let err = unpack(tar.as_slice(), &layer).unwrap_err().to_string();
    assert_eq!(
        err,
        "entry `x`: appears earlier in this layer as a directory"
    );
    assert!(layer.join("x/inner").is_file(), "nothing was replaced");
}

#[test]
fn truncated_and_garbage_streams_fail_cleanly() {
    let (_tmp, layer) = scratch();
    let tar = Tar::new().file("big", &"z".repeat(10_000)).bytes();
    let err = unpack(&tar[..2000], &layer).unwrap_err().to_string();
    assert!(
        err.contains("big") || err.contains("reading layer tar"),
        "{err}"
    );
    let err = unpack(
        &b"this is not a tar archive at all, not even close....."[..],
        &layer,
    );
    assert!(err.is_err());
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let n = rustix::fs::lgetxattr(path, name, &mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}
