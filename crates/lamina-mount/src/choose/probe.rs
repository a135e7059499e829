//! What this kernel's overlay really supports, found by trying it on the store's own
//! filesystem (upper-fs support is what decides metacopy and volatile), once per boot and
//! kernel. The result is cached in `<store>/run/probe.json`; a different boot or kernel
//! release invalidates it, so an upgraded host never trusts a stale answer.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

use lamina_store::Store;
use lamina_sys::{At, HostFs, Mounter, OverlaySpec};
use serde::{Deserialize, Serialize};

/// Overlay's compiled-in limit; the probe confirms it rather than assuming it.
const EXPECTED_MAX_LOWERS: usize = 500;
const PROBE_SEARCH_CEILING: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// `uname -r` and the boot ID the probe ran under: the cache key.
    pub kernel: String,
    pub boot_id: String,
    pub new_mount_api: bool,
    pub lowerdir_plus: bool,
    /// Metadata-only copy-up really happened: a chown through a `metacopy=on` overlay
    /// left an upper file with the metacopy xattr and without its data.
    pub metacopy: bool,
    pub volatile: bool,
    pub redirect_dir: bool,
    /// An idmapped mount (of a user namespace's mappings) is accepted as a lower layer.
    #[serde(default)]
    pub idmapped_layers: bool,
    pub max_lower_layers: usize,
    /// An EROFS image file mounts without a loop device (Linux 6.12): what composefs's
    /// metadata images need. `None` in a cache written before lamina asked: probe again.
    #[serde(default)]
    pub erofs_file_backed: Option<bool>,
    /// The store's filesystem seals a file with fs-verity: composefs seals its objects
    /// and images and mounts with `verity=require`. `None` in a cache written before
    /// lamina asked: probe again.
    #[serde(default)]
    pub fs_verity: Option<bool>,
}

/// The cached probe when it matches this boot and kernel, otherwise a fresh one (cached).
pub fn probe(store: &Store, mounter: &dyn Mounter, refresh: bool) -> std::io::Result<Probe> {
    let cache = cache_path(store);
    let (kernel, boot_id) = (kernel_release(), boot_id());
    let current = || {
        read_cache(&cache).filter(|cached| {
            cached.kernel == kernel
                && cached.boot_id == boot_id
                && cached.erofs_file_backed.is_some()
                && cached.fs_verity.is_some()
        })
    };
    if !refresh && let Some(cached) = current() {
        return Ok(cached);
    }
    // One probe at a time in a process: its scratch directory and the cache's temporary
    // file are named by the process, and a daemon's pool refill, a Prepare and a
    // composefs build can all find the cache missing at once. A thread that waited
    // takes what the one before it found.
    static PROBING: Mutex<()> = Mutex::new(());
    let _probing = PROBING.lock().unwrap_or_else(PoisonError::into_inner);
    if !refresh && let Some(cached) = current() {
        return Ok(cached);
    }
    let scratch = Scratch::new(store)?;
    let api = mounter.probe_mount_api();
    let result = Probe {
        kernel,
        boot_id,
        new_mount_api: api.new_mount_api,
        lowerdir_plus: api.lowerdir_plus,
        metacopy: probe_metacopy(mounter, &**store.host(), &scratch.dir("metacopy")?),
        volatile: mounts_with(mounter, &scratch.dir("volatile")?, ("volatile", None)),
        redirect_dir: mounts_with(
            mounter,
            &scratch.dir("redirect")?,
            ("redirect_dir", Some("on")),
        ),
        idmapped_layers: probe_idmapped(mounter, &scratch.dir("idmap")?),
        max_lower_layers: probe_max_lowers(mounter, &scratch.dir("lowers")?)?,
        erofs_file_backed: Some(probe_erofs(mounter, &scratch.dir("erofs")?)),
        fs_verity: Some(probe_verity(&**store.host(), &scratch.dir("verity")?)),
    };
    if !result.metacopy {
        tracing::warn!("metadata-only copy-up does not work on this kernel and store filesystem");
    }
    fs::create_dir_all(cache.parent().unwrap_or(store.root()))?;
    // Concurrent first creates of several processes all probe; each writes its own file,
    // and the last rename wins (every result is the same).
    let tmp = cache.with_extension(format!("json.tmp.{}", std::process::id()));
    fs::write(&tmp, serde_json::to_vec_pretty(&result)?)?;
    fs::rename(&tmp, &cache)?;
    Ok(result)
}

pub fn cache_path(store: &Store) -> PathBuf {
    store.root().join("run").join("probe.json")
}

/// The running kernel's release, asked once: it cannot change while a process runs.
pub(crate) fn kernel_release() -> String {
    static RELEASE: OnceLock<String> = OnceLock::new();
    RELEASE
        .get_or_init(|| {
            rustix::system::uname()
                .release()
                .to_string_lossy()
                .into_owned()
        })
        .clone()
}

