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
    let dir = parent_of(path);
    let tmp = temporary_beside(path);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(StoreError::io("writing", &tmp))
        .and_then(|file| {
            host.write_all(&file, &tmp, bytes)
                .and_then(|()| host.fsync(&file, &tmp))
                .map_err(StoreError::errno("writing", &tmp))
        })
        .and_then(|()| fs::rename(&tmp, path).map_err(StoreError::io("replacing", path)));
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir_with(host, dir)
}

/// Writes `path`, which does not exist yet (a create's first container record), whole for
/// every process and for every crash, without the two device flushes of
/// [`write_durably`] where the filesystem allows. On ext4 and xfs it is a symlink whose
/// target is `bytes` ([`HostFs::write_new_symlink`]): the journal logs the target with
/// the name, so after a crash the record is absent (nothing logged after it survived
/// either: no container fsync, no later record) or whole, and no byte goes to the device
/// now. Too long for a symlink there, the bytes go to a temporary file with `O_DIRECT`
/// ([`HostFs::write_new_direct`]) renamed into place, whose size the journal holds ahead
/// of the rename: never the empty file a buffered write leaves when a container's own
/// fsync commits the rename first. Elsewhere this is [`write_durably`]. The flushes cost
/// 0.4–1.6 ms here, most of a create called as a process (docs/store.md).
///
/// `symlink`: the store's readers take a symlink record ([`crate::Store::symlink_records`]).
/// A symlink refused for any reason (a security module's policy, say) falls back too.
pub(crate) fn write_new_with(
    host: &dyn HostFs,
    path: &Path,
    bytes: &[u8],
    symlink: bool,
) -> Result<(), StoreError> {
    if symlink && let Ok(true) = host.write_new_symlink(path, bytes) {
        return Ok(());
    }
    let tmp = temporary_beside(path);
    match host.write_new_direct(&tmp, bytes) {
        Ok(true) => fs::rename(&tmp, path).map_err(|e| {
            let _ = fs::remove_file(&tmp);
            StoreError::io("replacing", path)(e)
        }),
        Ok(false) => write_durably_with(host, path, bytes),
        Err(e) => Err(StoreError::errno("writing", &tmp)(e)),
    }
}

fn temporary_beside(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent_of(path).join(format!(".{name}.{}.tmp", crate::unique_suffix()))
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

    /// The order is the durability argument: the data is synced before the rename names
    /// it, and the directory after the rename, or the rename may not survive a crash.
    #[test]
    fn the_file_is_synced_before_the_rename_and_its_directory_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        let fake = lamina_sys::FakeMounter::new();
        write_durably_with(&fake, &path, b"{}").unwrap();
        let syncs: Vec<std::path::PathBuf> = fake
            .calls()
            .into_iter()
            .filter_map(|call| match call {
                lamina_sys::FakeCall::Fsync(p) => Some(p),
                _ => None,
            })
            .collect();
        assert_eq!(syncs.len(), 2, "{syncs:?}");
        assert_ne!(
            syncs[0], path,
            "the temporary file is synced, not the target"
        );
        assert_eq!(syncs[0].parent(), Some(dir.path()));
        assert_eq!(syncs[1], dir.path(), "the directory, after the rename");
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
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

    /// On ext4 and xfs the file is written with O_DIRECT and padded with spaces to whole
    /// blocks; elsewhere it is [`write_durably`]'s. Either way it reads back as the bytes,
    /// and JSON parsers take the padding as the whitespace it is.
    #[test]
    fn a_new_file_reads_back_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("container.json");
        let json =
            serde_json::to_vec(&serde_json::json!({"id": "c", "big": "x".repeat(9000)})).unwrap();
        write_new_with(&RealHost, &path, &json, true).unwrap();
        let read = fs::read(&path).unwrap();
        assert!(read.starts_with(&json));
        assert!(read[json.len()..].iter().all(|&b| b == b' '));
        let value: serde_json::Value = serde_json::from_slice(&read).unwrap();
        assert_eq!(value["id"], "c");
        assert_eq!(entries(dir.path()), ["container.json"]);
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone").join("record.json");
        let err = write_durably(&path, b"x").unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }
}
