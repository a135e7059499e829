//! A lazy layer in the store: `lazy/<chain-id-hex>/`, beside `layers/` and never in it
//! (a layer under `layers/` is whole and verified against its diffID; a lazy one is not
//! yet). It holds:
//!
//! - `lazy.json`: what the layer is and where its bytes are ([`LazyRecord`]);
//! - `index`: the index's bytes as fetched and checked, so a server builds the layer's
//!   chunks again without the registry (and checks them against the digest again);
//! - `auth.json` (`0600`, if the create had credentials): what its server fetches with;
//! - `diff/`: the layer's tree as overlay reads a lower: directories, symlinks, devices,
//!   whiteouts and opaque markers as the tar path makes them, each non-empty regular file
//!   a sparse metacopy file redirecting (`/<chain-id-hex>-<n>`, [`object_name`]) into the
//!   layer's objects, with the index's owners, modes, times and xattrs, and the files
//!   whose bytes the index itself gives (eStargz's TOC) written whole;
//! - `objects.mnt/`: where the server mounts those objects (FUSE, `lamina-lazy`), and
//!   `copies-*/`, the chunks that server fetched;
//! - `bad`, if completion found the layer wrong (`crate::complete`).
//!
//! Published whole: written in `tmp/`, synced, renamed into place.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_image::lazy::estargz::TocFile;
use lamina_image::lazy::source::IndexRecord;
use lamina_image::lazy::tree::{Change, LayerTree, Node, NodeKind};
use lamina_store::{Store, StoreError};
use lamina_sys::{At, HostFs};
use lamina_unpack::metadata::{Meta, apply_at, apply_fd};
use rustix::fs::{AtFlags, Mode, OFlags};
use serde::{Deserialize, Serialize};

/// The store's directory of lazy layers.
pub fn lazy_root(store: &Path) -> PathBuf {
    store.join("lazy")
}

/// Lazy layer `chain_id`'s directory.
pub fn dir(store: &Path, chain_id: &Digest) -> PathBuf {
    lazy_root(store).join(chain_id.hex())
}

/// Its tree, as overlay's lower.
pub fn diff(store: &Path, chain_id: &Digest) -> PathBuf {
    dir(store, chain_id).join("diff")
}

/// Where its objects are served.
pub fn objects_mount(store: &Path, chain_id: &Digest) -> PathBuf {
    dir(store, chain_id).join("objects.mnt")
}

/// The chain IDs named by the entries of the store's `lazy/` (a record or not).
pub fn named_layers(store: &Path) -> Vec<Digest> {
    let Ok(entries) = fs::read_dir(lazy_root(store)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| Digest::from_hex(entry.file_name().to_str()?))
        .collect()
}

/// A registry client for `record`'s layer: the `shared` settings (timeouts,
/// certificates, retries) with the layer's own credentials and scheme, never an auth
/// file's, which would be whoever started the daemon's.
pub fn client(
    store: &Path,
    record: &LazyRecord,
    shared: &lamina_registry::PullOptions,
) -> io::Result<lamina_registry::Client> {
    let reference = lamina_registry::RegistryRef::parse(&record.repository)
        .ok_or_else(|| {
            io::Error::other(format!("`{}` is no docker:// reference", record.repository))
        })?
        .map_err(io::Error::other)?;
    let auth = auth(store, &record.chain_id).map_err(io::Error::other)?;
    let options = lamina_registry::PullOptions {
        credentials: auth.map(|a| lamina_registry::Credentials {
            username: a.username,
            password: a.password,
        }),
        insecure_registries: if record.plain_http {
            vec![reference.host.clone()]
        } else {
            Vec::new()
        },
        auth_file: None,
        ..shared.clone()
    };
    lamina_registry::Client::new(&reference, &options).map_err(io::Error::other)
}

/// Whether `chain_id` is a lazy layer of the store.
pub fn is_lazy(store: &Path, chain_id: &Digest) -> bool {
    dir(store, chain_id).join(RECORD).is_file()
}

