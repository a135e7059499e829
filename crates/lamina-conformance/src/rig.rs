//! What differs between running the suite against the fake mounter and against the real
//! kernel: how a file gets into and out of a container's rootfs, whether the rootfs is
//! read-only, what is still mounted, and which faults can be injected.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lamina_image::{Image, ImageRef, Platform, resolve};
use lamina_store::{Store, StoreProperties};
use lamina_sys::{
    Errno, FakeMounter, MountApiSupport, MountError, Mounter, OverlaySpec, RealMounter, UpperFs,
    UserNsMaps, When,
};

use crate::adapter::{self, Made};
use crate::table::Call;

pub trait Rig {
    /// For messages: `fake`, `ext4`, `xfs`.
    fn name(&self) -> &str;
    fn store(&self) -> &Store;
    fn mounter(&self) -> &dyn Mounter;
    fn image(&self) -> &Image;
    /// Writes `data` at `rel` inside `made`'s rootfs.
    fn write(&self, made: &Made, rel: &str, data: &[u8]) -> io::Result<()>;
    /// Reads `rel` inside `made`'s rootfs.
    fn read(&self, made: &Made, rel: &str) -> io::Result<Vec<u8>>;
    /// Whether a write into `made`'s rootfs is refused as on a read-only filesystem.
    fn is_read_only(&self, made: &Made) -> bool;
    /// Everything mounted at or below the store's root.
    fn mounts_under_store(&self) -> Vec<PathBuf>;
    /// Whether [`Rig::inject`] can make `call` fail here.
    fn can_inject(&self, call: Call) -> bool;
    /// Makes `call` fail next with `errno`; `false` when this rig cannot.
    fn inject(&self, call: Call, errno: Errno) -> bool;
    /// Whether the store is on btrfs with quotas: this rig runs the rows only such a
    /// store serves (`isolated-quota`), and those alone.
    fn quota_store(&self) -> bool {
        self.mounter().btrfs_quotas(self.store().root())
    }
    /// Whether [`Rig::set_immutable`] works here.
    fn supports_immutable(&self) -> bool;
    /// Sets or clears the immutable attribute of `path`; `false` when that failed.
    fn set_immutable(&self, path: &Path, on: bool) -> bool;
}

/// Builds the sample image (a stand-in busybox: nothing runs it) under `dir`.
pub fn sample_image(dir: &Path) -> Image {
    fs::create_dir_all(dir).expect("image dir");
    let busybox = dir.join("stand-in-busybox");
    fs::write(&busybox, b"#!/bin/true\n").expect("stand-in busybox");
    let built = lamina_sample::busybox_image(&busybox).expect("building the sample image");
    let files =
        lamina_sample::write_all_formats(&built, &dir.join("image")).expect("writing the image");
    resolve(
        &ImageRef::parse(&files.references()[0]).expect("sample reference"),
        &Platform::host(),
    )
    .expect("resolving the sample image")
}

/// The fake mounter: nothing is mounted, so a rootfs's contents are read from and
/// written to the directories its (recorded) overlay or bind would show.
#[derive(Debug)]
pub struct FakeRig {
    pub fake: Arc<FakeMounter>,
    store: Store,
    image: Image,
}

impl FakeRig {
    /// The store's host is the fake too: ownership and device nodes an import sets are
    /// recorded, not made, so the suite runs as any user.
    pub fn new(dir: &Path) -> FakeRig {
        let fake = Arc::new(FakeMounter::new());
        let store = Store::init_hosted(
            &dir.join("store"),
            &StoreProperties::default(),
            fake.clone(),
        )
        .expect("store");
        let image = sample_image(&dir.join("sample"));
        adapter::assume_full_probe(&store, fake.as_ref()).expect("caching a probe");
        FakeRig { fake, store, image }
    }

    /// A fake whose store is on btrfs with quotas enabled: the rig for the rows only
    /// such a store serves.
    pub fn with_quotas(dir: &Path) -> FakeRig {
        let rig = FakeRig::new(dir);
        rig.fake.set_kernel(lamina_sys::FakeKernel {
            btrfs_quotas: true,
            ..lamina_sys::FakeKernel::default()
        });
        rig
    }
}

