//! Background completion: a lazy layer fetched whole and imported as an ordinary layer
//! (`layers/<chain-id>`, its blob's digest and its tar's diffID verified as every import
//! verifies them), then compared with the tree its index gave: every entry the index
//! listed is in the tar with the same kind, owners, mode, size, content digest, link
//! target or device, and the tar holds nothing the index did not list (but eStargz's own
//! TOC entry). New containers then use the ordinary layer.
//!
//! A layer whose blob or tar does not match what the image says (a digest or diffID
//! mismatch), or whose index described something else than its tar, is marked bad
//! (`lazy/<chain-id>/bad`, the reason inside): new creates from it are refused and
//! `check` names it. Containers made from it before keep what they have.

use std::collections::HashSet;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use lamina_image::lazy::source::Format;
use lamina_image::lazy::tree::{Change, LayerTree, NodeKind};
use lamina_image::{BlobLocation, Compression, Digest, LayerBlob};
use lamina_registry::PullOptions;
use lamina_store::beneath::{Tree, pin_at};
use lamina_store::{Store, StoreError};
use rustix::fs::FileType;

use crate::fetched::Fetched;
use crate::layer::{self, LazyRecord};

const BAD: &str = "bad";

/// Why lazy layer `chain_id` is bad, if it is.
pub fn bad_reason(store: &Path, chain_id: &Digest) -> Option<String> {
    let path = layer::dir(store, chain_id).join(BAD);
    lamina_store::read_regular_file(&path)
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// Marks lazy layer `chain_id` bad for `why`.
pub fn mark_bad(store: &Store, chain_id: &Digest, why: &str) -> Result<(), StoreError> {
    tracing::error!(layer = %chain_id, why, "lazy layer is bad");
    lamina_store::write_durably(
        &layer::dir(store.root(), chain_id).join(BAD),
        why.as_bytes(),
    )
}

/// How a completion ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Completed {
    /// The layer is an ordinary layer, and its index told the truth.
    Whole,
    /// Marked bad, for this reason.
    Bad(String),
}

/// Completes lazy layer `record` of `store`, fetching with `pull` and the layer's own
/// credentials and scheme ([`layer::client`]): only what `fetched` lacks, if it is given
/// and what it makes is the manifest's blob, else the whole blob. An error is one a
/// retry may cure (the registry unreachable, the disk full); a layer found wrong is
/// [`Completed::Bad`].
pub fn complete(
    store: &Store,
    record: &LazyRecord,
    pull: &PullOptions,
    fetched: Option<&Fetched>,
) -> Result<Completed, StoreError> {
    if let Some(why) = bad_reason(store.root(), &record.chain_id) {
        return Ok(Completed::Bad(why));
    }
    let tree = record.tree(store.root())?;
    let chain_id = &record.chain_id;
    if !store.has_layer(chain_id) {
        // Downloaded first and checked against the manifest's digest, then imported
        // from disk: a failure while fetching is the network's (tried again), one of a
        // blob whose digest is the manifest's is the image's (bad for good).
        let staged = store.layout().tmp().join(format!(
            "{}lazyblob-{}-{}",
            lamina_store::STAGING_PREFIX,
            lamina_store::unique_suffix(),
            chain_id.hex(),
        ));
        let from_fetched = match fetched {
            Some(fetched) if !fetched.discarded() => fill(store, record, pull, fetched)?,
            _ => false,
        };
        let (downloaded, blob_path) = match from_fetched {
            true => (
                Ok(Ok(())),
                fetched.map(|f| f.path().to_path_buf()).unwrap_or_default(),
            ),
            false => (download(store, record, pull, &staged), staged.clone()),
        };
        let imported = match downloaded {
            Ok(Ok(())) => {
                let blob = blob_at(record, &blob_path);
                store
                    .import_layer(&record.chain, record.chain.len() - 1, &blob)
                    .map_err(|e| (!is_the_images(&e), e.to_string()))
            }
            Ok(Err(bad)) => Err((false, bad)),
            Err(e) => Err((true, e.to_string())),
        };
        let _ = std::fs::remove_file(&staged);
        // Kept for a retry (a failure of the network or the disk), let go otherwise.
        if let (Some(fetched), false) = (fetched, matches!(imported, Err((true, _)))) {
            fetched.discard();
        }
        match imported {
            Ok(()) => {}
            Err((true, why)) => {
                return Err(StoreError::Layer {
                    layer: format!("lazy layer {chain_id}"),
                    message: why,
                });
            }
            Err((false, why)) => {
                mark_bad(store, chain_id, &why)?;
                return Ok(Completed::Bad(why));
            }
        }
    }
    let layer_dir = store.layout().layer_diff(chain_id);
    if let Err(why) = same_tree(store, &tree, &layer_dir, record.index.format) {
        let why = format!("its index does not describe its tar: {why}");
        mark_bad(store, chain_id, &why)?;
        return Ok(Completed::Bad(why));
    }
    tracing::info!(layer = %chain_id, "lazy layer completed: now an ordinary layer");
    Ok(Completed::Whole)
}

