//! Rebase, for containerd 2.x's parallel unpack (`max_concurrent_unpacks` > 1 and
//! `rebase` in the proxy's capabilities): every layer of an image is prepared without a
//! parent, all are applied at once, and each is committed in order naming the parent it
//! goes on. An unpack's upper holds only its layer's changes, in overlay's form (a
//! whiteout is a 0/0 device, an opaque directory an xattr), whatever lies under it, so
//! committing it onto another parent is sound when two things hold:
//! - the applier writes those forms: containerd writes them straight into an overlay
//!   mount's `upperdir=` but turns them into deletions — of nothing, in an empty
//!   directory — through any other mount, so such a snapshot is answered as an overlay of
//!   its upper alone ([`as_upper_only_overlay`]);
//! - the layer lands on the chain it was unpacked for: its name (containerd's chain ID)
//!   must be the one the parent's chain and its diff ID make.
//!
//! A hard link to a file of a lower layer cannot be made in an upper that has none (the
//! unpack fails, as containerd's overlayfs does under rebase).

use std::collections::BTreeMap;

use lamina_snapshot_index::{Committing, SnapshotKind, SnapshotRecord};

use crate::snapshotter::{MountSpec, extraction_target, layer_chain};
use crate::{SnapshotError, Snapshotter};

/// The chain ID of the layer an unpack goes on, which containerd's unpacker gives every
/// layer but the first.
pub(crate) const PARENT_CHAIN_LABEL: &str = "containerd.io/snapshot/parent-chain-id";
/// The diff ID (digest of the uncompressed tar) of the layer an unpack extracts.
pub(crate) const DIFF_ID_LABEL: &str = "containerd.io/snapshot/diff-id";

/// Whether a snapshot is an unpack that will be rebased at commit: active, an unpack's,
/// without a parent, for a layer that has one.
pub(crate) fn unpacks_for_rebase(
    kind: SnapshotKind,
    key: &str,
    parent: Option<&str>,
    labels: &BTreeMap<String, String>,
) -> bool {
    kind == SnapshotKind::Active
        && parent.is_none()
        && labels.contains_key(PARENT_CHAIN_LABEL)
        && extraction_target(key, labels).is_some()
}

/// An empty snapshot's bind, answered as an overlay of that directory alone (no lower:
/// containerd's applier writes into `upperdir=` and never mounts it; anything that did
/// would fail, not lose a whiteout).
pub(crate) fn as_upper_only_overlay(mounts: Vec<MountSpec>) -> Vec<MountSpec> {
    match &mounts[..] {
        [bind] if bind.kind == "bind" => vec![MountSpec {
            kind: "overlay".into(),
            source: "overlay".into(),
            options: vec![format!("upperdir={}", bind.source)],
        }],
        _ => mounts,
    }
}

/// A retried Commit of an unfinished one must name the parent the first attempt did (or
/// none).
pub(crate) fn refuse_other_parent(
    key: &str,
    active: &SnapshotRecord,
    in_flight: &Committing,
    parent: &str,
) -> Result<(), SnapshotError> {
    let recorded = in_flight.parent.as_deref().or(active.parent.as_deref());
    if parent.is_empty() || recorded == Some(parent) {
        return Ok(());
    }
    Err(SnapshotError::FailedPrecondition(format!(
        "snapshot `{key}` is being committed onto `{}`, not `{parent}`",
        recorded.unwrap_or("")
    )))
}

impl Snapshotter {
    /// Whether active `key` (`row`) was prepared as an unpack for rebase, by the labels its
    /// Prepare recorded (an Update cannot change what its mounts were answered as).
    pub(crate) fn prepared_for_rebase(&self, key: &str, row: &SnapshotRecord) -> bool {
        // A snapshot with a parent never is: no lookup of its shape on Mounts' path.
        if row.kind != SnapshotKind::Active || row.parent.is_some() {
            return false;
        }
        self.shape_of(key, row).is_ok_and(|shape| {
            unpacks_for_rebase(row.kind, key, row.parent.as_deref(), &shape.labels)
        })
    }

    /// The parent a Commit naming `parent` rebases active `key` onto, publishing `layer`:
    /// none when `parent` is empty or the one it was prepared on; refused unless `key` was
    /// prepared as an unpack for rebase (answered as an upper-only overlay) and `layer` is
    /// the chain ID `parent`'s chain and its diff ID make.
    pub(crate) fn rebase_onto(
        &self,
        key: &str,
        active: &SnapshotRecord,
        parent: &str,
        layer: &lamina_image::Digest,
    ) -> Result<Option<String>, SnapshotError> {
        if parent.is_empty() || active.parent.as_deref() == Some(parent) {
            return Ok(None);
        }
        let refused = |why: String| {
            Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}` cannot be committed onto `{parent}`: {why}"
            )))
        };
        if let Some(prepared_on) = &active.parent {
            return refused(format!(
                "it was prepared on `{prepared_on}`, and its upper holds changes to that parent's tree"
            ));
        }
        if !self.prepared_for_rebase(key, active) {
            return refused(format!(
                "only an unpack prepared with a {PARENT_CHAIN_LABEL} label is rebased (its whiteouts written in overlay's form), and this is not one"
            ));
        }
        let Some(diff_id) = self
            .shape_of(key, active)?
            .labels
            .get(DIFF_ID_LABEL)
            .and_then(|d| lamina_image::Digest::parse(d).ok())
        else {
            return refused(format!(
                "it has no {DIFF_ID_LABEL} label to check its chain with"
            ));
        };
        let chain = layer_chain(&self.index(), parent).map_err(|e| match e {
            SnapshotError::NotFound(what) => SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}` cannot be committed onto `{parent}`: {what} does not exist"
            )),
            e => e,
        })?;
        let expected = lamina_image::next_chain_id(chain.last(), &diff_id);
        if expected != *layer {
            return refused(format!(
                "its layer is {layer}, but that parent and its diff ID {diff_id} make {expected}"
            ));
        }
        Ok(Some(parent.to_string()))
    }

    /// Refuses removing `key` while a commit in flight will land on it.
    pub(crate) fn refuse_removing_a_rebase_parent(&self, key: &str) -> Result<(), SnapshotError> {
        let intents = self.index().commit_intents()?;
        match intents
            .iter()
            .find(|(_, intent)| intent.parent.as_deref() == Some(key))
        {
            Some((child, _)) => Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}` has children (`{child}`, a commit in flight onto it): finish or remove them first"
            ))),
            None => Ok(()),
        }
    }
}
