//! containerd's remote snapshots: an image unpack whose `Prepare` carries the labels
//! containerd adds for remote snapshotters (`cri.image-ref`, `cri.manifest-digest`,
//! `cri.layer-digest`, with `containerd.io/snapshot.ref`) gets its layer made lazy
//! (lamina-mount's `lazy` provider: index only, data on first read) and committed at
//! once, labelled [`REMOTE_LABEL`]; `AlreadyExists` then tells containerd to skip the
//! layer's download and unpack. Any layer lamina cannot make lazy — no index, an index
//! failing a check, the registry unreachable, a chain the image does not have — is
//! unpacked by containerd as always: a remote snapshot is never a failed pull.
//!
//! Off unless the daemon runs with `--remote-snapshots REGISTRIES`, and then only for
//! images from those registries (or repositories): these labels also reach lamina from an
//! image's own layer annotations when containerd does not set them, and a lazy layer's
//! chain ID is only its image config's claim until completion checks it, so whoever may
//! push to a listed registry is trusted not to claim another image's layers. Only an
//! unpack's Prepare (containerd's `extract-… <chain ID>` key) is served, never with the
//! daemon's global `--username`/`--password` (an auth file's credentials for the host are
//! used), and at most [`AT_ONCE`] at a time: the others are unpacked by containerd.

use std::collections::BTreeMap;

use lamina_image::{Digest, Image, Platform};
use lamina_registry::{PullOptions, RegistryRef, Target};
use lamina_snapshot_index::{SnapshotKind, SnapshotRecord};

use crate::SnapshotError;
use crate::snapshotter::{REF_LABEL, Snapshotter, now_ns};

/// Marks a committed snapshot whose layer lamina serves lazily (as stargz-snapshotter
/// marks its own): its data is fetched on first read and in the background.
pub const REMOTE_LABEL: &str = "containerd.io/snapshot/remote";
/// The image the layer belongs to, as containerd pulls it (`HOST/REPO:TAG`).
pub const IMAGE_REF_LABEL: &str = "containerd.io/snapshot/cri.image-ref";
/// The digest of the image manifest listing the layer.
pub const MANIFEST_LABEL: &str = "containerd.io/snapshot/cri.manifest-digest";
/// The digest of the layer's blob.
pub const LAYER_LABEL: &str = "containerd.io/snapshot/cri.layer-digest";
/// containerd 2.x's: the diffID of the layer, from the image config it read.
const DIFF_ID_LABEL: &str = "containerd.io/snapshot.diffid";

/// Remote preparations at once: each holds a gRPC worker thread on the registry.
pub const AT_ONCE: usize = 8;

/// Where remote snapshots may come from: registries (`HOST[:PORT]`), repositories
/// (`HOST[:PORT]/REPO`, and the repositories under it), or every one (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSources(Vec<String>);

impl RemoteSources {
    /// Parses a comma-separated list; an empty one is refused.
    pub fn parse(list: &str) -> Result<Self, SnapshotError> {
        let entries: Vec<String> = list
            .split(',')
            .map(|e| e.trim().trim_end_matches('/').to_string())
            .filter(|e| !e.is_empty())
            .collect();
        if entries.is_empty() {
            return Err(SnapshotError::InvalidArgument(
                "name the registries remote snapshots may come from (HOST[:PORT][/REPO],…), or `*` for any".into(),
            ));
        }
        Ok(RemoteSources(entries))
    }

    /// Whether `host` / `repository` is one of these.
    fn allow(&self, host: &str, repository: &str) -> bool {
        let image = format!("{host}/{repository}");
        self.0.iter().any(|entry| {
            entry == "*"
                || entry == host
                || image == *entry
                || image.starts_with(&format!("{entry}/"))
        })
    }
}

/// Whether `key` is an unpack's (`…/extract-<unique> <target>`), as containerd names the
/// snapshot it applies a layer into; a pod's sandbox may carry the labels, not this key.
fn is_unpack_key(key: &str, target: &Digest) -> bool {
    let last = key.rsplit('/').next().unwrap_or(key);
    last.split_once(' ').is_some_and(|(unique, chain)| {
        unique.starts_with("extract-") && chain == target.to_string()
    })
}