/// Fetches what `fetched` lacks of the layer's blob; `true` if the whole then is the
/// manifest's blob. `false` (logged) if it is not — a range the registry once served
/// wrong — and the blob is then fetched whole, once more. The error is the fetch's.
fn fill(
    store: &Store,
    record: &LazyRecord,
    pull: &PullOptions,
    fetched: &Fetched,
) -> Result<bool, StoreError> {
    let fail = |why: String| StoreError::Layer {
        layer: format!("lazy layer {}", record.chain_id),
        message: why,
    };
    let client = layer::client(store.root(), record, pull).map_err(|e| fail(e.to_string()))?;
    let digest = record.blob_digest.to_string();
    let held = fetched.held();
    fetched
        .fill(|start, len| {
            client
                .read_range(&digest, record.blob_size, start, len)
                .map_err(io::Error::other)
        })
        .map_err(|e| fail(format!("fetching the rest of the blob: {e}")))?;
    // From here on reads write nothing into it: what is hashed is what is imported.
    fetched.seal();
    let file =
        std::fs::File::open(fetched.path()).map_err(StoreError::io("reading", fetched.path()))?;
    let mut hashing = lamina_image::HashingReader::new(file);
    io::copy(&mut hashing, &mut io::sink()).map_err(StoreError::io("reading", fetched.path()))?;
    let (got, size) = hashing
        .finish()
        .map_err(StoreError::io("reading", fetched.path()))?;
    if got == record.blob_digest && size == record.blob_size {
        tracing::info!(layer = %record.chain_id, kept = held, fetched = record.blob_size - held, "lazy layer's blob made from what reads fetched and the rest");
        return Ok(true);
    }
    tracing::warn!(layer = %record.chain_id, "the bytes fetched for reads do not make the manifest's blob: fetching it whole");
    fetched.discard();
    Ok(false)
}

/// Fetches the layer's whole blob into `to`. The outer error is the fetch's (the
/// registry, the disk); the inner one says the blob is not the manifest's.
fn download(
    store: &Store,
    record: &LazyRecord,
    pull: &PullOptions,
    to: &Path,
) -> Result<Result<(), String>, StoreError> {
    let fail = |why: String| StoreError::Layer {
        layer: format!("lazy layer {}", record.chain_id),
        message: why,
    };
    let client = layer::client(store.root(), record, pull).map_err(|e| fail(e.to_string()))?;
    let stream = client
        .open_blob(&record.blob_digest.to_string(), record.blob_size, &[])
        .map_err(|e| fail(e.to_string()))?;
    let mut hashing = lamina_image::HashingReader::new(stream);
    let mut file = std::fs::File::create(to).map_err(StoreError::io("creating", to))?;
    io::copy(&mut hashing, &mut file).map_err(|e| fail(format!("fetching the blob: {e}")))?;
    let (digest, size) = hashing
        .finish()
        .map_err(|e| fail(format!("fetching the blob: {e}")))?;
    if digest != record.blob_digest || size != record.blob_size {
        return Ok(Err(format!(
            "blob digest mismatch: the manifest says {} ({} bytes), the registry served {digest} ({size} bytes)",
            record.blob_digest, record.blob_size
        )));
    }
    Ok(Ok(()))
}

/// The downloaded blob at `path`, as an import reads it.
fn blob_at(record: &LazyRecord, path: &Path) -> LayerBlob {
    LayerBlob {
        index: record.chain.len() - 1,
        location: BlobLocation::File(path.to_path_buf()),
        digest: Some(record.blob_digest.clone()),
        size: Some(record.blob_size),
        compression: Some(match record.index.format {
            Format::Estargz => Compression::Gzip,
            Format::ZstdChunked => Compression::Zstd,
        }),
        diff_id: record.diff_id.clone(),
        remote: None,
    }
}

/// Whether an import of a blob whose digest is the manifest's failed for a reason of
/// the image's own (its tar not its diffID, its size not the manifest's): bad for good. Anything
/// else (the disk, memory, a lock, the unpacker's refusals, which a retry repeats) is
/// tried again, and marked bad only after repeated failures (`serve::GIVE_UP_AFTER`).
fn is_the_images(e: &StoreError) -> bool {
    let text = e.to_string();
    text.contains("mismatch")
}

fn rel(components: &[Vec<u8>]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    components
        .iter()
        .map(|c| std::ffi::OsStr::from_bytes(c))
        .collect()
}

