//! Every entry of an imported layer — its type, mode, owner, content and xattrs — as it
//! was when the import verified the layer (`layers/<chain-id>/file-list`, written beside
//! `layer.json`), so that `check --verify` can read a layer's tree again and name each
//! entry changed, added or gone since. Without it a changed byte in a classic layer's tree
//! (`diff/bin/busybox`), a retargeted symlink or an added setuid bit would be in every
//! container of that image and no check would see it.
//!
//! Content is named by its fs-verity digest (SHA-256, 4 KiB blocks: composefs's object
//! name, the hashing sharing stores use to store each file's content once); a symlink's
//! by the digest of its target, a device by its number; xattrs by one digest of all of
//! them. Each inode is read once, whatever number of names it has.
//!
//! The list is as trustworthy as the store (root's, 0700): it finds damage and edits that
//! did not also rewrite the list, not an attacker who can write the store. Its absence is
//! noticed: `layer.json` says the import wrote one.
//!
//! Format: a header line, then one line per entry in the order walked (the root first,
//! as `.`): kind (`f` `d` `l` `c` `b` `p` `s`), mode in octal, uid, gid, content (`-`
//! for none), xattrs (`-` for none), and the path with every byte outside `!`..`~` and
//! every `%` written as `%XX`, separated by spaces.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::{self, BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use composefs::fsverity::{FsVerityHashValue, FsVerityHasher};
use lamina_sys::{At, HostFs};
use rustix::fs::{FileType, Stat};

use crate::beneath::{Entry, Tree};
use crate::file_objects::ObjectId;

/// The file beside a layer's `diff/`.
pub const FILE_LIST: &str = "file-list";

const HEADER: &str = "lamina file list 2";

/// Entries listed in one layer, and bytes of their paths: past either the layer gets no
/// list (a tar of a few megabytes can name a million files under a deep directory).
const MAX_ENTRIES: usize = 1_000_000;
const MAX_PATH_BYTES: usize = 64 << 20;

/// The largest list read: [`MAX_ENTRIES`] lines and [`MAX_PATH_BYTES`] escaped.
const MAX_LIST_BYTES: u64 = (MAX_ENTRIES as u64) * 200 + 3 * MAX_PATH_BYTES as u64;

/// What a stub whose object is missing reads as, and how its change is said.
const OBJECT_GONE: &str = "the object holding its data is gone";

/// What is recorded of one entry, path aside.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    kind: char,
    mode: u32,
    uid: u32,
    gid: u32,
    content: String,
    xattrs: String,
}

impl Listed {
    /// Which part of `self` differs from `was`, for a message.
    fn change_from(&self, was: &Listed) -> Option<&'static str> {
        if self.kind != was.kind {
            Some("its type changed")
        } else if self.content == OBJECT_GONE {
            Some(OBJECT_GONE)
        } else if self.content != was.content {
            Some(match self.kind {
                'f' => "its content changed",
                'l' => "its target changed",
                _ => "its device number changed",
            })
        } else if self.mode != was.mode {
            Some("its mode changed")
        } else if (self.uid, self.gid) != (was.uid, was.gid) {
            Some("its owner changed")
        } else if self.xattrs != was.xattrs {
            Some("its xattrs changed")
        } else {
            None
        }
    }

    fn line(&self, path: &Path, out: &mut Vec<u8>) {
        out.extend_from_slice(
            format!(
                "{} {:o} {} {} {} {} ",
                self.kind, self.mode, self.uid, self.gid, self.content, self.xattrs
            )
            .as_bytes(),
        );
        escape(path.as_os_str().as_bytes(), out);
        out.push(b'\n');
    }
}

/// How a layer's tree differs from its list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// Listed, and not as it was (which part says what).
    Changed(PathBuf, &'static str),
    /// An entry the list does not name.
    Added(PathBuf),
    /// Listed, and gone.
    Gone(PathBuf),
    /// Part of the tree could not be walked (moved or replaced while it was read).
    Unwalked,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Changed(p, what) => write!(f, "{}: {what} since import", shown(p)),
            Self::Added(p) => write!(f, "{}: an entry the layer did not have", shown(p)),
            Self::Gone(p) => write!(f, "{}: gone", shown(p)),
            Self::Unwalked => f.write_str("the tree changed while it was read"),
        }
    }
}

