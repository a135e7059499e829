//! Where a composefs build puts file contents: `objects/<ab>/<62 hex>`, named by their
//! fs-verity digest. Imports make most of them (`lamina_store::file_objects`); the build
//! makes what they did not (layers from before, committed snapshots). An object is a
//! hardlink to the layer file's own inode (no data copy); a layer file whose content is
//! already an object shares its extents where the filesystem can; the names are made
//! durable by an fsync of each fan-out directory.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use composefs::fsverity::FsVerityHashValue;
use composefs::tree::RegularFile;
use lamina_store::file_objects::digest_of;

use lamina_sys::HostFs;

use crate::lowers::composefs::merge::LayerFile;
use crate::lowers::composefs::{ObjectId, seal};

/// Where a build stores its objects.
pub(crate) struct Objects<'a> {
    host: &'a dyn HostFs,
    /// The store's `objects/`.
    dir: PathBuf,
    /// The build's own name in `tmp/` for an object it must copy.
    staging: PathBuf,
    /// False once the filesystem has said it cannot share extents.
    can_share: bool,
    /// Bytes of layer files this build made share an object's extents.
    pub(crate) shared_bytes: u64,
    /// Seal every object with fs-verity (the probe found it works here).
    verity: bool,
    /// Fan-out directories this build published objects in, whose entries
    /// [`Objects::sync_names`] makes durable before the image names them.
    published_in: std::collections::BTreeSet<PathBuf>,
    /// An object may be a layer file's own inode (false where layers keep their data in
    /// objects: no layer file an image shows is ever another's object).
    pub(crate) link_layer_files: bool,
}

impl<'a> Objects<'a> {
    /// Objects in `dir` (the store's `objects/`), copies staged at `staging`, each
    /// sealed with fs-verity when `verity`.
    pub(crate) fn new(host: &'a dyn HostFs, dir: PathBuf, staging: PathBuf, verity: bool) -> Self {
        Objects {
            host,
            dir,
            staging,
            can_share: true,
            shared_bytes: 0,
            verity,
            published_in: std::collections::BTreeSet::new(),
            link_layer_files: true,
        }
    }

    /// A layer's regular file as the image records it: inline when small, otherwise an
    /// object in `objects/`, made if no file of that content is there yet. When one is
    /// there already (another layer's file, of this image or another), the layer's file
    /// is made to share the object's extents where the filesystem can (xfs, btrfs), so
    /// the store holds that content once on disk (issue 24) while every layer keeps its
    /// own inode, owner, mode and hardlinks for the strategies that mount layers.
    pub(crate) fn store(&mut self, layer_file: &LayerFile) -> io::Result<RegularFile<ObjectId>> {
        let path = &layer_file.path;
        // An imported layer's stub (a store whose layers keep their data in objects):
        // its data is an object already, under its short name.
        if layer_file.linkable
            && layer_file.size > composefs::INLINE_CONTENT_MAX_V0 as u64
            && let Some(short) =
                lamina_store::object_layers::stub_object(self.host, lamina_sys::At::Path(path))?
        {
            return self.store_stub(&short, layer_file.size);
        }
        // A committed snapshot's file may still be written, or swapped for a symlink, by
        // its container: opened once, beneath its layer's root and following nothing.
        let mut file = if layer_file.linkable {
            File::open(path)?
        } else {
            let rel = path
                .strip_prefix(&*layer_file.root)
                .map_err(io::Error::other)?;
            lamina_store::beneath::Tree::open(&layer_file.root)?.open_regular(rel)?
        };
        let size = file.metadata()?.len();
        if size <= composefs::INLINE_CONTENT_MAX_V0 as u64 {
            let mut data = Vec::with_capacity(size as usize);
            io::Read::read_to_end(&mut io::Read::take(&mut file, size), &mut data)?;
            return Ok(RegularFile::Inline(data.into()));
        }
        if !layer_file.linkable {
            // What the merge counted against the image's bounds is what is copied: a file
            // that grew or shrank since is refused, so no bound is passed by a later
            // truncate.
            if size != layer_file.size {
                return Err(io::Error::other(format!(
                    "{}: changed since the layers were merged",
                    path.display()
                )));
            }
            let stored = self.store_copy(&file, size);
            if stored.is_err() {
                let _ = fs::remove_file(&self.staging);
            }
            return stored;
        }
        let (id, hashed) = digest_of(&mut file)?;
        let object = self.dir.join(id.to_object_pathname());
        if object.exists() {
            self.share(&object, &file, path, hashed);
            // Published by a build running beside this one, its name maybe not yet
            // durable: synced here too before this image names it.
            if let Some(fan_out) = object.parent() {
                self.published_in.insert(fan_out.to_path_buf());
            }
        } else {
            // A hardlink set's inode is copied: lent to other images, its thousands of
            // links could reach the filesystem's link limit. Its only name is its own while
            // no object is made of it.
            let alone = self.link_layer_files && file.metadata()?.nlink() == 1;
            drop(file);
            self.publish(path, &object, alone)?;
        }
        if self.verity {
            seal(self.host, &object)?;
        }
        Ok(RegularFile::External(id, hashed))
    }

