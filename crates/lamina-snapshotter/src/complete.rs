//! Making an upper directory a self-contained layer before a commit publishes it.
//!
//! With `metacopy=on` (stall S3), a chown or chmod copies up only a file's metadata: the
//! upper file is sparse, marked `trusted.overlay.metacopy`, and its data stays in a lower
//! layer (found at the same path, or where `trusted.overlay.redirect` points). As a layer,
//! such a file would read as holes under any overlay mounted without metacopy, so a commit
//! first copies each one's data in from the layers below and drops the markers — only
//! for the files that were metadata-copied, which is what metacopy saved in the first
//! place.

use std::ffi::OsStr;
use std::fs::{File, FileTimes};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use lamina_store::beneath::{Tree, proc_path};
use lamina_sys::{At, HostFs};
use rustix::fs::FileType;
use rustix::io::Errno;

use crate::metacopy_origin::{METACOPY, REDIRECT, has};

/// Fills every metadata-only copy under `upper` with its data from `lowers` (top-most
/// first), keeping its times; returns how many it filled.
///
/// The upper may still be written through a mount containerd made (a commit of a running
/// container's snapshot), so nothing is reached by a path a container could redirect:
/// the upper and each lower are walked and opened beneath their roots, no symlink
/// followed, and a file is written only once it is known to be the regular file it was
/// listed as (`lamina_store::beneath`). A file gone or replaced since it was listed is
/// what the container did meanwhile, and is left to it. Each copy's data is looked up as
/// overlay looks it up (`metacopy_origin.rs`).
pub(crate) fn complete_metacopies(
    host: &dyn HostFs,
    upper: &Path,
    lowers: &[PathBuf],
    objects: Option<&Path>,
) -> io::Result<usize> {
    let upper = Tree::open(upper)?;
    let lowers = lowers
        .iter()
        .map(|lower| Tree::open(lower))
        .collect::<io::Result<Vec<_>>>()?;
    let objects = objects.map(Tree::open).transpose()?;
    let mut filled = 0;
    let whole = upper.walk(|entry| {
        if entry.kind() != FileType::RegularFile {
            return Ok(true);
        }
        // Pinned, then looked at: the type the walk saw may have changed since.
        let (pinned, stat) = match entry.pin() {
            Ok(pinned) => pinned,
            Err(e)
                if matches!(
                    Errno::from_io_error(&e),
                    Some(Errno::NOENT | Errno::LOOP | Errno::NOTDIR)
                ) =>
            {
                return Ok(true);
            }
            Err(e) => return Err(e),
        };
        let regular = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
        if regular && has(host, &pinned, METACOPY)? {
            fill(
                host,
                &upper,
                &entry.rel(),
                &pinned,
                &lowers,
                objects.as_ref(),
            )?;
            filled += 1;
        }
        Ok(true)
    })?;
    // What was skipped may hold a copy left unfilled: a layer of holes is worse than no
    // commit. Only a tree changed while it was walked, or deeper than the walk goes,
    // has anything skipped.
    if !whole {
        return Err(io::Error::other(format!(
            "{}: changed while it was committed, or deeper than {} directories",
            upper.path().display(),
            lamina_store::beneath::MAX_DEPTH
        )));
    }
    Ok(filled)
}

/// Copies the data of the metadata-only copy `rel` (reached as `pinned`) in from the
/// layer below that has it, and drops its markers.
fn fill(
    host: &dyn HostFs,
    upper: &Tree,
    rel: &Path,
    pinned: &OwnedFd,
    lowers: &[Tree],
    objects: Option<&Tree>,
) -> io::Result<()> {
    let mut data = crate::metacopy_origin::open_origin(host, upper, rel, pinned, lowers, objects)?
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{}: metadata-only copy whose data no lower layer has",
                    upper.path().join(rel).display()
                ),
            )
        })?;
    let path = proc_path(pinned);
    let before = std::fs::metadata(&path)?;
    // The pinned inode is a regular file (checked on its descriptor): no device opens.
    let mut file = File::options().write(true).open(&path)?;
    io::copy(&mut data, &mut file)?;
    file.set_len(data.metadata()?.len())?;
    file.set_times(
        FileTimes::new()
            .set_accessed(before.accessed()?)
            .set_modified(before.modified()?),
    )?;
    host.fsync(&file, &path)?;
    for name in [METACOPY, REDIRECT] {
        host.remove_xattr(At::Fd(file.as_fd()), OsStr::new(name))?;
    }
    Ok(())
}