impl Difference {
    /// The entry it is about, relative to the layer's tree.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::Changed(p, _) | Self::Added(p) | Self::Gone(p) => Some(p),
            Self::Unwalked => None,
        }
    }
}

fn shown(path: &Path) -> String {
    lamina_image::shown(&path.display().to_string())
}

/// Lists every entry under `diff` into `out` (created, not synced), and returns, when
/// `collect`, the files the listing hashed as file objects would (`file_objects::Hashed`:
/// each inode of more than the inline limit once), so an import that stores file objects
/// does not read them again. `None`, and `out` removed, when the layer is past what is listed or
/// part of it could not be walked; stops when `cancelled`.
pub fn write(
    host: &dyn HostFs,
    diff: &Path,
    out: &Path,
    collect: bool,
    cancelled: &AtomicBool,
) -> io::Result<Option<crate::file_objects::Hashed>> {
    let written = write_to(host, diff, out, collect, cancelled);
    if !matches!(written, Ok(Some(_))) {
        let _ = std::fs::remove_file(out);
    }
    match written {
        Err(e) if e.get_ref().is_some_and(|inner| inner.is::<PastBounds>()) => {
            tracing::info!(layer = %diff.display(), "layer past what is listed for check --verify");
            Ok(None)
        }
        other => other,
    }
}

fn write_to(
    host: &dyn HostFs,
    diff: &Path,
    out: &Path,
    collect: bool,
    cancelled: &AtomicBool,
) -> io::Result<Option<crate::file_objects::Hashed>> {
    let tree = Tree::open(diff)?;
    let mut file = BufWriter::new(
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(out)?,
    );
    file.write_all(HEADER.as_bytes())?;
    file.write_all(b"\n")?;
    let mut reader = Reader::new(host, None);
    let mut line = Vec::new();
    let root = reader.root(&tree)?;
    root.line(Path::new("."), &mut line);
    let (mut entries, mut path_bytes) = (0, 0);
    let mut hashed = crate::file_objects::Hashed::default();
    let mut inodes = HashSet::new();
    let whole = tree.walk(|entry| {
        if cancelled.load(Ordering::Relaxed) {
            return Err(io::Error::other("the import is being given up"));
        }
        let rel = entry.rel();
        entries += 1;
        path_bytes += rel.as_os_str().len();
        if entries > MAX_ENTRIES || path_bytes > MAX_PATH_BYTES {
            return Err(io::Error::other(PastBounds));
        }
        let listed = reader.entry(&tree, entry)?;
        let stat = entry.stat;
        if collect
            && listed.kind == 'f'
            && crate::file_objects::is_object_sized(stat.st_size)
            && inodes.insert((stat.st_dev, stat.st_ino))
            && let Ok(id) = ObjectId::from_hex(&listed.content)
        {
            hashed.push(rel.clone(), stat.st_nlink, id);
        }
        listed.line(&rel, &mut line);
        if line.len() >= 64 << 10 {
            file.write_all(&line)?;
            line.clear();
        }
        Ok(true)
    })?;
    file.write_all(&line)?;
    file.flush()?;
    Ok(whole.then_some(hashed))
}

/// A layer's list, read back: each path and what was recorded of it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileList {
    entries: HashMap<PathBuf, Listed>,
}

