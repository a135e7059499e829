//! The providers: how a container's rootfs comes to exist. One module each — [`fresh`]
//! (an overlay mounted for this container), [`pooled`], [`shared_ro`], [`direct`],
//! [`lazy`] (layers served before their data arrives) — and in this file the one `match`
//! per lifecycle step that sends a model to its module: [`admit`] (before any layer is
//! fetched), [`provide`] (create), [`mount_again`] (mount after an unmount or a host
//! restart), [`attach`] (what a caller that mounts for itself binds), [`still_served`]
//! (whether a mounted rootfs's data is still served) and [`release`] (what delete lets go
//! of); and the pending-layer steps (layers a provider keeps outside `layers/` until they
//! are whole), which the lifecycle and `check` ask without naming a provider.
//!
//! An overlay provider composes its lowers ([`crate::lowers`]: the layers, or a composefs
//! image) with an upper ([`crate::uppers`]: the store, a disk, memory, a quota): neither is
//! decided again in a provider.

pub mod direct;
pub mod fresh;
pub mod lazy;
mod made;
mod one_page;
pub mod pooled;
pub mod shared_ro;

use std::path::PathBuf;

use lamina_image::Digest;
use lamina_store::{IdMap, Store};
use lamina_sys::{DiskFs, Mounter};

use crate::choose::Choice;
use crate::model::Provider;
use crate::model::record::Container;
use crate::uppers::isolated::{DiskLimit, UpperPlan};
use crate::{RootfsError, Strategies};

pub use made::ToMount;
pub(crate) use made::{Made, Undo, bind_dir};

/// Options for one create.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// Leave mounting to the caller (Garden's `--without-mount`): record what to mount,
    /// mount nothing for the container.
    pub without_mount: bool,
    /// With `without_mount`, a pooled strategy still claims a ready pre-mounted overlay
    /// (the caller binds it: containerd's snapshotter), and the record says it is mounted.
    pub claim_pooled_without_mount: bool,
    /// With `without_mount`, a volatile or composefs overlay is still mounted by lamina
    /// (the caller binds it: containerd's snapshotter, which then need not know that a
    /// composefs overlay's lower must be mounted first). The kernel marks a volatile
    /// upper's work dir when it mounts it and refuses every later mount until the
    /// marker goes, which only lamina's own `unmount` does after a clean sync; an
    /// overlay the caller mounted and unmounted itself could never be mounted again (a
    /// task restart).
    pub mount_volatile_without_mount: bool,
    pub strategies: Strategies,
    pub read_only: bool,
    pub ephemeral: bool,
    /// Garden's `--disk-limit-size-bytes`: the most the container may use.
    pub disk_limit: Option<DiskLimit>,
    /// What isolated uppers on disk are formatted with.
    pub disk_fs: DiskFs,
    /// Overlay options appended to a freshly mounted read-write overlay: how benchmarks
    /// reproduce other kernels' behaviour here (`fsync=strict` is 6.12–6.14's).
    pub extra_overlay_options: Vec<(String, Option<String>)>,
    /// This container's own uid/gid mapping (containerd's `uidmapping`/`gidmapping`
    /// labels): its layers show through an idmapped mount of each, so files owned by 0
    /// in the image are the mapped root's. lamina mounts such an overlay itself, even
    /// with `without_mount`: an option string cannot carry an idmap.
    pub idmap: Option<IdMap>,
    /// The container is made again from the shape its first create recorded (the
    /// snapshotter's recovery after a crash): chosen as that create chose, so it gets the
    /// same flavour, and then mounted fresh ([`crate::Model::remade`]), never claimed
    /// from a pool.
    pub remake: bool,
    /// How a `lazy` create starts the server of the store's lazy layers if none runs.
    pub lazy_server: Option<lazy::LazyServer>,
}

/// One create's question to a provider: the layers (in the store), the container's ID,
/// what was chosen, and the upper planned for it.
pub(crate) struct Provide<'a, 'r> {
    pub(crate) store: &'a Store,
    pub(crate) mounter: &'a dyn Mounter,
    pub(crate) chain_ids: &'r [Digest],
    pub(crate) id: &'r str,
    pub(crate) choice: &'r Choice,
    pub(crate) upper: Option<UpperPlan>,
    pub(crate) options: &'r CreateOptions,
}

/// What a caller mounts to see a container's rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attach {
    /// A recursive bind of this directory.
    Bind { source: PathBuf, read_only: bool },
    /// An overlay with these options (lowerdir, upperdir, workdir, flavour, ro).
    Overlay { options: Vec<String> },
}

