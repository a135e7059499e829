//! Turning what a caller asked for into the strategies one create will use: checks an
//! explicit list against what the kernel supports (as probed), and resolves `auto` to
//! the fastest safe combination, with the reason, which `create` logs.

pub mod probe;

use crate::choose::probe::Probe;
use crate::model::{Flavour, Model};
use crate::{RootfsError, Strategies, UpperBackend};

/// What the caller asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request {
    pub strategies: Strategies,
    /// The container's rootfs must be read-only (`--read-only`).
    pub read_only: bool,
    /// The container's writes need not survive a crash (`--ephemeral`).
    pub ephemeral: bool,
    /// The caller set a disk limit, which only an isolated upper enforces here.
    pub disk_limit: bool,
    /// The store is on btrfs with quotas enabled: `isolated-quota` works, and `auto`
    /// enforces a disk limit with a qgroup. Asked of the kernel only when it matters
    /// (a disk limit, or `isolated-quota` named).
    pub quota_store: bool,
    /// The store idmaps its layers at mount time (a uid-mapped store): a plain bind of a
    /// layer, or of a tree of hardlinks to one, would show host ids.
    pub idmapped_layers: bool,
    /// Where the image's composefs metadata image stands: `auto` mounts a deep image
    /// on it once it is built, and never builds it on the caller's path.
    pub metadata_image: MetadataImage,
    /// The caller mounts the rootfs itself from the printed options (Garden's
    /// `--without-mount`): `auto` keeps to the layers, whose directories outlive a host
    /// restart, where a composefs overlay's options name the image's mount, which does not.
    pub caller_mounts: bool,
    /// The image has indexed layers the store lacks, and a server of lazy layers runs for
    /// the store (`lamina daemon`): `auto` serves them lazily, on demand. Never asked to
    /// start one.
    pub served_on_demand: bool,
}

/// Where an image's composefs metadata image stands (`composefs.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MetadataImage {
    /// Not built (or not asked: only `auto` reads it).
    #[default]
    Absent,
    Built,
    /// A build refused the image (past a bound, an xattr EROFS cannot hold): `auto`
    /// keeps to the layers and does not try again.
    Refused,
}

/// The fewest layers for which `auto` mounts an image through composefs: its create
/// costs about what classic's does at 10 layers and 0.7–0.8× of it from 20 up
/// (docs/benchmarks.md, composefs-deep), and a deep image's one lower also keeps
/// containerd's mount options short and shares the page cache across images.
pub const COMPOSEFS_FROM_LAYERS: usize = 20;

/// Whether the kernel mounts composefs overlays (`lamina probe`).
fn composefs_supported(probe: &Probe) -> bool {
    probe.lowerdir_plus && probe.metacopy && probe.erofs_file_backed == Some(true)
}

impl Request {
    /// The request for `strategies` on `store`: what the store is (btrfs with quotas,
    /// asked of the kernel only when a disk limit or `isolated-quota` makes it matter;
    /// idmapped layers) filled in from the store itself.
    pub fn on_store(
        store: &lamina_store::Store,
        mounter: &dyn lamina_sys::Mounter,
        strategies: Strategies,
        read_only: bool,
        ephemeral: bool,
        disk_limit: bool,
    ) -> Self {
        let quota_matters = disk_limit || strategies.isolated == Some(UpperBackend::Quota);
        Request {
            strategies,
            read_only,
            ephemeral,
            disk_limit,
            quota_store: quota_matters && mounter.btrfs_quotas(store.root()),
            idmapped_layers: store.properties().idmaps_layers(),
            metadata_image: MetadataImage::Absent,
            caller_mounts: false,
            served_on_demand: false,
        }
    }
}

/// What the pools hold for this create, asked lazily (each question is one readdir).
pub struct Pools<'a> {
    /// Whether the image's pool of this mount flavour has a slot.
    pub overlay_ready: &'a dyn Fn(Flavour) -> bool,
    /// Whether bare upper filesystems of this backend wait in a pool.
    pub upper_ready: &'a dyn Fn(UpperBackend) -> bool,
}