/// Where an overlay's `upper` is now. The fake keeps a mount's spec as it was mounted,
/// and a pool slot's was mounted in a staging directory since renamed to the container's
/// (the kernel follows the inode; `/proc/mounts` keeps the old path too): the upper is
/// the same path below the container's directory.
fn moved_with(made: &Made, upper: &Path) -> PathBuf {
    if upper.is_dir() {
        return upper.to_path_buf();
    }
    let base = made.rootfs.parent().unwrap_or(&made.rootfs);
    let parts: Vec<_> = upper.components().collect();
    (1..parts.len())
        .map(|n| base.join(parts[parts.len() - n..].iter().collect::<PathBuf>()))
        .find(|candidate| candidate.is_dir())
        .unwrap_or_else(|| upper.to_path_buf())
}

/// `rel` as a composefs overlay shows it: looked up in the EROFS metadata image, its
/// content inline or in the object its entry names under a data-only lower.
fn read_composefs(image: &Path, data_lowers: &[PathBuf], rel: &str) -> io::Result<Vec<u8>> {
    use composefs::fsverity::{FsVerityHashValue, Sha256HashValue};
    use composefs::generic_tree::{Inode, LeafContent};
    use composefs::tree::RegularFile;
    let not_found = || io::Error::new(io::ErrorKind::NotFound, rel.to_string());
    let bytes = fs::read(image)?;
    let tree = composefs::erofs::reader::erofs_to_filesystem::<Sha256HashValue>(&bytes)
        .map_err(|e| io::Error::other(format!("reading {}: {e:#}", image.display())))?;
    let path = Path::new(rel);
    let dir = tree
        .root
        .get_directory(path.parent().unwrap_or(Path::new("")).as_os_str())
        .map_err(|_| not_found())?;
    let Some(Inode::Leaf(id, _)) = path.file_name().and_then(|name| dir.lookup(name)) else {
        return Err(not_found());
    };
    match &tree.leaves[id.0].content {
        LeafContent::Regular(RegularFile::Inline(data)) => Ok(data.to_vec()),
        LeafContent::Regular(
            RegularFile::External(object, _) | RegularFile::ExternalNoVerity(object, _),
        ) => data_lowers
            .iter()
            .map(|d| d.join(object.to_object_pathname()))
            .find(|p| p.is_file())
            .map_or_else(|| Err(not_found()), fs::read),
        _ => Err(io::Error::other(format!("{rel} is not a regular file"))),
    }
}

fn erofs() -> io::Error {
    io::Error::from_raw_os_error(Errno::ROFS.raw_os_error())
}

fn not_mounted(made: &Made) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("nothing is mounted on {}", made.rootfs.display()),
    )
}

impl Rig for FakeRig {
    fn name(&self) -> &str {
        "fake"
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn mounter(&self) -> &dyn Mounter {
        self.fake.as_ref()
    }

    fn image(&self) -> &Image {
        &self.image
    }

    fn write(&self, made: &Made, rel: &str, data: &[u8]) -> io::Result<()> {
        let spec = self
            .fake
            .spec_at(&made.rootfs)
            .ok_or_else(|| not_mounted(made))?;
        if spec.read_only {
            return Err(erofs());
        }
        let upper = spec
            .upper
            .as_deref()
            .map(|u| moved_with(made, u))
            .ok_or_else(|| io::Error::other("a read-write overlay without an upper"))?;
        let path = upper.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, data)
    }

