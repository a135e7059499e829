//! composefs (issue 24): an image as one lower, whatever its layer count. Built once per
//! image (its top chain ID) from the store's layers:
//!
//! - the layers are merged in memory as overlay would show them (whiteouts remove,
//!   opaque directories hide what is below, a directory's metadata is its top-most
//!   layer's), hardlinks kept as one inode;
//! - every regular file of the merged tree larger than composefs's inline limit is stored
//!   once in `objects/<ab>/<rest>`, named by its fs-verity digest (SHA-256, computed in
//!   userspace: this kernel has no fs-verity). An object is a hardlink to the layer's
//!   inode, so building costs no data copy; a file whose content is already an object
//!   (from any image) is made to share that object's extents where the filesystem can
//!   (xfs, btrfs: `FIDEDUPERANGE`), so the store holds each content once on disk while
//!   every layer keeps its own inodes for the strategies that mount layers;
//! - the merged tree becomes `composefs/<top>.erofs`, an EROFS image written by the
//!   `composefs` crate whose regular files are overlay metacopy inodes redirecting into
//!   `objects/`.
//!
//! The image is mounted once (file-backed EROFS, no loop device) on `composefs/<top>.mnt`
//! ([`mounted`]), and every container's overlay has its `rootfs/` as the only lower and
//! `objects/` as a data-only lower (`plan::read_write`). The objects' own owners and modes
//! are never seen: overlay takes a file's metadata from the image and only its data from
//! the object.
//!
//! `clean` removes images (and their mounts) nothing uses, then objects no remaining
//! image references (`composefs_collect.rs`); `check --verify` re-hashes both
//! (`composefs_verify.rs`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use composefs::erofs::writer::{ValidatedFileSystem, mkfs_erofs};
use composefs::fsverity::{FsVerityHashValue, FsVerityHasher, Sha256HashValue, compute_verity};
use composefs::generic_tree::{self, Inode, Leaf, LeafContent, LeafId, Stat};
use composefs::tree::RegularFile;
use rustix::fs::FileType;

use lamina_image::Digest;
use lamina_store::{Store, StoreError};
use lamina_sys::{At, HostFs, Mounter};

use crate::RootfsError;
use crate::record::Container;

/// An object's name: its fs-verity digest.
pub(crate) type ObjectId = Sha256HashValue;

/// Entries (of every layer, replaced ones included) a metadata image may be built from.
/// The tree and the image are built in memory, a few hundred bytes an entry plus the
/// names, link targets and xattrs it holds (bounded by [`MAX_METADATA_BYTES`]): together
/// about 1.5 GiB at worst, where a hostile layer of long symlinks cost 12.5 KiB an entry
/// without the second bound (review finding). Real images have tens of thousands.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Bytes of names, regular files' layer paths (held until hashed), symlink targets and
/// xattrs (names and values) the build reads, across every layer: each is held about
/// three times (tree, image, hashes of names).
pub const MAX_METADATA_BYTES: usize = 256 << 20;

/// The most xattrs, and xattr bytes (names and values), one inode may carry into a
/// metadata image. EROFS (and the `composefs` crate's writer) stores an inode's shared
/// xattr count in a byte and its xattr area's size and each value's size in 16 bits, and
/// the writer truncates past them silently: a 64 KiB value on an XFS layer made the
/// kernel read the value's bytes as forged overlay redirects into another image's objects
/// (review finding). Far above what real images carry (ACLs, capabilities, labels).
pub const MAX_XATTRS_PER_INODE: usize = 128;
pub const MAX_XATTR_BYTES_PER_INODE: usize = 32 << 10;

/// The merged tree while layers are laid over it: a regular file is still its path in a
/// layer (hashed once the tree is final, so replaced files are never read).
type Merging = generic_tree::FileSystem<PathBuf>;
type MergingDir = generic_tree::Directory<PathBuf>;

