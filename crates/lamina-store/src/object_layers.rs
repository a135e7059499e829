//! Layers stored as metadata plus objects (a store made with `init-store --layer-data
//! objects`): each content once on any filesystem, and no inode shared between images.
//!
//! Once a staged layer's data is durable, each of its regular files of more than
//! composefs's inline limit that is not part of a hardlink set moves, inode and all, to
//! `objects/<ab>/<20 base64url>`, named by the first 16 bytes of its fs-verity digest,
//! unless an object of that name already holds the same bytes (compared, not assumed).
//! Its place in the layer takes a **stub**: a new inode with the file's owner, mode,
//! times, xattrs and size, no data blocks, and overlay's metacopy and redirect xattrs
//! naming the object. Overlay mounted with `metacopy=on` and `objects/` as a data-only
//! lower shows the stub's metadata with the object's data; every view of the layer sees
//! its own inode's link count and change time, never another image's.
//!
//! The short name exists for ext4: a redirect of up to 24 bytes fits in a 256-byte
//! inode beside the metacopy mark, so a stub costs an inode and no block (a 66-byte
//! composefs name takes a 4 KiB xattr block per file). 128 bits name the content; the
//! byte comparison keeps a colliding file its own.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use base64::Engine;
use composefs::fsverity::FsVerityHashValue;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, Timestamps};

use lamina_sys::{At, HostFs};

use crate::beneath::{Tree, resolve_from};
use crate::file_objects::{ObjectId, times_of};

/// Overlay's mark of a file whose data lives in a lower layer below.
pub const METACOPY_XATTR: &str = "trusted.overlay.metacopy";
/// Where, in a data-only lower, that data is.
pub const REDIRECT_XATTR: &str = "trusted.overlay.redirect";

/// Base64url characters of an object's short name after its fan-out directory: 15
/// digest bytes, with the fan-out's one byte 128 bits.
const SHORT_CHARS: usize = 20;

/// What moving a layer's data did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Files that became stubs, and their bytes.
    pub files: usize,
    pub bytes: u64,
    /// Of those, files whose content an object already held (their own copy dropped).
    pub deduplicated: usize,
}

/// `objects/`-relative name of the object a stub of content `id` redirects to.
pub fn short_name(id: &ObjectId) -> String {
    let hex = id.to_hex();
    let bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect();
    format!(
        "{:02x}/{}",
        bytes[0],
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes[1..16])
    )
}

/// The redirect a stub of content `id` carries: its short name from the data-only
/// lower's root.
fn redirect(id: &ObjectId) -> String {
    format!("/{}", short_name(id))
}

/// The `objects/`-relative name a stub's redirect value names, if it is one this module
/// writes (anything else is refused, never followed: it came from a store record).
pub fn object_of_redirect(value: &[u8]) -> Option<PathBuf> {
    let rest = value.strip_prefix(b"/")?;
    let (fan_out, name) = (rest.get(..2)?, rest.get(3..)?);
    let b64 = |b: &u8| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_';
    (rest.len() == 3 + SHORT_CHARS
        && rest[2] == b'/'
        && is_fan_out_name(fan_out)
        && name.iter().all(b64))
    .then(|| PathBuf::from(OsStr::from_bytes(rest)))
}

/// Whether the layer tree `diff` has, at its root, an entry named as a fan-out of
/// `objects/` (two lowercase hex digits). Overlay looks a stub's redirect up in the
/// regular layers below the stub's before the data-only one, so a file at
/// `<ab>/<name>` there would be read in place of the object: a layer below such a tree
/// keeps its files' data (an unreadable tree counts as one).
pub fn could_shadow_objects(diff: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(diff) else {
        return true;
    };
    entries
        .into_iter()
        .any(|entry| entry.map_or(true, |e| is_fan_out_name(e.file_name().as_bytes())))
}

/// Whether `name` is an `objects/` fan-out's: two lowercase hex digits.
fn is_fan_out_name(name: &[u8]) -> bool {
    name.len() == 2
        && name
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// The object a layer file is a stub of (`objects/`-relative), or `None` for a file
/// holding its own data. A stub is what overlay takes for one: both marks. An unreadable
/// or foreign redirect is an error naming it.
pub fn stub_object(host: &dyn HostFs, at: At<'_>) -> io::Result<Option<PathBuf>> {
    let Some(value) = host.get_xattr(at, OsStr::new(REDIRECT_XATTR))? else {
        return Ok(None);
    };
    if host.get_xattr(at, OsStr::new(METACOPY_XATTR))?.is_none() {
        return Ok(None);
    }
    object_of_redirect(&value).map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a layer file's redirect `{}` names no object",
                String::from_utf8_lossy(&value)
            ),
        )
    })
}