const RECORD: &str = "lazy.json";
const INDEX: &str = "index";
/// The username and password the pull that published the layer was given (root's alone,
/// `0600`): what its server fetches this layer's chunks with, and no other layer's.
const AUTH: &str = "auth.json";

/// A username and password for one lazy layer's registry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LayerAuth {
    pub username: String,
    pub password: String,
}

/// The credentials lazy layer `chain_id` was published with, if any.
pub fn auth(store: &Path, chain_id: &Digest) -> Result<Option<LayerAuth>, StoreError> {
    let path = dir(store, chain_id).join(AUTH);
    if !path.exists() {
        return Ok(None);
    }
    let bytes = lamina_store::read_regular_file(&path).map_err(StoreError::io("reading", &path))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StoreError::io("reading", &path)(e.into()))
}

/// How a publish ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// Published now, or found published from the same blob and index.
    Ready,
    /// A lazy layer of this chain ID was published from another source (blob, index,
    /// repository or credentials): a chain ID is the config's claim, which nothing lazy
    /// has checked yet, and a layer's credentials are one tenant's, so it is not reused
    /// (the caller pulls this layer whole, verified).
    Other,
}

/// Where a lazy layer's bytes are fetched from, and with what.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub blob_digest: &'a Digest,
    pub index_digest: &'a Digest,
    pub repository: &'a str,
    pub plain_http: bool,
    pub auth: Option<&'a LayerAuth>,
}

/// Whether the lazy layer already at `chain_id` is `source`'s: the same blob and index,
/// fetched from the same repository, the same way, with the same credentials (a layer's
/// server fetches with one tenant's credentials, never another's).
pub fn same_source(
    store: &Path,
    chain_id: &Digest,
    source: Source<'_>,
) -> Result<bool, StoreError> {
    let existing = LazyRecord::read(store, chain_id)?;
    let existing_auth = self::auth(store, chain_id)?;
    let auth = source.auth;
    let same_auth = match (existing_auth.as_ref(), auth) {
        (None, None) => true,
        (Some(a), Some(b)) => a.username == b.username && a.password == b.password,
        _ => false,
    };
    Ok(existing.blob_digest == *source.blob_digest
        && existing.index.digest == *source.index_digest
        && existing.repository == source.repository
        && existing.plain_http == source.plain_http
        && same_auth)
}

/// Creates `dir` (and what is missing above it) as root's alone.
fn private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// What a lazy layer is, and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LazyRecord {
    pub chain_id: Digest,
    /// The chain IDs of the layers from the image's bottom up to this one (its last).
    pub chain: Vec<Digest>,
    /// What the whole layer's tar must hash to (the image config's).
    pub diff_id: Digest,
    pub blob_digest: Digest,
    pub blob_size: u64,
    /// `docker://HOST/REPO`.
    pub repository: String,
    /// Spoken to over plain HTTP (the operator marked the registry insecure).
    #[serde(default)]
    pub plain_http: bool,
    pub index: IndexRecord,
}

impl LazyRecord {
    /// The record of lazy layer `chain_id`.
    pub fn read(store: &Path, chain_id: &Digest) -> Result<LazyRecord, StoreError> {
        let path = dir(store, chain_id).join(RECORD);
        let bytes =
            lamina_store::read_regular_file(&path).map_err(StoreError::io("reading", &path))?;
        let record: LazyRecord = serde_json::from_slice(&bytes)
            .map_err(|e| StoreError::io("reading", &path)(e.into()))?;
        let bad = |why: String| StoreError::io("reading", &path)(io::Error::other(why));
        if record.chain_id != *chain_id {
            return Err(bad(format!("it names layer {}", record.chain_id)));
        }
        // Its chain must be one an image makes and end in this layer by its diffID:
        // completion imports the layer under it.
        let parent = record.chain.len().checked_sub(2).map(|n| &record.chain[n]);
        if record.chain.last() != Some(chain_id)
            || lamina_image::next_chain_id(parent, &record.diff_id) != *chain_id
        {
            return Err(bad(
                "its chain does not end in this layer by its diffID".into()
            ));
        }
        Ok(record)
    }

