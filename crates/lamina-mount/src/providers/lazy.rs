//! lazy: an overlay mounted for this container, its indexed layers lazy (issue 39). A
//! registry layer whose descriptor names an index (eStargz's TOC, zstd:chunked's
//! manifest) is fetched as that index alone and published as a lazy layer
//! (`lamina_lazy::layer`: its tree, each regular file a metacopy inode redirecting into
//! the layer's objects); every other layer is imported whole, as for any strategy, and
//! so is a layer whose index fails a check (logged, never a failed create). The
//! overlay's lowers are the layers top-most first, each lazy one by its tree, and its
//! data-only lowers are the lazy layers' objects, which a server (`lamina daemon`,
//! `lamina_lazy::serve`) mounts over FUSE and fetches chunk by chunk on first read.
//!
//! The create starts that server through [`LazyServer`] if none runs, and waits until it
//! serves every lazy layer the container needs; mounting again (after a host restart)
//! needs it running. An image with no indexed layer makes an ordinary metacopy overlay.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lamina_image::lazy::source::{declared, fetch_index};
use lamina_image::{Digest, Image, LayerBlob};
use lamina_lazy::layer::{self, LazyRecord};
use lamina_store::{ContainerDirs, Store, StoreError};
use lamina_sys::{Mounter, OverlaySpec};

use crate::RootfsError;
use crate::lowers::plan;
use crate::model::Flavour;
use crate::model::record::{Container, RootfsRecord};
use crate::providers::{Attach, Made, Provide, ToMount, Undo, one_page, record_mounted};

/// Layers whose indexes one create fetches at once.
const INDEXES_AT_ONCE: usize = 8;

/// How long a served layer's mount may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// How long a create waits for the server to serve its lazy layers.
const SERVED_WITHIN: Duration = Duration::from_secs(15);

/// Starts a server of the store's lazy layers (the front-end's way: the CLI starts
/// `lamina daemon`); an error says why it could not.
#[derive(Clone)]
pub struct LazyServer(pub Arc<StartServer>);

/// Starts a server for the store, or says why it could not.
pub type StartServer = dyn Fn(&Store) -> Result<(), String> + Send + Sync;

impl std::fmt::Debug for LazyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LazyServer")
    }
}