/// The image's metadata image, built if it does not exist yet (under a per-image lock,
/// written in `tmp/` and renamed into place when whole, its objects synced first).
pub fn ensure(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
) -> Result<PathBuf, StoreError> {
    let Some(top) = chain_ids.last() else {
        return Err(
            StoreError::io("building composefs image for", store.root())(io::Error::other(
                "the image has no layers",
            )),
        );
    };
    let image = image_path(store, top);
    if image.is_file() && verity_path(&image).is_file() {
        return Ok(image);
    }
    let verity = verity_here(store, mounter);
    if image.is_file() && !verity {
        return Ok(image);
    }
    let _lock = store.lock(&format!("composefs-{}", top.hex()))?;
    if image.is_file() {
        if verity && !verity_path(&image).is_file() {
            // Built before this kernel (or filesystem) could seal: sealed now, so every
            // container of the image from here on mounts with `verity=require`.
            seal_built(store, &image).map_err(StoreError::io("sealing with fs-verity", &image))?;
        }
        return Ok(image);
    }
    // A mount left from an image that is gone (removed by hand, or as damaged by `check
    // --verify --repair`) shows that image, not the one built now: it goes first (review
    // finding: a repaired image went on being served from its old mount).
    let target = mount_path(store, top);
    if target.is_dir() {
        crate::clean::remove_unmounted(mounter, &target).map_err(|e| {
            StoreError::io("unmounting the old mount", &target)(io::Error::other(e.to_string()))
        })?;
    }
    let started = std::time::Instant::now();
    let staging = store.layout().tmp().join(format!(
        "composefs-{}-{}",
        top.hex(),
        lamina_store::unique_suffix()
    ));
    let built = build(store, chain_ids, verity).and_then(|bytes| {
        let mut file = File::create(&staging)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        drop(file);
        if verity {
            seal(&**store.host(), &staging)?;
        }
        // What `check --verify` holds the image to, recorded before the image appears.
        let digest = compute_verity::<ObjectId>(&bytes).to_hex();
        lamina_store::write_durably(&digest_path(&image), digest.as_bytes())
            .map_err(io::Error::other)?;
        fs::rename(&staging, &image)?;
        if verity {
            lamina_store::write_durably(&verity_path(&image), VERITY_MARK)
                .map_err(io::Error::other)?;
        }
        lamina_store::sync_dir(&store.layout().composefs()).map_err(io::Error::other)
    });
    if let Err(e) = built {
        let _ = fs::remove_file(&staging);
        return Err(StoreError::io("building composefs image", &image)(e));
    }
    tracing::info!(image = %top, layers = chain_ids.len(), ms = started.elapsed().as_millis() as u64, "built composefs image");
    Ok(image)
}

/// The image's metadata image, built if need be, mounted (read-only, file-backed EROFS)
/// on `composefs/<top>.mnt` if it is not: the one lower every composefs overlay of the
/// image names, so a thousand containers share one EROFS superblock and its inode
/// cache, and mount options can name it (`--without-mount`). It stays mounted until
/// `clean` removes the image; a host restart unmounts it, and the next create, `mount`
/// or pool refill mounts it again. The caller holds the layers-in-use lock.
pub fn mounted(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
) -> Result<PathBuf, RootfsError> {
    let image = ensure(store, mounter, chain_ids)?;
    let top = chain_ids
        .last()
        .expect("ensure refuses an image without layers");
    let target = mount_path(store, top);
    // Mounted already (every create but an image's first since boot): no lock needed,
    // since only `clean` unmounts it, under the layers lock the caller holds shared.
    let mounted = |target: &Path| -> Result<bool, RootfsError> {
        Ok(target.is_dir() && mounter.is_mountpoint(target)?)
    };
    if mounted(&target)? {
        return Ok(target);
    }
    let _lock = store.lock(&format!("composefs-{}", top.hex()))?;
    if mounted(&target)? {
        return Ok(target);
    }
    fs::create_dir_all(&target).map_err(StoreError::io("creating", &target))?;
    mounter.mount_erofs(&image, &target)?;
    tracing::info!(image = %top, "mounted composefs metadata image");
    Ok(target)
}

/// Whether this store's kernel and filesystem seal files with fs-verity (the cached
/// probe; a probe that cannot run says no).
fn verity_here(store: &Store, mounter: &dyn Mounter) -> bool {
    crate::probe::probe(store, mounter, false).is_ok_and(|p| p.fs_verity == Some(true))
}

/// Seals `path` with fs-verity: opened read-only, as the kernel requires.
fn seal(host: &dyn HostFs, path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    host.enable_verity(&file, path).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("sealing {} with fs-verity: {e}", path.display()),
        )
    })
}

/// Seals metadata image `image` and every object it references, then marks it sealed.
fn seal_built(store: &Store, image: &Path) -> io::Result<()> {
    let bytes = fs::read(image)?;
    let objects = composefs::erofs::reader::collect_objects::<ObjectId>(&bytes)
        .map_err(|e| io::Error::other(format!("{e:#}")))?;
    for object in objects {
        seal(
            &**store.host(),
            &store.layout().objects().join(object.to_object_pathname()),
        )?;
    }
    seal(&**store.host(), image)?;
    lamina_store::write_durably(&verity_path(image), VERITY_MARK).map_err(io::Error::other)
}