    fn read(&self, made: &Made, rel: &str) -> io::Result<Vec<u8>> {
        let spec = self
            .fake
            .spec_at(&made.rootfs)
            .ok_or_else(|| not_mounted(made))?;
        // Upper first, then the lowers top-most first, as overlay looks them up (a bind of
        // a plain directory is recorded as its only lower).
        let upper = spec.upper.as_deref().map(|u| moved_with(made, u));
        for dir in upper.iter().chain(&spec.lowers) {
            // A lower inside a (fake) mounted composefs metadata image: its `rootfs/`.
            let mounted = dir.parent().and_then(|mnt| self.fake.erofs_image_at(mnt));
            if let (Some(image), Some(sub)) = (mounted, dir.file_name()) {
                let rel = Path::new(sub).join(rel);
                match read_composefs(&image, &spec.data_lowers, &rel.to_string_lossy()) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    found => return found,
                }
            }
            let path = dir.join(rel);
            if path.exists() {
                return fs::read(path);
            }
        }
        Err(io::Error::new(io::ErrorKind::NotFound, rel.to_string()))
    }

    fn is_read_only(&self, made: &Made) -> bool {
        self.fake
            .spec_at(&made.rootfs)
            .is_some_and(|spec| spec.read_only || spec.upper.is_none())
    }

    fn mounts_under_store(&self) -> Vec<PathBuf> {
        let root = self.store.root().to_path_buf();
        self.fake
            .mounted()
            .into_iter()
            .filter(|p| p.starts_with(&root))
            .collect()
    }

    fn can_inject(&self, _call: Call) -> bool {
        true
    }

    fn supports_immutable(&self) -> bool {
        false
    }

    fn inject(&self, call: Call, errno: Errno) -> bool {
        match call {
            Call::NextMount => self.fake.fail_next_mount(errno),
            Call::NextOverlayMount => self.fake.fail_next_overlay_mount(errno),
            Call::NextSync => self.fake.fail_next_sync(errno),
            Call::NextUnmount => self
                .fake
                .fail(lamina_sys::Call::Unmount, When::Nth(1), errno),
        }
        true
    }

    fn set_immutable(&self, _path: &Path, _on: bool) -> bool {
        false
    }
}

/// The real mounter with the fake's injections in front: an armed call fails with its
/// errno before reaching the kernel; everything else (the rollback's unmounts, the loop
/// devices, the mount table `check` reads) is real.
#[derive(Debug, Default)]
pub struct FaultyMounter {
    inner: RealMounter,
    next_mount: Mutex<Option<Errno>>,
    next_overlay: Mutex<Option<Errno>>,
    next_sync: Mutex<Option<Errno>>,
    next_unmount: Mutex<Option<Errno>>,
}

fn take(slot: &Mutex<Option<Errno>>) -> Option<Errno> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

impl FaultyMounter {
    fn arm(&self, call: Call, errno: Errno) {
        let slot = match call {
            Call::NextMount => &self.next_mount,
            Call::NextOverlayMount => &self.next_overlay,
            Call::NextSync => &self.next_sync,
            Call::NextUnmount => &self.next_unmount,
        };
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(errno);
    }
}

impl Mounter for FaultyMounter {
    fn mount_overlay(&self, spec: &OverlaySpec, target: &Path) -> Result<(), MountError> {
        if let Some(errno) = take(&self.next_mount).or_else(|| take(&self.next_overlay)) {
            return Err(MountError::new("mount overlay at", target, errno));
        }
        self.inner.mount_overlay(spec, target)
    }

    fn unmount(&self, target: &Path) -> Result<bool, MountError> {
        if let Some(errno) = take(&self.next_unmount) {
            return Err(MountError::new("unmount", target, errno));
        }
        self.inner.unmount(target)
    }

    fn in_use(&self, mount: &Path) -> bool {
        self.inner.in_use(mount)
    }

    fn is_mountpoint(&self, path: &Path) -> Result<bool, MountError> {
        self.inner.is_mountpoint(path)
    }

    fn writable_mount_of(&self, dir: &Path, except: &Path) -> Result<Option<PathBuf>, MountError> {
        self.inner.writable_mount_of(dir, except)
    }

    fn bind_read_only(&self, source: &Path, target: &Path) -> Result<(), MountError> {
        self.inner.bind_read_only(source, target)
    }

    fn sync_filesystem(&self, path: &Path) -> Result<(), MountError> {
        if let Some(errno) = take(&self.next_sync) {
            return Err(MountError::new("syncfs", path, errno));
        }
        self.inner.sync_filesystem(path)
    }

    fn mount_upper_fs(&self, fs: &UpperFs, target: &Path) -> Result<(), MountError> {
        if let Some(errno) = take(&self.next_mount) {
            return Err(MountError::new("mount upper filesystem at", target, errno));
        }
        self.inner.mount_upper_fs(fs, target)
    }