/// Makes every layer of `image` present: lazy where its index can be fetched and
/// checked, whole otherwise. Returns the chain IDs, bottom-most first.
pub(crate) fn import(store: &Store, image: &Image) -> Result<Vec<Digest>, StoreError> {
    refuse_mapped(store)?;
    let chain_ids = image.chain_ids();
    // Each layer's index is a round trip or two of its own: several at once.
    let mut lazy = Vec::with_capacity(chain_ids.len());
    for (group, blobs) in image.layers.chunks(INDEXES_AT_ONCE).enumerate() {
        let found: Vec<Result<bool, StoreError>> = std::thread::scope(|scope| {
            let chain_ids = &chain_ids;
            let running: Vec<_> = blobs
                .iter()
                .enumerate()
                .map(|(i, blob)| {
                    let n = group * INDEXES_AT_ONCE + i;
                    scope.spawn(move || lazily(store, blob, &chain_ids[..=n]))
                })
                .collect();
            running
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        for one in found {
            lazy.push(one?);
        }
    }
    store.import_except(image, |n| lazy[n])
}

/// Whether `auto` would serve `image` lazily here: it has an indexed registry layer the
/// store lacks, the store maps no ids, and a server of lazy layers runs for the store
/// (`auto` never starts one: a Garden create stays one process unless the operator runs
/// `lamina daemon`).
pub(crate) fn served_lazily(store: &Store, image: &Image) -> bool {
    let chain_ids = image.chain_ids();
    !store.properties().mapped()
        && image.layers.iter().zip(&chain_ids).any(|(blob, chain_id)| {
            blob.remote
                .as_ref()
                .is_some_and(|r| declared(&r.annotations).is_some())
                && !store.has_layer(chain_id)
        })
        && lamina_lazy::serve::running(store.root())
}

/// A lazy layer's tree carries the index's owners as they are: a store that maps ids
/// would show them unmapped.
fn refuse_mapped(store: &Store) -> Result<(), StoreError> {
    if store.properties().mapped() {
        return Err(StoreError::Properties {
            store: store.root().to_path_buf(),
            why: "strategy `lazy` does not serve a store with uid or gid mappings".into(),
        });
    }
    Ok(())
}

/// containerd's remote snapshots: makes layer `n` of `image` present lazily, as a lazy
/// create would (its own source, index checked, never another's lazy layer reused). The
/// caller checked that the layers below are the image's. `false`: it is to be pulled whole
/// (already in the store, no usable index, or a lazy layer of its chain ID from another
/// source).
pub fn prepare_layer(store: &Store, image: &Image, n: usize) -> Result<bool, StoreError> {
    refuse_mapped(store)?;
    let chain_ids = image.chain_ids();
    let (Some(blob), Some(chain)) = (image.layers.get(n), chain_ids.get(..=n)) else {
        return Ok(false);
    };
    lazily(store, blob, chain)
}

/// Refuses lazy layer `chain_id` if its completion found it bad, naming why.
pub(crate) fn refuse_bad(store: &Store, chain_id: &Digest) -> Result<(), StoreError> {
    refuse_bad_as(store, chain_id, || chain_id.to_string())
}

/// [`refuse_bad`], the error naming the layer as `layer` describes it.
fn refuse_bad_as(
    store: &Store,
    chain_id: &Digest,
    layer: impl FnOnce() -> String,
) -> Result<(), StoreError> {
    match lamina_lazy::complete::bad_reason(store.root(), chain_id) {
        Some(why) => Err(StoreError::Layer {
            layer: layer(),
            message: format!("lazy layer {chain_id} is bad: {why}"),
        }),
        None => Ok(()),
    }
}

/// Whether `chain_id` is a lazy layer of `store` not yet an ordinary one.
pub fn still_lazy(store: &Store, chain_id: &Digest) -> bool {
    !store.has_layer(chain_id) && layer::is_lazy(store.root(), chain_id)
}

/// What lazy layer `chain_id` holds on disk (bytes, inodes: its tree, index, the chunks
/// fetched so far and the blob bytes kept for completion), if it is one and not yet an
/// ordinary layer. Its objects' mount is not walked: a dead server's fails every look,
/// and a stalled one's never answers.
pub fn layer_usage(store: &Store, chain_id: &Digest) -> Option<Result<(u64, u64), StoreError>> {
    if !still_lazy(store, chain_id) {
        return None;
    }
    let dir = layer::dir(store.root(), chain_id);
    let mount = layer::objects_mount(store.root(), chain_id);
    let walk = || -> Result<(u64, u64), StoreError> {
        let (mut bytes, mut inodes) = (0, 1);
        for entry in std::fs::read_dir(&dir).map_err(StoreError::io("measuring", &dir))? {
            let entry = entry.map_err(StoreError::io("measuring", &dir))?;
            let path = entry.path();
            if path == mount {
                continue;
            }
            let meta = entry
                .metadata()
                .map_err(StoreError::io("measuring", &path))?;
            let (b, i) = match meta.is_dir() {
                true => lamina_store::disk_usage_and_inodes(&path)?,
                false => {
                    use std::os::unix::fs::MetadataExt;
                    (meta.blocks() * 512, 1)
                }
            };
            bytes += b;
            inodes += i;
        }
        Ok((bytes, inodes))
    };
    Some(walk())
}

/// The directory showing layer `chain_id`'s tree: its lazy tree while it is lazy, else
/// its ordinary one.
pub fn tree_of(store: &Store, chain_id: &Digest) -> PathBuf {
    match still_lazy(store, chain_id) {
        true => layer::diff(store.root(), chain_id),
        false => store.layout().layer_diff(chain_id),
    }
}

/// The lowers a commit fills metadata-only copies from (top-most first): each layer's
/// tree ([`tree_of`]), then the objects of those still lazy, where their trees' files
/// redirect (read through their server). Over ordinary layers, the layers alone.
pub(crate) fn commit_lowers(store: &Store, chain_ids: &[Digest]) -> Vec<PathBuf> {
    let lazy = lazy_layers(store, chain_ids);
    chain_ids
        .iter()
        .rev()
        .map(|c| tree_of(store, c))
        .chain(
            lazy.iter()
                .rev()
                .map(|c| layer::objects_mount(store.root(), c)),
        )
        .collect()
}

/// The bytes of lazy layer `chain_id`'s regular files, as its index lists them: what it
/// will hold once complete.
pub(crate) fn indexed_bytes(store: &Store, chain_id: &Digest) -> Result<u64, StoreError> {
    let tree = LazyRecord::read(store.root(), chain_id)?.tree(store.root())?;
    Ok(tree.files.iter().map(|f| f.size).sum())
}

/// The choice for a chain with lazy layer `lazy`: `lazy`, when `auto`, `lazy` or
/// `classic` was asked (classic's overlay of the layers in the store is, over lazy ones,
/// a lazy overlay: how an unpack over a lazy layer gets its snapshot); any other strategy
/// is refused, never silently replaced, and so is a disk limit (lazy has no upper of its
/// own). An ephemeral container gets a durable upper: more than it asked.
pub(crate) fn for_lazy_layers(
    request: &crate::choose::Request,
    lazy: &Digest,
) -> Result<crate::choose::Choice, RootfsError> {
    use crate::{Model, Strategies};
    let asked = request.strategies;
    if !asked.auto && !asked.lazy && asked != Strategies::CLASSIC {
        return Err(RootfsError::Refused(format!(
            "layer {lazy} is lazy (its data is still being fetched): only strategy `lazy`, `classic` or `auto` serves it, not `{asked}`"
        )));
    }
    if request.disk_limit {
        return Err(RootfsError::Refused(format!(
            "layer {lazy} is lazy (its data is still being fetched): a disk limit needs an isolated upper, which strategy `lazy` does not give; ask again once the layer is complete"
        )));
    }
    let strategies = Strategies {
        deferred: asked.deferred,
        ..Strategies::parse("lazy").map_err(RootfsError::Refused)?
    };
    Ok(crate::choose::Choice {
        model: Model::named(strategies, request.read_only).map_err(RootfsError::Refused)?,
        reason: format!("layer {lazy} is lazy (its data is still being fetched)"),
        named: !asked.auto,
        build_metadata_image: false,
    })
}

/// Where the store's lazy layers are (`lazy/`).
pub fn layers_root(store: &Store) -> PathBuf {
    layer::lazy_root(store.root())
}

/// Whether `blob` (the top of `chain`) is present lazily: found published from this very
/// blob and index, or published now. `false`: it is to be pulled whole (no index, not a
/// registry's, an index that fails a check, or a lazy layer of its chain ID published
/// from another source — a chain ID is only the config's claim until a layer is
/// verified, and a layer's credentials are one tenant's).
fn lazily(store: &Store, blob: &LayerBlob, chain: &[Digest]) -> Result<bool, StoreError> {
    let chain_id = chain.last().expect("a chain ends in its layer");
    let root = store.root();
    if store.has_layer(chain_id) {
        return Ok(false);
    }
    let (Some(remote), Some(blob_digest), Some(blob_size)) =
        (&blob.remote, &blob.digest, blob.size)
    else {
        return Ok(false);
    };
    let Some((_, index_digest)) = declared(&remote.annotations) else {
        return Ok(false);
    };
    let other = || {
        tracing::warn!(layer = %blob.describe(), chain_id = %chain_id, "a lazy layer of this chain ID came from another source (blob, index, repository or credentials): pulling this one whole");
        Ok(false)
    };
    let auth = remote
        .credentials
        .as_ref()
        .map(|(username, password)| layer::LayerAuth {
            username: username.clone(),
            password: password.clone(),
        });
    if layer::is_lazy(root, chain_id) {
        let source = layer::Source {
            blob_digest,
            index_digest: &index_digest,
            repository: &remote.repository,
            plain_http: remote.plain_http,
            auth: auth.as_ref(),
        };
        if !layer::same_source(root, chain_id, source)? {
            return other();
        }
        refuse_bad_as(store, chain_id, || blob.describe())?;
        return Ok(true);
    }
    let (index, bytes, tree) = match fetch_index(remote, blob_size) {
        Ok(Some(index)) => index,
        Ok(None) => return Ok(false),
        Err(e) => {
            tracing::warn!(layer = %blob.describe(), error = %e, "its index cannot be used: pulling the layer whole");
            return Ok(false);
        }
    };
    let record = LazyRecord {
        chain_id: chain_id.clone(),
        chain: chain.to_vec(),
        diff_id: blob.diff_id.clone(),
        blob_digest: blob_digest.clone(),
        blob_size,
        repository: remote.repository.clone(),
        plain_http: remote.plain_http,
        index,
    };
    match layer::publish(store, &record, &bytes, &tree, auth.as_ref())? {
        layer::Published::Ready => {
            tracing::info!(layer = %blob.describe(), chain_id = %chain_id, files = tree.files.len(), index_bytes = bytes.len(), "published lazy layer");
            Ok(true)
        }
        layer::Published::Other => other(),
    }
}

/// `pull --lazy`: [`import`], then the lazy layers served (a server started with `start`
/// if none runs), so their completion begins. The caller holds the layers-in-use lock.
pub fn pull(
    store: &Store,
    mounter: &dyn Mounter,
    image: &Image,
    start: Option<&LazyServer>,
) -> Result<Vec<Digest>, RootfsError> {
    let chain_ids = import(store, image)?;
    ensure_served(store, mounter, &chain_ids, start)?;
    Ok(chain_ids)
}

/// The layers of `chain_ids` that are lazy here (not in `layers/`), bottom-most first.
pub(crate) fn lazy_layers(store: &Store, chain_ids: &[Digest]) -> Vec<Digest> {
    chain_ids
        .iter()
        .filter(|c| still_lazy(store, c))
        .cloned()
        .collect()
}

/// The overlay of the layers `chain_ids` with `flavour`'s options, each of `lazy` (its
/// lazy layers) by its tree in its place and its objects a data-only lower.
fn spec_of(
    store: &Store,
    chain_ids: &[Digest],
    dirs: &ContainerDirs,
    read_only: bool,
    lazy: &[Digest],
    flavour: Flavour,
) -> OverlaySpec {
    let mut spec = plan::read_write(store, chain_ids, dirs, flavour);
    spec.lowers = chain_ids
        .iter()
        .rev()
        .map(|c| match lazy.contains(c) {
            true => layer::diff(store.root(), c),
            false => store.layout().layer_diff(c),
        })
        .collect();
    // The store's own `objects/` stays last where its layers' stubs need it.
    let store_objects = std::mem::take(&mut spec.data_lowers);
    spec.data_lowers = lazy
        .iter()
        .rev()
        .map(|c| layer::objects_mount(store.root(), c))
        .chain(store_objects)
        .collect();
    spec.read_only = read_only;
    spec
}

/// Whether every one of `lazy`'s objects is mounted by a running server: mounted, and
/// answering: a dead server's mount, until the new one replaces it, fails `statfs` with
/// `ENOTCONN` (a `stat` may be answered from the kernel's attribute cache).
fn served(store: &Store, mounter: &dyn Mounter, lazy: &[Digest]) -> Result<bool, RootfsError> {
    if !lamina_lazy::serve::running(store.root()) {
        return Ok(false);
    }
    let mounts: Vec<PathBuf> = mounter.mounts_under(&layer::lazy_root(store.root()))?;
    for c in lazy {
        let target = layer::objects_mount(store.root(), c);
        if !mounts.contains(&target) {
            return Ok(false);
        }
        if !answers(&target)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether a FUSE mount at `target` answers `statfs` (a dead server's fails it). Asked
/// on a thread of its own: a server that is stopped or whose every request thread waits
/// on a stalled registry never answers, and that refuses the create, naming it.
fn answers(target: &Path) -> Result<bool, RootfsError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let probe = target.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(lamina_lazy::serve::answering_fuse_mount(&probe));
    });
    rx.recv_timeout(ANSWER_WITHIN).map_err(|_| {
        RootfsError::Refused(format!(
            "the server of lazy objects at {} does not answer within {} s: see the log of `lamina daemon`",
            target.display(),
            ANSWER_WITHIN.as_secs()
        ))
    })
}

/// Waits until the lazy layers of `chain_ids` are served, starting a server with
/// `start` if none runs; returns those layers.
fn ensure_served(
    store: &Store,
    mounter: &dyn Mounter,
    chain_ids: &[Digest],
    start: Option<&LazyServer>,
) -> Result<Vec<Digest>, RootfsError> {
    let lazy = lazy_layers(store, chain_ids);
    if lazy.is_empty() || served(store, mounter, &lazy)? {
        return Ok(lazy);
    }
    if !lamina_lazy::serve::running(store.root()) {
        let Some(start) = start else {
            return Err(RootfsError::Refused(format!(
                "lazy layer {} is not served: start `lamina daemon` for this store",
                lazy[0]
            )));
        };
        (start.0)(store).map_err(|why| {
            RootfsError::Refused(format!("starting the server of lazy layers: {why}"))
        })?;
    }
    let started = Instant::now();
    while started.elapsed() < SERVED_WITHIN {
        if served(store, mounter, &lazy)? {
            return Ok(lazy);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(RootfsError::Refused(format!(
        "lazy layers are not served within {} s: see the log of `lamina daemon` for this store",
        SERVED_WITHIN.as_secs()
    )))
}

/// Mounts a new lazy overlay on the container's rootfs.
pub(crate) fn provide<'a>(cx: &Provide<'a, '_>, read_only: bool) -> Result<Made<'a>, RootfsError> {
    let (store, mounter, options) = (cx.store, cx.mounter, cx.options);
    let lazy = ensure_served(store, mounter, cx.chain_ids, options.lazy_server.as_ref())?;
    let claim = store.create_container_dirs(cx.id)?;
    let undo = Undo::new(store, mounter, &claim.dirs, None);
    // With every layer ordinary (completed, or none indexed) the overlay is a classic one,
    // as fast as one: metacopy is for lazy layers' redirects. Mounted again later, it
    // gets metacopy on (a superset), so copy-ups made either way are read.
    let flavour = if lazy.is_empty() {
        Flavour::PLAIN
    } else {
        Flavour::LAZY
    };
    let spec = spec_of(store, cx.chain_ids, &claim.dirs, read_only, &lazy, flavour);
    let mounts = !options.without_mount || options.mount_volatile_without_mount;
    if mounts {
        let noted = note_servers(store, &claim.dirs.base, &lazy)?;
        mounter.mount_overlay(&spec, &claim.dirs.rootfs)?;
        still_the_noted_servers(store, &lazy, &noted)?;
    }
    let rootfs = RootfsRecord::new(cx.choice.model, mounts, spec.option_strings());
    Ok(Made {
        claim,
        undo,
        to_mount: ToMount::Overlay(spec),
        rootfs,
        lease_in_flight: None,
        claimed_from_pool: false,
    })
}

/// Mounts a lazy container's rootfs again; its lazy layers must be served.
pub(crate) fn mount_again(
    store: &Store,
    mounter: &dyn Mounter,
    container: &mut Container,
    read_only: bool,
) -> Result<(), RootfsError> {
    let lazy = ensure_served(store, mounter, &container.record.layers, None)?;
    let dirs = container.dirs(store);
    let layers = &container.record.layers;
    let spec = spec_of(store, layers, &dirs, read_only, &lazy, Flavour::LAZY);
    let noted = note_servers(store, &dirs.base, &lazy)?;
    mounter.mount_overlay(&spec, &dirs.rootfs)?;
    if let Err(e) = still_the_noted_servers(store, &lazy, &noted) {
        let _ = mounter.unmount(&dirs.rootfs);
        return Err(e);
    }
    container.rootfs.mount_options = spec.option_strings();
    record_mounted(store, container)
}

/// Beside a container, which served mount (its device) each of its lazy layers had when
/// its overlay was mounted: the overlay keeps that mount for its life, so once a new
/// server serves the layer the container reads from a dead one.
const SERVERS: &str = "lazy-servers";

/// The device of `chain_id`'s objects mount now (the caller knows it answers).
fn served_device(store: &Store, chain_id: &Digest) -> Result<u64, RootfsError> {
    let mount = layer::objects_mount(store.root(), chain_id);
    rustix::fs::stat(&mount)
        .map(|st| st.st_dev)
        .map_err(|e| StoreError::errno("looking at", &mount)(e).into())
}

/// Notes, beside the container at `base`, the mounts serving `lazy` (its lazy layers,
/// served now) that its overlay is about to hold; returns their devices.
fn note_servers(store: &Store, base: &Path, lazy: &[Digest]) -> Result<Vec<u64>, RootfsError> {
    let mut lines = String::new();
    let mut devices = Vec::new();
    for c in lazy {
        let device = served_device(store, c)?;
        lines.push_str(&format!("{} {device}\n", c.hex()));
        devices.push(device);
    }
    let path = base.join(SERVERS);
    std::fs::write(&path, lines).map_err(StoreError::io("writing", &path))?;
    Ok(devices)
}

/// After the overlay is mounted: each of `lazy` is still served by the mount `noted`
/// before it. The overlay looked its objects up by path; a mount replaced in between (a
/// server died and the next one took over) may have left it the directory underneath.
fn still_the_noted_servers(
    store: &Store,
    lazy: &[Digest],
    noted: &[u64],
) -> Result<(), RootfsError> {
    for (c, device) in lazy.iter().zip(noted) {
        let mount = layer::objects_mount(store.root(), c);
        let same = answers(&mount)? && served_device(store, c)? == *device;
        if !same {
            return Err(RootfsError::Refused(format!(
                "the server of lazy layer {c} changed while the container was being mounted: try again"
            )));
        }
    }
    Ok(())
}

/// Refuses a mounted lazy container whose lazy layers are not all served now, or are
/// served by another mount than the one its overlay holds (the server restarted: reads of
/// what was never fetched fail until it is mounted again).
pub(crate) fn still_served(
    store: &Store,
    mounter: &dyn Mounter,
    container: &Container,
) -> Result<(), RootfsError> {
    let lazy = lazy_layers(store, &container.record.layers);
    if !lazy.is_empty() && !served(store, mounter, &lazy)? {
        return Err(RootfsError::Refused(format!(
            "lazy layer {} is not served: its reads would fail; see the log of `lamina daemon` for this store",
            lazy[0]
        )));
    }
    let noted = container.dirs(store).base.join(SERVERS);
    let Ok(noted) = lamina_store::read_regular_file(&noted) else {
        return Ok(());
    };
    for line in String::from_utf8_lossy(&noted).lines() {
        let Some((hex, device)) = line.split_once(' ') else {
            continue;
        };
        let Some(chain_id) = Digest::from_hex(hex) else {
            continue;
        };
        // Those still lazy were asked to answer just above; a completed one is asked now.
        let answering =
            lazy.contains(&chain_id) || answers(&layer::objects_mount(store.root(), &chain_id))?;
        let now = match answering {
            true => served_device(store, &chain_id).ok(),
            false => None,
        };
        if now.map(|d| d.to_string()).as_deref() != Some(device) {
            return Err(RootfsError::Refused(format!(
                "the server of lazy layer {chain_id} restarted since container `{}` was mounted: its overlay holds the dead server's mount, so reads of data not yet fetched fail; unmount and mount it again (`lamina unmount`, `lamina mount`), or make it again",
                container.id()
            )));
        }
    }
    Ok(())
}

/// The overlay a caller mounts itself, rebuilt from the layers (see `fresh::attach`).
pub(crate) fn attach(
    store: &Store,
    mounter: &dyn Mounter,
    container: &Container,
    read_only: bool,
) -> Result<Attach, RootfsError> {
    let lazy = ensure_served(store, mounter, &container.record.layers, None)?;
    let dirs = container.dirs(store);
    let layers = &container.record.layers;
    let spec = spec_of(store, layers, &dirs, read_only, &lazy, Flavour::LAZY);
    Ok(Attach::Overlay {
        options: one_page::options_for_one_page(store, spec)?,
    })
}

/// Whether `chain_id` is a lazy layer of `store` (for `check`: a container may name it).
pub fn is_lazy(store: &Path, chain_id: &Digest) -> bool {
    layer::is_lazy(store, chain_id)
}

/// Whether `mount` is where a server serves a lazy layer's objects (for `check`: the
/// server's, or a dead server's that the next one replaces).
pub fn owns_mount(store: &Path, mount: &Path) -> bool {
    if !mount.starts_with(layer::lazy_root(store)) {
        return false;
    }
    let hex = mount
        .strip_prefix(layer::lazy_root(store))
        .ok()
        .and_then(|rel| rel.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    hex.and_then(|hex| Digest::from_hex(&hex))
        .is_some_and(|chain_id| {
            is_lazy(store, &chain_id) && layer::objects_mount(store, &chain_id) == mount
        })
}

/// The store's lazy layers marked bad, each with why (for `check`).
pub fn bad_layers(store: &Path) -> Vec<(PathBuf, String)> {
    let mut bad: Vec<(PathBuf, String)> = layer::named_layers(store)
        .into_iter()
        .filter_map(|chain_id| {
            let why = lamina_lazy::complete::bad_reason(store, &chain_id)?;
            Some((layer::dir(store, &chain_id), why))
        })
        .collect();
    bad.sort();
    bad
}