/// What a Prepare asks for a remote snapshot.
struct Asked {
    manifest: RegistryRef,
    layer: Digest,
    target: Digest,
}

/// The remote layer `labels` ask for, if they ask for one; malformed labels ask for
/// nothing (containerd unpacks the layer).
fn asked(labels: &BTreeMap<String, String>) -> Option<Asked> {
    let target = Digest::parse(labels.get(REF_LABEL)?).ok()?;
    let layer = Digest::parse(labels.get(LAYER_LABEL)?).ok()?;
    let manifest = Digest::parse(labels.get(MANIFEST_LABEL)?).ok()?;
    let image = labels.get(IMAGE_REF_LABEL)?;
    let reference = match RegistryRef::parse(&format!("docker://{image}"))? {
        Ok(reference) => reference,
        Err(e) => {
            tracing::warn!(image = %lamina_image::shown(image), error = %e, "remote snapshot: the image reference is not one lamina reads; containerd unpacks the layer");
            return None;
        }
    };
    Some(Asked {
        manifest: RegistryRef {
            host: match reference.host.as_str() {
                // containerd's name for Docker Hub; its API is served elsewhere.
                "docker.io" => lamina_registry::DOCKER_HUB.into(),
                host => host.into(),
            },
            target: Target::Digest(manifest),
            ..reference
        },
        layer,
        target,
    })
}

impl Snapshotter {
    /// Serves containerd's remote snapshots from `sources`, fetching as `pull` says
    /// (registries spoken to over plain HTTP, an auth file, timeouts; never its global
    /// credentials, which are for one registry and would go to whichever a label names).
    /// The daemon's default strategies must be able to serve a lazy layer (`auto`, or a
    /// list naming `lazy`).
    pub fn with_remote_snapshots(
        mut self,
        sources: RemoteSources,
        pull: PullOptions,
    ) -> Result<Self, SnapshotError> {
        if !self.default_strategies.serve_lazy_layers() {
            return Err(SnapshotError::InvalidArgument(format!(
                "remote snapshots need a snapshot strategy that serves lazy layers (`auto`, or one naming `lazy`), not `{}`",
                self.default_strategies
            )));
        }
        let pull = PullOptions {
            credentials: None,
            // A Prepare waits on it: one retry, as a lazy read's.
            retries: 1,
            ..pull
        };
        self.remote = Some(std::sync::Arc::new(Remote {
            sources,
            pull,
            in_flight: Default::default(),
            images: Default::default(),
        }));
        Ok(self)
    }