impl std::fmt::Debug for Pools<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools").finish_non_exhaustive()
    }
}

impl Pools<'_> {
    /// Pools that hold nothing.
    pub const EMPTY: Pools<'static> = Pools {
        overlay_ready: &|_| false,
        upper_ready: &|_| false,
    };
}

/// What one create will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The rootfs to provide.
    pub model: Model,
    /// Why, for the log line.
    pub reason: String,
    /// The operator named these strategies (not `auto`): each is honoured or the create
    /// fails saying why, never silently replaced.
    pub named: bool,
    /// `auto` would mount this image through composefs once its metadata image is
    /// built: the front-end builds it in the background (`lamina build-metadata-image`), off
    /// the caller's path, for the creates after this one.
    pub build_metadata_image: bool,
}

/// Resolves `request`. `layers` is the image's layer count.
pub fn choose(
    request: &Request,
    probe: &Probe,
    layers: usize,
    pools: &Pools<'_>,
) -> Result<Choice, RootfsError> {
    if request.strategies.auto {
        return Ok(choose_auto(request, probe, layers, pools));
    }
    let mut strategies = request.strategies;
    let read_only = request.read_only || strategies.read_only_kind().is_some();
    if request.ephemeral && strategies.read_only_kind().is_none() {
        strategies.volatile = true;
    }
    if request.disk_limit && strategies.isolated.is_none() && !read_only {
        return Err(RootfsError::DiskLimitNeedsIsolated {
            strategies: strategies.to_string(),
        });
    }
    if strategies
        .isolated
        .is_some_and(crate::model::own_filesystem)
    {
        // Deleting an isolated container detaches a loop device and removes an image
        // file: the reaper's work, never the caller's wait.
        strategies.deferred = true;
    }
    if strategies.isolated == Some(UpperBackend::Quota) && !request.quota_store {
        return Err(RootfsError::Unsupported {
            strategy: "isolated-quota",
            why: "the store is not on btrfs with quotas enabled (`btrfs quota enable <mount point>`)",
        });
    }
    if strategies.pooled && read_only {
        return Err(RootfsError::PoolReadOnly);
    }
    if strategies.pooled && !strategies.metacopy && !strategies.composefs {
        strategies.metacopy = named_pool_copy_up(probe, pools, Flavour::of(strategies));
    }
    let unsupported = |strategy, why| Err(RootfsError::Unsupported { strategy, why });
    if strategies.metacopy && !probe.metacopy {
        return unsupported(
            "metacopy",
            "metadata-only copy-up did not happen in the probe",
        );
    }
    if strategies.composefs && !composefs_supported(probe) {
        return unsupported(
            "composefs",
            "it needs overlay's `lowerdir+`/`datadir+` (Linux 6.8), metadata-only copy-up and file-backed EROFS (Linux 6.12)",
        );
    }
    if strategies.volatile && !probe.volatile {
        return unsupported("volatile", "overlay refused the volatile option");
    }
    if strategies.direct && request.idmapped_layers {
        return unsupported(
            "direct",
            "this uid-mapped store idmaps its layers when it mounts an overlay, and a bind of the layers would show them owned by host root (use shared-ro, or a store made with --chown-layers)",
        );
    }
    if let Some(kind) = strategies.read_only_kind()
        && !probe.new_mount_api
    {
        return unsupported(
            kind,
            "read-only binds need the new mount API (open_tree, mount_setattr)",
        );
    }
    Ok(Choice {
        model: Model::named(strategies, read_only).map_err(RootfsError::Refused)?,
        reason: "requested".into(),
        named: true,
        build_metadata_image: false,
    })
}

