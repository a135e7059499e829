//! The entry loop: parse each tar entry, create it beneath the root, then fix directory
//! times last (creating children changes a directory's mtime).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use tar::EntryType;

use lamina_sys::{At, HostFs, Node, RealHost};

use crate::UnpackError;
use crate::entry_path::EntryPath;
use crate::metadata;
use crate::records::{Described, Kind, Member, Pending, Refusal};
use crate::remove::remove_at;
use crate::resolve::{LayerRoot, ResolveError};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";

/// What an unpack wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnpackSummary {
    pub entries: u64,
    pub file_bytes: u64,
    /// Whiteouts and opaque markers: a layer without any can be used as a rootfs on its
    /// own, with no overlay to interpret them.
    pub overlay_markers: u64,
}

/// Unpacks the (already decompressed) tar stream `reader` into the existing directory
/// `dest`. The whole stream is consumed, trailing padding included, so a caller hashing
/// the stream sees every byte.
pub fn unpack<R: Read>(reader: R, dest: &Path) -> Result<UnpackSummary, UnpackError> {
    unpack_limited(reader, dest, u64::MAX)
}

/// [`unpack`], refusing the layer once its entries declare more than `max_bytes` of
/// data in total, before reading the entry that crosses it. (The caller's reader enforces
/// the same limit on the stream as a whole; this names the entry, and stops a lying header
/// without waiting for the bytes.)
pub fn unpack_limited<R: Read>(
    reader: R,
    dest: &Path,
    max_bytes: u64,
) -> Result<UnpackSummary, UnpackError> {
    unpack_with(reader, dest, max_bytes, &RealHost)
}

/// [`unpack_limited`] with owners, device nodes and xattrs set through `host`: the
/// store passes its own, so an import on the fake host needs no privilege.
pub fn unpack_with<R: Read>(
    reader: R,
    dest: &Path,
    max_bytes: u64,
    host: &dyn HostFs,
) -> Result<UnpackSummary, UnpackError> {
    let root = LayerRoot::open(dest).map_err(|e| {
        UnpackError::stream(format!("opening layer directory {}: {e}", dest.display()))
    })?;
    let mut archive = tar::Archive::new(reader);
    let mut state = Unpacker {
        host,
        root,
        max_bytes,
        dir_times: Vec::new(),
        summary: UnpackSummary::default(),
        last_entry: None,
    };
    // Raw: extension records come to `Pending` unparsed, so their sizes are checked
    // before they are buffered (see records.rs).
    let members = archive
        .entries()
        .map_err(|e| state.stream_error(e))?
        .raw(true);
    let mut pending = Pending::default();
    for member in members {
        let mut member = member.map_err(|e| state.stream_error(e))?;
        match pending.read(&mut member) {
            Ok(Member::Record) => {}
            Ok(Member::Entry(described)) => state.entry(&mut member, described)?,
            Err(refusal) => return Err(state.refused(refusal)),
        }
    }
    if !pending.is_empty() {
        return Err(state.refused(Refusal {
            name: None,
            message: "the archive ends with extension records that describe no entry".into(),
        }));
    }
    state.finish_dir_times()?;
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(|e| state.stream_error(e))?;
    Ok(state.summary)
}

struct Unpacker<'h> {
    host: &'h dyn HostFs,
    root: LayerRoot,
    max_bytes: u64,
    dir_times: Vec<(Vec<Vec<u8>>, i64)>,
    summary: UnpackSummary,
    /// The last entry read whole: a stream that breaks between entries is named by it.
    last_entry: Option<Vec<u8>>,
}