    /// The layer's tree, from the index kept beside the record, checked again.
    pub fn tree(&self, store: &Path) -> Result<LayerTree, StoreError> {
        let path = dir(store, &self.chain_id).join(INDEX);
        let bytes = index_bytes(store, &self.chain_id)?;
        self.index
            .tree(&bytes)
            .map_err(|e| StoreError::io("reading", &path)(io::Error::other(e)))
    }
}

/// The bytes of lazy layer `chain_id`'s index as they were fetched from its blob (not
/// checked here: [`LazyRecord::tree`] checks them).
pub fn index_bytes(store: &Path, chain_id: &Digest) -> Result<Vec<u8>, StoreError> {
    let path = dir(store, chain_id).join(INDEX);
    lamina_store::read_regular_file(&path).map_err(StoreError::io("reading", &path))
}

/// The object a regular file's metacopy inode redirects to: `<chain-id-hex>-<n>`, the
/// `n`th regular file of that layer. Not its content digest: that is the index's claim,
/// and a file claiming another's digest must not be served in its place (here, or in a
/// layer below whose objects overlay looks up after this one's).
pub fn object_name(chain_id: &Digest, n: usize) -> String {
    format!("{}-{n}", chain_id.hex())
}

/// Publishes lazy layer `record.chain_id` with the index's `bytes`, the `tree` they make
/// and the credentials it was fetched with, unless it is there already. A directory left
/// there without a record (a partial removal) is moved aside first.
pub fn publish(
    store: &Store,
    record: &LazyRecord,
    bytes: &[u8],
    tree: &LayerTree,
    auth: Option<&LayerAuth>,
) -> Result<Published, StoreError> {
    let root = store.root();
    let target = dir(root, &record.chain_id);
    let ready = || -> Result<Published, StoreError> {
        let source = Source {
            blob_digest: &record.blob_digest,
            index_digest: &record.index.digest,
            repository: &record.repository,
            plain_http: record.plain_http,
            auth,
        };
        let same = same_source(root, &record.chain_id, source)?;
        Ok(if same {
            Published::Ready
        } else {
            Published::Other
        })
    };
    if target.join(RECORD).is_file() {
        return ready();
    }
    // Named as every staging directory is, so `clean` knows it its creator's while the
    // creator lives.
    let staging = store.layout().tmp().join(format!(
        "{}lazy-{}-{}",
        lamina_store::STAGING_PREFIX,
        lamina_store::unique_suffix(),
        record.chain_id.hex(),
    ));
    let io_error = |what: &'static str, path: &Path| StoreError::io(what, path);
    let written = (|| -> Result<Published, StoreError> {
        private_dir(&staging).map_err(io_error("creating", &staging))?;
        let diff = staging.join("diff");
        write_tree(&**store.host(), &diff, &record.chain_id, tree)
            .map_err(|e| io_error("writing the lazy layer's tree", &diff)(e))?;
        let inline = record
            .index
            .inline_files(bytes)
            .map_err(|e| io_error("reading the index", &diff)(io::Error::other(e)))?;
        write_inline(&**store.host(), &diff, &inline)
            .map_err(|e| io_error("writing the lazy layer's tree", &diff)(e))?;
        fs::create_dir(staging.join("objects.mnt")).map_err(io_error("creating", &staging))?;
        lamina_store::write_durably(&staging.join(INDEX), bytes)?;
        if let Some(auth) = auth {
            write_private(store, &staging.join(AUTH), auth)?;
        }
        let json = serde_json::to_vec_pretty(record)
            .map_err(|e| io_error("writing", &staging)(e.into()))?;
        lamina_store::write_durably(&staging.join(RECORD), &json)?;
        let dir_file = File::open(&staging).map_err(io_error("opening", &staging))?;
        store
            .host()
            .syncfs(&dir_file, &staging)
            .map_err(|e| io_error("syncing", &staging)(e.into()))?;
        let parent = lazy_root(root);
        private_dir(&parent).map_err(io_error("creating", &parent))?;
        if target.exists() && !target.join(RECORD).is_file() {
            let aside = store.layout().tmp().join(format!(
                "{}lazypartial-{}-{}",
                lamina_store::STAGING_PREFIX,
                lamina_store::unique_suffix(),
                record.chain_id.hex()
            ));
            fs::rename(&target, &aside).map_err(io_error("moving aside", &target))?;
            let _ = lamina_store::remove_tree(&aside);
        }
        match fs::rename(&staging, &target) {
            Ok(()) => {
                lamina_store::sync_dir(&parent)?;
                Ok(Published::Ready)
            }
            // Another import published one meanwhile.
            Err(_) if target.join(RECORD).is_file() => {
                let _ = lamina_store::remove_tree(&staging);
                ready()
            }
            Err(e) => Err(io_error("publishing", &target)(e)),
        }
    })();
    if written.is_err() {
        let _ = lamina_store::remove_tree(&staging);
    }
    written
}