/// A rootfs with an idmap of its own (containerd's `uidmapping`/`gidmapping` labels) is
/// an overlay lamina mounts itself, with each lower an idmapped mount of a user namespace
/// with those maps: no mount option can say that, and what is shared between containers
/// (a pool's overlays, the image's shared read-only mount, a bind of the layer itself,
/// a composefs image's one EROFS mount) is mapped for none of them. `auto` drops those; a strategy naming one is refused.
pub fn for_own_idmap(mut choice: Choice) -> Result<Choice, RootfsError> {
    // Its image could never serve this container: nothing to build for it.
    choice.build_metadata_image = false;
    let mut s = choice.model.strategies();
    let shared = [
        (s.pooled, "pooled"),
        (s.shared_ro, "shared-ro"),
        (s.direct, "direct"),
        (s.composefs, "composefs"),
    ]
    .into_iter()
    .find_map(|(on, name)| on.then_some(name));
    let Some(shared) = shared else {
        return Ok(choice);
    };
    if choice.named {
        return Err(RootfsError::Refused(format!(
            "strategy {shared} shares one mount between containers, which cannot carry this container's own uid/gid mapping; name an overlay strategy (classic, metacopy, volatile, isolated) or auto"
        )));
    }
    let read_only = choice.model.read_only();
    (s.pooled, s.shared_ro, s.direct) = (false, false, false);
    s.composefs = false;
    Ok(Choice {
        model: Model::named(s, read_only).map_err(RootfsError::Refused)?,
        reason: format!(
            "{}; an idmapped rootfs: an overlay of its own, not {shared}",
            choice.reason
        ),
        named: false,
        build_metadata_image: false,
    })
}

fn choose_auto(request: &Request, probe: &Probe, layers: usize, pools: &Pools<'_>) -> Choice {
    let mut s = Strategies {
        deferred: true,
        ..Strategies::CLASSIC
    };
    let mut why = vec!["deferred delete always"];
    // A lazy overlay is a metacopy one with data-only lowers.
    if request.served_on_demand
        && !request.disk_limit
        && !request.idmapped_layers
        && probe.metacopy
        && probe.lowerdir_plus
    {
        s.lazy = true;
        why.push("indexed layers the store lacks, and a server of lazy layers runs: lazy");
        return Choice {
            model: Model::named(s, request.read_only).expect("auto picks a lazy model"),
            reason: why.join("; "),
            named: false,
            build_metadata_image: false,
        };
    }
    if request.read_only {
        if !probe.new_mount_api {
            why.push("read-only, but no new mount API for binds: a classic overlay");
        } else if layers == 1 && !request.idmapped_layers {
            s.direct = true;
            why.push("read-only single-layer image: bind the layer, no overlay");
        } else {
            s.shared_ro = true;
            why.push("read-only multi-layer image: bind the image's shared read-only overlay");
        }
        return Choice {
            model: Model::named(s, true).expect("auto picks a read-only model"),
            reason: why.join("; "),
            named: false,
            build_metadata_image: false,
        };
    }
    if default_copy_up(probe) {
        s.metacopy = true;
        why.push("metacopy passed the probe");
    } else {
        why.push("metacopy failed the probe: full copy-up");
    }
    if request.ephemeral {
        if probe.volatile {
            s.volatile = true;
            why.push("ephemeral: volatile upper");
        } else {
            why.push("ephemeral, but overlay refused volatile");
        }
    }
    let build_metadata_image = choose_composefs(request, probe, layers, &mut s, &mut why);
    s.isolated = choose_upper(request, &s, pools, &mut why);
    // No pool holds quota uppers: a subvolume costs about what a claim does.
    if s.isolated != Some(UpperBackend::Quota)
        && let Some(flavour) = ready_pool_flavour(pools, Flavour::of(s))
    {
        s.metacopy = flavour.metacopy;
        s.composefs = flavour.composefs;
        s.pooled = true;
        why.push("a pre-mounted overlay is ready in the pool");
    }
    Choice {
        model: Model::named(s, false).expect("auto picks a read-write model"),
        reason: why.join("; "),
        named: false,
        build_metadata_image,
    }
}

/// Whether an overlay whose caller named no copy-up (`metacopy`, `composefs`) copies up
/// metadata only: wherever the kernel does it. The one definition `auto`, a named
/// `pooled` and `pool fill` share, so a pool filled for one is the pool the others claim.
fn default_copy_up(probe: &Probe) -> bool {
    probe.metacopy
}

