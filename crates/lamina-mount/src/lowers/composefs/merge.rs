//! composefs's merge: an image's layers laid one over the other in memory, as overlay
//! would show them (whiteouts remove, opaque directories hide what is below, a
//! directory's metadata is its top-most layer's, hardlinks stay one inode), with a
//! regular file still its path in its layer. Bounded by [`Limits`].
//!
//! Every directory is read from a descriptor of it, opened from its parent's without
//! following a symlink, and every entry is looked at from its directory's descriptor: a
//! committed containerd snapshot's container may still rename things in its upper, and a
//! directory swapped for a symlink to a host directory would put that directory's names,
//! owners and xattrs in the image. A directory that is not the one listed by the time it
//! is opened fails the build.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use composefs::generic_tree::{self, Inode, Leaf, LeafContent, LeafId, Stat};
use rustix::fs::{Dir, FileType, Mode, OFlags};

use lamina_image::Digest;
use lamina_store::Store;
use lamina_sys::{At, HostFs};

/// Entries (of every layer, replaced ones included) a metadata image may be built from.
/// The tree and the image are built in memory, a few hundred bytes an entry plus the
/// names, link targets and xattrs it holds (bounded by [`MAX_METADATA_BYTES`]): together
/// about 1.5 GiB at worst, where a hostile layer of long symlinks would cost 12.5 KiB an
/// entry without the second bound. Real images have tens of thousands.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Bytes of names, regular files' layer paths (held until hashed), symlink targets and
/// xattrs (names and values) the build reads, across every layer: each is held about
/// three times (tree, image, hashes of names).
pub const MAX_METADATA_BYTES: usize = 256 << 20;

/// Directories nested in one layer that a metadata image is built from: the merge holds a
/// descriptor of each directory above the one it reads, and recurses once a level (at 512
/// levels two builds at once pass a soft limit of 1024 descriptors, and a debug build
/// overflows a 2 MiB thread stack past 450). Real images nest a few dozen.
pub const MAX_DEPTH: usize = 128;

/// Why an image cannot be built, as an error whose kind says so (`InvalidData`): a
/// refusal that building again would repeat, unlike a full disk or a lock timeout.
pub(crate) fn refusal(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// Whether building failed for a reason the image itself carries ([`refusal`], or a
/// path longer than the kernel takes), so building again would fail again.
pub(crate) fn is_refusal(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::InvalidData | io::ErrorKind::InvalidFilename
    )
}

/// How much of an image one build may read: into memory (entries, metadata bytes), and
/// hash (file bytes) while it holds the layers lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub entries: usize,
    pub metadata_bytes: usize,
    pub file_bytes: u64,
}

impl Limits {
    /// An operator asked for composefs (`--strategy composefs`, `pool fill`).
    pub const NAMED: Limits = Limits {
        entries: MAX_ENTRIES,
        metadata_bytes: MAX_METADATA_BYTES,
        file_bytes: u64::MAX,
    };
    /// `auto`'s background build, for any image a caller creates from: a quarter of
    /// the named entries and metadata (about 400 MiB of memory at worst), far above real
    /// images' tens of thousands of entries, and 4 GiB of files to hash (about 20 s at
    /// the 200 MiB/s measured here, while `clean` and `delete-store` wait for the layers
    /// lock); a larger image keeps to its layers. Any create can start such a build, so
    /// the named limits alone are too loose for it.
    pub const AUTO: Limits = Limits {
        entries: MAX_ENTRIES / 4,
        metadata_bytes: MAX_METADATA_BYTES / 4,
        file_bytes: 4 << 30,
    };
}

/// The most xattrs, and xattr bytes (names and values), one inode may carry into a
/// metadata image. EROFS (and the `composefs` crate's writer) stores an inode's shared
/// xattr count in a byte and its xattr area's size and each value's size in 16 bits, and
/// the writer truncates past them silently: a 64 KiB value on an XFS layer would make the
/// kernel read the value's bytes as forged overlay redirects into another image's objects.
/// Far above what real images carry (ACLs, capabilities, labels).
pub const MAX_XATTRS_PER_INODE: usize = 128;
pub const MAX_XATTR_BYTES_PER_INODE: usize = 32 << 10;