/// Refuses, before any layer is fetched, what the chosen provider cannot serve for
/// these options: a refusal should not cost the caller a pull.
pub(crate) fn admit(
    choice: &Choice,
    idmapped_layers: bool,
    options: &CreateOptions,
) -> Result<(), RootfsError> {
    if choice.model.composefs() {
        crate::lowers::composefs::admit(idmapped_layers || options.idmap.is_some())?;
    }
    match choice.model.provider {
        // Pool slots are mounted read-write overlays: a named `pooled` is served from
        // the pool of its flavour or refused, never replaced.
        Provider::Pooled { .. }
            if choice.named && options.without_mount && !options.claim_pooled_without_mount =>
        {
            Err(RootfsError::PoolWithoutMount)
        }
        // One overlay mount per container: no idmap of its lowers.
        Provider::Lazy { .. } if idmapped_layers || options.idmap.is_some() => {
            Err(RootfsError::Refused(
                "strategy `lazy` does not idmap its layers: use it in a store that does not idmap layers, without an idmap of the container's own".into(),
            ))
        }
        Provider::Fresh { .. }
        | Provider::Pooled { .. }
        | Provider::SharedRo
        | Provider::Direct
        | Provider::Lazy { .. } => Ok(()),
    }
}

/// Provides the rootfs `cx.choice` names in the container's new directory.
pub(crate) fn provide<'a>(cx: &Provide<'a, '_>) -> Result<Made<'a>, RootfsError> {
    match cx.choice.model.provider {
        Provider::Fresh { flavour, read_only } => fresh::provide(cx, flavour, read_only),
        Provider::Pooled { flavour } => pooled::provide(cx, flavour),
        Provider::SharedRo => shared_ro::provide(cx),
        Provider::Direct => direct::provide(cx),
        Provider::Lazy { read_only } => lazy::provide(cx, read_only),
    }
}

/// Mounts an unmounted container's rootfs again as its record describes, and records it
/// mounted.
pub(crate) fn mount_again(
    store: &Store,
    mounter: &dyn Mounter,
    container: &mut Container,
) -> Result<(), RootfsError> {
    let dirs = container.dirs(store);
    crate::uppers::mount_again(mounter, container, &dirs)?;
    match container.model().provider {
        Provider::Fresh { flavour, read_only } => {
            fresh::mount_again(store, mounter, container, flavour, read_only)
        }
        // A claimed pool slot is an ordinary read-write overlay once unmounted.
        Provider::Pooled { flavour } => {
            fresh::mount_again(store, mounter, container, flavour, false)
        }
        Provider::SharedRo => shared_ro::mount_again(store, mounter, container),
        Provider::Direct => direct::mount_again(store, mounter, container),
        Provider::Lazy { read_only } => lazy::mount_again(store, mounter, container, read_only),
    }
}

/// What a caller that mounts for itself mounts for a container lamina has not mounted.
pub(crate) fn attach(
    store: &Store,
    mounter: &dyn Mounter,
    container: &Container,
) -> Result<Attach, RootfsError> {
    match container.model().provider {
        Provider::Fresh { .. } | Provider::Pooled { .. } => {
            fresh::attach(store, mounter, container)
        }
        Provider::SharedRo => shared_ro::attach(store, mounter, container),
        Provider::Direct => direct::attach(container),
        Provider::Lazy { read_only } => lazy::attach(store, mounter, container, read_only),
    }
}

/// Whether [`attach`]'s answer for `container` follows from its record and the store's
/// fixed properties alone, with nothing mounted or checked on the way, so it stands for
/// as long as the record does ([`crate::AttachCache`]). A provider that mounts or checks
/// anything when asked says no.
pub(crate) fn attach_from_record_alone(container: &Container) -> bool {
    match container.model().provider {
        // Layer links handed out stay while a record names their layers; an isolated
        // upper is mounted again when asked.
        Provider::Fresh { .. } | Provider::Pooled { .. } => container.rootfs.upper_fs.is_none(),
        Provider::SharedRo | Provider::Direct | Provider::Lazy { .. } => false,
    }
}

/// Refuses a mounted rootfs whose data a server must still serve and no longer does
/// (a lazy container whose server died): its reads would fail.
pub(crate) fn still_served(
    store: &Store,
    mounter: &dyn Mounter,
    container: &Container,
) -> Result<(), RootfsError> {
    match container.model().provider {
        Provider::Lazy { .. } => lazy::still_served(store, mounter, container),
        Provider::Fresh { .. }
        | Provider::Pooled { .. }
        | Provider::SharedRo
        | Provider::Direct => Ok(()),
    }
}

