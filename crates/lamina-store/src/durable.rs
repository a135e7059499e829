//! Durable small-file writes: every file lamina reads back to know what the store holds
//! (the store marker, container records, pool targets, containerd snapshot metadata)
//! goes through [`write_durably`]. A plain write-then-rename can leave an empty or
//! truncated file after a crash (the rename reaches the disk before the data), and one
//! torn record used to wedge `list`, `check` and `clean` for the whole store.

use std::fs::{self, File, OpenOptions};
use std::path::Path;

use lamina_sys::{HostFs, RealHost};

use crate::StoreError;

/// Replaces `path` with `bytes` so that a crash at any point leaves either the previous
/// file whole or the new one whole: the bytes go to a temporary file beside it, which is
/// fsynced, renamed over `path`, and then the directory is fsynced so the rename itself
/// survives. On failure the temporary file is removed and `path` is untouched.
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_durably_with(&RealHost, path, bytes)
}

/// [`write_durably`] with the write and both fsyncs going through `host`, the kernel
/// seam: ENOSPC on the write and EIO on an fsync are what a full or failing disk says.
pub(crate) fn write_durably_with(
    host: &dyn HostFs,
    path: &Path,
    bytes: &[u8],
) -> Result<(), StoreError> {
    replace_with(host, path, bytes, Wait::ForDisk)
}

/// Writes `path`, which does not exist yet, whole or not at all for every process (a
/// temporary file renamed into place) without waiting for the disk: the write reaches it
/// with the filesystem's next commit (ext4 within 5 s, xfs within 30 s). After a host
/// crash inside that window the file is absent or empty, never torn below a page. A
/// create's first record is written this way; the device flush two fsyncs cost here
/// (0.4–1.4 ms, docs/store.md) is most of a create called as a process.
pub(crate) fn write_atomically_with(
    host: &dyn HostFs,
    path: &Path,
    bytes: &[u8],
) -> Result<(), StoreError> {
    replace_with(host, path, bytes, Wait::No)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    ForDisk,
    No,
}

fn replace_with(
    host: &dyn HostFs,
    path: &Path,
    bytes: &[u8],
    wait: Wait,
) -> Result<(), StoreError> {
    let dir = parent_of(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", crate::unique_suffix()));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(StoreError::io("writing", &tmp))
        .and_then(|file| {
            host.write_all(&file, &tmp, bytes)
                .and_then(|()| match wait {
                    Wait::ForDisk => host.fsync(&file, &tmp),
                    Wait::No => Ok(()),
                })
                .map_err(StoreError::errno("writing", &tmp))
        })
        .and_then(|()| fs::rename(&tmp, path).map_err(StoreError::io("replacing", path)));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    match wait {
        Wait::ForDisk => sync_dir_with(host, dir),
        Wait::No => Ok(()),
    }
}

/// Fsyncs a directory, making the renames and creations in it durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    sync_dir_with(&RealHost, dir)
}

fn sync_dir_with(host: &dyn HostFs, dir: &Path) -> Result<(), StoreError> {
    let file = File::open(dir).map_err(StoreError::io("syncing", dir))?;
    host.fsync(&file, dir)
        .map_err(StoreError::errno("syncing", dir))
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_file_is_whole_after_a_write_and_no_temporary_remains() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        let big = vec![b'x'; 256 * 1024];
        write_durably(&path, &big).unwrap();
        assert_eq!(fs::read(&path).unwrap(), big);
        assert_eq!(entries(dir.path()), ["record.json"]);
    }

    #[test]
    fn a_write_replaces_the_previous_contents_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        write_durably(&path, b"a much longer first version").unwrap();
        write_durably(&path, b"short").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"short");
        assert_eq!(entries(dir.path()), ["record.json"]);
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_and_the_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: a file cannot replace a non-empty directory.
        let path = dir.path().join("record.json");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), b"kept").unwrap();
        let err = write_durably(&path, b"new").unwrap_err();
        assert!(err.to_string().contains("record.json"), "{err}");
        assert_eq!(entries(dir.path()), ["record.json"]);
        assert_eq!(fs::read(path.join("keep")).unwrap(), b"kept");
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone").join("record.json");
        let err = write_durably(&path, b"x").unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }
}
