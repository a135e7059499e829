//! Container directories and records. A container's directory is built in `tmp/` with a
//! flocked `lock` file, then renamed into `images/<ID>` without replacing anything: that
//! rename is the atomic claim of an ID, and the held lock tells crash recovery the create
//! is still running. `container.json`, written last (a symlink whose target is the record,
//! or a file renamed into place), makes a container listed.

use std::fs::{self, File};
use std::io::Read;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{CWD, FlockOperation, RenameFlags};

use lamina_image::Digest;
use serde::{Deserialize, Serialize};

use crate::record_paths::MAX_RECORD_BYTES;
use crate::{Store, StoreError};

const RECORD: &str = "container.json";
/// Held (flock) by whoever is creating the container; free once it is complete or its
/// creator died.
pub const LOCK: &str = "lock";

/// What the store remembers about a container: what it was made from. How its rootfs
/// is provided (provider, upper, teardown, what is mounted) is lamina-mount's part of the
/// record, kept in [`ContainerRecord::rootfs`] and read and checked there: the store
/// never mounts, so it never interprets it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContainerRecord {
    pub id: String,
    /// The image reference it was created from.
    pub image: String,
    /// The image config digest.
    pub image_id: Digest,
    /// Chain IDs of its layers, bottom-most first.
    pub layers: Vec<Digest>,
    pub env: Vec<String>,
    pub created_unix: u64,
    /// Garden's disk limit, as asked for (`stats` reports it as `quota_size_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_limit: Option<DiskLimitRecord>,
    /// Every other field of `container.json`: lamina-mount's rootfs record (the
    /// `rootfs` object, or the flat fields records written before it had one).
    #[serde(flatten)]
    pub rootfs: serde_json::Map<String, serde_json::Value>,
}

/// A container's disk limit as the caller gave it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskLimitRecord {
    pub bytes: u64,
    /// The limit counts only what the container writes (`--exclude-image-from-quota`).
    pub exclude_image: bool,
}

/// A container directory this process is creating. Its `lock` stays held until the claim
/// is dropped, so crash recovery never mistakes a create in progress for a dead one.
#[derive(Debug)]
pub struct ContainerClaim {
    pub dirs: ContainerDirs,
    _lock: DirLock,
}

/// A held flock on a container-shaped directory's `lock` file (released on drop). Holds
/// nothing for a directory made before lamina kept lock files.
#[derive(Debug)]
pub struct DirLock {
    pub(crate) _held: Option<crate::Flocked>,
}

/// The directories of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDirs {
    pub base: PathBuf,
    pub rootfs: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

impl ContainerDirs {
    pub fn under(base: PathBuf) -> Self {
        Self {
            rootfs: base.join("rootfs"),
            upper: base.join("upper"),
            work: base.join("work"),
            base,
        }
    }

    /// Strategy `isolated`: upper and work live on the container's own filesystem,
    /// mounted at `upperfs/`.
    pub fn isolated(base: PathBuf) -> Self {
        let upper_fs = base.join(UPPER_FS);
        Self {
            rootfs: base.join("rootfs"),
            upper: upper_fs.join("upper"),
            work: upper_fs.join("work"),
            base,
        }
    }

    /// The isolated shape when the container has its own upper filesystem, else the
    /// plain one: how code that reads a record (or a pool's kind) finds the dirs.
    pub fn shaped(base: PathBuf, own_upper_fs: bool) -> Self {
        if own_upper_fs {
            Self::isolated(base)
        } else {
            Self::under(base)
        }
    }

    /// Where an isolated container's own upper filesystem is mounted.
    pub fn upper_fs_mount(&self) -> PathBuf {
        self.base.join(UPPER_FS)
    }

    /// The image file of an isolated container's disk-backed upper filesystem.
    pub fn upper_image(&self) -> PathBuf {
        self.base.join("upper.img")
    }
}

/// What a staged directory is called in `tmp/` until its lock is held: then `<pid>-…`,
/// so a crash in between leaves a name whose creator can be checked for.
pub const STAGING_PREFIX: &str = ".staging-";