impl Unpacker<'_> {
    /// A tar or decompression failure outside any entry's data.
    fn stream_error(&self, e: io::Error) -> UnpackError {
        // The tar crate's messages quote header fields raw: escape them like names.
        let e = crate::shown(e.to_string().as_bytes());
        match &self.last_entry {
            Some(raw) => UnpackError::entry(raw, format!("reading the tar after this entry: {e}")),
            None => UnpackError::stream(format!("reading layer tar: {e}")),
        }
    }

    /// A member refused before anything was created for it.
    fn refused(&self, refusal: Refusal) -> UnpackError {
        match (&refusal.name, &self.last_entry) {
            (Some(name), _) => UnpackError::entry(name, refusal.message),
            (None, Some(last)) => UnpackError::entry(
                last,
                format!("the record after this entry: {}", refusal.message),
            ),
            (None, None) => UnpackError::stream(refusal.message),
        }
    }

    fn entry<R: Read>(
        &mut self,
        data: &mut tar::Entry<'_, R>,
        described: Described,
    ) -> Result<(), UnpackError> {
        self.entry_at(data, &described)?;
        self.last_entry = Some(described.name);
        Ok(())
    }

    fn entry_at<R: Read>(
        &mut self,
        data: &mut tar::Entry<'_, R>,
        entry: &Described,
    ) -> Result<(), UnpackError> {
        let raw = entry.name.as_slice();
        let meta = &entry.meta;
        let fail = |msg: String| UnpackError::entry(raw, msg);
        let path = EntryPath::parse(raw).map_err(|r| fail(r.to_string()))?;
        let total = self.summary.file_bytes.saturating_add(entry.size);
        if total > self.max_bytes {
            return Err(fail(format!(
                "declares {} bytes, bringing the layer to {total} bytes, past the per-layer \
                 limit of {} bytes",
                entry.size, self.max_bytes
            )));
        }
        self.summary.entries += 1;

        let Some(name) = path.name().map(<[u8]>::to_vec) else {
            // `./` itself: the layer root takes the entry's metadata.
            if entry.kind != Kind::Directory {
                return Err(fail("names the layer root but is not a directory".into()));
            }
            metadata::apply_fd(self.host, self.root.fd().as_fd(), meta)
                .map_err(|e| fail(format!("setting metadata: {e}")))?;
            self.dir_times.push((Vec::new(), meta.mtime));
            return Ok(());
        };
        let parent = self
            .root
            .open_dir(path.parent(), true)
            .map_err(|e| fail(format!("parent {e}")))?;
        let parent = parent.as_fd();

        if name == OPAQUE_MARKER {
            if path.parent().is_empty() {
                // It would hide every layer below from the layer root up: no image
                // builder emits one, and no layer needs it to replace files.
                return Err(fail(
                    "opaque marker at the layer root would hide every layer below".into(),
                ));
            }
            self.summary.overlay_markers += 1;
            return metadata::set_xattr_at(self.host, parent, b".", "trusted.overlay.opaque", b"y")
                .map_err(|e| fail(format!("marking directory opaque: {e}")));
        }
        if name.starts_with(b".wh..wh.") {
            return Ok(()); // aufs bookkeeping (.wh..wh.plnk etc.): meaningless to overlay
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(fail("whiteout names no entry".into()));
            }
            self.summary.overlay_markers += 1;
            // OCI: a whiteout hides only what lower layers hold; an entry of this layer
            // at the same name makes the layer mean two things.
            if exists(parent, hidden).map_err(|e| fail(format!("looking up: {e}")))? {
                return Err(fail(format!(
                    "whiteout hides `{}`, which this layer itself holds",
                    crate::shown(hidden)
                )));
            }
            return self
                .host
                .mknod(parent, OsStr::from_bytes(hidden), Node::WHITEOUT, 0)
                .map_err(|e| fail(format!("creating whiteout: {e}")));
        }

        replace_existing(self.host, parent, &name, entry.kind == Kind::Directory).map_err(fail)?;
        match &entry.kind {
            Kind::Directory => {
                match rustix::fs::mkdirat(parent, name.as_slice(), Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(fail(format!("creating directory: {e}"))),
                }
                let dir = open_nofollow(parent, &name, OFlags::DIRECTORY)
                    .map_err(|e| fail(format!("opening directory: {e}")))?;
                metadata::apply_fd(self.host, dir.as_fd(), meta)
                    .map_err(|e| fail(format!("setting metadata: {e}")))?;
                self.dir_times
                    .push((path.components().to_vec(), meta.mtime));
            }
            Kind::File => {
                let fd = rustix::fs::openat(
                    parent,
                    name.as_slice(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| fail(format!("creating file: {e}")))?;
                let mut file = File::from(fd);
                self.summary.file_bytes +=
                    io::copy(data, &mut file).map_err(|e| fail(format!("writing file: {e}")))?;
                metadata::apply_fd(self.host, file.as_fd(), meta)
                    .map_err(|e| fail(format!("setting metadata: {e}")))?;
            }
            Kind::Symlink(target) => {
                rustix::fs::symlinkat(target.as_slice(), parent, name.as_slice())
                    .map_err(|e| fail(format!("creating symlink: {e}")))?;
                metadata::apply_at(self.host, parent, &name, meta, true)
                    .map_err(|e| fail(format!("setting metadata: {e}")))?;
            }
            Kind::Hardlink(target) => {
                self.hardlink(parent, &name, target).map_err(fail)?;
            }
            Kind::Node { kind, major, minor } => {
                let (major, minor) = (*major, *minor);
                let node = match kind {
                    EntryType::Char => Node::Char { major, minor },
                    EntryType::Block => Node::Block { major, minor },
                    _ => Node::Fifo,
                };
                self.host
                    .mknod(parent, OsStr::from_bytes(&name), node, 0o600)
                    .map_err(|e| fail(format!("creating {kind:?} node: {e}")))?;
                metadata::apply_at(self.host, parent, &name, meta, false)
                    .map_err(|e| fail(format!("setting metadata: {e}")))?;
            }
        }
        Ok(())
    }

    /// Links `name` to `target`, another entry of this layer. The target is resolved
    /// beneath the root exactly like an entry name: no `..`, no absolute path, no symlink.
    fn hardlink(&self, parent: BorrowedFd<'_>, name: &[u8], target: &[u8]) -> Result<(), String> {
        let shown = crate::shown(target);
        let target_path =
            EntryPath::parse(target).map_err(|r| format!("hardlink target `{shown}`: {r}"))?;
        let Some(target_name) = target_path.name() else {
            return Err("hardlink to the layer root".into());
        };
        let target_parent = self
            .root
            .open_dir(target_path.parent(), false)
            .map_err(|e| format!("hardlink target `{shown}`: parent {e}"))?;
        match rustix::fs::linkat(
            target_parent.as_fd(),
            target_name,
            parent,
            name,
            AtFlags::empty(),
        ) {
            Ok(()) => Ok(()),
            Err(Errno::NOENT) => Err(format!(
                "hardlink target `{shown}` does not exist in this layer"
            )),
            Err(Errno::PERM) => Err(format!("hardlink target `{shown}` is a directory")),
            Err(e) => Err(format!("creating hardlink to `{shown}`: {e}")),
        }
    }

    /// Directory mtimes, deepest first, once nothing more will be created inside them.
    fn finish_dir_times(&mut self) -> Result<(), UnpackError> {
        self.dir_times
            .sort_by_key(|(parts, _)| std::cmp::Reverse(parts.len()));
        for (parts, mtime) in &self.dir_times {
            let fail = |e: String| UnpackError::entry(&EntryPath::join(parts), e);
            let dir = match self.root.open_dir(parts, false) {
                Ok(dir) => dir,
                // A later entry replaced this directory with something else.
                Err(
                    ResolveError::Missing(_) | ResolveError::NotDir(_) | ResolveError::Symlink(_),
                ) => continue,
                Err(e) => return Err(fail(e.to_string())),
            };
            rustix::fs::futimens(&dir, &metadata::timestamps(*mtime))
                .map_err(|e| fail(format!("setting mtime: {e}")))?;
        }
        Ok(())
    }
}

