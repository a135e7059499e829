//! Making an upper directory a self-contained layer before a commit publishes it.
//!
//! With `metacopy=on` (stall S3), a chown or chmod copies up only a file's metadata: the
//! upper file is sparse, marked `trusted.overlay.metacopy`, and its data stays in a lower
//! layer (found at the same path, or where `trusted.overlay.redirect` points). As a layer,
//! such a file would read as holes under any overlay mounted without metacopy, so a commit
//! first copies each one's data in from the layers below and drops the markers — only
//! for the files that were metadata-copied, which is what metacopy saved in the first
//! place.

use std::fs::{self, File, FileTimes, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

const METACOPY: &str = "trusted.overlay.metacopy";
const REDIRECT: &str = "trusted.overlay.redirect";

/// Fills every metadata-only copy under `upper` with its data from `lowers` (top-most
/// first), keeping its times; returns how many it filled.
pub(crate) fn complete_metacopies(upper: &Path, lowers: &[PathBuf]) -> io::Result<usize> {
    let mut filled = 0;
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        for entry in fs::read_dir(upper.join(&rel))? {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(rel);
            } else if kind.is_file() && has_xattr(&upper.join(&rel), METACOPY)? {
                fill(upper, &rel, lowers)?;
                filled += 1;
            }
        }
    }
    Ok(filled)
}

fn fill(upper: &Path, rel: &Path, lowers: &[PathBuf]) -> io::Result<()> {
    let path = upper.join(rel);
    let origin = data_path(&path, rel)?;
    let source = lowers
        .iter()
        .map(|lower| lower.join(&origin))
        .find(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{}: metadata-only copy whose data ({}) no lower layer has",
                    path.display(),
                    origin.display()
                ),
            )
        })?;
    let before = fs::symlink_metadata(&path)?;
    let mut data = File::open(&source)?;
    let mut file = OpenOptions::new().write(true).open(&path)?;
    io::copy(&mut data, &mut file)?;
    file.set_len(data.metadata()?.len())?;
    file.set_times(
        FileTimes::new()
            .set_accessed(before.accessed()?)
            .set_modified(before.modified()?),
    )?;
    file.sync_all()?;
    for name in [METACOPY, REDIRECT] {
        match rustix::fs::lremovexattr(&path, name) {
            Ok(()) | Err(rustix::io::Errno::NODATA) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Where the data of the metadata-only copy at `rel` lives in the layers below: an
/// absolute redirect is from the layer root, a relative one names a file beside it.
fn data_path(path: &Path, rel: &Path) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; 4096];
    let redirect = match rustix::fs::lgetxattr(path, REDIRECT, &mut buf) {
        Ok(len) => String::from_utf8_lossy(&buf[..len]).into_owned(),
        Err(rustix::io::Errno::NODATA) => return Ok(rel.to_path_buf()),
        Err(e) => return Err(e.into()),
    };
    Ok(match redirect.strip_prefix('/') {
        Some(from_root) => PathBuf::from(from_root),
        None => rel.with_file_name(redirect),
    })
}

fn has_xattr(path: &Path, name: &str) -> io::Result<bool> {
    match rustix::fs::lgetxattr(path, name, &mut [0u8; 0][..]) {
        Ok(_) | Err(rustix::io::Errno::RANGE) => Ok(true),
        Err(rustix::io::Errno::NODATA) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