/// The mount point of an isolated container's upper filesystem, in its directory.
const UPPER_FS: &str = "upperfs";

/// IDs become directory names and appear in Garden's paths.
pub fn validate_id(id: &str) -> Result<(), StoreError> {
    let why = if id.is_empty() {
        Some("is empty")
    } else if id.contains('/') {
        Some("contains invalid characters: `/`")
    } else if id == "." || id == ".." {
        Some("is `.` or `..`")
    } else if id.contains('\0') {
        Some("contains invalid characters: a NUL byte")
    } else if id.len() > 200 {
        Some("is longer than 200 bytes")
    } else if id.starts_with('.') {
        Some("starts with `.`")
    } else {
        None
    };
    match why {
        Some(why) => Err(StoreError::InvalidId {
            id: id.to_string(),
            why,
        }),
        None => Ok(()),
    }
}

/// [`validate_id`], and what a new container's ID must also be: printable on one line.
/// A newline, an escape sequence or a bidirectional override in an ID would print as a
/// second entry of `list`, rewrite an operator's terminal, or show another name, wherever
/// the ID is shown. IDs already in a store are
/// still found by the other commands (so they can be deleted) and are shown escaped.
pub fn validate_new_id(id: &str) -> Result<(), StoreError> {
    validate_id(id)?;
    if id
        .chars()
        .any(|c| c.is_control() || UNPRINTABLE.contains(&c))
    {
        return Err(StoreError::InvalidId {
            id: id.to_string(),
            why: "contains invalid characters: a control character",
        });
    }
    Ok(())
}

/// Characters that are not control characters but still move or hide what follows when
/// printed: line and paragraph separators, bidirectional overrides and isolates, and
/// invisible joiners.
const UNPRINTABLE: &[char] = &[
    '\u{200b}', '\u{200c}', '\u{200d}', '\u{200e}', '\u{200f}', '\u{2028}', '\u{2029}', '\u{202a}',
    '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2060}', '\u{2066}', '\u{2067}', '\u{2068}',
    '\u{2069}', '\u{feff}',
];

/// `text` with each control character escaped (`\n`, `\u{1b}`), for one line of output.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_control() || UNPRINTABLE.contains(&c) {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

impl Store {
    pub fn container_dirs(&self, id: &str) -> ContainerDirs {
        ContainerDirs::under(self.layout.container(id))
    }

    /// Claims `id` and makes its directories. Fails with `AlreadyExists` if the ID is
    /// taken, including by a create still in flight.
    pub fn create_container_dirs(&self, id: &str) -> Result<ContainerClaim, StoreError> {
        self.create_container_dirs_shaped(id, true)
    }

    /// [`Store::create_container_dirs`] with `rootfs/` alone: a read-only bind writes
    /// nothing, so it has no upper or work directory to make and remove.
    pub fn create_bind_container_dirs(&self, id: &str) -> Result<ContainerClaim, StoreError> {
        self.create_container_dirs_shaped(id, false)
    }

    fn create_container_dirs_shaped(
        &self,
        id: &str,
        upper: bool,
    ) -> Result<ContainerClaim, StoreError> {
        validate_id(id)?;
        if self.container_exists(id) {
            return Err(StoreError::AlreadyExists(id.into()));
        }
        // Published straight from its hidden name: a create's directory needs no `new-`
        // stage of its own, and a crash leaves it to `clean` as its dead creator's.
        let (staged, lock) = self.stage_dirs("new", upper, false)?;
        self.publish_container(&staged.base, lock, id)
            .inspect_err(|_| {
                let _ = crate::remove_tree(&staged.base);
            })
    }

    /// Makes a locked container directory (rootfs, upper, work, lock) under `tmp/`.
    pub fn stage_container_dirs(
        &self,
        prefix: &str,
    ) -> Result<(ContainerDirs, DirLock), StoreError> {
        self.stage_dirs(prefix, true, true)
    }

