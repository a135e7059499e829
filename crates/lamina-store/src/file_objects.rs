//! Each file's content stored once, whatever layer or image it came from (issue 24), in
//! a store initialised with `--share-file-content`.
//!
//! When a layer is imported, every regular file of more than composefs's inline limit is
//! hashed (its fs-verity digest, which names objects in `objects/<ab>/<62 hex>`). A file
//! whose content is already an object, with the very same owner, mode, modification time
//! and xattrs, becomes a hardlink to that object's inode: the store then holds that
//! content once on every filesystem, ext4 included, and every strategy — classic layers,
//! `direct`, composefs — reads the one copy (and caches it once). A file whose content is
//! no object yet becomes one, once the layer's data is durable.
//!
//! Linking two files into one inode must never show a container a hardlink its image
//! does not have (`find -samefile`, `tar`'s and `du`'s hardlink detection would see it).
//! A container's view is always one chain of layers (a layer and the layers below it), so
//! two files may share an inode only if neither's layer lies below the other's. A layer
//! therefore records the digests of all its files ([`MANIFEST`]), and an import links a
//! file only if no layer below it, and no earlier file of its own layer, has that
//! content. A layer above one without a manifest (from a store or a release before
//! this, a committed containerd snapshot, one past [`MAX_FILES`], one whose import
//! failed) neither links nor publishes: what it could share an inode with is not known.
//! Hashing needs nothing from below, so it runs before the wait for the layers below
//! (an import unpacks three at once), and a layer with nothing to link does not wait.
//!
//! Every object is the inode of a file lamina imported and verified (with or without a
//! manifest), or a copy: a composefs build copies a committed containerd snapshot's file
//! instead of linking it, as a snapshot's upper, which its container may still write
//! through containerd's mount, must not become other images' verified files. Nothing
//! writes an imported layer's files. Linking to an inode of a layer without a manifest
//! keeps the rule above: no layer above that one links, and the layers below it were
//! imported before it.
//!
//! A linked file is compared byte for byte with the object first: an object is named by
//! its content, but a damaged or altered object must not become part of a layer whose
//! digest was just verified.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use composefs::fsverity::{FsVerityHashValue, FsVerityHasher, Sha256HashValue};
use rustix::fs::{AtFlags, FileType, OFlags, Stat, Timestamps};

use lamina_sys::{At, HostFs};

use crate::beneath::{Tree, resolve_from};

/// A file's content name: its fs-verity digest (SHA-256, 4 KiB blocks), as composefs
/// names objects.
pub type ObjectId = Sha256HashValue;

/// The digests of one layer's files.
pub type Digests = HashSet<ObjectId>;

/// The file beside a layer's `diff/` that lists its files' digests.
pub const MANIFEST: &str = "file-digests";

/// The manifest's first line: what it is and its format.
const HEADER: &str = "lamina file digests 1";

/// The largest manifest read (a layer of 4 million distinct files); a bigger one is
/// taken as unknown.
const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// Links past which an object's inode is not linked again: ext4 allows 65 000, and a
/// `direct` image's flattened tree links the same inodes once more per image.
const MAX_LINKS: u64 = 30_000;

/// The smallest file stored as an object: composefs keeps smaller ones in its metadata
/// image, and for such files a link saves nothing.
const SMALLEST: i64 = composefs::INLINE_CONTENT_MAX_V0 as i64 + 1;

/// What [`link`] did to a staged layer, and what is left to do once its data is durable.
#[derive(Debug, Default)]
pub struct Staged {
    /// The digest of every file of [`SMALLEST`] bytes or more: the layer's manifest.
    pub digests: Digests,
    /// Files whose content is no object yet, to be published as objects ([`publish`]).
    /// Empty where what lies below the layer is not known.
    pub to_publish: Vec<(PathBuf, ObjectId)>,
    /// Files whose data moves to `objects/` once the layer's data is durable, leaving
    /// stubs (a store whose layers keep their data there: `object_layers.rs`).
    pub to_move: Vec<(PathBuf, u64, ObjectId)>,
    /// Files that became links to an existing object, and their bytes.
    pub linked: usize,
    pub linked_bytes: u64,
}

/// Files [`hash`] looks at in one layer, and bytes of their paths it keeps: past
/// either, the layer is left as it is, without a manifest (so nothing above it links
/// either). A tar of a few megabytes can hold a million small files under a deep directory
/// (200 000 such paths take 800 MB).
const MAX_FILES: usize = 1_000_000;
const MAX_PATH_BYTES: usize = 64 << 20;