/// Writes `auth` at `path`, readable by root alone, durably.
fn write_private(store: &Store, path: &Path, auth: &LayerAuth) -> Result<(), StoreError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let json = serde_json::to_vec(auth).map_err(|e| StoreError::io("writing", path)(e.into()))?;
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(StoreError::io("creating", path))?;
    file.write_all(&json)
        .map_err(StoreError::io("writing", path))?;
    store
        .host()
        .fsync(&file, path)
        .map_err(|e| StoreError::io("syncing", path)(e.into()))
}

/// Writes the files whose bytes the index gives (eStargz's TOC entry) at the root of
/// `diff`, whole, as a whole pull would; a name the tree already holds is left as it is.
fn write_inline(host: &dyn HostFs, diff: &Path, files: &[(String, TocFile)]) -> io::Result<()> {
    let root = File::open(diff)?;
    for (name, file) in files {
        let fd = match rustix::fs::openat(
            &root,
            name.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut written = File::from(fd);
        std::io::Write::write_all(&mut written, &file.json)?;
        let meta = Meta {
            mode: file.mode,
            uid: file.uid,
            gid: file.gid,
            mtime: file.mtime,
            xattrs: Vec::new(),
        };
        apply_fd(host, written.as_fd(), &meta).map_err(io::Error::from)?;
    }
    Ok(())
}

fn meta(node: &Node) -> Meta {
    Meta {
        mode: node.mode,
        uid: node.uid,
        gid: node.gid,
        mtime: node.mtime,
        xattrs: node.xattrs.clone(),
    }
}

/// Opens directory `components` beneath `root`, making each missing one (`0755`, root's:
/// an entry of its own gives it its metadata later), following no symlink.
fn open_dir(root: BorrowedFd<'_>, components: &[Vec<u8>]) -> io::Result<OwnedFd> {
    let mut fd = rustix::fs::openat(
        root,
        ".",
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )?;
    for name in components {
        match rustix::fs::mkdirat(&fd, name.as_slice(), Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        fd = rustix::fs::openat(
            &fd,
            name.as_slice(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
            Mode::empty(),
        )?;
    }
    Ok(fd)
}

/// Writes `tree` at `diff` (which must not exist). Directories get their metadata last,
/// deepest first, so entries made in them do not change their times afterwards.
pub fn write_tree(
    host: &dyn HostFs,
    diff: &Path,
    chain_id: &Digest,
    tree: &LayerTree,
) -> io::Result<()> {
    fs::create_dir(diff)?;
    let root = File::open(diff)?;
    let root = root.as_fd();
    let failed = |path: &[Vec<u8>], e: rustix::io::Errno| {
        io::Error::other(format!(
            "`{}`: {e}",
            lamina_unpack::shown(&lamina_unpack::EntryPath::join(path))
        ))
    };
    let mut dirs: BTreeMap<Vec<Vec<u8>>, Meta> = BTreeMap::new();
    for change in &tree.changes {
        let (path, node) = match change {
            Change::Opaque(path) => {
                let dir = open_dir(root, path.components())?;
                host.set_xattr(
                    At::Fd(dir.as_fd()),
                    OsStr::new("trusted.overlay.opaque"),
                    b"y",
                )
                .map_err(|e| failed(path.components(), e))?;
                continue;
            }
            Change::Whiteout(path) => {
                let parent = open_dir(root, path.parent())?;
                let name = path.name().unwrap_or_default();
                host.mknod(
                    parent.as_fd(),
                    OsStr::from_bytes(name),
                    lamina_sys::Node::WHITEOUT,
                    0o600,
                )
                .map_err(|e| failed(path.components(), e))?;
                continue;
            }
            Change::Node(node) => (&node.path, node),
        };
        let fail = |e| failed(path.components(), e);
        if matches!(node.kind, NodeKind::Dir) {
            open_dir(root, path.components())?;
            dirs.insert(path.components().to_vec(), meta(node));
            continue;
        }
        let parent = open_dir(root, path.parent())?;
        let name = path.name().unwrap_or_default();
        match &node.kind {
            NodeKind::Dir => {}
            NodeKind::File(n) => {
                let file = &tree.files[*n];
                let fd = rustix::fs::openat(
                    &parent,
                    name,
                    OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(fail)?;
                rustix::fs::ftruncate(&fd, file.size).map_err(fail)?;
                if file.size > 0 {
                    host.set_xattr(
                        At::Fd(fd.as_fd()),
                        OsStr::new("trusted.overlay.metacopy"),
                        b"",
                    )
                    .map_err(fail)?;
                    let redirect = format!("/{}", object_name(chain_id, *n));
                    host.set_xattr(
                        At::Fd(fd.as_fd()),
                        OsStr::new("trusted.overlay.redirect"),
                        redirect.as_bytes(),
                    )
                    .map_err(fail)?;
                }
                apply_fd(host, fd.as_fd(), &meta(node)).map_err(fail)?;
            }
            NodeKind::Symlink(target) => {
                rustix::fs::symlinkat(target.as_slice(), &parent, name).map_err(fail)?;
                apply_at(host, parent.as_fd(), name, &meta(node), true).map_err(fail)?;
            }
            NodeKind::Hardlink(target) => {
                let from = open_dir(root, target.parent())?;
                rustix::fs::linkat(
                    &from,
                    target.name().unwrap_or_default(),
                    &parent,
                    name,
                    AtFlags::empty(),
                )
                .map_err(fail)?;
            }
            NodeKind::Char(major, minor) | NodeKind::Block(major, minor) => {
                let (major, minor) = (*major, *minor);
                let kind = match node.kind {
                    NodeKind::Char(..) => lamina_sys::Node::Char { major, minor },
                    _ => lamina_sys::Node::Block { major, minor },
                };
                host.mknod(parent.as_fd(), OsStr::from_bytes(name), kind, 0o600)
                    .map_err(fail)?;
                apply_at(host, parent.as_fd(), name, &meta(node), false).map_err(fail)?;
            }
            NodeKind::Fifo => {
                host.mknod(
                    parent.as_fd(),
                    OsStr::from_bytes(name),
                    lamina_sys::Node::Fifo,
                    0o600,
                )
                .map_err(fail)?;
                apply_at(host, parent.as_fd(), name, &meta(node), false).map_err(fail)?;
            }
        }
    }
    for (components, meta) in dirs.iter().rev() {
        let dir = open_dir(root, components)?;
        apply_fd(host, dir.as_fd(), meta).map_err(|e| failed(components, e))?;
    }
    Ok(())
}