    /// Makes a locked container directory under `tmp/`, hidden (`.staging-`), and with
    /// `shown` renamed to its `prefix-` name once locked.
    fn stage_dirs(
        &self,
        prefix: &str,
        upper: bool,
        shown: bool,
    ) -> Result<(ContainerDirs, DirLock), StoreError> {
        let name = format!("{prefix}-{}", unique_suffix());
        // Made under a hidden name and shown only with its lock held: `clean` judges a
        // `new-`/`pool-` directory by its lock, and must never see one without it.
        let hidden = self.layout.tmp().join(format!("{STAGING_PREFIX}{name}"));
        let dirs = match shown {
            true => ContainerDirs::under(self.layout.tmp().join(&name)),
            false => ContainerDirs::under(hidden.clone()),
        };
        fs::create_dir(&hidden).map_err(StoreError::io("creating", &hidden))?;
        let lock = match lock_new(&hidden).and_then(|lock| match shown {
            true => fs::rename(&hidden, &dirs.base)
                .map(|()| lock)
                .map_err(StoreError::io("staging", &hidden)),
            false => Ok(lock),
        }) {
            Ok(lock) => lock,
            Err(e) => {
                let _ = crate::remove_tree(&hidden);
                return Err(e);
            }
        };
        let made = match upper {
            true => &[&dirs.rootfs, &dirs.upper, &dirs.work][..],
            false => &[&dirs.rootfs][..],
        };
        for dir in made {
            if let Err(e) = fs::create_dir(dir) {
                let _ = crate::remove_tree(&dirs.base);
                return Err(StoreError::io("creating", dir)(e));
            }
        }
        Ok((
            dirs,
            DirLock {
                _held: Some(crate::Flocked::new(lock)),
            },
        ))
    }

    /// Renames a staged (or pooled) container directory, whose `lock` the caller holds,
    /// to `images/<id>` — never over an existing one. On `AlreadyExists` the directory is
    /// left where it was, for the caller to dispose of.
    pub fn publish_container(
        &self,
        staged: &Path,
        lock: DirLock,
        id: &str,
    ) -> Result<ContainerClaim, StoreError> {
        validate_id(id)?;
        let dirs = self.container_dirs(id);
        match rustix::fs::renameat_with(CWD, staged, CWD, &dirs.base, RenameFlags::NOREPLACE) {
            Ok(()) => Ok(ContainerClaim { dirs, _lock: lock }),
            Err(rustix::io::Errno::EXIST) => Err(StoreError::AlreadyExists(id.into())),
            Err(e) => Err(StoreError::errno("claiming", &dirs.base)(e)),
        }
    }