/// A staged layer's files, hashed: what [`link`] decides on.
#[derive(Debug, Default)]
pub struct Hashed {
    /// The digest of every file of [`SMALLEST`] bytes or more: the layer's manifest.
    pub digests: Digests,
    /// Each file's path in the layer, link count and digest, in the order walked.
    files: Vec<(PathBuf, u64, ObjectId)>,
}

impl Hashed {
    /// Whether the layer has no file an object could be made of.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Adds the file at `rel` (its inode's first name), of `nlink` links and content `id`.
    pub(crate) fn push(&mut self, rel: PathBuf, nlink: u64, id: ObjectId) {
        self.digests.insert(id.clone());
        self.files.push((rel, nlink, id));
    }

    /// The layer's manifest, and each file's path in the layer, link count and digest,
    /// in the order walked.
    pub fn into_parts(self) -> (Digests, Vec<(PathBuf, u64, ObjectId)>) {
        (self.digests, self.files)
    }
}

/// Whether a regular file of `size` bytes becomes an object (composefs keeps smaller
/// ones inline).
pub(crate) fn is_object_sized(size: i64) -> bool {
    size >= SMALLEST
}

/// Hashes the files of the staged layer `diff`, each inode once: done before anything
/// below the layer is known, so three layers of an import hash at once. `None` when the
/// layer is past [`MAX_FILES`] or [`MAX_PATH_BYTES`], or a directory changed under the
/// walk. Stops when `cancelled` (the import is being given up).
pub fn hash(diff: &Path, cancelled: &AtomicBool) -> io::Result<Option<Hashed>> {
    let tree = Tree::open(diff)?;
    let mut hashed = Hashed::default();
    let mut inodes = HashSet::new();
    let mut path_bytes = 0;
    let walked = tree.walk(|entry| {
        let st = entry.stat;
        if entry.kind() != FileType::RegularFile
            || st.st_size < SMALLEST
            || !inodes.insert((st.st_dev, st.st_ino))
        {
            return Ok(true);
        }
        if cancelled.load(Ordering::Relaxed) {
            return Err(io::Error::other("the import is being given up"));
        }
        let rel = entry.rel();
        path_bytes += rel.as_os_str().len();
        if hashed.files.len() >= MAX_FILES || path_bytes > MAX_PATH_BYTES {
            return Err(io::Error::other(PastBounds));
        }
        let id = hash_entry(&tree, entry)?;
        hashed.digests.insert(id.clone());
        hashed.files.push((rel, st.st_nlink, id));
        Ok(true)
    });
    match walked {
        Ok(true) => Ok(Some(hashed)),
        Ok(false) => Ok(None),
        Err(e) if e.get_ref().is_some_and(|inner| inner.is::<PastBounds>()) => {
            tracing::info!(layer = %diff.display(), "layer past what file objects stage: its files stay its own");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Links to an object in `objects` each file of the hashed layer `diff` it may (see
/// the module's doc), and lists those whose content is no object yet; `below` holds the
/// manifests of every layer under this one.
pub fn link(
    host: &dyn HostFs,
    diff: &Path,
    objects: &Path,
    hashed: Hashed,
    below: &[Arc<Digests>],
) -> io::Result<Staged> {
    let tree = Tree::open(diff)?;
    let object_tree = Tree::open(objects)?;
    let mut staged = Staged {
        digests: hashed.digests,
        ..Staged::default()
    };
    let mut seen_here = HashSet::new();
    let mut dir_times: HashMap<PathBuf, Timestamps> = HashMap::new();
    for (rel, nlink, id) in hashed.files {
        let first_here = seen_here.insert(id.clone());
        // A file of a hardlink set in its layer stays what it is: relinking one of its
        // names would split the set, and publishing it would lend other images an inode
        // of thousands of links, and the ext4 link limit would then fail another image's
        // `direct` create.
        if !first_here || nlink != 1 || below.iter().any(|layer| layer.contains(&id)) {
            continue;
        }
        let object = match object_tree.open_regular(&object_path(Path::new(""), &id)) {
            Ok(object) => object,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                staged.to_publish.push((rel, id));
                continue;
            }
            Err(e) => {
                tracing::debug!(object = %id.to_hex(), error = %e, "object not usable: file kept");
                continue;
            }
        };
        let linked = tree
            .open_regular(&rel)
            .and_then(|file| link_to(host, &tree, &rel, &file, &object, &mut dir_times));
        match linked {
            Ok(Some(bytes)) => {
                staged.linked += 1;
                staged.linked_bytes += bytes;
            }
            Ok(None) => {}
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<LeftBehind>()) => return Err(e),
            Err(e) => {
                tracing::debug!(file = %rel.display(), error = %e, "not linked to its object")
            }
        }
    }
    // The renames changed the directories' times, which containers see: put them back.
    for (rel, times) in dir_times {
        let dir = resolve_from(tree.root(), &rel, OFlags::RDONLY | OFlags::DIRECTORY)?;
        rustix::fs::futimens(&dir, &times)?;
    }
    Ok(staged)
}

/// The fs-verity digest of the regular file `entry` of a walk of `tree`: opened from the
/// directory the walk holds, the name not followed (the tree is the import's own), and
/// checked to be the inode the walk listed.
pub(crate) fn hash_entry(tree: &Tree, entry: &crate::beneath::Entry<'_>) -> io::Result<ObjectId> {
    let fd = rustix::fs::openat(
        entry.dir,
        entry.name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let now = rustix::fs::fstat(&fd)?;
    if (now.st_dev, now.st_ino) != (entry.stat.st_dev, entry.stat.st_ino) {
        return Err(io::Error::other(format!(
            "{}: changed while hashed",
            tree.path().join(entry.rel()).display()
        )));
    }
    Ok(digest_of(File::from(fd))?.0)
}

/// The fs-verity digest of everything `content` reads (composefs's object name), and
/// how many bytes that was.
pub fn digest_of(mut content: impl Read) -> io::Result<(ObjectId, u64)> {
    let mut hasher = FsVerityHasher::<ObjectId, 12>::new();
    let read = io::copy(&mut content, &mut hasher)?;
    Ok((hasher.digest(), read))
}

/// A link's temporary name that could not be removed: the import must fail.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct LeftBehind(String);

/// Why [`hash`]'s walk stopped early.
#[derive(Debug, thiserror::Error)]
#[error("past {MAX_FILES} files or {MAX_PATH_BYTES} bytes of paths")]
struct PastBounds;

/// Replaces the layer file `rel` (open as `file`) with a hardlink to `object`'s inode if
/// the two have the same metadata and bytes. `Some(bytes)` when it did.
fn link_to(
    host: &dyn HostFs,
    tree: &Tree,
    rel: &Path,
    file: &File,
    object: &File,
    dir_times: &mut HashMap<PathBuf, Timestamps>,
) -> io::Result<Option<u64>> {
    let ours = rustix::fs::fstat(file)?;
    let theirs = rustix::fs::fstat(object)?;
    if !same_metadata(&ours, &theirs)
        || theirs.st_nlink >= MAX_LINKS
        || xattrs(host, file.as_fd())? != xattrs(host, object.as_fd())?
        || !same_bytes(file, object)?
    {
        return Ok(None);
    }
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Ok(None);
    };
    let dir = resolve_from(tree.root(), parent, OFlags::RDONLY | OFlags::DIRECTORY)?;
    if !dir_times.contains_key(parent) {
        let st = rustix::fs::fstat(&dir)?;
        dir_times.insert(parent.to_path_buf(), times_of(&st));
    }
    let temporary = format!(".lamina-link-{}", std::process::id());
    // Linked from the descriptor compared, not by name: the inode checked is the one
    // linked (root may link any inode by descriptor).
    rustix::fs::linkat(object, "", &dir, &temporary, AtFlags::EMPTY_PATH)?;
    if let Err(e) = rustix::fs::renameat(&dir, &temporary, &dir, name) {
        // A name left behind would be published inside a layer whose diffID was checked.
        rustix::fs::unlinkat(&dir, &temporary, AtFlags::empty()).map_err(|undo| {
            io::Error::other(LeftBehind(format!(
                "{}: {undo} removing {temporary} after {e}",
                rel.display()
            )))
        })?;
        return Err(e.into());
    }
    Ok(Some(ours.st_size as u64))
}

/// Publishes the staged layer's files `to_publish` (under `diff`) as objects in
/// `objects`. Called once the layer's data is durable: an object's name must never
/// exist before its content is on disk, since later imports link to it. The names need
/// not be durable themselves: a lost one only means a later file is not linked, and a
/// composefs build syncs the names its image refers to. Best effort for the same reason.
pub fn publish(diff: &Path, objects: &Path, to_publish: &[(PathBuf, ObjectId)]) -> usize {
    let (Ok(tree), Ok(objects_dir)) = (Tree::open(diff), Tree::open(objects)) else {
        return 0;
    };
    let mut fan_outs = HashSet::new();
    let mut published = 0;
    for (rel, id) in to_publish {
        let fan_out = id.to_object_dir();
        // Only the fan-out directory: an import that outlived `delete-store` must not
        // make the store's directories again.
        if !fan_outs.contains(&fan_out) {
            match rustix::fs::mkdirat(objects_dir.root(), fan_out.as_str(), 0o755.into()) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => {
                    tracing::debug!(dir = %objects.join(&fan_out).display(), error = %e, "objects not published");
                    return published;
                }
            }
            fan_outs.insert(fan_out.clone());
        }
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        let target = object_path(Path::new(""), id);
        let linked =
            resolve_from(tree.root(), parent, OFlags::PATH | OFlags::DIRECTORY).and_then(|dir| {
                rustix::fs::linkat(&dir, name, objects_dir.root(), &target, AtFlags::empty())
                    .map_err(io::Error::from)
            });
        match linked {
            Ok(()) => published += 1,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                tracing::debug!(file = %rel.display(), error = %e, "not published as an object")
            }
        }
    }
    published
}