impl FileList {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The list of the layer at `layer_dir`: `Ok(None)` when it has none.
    pub fn read(layer_dir: &Path) -> io::Result<Option<FileList>> {
        let path = layer_dir.join(FILE_LIST);
        let bytes = match crate::read_regular_file_at_most(&path, MAX_LIST_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        parse(&bytes)
            .map(Some)
            .ok_or_else(|| io::Error::other("not a file list"))
    }

    /// How the tree under `diff` differs from this list, every entry read again. A stub's
    /// content is its object's in `objects` (a layer that keeps its data there), its
    /// xattrs without overlay's two marks.
    pub fn differences(
        &self,
        host: &dyn HostFs,
        diff: &Path,
        objects: Option<&Path>,
    ) -> io::Result<Vec<Difference>> {
        let tree = Tree::open(diff)?;
        let objects = objects.map(Tree::open).transpose()?;
        let mut reader = Reader::new(host, objects);
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let mut compare =
            |rel: PathBuf, now: Listed, found: &mut Vec<Difference>| match self.entries.get(&rel) {
                None => found.push(Difference::Added(rel)),
                Some(was) => {
                    if let Some(what) = now.change_from(was) {
                        found.push(Difference::Changed(rel.clone(), what));
                    }
                    seen.insert(rel);
                }
            };
        compare(PathBuf::from("."), reader.root(&tree)?, &mut found);
        let whole = tree.walk(|entry| {
            let listed = reader.entry(&tree, entry)?;
            compare(entry.rel(), listed, &mut found);
            Ok(true)
        })?;
        if !whole {
            found.push(Difference::Unwalked);
        }
        let mut gone: Vec<_> = self
            .entries
            .keys()
            .filter(|path| !seen.contains(*path))
            .cloned()
            .map(Difference::Gone)
            .collect();
        gone.sort_by(|a, b| a.path().cmp(&b.path()));
        found.extend(gone);
        Ok(found)
    }
}

/// Reads entries as the list records them, each inode's content and xattrs once.
struct Reader<'a> {
    host: &'a dyn HostFs,
    by_inode: HashMap<(u64, u64), (String, String)>,
    /// The store's `objects/`, where stubs' data is.
    objects: Option<Tree>,
}

impl<'a> Reader<'a> {
    fn new(host: &'a dyn HostFs, objects: Option<Tree>) -> Self {
        Self {
            host,
            by_inode: HashMap::new(),
            objects,
        }
    }

    /// The object `entry` is a stub of, opened, where the layer keeps data in objects.
    fn stub_data(&self, entry: &Entry<'_>) -> io::Result<Option<std::fs::File>> {
        let Some(objects) = &self.objects else {
            return Ok(None);
        };
        match crate::object_layers::stub_object(self.host, At::Child(entry.dir, entry.name))? {
            Some(object) => objects.open_regular(&object).map(Some),
            None => Ok(None),
        }
    }

    fn root(&mut self, tree: &Tree) -> io::Result<Listed> {
        let fd = tree.root();
        let stat = rustix::fs::fstat(fd)?;
        let xattrs = xattrs_digest(self.host, At::Fd(fd), false)?;
        Ok(listed(&stat, "-".into(), xattrs))
    }

    fn entry(&mut self, tree: &Tree, entry: &Entry<'_>) -> io::Result<Listed> {
        let stat = entry.stat;
        let key = (stat.st_dev, stat.st_ino);
        if let Some((content, xattrs)) = self.by_inode.get(&key) {
            return Ok(listed(stat, content.clone(), xattrs.clone()));
        }
        let stub = match entry.kind() {
            FileType::RegularFile => match self.stub_data(entry) {
                Ok(data) => data.map(Some),
                // Said as this entry's change, not as the whole layer unreadable.
                Err(e) if e.kind() == io::ErrorKind::NotFound => Some(None),
                Err(e) => return Err(e),
            },
            _ => None,
        };
        let content = match entry.kind() {
            FileType::RegularFile => match &stub {
                Some(None) => OBJECT_GONE.into(),
                Some(Some(object)) => {
                    let content = io::Read::take(object, stat.st_size as u64 + 1);
                    crate::file_objects::digest_of(content)?.0.to_hex()
                }
                None => crate::file_objects::hash_entry(tree, entry)?.to_hex(),
            },
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(entry.dir, entry.name, Vec::new())?;
                FsVerityHasher::<ObjectId, 12>::hash(target.as_bytes()).to_hex()
            }
            FileType::CharacterDevice | FileType::BlockDevice => format!("r{}", stat.st_rdev),
            _ => "-".into(),
        };
        let xattrs = xattrs_digest(self.host, At::Child(entry.dir, entry.name), stub.is_some())?;
        if stat.st_nlink > 1 {
            self.by_inode.insert(key, (content.clone(), xattrs.clone()));
        }
        Ok(listed(stat, content, xattrs))
    }
}

