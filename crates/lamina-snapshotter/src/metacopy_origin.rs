//! Where overlay finds the data of a metadata-only copy-up: the lookup a commit repeats
//! to fill one in (`complete.rs`).
//!
//! Overlay looks a path up one name at a time. A directory's lower layers are those in
//! which its name was found as a directory, top-most first. A redirect on a directory
//! (`trusted.overlay.redirect`, written when a directory is renamed: `mv a c` leaves `c`
//! redirecting to `a`) changes the name the layers below are asked for — a relative one
//! within the same parent, an absolute one from every layer's root. An opaque directory
//! hides the layers below it; a whiteout or any other non-directory ends the lookup. A
//! file copied up by metadata in a renamed directory has no redirect of its own: its
//! data is at the directory's old name (review finding: `mv a c; chmod 600 c/f` had
//! `c/f` filled from the lower's `c/f`, or refused when there was none).
//!
//! Every layer is reached beneath its root, no symlink followed (`beneath::Tree`), as
//! overlay follows none either.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use lamina_store::beneath::{Tree, proc_path};
use rustix::fs::FileType;
use rustix::io::Errno;

const REDIRECT: &str = "trusted.overlay.redirect";
const OPAQUE: &str = "trusted.overlay.opaque";

/// The name a layer is asked for: relative to the parent directory there, or from the
/// layer's root.
#[derive(Debug, Clone)]
enum Name {
    Relative(OsString),
    FromRoot(PathBuf),
}

/// One layer in which a directory was found, and its path there.
type Found = (usize, PathBuf);

/// The data of the metadata-only copy at `rel` in `upper` (whose own inode `pinned`
/// reaches), opened to read, from `lowers` (top-most first); `None` when no layer has it.
pub(crate) fn open_origin(
    upper: &Tree,
    rel: &Path,
    pinned: &Path,
    lowers: &[Tree],
) -> io::Result<Option<File>> {
    let names: Vec<&OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::other(format!(
                "{}: not a plain path",
                rel.display()
            ))),
        })
        .collect::<io::Result<_>>()?;
    let Some((file_name, dir_names)) = names.split_last() else {
        return Ok(None);
    };
    let root: Vec<Found> = (0..lowers.len()).map(|i| (i, PathBuf::new())).collect();
    let mut stack = root.clone();
    let mut at = PathBuf::new();
    for dir_name in dir_names {
        at.push(dir_name);
        let (dir, _) = upper.pin(&at)?;
        if marked(&dir, OPAQUE)? {
            return Ok(None);
        }
        let name = asked_for(&proc_path(&dir), dir_name)?;
        stack = match look_up(lowers, &root, &stack, name, true)? {
            Lookup::Dirs(found) => found,
            Lookup::File(_) | Lookup::Nothing => return Ok(None),
        };
    }
    let name = asked_for(pinned, file_name)?;
    match look_up(lowers, &root, &stack, name, false)? {
        Lookup::File(file) => Ok(Some(file)),
        Lookup::Dirs(_) | Lookup::Nothing => Ok(None),
    }
}

/// What one name's lookup in the layers found.
enum Lookup {
    /// The layers in which it is a directory, top-most first.
    Dirs(Vec<Found>),
    /// The top-most layer's regular file, opened to read.
    File(File),
    Nothing,
}

/// Looks `name` up in the layers of `parents` (those the parent directory was found in),
/// or in every layer's root from an absolute redirect on: the directories it is, or the
/// file it is (`dir` false).
fn look_up(
    lowers: &[Tree],
    root: &[Found],
    parents: &[Found],
    mut name: Name,
    dir: bool,
) -> io::Result<Lookup> {
    let mut stack: Vec<Found> = match name {
        Name::FromRoot(_) => root.to_vec(),
        Name::Relative(_) => parents.to_vec(),
    };
    let mut found = Vec::new();
    let mut k = 0;
    while let Some((layer, parent)) = stack.get(k).cloned() {
        k += 1;
        let path = match &name {
            Name::Relative(n) => parent.join(n),
            Name::FromRoot(p) => p.clone(),
        };
        let (fd, stat) = match lowers[layer].pin(&path) {
            Ok(pinned) => pinned,
            Err(e) if matches!(Errno::from_io_error(&e), Some(Errno::NOENT | Errno::NOTDIR)) => {
                continue;
            }
            // A symlink on the way: overlay would not go through it either.
            Err(e) if Errno::from_io_error(&e) == Some(Errno::LOOP) => break,
            Err(e) => return Err(e),
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory if dir => {
                found.push((layer, path));
                if marked(&fd, OPAQUE)? {
                    break;
                }
                if let Some(redirect) = redirect_of(&proc_path(&fd))? {
                    let absolute = matches!(redirect, Name::FromRoot(_));
                    name = redirect;
                    if absolute {
                        // The layers below this one, each from its root.
                        stack = root[layer + 1..].to_vec();
                        k = 0;
                    }
                }
            }
            FileType::RegularFile if !dir => {
                return Ok(Lookup::File(File::open(proc_path(&fd))?));
            }
            // A whiteout, or a name of another type: what is below is hidden.
            _ => break,
        }
    }
    Ok(if found.is_empty() {
        Lookup::Nothing
    } else {
        Lookup::Dirs(found)
    })
}

/// The name the layers below are asked for: the entry's redirect, else its own name.
fn asked_for(pinned: &Path, own: &OsStr) -> io::Result<Name> {
    Ok(redirect_of(pinned)?.unwrap_or_else(|| Name::Relative(own.to_os_string())))
}

/// The redirect of the entry `pinned` reaches, if it has one. One that is not a plain
/// name or a plain path from the root (`..`, `.`) is refused: the kernel writes none.
fn redirect_of(pinned: &Path) -> io::Result<Option<Name>> {
    let mut buf = vec![0u8; 4096];
    let len = match rustix::fs::getxattr(pinned, REDIRECT, &mut buf) {
        Ok(len) => len,
        Err(Errno::NODATA) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let raw = OsStr::from_bytes(&buf[..len]);
    let path = Path::new(raw);
    let plain = |p: &Path| p.components().all(|c| matches!(c, Component::Normal(_)));
    let name = match path.strip_prefix("/") {
        Ok(from_root) if plain(from_root) && !from_root.as_os_str().is_empty() => {
            Name::FromRoot(from_root.to_path_buf())
        }
        Err(_) if plain(path) && path.components().count() == 1 => {
            Name::Relative(raw.to_os_string())
        }
        _ => {
            return Err(io::Error::other(format!(
                "redirect {:?} is neither a name nor a path from the root",
                raw
            )));
        }
    };
    Ok(Some(name))
}

/// Whether the entry `fd` pins has xattr `name` set to `y` (overlay's opaque mark).
fn marked(fd: &OwnedFd, name: &str) -> io::Result<bool> {
    let mut buf = [0u8; 1];
    match rustix::fs::getxattr(proc_path(fd), name, &mut buf) {
        Ok(1) => Ok(buf[0] == b'y'),
        Ok(_) | Err(Errno::NODATA) | Err(Errno::RANGE) => Ok(false),
        Err(e) => Err(e.into()),
    }
}