    /// Takes the `lock` of a container-shaped directory if nobody holds it. `None` means
    /// a live process is working on it. A directory without a lock file (made by an older
    /// lamina), or with something there no lamina could lock (a FIFO, a symlink, a
    /// directory: `container_lock::open_dir_lock`), counts as unlocked.
    pub fn try_lock_dir(&self, dir: &Path) -> Result<Option<DirLock>, StoreError> {
        let path = dir.join(LOCK);
        let Some(file) = crate::container_lock::open_dir_lock(&path)? else {
            return Ok(Some(DirLock { _held: None }));
        };
        match rustix::fs::flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(DirLock {
                _held: Some(crate::Flocked::new(file)),
            })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(StoreError::errno("locking", &path)(e)),
        }
    }

    /// Moves container `id` out of `images/` into `trash/` in one rename: from then on it
    /// is not listed and its ID is free, and whatever tears it down finds it there even
    /// after a crash. Returns `None` if there was no such container.
    pub fn trash_container(&self, id: &str) -> Result<Option<PathBuf>, StoreError> {
        validate_id(id)?;
        let base = self.layout.container(id);
        let doomed = self
            .layout
            .trash()
            .join(format!("{id}.{}", unique_suffix()));
        match fs::rename(&base, &doomed) {
            Ok(()) => Ok(Some(doomed)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("moving to trash", &base)(e)),
        }
    }

    /// Container directories waiting in `trash/`, oldest name first.
    pub fn trash_entries(&self) -> Result<Vec<PathBuf>, StoreError> {
        list_dirs(&self.layout.trash())
    }

    /// Every container-shaped directory a record may live in: `images/*` and `trash/*`.
    /// Reference counts (shared mounts, flattened trees) are computed from these.
    pub fn all_container_dirs(&self) -> Result<Vec<PathBuf>, StoreError> {
        let mut dirs = list_dirs(&self.layout.images())?;
        dirs.extend(self.trash_entries()?);
        Ok(dirs)
    }

    /// The record in a container directory wherever it is (`images/`, `trash/`, a pool).
    /// `None` if there is none yet; [`StoreError::BadRecord`] if it exists but cannot be
    /// read as a record.
    pub fn record_in(&self, dir: &Path) -> Result<Option<ContainerRecord>, StoreError> {
        let id = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        read_record(&id, &dir.join(RECORD), false)
    }

    /// Writes the record durably: after a crash it is the previous record or this one,
    /// whole ([`crate::write_durably`]).
    pub fn write_record(&self, record: &ContainerRecord) -> Result<(), StoreError> {
        let (path, json) = self.encoded(record)?;
        self.write_durably(&path, &json)
    }

    /// Writes a new container's first record, whole after any crash, without waiting for
    /// the disk where the filesystem's journal makes that safe
    /// ([`crate::durable::write_new_with`]).
    pub fn write_new_record(&self, record: &ContainerRecord) -> Result<(), StoreError> {
        // Compact: a record short enough is a symlink's target, which xfs caps at 1023
        // bytes.
        let (path, json) = self.encoded_as(record, serde_json::to_vec)?;
        crate::durable::write_new_with(&**self.host(), &path, &json, self.symlink_records())
    }

    /// Where `record` goes, and its bytes. A record past [`MAX_RECORD_BYTES`] is refused
    /// here rather than written: every reader would refuse it (an image config may be up
    /// to 4 MiB, so its environment alone can make one).
    fn encoded(&self, record: &ContainerRecord) -> Result<(PathBuf, Vec<u8>), StoreError> {
        self.encoded_as(record, serde_json::to_vec_pretty)
    }

    fn encoded_as(
        &self,
        record: &ContainerRecord,
        encode: fn(&ContainerRecord) -> serde_json::Result<Vec<u8>>,
    ) -> Result<(PathBuf, Vec<u8>), StoreError> {
        let path = self.layout.container(&record.id).join(RECORD);
        let json = encode(record).map_err(|e| StoreError::io("encoding", &path)(e.into()))?;
        if json.len() as u64 > MAX_RECORD_BYTES {
            return Err(StoreError::io("writing", &path)(std::io::Error::other(
                format!(
                    "the record would be {} bytes, past the {MAX_RECORD_BYTES}-byte limit (an image environment this large is refused)",
                    json.len()
                ),
            )));
        }
        Ok((path, json))
    }

    pub fn record(&self, id: &str) -> Result<ContainerRecord, StoreError> {
        Ok(self.record_and_bytes(id)?.0)
    }

    /// [`Store::record`] and the bytes it was read from, for a caller that keeps answers
    /// derived from it and compares [`Store::record_bytes`] later.
    pub fn record_and_bytes(&self, id: &str) -> Result<(ContainerRecord, Vec<u8>), StoreError> {
        validate_id(id)?;
        let path = self.layout.container(id).join(RECORD);
        let bad = bad_record(id, &path);
        let bytes = record_bytes(&path, &bad)?.ok_or_else(|| StoreError::NotFound(id.into()))?;
        let record = parse_record(id, &bytes, true, &bad)?;
        Ok((record, bytes))
    }

    /// Container `id`'s record as stored, unparsed and unlocked (`None`: it has none). A
    /// record is only ever replaced whole (a rename, or a new symlink), never changed in
    /// place, so bytes equal to ones read before are that same record.
    pub fn record_bytes(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        validate_id(id)?;
        let path = self.layout.container(id).join(RECORD);
        record_bytes(&path, &bad_record(id, &path))
    }

    /// Whether anything (even a half-created container) holds this ID.
    pub fn container_exists(&self, id: &str) -> bool {
        validate_id(id).is_ok() && self.layout.container(id).exists()
    }

    /// Complete containers with a readable record, sorted by ID. Containers whose record
    /// is unreadable are left out: callers that must not overlook them (anything that
    /// removes what a container might use) use [`Store::scan_containers`].
    pub fn containers(&self) -> Result<Vec<ContainerRecord>, StoreError> {
        Ok(self.scan_containers()?.records)
    }

    /// Every container in `images/` that has a record: the readable ones, sorted by ID,
    /// and those whose record is torn or garbage, so one bad record costs its container
    /// and not the whole store's listing.
    pub fn scan_containers(&self) -> Result<ContainerScan, StoreError> {
        let images = self.layout.images();
        let mut scan = ContainerScan::default();
        for entry in fs::read_dir(&images).map_err(StoreError::io("listing", &images))? {
            let entry = entry.map_err(StoreError::io("listing", &images))?;
            let Some(id) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            match self.record(&id) {
                Ok(record) => scan.records.push(record),
                Err(StoreError::NotFound(_) | StoreError::InvalidId { .. }) => {}
                Err(StoreError::BadRecord { id, path, why }) => {
                    scan.bad.push(BadRecord { id, path, why });
                }
                Err(e) => return Err(e),
            }
        }
        scan.records.sort_by(|a, b| a.id.cmp(&b.id));
        scan.bad.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(scan)
    }

    /// Removes a container's directory tree. The caller has unmounted it. The tree is
    /// first renamed into `trash/`, so a concurrent delete or list never sees it half
    /// gone, and a crash mid-removal leaves it where `clean` finishes it.
    pub fn remove_container_dirs(&self, id: &str) -> Result<bool, StoreError> {
        match self.trash_container(id)? {
            Some(doomed) => {
                crate::remove_tree(&doomed).map_err(StoreError::io("removing", &doomed))?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    pub fn rootfs_path(&self, id: &str) -> PathBuf {
        self.container_dirs(id).rootfs
    }

    pub fn id_from_path(&self, path: &Path) -> Option<String> {
        self.layout.id_from_rootfs_path(path)
    }
}

/// The containers in `images/`, as [`Store::scan_containers`] found them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerScan {
    pub records: Vec<ContainerRecord>,
    /// Containers whose `container.json` exists but cannot be read.
    pub bad: Vec<BadRecord>,
}

/// A container whose record exists but is empty, truncated, garbage or unreadable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRecord {
    pub id: String,
    /// The record file itself.
    pub path: PathBuf,
    /// Why it could not be read, for an operator.
    pub why: String,
}