    /// Stores the content of `file` (`size` bytes, of a committed snapshot) as an object
    /// of its own: copied (a reflink where the filesystem has them) into the build's
    /// staging name, then hashed from that copy, which nothing else can write, so the
    /// object's name is always its content (hashing the layer file and copying it after
    /// would let a write in between put other bytes under the name). At most `size` bytes
    /// are copied. The caller removes the staging copy on an error.
    fn store_copy(&mut self, file: &File, size: u64) -> io::Result<RegularFile<ObjectId>> {
        // Content some object has already (every build of a chain after its first): the
        // bytes just read are that object's, so it is what the image names, and nothing
        // is copied or synced (copying and syncing every snapshot file on every build costs
        // 4316 fsyncs where 567 do).
        let (id, read) = digest_of(io::Read::take(file, size))?;
        let object = self.dir.join(id.to_object_pathname());
        if read == size && object.exists() {
            return self.named(id, &object, read);
        }
        let (copy, id, hashed) = copy_and_hash(self.host, file, size, &self.staging)?;
        let object = self.dir.join(id.to_object_pathname());
        if object.exists() {
            fs::remove_file(&self.staging)?;
        } else {
            self.host.fsync(&copy, &self.staging)?;
            self.make_fan_out(&object)?;
            fs::rename(&self.staging, &object)?;
        }
        drop(copy);
        self.named(id, &object, hashed)
    }

    /// The object a stub's redirect names (`short`, under `objects/`), `size` bytes as
    /// the stub says, as the image names it: by its whole digest, a second name of the
    /// same inode made if missing. Hashed, so a damaged object fails the build rather
    /// than be named by a digest it no longer has.
    fn store_stub(&mut self, short: &Path, size: u64) -> io::Result<RegularFile<ObjectId>> {
        let tree = lamina_store::beneath::Tree::open(&self.dir)?;
        let object = tree.open_regular(short)?;
        let (id, hashed) = digest_of(io::Read::take(&object, size + 1))?;
        if hashed != size || Path::new(&lamina_store::object_layers::short_name(&id)) != short {
            return Err(io::Error::other(format!(
                "object {} does not hold the content its name says (`lamina check --verify` names the layer)",
                self.dir.join(short).display()
            )));
        }
        let named = self.dir.join(id.to_object_pathname());
        self.make_fan_out(&named)?;
        match fs::hard_link(self.dir.join(short), &named) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        self.named(id, &named, hashed)
    }

    /// `object` (of content `id`, `len` bytes) as the image names it: its fan-out synced
    /// before the image appears, sealed where the store seals.
    fn named(
        &mut self,
        id: ObjectId,
        object: &Path,
        len: u64,
    ) -> io::Result<RegularFile<ObjectId>> {
        if let Some(fan_out) = object.parent() {
            self.published_in.insert(fan_out.to_path_buf());
        }
        if self.verity {
            seal(self.host, object)?;
        }
        Ok(RegularFile::External(id, len))
    }

    /// Makes `object`'s fan-out directory if it is missing, and remembers to sync it.
    fn make_fan_out(&mut self, object: &Path) -> io::Result<()> {
        if let Some(fan_out) = object.parent() {
            // Only the fan-out directory: a build that outlived `delete-store` must not
            // make the store's directories again.
            match fs::create_dir(fan_out) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            self.published_in.insert(fan_out.to_path_buf());
        }
        Ok(())
    }