/// Tar semantics: a later entry replaces an earlier one at the same path, and a directory
/// entry over an existing directory only updates its metadata. The layer directory starts
/// empty, so what exists came from this layer. A directory turned into a non-directory
/// (or back), or an entry over this layer's own whiteout, is refused: a layer whose
/// meaning depends on which duplicate a reader honours is how scanners get fooled.
fn replace_existing(
    host: &dyn HostFs,
    parent: BorrowedFd<'_>,
    name: &[u8],
    new_is_dir: bool,
) -> Result<(), String> {
    // Through the seam: a whiteout the fake made is a regular file on disk.
    let st = match host.stat(At::Child(parent, OsStr::from_bytes(name))) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(format!("looking up the earlier entry: {e}")),
    };
    let kind = FileType::from_raw_mode(st.st_mode);
    let is_dir = kind == FileType::Directory;
    if kind == FileType::CharacterDevice && st.st_rdev == 0 {
        return Err("this layer also whites out the same name".into());
    }
    match (is_dir, new_is_dir) {
        (true, true) => Ok(()),
        (false, false) => {
            remove_at(parent, name, false).map_err(|e| format!("replacing the earlier entry: {e}"))
        }
        (true, false) => Err("appears earlier in this layer as a directory".into()),
        (false, true) => Err("appears earlier in this layer as a non-directory".into()),
    }
}

fn exists(parent: BorrowedFd<'_>, name: &[u8]) -> Result<bool, Errno> {
    match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

fn open_nofollow(parent: BorrowedFd<'_>, name: &[u8], extra: OFlags) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | extra,
        Mode::empty(),
    )
}