/// This boot's ID, kept once read: a process does not outlive its boot. A failed read
/// answers "" and is tried again next time.
pub(crate) fn boot_id() -> String {
    static BOOT_ID: OnceLock<String> = OnceLock::new();
    if let Some(id) = BOOT_ID.get() {
        return id.clone();
    }
    match fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        Ok(id) => BOOT_ID.get_or_init(|| id.trim().to_string()).clone(),
        Err(_) => String::new(),
    }
}

/// The cached probe at `path`, parsed. A daemon asks on every create, so what it parsed
/// is kept with the file's identity (device, inode, size, change and modification times)
/// and parsed again only when one of them differs. lamina replaces the file by rename (a
/// new inode); a write in place by hand that keeps its size within one timestamp tick
/// goes unseen until the file next changes.
fn read_cache(path: &Path) -> Option<Probe> {
    /// Stores one process keeps parsed probes for; the CLI uses one, a test process many.
    const MOST_KEPT: usize = 8;
    static KEPT: Mutex<Vec<(PathBuf, FileStamp, Probe)>> = Mutex::new(Vec::new());
    let stamp = FileStamp::of(path)?;
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, _, probe)) = kept.iter().find(|(p, s, _)| p == path && *s == stamp) {
        return Some(probe.clone());
    }
    // A few hundred bytes as lamina writes it; anything past the bound is not its, and
    // is probed again rather than read whole under the lock.
    const MOST_BYTES: u64 = 64 * 1024;
    let bytes = lamina_store::read_regular_file_at_most(path, MOST_BYTES).ok()?;
    let probe = serde_json::from_slice::<Probe>(&bytes).ok()?;
    kept.retain(|(p, _, _)| p != path);
    if kept.len() >= MOST_KEPT {
        kept.remove(0);
    }
    // Stamped before the read: a write between the two is seen at the next call.
    kept.push((path.to_path_buf(), stamp, probe.clone()));
    Some(probe)
}