/// A named `pooled` that names no copy-up claims a slot of the default copy-up's pool, or
/// else of a pool of full copy-up slots (what `pooled` alone filled before metacopy was
/// its default); with neither ready, the default's, so the refusal names that pool.
fn named_pool_copy_up(probe: &Probe, pools: &Pools<'_>, unnamed: Flavour) -> bool {
    let default = Flavour {
        metacopy: default_copy_up(probe),
        ..unnamed
    };
    default.metacopy && ((pools.overlay_ready)(default) || !(pools.overlay_ready)(unnamed))
}

/// Whether an auto read-write create of an image of `layers` layers mounts it through
/// composefs (sets `s.composefs`): a deep image whose metadata image is built, where the
/// kernel mounts composefs and the store does not idmap layers. Returns whether the
/// image's metadata image should be built in the background: a deep image whose build
/// has not been tried. Building it here would put ~0.6 s per 128 MiB of files on this
/// caller's path (docs/benchmarks.md, composefs-import); the layers serve this create.
fn choose_composefs(
    request: &Request,
    probe: &Probe,
    layers: usize,
    s: &mut Strategies,
    why: &mut Vec<&'static str>,
) -> bool {
    if layers < COMPOSEFS_FROM_LAYERS
        || !s.metacopy
        || request.idmapped_layers
        || request.caller_mounts
        || !composefs_supported(probe)
    {
        return false;
    }
    match request.metadata_image {
        MetadataImage::Built => {
            // composefs implies metacopy (its files are metacopy inodes): named as
            // `composefs` alone, as `pool fill --strategy pooled,composefs` names it.
            s.composefs = true;
            s.metacopy = false;
            why.push("deep image with its composefs metadata image built: one lower");
            false
        }
        MetadataImage::Absent => {
            why.push("deep image: its composefs metadata image is built in the background for the creates after this one");
            true
        }
        MetadataImage::Refused => {
            why.push("deep image, but composefs refused it: the layers as lowers");
            false
        }
    }
}

/// The flavour of a ready pool that serves an auto create wanting `flavour`: that flavour,
/// or the same over the layers instead of composefs, or without metacopy either (a
/// pre-mounted overlay saves the mount stall, S2; composefs and metacopy only speed the
/// mount and later copy-ups, S3: an operator's pool filled before `auto` took composefs
/// is still claimed). Volatile and the upper filesystem never change: they decide what
/// survives a crash and how much the container may write.
fn ready_pool_flavour(pools: &Pools<'_>, flavour: Flavour) -> Option<Flavour> {
    let layers = Flavour {
        composefs: false,
        metacopy: flavour.metacopy || flavour.composefs,
        ..flavour
    };
    let plain = Flavour {
        metacopy: false,
        ..layers
    };
    let mut candidates = vec![flavour];
    for candidate in [layers, plain] {
        if !candidates.contains(&candidate) {
            candidates.push(candidate); // each pool asked once
        }
    }
    candidates
        .into_iter()
        .find(|&candidate| (pools.overlay_ready)(candidate))
}