/// Whether the imported layer at `layer_dir` is what `tree` says, entry by entry, and
/// holds nothing more.
fn same_tree(
    store: &Store,
    tree: &LayerTree,
    layer_dir: &Path,
    format: Format,
) -> Result<(), String> {
    let root =
        Tree::open(layer_dir).map_err(|e| format!("opening {}: {e}", layer_dir.display()))?;
    // The store's `objects/`, opened once if a stub asks for it.
    let objects = std::cell::OnceCell::new();
    let mut listed: HashSet<PathBuf> = HashSet::new();
    for change in &tree.changes {
        let path = match change {
            Change::Node(node) => &node.path,
            Change::Whiteout(path) | Change::Opaque(path) => path,
        };
        let rel = rel(path.components());
        for ancestor in rel.ancestors() {
            listed.insert(ancestor.to_path_buf());
        }
        // The layer's root is the layer directory, whose metadata the store decides.
        if path.is_root() {
            continue;
        }
        let shown = rel.display().to_string();
        let (fd, stat) = pin_at(root.root(), &rel).map_err(|e| format!("`{shown}`: {e}"))?;
        let kind = FileType::from_raw_mode(stat.st_mode);
        let differs = |what: &str| Err(format!("`{shown}`: its {what} differs"));
        let node = match change {
            Change::Whiteout(_) => {
                if kind != FileType::CharacterDevice || stat.st_rdev != 0 {
                    return differs("whiteout");
                }
                continue;
            }
            Change::Opaque(_) => {
                let opaque = store
                    .host()
                    .get_xattr(
                        lamina_sys::At::Fd(fd.as_fd()),
                        std::ffi::OsStr::new("trusted.overlay.opaque"),
                    )
                    .ok()
                    .flatten();
                if kind != FileType::Directory || opaque.as_deref() != Some(b"y") {
                    return differs("opaque marker");
                }
                continue;
            }
            Change::Node(node) => node,
        };
        if (stat.st_uid, stat.st_gid) != (node.uid, node.gid) {
            return differs("owner");
        }
        let expected = match &node.kind {
            NodeKind::Dir => FileType::Directory,
            NodeKind::File(_) | NodeKind::Hardlink(_) => FileType::RegularFile,
            NodeKind::Symlink(_) => FileType::Symlink,
            NodeKind::Char(..) => FileType::CharacterDevice,
            NodeKind::Block(..) => FileType::BlockDevice,
            NodeKind::Fifo => FileType::Fifo,
        };
        if kind != expected {
            return differs("kind");
        }
        if kind != FileType::Symlink
            && !matches!(node.kind, NodeKind::Hardlink(_))
            && stat.st_mode & 0o7777 != node.mode
        {
            return differs("mode");
        }
        match &node.kind {
            NodeKind::File(n) => {
                let file = &tree.files[*n];
                if stat.st_size as u64 != file.size {
                    return differs("size");
                }
                let digest = content_digest(store, &root, &objects, &rel, &fd)
                    .map_err(|e| format!("`{shown}`: {e}"))?;
                if digest != file.digest {
                    return differs("content");
                }
            }
            NodeKind::Hardlink(target) => {
                let (_, target_stat) = pin_at(root.root(), &self::rel(target.components()))
                    .map_err(|e| format!("`{shown}`: its link target: {e}"))?;
                if target_stat.st_ino != stat.st_ino {
                    return differs("link target");
                }
            }
            NodeKind::Symlink(target) => {
                let read = rustix::fs::readlinkat(&fd, "", Vec::new())
                    .map_err(|e| format!("`{shown}`: {e}"))?;
                if read.as_bytes() != target.as_slice() {
                    return differs("link target");
                }
            }
            NodeKind::Char(major, minor) | NodeKind::Block(major, minor) => {
                if stat.st_rdev != rustix::fs::makedev(*major, *minor) {
                    return differs("device");
                }
            }
            NodeKind::Dir | NodeKind::Fifo => {}
        }
    }
    let mut extra = None;
    root.walk(|entry| {
        let path = entry.rel();
        let own_toc =
            format == Format::Estargz && path == Path::new(lamina_image::lazy::estargz::TOC_NAME);
        if !listed.contains(&path) && !own_toc && extra.is_none() {
            extra = Some(path);
        }
        Ok(true)
    })
    .map_err(|e| format!("walking {}: {e}", layer_dir.display()))?;
    match extra {
        Some(path) => Err(format!(
            "`{}` is in the tar, not in the index",
            path.display()
        )),
        None => Ok(()),
    }
}

/// The SHA-256 of the regular file at `rel` under `root`.
/// The digest of the file `rel` under `root` (pinned as `pinned`): of its object's data
/// where it is a stub of a store whose layers keep their data in objects.
fn content_digest(
    store: &Store,
    root: &Tree,
    objects: &std::cell::OnceCell<io::Result<Tree>>,
    rel: &Path,
    pinned: &std::os::fd::OwnedFd,
) -> io::Result<Digest> {
    use std::os::fd::AsFd;
    let stub = match store.properties().layer_data_in_objects {
        true => lamina_store::object_layers::stub_object(
            &**store.host(),
            lamina_sys::At::Fd(pinned.as_fd()),
        )?,
        false => None,
    };
    let file = match stub {
        Some(object) => objects
            .get_or_init(|| Tree::open(&store.layout().objects()))
            .as_ref()
            .map_err(|e| io::Error::new(e.kind(), e.to_string()))?
            .open_regular(&object)?,
        None => root.open_regular(rel)?,
    };
    let (digest, _) = lamina_image::HashingReader::new(file).finish()?;
    Ok(digest)
}