fn listed(stat: &Stat, content: String, xattrs: String) -> Listed {
    let kind = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => 'f',
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::CharacterDevice => 'c',
        FileType::BlockDevice => 'b',
        FileType::Fifo => 'p',
        FileType::Socket => 's',
        FileType::Unknown => '?',
    };
    Listed {
        kind,
        mode: stat.st_mode & 0o7777,
        uid: stat.st_uid,
        gid: stat.st_gid,
        content,
        xattrs,
    }
}

/// One digest of every xattr the layer's files carry for what they are (name and value,
/// sorted by name), `-` for none. The host's own security labels (`security.selinux`,
/// IMA's and EVM's) are not the layer's: a relabel changes them on every file. A file
/// capability is the layer's.
fn xattrs_digest(host: &dyn HostFs, at: At<'_>, stub: bool) -> io::Result<String> {
    let mut names: Vec<OsString> = host.list_xattrs(at)?;
    names.retain(|name| {
        let name = name.as_bytes();
        if stub
            && [
                crate::object_layers::METACOPY_XATTR,
                crate::object_layers::REDIRECT_XATTR,
            ]
            .iter()
            .any(|mark| name == mark.as_bytes())
        {
            return false;
        }
        !name.starts_with(b"security.") || name == b"security.capability"
    });
    if names.is_empty() {
        return Ok("-".into());
    }
    names.sort();
    let mut all = Vec::new();
    for name in names {
        let Some(value) = host.get_xattr(at, &name)? else {
            continue;
        };
        all.extend_from_slice(name.as_bytes());
        all.push(0);
        all.extend_from_slice(&(value.len() as u64).to_le_bytes());
        all.extend_from_slice(&value);
    }
    Ok(FsVerityHasher::<ObjectId, 12>::hash(&all).to_hex())
}

/// Past [`MAX_ENTRIES`] or [`MAX_PATH_BYTES`].
#[derive(Debug)]
struct PastBounds;

impl std::fmt::Display for PastBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("past the entries a layer's list holds")
    }
}

impl std::error::Error for PastBounds {}

fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        if (b'!'..=b'~').contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
}