/// What the verity mark holds: the algorithm objects are sealed with.
const VERITY_MARK: &[u8] = b"sha256\n";

/// Where the mark lives that says metadata image `image` and every object it references
/// are sealed with fs-verity: its containers mount with `verity=require`, so the kernel
/// refuses a file whose object's content is not the one the image names.
pub fn verity_path(image: &Path) -> PathBuf {
    let mut name = image.as_os_str().to_os_string();
    name.push(".verity");
    PathBuf::from(name)
}

/// What lives beside metadata image `image` and goes with it.
pub fn companions(image: &Path) -> [PathBuf; 2] {
    [digest_path(image), verity_path(image)]
}

/// The directory inside a metadata image that holds the image's tree.
pub const ROOTFS: &str = "rootfs";

/// The image (top chain ID hex) whose metadata image `container` mounts, if it is a
/// composefs container: what `clean` and `check --repair` must leave in place.
pub(crate) fn image_of(container: &Container) -> Option<String> {
    let composefs = container.model().flavor().is_some_and(|f| f.composefs);
    composefs
        .then(|| {
            container
                .record
                .layers
                .last()
                .map(|top| top.hex().to_string())
        })
        .flatten()
}

/// Where the metadata image of `top` is mounted.
pub fn mount_path(store: &Store, top: &Digest) -> PathBuf {
    store
        .layout()
        .composefs()
        .join(format!("{}.mnt", top.hex()))
}

/// Where the metadata image of the image whose top layer is `top` lives.
pub fn image_path(store: &Store, top: &Digest) -> PathBuf {
    store
        .layout()
        .composefs()
        .join(format!("{}.erofs", top.hex()))
}

/// Where the fs-verity digest (hex) of metadata image `image` is recorded.
pub fn digest_path(image: &Path) -> PathBuf {
    let mut name = image.as_os_str().to_os_string();
    name.push(".digest");
    PathBuf::from(name)
}

/// The EROFS image of `chain_ids` merged, its objects stored and synced.
fn build(store: &Store, chain_ids: &[Digest], verity: bool) -> io::Result<Box<[u8]>> {
    let host = &**store.host();
    let mut merge = Merge {
        host,
        inodes: HashMap::new(),
        entries: 0,
        metadata_bytes: 0,
    };
    let bottom = store.layout().layer_diff(&chain_ids[0]);
    let mut tree = Merging::new(merge.metadata_of(&bottom)?);
    for chain_id in chain_ids {
        let layer = store.layout().layer_diff(chain_id);
        let Merging { root, leaves } = &mut tree;
        merge.apply(&layer, root, leaves)?;
        root.stat = merge.metadata_of(&layer)?;
    }
    tree.compact();
    // The merged tree under `rootfs/`, which overlays name as their lower: unmounted, the
    // mount point is empty and `rootfs/` does not exist, so a caller mounting the options
    // itself (`--without-mount`) after a host restart gets an error, not an empty root
    // (review finding).
    let merged = std::mem::replace(
        &mut tree.root,
        generic_tree::Directory::new(Stat::uninitialized()),
    );
    tree.root.stat = merged.stat.clone();
    tree.root
        .insert(OsStr::new(ROOTFS), Inode::Directory(Box::new(merged)));
    let objects = store.layout().objects();
    let staging = store.layout().tmp().join(format!(
        "composefs-{}-objects-{}",
        chain_ids[chain_ids.len() - 1].hex(),
        lamina_store::unique_suffix()
    ));
    let mut objects = Objects {
        host,
        dir: objects,
        staging,
        can_share: true,
        shared_bytes: 0,
        verity,
        published_in: std::collections::BTreeSet::new(),
    };
    let tree = tree.try_map_regular(|path| objects.store(path))?;
    objects.sync_names()?;
    if objects.shared_bytes > 0 {
        tracing::info!(
            bytes = objects.shared_bytes,
            "layer files now share their objects' extents"
        );
    }
    let tree = ValidatedFileSystem::new(tree).map_err(|e| io::Error::other(format!("{e:#}")))?;
    Ok(mkfs_erofs(&tree))
}

struct Merge<'a> {
    host: &'a dyn HostFs,
    /// Layer inodes already in the tree, so a hardlink stays one inode.
    inodes: HashMap<(u64, u64), LeafId>,
    /// Entries read so far, against [`MAX_ENTRIES`].
    entries: usize,
    /// Names, paths, link targets and xattrs read so far, against [`MAX_METADATA_BYTES`].
    metadata_bytes: usize,
}

