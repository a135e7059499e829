//! A layer's index as the changes it makes to the tree below it: what a lazy layer's
//! metadata is built from, before any file's bytes are present. The rules are the tar
//! unpacker's (`lamina_unpack`), so a lazy layer shows what the same layer pulled whole
//! shows: names beneath the layer root (no `..`, no absolute path, no NUL), whiteouts and
//! opaque markers by name, aufs bookkeeping ignored, overlay's and lamina's own xattrs
//! dropped, hardlinks only to an earlier file of the same layer. Anything the unpacker
//! would refuse, and anything an index cannot say safely (a name given twice, a device
//! number past Linux's, an owner of -1), refuses the index: the layer is pulled whole.

use lamina_unpack::{EntryPath, is_reserved_xattr};

use crate::lazy::{IndexError, LazyFile, index_error};

/// Linux's largest device major and minor numbers.
const MAX_MAJOR: u64 = (1 << 12) - 1;
const MAX_MINOR: u64 = (1 << 20) - 1;
/// The largest extended attribute value Linux stores.
const MAX_XATTR_VALUE: usize = 64 << 10;

/// What one index entry makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Dir,
    /// A regular file: the layer's `files[n]`.
    File(usize),
    Symlink(Vec<u8>),
    /// Another name for an earlier file of this layer.
    Hardlink(EntryPath),
    Char(u32, u32),
    Block(u32, u32),
    Fifo,
}

/// A node of the layer's tree with its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub path: EntryPath,
    pub kind: NodeKind,
    /// Permission bits only (`& 0o7777`): the kind says the type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch; 0 where the index gives none it can parse.
    pub mtime: i64,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// One change a layer makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Node(Node),
    /// Hides what the layers below hold at this path.
    Whiteout(EntryPath),
    /// Hides what the layers below hold inside this directory.
    Opaque(EntryPath),
}

/// A layer's changes and its regular files' chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerTree {
    pub changes: Vec<Change>,
    pub files: Vec<LazyFile>,
}

/// One index entry as the tree needs it, whichever format listed it.
pub(crate) struct RawEntry<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub link_name: &'a str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub dev: (u64, u64),
    /// RFC 3339, or empty.
    pub mtime: &'a str,
    /// Values base64.
    pub xattrs: &'a std::collections::BTreeMap<String, String>,
}

fn refused(name: &str, why: impl std::fmt::Display) -> IndexError {
    index_error(format!(
        "`{}`: {why}",
        lamina_unpack::shown(name.as_bytes())
    ))
}

/// The tree `entries` make, their regular files being `files` (as the format's reader
/// checked them, in entry order: the `n`th `reg` entry is `files[n]`).
pub(crate) fn build<'a>(
    entries: impl Iterator<Item = RawEntry<'a>>,
    files: Vec<LazyFile>,
) -> Result<LayerTree, IndexError> {
    let mut changes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // Paths of this layer's regular files so far, for hardlinks.
    let mut file_paths = std::collections::HashSet::new();
    let mut next_file = 0usize;
    for entry in entries {
        if entry.kind == "chunk" {
            continue;
        }
        let path = EntryPath::parse(entry.name.as_bytes()).map_err(|r| refused(entry.name, r))?;
        let file_index = (entry.kind == "reg").then(|| {
            next_file += 1;
            next_file - 1
        });
        let Some(name) = path.name() else {
            continue; // the layer root's own entry: its metadata is the image's
        };
        if !seen.insert(path.components().to_vec()) {
            return Err(refused(entry.name, "listed twice"));
        }
        if name == b".wh..wh..opq" {
            if path.parent().is_empty() {
                return Err(refused(entry.name, "an opaque marker at the layer root"));
            }
            changes.push(Change::Opaque(
                EntryPath::parse(&EntryPath::join(path.parent()))
                    .map_err(|r| refused(entry.name, r))?,
            ));
            continue;
        }
        if name.starts_with(b".wh..wh.") {
            continue; // aufs bookkeeping
        }
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            if hidden.is_empty() || hidden == b"." || hidden == b".." {
                return Err(refused(entry.name, "a whiteout that names no entry"));
            }
            let mut parts = path.parent().to_vec();
            parts.push(hidden.to_vec());
            changes.push(Change::Whiteout(
                EntryPath::parse(&EntryPath::join(&parts)).map_err(|r| refused(entry.name, r))?,
            ));
            continue;
        }
        let kind = match entry.kind {
            "dir" => NodeKind::Dir,
            "reg" => {
                file_paths.insert(path.components().to_vec());
                NodeKind::File(file_index.unwrap_or_default())
            }
            "symlink" => NodeKind::Symlink(entry.link_name.as_bytes().to_vec()),
            "hardlink" => {
                let target = EntryPath::parse(entry.link_name.as_bytes())
                    .map_err(|r| refused(entry.name, format!("hardlink target: {r}")))?;
                if !file_paths.contains(target.components()) {
                    return Err(refused(
                        entry.name,
                        "a hardlink to no earlier file of this layer",
                    ));
                }
                NodeKind::Hardlink(target)
            }
            "char" | "block" => {
                let (major, minor) = entry.dev;
                if major > MAX_MAJOR || minor > MAX_MINOR {
                    return Err(refused(entry.name, "a device number past Linux's"));
                }
                let (major, minor) = (major as u32, minor as u32);
                if entry.kind == "char" {
                    NodeKind::Char(major, minor)
                } else {
                    NodeKind::Block(major, minor)
                }
            }
            "fifo" => NodeKind::Fifo,
            other => return Err(refused(entry.name, format!("entry type `{other}`"))),
        };
        if entry.uid == u32::MAX || entry.gid == u32::MAX {
            return Err(refused(entry.name, "an owner of -1"));
        }
        let mut xattrs = Vec::new();
        for (key, value) in entry.xattrs {
            use base64::Engine;
            let value = base64::engine::general_purpose::STANDARD
                .decode(value)
                .map_err(|e| refused(entry.name, format!("xattr `{key}`: {e}")))?;
            if value.len() > MAX_XATTR_VALUE || key.is_empty() || key.contains('\0') {
                return Err(refused(entry.name, format!("xattr `{key}`")));
            }
            if !is_reserved_xattr(key.as_bytes()) {
                xattrs.push((key.as_bytes().to_vec(), value));
            }
        }
        let mtime = humantime::parse_rfc3339_weak(entry.mtime)
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs() as i64);
        changes.push(Change::Node(Node {
            path,
            kind,
            mode: entry.mode & 0o7777,
            uid: entry.uid,
            gid: entry.gid,
            mtime,
            xattrs,
        }));
    }
    if next_file != files.len() {
        return Err(index_error("its regular files and their chunks disagree"));
    }
    Ok(LayerTree { changes, files })
}