fn unescape(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] == b'%' {
            let hex = std::str::from_utf8(text.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    Some(out)
}

fn parse(bytes: &[u8]) -> Option<FileList> {
    let mut lines = bytes.strip_suffix(b"\n")?.split(|&b| b == b'\n');
    if lines.next()? != HEADER.as_bytes() {
        return None;
    }
    let mut entries = HashMap::new();
    for line in lines {
        let mut fields = line.splitn(7, |&b| b == b' ');
        let mut text = || std::str::from_utf8(fields.next()?).ok().map(str::to_string);
        let kind = text()?;
        let mode = u32::from_str_radix(&text()?, 8).ok()?;
        let uid = text()?.parse().ok()?;
        let gid = text()?.parse().ok()?;
        let (content, xattrs) = (text()?, text()?);
        let path = PathBuf::from(OsStr::from_bytes(&unescape(fields.next()?)?));
        let mut kind_chars = kind.chars();
        let (Some(kind), None) = (kind_chars.next(), kind_chars.next()) else {
            return None;
        };
        let listed = Listed {
            kind,
            mode,
            uid,
            gid,
            content,
            xattrs,
        };
        if path.as_os_str().is_empty() || entries.insert(path, listed).is_some() {
            return None;
        }
    }
    Some(FileList { entries })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_sys::RealHost;

    fn listed(dir: &Path) -> FileList {
        let out = dir.join(FILE_LIST);
        let _ = std::fs::remove_file(&out);
        let hashed = write(
            &RealHost,
            &dir.join("diff"),
            &out,
            true,
            &AtomicBool::new(false),
        )
        .unwrap();
        // What the listing hashed is what file objects would hash.
        let again = crate::file_objects::hash(&dir.join("diff"), &AtomicBool::new(false)).unwrap();
        assert_eq!(
            hashed.expect("listed").into_parts(),
            again.expect("hashed").into_parts()
        );
        FileList::read(dir).unwrap().unwrap()
    }

    #[test]
    fn a_list_reads_back_as_written_whatever_bytes_its_paths_hold() {
        let dir = tempfile::tempdir().unwrap();
        let diff = dir.path().join("diff");
        std::fs::create_dir_all(diff.join("etc")).unwrap();
        std::fs::write(diff.join("etc/passwd"), b"root:x:0:0\n").unwrap();
        std::fs::write(diff.join("odd name%\n\u{7f}"), b"odd").unwrap();
        std::fs::hard_link(diff.join("etc/passwd"), diff.join("linked")).unwrap();
        std::os::unix::fs::symlink("etc/passwd", diff.join("link")).unwrap();
        let list = listed(dir.path());
        assert_eq!(
            list.len(),
            6,
            "the root, a directory, three names of files, a link"
        );
        assert_eq!(list.differences(&RealHost, &diff, None).unwrap(), vec![]);
    }

    #[test]
    fn differences_name_each_entry_changed_added_and_gone() {
        let dir = tempfile::tempdir().unwrap();
        let diff = dir.path().join("diff");
        std::fs::create_dir_all(diff.join("bin")).unwrap();
        std::fs::write(diff.join("bin/busybox"), vec![7u8; 10_000]).unwrap();
        std::fs::write(diff.join("bin/gone"), b"x").unwrap();
        std::fs::write(diff.join("bin/su"), b"su").unwrap();
        std::os::unix::fs::symlink("busybox", diff.join("bin/sh")).unwrap();
        let list = listed(dir.path());
        let mut changed = vec![7u8; 10_000];
        changed[4321] = 8;
        std::fs::write(diff.join("bin/busybox"), changed).unwrap();
        std::fs::remove_file(diff.join("bin/gone")).unwrap();
        std::fs::write(diff.join("ld.so.preload"), b"/evil.so").unwrap();
        std::fs::remove_file(diff.join("bin/sh")).unwrap();
        std::os::unix::fs::symlink("/tmp/evil", diff.join("bin/sh")).unwrap();
        let setuid = std::process::Command::new("chmod")
            .arg("4755")
            .arg(diff.join("bin/su"))
            .status()
            .unwrap();
        assert!(setuid.success());
        let mut found = list.differences(&RealHost, &diff, None).unwrap();
        found.sort_by_key(|d| format!("{d:?}"));
        assert_eq!(
            found,
            vec![
                Difference::Added(PathBuf::from("ld.so.preload")),
                Difference::Changed(PathBuf::from("bin/busybox"), "its content changed"),
                Difference::Changed(PathBuf::from("bin/sh"), "its target changed"),
                Difference::Changed(PathBuf::from("bin/su"), "its mode changed"),
                Difference::Gone(PathBuf::from("bin/gone")),
            ]
        );
    }

    #[test]
    fn a_damaged_list_is_refused_not_believed() {
        let dir = tempfile::tempdir().unwrap();
        let line = |rest: &str| format!("{HEADER}\n{rest}\n");
        for bad in [
            "not a list\n".to_string(),
            line("f 644 0 0 - -"),
            line("ff 644 0 0 - - a"),
            line("f 999 0 0 - - a"),
            line("f 644 0 0 - - a\nf 644 0 0 - - a"),
            line("f 644 0 0 - - %G0"),
        ] {
            std::fs::write(dir.path().join(FILE_LIST), &bad).unwrap();
            assert!(FileList::read(dir.path()).is_err(), "{bad}");
        }
        std::fs::write(dir.path().join(FILE_LIST), line("f 644 0 0 - - a%20b")).unwrap();
        assert_eq!(FileList::read(dir.path()).unwrap().unwrap().len(), 1);
        assert!(FileList::read(&dir.path().join("none")).unwrap().is_none());
    }
}