impl Merge<'_> {
    /// Lays layer directory `src` over `dir`.
    fn apply(
        &mut self,
        src: &Path,
        dir: &mut MergingDir,
        leaves: &mut Vec<Leaf<PathBuf>>,
    ) -> io::Result<()> {
        for entry in fs::read_dir(src)? {
            let name = entry?.file_name();
            let name = name.as_os_str();
            let from = src.join(name);
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(io::Error::other(format!(
                    "the image's layers hold more than {MAX_ENTRIES} entries, more than a composefs image is built from"
                )));
            }
            self.count_bytes(name.len())?;
            self.apply_entry(&from, name, dir, leaves)?;
        }
        Ok(())
    }

    /// Lays one entry of a layer, `from`, over `dir` under `name`. Errors name the entry
    /// (from the layer's `diff/` down).
    fn apply_entry(
        &mut self,
        from: &Path,
        name: &OsStr,
        dir: &mut MergingDir,
        leaves: &mut Vec<Leaf<PathBuf>>,
    ) -> io::Result<()> {
        let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", shown(from)));
        let st = self
            .host
            .stat(At::Path(from))
            .map_err(io::Error::from)
            .map_err(at)?;
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind == FileType::CharacterDevice && st.st_rdev == 0 {
            dir.remove(name); // a whiteout: the name is gone from here down
            return Ok(());
        }
        if kind == FileType::Directory {
            let keep = matches!(dir.lookup(name), Some(Inode::Directory(_)))
                && !crate::flatten::is_opaque(self.host, from);
            if !keep {
                let fresh = generic_tree::Directory::new(Stat::uninitialized());
                dir.insert(name, Inode::Directory(Box::new(fresh)));
            }
            let child = dir
                .get_directory_mut(name)
                .map_err(|e| at(io::Error::other(e.to_string())))?;
            self.apply(from, child, leaves)?;
            child.stat = self.stat_of(from, &st).map_err(at)?;
            return Ok(());
        }
        let id = match self.inodes.get(&(st.st_dev, st.st_ino)) {
            Some(&id) => id,
            None => {
                let content = match kind {
                    FileType::RegularFile => {
                        // The leaf keeps its layer path until it is hashed (review
                        // finding: deep paths cost 3.6 KiB an entry, uncounted).
                        self.count_bytes(from.as_os_str().len())?;
                        LeafContent::Regular(from.to_path_buf())
                    }
                    FileType::Symlink => {
                        let target = fs::read_link(from).map_err(at)?.into_os_string();
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
                    _ => return Err(at(io::Error::other("a file of unknown type"))),
                };
                let id = LeafId(leaves.len());
                leaves.push(Leaf {
                    stat: self.stat_of(from, &st).map_err(at)?,
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
        if self.metadata_bytes > MAX_METADATA_BYTES {
            return Err(io::Error::other(format!(
                "the image's names, paths, link targets and xattrs pass {MAX_METADATA_BYTES} bytes, more than a composefs image is built from"
            )));
        }
        Ok(())
    }

    /// [`Merge::stat_of`] for a path not yet stat'ed (a layer's root).
    fn metadata_of(&mut self, path: &Path) -> io::Result<Stat> {
        let st = self.host.stat(At::Path(path))?;
        self.stat_of(path, &st)
    }

    /// Owner, mode (set-id and sticky bits included) and mtime from `st` (`path`'s own
    /// stat), and `path`'s xattrs other than overlay's own markers, read through the
    /// store's host (the kernel seam).
    fn stat_of(&mut self, path: &Path, st: &rustix::fs::Stat) -> io::Result<Stat> {
        let mut xattrs = std::collections::BTreeMap::new();
        let mut xattr_bytes = 0;
        for name in self.host.list_xattrs(At::Path(path))? {
            if name.as_encoded_bytes().starts_with(b"trusted.overlay.") {
                continue; // overlay's markers mean nothing in the merged tree
            }
            if let Some(value) = self.host.get_xattr(At::Path(path), &name)? {
                xattr_bytes += name.len() + value.len();
                xattrs.insert(name.into_boxed_os_str(), value.into_boxed_slice());
            }
        }
        if xattrs.len() > MAX_XATTRS_PER_INODE || xattr_bytes > MAX_XATTR_BYTES_PER_INODE {
            return Err(io::Error::other(format!(
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
        return Err(io::Error::other(format!(
            "device number {rdev:#x} does not fit an EROFS inode"
        )));
    }
    Ok(rdev)
}

/// Where a build stores its objects.
struct Objects<'a> {
    host: &'a dyn HostFs,
    /// The store's `objects/`.
    dir: PathBuf,
    /// The build's own name in `tmp/` for an object it must copy.
    staging: PathBuf,
    /// False once the filesystem has said it cannot share extents.
    can_share: bool,
    /// Bytes of layer files this build made share an object's extents.
    shared_bytes: u64,
    /// Seal every object with fs-verity (the probe found it works here).
    verity: bool,
    /// Fan-out directories this build published objects in, whose entries
    /// [`Objects::sync_names`] makes durable before the image names them.
    published_in: std::collections::BTreeSet<PathBuf>,
}

impl Objects<'_> {
    /// A layer's regular file as the image records it: inline when small, otherwise an
    /// object in `objects/`, made if no file of that content is there yet. When one is
    /// there already (another layer's file, of this image or another), the layer's file
    /// is made to share the object's extents where the filesystem can (xfs, btrfs), so
    /// the store holds that content once on disk (issue 24) while every layer keeps its
    /// own inode, owner, mode and hardlinks for the strategies that mount layers.
    fn store(&mut self, path: &PathBuf) -> io::Result<RegularFile<ObjectId>> {
        let mut file = File::open(path)?;
        let size = file.metadata()?.len();
        if size <= composefs::INLINE_CONTENT_MAX_V0 as u64 {
            let mut data = Vec::with_capacity(size as usize);
            io::Read::read_to_end(&mut file, &mut data)?;
            return Ok(RegularFile::Inline(data.into()));
        }
        let mut hasher = FsVerityHasher::<ObjectId, 12>::new();
        let hashed = io::copy(&mut file, &mut hasher)?;
        let id = hasher.digest();
        let object = self.dir.join(id.to_object_pathname());
        if object.exists() {
            self.share(&object, &file, path, hashed);
        } else {
            drop(file);
            self.publish(path, &object)?;
        }
        if self.verity {
            seal(self.host, &object)?;
        }
        Ok(RegularFile::External(id, hashed))
    }

    /// Makes `object` hold the content of layer file `path`.
    fn publish(&mut self, path: &Path, object: &Path) -> io::Result<()> {
        if let Some(fan_out) = object.parent() {
            fs::create_dir_all(fan_out)?;
            self.published_in.insert(fan_out.to_path_buf());
        }
        match fs::hard_link(path, object) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            // Past the filesystem's link limit, or refused: a copy of our own (a reflink
            // where the filesystem has them: `fs::copy` asks for one), written in `tmp/`
            // under the build's name (swept with it after a crash), synced, then
            // published whole by a rename: an object's name is never trusted before its
            // content is on disk.
            Err(_) => {
                fs::copy(path, &self.staging)?;
                File::open(&self.staging)?.sync_all()?;
                fs::rename(&self.staging, object)?;
            }
        }
        Ok(())
    }

    /// Makes the names of the objects this build published durable: an fsync of each
    /// fan-out directory it linked into (and of `objects/`, which may have gained one).
    /// An object's data is a layer's, synced when it was imported, or a copy synced
    /// before its rename; so only names are at stake, and a `syncfs` of the whole store
    /// filesystem — every container's dirty upper with it, stall S1 — is not needed.
    fn sync_names(&self) -> io::Result<()> {
        if self.published_in.is_empty() {
            return Ok(());
        }
        for dir in self.published_in.iter().chain(std::iter::once(&self.dir)) {
            let handle = File::open(dir)?;
            self.host.fsync(&handle, dir).map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("syncing {}: {e}", dir.display()),
                )
            })?;
        }
        Ok(())
    }

    /// Makes layer file `file` (at `path`, `len` bytes) share `object`'s extents, unless
    /// it is the object's own inode. Best effort: the kernel compares the bytes itself
    /// and changes nothing where they differ, and a refusal (ext4 and tmpfs have no
    /// shared extents; a file in use as swap) leaves the file whole and the build going.
    fn share(&mut self, object: &Path, file: &File, path: &Path, len: u64) {
        if !self.can_share {
            return;
        }
        let Ok(source) = File::open(object) else {
            return;
        };
        let same_inode = match (source.metadata(), file.metadata()) {
            (Ok(a), Ok(b)) => {
                use std::os::unix::fs::MetadataExt;
                (a.dev(), a.ino()) == (b.dev(), b.ino())
            }
            _ => true,
        };
        if same_inode {
            return;
        }
        match self.host.share_extents(&source, file, path, len) {
            Ok(shared) => self.shared_bytes += shared,
            Err(lamina_sys::Errno::OPNOTSUPP | lamina_sys::Errno::INVAL) => {
                self.can_share = false;
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "layer file keeps its own extents")
            }
        }
    }
}