/// Whether an auto create gets its own upper filesystem (docs/benchmarks.md, S1, S3 and
/// isolated). It wins at delete (a clean container among dirty neighbours is gone in
/// 1/110 of classic's time) and under `__pycache__` storms, but making one costs a mkfs
/// and a loop attach (~11 ms against ~0.2 ms), and whole-file copy-ups through its loop
/// device cost 2–7× classic's: so auto takes one only when one is ready in a pool and
/// metacopy keeps copy-ups to metadata — or when a disk limit needs one. An ephemeral
/// container prefers a memory upper when the operator pooled some. On a btrfs store with
/// quotas, a disk limit is a qgroup on a subvolume instead: one ioctl, no filesystem.
fn choose_upper(
    request: &Request,
    s: &Strategies,
    pools: &Pools<'_>,
    why: &mut Vec<&'static str>,
) -> Option<UpperBackend> {
    if request.disk_limit && request.quota_store {
        why.push("disk limit on a btrfs store with quotas: a subvolume with a qgroup limit");
        return Some(UpperBackend::Quota);
    }
    if request.disk_limit {
        why.push("disk limit: an isolated upper filesystem of that size");
    } else if !s.metacopy && !s.composefs {
        return None;
    }
    let backends: &[UpperBackend] = if request.ephemeral {
        &[UpperBackend::Memory, UpperBackend::Disk]
    } else {
        &[UpperBackend::Disk]
    };
    for &backend in backends {
        let flavour = Flavour {
            isolated: Some(backend),
            ..Flavour::of(*s)
        };
        if ready_pool_flavour(pools, flavour).is_some() || (pools.upper_ready)(backend) {
            why.push("an isolated upper filesystem is ready in a pool: no neighbour sync, own rename lock");
            return Some(backend);
        }
    }
    request.disk_limit.then_some(UpperBackend::Disk)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(metacopy: bool) -> Probe {
        Probe {
            kernel: "6.18".into(),
            boot_id: "b".into(),
            new_mount_api: true,
            lowerdir_plus: true,
            metacopy,
            volatile: true,
            redirect_dir: true,
            idmapped_layers: true,
            max_lower_layers: 500,
            erofs_file_backed: Some(true),
            fs_verity: Some(false),
        }
    }

    fn auto(read_only: bool, ephemeral: bool) -> Request {
        Request {
            strategies: Strategies::AUTO,
            read_only,
            ephemeral,
            ..Request::default()
        }
    }

    #[test]
    fn auto_serves_indexed_layers_lazily_only_where_a_server_runs_and_it_can() {
        let served = |read_only| Request {
            served_on_demand: true,
            ..auto(read_only, false)
        };
        assert_eq!(
            chosen(served(false), &probe(true), 2, true),
            "lazy,deferred"
        );
        assert_eq!(
            chosen(served(true), &probe(true), 2, false),
            "lazy,deferred"
        );
        assert!(
            choose(&served(true), &probe(true), 2, &Pools::EMPTY)
                .unwrap()
                .model
                .read_only()
        );
        assert_eq!(
            chosen(auto(false, false), &probe(true), 2, false),
            "metacopy,deferred",
            "no server: the layers are pulled whole"
        );
        let limited = Request {
            disk_limit: true,
            ..served(false)
        };
        assert!(!chosen(limited, &probe(true), 2, false).contains("lazy"));
        let idmapped = Request {
            idmapped_layers: true,
            ..served(false)
        };
        assert!(!chosen(idmapped, &probe(true), 2, false).contains("lazy"));
        assert!(!chosen(served(false), &probe(false), 2, false).contains("lazy"));
    }

    #[test]
    fn an_idmapped_store_never_binds_layers_directly() {
        let idmapped = Request {
            idmapped_layers: true,
            ..auto(true, false)
        };
        assert_eq!(
            chosen(idmapped, &probe(true), 1, false),
            "shared-ro,deferred"
        );
        let direct = Request {
            strategies: Strategies::parse("direct").unwrap(),
            ..idmapped
        };
        let err = choose(&direct, &probe(true), 1, &Pools::EMPTY).unwrap_err();
        assert!(err.to_string().contains("--chown-layers"), "{err}");
    }

    fn chosen(request: Request, probe: &Probe, layers: usize, pool: bool) -> String {
        let pools = Pools {
            overlay_ready: &|flavour| pool && flavour.isolated.is_none(),
            upper_ready: &|_| false,
        };
        choose(&request, probe, layers, &pools)
            .unwrap()
            .model
            .to_string()
    }

    #[test]
    fn auto_picks_the_fastest_safe_combination() {
        let good = probe(true);
        assert_eq!(chosen(auto(true, false), &good, 1, true), "direct,deferred");
        assert_eq!(
            chosen(auto(true, false), &good, 3, true),
            "shared-ro,deferred"
        );
        assert_eq!(
            chosen(auto(false, false), &good, 3, false),
            "metacopy,deferred"
        );
        assert_eq!(
            chosen(auto(false, true), &good, 3, true),
            "pooled,metacopy,volatile,deferred"
        );
        assert_eq!(
            chosen(auto(false, false), &probe(false), 3, false),
            "deferred"
        );
    }

    #[test]
    fn auto_mounts_a_deep_image_through_composefs_once_its_metadata_image_is_built() {
        let good = probe(true);
        let deep = COMPOSEFS_FROM_LAYERS;
        let with = |metadata_image| Request {
            metadata_image,
            ..auto(false, false)
        };
        let pick =
            |request: Request, probe: &Probe, layers: usize, ready: &dyn Fn(Flavour) -> bool| {
                let pools = Pools {
                    overlay_ready: ready,
                    upper_ready: &|_| false,
                };
                let choice = choose(&request, probe, layers, &pools).unwrap();
                (choice.model.to_string(), choice.build_metadata_image)
            };
        let none = |_: Flavour| false;
        // Not built: the layers serve this create, and the image is built for the next.
        assert_eq!(
            pick(with(MetadataImage::Absent), &good, deep, &none),
            ("metacopy,deferred".to_string(), true)
        );
        assert_eq!(
            pick(with(MetadataImage::Built), &good, deep, &none),
            ("composefs,deferred".to_string(), false)
        );
        // Refused once: the layers, and no build again.
        assert_eq!(
            pick(with(MetadataImage::Refused), &good, deep, &none),
            ("metacopy,deferred".to_string(), false)
        );
        // Shallow images, a uid-mapped store, a kernel without file-backed EROFS or
        // metacopy, read-only containers: never composefs, never a build.
        for (request, probe, layers) in [
            (with(MetadataImage::Built), good.clone(), deep - 1),
            (
                Request {
                    idmapped_layers: true,
                    ..with(MetadataImage::Built)
                },
                good.clone(),
                deep,
            ),
            (
                with(MetadataImage::Built),
                Probe {
                    erofs_file_backed: Some(false),
                    ..good.clone()
                },
                deep,
            ),
            (with(MetadataImage::Absent), probe(false), deep),
            (
                Request {
                    read_only: true,
                    ..with(MetadataImage::Built)
                },
                good.clone(),
                deep,
            ),
        ] {
            let (model, build) = pick(request, &probe, layers, &none);
            assert!(!model.contains("composefs") && !build, "{model} {build}");
        }
        // With a disk limit or ephemeral, composefs combines with the upper auto picks.
        let ephemeral = Request {
            ephemeral: true,
            ..with(MetadataImage::Built)
        };
        assert_eq!(
            pick(ephemeral, &good, deep, &none).0,
            "composefs,volatile,deferred"
        );
        // A pool of the image's composefs overlays is claimed first; a pool filled
        // before auto took composefs (over the layers) is still claimed.
        let composefs_pool = |f: Flavour| f.composefs && f.isolated.is_none();
        assert_eq!(
            pick(with(MetadataImage::Built), &good, deep, &composefs_pool).0,
            "composefs,pooled,deferred"
        );
        let layers_pool = |f: Flavour| !f.composefs && f.metacopy && f.isolated.is_none();
        assert_eq!(
            pick(with(MetadataImage::Built), &good, deep, &layers_pool).0,
            "pooled,metacopy,deferred"
        );
    }

    #[test]
    fn composefs_is_refused_where_the_kernel_cannot_mount_an_erofs_file() {
        let named = Request {
            strategies: Strategies::parse("composefs").unwrap(),
            ..Request::default()
        };
        let ok = choose(&named, &probe(true), 3, &Pools::EMPTY).unwrap();
        assert!(ok.model.flavour().unwrap().composefs);
        let older = Probe {
            erofs_file_backed: Some(false),
            fs_verity: Some(false),
            ..probe(true)
        };
        let err = choose(&named, &older, 3, &Pools::EMPTY).unwrap_err();
        assert!(err.to_string().contains("file-backed EROFS"), "{err}");
    }

    #[test]
    fn a_named_pooled_claims_the_pool_auto_fills() {
        let named = |list: &str| Request {
            strategies: Strategies::parse(list).unwrap(),
            ..Request::default()
        };
        let pick = |request: Request, probe: &Probe, ready: &dyn Fn(Flavour) -> bool| {
            let pools = Pools {
                overlay_ready: ready,
                upper_ready: &|_| false,
            };
            choose(&request, probe, 2, &pools)
                .unwrap()
                .model
                .to_string()
        };
        let good = probe(true);
        // What `pool fill IMAGE` fills (auto's flavour, no pool ready yet) is what a
        // named `pooled` asks for with nothing ready, and what it claims once filled.
        let filled = choose(&auto(false, false), &good, 2, &Pools::EMPTY)
            .unwrap()
            .model
            .flavour()
            .unwrap();
        assert_eq!(pick(named("pooled"), &good, &|_| false), "pooled,metacopy");
        assert_eq!(
            pick(named("pooled"), &good, &|f| f == filled),
            "pooled,metacopy"
        );
        // A pool of full copy-up slots alone is still claimed; a named copy-up is kept.
        assert_eq!(
            pick(named("pooled"), &good, &|f| f == Flavour::PLAIN),
            "pooled"
        );
        assert_eq!(
            pick(named("pooled,volatile"), &good, &|_| false),
            "pooled,metacopy,volatile"
        );
        assert_eq!(
            pick(named("pooled,composefs"), &good, &|_| false),
            "composefs,pooled"
        );
        // No metacopy in the kernel: full copy-up, and no metacopy asked of the probe.
        assert_eq!(pick(named("pooled"), &probe(false), &|_| true), "pooled");
    }

    #[test]
    fn the_pool_is_asked_for_the_flavour_auto_would_mount() {
        let asked = std::cell::RefCell::new(Vec::new());
        let pools = Pools {
            overlay_ready: &|f| {
                asked.borrow_mut().push(f.to_string());
                false
            },
            upper_ready: &|_| false,
        };
        choose(&auto(false, true), &probe(true), 2, &pools).unwrap();
        // Each flavour auto would mount, then the same without metacopy: a pre-mounted
        // overlay saves more than metacopy does.
        assert_eq!(
            asked.into_inner(),
            vec![
                "isolated-memory,metacopy,volatile",
                "isolated-memory,volatile",
                "isolated,metacopy,volatile",
                "isolated,volatile",
                "metacopy,volatile",
                "volatile"
            ]
        );
    }

    #[test]
    fn auto_isolates_when_an_upper_is_ready_or_a_disk_limit_needs_one() {
        let good = probe(true);
        let uppers = |backend: UpperBackend| Pools {
            overlay_ready: &|_| false,
            upper_ready: match backend {
                UpperBackend::Disk => &|b| b == UpperBackend::Disk,
                UpperBackend::Memory | UpperBackend::Quota => &|_| true,
            },
        };
        let pick = |request: Request, pools: &Pools<'_>| {
            choose(&request, &good, 2, pools).unwrap().model.to_string()
        };
        assert_eq!(
            pick(auto(false, false), &uppers(UpperBackend::Disk)),
            "isolated,metacopy,deferred"
        );
        assert_eq!(
            pick(auto(false, true), &uppers(UpperBackend::Memory)),
            "isolated-memory,metacopy,volatile,deferred",
            "ephemeral prefers a memory upper when one is pooled"
        );
        assert_eq!(
            pick(auto(false, true), &uppers(UpperBackend::Disk)),
            "isolated,metacopy,volatile,deferred"
        );
        let limited = Request {
            disk_limit: true,
            ..auto(false, false)
        };
        assert_eq!(pick(limited, &Pools::EMPTY), "isolated,metacopy,deferred");
        let no_metacopy = probe(false);
        assert_eq!(
            choose(
                &auto(false, false),
                &no_metacopy,
                2,
                &uppers(UpperBackend::Disk)
            )
            .unwrap()
            .model
            .to_string(),
            "deferred",
            "without metacopy, whole-file copy-ups through a loop device cost more"
        );
        assert_eq!(
            choose(&limited, &no_metacopy, 2, &Pools::EMPTY)
                .unwrap()
                .model
                .to_string(),
            "isolated,deferred",
            "a limit still needs one"
        );
        assert_eq!(pick(auto(false, false), &Pools::EMPTY), "metacopy,deferred");
        assert_eq!(
            pick(
                Request {
                    read_only: true,
                    ..limited
                },
                &Pools::EMPTY
            ),
            "shared-ro,deferred",
            "a read-only rootfs writes nothing to limit"
        );
    }

    #[test]
    fn a_disk_limit_needs_an_isolated_upper() {
        let request = Request {
            strategies: Strategies::parse("metacopy").unwrap(),
            disk_limit: true,
            ..Request::default()
        };
        let err = choose(&request, &probe(true), 2, &Pools::EMPTY).unwrap_err();
        assert!(
            err.to_string().contains("needs strategy `isolated`"),
            "{err}"
        );
        let isolated = Request {
            strategies: Strategies::parse("isolated").unwrap(),
            ..request
        };
        assert_eq!(
            choose(&isolated, &probe(true), 2, &Pools::EMPTY)
                .unwrap()
                .model
                .to_string(),
            "isolated,deferred",
            "an isolated container's delete is always deferred"
        );
    }

    #[test]
    fn a_disk_limit_on_a_btrfs_store_with_quotas_is_a_qgroup() {
        let good = probe(true);
        let limited = Request {
            disk_limit: true,
            quota_store: true,
            ..auto(false, false)
        };
        let choice = choose(&limited, &good, 2, &Pools::EMPTY).unwrap();
        assert_eq!(choice.model.to_string(), "isolated-quota,metacopy,deferred");
        assert!(choice.reason.contains("qgroup"), "{}", choice.reason);
        let ready = Pools {
            overlay_ready: &|_| true,
            upper_ready: &|_| true,
        };
        assert_eq!(
            choose(&limited, &good, 2, &ready)
                .unwrap()
                .model
                .to_string(),
            "isolated-quota,metacopy,deferred",
            "a subvolume costs less than any pooled loop-mounted upper"
        );
        let read_only = Request {
            read_only: true,
            ..limited
        };
        assert_eq!(
            choose(&read_only, &good, 2, &Pools::EMPTY)
                .unwrap()
                .model
                .to_string(),
            "shared-ro,deferred"
        );
        let unlimited = Request {
            disk_limit: false,
            ..limited
        };
        assert_eq!(
            choose(&unlimited, &good, 2, &Pools::EMPTY)
                .unwrap()
                .model
                .to_string(),
            "metacopy,deferred",
            "without a limit a quota store changes nothing"
        );
        let named = Request {
            strategies: Strategies::parse("isolated-quota").unwrap(),
            ..Request::default()
        };
        let err = choose(&named, &good, 2, &Pools::EMPTY).unwrap_err();
        assert!(err.to_string().contains("btrfs quota enable"), "{err}");
        let named = Request {
            quota_store: true,
            ..named
        };
        assert_eq!(
            choose(&named, &good, 2, &Pools::EMPTY)
                .unwrap()
                .model
                .to_string(),
            "isolated-quota",
            "a subvolume goes in one ioctl: inline unless deferred is asked for"
        );
    }

    #[test]
    fn explicit_lists_are_checked_against_the_probe() {
        let request = Request {
            strategies: Strategies::parse("metacopy").unwrap(),
            ..Request::default()
        };
        let err = choose(&request, &probe(false), 2, &Pools::EMPTY).unwrap_err();
        assert!(
            err.to_string()
                .contains("strategy metacopy is not available")
        );
        let ephemeral = Request {
            ephemeral: true,
            ..Request::default()
        };
        assert_eq!(chosen(ephemeral, &probe(false), 2, false), "volatile");
        let direct = Request {
            strategies: Strategies::parse("direct").unwrap(),
            ..Request::default()
        };
        assert!(
            choose(&direct, &probe(false), 2, &Pools::EMPTY)
                .unwrap()
                .model
                .read_only(),
            "a read-only strategy makes the rootfs read-only"
        );
    }
}
