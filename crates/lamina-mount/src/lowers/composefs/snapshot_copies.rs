//! A one-time repair of stores whose composefs builds ran before builds copied committed
//! containerd snapshots' files: such a build made the snapshot file's own inode an
//! object, which the snapshot's container may still write through containerd's mount,
//! and every image holding that content reads the object. Before a store's first build
//! since, each object that is the inode of a committed snapshot's file is replaced by a
//! copy whose content is its name. Done once per store: the mark
//! `composefs/snapshot-objects-copied` records it.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use composefs::fsverity::FsVerityHashValue;
use lamina_store::Store;
use lamina_store::beneath::Tree;
use lamina_sys::HostFs;
use rustix::fs::FileType;

use crate::fsutil::entries;

/// The mark a store has been repaired.
const MARK: &str = "snapshot-objects-copied";

/// Replaces every object that is a committed snapshot's file by a copy (sealed with
/// fs-verity when `verity`), unless the store has been repaired already: one whose bytes
/// are no longer its name loses its name, so a build makes it again. One repair at a
/// time (lock `composefs-repair`, which also judges its copies in `tmp/`); what fails for
/// one object is logged and leaves the mark unwritten, so the next build tries again.
/// Returns how many objects were replaced or removed.
pub(crate) fn copy_snapshot_objects(
    store: &Store,
    host: &dyn HostFs,
    verity: bool,
) -> io::Result<usize> {
    let mark = store.layout().composefs().join(MARK);
    if mark.exists() {
        return Ok(0);
    }
    let _one = store.lock("composefs-repair").map_err(io::Error::other)?;
    if mark.exists() {
        return Ok(0);
    }
    let objects = objects_by_inode(&store.layout().objects())?;
    let mut repaired = 0;
    let mut failed = 0;
    if !objects.is_empty() {
        for layer in entries(&store.layout().layers()).map_err(io::Error::other)? {
            if !is_committed_snapshot(&layer) {
                continue;
            }
            let Ok(tree) = Tree::open(&layer.join("diff")) else {
                continue;
            };
            let mut found = Vec::new();
            tree.walk(|entry| {
                let st = entry.stat;
                if entry.kind() == FileType::RegularFile
                    && st.st_nlink > 1
                    && let Some(object) = objects.get(&(st.st_dev, st.st_ino))
                {
                    found.push(object.clone());
                }
                Ok(true)
            })?;
            for object in found {
                match repair(store, host, &object, verity) {
                    Ok(()) => repaired += 1,
                    Err(e) => {
                        failed += 1;
                        tracing::warn!(object = %object.display(), error = %e, "object of a committed snapshot not repaired: the next build tries again");
                    }
                }
            }
        }
    }
    if failed == 0 {
        lamina_store::write_durably(&mark, b"").map_err(io::Error::other)?;
    }
    if repaired > 0 {
        tracing::warn!(
            repaired,
            "objects that were committed snapshots' files replaced by copies"
        );
    }
    Ok(repaired)
}

/// Every object's path, by its device and inode.
fn objects_by_inode(objects: &Path) -> io::Result<HashMap<(u64, u64), PathBuf>> {
    let mut all = HashMap::new();
    for fan_out in entries(objects).map_err(io::Error::other)? {
        if !fan_out.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            continue;
        }
        for object in entries(&fan_out).map_err(io::Error::other)? {
            if let Ok(meta) = object.symlink_metadata()
                && meta.is_file()
            {
                all.insert((meta.dev(), meta.ino()), object);
            }
        }
    }
    Ok(all)
}

/// Whether the layer directory `layer` is a committed containerd snapshot; an
/// unreadable record is taken as one.
fn is_committed_snapshot(layer: &Path) -> bool {
    !lamina_store::LayerRecord::read(layer).is_ok_and(|record| record.imported())
}

/// Replaces `object` by a copy of its bytes when they are still its name, sealed when
/// `verity` (images built before keep mounting with `verity=require`); removes the name
/// when they are not (the snapshot's container wrote them), so no build refers to that
/// inode again and the next one makes the object anew.
fn repair(store: &Store, host: &dyn HostFs, object: &Path, verity: bool) -> io::Result<()> {
    let staging = store.layout().tmp().join(format!(
        "composefs-repair-{}",
        lamina_store::unique_suffix()
    ));
    let copied = File::open(object).and_then(|source| {
        let size = source.metadata()?.len();
        crate::lowers::composefs::objects::copy_and_hash(host, &source, size, &staging)
    });
    let outcome = copied.and_then(|(copy, id, _)| {
        let name = object
            .strip_prefix(store.layout().objects())
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        if name != id.to_object_pathname() {
            tracing::warn!(object = %object.display(), "object of a committed snapshot no longer holds its content: removed (`lamina check --verify` names the images that used it)");
            return fs::remove_file(object);
        }
        host.fsync(&copy, &staging)?;
        if verity {
            crate::lowers::composefs::seal(host, &staging)?;
        }
        fs::rename(&staging, object)
    });
    let _ = fs::remove_file(&staging);
    outcome
}