/// Where the object of content `id` is under the store's `objects/` directory `objects`.
pub fn object_path(objects: &Path, id: &ObjectId) -> PathBuf {
    objects.join(id.to_object_pathname())
}

/// The manifest of `digests`, as written beside a layer's `diff/`.
pub fn manifest_bytes(digests: &Digests) -> Vec<u8> {
    let mut hexes: Vec<String> = digests.iter().map(|d| d.to_hex()).collect();
    hexes.sort_unstable();
    let mut text = format!("{HEADER}\n{}\n", hexes.len());
    for hex in hexes {
        text.push_str(&hex);
        text.push('\n');
    }
    text.into_bytes()
}

/// The manifest of the layer whose directory is `layer_dir`; `None` when it has none or
/// it cannot be read whole (a layer from before manifests, a committed snapshot, a
/// manifest a crash cut short).
pub fn read_manifest(layer_dir: &Path) -> Option<Digests> {
    let path = layer_dir.join(MANIFEST);
    let file = crate::open_regular_file(&path).ok()?;
    let mut text = String::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_string(&mut text)
        .ok()?;
    let parsed = parse_manifest(&text);
    if parsed.is_none() {
        tracing::warn!(path = %path.display(), "layer manifest unreadable: its files are not linked to");
    }
    parsed
}