    fn mount_erofs(&self, image: &Path, target: &Path) -> Result<(), MountError> {
        if let Some(errno) = take(&self.next_mount) {
            return Err(MountError::new("mount EROFS image at", target, errno));
        }
        self.inner.mount_erofs(image, target)
    }

    fn mounts_under(&self, dir: &Path) -> Result<Vec<PathBuf>, MountError> {
        self.inner.mounts_under(dir)
    }

    fn probe_mount_api(&self) -> MountApiSupport {
        self.inner.probe_mount_api()
    }

    fn probe_idmapped_layers(&self, lower: &Path, other: &Path, maps: &UserNsMaps) -> bool {
        self.inner.probe_idmapped_layers(lower, other, maps)
    }

    fn detach_loop_device(&self, device: &Path) -> Result<(), MountError> {
        self.inner.detach_loop_device(device)
    }

    fn loop_backing_files(&self) -> Vec<(PathBuf, PathBuf)> {
        self.inner.loop_backing_files()
    }

    fn limit_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError> {
        self.inner.limit_subvolume(path, limit_bytes)
    }

    fn create_subvolume(&self, path: &Path, limit_bytes: u64) -> Result<(), MountError> {
        self.inner.create_subvolume(path, limit_bytes)
    }

    fn delete_subvolume(&self, path: &Path) -> Result<bool, MountError> {
        self.inner.delete_subvolume(path)
    }

    fn subvolume_usage(&self, path: &Path) -> Result<u64, MountError> {
        self.inner.subvolume_usage(path)
    }

    fn btrfs_quotas(&self, dir: &Path) -> bool {
        self.inner.btrfs_quotas(dir)
    }
}

/// The real kernel, on a store the caller put on a filesystem of its choice (a loop-
/// backed ext4 or xfs in the integration suite). Needs root.
#[derive(Debug)]
pub struct RealRig {
    name: String,
    mounter: FaultyMounter,
    store: Store,
    image: Image,
}

impl RealRig {
    pub fn new(name: &str, dir: &Path) -> RealRig {
        RealRig::with_properties(name, dir, &StoreProperties::default())
    }

    /// A rig whose store is made with `properties` (one whose layers keep their data in
    /// objects, say).
    pub fn with_properties(name: &str, dir: &Path, properties: &StoreProperties) -> RealRig {
        RealRig {
            name: name.to_string(),
            mounter: FaultyMounter::default(),
            store: Store::init_with(&dir.join("store"), properties).expect("store"),
            image: sample_image(&dir.join("sample")),
        }
    }
}

impl Rig for RealRig {
    fn name(&self) -> &str {
        &self.name
    }

    fn store(&self) -> &Store {
        &self.store
    }

    fn mounter(&self) -> &dyn Mounter {
        &self.mounter
    }

    fn image(&self) -> &Image {
        &self.image
    }

    fn write(&self, made: &Made, rel: &str, data: &[u8]) -> io::Result<()> {
        let path = made.rootfs.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, data)
    }

    fn read(&self, made: &Made, rel: &str) -> io::Result<Vec<u8>> {
        fs::read(made.rootfs.join(rel))
    }

    fn is_read_only(&self, made: &Made) -> bool {
        let probe = made.rootfs.join(".conformance-read-only-probe");
        match fs::File::create_new(&probe) {
            Ok(_) => {
                let _ = fs::remove_file(&probe);
                false
            }
            Err(e) => e.raw_os_error() == Some(Errno::ROFS.raw_os_error()),
        }
    }

    fn mounts_under_store(&self) -> Vec<PathBuf> {
        lamina_sys::mounts_under(self.store.root()).expect("reading the mount table")
    }

    fn can_inject(&self, _call: Call) -> bool {
        true
    }

    fn supports_immutable(&self) -> bool {
        true
    }

    fn inject(&self, call: Call, errno: Errno) -> bool {
        self.mounter.arm(call, errno);
        true
    }

    fn set_immutable(&self, path: &Path, on: bool) -> bool {
        std::process::Command::new("chattr")
            .arg(if on { "+i" } else { "-i" })
            .arg(path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}