/// What changes when a file is replaced or written: its identity for [`read_cache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// The stamp of the regular file at `path` (not followed if a symlink).
    fn of(path: &Path) -> Option<FileStamp> {
        let meta = fs::symlink_metadata(path).ok()?;
        meta.file_type().is_file().then(|| FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// A probe workspace under the store's tmp/, removed (after unmounting) on drop.
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new(store: &Store) -> std::io::Result<Self> {
        let root = store
            .layout()
            .tmp()
            .join(format!("probe-{}", std::process::id()));
        if root.exists() {
            fs::remove_dir_all(&root)?;
        }
        fs::create_dir_all(&root)?;
        Ok(Self { root })
    }

    fn dir(&self, name: &str) -> std::io::Result<PathBuf> {
        let dir = self.root.join(name);
        for sub in ["lower", "upper", "work", "merged"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        Ok(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn rw_spec(dir: &Path, option: Option<(&str, Option<&str>)>) -> OverlaySpec {
    OverlaySpec {
        lowers: vec![dir.join("lower")],
        upper: Some(dir.join("upper")),
        work: Some(dir.join("work")),
        options: option
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .into_iter()
            .collect(),
        ..OverlaySpec::default()
    }
}

/// Mounts, runs `check` on the merged dir, always unmounts. `None` if the mount failed.
fn with_mount<T>(
    mounter: &dyn Mounter,
    spec: &OverlaySpec,
    merged: &Path,
    check: impl FnOnce(&Path) -> T,
) -> Option<T> {
    mounter.mount_overlay(spec, merged).ok()?;
    let result = check(merged);
    if let Err(e) = mounter.unmount(merged) {
        tracing::error!(error = %e, "probe could not unmount its scratch overlay");
    }
    Some(result)
}

fn mounts_with(mounter: &dyn Mounter, dir: &Path, option: (&str, Option<&str>)) -> bool {
    with_mount(
        mounter,
        &rw_spec(dir, Some(option)),
        &dir.join("merged"),
        |_| (),
    )
    .is_some()
}

/// Mounts an empty EROFS image file (the `composefs` crate writes it) and unmounts it.
fn probe_erofs(mounter: &dyn Mounter, dir: &Path) -> bool {
    let tree = composefs::tree::FileSystem::<composefs::fsverity::Sha256HashValue>::new(
        composefs::generic_tree::Stat {
            st_mode: 0o755,
            ..composefs::generic_tree::Stat::uninitialized()
        },
    );
    let Ok(tree) = composefs::erofs::writer::ValidatedFileSystem::new(tree) else {
        return false;
    };
    let image = dir.join("image.erofs");
    if fs::write(&image, composefs::erofs::writer::mkfs_erofs(&tree)).is_err() {
        return false;
    }
    let target = dir.join("merged");
    let mounted = mounter.mount_erofs(&image, &target).is_ok();
    if mounted {
        let _ = mounter.unmount(&target);
    }
    mounted
}

/// Seals a file of one block in the store's filesystem with fs-verity.
fn probe_verity(host: &dyn HostFs, dir: &Path) -> bool {
    let path = dir.join("sealed");
    if fs::write(&path, [b'v'; 4096]).is_err() {
        return false;
    }
    fs::File::open(&path).is_ok_and(|file| host.enable_verity(&file, &path).is_ok())
}

/// The chown and the xattr read go through the store's host, like every ownership call.
fn probe_metacopy(mounter: &dyn Mounter, host: &dyn HostFs, dir: &Path) -> bool {
    let data = vec![b'm'; 256 * 1024];
    if fs::write(dir.join("lower/file"), &data).is_err() {
        return false;
    }
    let spec = rw_spec(dir, Some(("metacopy", Some("on"))));
    let chowned = with_mount(mounter, &spec, &dir.join("merged"), |merged| {
        let file = merged.join("file");
        host.stat(At::Path(&file))
            .and_then(|st| host.chown(At::Path(&file), 4242, st.st_gid))
            .is_ok()
    });
    if chowned != Some(true) {
        return false;
    }
    let upper = dir.join("upper/file");
    let has_xattr = host
        .get_xattr(At::Path(&upper), OsStr::new("trusted.overlay.metacopy"))
        .is_ok_and(|v| v.is_some());
    // Not `blocks == 0`: ext4 charges the upper inode a block for its xattrs. A real
    // copy-up of the data would allocate at least the file's size.
    let no_data = host
        .stat(At::Path(&upper))
        .is_ok_and(|st| st.st_size == data.len() as i64 && st.st_blocks * 512 < st.st_size / 4);
    has_xattr && no_data
}

/// Builds an overlay (never attached) with an idmapped lower, for a typical Garden
/// mapping of 65536 ids.
fn probe_idmapped(mounter: &dyn Mounter, dir: &Path) -> bool {
    let map = "0 100000 65536\n".to_string();
    idmapped_layers_through(
        mounter,
        dir,
        &lamina_sys::UserNsMaps {
            uid_map: map.clone(),
            gid_map: map,
        },
    )
}

/// Whether overlay on the filesystem of `parent` accepts layers idmapped with `maps`:
/// what `init-store` asks before it records a uid-mapped store that idmaps its layers
/// (else it chowns them at import). Works in a scratch directory it removes.
pub fn idmapped_layers_on(parent: &Path, maps: &lamina_sys::UserNsMaps) -> bool {
    idmapped_layers_through(&lamina_sys::RealMounter::new(), parent, maps)
}

/// [`idmapped_layers_on`], asking `mounter` (the kernel seam).
pub fn idmapped_layers_through(
    mounter: &dyn Mounter,
    parent: &Path,
    maps: &lamina_sys::UserNsMaps,
) -> bool {
    let dir = parent.join(format!(".lamina-idmap-probe-{}", std::process::id()));
    let made =
        fs::create_dir_all(dir.join("lower")).and_then(|()| fs::create_dir(dir.join("other")));
    let supported =
        made.is_ok() && mounter.probe_idmapped_layers(&dir.join("lower"), &dir.join("other"), maps);
    let _ = fs::remove_dir_all(&dir);
    supported
}

/// The most lower layers one overlay accepts: confirm the known limit, else bisect.
fn probe_max_lowers(mounter: &dyn Mounter, dir: &Path) -> std::io::Result<usize> {
    let merged = dir.join("merged");
    let mut lowers: Vec<PathBuf> = Vec::new();
    // Lower dirs are made only as far as a trial needs: confirming the known limit takes
    // 501 of them, and only a kernel with another limit pays for the bisection's.
    let mut fits = |n: usize| -> std::io::Result<bool> {
        while lowers.len() < n {
            let lower = dir.join("lower").join(lowers.len().to_string());
            fs::create_dir_all(&lower)?;
            lowers.push(lower);
        }
        let spec = OverlaySpec {
            lowers: lowers[..n].to_vec(),
            read_only: true,
            ..OverlaySpec::default()
        };
        Ok(with_mount(mounter, &spec, &merged, |_| ()).is_some())
    };
    if fits(EXPECTED_MAX_LOWERS)? && !fits(EXPECTED_MAX_LOWERS + 1)? {
        return Ok(EXPECTED_MAX_LOWERS);
    }
    let (mut ok, mut bad) = (0, PROBE_SEARCH_CEILING + 1);
    while bad - ok > 1 {
        let mid = (ok + bad) / 2;
        if fits(mid)? { ok = mid } else { bad = mid }
    }
    Ok(ok)
}