/// The merged tree while layers are laid over it: a regular file is still its path in a
/// layer (hashed once the tree is final, so replaced files are never read).
pub(crate) type Merging = generic_tree::FileSystem<LayerFile>;
type MergingDir = generic_tree::Directory<LayerFile>;

/// A regular file of the merged tree, where a layer holds it.
#[derive(Debug)]
pub(crate) struct LayerFile {
    pub(crate) path: PathBuf,
    /// Its size when the merge stat'ed it (layers do not change).
    pub(crate) size: u64,
    /// Its inode may become an object: it is a file of a layer lamina imported and
    /// verified, which nothing writes (unless it is a hardlink set: see
    /// `Objects::publish`). A committed containerd snapshot's file is copied
    /// instead: its container may still write it through containerd's mount, and an
    /// object is read by other images' containers (and, in a store that shares file
    /// content, linked into their layers).
    pub(crate) linkable: bool,
    /// Its layer's `diff/`, beneath which a file that is not linkable is opened.
    pub(crate) root: Arc<Path>,
}

/// The layers of `chain_ids` (bottom first) merged, read within `limits`.
pub(crate) fn merge(store: &Store, chain_ids: &[Digest], limits: Limits) -> io::Result<Merging> {
    let mut merge = Merge {
        store,
        host: &**store.host(),
        limits,
        inodes: HashMap::new(),
        entries: 0,
        metadata_bytes: 0,
        linkable: false,
        layer_root: Arc::from(Path::new("")),
    };
    let bottom = store.layout().layer_diff(&chain_ids[0]);
    let mut tree = Merging::new(merge.metadata_of(&open_directory(rustix::fs::CWD, &bottom)?)?);
    for chain_id in chain_ids {
        let layer = store.layout().layer_diff(chain_id);
        // An imported layer (its record has the diffID it was verified against); a
        // committed containerd snapshot has none.
        merge.linkable = store
            .layer_record(chain_id)
            .is_ok_and(|record| record.imported());
        merge.layer_root = Arc::from(layer.as_path());
        let layer_dir = open_directory(rustix::fs::CWD, &layer)?;
        let Merging { root, leaves } = &mut tree;
        merge.apply(&layer_dir, &layer, root, leaves, 0)?;
        root.stat = merge.metadata_of(&layer_dir)?;
    }
    tree.compact();
    refuse_past_file_bytes(&tree, limits.file_bytes)?;
    Ok(tree)
}

/// Refuses a merged tree whose regular files (each inode once, as the build hashes
/// them) pass `most` bytes. Counted on the final tree, not per layer: a file a later
/// layer replaces or deletes is never hashed, and counting every layer's copy would
/// refuse images that hash far less.
fn refuse_past_file_bytes(tree: &Merging, most: u64) -> io::Result<()> {
    if most == u64::MAX {
        return Ok(());
    }
    let mut total: u64 = 0;
    for leaf in &tree.leaves {
        if let LeafContent::Regular(file) = &leaf.content {
            total = total.saturating_add(file.size);
            if total > most {
                return Err(refusal(format!(
                    "the image's files pass {most} bytes, more than a composefs image is built from here"
                )));
            }
        }
    }
    Ok(())
}

struct Merge<'a> {
    store: &'a Store,
    host: &'a dyn HostFs,
    /// Layer inodes already in the tree, so a hardlink stays one inode.
    inodes: HashMap<(u64, u64), LeafId>,
    limits: Limits,
    /// Entries read so far, against the limits.
    entries: usize,
    /// Names, paths, link targets and xattrs read so far, against the limits.
    metadata_bytes: usize,
    /// Whether the layer being laid may lend its inodes to objects ([`LayerFile`]).
    linkable: bool,
    /// The `diff/` of the layer being laid.
    layer_root: Arc<Path>,
}