// Layers a provider keeps outside `layers/` until they are whole ("pending": lazy's, in
// `lazy/`). The lifecycle and `check` ask these steps, never a provider by name.

/// Imports `image`'s layers as `model`'s provider makes them present (lazy: pending
/// where an index serves them); bottom-most first. The caller holds the layers-in-use
/// lock.
pub(crate) fn import(
    store: &Store,
    image: &lamina_image::Image,
    model: &crate::Model,
) -> Result<Vec<Digest>, lamina_store::StoreError> {
    match model.provider {
        Provider::Lazy { .. } => lazy::import(store, image),
        Provider::Fresh { .. }
        | Provider::Pooled { .. }
        | Provider::SharedRo
        | Provider::Direct => store.import(image),
    }
}

/// The layers of `chain_ids` the store has not imported but a provider keeps, bottom-most
/// first: a chain with any is served by that provider only ([`for_pending_chain`]).
pub(crate) fn pending_layers(store: &Store, chain_ids: &[Digest]) -> Vec<Digest> {
    lazy::lazy_layers(store, chain_ids)
}

/// Whether `chain_id` is a layer a provider keeps (a container or snapshot may name it).
pub(crate) fn is_pending_layer(store: &Store, chain_id: &Digest) -> bool {
    lazy::is_lazy(store.root(), chain_id)
}

/// Refuses pending layer `chain_id` if its provider found it wrong, naming why.
pub(crate) fn refuse_bad_pending(
    store: &Store,
    chain_id: &Digest,
) -> Result<(), lamina_store::StoreError> {
    lazy::refuse_bad(store, chain_id)
}

/// The bytes pending layer `chain_id` will hold once whole (for `stats`).
pub(crate) fn pending_bytes(
    store: &Store,
    chain_id: &Digest,
) -> Result<u64, lamina_store::StoreError> {
    lazy::indexed_bytes(store, chain_id)
}

/// Pending layers their provider marked bad, as `check` reports them: the finding's kind,
/// the layer's directory, and what to say.
pub(crate) fn bad_pending_layers(store: &Store) -> Vec<(&'static str, PathBuf, String)> {
    lazy::bad_layers(store.root())
        .into_iter()
        .map(|(dir, why)| {
            let detail = format!("lazy layer marked bad: {why}; new creates from it are refused");
            ("bad_lazy_layer", dir, detail)
        })
        .collect()
}

/// Whether `mount`, outside any container, is one a provider serves pending layers from.
pub(crate) fn serves_mount(store: &Store, mount: &std::path::Path) -> bool {
    lazy::owns_mount(store.root(), mount)
}

/// The choice for a stored chain holding pending layer `pending`: the provider that keeps
/// it, or a refusal naming it.
pub(crate) fn for_pending_chain(
    request: &crate::choose::Request,
    pending: &Digest,
) -> Result<Choice, RootfsError> {
    lazy::for_lazy_layers(request, pending)
}

/// Whether `auto` would serve `image` on demand here (lazily, by a server already running).
pub(crate) fn served_on_demand(store: &Store, image: &lamina_image::Image) -> bool {
    lazy::served_lazily(store, image)
}

/// The lowers a commit fills metadata-only copies from, top-most first (each layer's tree,
/// then where pending layers' trees redirect).
pub(crate) fn commit_lowers(store: &Store, chain_ids: &[Digest]) -> Vec<PathBuf> {
    lazy::commit_lowers(store, chain_ids)
}

/// Lets go of what a deleted container held outside its directory (its removal done).
pub(crate) fn release(
    store: &Store,
    mounter: &dyn Mounter,
    container: Option<&Container>,
) -> Result<(), RootfsError> {
    let Some(container) = container else {
        return Ok(());
    };
    match container.model().provider {
        Provider::SharedRo => shared_ro::release_lease(store, mounter, container),
        Provider::Fresh { .. }
        | Provider::Pooled { .. }
        | Provider::Direct
        | Provider::Lazy { .. } => Ok(()),
    }
}

/// Records `container` mounted (the last step of every [`mount_again`]).
fn record_mounted(store: &Store, container: &mut Container) -> Result<(), RootfsError> {
    container.rootfs.mounted = true;
    crate::model::record::write(store, container)?;
    Ok(())
}