impl BadRecord {
    /// The container's directory.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(&self.path)
    }
}

/// Reads the record at `path` of container `id`. Anything there that is not a record
/// (empty, cut short, not JSON, not readable at all) is [`StoreError::BadRecord`], so
/// callers can tell one broken container from a broken store.
fn read_record(
    id: &str,
    path: &Path,
    named_by_dir: bool,
) -> Result<Option<ContainerRecord>, StoreError> {
    let bad = bad_record(id, path);
    match record_bytes(path, &bad)? {
        Some(bytes) => parse_record(id, &bytes, named_by_dir, &bad).map(Some),
        None => Ok(None),
    }
}

fn bad_record(id: &str, path: &Path) -> impl Fn(String) -> StoreError {
    let (id, path) = (id.to_string(), path.to_path_buf());
    move |why| StoreError::BadRecord {
        id: id.clone(),
        path: path.clone(),
        why,
    }
}

/// Checks and parses container `id`'s record (`named_by_dir`: its directory is
/// `images/<id>`, so the record must name `id`). Bounded: a record past
/// [`MAX_RECORD_BYTES`] is bad.
fn parse_record(
    id: &str,
    bytes: &[u8],
    named_by_dir: bool,
    bad: &dyn Fn(String) -> StoreError,
) -> Result<ContainerRecord, StoreError> {
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(bad(format!("it is past {MAX_RECORD_BYTES} bytes")));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("is empty".into()));
    }
    let record: ContainerRecord =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("not a container record: {e}")))?;
    let expected = if named_by_dir { id } else { record.id.as_str() };
    if record.id != expected {
        return Err(bad(format!(
            "it names container `{}`, not `{expected}`",
            lamina_image::shown(&record.id)
        )));
    }
    Ok(record)
}