impl Merge<'_> {
    /// Lays layer directory `src` (open as `src_dir`, `depth` levels below its layer's
    /// root) over `dir`.
    fn apply(
        &mut self,
        src_dir: &OwnedFd,
        src: &Path,
        dir: &mut MergingDir,
        leaves: &mut Vec<Leaf<LayerFile>>,
        depth: usize,
    ) -> io::Result<()> {
        // Names first, so that only this directory's descriptor is held while its
        // children are laid.
        let mut names = Vec::new();
        let mut listing = Dir::read_from(src_dir)?;
        while let Some(entry) = listing.read() {
            let name = OsStr::from_bytes(entry?.file_name().to_bytes()).to_os_string();
            if name == "." || name == ".." {
                continue;
            }
            self.entries += 1;
            if self.entries > self.limits.entries {
                return Err(refusal(format!(
                    "the image's layers hold more than {} entries, more than a composefs image is built from",
                    self.limits.entries
                )));
            }
            self.count_bytes(name.len())?;
            names.push(name);
        }
        drop(listing);
        if depth == 1 {
            // Between the listing of a directory at a layer's top and the looks at what
            // it lists: where a test renames that directory as a committed snapshot's
            // container could.
            self.store.pause_point("composefs-listed");
        }
        for name in names {
            let from = src.join(&name);
            self.apply_entry(src_dir.as_fd(), &from, &name, dir, leaves, depth)?;
        }
        Ok(())
    }

    /// Lays one entry of a layer, `name` in the directory open as `parent` (at `from`),
    /// over `dir`. Errors name the entry (from the layer's `diff/` down).
    fn apply_entry(
        &mut self,
        parent: BorrowedFd<'_>,
        from: &Path,
        name: &OsStr,
        dir: &mut MergingDir,
        leaves: &mut Vec<Leaf<LayerFile>>,
        depth: usize,
    ) -> io::Result<()> {
        let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", shown(from)));
        let st = self
            .host
            .stat(At::Child(parent, name))
            .map_err(io::Error::from)
            .map_err(at)?;
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind == FileType::CharacterDevice && st.st_rdev == 0 {
            dir.remove(name); // a whiteout: the name is gone from here down
            return Ok(());
        }
        if kind == FileType::Directory {
            if depth + 1 > MAX_DEPTH {
                return Err(at(refusal(format!(
                    "directories nested deeper than {MAX_DEPTH} levels, more than a composefs image is built from"
                ))));
            }
            let child_dir = open_directory(parent, name).map_err(at)?;
            let now = rustix::fs::fstat(&child_dir)
                .map_err(io::Error::from)
                .map_err(at)?;
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
                return Err(at(io::Error::other(
                    "replaced while the layers were merged",
                )));
            }
            let opaque = self.host.get_xattr(
                At::Fd(child_dir.as_fd()),
                OsStr::new("trusted.overlay.opaque"),
            );
            let keep = matches!(dir.lookup(name), Some(Inode::Directory(_)))
                && !matches!(opaque, Ok(Some(v)) if v == b"y");
            if !keep {
                let fresh = generic_tree::Directory::new(Stat::uninitialized());
                dir.insert(name, Inode::Directory(Box::new(fresh)));
            }
            let child = dir
                .get_directory_mut(name)
                .map_err(|e| at(io::Error::other(e.to_string())))?;
            self.apply(&child_dir, from, child, leaves, depth + 1)?;
            child.stat = self.stat_of(At::Fd(child_dir.as_fd()), &st).map_err(at)?;
            return Ok(());
        }
        let id = match self.inodes.get(&(st.st_dev, st.st_ino)) {
            Some(&id) => id,
            None => {
                let content = match kind {
                    FileType::RegularFile => {
                        // The leaf keeps its layer path until it is hashed, so the
                        // path is counted (deep paths cost 3.6 KiB an entry).
                        self.count_bytes(from.as_os_str().len())?;
                        LeafContent::Regular(LayerFile {
                            path: from.to_path_buf(),
                            size: st.st_size as u64,
                            linkable: self.linkable,
                            root: self.layer_root.clone(),
                        })
                    }
                    FileType::Symlink => {
                        let target = rustix::fs::readlinkat(parent, name, Vec::new())
                            .map_err(io::Error::from)
                            .map_err(at)?;
                        let target = OsString::from_vec(target.into_bytes());
                        self.count_bytes(target.len())?;
                        LeafContent::Symlink(target.into())
                    }
                    FileType::CharacterDevice => {
                        LeafContent::CharacterDevice(device(st.st_rdev).map_err(at)?)
                    }
                    FileType::BlockDevice => {
                        LeafContent::BlockDevice(device(st.st_rdev).map_err(at)?)
                    }
                    FileType::Fifo => LeafContent::Fifo,
                    FileType::Socket => LeafContent::Socket,
                    _ => return Err(at(refusal("a file of unknown type"))),
                };
                let id = LeafId(leaves.len());
                leaves.push(Leaf {
                    stat: self.stat_of(At::Child(parent, name), &st).map_err(at)?,
                    content,
                });
                self.inodes.insert((st.st_dev, st.st_ino), id);
                id
            }
        };
        dir.insert(name, Inode::leaf(id));
        Ok(())
    }

    fn count_bytes(&mut self, n: usize) -> io::Result<()> {
        self.metadata_bytes += n;
        if self.metadata_bytes > self.limits.metadata_bytes {
            return Err(refusal(format!(
                "the image's names, paths, link targets and xattrs pass {} bytes, more than a composefs image is built from",
                self.limits.metadata_bytes
            )));
        }
        Ok(())
    }

    /// [`Merge::stat_of`] for a directory not yet stat'ed (a layer's root), open as `dir`.
    fn metadata_of(&mut self, dir: &OwnedFd) -> io::Result<Stat> {
        let st = self.host.stat(At::Fd(dir.as_fd()))?;
        self.stat_of(At::Fd(dir.as_fd()), &st)
    }

    /// Owner, mode (set-id and sticky bits included) and mtime from `st` (`at`'s own
    /// stat), and `at`'s xattrs other than overlay's own markers, read through the
    /// store's host (the kernel seam).
    fn stat_of(&mut self, at: At<'_>, st: &rustix::fs::Stat) -> io::Result<Stat> {
        let mut xattrs = std::collections::BTreeMap::new();
        let mut xattr_bytes = 0;
        for name in self.host.list_xattrs(at)? {
            if name.as_encoded_bytes().starts_with(b"trusted.overlay.") {
                continue; // overlay's markers mean nothing in the merged tree
            }
            if let Some(value) = self.host.get_xattr(at, &name)? {
                xattr_bytes += name.len() + value.len();
                xattrs.insert(name.into_boxed_os_str(), value.into_boxed_slice());
            }
        }
        if xattrs.len() > MAX_XATTRS_PER_INODE || xattr_bytes > MAX_XATTR_BYTES_PER_INODE {
            return Err(refusal(format!(
                "{} xattrs of {xattr_bytes} bytes on one file, more than a composefs image holds ({MAX_XATTRS_PER_INODE}, {MAX_XATTR_BYTES_PER_INODE} bytes)",
                xattrs.len()
            )));
        }
        self.count_bytes(xattr_bytes)?;
        Ok(Stat {
            st_mode: st.st_mode & 0o7777,
            st_uid: st.st_uid,
            st_gid: st.st_gid,
            st_mtim_sec: st.st_mtime,
            st_mtim_nsec: st.st_mtime_nsec as u32,
            xattrs,
        })
    }
}

/// The directory `name` under `parent`, opened to read, no symlink followed.
fn open_directory(parent: impl AsFd, name: impl rustix::path::Arg) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// A layer path as errors show it: from the layer's `diff/` down.
fn shown(path: &Path) -> String {
    let text = path.display().to_string();
    match text.find("/diff/") {
        Some(at) => text[at + "/diff/".len()..].to_string(),
        None => text,
    }
}

/// A device number as EROFS stores it (32 bits; the writer would panic on more).
fn device(rdev: u64) -> io::Result<u64> {
    if rdev > u64::from(u32::MAX) {
        return Err(refusal(format!(
            "device number {rdev:#x} does not fit an EROFS inode"
        )));
    }
    Ok(rdev)
}