/// Moves the data of `files` (each a path in the staged layer `diff`, its link count
/// and its fs-verity digest) into `objects`, leaving stubs, each made in the empty
/// directory `stubs` (outside the tree, on its filesystem: no name of the layer's is
/// ever in the way) and renamed into its file's place. Called once the layer's data is
/// durable (an object's name must never exist before its content is on disk); the
/// caller keeps objects from being collected until the layer is published, and makes
/// the stubs durable with it. A failure fails the import, whose staging is removed.
pub fn move_data(
    host: &dyn HostFs,
    diff: &Path,
    stubs: &Path,
    objects: &Path,
    files: &[(PathBuf, u64, ObjectId)],
) -> io::Result<Moved> {
    let tree = Tree::open(diff)?;
    let objects_dir = Tree::open(objects)?;
    let stubs = Tree::open(stubs)?;
    let stubs = stubs.root();
    let mut moved = Moved::default();
    let mut dir_times: HashMap<PathBuf, Timestamps> = HashMap::new();
    let mut fan_outs = std::collections::HashSet::new();
    let mut open_dir: Option<(PathBuf, rustix::fd::OwnedFd)> = None;
    for (rel, nlink, id) in files {
        // A hardlink set keeps its one inode (the image's own hardlinks).
        if *nlink != 1 {
            continue;
        }
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        // The walk lists a directory's files together: its descriptor is opened once
        // for them, not walked to from the root for each.
        if open_dir.as_ref().is_none_or(|(path, _)| path != parent) {
            let fd = resolve_from(tree.root(), parent, OFlags::RDONLY | OFlags::DIRECTORY)?;
            open_dir = Some((parent.to_path_buf(), fd));
        }
        let Some((_, dir)) = &open_dir else {
            continue;
        };
        if let std::collections::hash_map::Entry::Vacant(e) = dir_times.entry(parent.into()) {
            e.insert(times_of(&rustix::fs::fstat(dir)?));
        }
        let short = short_name(id);
        let fan_out = &short[..2];
        if fan_outs.insert(fan_out.to_string()) {
            match rustix::fs::mkdirat(objects_dir.root(), fan_out, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let file = File::from(rustix::fs::openat(
            dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?);
        let stat = rustix::fs::fstat(&file)?;
        let stub = make_stub(host, stubs, &file, &stat, id)?;
        let deduplicated = match rustix::fs::renameat_with(
            dir,
            name,
            objects_dir.root(),
            short.as_str(),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => false,
            Err(rustix::io::Errno::EXIST) => {
                let object = objects_dir.open_regular(Path::new(&short))?;
                if !crate::file_objects::same_bytes(&file, &object)? {
                    // Another content under the name (a collision, or a damaged object):
                    // the file keeps its own data.
                    rustix::fs::unlinkat(stubs, STUB_NAME, AtFlags::empty())?;
                    continue;
                }
                true
            }
            Err(e) => {
                let _ = rustix::fs::unlinkat(stubs, STUB_NAME, AtFlags::empty());
                return Err(e.into());
            }
        };
        drop(stub);
        rustix::fs::renameat(stubs, STUB_NAME, dir, name)?;
        moved.files += 1;
        moved.bytes += stat.st_size as u64;
        moved.deduplicated += usize::from(deduplicated);
    }
    // The renames changed the directories' times, which containers see: put them back.
    for (rel, times) in dir_times {
        let dir = resolve_from(tree.root(), &rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
        rustix::fs::futimens(&dir, &times)?;
    }
    Ok(moved)
}

/// The name a stub is made under, in the stubs directory, before it takes its file's
/// place.
const STUB_NAME: &str = "stub";

/// Makes, at [`STUB_NAME`] in `dir`, the stub of `file` (`stat`, content `id`).
fn make_stub(
    host: &dyn HostFs,
    dir: BorrowedFd<'_>,
    file: &File,
    stat: &rustix::fs::Stat,
    id: &ObjectId,
) -> io::Result<File> {
    let stub = File::from(rustix::fs::openat(
        dir,
        STUB_NAME,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?);
    let made = (|| -> io::Result<()> {
        rustix::fs::ftruncate(&stub, stat.st_size as u64)?;
        let at = At::Fd(stub.as_fd());
        // A default ACL above would have given the new inode an access ACL the file
        // never had.
        match host.remove_xattr(at, OsStr::new("system.posix_acl_access")) {
            Ok(()) | Err(lamina_sys::Errno::NODATA | lamina_sys::Errno::NOTSUP) => {}
            Err(e) => return Err(e.into()),
        }
        // Owner before mode (a chown clears set-id bits), xattrs after both (a chown
        // clears file capabilities), times last.
        host.chown(at, stat.st_uid, stat.st_gid)?;
        host.set_mode(at, stat.st_mode & 0o7777)?;
        for (name, value) in crate::file_objects::xattrs(host, file.as_fd())? {
            host.set_xattr(at, &name, &value)?;
        }
        host.set_xattr(at, OsStr::new(METACOPY_XATTR), b"")?;
        host.set_xattr(at, OsStr::new(REDIRECT_XATTR), redirect(id).as_bytes())?;
        rustix::fs::futimens(&stub, &times_of(stat))?;
        Ok(())
    })();
    if let Err(e) = made {
        let _ = rustix::fs::unlinkat(dir, STUB_NAME, AtFlags::empty());
        return Err(e);
    }
    Ok(stub)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_name_fits_in_an_ext4_inode_and_reads_back() {
        let id = ObjectId::from_hex("ab".repeat(32)).unwrap();
        let redirect = redirect(&id);
        assert!(redirect.len() <= 24, "{redirect}");
        assert_eq!(
            object_of_redirect(redirect.as_bytes()),
            Some(PathBuf::from(short_name(&id)))
        );
        for foreign in [
            "/ab/../../etc/passwd1234",
            "ab/qwertyuiopasdfghjklz",
            "/AB/qwertyuiopasdfghjklz",
            "/ab/qwertyuiopasdfghjkl",
            "/ab/qwertyuiopasdfghjk/z",
        ] {
            assert_eq!(object_of_redirect(foreign.as_bytes()), None, "{foreign}");
        }
    }
}