fn parse_manifest(text: &str) -> Option<Digests> {
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return None;
    }
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let count: usize = lines.next()?.parse().ok()?;
    let digests = lines
        .map(|hex| ObjectId::from_hex(hex).ok())
        .collect::<Option<Digests>>()?;
    (digests.len() == count && text.ends_with('\n')).then_some(digests)
}

/// Whether two inodes would show the same file: owner, mode, size and modification time
/// (a change time cannot be set, and nothing reads an image's access times).
fn same_metadata(a: &Stat, b: &Stat) -> bool {
    (a.st_mode, a.st_uid, a.st_gid, a.st_size) == (b.st_mode, b.st_uid, b.st_gid, b.st_size)
        && (a.st_mtime, a.st_mtime_nsec) == (b.st_mtime, b.st_mtime_nsec)
        && a.st_dev == b.st_dev
}

pub(crate) fn times_of(st: &Stat) -> Timestamps {
    let time = |sec: i64, nsec: u64| rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: nsec as _,
    };
    Timestamps {
        last_access: time(st.st_atime, st.st_atime_nsec),
        last_modification: time(st.st_mtime, st.st_mtime_nsec),
    }
}

/// Every xattr of `fd`, sorted by name, read through the kernel seam.
pub(crate) fn xattrs(
    host: &dyn HostFs,
    fd: BorrowedFd<'_>,
) -> io::Result<Vec<(OsString, Vec<u8>)>> {
    let mut all = Vec::new();
    for name in host.list_xattrs(At::Fd(fd))? {
        if let Some(value) = host.get_xattr(At::Fd(fd), &name)? {
            all.push((name, value));
        }
    }
    all.sort();
    Ok(all)
}

/// Whether `a` and `b` hold the same bytes, read from their starts.
pub(crate) fn same_bytes(a: &File, b: &File) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut left = vec![0u8; 128 << 10];
    let mut right = vec![0u8; 128 << 10];
    let mut offset = 0u64;
    loop {
        let n = read_full(a, &mut left, offset)?;
        let m = read_full(b, &mut right[..n.max(1)], offset)?;
        if n != m || left[..n] != right[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
        offset += n as u64;
    }
    fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    }
}