/// The longest symlink target Linux stores (`PATH_MAX`, its NUL included).
const LONGEST_LINK: usize = 4096;

/// The bytes of the record at `path`: a regular file's, or a symlink's target (a first
/// record, [`crate::durable::write_new_with`]; never followed). `None` if there is none.
fn record_bytes(
    path: &Path,
    bad: &dyn Fn(String) -> StoreError,
) -> Result<Option<Vec<u8>>, StoreError> {
    // Twice: a record file renamed over a symlink, or the reverse, between the two
    // looks below. The symlink is tried first: a first record is one, and one
    // `readlink` into a buffer of the longest target reads it.
    for attempt in 0..2 {
        match rustix::fs::readlink(path, Vec::with_capacity(LONGEST_LINK)) {
            Ok(target) => return Ok(Some(target.into_bytes())),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(None),
            // Not a symlink: a record file, or something refused below.
            Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(bad(std::io::Error::from(e).to_string())),
        }
        match crate::open_regular_file(path) {
            Ok(file) => {
                // A record file is one 4 KiB block (written with O_DIRECT) and rarely
                // more: room for two reads it in one call instead of doubling steps.
                let mut bytes = Vec::with_capacity(8192);
                file.take(MAX_RECORD_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| bad(e.to_string()))?;
                return Ok(Some(bytes));
            }
            // NotADirectory: a stray file in `images/` is no container at all.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(None);
            }
            Err(_) if attempt == 0 && path.symlink_metadata().is_ok_and(|m| m.is_symlink()) => {
                continue;
            }
            Err(e) => return Err(bad(e.to_string())),
        }
    }
    Err(bad("it kept changing while read".into()))
}

/// Unique within the store: pid, time and a per-process counter.
pub fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{}-{nanos}-{n}", std::process::id())
}

/// Creates and flocks `dir/lock`.
fn lock_new(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join(LOCK);
    let file = crate::locks::open_lock_file(&path).map_err(StoreError::io("creating", &path))?;
    rustix::fs::flock(file.as_fd(), FlockOperation::LockExclusive)
        .map_err(StoreError::errno("locking", &path))?;
    Ok(file)
}