    /// Makes `object` hold the content of the imported layer file `path`: its own inode
    /// when `link`, else a copy.
    fn publish(&mut self, path: &Path, object: &Path, link: bool) -> io::Result<()> {
        self.make_fan_out(object)?;
        let linked = if link {
            fs::hard_link(path, object)
        } else {
            Err(io::Error::other("a hardlink set is copied"))
        };
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            // A hardlink set, past the filesystem's link limit, or refused: a copy of our own (a reflink
            // where the filesystem has them: `fs::copy` asks for one), written in `tmp/`
            // under the build's name (swept with it after a crash), synced, then
            // published whole by a rename: an object's name is never trusted before its
            // content is on disk. An imported layer's file is never written, so what is
            // copied is what was hashed.
            // A copy that fails (ENOSPC, most often) leaves no staging file behind.
            Err(_) => {
                let copied = (|| {
                    fs::copy(path, &self.staging)?;
                    self.host
                        .fsync(&File::open(&self.staging)?, &self.staging)?;
                    fs::rename(&self.staging, object)
                })();
                if copied.is_err() {
                    let _ = fs::remove_file(&self.staging);
                }
                copied?;
            }
        }
        Ok(())
    }

    /// Makes the names of the objects this build published durable: an fsync of each
    /// fan-out directory it linked into (and of `objects/`, which may have gained one).
    /// An object's data is a layer's, synced when it was imported, or a copy synced
    /// before its rename; so only names are at stake, and a `syncfs` of the whole store
    /// filesystem — every container's dirty upper with it, stall S1 — is not needed.
    pub(crate) fn sync_names(&self) -> io::Result<()> {
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
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => true,
        };
        if same_inode {
            return;
        }
        match self.host.share_extents(&source, file, path, len) {
            Ok(shared) => self.shared_bytes += shared,
            // The filesystem has no shared extents (ext4, tmpfs): no use asking again.
            Err(lamina_sys::Errno::OPNOTSUPP | lamina_sys::Errno::XDEV) => {
                self.can_share = false;
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "layer file keeps its own extents")
            }
        }
    }
}

/// Copies at most `size` bytes of `source` from its start into a new file at `staging`
/// (a reflink where the filesystem has them), and hashes that copy, which nothing else
/// writes: the copy, its digest and its length. The copy is not synced; the caller
/// removes it on an error.
pub(crate) fn copy_and_hash(
    host: &dyn HostFs,
    source: &File,
    size: u64,
    staging: &Path,
) -> io::Result<(File, ObjectId, u64)> {
    let copy = File::create(staging)?;
    let mut from = 0u64;
    while from < size {
        match host.copy_range(source, from, &copy, staging, size - from) {
            Ok(0) => break,
            Ok(copied) => from += copied,
            // No in-kernel copy between these files: read and write.
            Err(_) if from == 0 => {
                io::Seek::seek(&mut &*source, io::SeekFrom::Start(0))?;
                io::copy(&mut io::Read::take(source, size), &mut &copy)?;
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    let (id, hashed) = digest_of(File::open(staging)?)?;
    Ok((copy, id, hashed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_that_cannot_be_published_leaves_no_staging_file() {
        let tmp = tempfile::tempdir().unwrap();
        let host = lamina_sys::FakeMounter::new();
        let layer_file = tmp.path().join("layer-file");
        fs::write(&layer_file, vec![7u8; 4096]).unwrap();
        let staging = tmp.path().join("tmp-objects-staging");
        let mut objects = Objects::new(&host, tmp.path().join("objects"), staging.clone(), false);
        // A directory where the object's name goes: the copy is made and synced, and
        // its rename fails as a full filesystem's copy would have.
        let object = tmp.path().join("objects/ab/cdef");
        fs::create_dir_all(object.join("in-the-way")).unwrap();
        let err = objects.publish(&layer_file, &object, false).unwrap_err();
        assert!(!staging.exists(), "staging copy left after {err}");
        assert!(object.join("in-the-way").exists());
    }
}