    /// The chain ID of the layer `labels` ask for, made lazy here on `parent`, or `None`
    /// for containerd to unpack it. Talks to the registry, so the caller holds no lock.
    pub(crate) fn remote_layer(
        &self,
        key: &str,
        parent: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Option<Digest> {
        let remote = self.remote.as_ref()?;
        let asked = asked(labels)?;
        if self.store.has_layer(&asked.target) || !is_unpack_key(key, &asked.target) {
            return None;
        }
        if !remote
            .sources
            .allow(&asked.manifest.host, &asked.manifest.repository)
        {
            tracing::info!(layer = %asked.layer, repository = %format!("{}/{}", asked.manifest.host, asked.manifest.repository), "remote snapshot: not from a registry remote snapshots may come from; containerd unpacks the layer");
            return None;
        }
        let Some(_slot) = Slot::take(&remote.in_flight) else {
            tracing::info!(layer = %asked.layer, at_once = AT_ONCE, "remote snapshot: as many in flight as may be; containerd unpacks the layer");
            return None;
        };
        match self.make_lazy(&remote.pull, parent, &asked, labels) {
            Ok(true) => Some(asked.target),
            Ok(false) => None,
            Err(why) => {
                tracing::warn!(layer = %asked.layer, chain_id = %asked.target, why, "remote snapshot: containerd unpacks the layer");
                None
            }
        }
    }

    fn make_lazy(
        &self,
        pull: &PullOptions,
        parent: Option<&str>,
        asked: &Asked,
        labels: &BTreeMap<String, String>,
    ) -> Result<bool, String> {
        let below = match parent {
            Some(p) => {
                crate::snapshotter::layer_chain(&self.index(), p).map_err(|e| e.to_string())?
            }
            None => Vec::new(),
        };
        let image = self
            .remote
            .as_ref()
            .map(|r| r.images.resolve(&asked.manifest, pull))
            .unwrap_or_else(|| Err("remote snapshots are off".into()))?;
        let n = position(&image, asked, &below, labels)?;
        // No layers-in-use lock while the index is fetched: collection never takes a
        // lazy layer, and the row naming it is written under the lock.
        lamina_mount::prepare_lazy_layer(&self.store, &image, n).map_err(|e| e.to_string())
    }

    /// Records remote layer `chain_id` as committed snapshot `key` on `parent`; the
    /// caller holds the snapshot lock and found the key free.
    pub(crate) fn commit_remote(
        &self,
        key: &str,
        parent: Option<&str>,
        chain_id: Digest,
        mut labels: BTreeMap<String, String>,
    ) -> Result<(), SnapshotError> {
        labels.insert(REMOTE_LABEL.into(), "remote snapshot".into());
        let now = now_ns();
        let record = SnapshotRecord {
            kind: SnapshotKind::Committed,
            parent: parent.map(str::to_string),
            labels,
            created_ns: now,
            updated_ns: now,
            layer: Some(chain_id.clone()),
            container: None,
            committing: None,
        };
        // The lazy layer's publishing rename is durable before a row names it.
        lamina_store::sync_dir(&lamina_mount::lazy_layers_root(&self.store))?;
        self.index().insert(key, &record)?;
        tracing::info!(key, chain_id = %chain_id, "remote snapshot: layer served lazily, committed without a download");
        Ok(())
    }
}

/// The daemon's remote snapshots: from where, fetched how, and how many in flight.
#[derive(Debug)]
pub(crate) struct Remote {
    sources: RemoteSources,
    pull: PullOptions,
    in_flight: std::sync::atomic::AtomicUsize,
    images: Resolved,
}

/// Images resolved lately, by the reference (pinned by manifest digest) that named them:
/// containerd prepares an image's layers one after another, each Prepare naming the same
/// manifest, which is fetched (with its config) once rather than once a layer.
#[derive(Debug, Default)]
struct Resolved(std::sync::Mutex<Vec<(String, std::time::Instant, Image)>>);

/// How long, and how many, resolved images are kept.
const RESOLVED_FOR: std::time::Duration = std::time::Duration::from_secs(60);
const RESOLVED_KEPT: usize = 16;

impl Resolved {
    fn resolve(&self, reference: &RegistryRef, pull: &PullOptions) -> Result<Image, String> {
        let key = reference.to_string();
        let now = std::time::Instant::now();
        {
            let mut kept = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            kept.retain(|(_, at, _)| now.duration_since(*at) < RESOLVED_FOR);
            if let Some((_, _, image)) = kept.iter().find(|(k, _, _)| *k == key) {
                return Ok(image.clone());
            }
        }
        let image = lamina_registry::resolve(reference, pull, &Platform::host())
            .map_err(|e| e.to_string())?;
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() >= RESOLVED_KEPT {
            kept.remove(0);
        }
        kept.push((key, now, image.clone()));
        Ok(image)
    }
}

/// One of the [`AT_ONCE`] remote preparations, given back when dropped.
struct Slot<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Slot<'a> {
    fn take(count: &'a std::sync::atomic::AtomicUsize) -> Option<Slot<'a>> {
        use std::sync::atomic::Ordering;
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < AT_ONCE).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count))
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Where the asked layer sits in `image`: it must be there, on exactly the layers
/// `below` (the parent snapshot's), with the chain ID (and, from containerd 2.x, the
/// diffID) containerd computed from the config it read.
fn position(
    image: &Image,
    asked: &Asked,
    below: &[Digest],
    labels: &BTreeMap<String, String>,
) -> Result<usize, String> {
    let n = image
        .layers
        .iter()
        .position(|l| l.digest.as_ref() == Some(&asked.layer))
        .ok_or_else(|| format!("manifest {} lists no layer {}", asked.manifest, asked.layer))?;
    let chain_ids = image.chain_ids();
    if chain_ids[n] != asked.target || chain_ids[..n] != *below {
        return Err(format!(
            "layer {} is not chain {} on the parent snapshot's layers in manifest {}",
            asked.layer, asked.target, asked.manifest
        ));
    }
    if let Some(diff_id) = labels.get(DIFF_ID_LABEL)
        && *diff_id != image.layers[n].diff_id.to_string()
    {
        return Err(format!(
            "the config's diffID of layer {} is not {}",
            asked.layer,
            lamina_image::shown(diff_id)
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(image: &str) -> BTreeMap<String, String> {
        let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        [
            (REF_LABEL, digest('a')),
            (LAYER_LABEL, digest('b')),
            (MANIFEST_LABEL, digest('c')),
            (IMAGE_REF_LABEL, image.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn the_manifest_is_asked_by_its_digest_from_the_image_s_repository() {
        let asked = asked(&labels("127.0.0.1:5000/lazy/app:1")).unwrap();
        assert_eq!(asked.manifest.host, "127.0.0.1:5000");
        assert_eq!(asked.manifest.repository, "lazy/app");
        assert_eq!(
            asked.manifest.target,
            Target::Digest(Digest::parse(&format!("sha256:{}", "c".repeat(64))).unwrap())
        );
        assert_eq!(asked.layer.hex(), "b".repeat(64));
        assert_eq!(asked.target.hex(), "a".repeat(64));
    }

    #[test]
    fn docker_hub_is_asked_where_its_api_is() {
        let asked = asked(&labels("docker.io/library/busybox:latest")).unwrap();
        assert_eq!(asked.manifest.host, lamina_registry::DOCKER_HUB);
        assert_eq!(asked.manifest.repository, "library/busybox");
    }

    #[test]
    fn sources_name_registries_and_repositories_under_them() {
        let sources = RemoteSources::parse("registry.example:5000, 127.0.0.1:5000/lazy/").unwrap();
        assert!(sources.allow("registry.example:5000", "any/thing"));
        assert!(sources.allow("127.0.0.1:5000", "lazy"));
        assert!(sources.allow("127.0.0.1:5000", "lazy/app"));
        assert!(!sources.allow("127.0.0.1:5000", "lazyfoo"));
        assert!(!sources.allow("127.0.0.1:5000", "other"));
        assert!(!sources.allow("registry.example", "any"));
        assert!(RemoteSources::parse("*").unwrap().allow("h", "r"));
        assert!(RemoteSources::parse(" , ").is_err());
    }

    #[test]
    fn only_an_unpack_s_key_is_served() {
        let target = Digest::parse(&format!("sha256:{}", "a".repeat(64))).unwrap();
        assert!(is_unpack_key(
            &format!("k8s.io/3/extract-12-ab {target}"),
            &target
        ));
        assert!(is_unpack_key(&format!("extract-1 {target}"), &target));
        assert!(!is_unpack_key("k8s.io/4/sandbox-id", &target));
        assert!(!is_unpack_key(
            &format!("k8s.io/4/extract-1 sha256:{}", "b".repeat(64)),
            &target
        ));
        assert!(!is_unpack_key(&format!("k8s.io/4/pod {target}"), &target));
    }

    #[test]
    fn labels_that_do_not_name_a_layer_ask_for_nothing() {
        let mut missing = labels("127.0.0.1:5000/lazy/app:1");
        missing.remove(MANIFEST_LABEL);
        assert!(asked(&missing).is_none());
        let mut bad = labels("127.0.0.1:5000/lazy/app:1");
        bad.insert(LAYER_LABEL.into(), "sha256:short".into());
        assert!(asked(&bad).is_none());
        assert!(asked(&labels("no-repository")).is_none());
        assert!(asked(&labels("")).is_none());
    }
}