/// Sub-directories of `dir`, sorted by name.
pub fn list_dirs(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(StoreError::io("listing", dir))? {
        let entry = entry.map_err(StoreError::io("listing", dir))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_id_prints_on_one_line_and_an_error_shows_it_escaped() {
        for id in ["web-1", "a b", "ünïcode"] {
            validate_new_id(id).unwrap();
        }
        for id in [
            "victim\nzzz",
            "esc\u{1b}[31m",
            "tab\there",
            "del\u{7f}",
            "rtl\u{202e}gpj.exe",
            "line\u{2028}sep",
        ] {
            let err = validate_new_id(id).unwrap_err().to_string();
            assert!(err.contains("a control character"), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            // Found by the other commands still, so a legacy one can be deleted.
            validate_id(id).unwrap();
        }
        assert_eq!(printable("a\nb\u{1b}c"), "a\\nb\\u{1b}c");
        assert_eq!(printable("plain"), "plain");
    }

    /// A first record may be a symlink whose target is the record: read without following
    /// it, replaced by a later record's file, and a symlink to a file is not that file.
    #[test]
    fn a_record_that_is_a_symlinks_target_reads_back_and_a_later_record_replaces_it() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("store")).unwrap();
        let path = |id: &str| store.layout().container(id).join(RECORD);
        for id in ["s", "t"] {
            drop(store.create_container_dirs(id).unwrap());
        }
        let json = serde_json::to_vec(&record("s")).unwrap();
        std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&json), path("s")).unwrap();
        assert_eq!(store.record("s").unwrap(), record("s"));

        let later = ContainerRecord {
            image: "oci:///later".into(),
            ..record("s")
        };
        store.write_record(&later).unwrap();
        assert!(path("s").symlink_metadata().unwrap().is_file());
        assert_eq!(store.record("s").unwrap(), later);

        let elsewhere = dir.path().join("record-elsewhere.json");
        fs::write(&elsewhere, serde_json::to_vec(&record("t")).unwrap()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, path("t")).unwrap();
        assert!(matches!(
            store.record("t"),
            Err(StoreError::BadRecord { .. })
        ));
    }

    /// A store made now writes first records as symlinks where the journal is ordered;
    /// one made by a lamina from before (version 1) keeps regular files, which that
    /// lamina reads; a long record is a file either way.
    #[test]
    fn only_a_store_whose_version_older_laminas_refuse_gets_symlink_records() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let fake = std::sync::Arc::new(lamina_sys::FakeMounter::new());
        fake.set_kernel(lamina_sys::FakeKernel {
            ordered_direct_writes: true,
            ..Default::default()
        });
        let host: std::sync::Arc<dyn lamina_sys::HostFs> = fake.clone();
        let store = Store::init_hosted(&root, &Default::default(), host.clone()).unwrap();
        assert!(store.symlink_records());
        let is_symlink = |store: &Store, id: &str| {
            let path = store.layout().container(id).join(RECORD);
            path.symlink_metadata().unwrap().file_type().is_symlink()
        };
        let long = ContainerRecord {
            env: vec!["X=".to_string() + &"x".repeat(2000)],
            ..record("long")
        };
        for r in [record("new"), long.clone()] {
            drop(store.create_container_dirs(&r.id).unwrap());
            store.write_new_record(&r).unwrap();
            assert_eq!(store.record(&r.id).unwrap(), r);
        }
        assert!(is_symlink(&store, "new"));
        assert!(
            !is_symlink(&store, "long"),
            "past a symlink's length: a file"
        );

        let marker = store.layout().marker();
        let mut json: serde_json::Value =
            serde_json::from_slice(&fs::read(&marker).unwrap()).unwrap();
        assert_eq!(json["version"], 3);
        json["version"] = 1.into();
        fs::write(&marker, serde_json::to_vec(&json).unwrap()).unwrap();
        let older = Store::open_hosted(&root, host).unwrap();
        assert!(!older.symlink_records());
        drop(older.create_container_dirs("old").unwrap());
        older.write_new_record(&record("old")).unwrap();
        assert!(!is_symlink(&older, "old"));
        assert_eq!(older.record("old").unwrap(), record("old"));
    }

    fn record(id: &str) -> ContainerRecord {
        ContainerRecord {
            id: id.into(),
            image: "oci:///image".into(),
            image_id: Digest::of(b"config"),
            layers: vec![Digest::of(b"layer")],
            env: Vec::new(),
            created_unix: 0,
            disk_limit: None,
            rootfs: serde_json::Map::new(),
        }
    }

    #[test]
    fn a_torn_record_is_reported_beside_the_healthy_ones_not_instead_of_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("store")).unwrap();
        for id in ["a", "empty", "garbage", "z"] {
            drop(store.create_container_dirs(id).unwrap());
            store.write_record(&record(id)).unwrap();
        }
        let path = |id: &str| store.layout().container(id).join(RECORD);
        fs::write(path("empty"), b"").unwrap();
        fs::write(path("garbage"), b"{\"id\": \"gar").unwrap();

        let scan = store.scan_containers().unwrap();
        let ids: Vec<&str> = scan.records.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "z"]);
        let bad: Vec<(&str, &Path)> = scan
            .bad
            .iter()
            .map(|b| (b.id.as_str(), b.path.as_path()))
            .collect();
        assert_eq!(
            bad,
            [
                ("empty", path("empty").as_path()),
                ("garbage", path("garbage").as_path())
            ]
        );
        assert_eq!(store.containers().unwrap(), scan.records);
        let err = store.record("garbage").unwrap_err();
        assert!(matches!(err, StoreError::BadRecord { .. }), "{err}");
        assert!(err.to_string().contains("container `garbage`"), "{err}");
        // Rewritten whole, it is a container again.
        store.write_record(&record("empty")).unwrap();
        assert_eq!(store.scan_containers().unwrap().bad.len(), 1);
    }
}
