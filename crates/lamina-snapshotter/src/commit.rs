//! Commit, remove, cleanup, and the recovery that makes them crash-safe.
//!
//! A commit moves the active snapshot's upper directory into `layers/` (one rename; no
//! copy) and swaps the active record for a committed one. It first records its intent in
//! the metadata (`committing`), so whichever step a crash interrupts, the next start
//! either finishes the commit (the layer got published) or puts the upper back. Because
//! of that, the final row is the one write it does not sync.

use lamina_snapshot_index::{Committing, SnapshotKind, SnapshotRecord, StoreSnapshots};
use std::collections::BTreeMap;
use std::fs;

use lamina_image::Digest;
use lamina_store::StoreError;

use crate::complete::complete_metacopies;
use crate::snapshotter::{container_number, extraction_target, is_snapshot_container, now_ns};
use crate::{SnapshotError, Snapshotter};

impl Snapshotter {
    pub fn commit(
        &self,
        name: &str,
        key: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<(), SnapshotError> {
        self.commit_onto(name, key, labels, "")
    }

    /// Commit with containerd 2.x's `parent`: empty, or the parent `key` was prepared on,
    /// commits as [`Snapshotter::commit`]; another parent rebases the snapshot onto it,
    /// which only an unpack's parentless snapshot may ask (see [`crate::rebase`]).
    pub fn commit_onto(
        &self,
        name: &str,
        key: &str,
        labels: BTreeMap<String, String>,
        parent: &str,
    ) -> Result<(), SnapshotError> {
        if name.is_empty() {
            return Err(SnapshotError::InvalidArgument(
                "a committed snapshot needs a name".into(),
            ));
        }
        crate::label_bounds::check(name, &labels)?;
        let _lock = self.store.lock_snapshots()?;
        let _layers_in_use = self.store.use_layers()?;
        if self.name_taken(name, Some(key))? {
            return Err(SnapshotError::AlreadyExists(name.into()));
        }
        let mut active = self
            .index()
            .get(key)?
            .ok_or_else(|| SnapshotError::NotFound(key.into()))?;
        // A commit of this snapshot that failed in this daemon (see `settle_failed_commit`):
        // a Commit again finishes it with the layer first recorded. containerd names each
        // attempt anew (`ns/<sequence>/name`), so a retry may come under another name; the
        // name and labels are only the row's, and the new ones are taken.
        if let Some(mut in_flight) = active.committing.clone() {
            crate::rebase::refuse_other_parent(key, &active, &in_flight, parent)?;
            let id = active.container.clone().unwrap_or_default();
            if !self.store.has_layer(&in_flight.layer) {
                // Its upper is back in place (the undo's last write failed): no writer
                // may hold it while it is published.
                lamina_mount::refuse_upper_in_use(&self.store, self.mounter.as_ref(), &id)?;
            }
            if in_flight.name != name || in_flight.labels != labels {
                in_flight.name = name.to_string();
                in_flight.labels = labels;
                active.committing = Some(in_flight);
                self.index().update(key, &active)?;
            }
            tracing::info!(key, name, "finishing a commit that failed before");
            return self.finish_or_settle(key, active);
        }
        if active.kind != SnapshotKind::Active {
            return Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}` is {}: only an active snapshot can be committed",
                active.kind.as_str()
            )));
        }
        let id = active.container.clone().unwrap_or_default();
        if !self.owns(key, &id) {
            return Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}`'s container `{id}` was lost in a crash and the name is another's now: nothing to commit"
            )));
        }
        // Refused before the intent is recorded: nothing to finish or undo later.
        match lamina_mount::upper_to_commit(&self.store, self.mounter.as_ref(), &id) {
            Err(lamina_mount::RootfsError::UpperNotCommittable { strategy }) => {
                return Err(SnapshotError::FailedPrecondition(format!(
                    "snapshot `{key}` has its upper on a filesystem of its own (strategy {strategy}), which a commit cannot move into the store; prepare snapshots you will commit with label containerd.io/snapshot/lamina.strategy=classic"
                )));
            }
            Err(lamina_mount::RootfsError::IdmappedNotCommittable) => {
                return Err(SnapshotError::FailedPrecondition(format!(
                    "snapshot `{key}` is idmapped ({}): what it wrote carries host ids, which a layer must not",
                    crate::UIDMAPPING_LABEL
                )));
            }
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        lamina_mount::refuse_upper_in_use(&self.store, self.mounter.as_ref(), &id)?;
        let layer = commit_layer(name, key, &labels, &active.labels);
        let rebase_onto = self.rebase_onto(key, &active, parent, &layer)?;
        active.committing = Some(Committing {
            name: name.to_string(),
            layer,
            labels,
            parent: rebase_onto,
        });
        self.index().update(key, &active)?;
        self.finish_or_settle(key, active)
    }

    /// [`Self::finish_commit`], settling what a failure left at once.
    fn finish_or_settle(&self, key: &str, active: SnapshotRecord) -> Result<(), SnapshotError> {
        let finished = self.finish_commit(key, active);
        if finished.is_err() {
            self.settle_failed_commit(key);
        }
        finished
    }

    /// After a failed commit, in the running daemon rather than at the next start: the
    /// snapshot is either still committing with its layer published (a write after the
    /// publish failed; the same commit again, or the next start, finishes it) or put back
    /// as it was — its upper restored, its intent cleared. Whatever fails here is left to
    /// the next start's `recover`, which does the same from the intent recorded.
    fn settle_failed_commit(&self, key: &str) {
        let undone = (|| -> Result<bool, SnapshotError> {
            let Some(mut active) = self.index().get(key)? else {
                return Ok(false);
            };
            let Some(committing) = active.committing.clone() else {
                return Ok(false);
            };
            if self.store.has_layer(&committing.layer) {
                return Ok(false);
            }
            self.restore_upper(&active, &committing.layer)?;
            let id = active.container.clone().unwrap_or_default();
            lamina_store::sync_dir(&self.store.layout().container(&id))?;
            active.committing = None;
            self.index().update(key, &active)?;
            Ok(true)
        })();
        match undone {
            Ok(true) => tracing::warn!(
                key,
                "a commit failed before its layer was published: undone, the snapshot is active as before"
            ),
            Ok(false) => tracing::warn!(
                key,
                "a commit failed after its layer was published: committing the snapshot again under the same name finishes it"
            ),
            Err(e) => {
                tracing::error!(key, error = %e, "a failed commit could not be undone now: the next start of the daemon finishes or undoes it")
            }
        }
    }

    /// Publishes the upper of active `key` (whose intent is recorded) as its layer, then
    /// records the committed snapshot and removes the active one's container.
    fn finish_commit(&self, key: &str, active: SnapshotRecord) -> Result<(), SnapshotError> {
        let Some(committing) = active.committing.clone() else {
            return Ok(());
        };
        let id = active.container.clone().unwrap_or_default();
        if let Some(parent) = &committing.parent {
            // Remove refuses it while this intent stands; a store changed behind the
            // daemon's back keeps the commit unfinished, before anything is published,
            // rather than orphaned.
            crate::snapshotter::layer_chain(&self.index(), parent).map_err(|e| {
                SnapshotError::FailedPrecondition(format!(
                    "snapshot `{key}` is being committed onto `{parent}`, which is gone: {e}"
                ))
            })?;
        }
        if !self.store.has_layer(&committing.layer) {
            let publish = |upper: &lamina_mount::UpperToCommit| -> Result<bool, SnapshotError> {
                self.store.fail_point("commit-publish")?;
                if let Some(lowers) = &upper.metacopy_lowers {
                    let filled = complete_metacopies(
                        &**self.store.host(),
                        &upper.upper,
                        lowers,
                        upper.objects.as_deref(),
                    )
                    .map_err(|e| {
                        SnapshotError::FailedPrecondition(format!(
                            "snapshot `{key}`: completing metadata-only copy-ups: {e}"
                        ))
                    })?;
                    tracing::debug!(key, filled, "filled metadata-only copy-ups");
                }
                Ok(self
                    .store
                    .publish_layer_dir(&committing.layer, &upper.upper)?)
            };
            let published =
                lamina_mount::commit_upper(&self.store, self.mounter.as_ref(), &id, publish)??;
            self.store.pause_point("commit-published");
            self.store.fail_point("commit-published")?;
            if published {
                // Its size was measured once, into its record, as it was published.
                let bytes = self
                    .store
                    .layer_record(&committing.layer)
                    .map_or(0, |r| r.size);
                self.activity.imported(bytes);
            }
        }
        let now = now_ns();
        let committed = SnapshotRecord {
            kind: SnapshotKind::Committed,
            parent: committing.parent.clone().or(active.parent),
            labels: committing.labels,
            created_ns: now,
            updated_ns: now,
            layer: Some(committing.layer.clone()),
            container: None,
            committing: None,
        };
        // The rename that published the layer is durable before the row that names it
        // (the database's sync may commit nothing but its own log; see Prepare).
        lamina_store::sync_dir(&self.store.layout().layers())?;
        // Not synced: a crash that loses this row keeps the intent, synced above, and the
        // layer, durable now, from which `recover` finishes the commit as this would
        // have. The next synced write makes it durable (the log is synced whole). Its
        // sync cost a commit 0.5–0.7 ms on ext4, where writing the log right after the
        // journal commit above waits on it.
        self.index()
            .replace_unsynced(key, &committing.name, &committed)?;
        self.usage_cache.forget(key);
        match &committing.parent {
            Some(parent) => {
                tracing::info!(key, name = %committing.name, layer = %committing.layer, parent, "committed snapshot, rebased onto its parent")
            }
            None => {
                tracing::info!(key, name = %committing.name, layer = %committing.layer, "committed snapshot")
            }
        }
        // What is left of the active container (its work dir) goes; a crash before this
        // leaves an unreferenced container that `recover` removes. The commit is recorded
        // either way: failing it now would have containerd retry a commit that happened.
        if let Err(e) = self.delete_container(&id) {
            tracing::warn!(key, container = %id, error = %e, "removing a committed snapshot's container failed: the daemon's next start removes it");
        }
        Ok(())
    }

    pub fn remove(&self, key: &str) -> Result<(), SnapshotError> {
        let _lock = self.store.lock_snapshots()?;
        let snapshot = self
            .index()
            .get(key)?
            .ok_or_else(|| SnapshotError::NotFound(key.into()))?;
        if let Some(child) = self.index().first_child(key)? {
            return Err(SnapshotError::FailedPrecondition(format!(
                "snapshot `{key}` has children (`{child}`): remove them first"
            )));
        }
        if snapshot.kind == SnapshotKind::Committed {
            self.refuse_removing_a_rebase_parent(key)?;
        }
        let container = snapshot.container;
        // An active's or a view's row is removed unsynced (one sync less per container
        // start and stop): a crash that brings it back costs a container made again and
        // removed again (`SnapshotIndex::remove_unsynced`). A committed one names a layer
        // that collection may take once the row is gone, so its removal is synced.
        match snapshot.kind {
            SnapshotKind::Committed => self.index().remove(key)?,
            SnapshotKind::Active | SnapshotKind::View => self.index().remove_unsynced(key)?,
        }
        self.usage_cache.forget(key);
        // A committed snapshot's layer stays until `Cleanup` (or `lamina clean`) finds
        // nothing naming it; an active's container goes now, or to the reaper if its
        // strategy defers deletes.
        match container {
            Some(id) if !self.owns(key, &id) => {
                tracing::warn!(key, container = %id, "removed a snapshot whose container a crash lost: the container under its name is another's, left alone");
            }
            Some(id) => {
                self.delete_container(&id)?;
            }
            None => {}
        }
        tracing::info!(key, "removed snapshot");
        Ok(())
    }

    /// containerd's `Cleanup`: finish deferred deletes, then collect layers nothing
    /// (no snapshot, no container, no pool) names any more.
    pub fn cleanup(&self) -> Result<lamina_mount::CleanReport, SnapshotError> {
        Ok(lamina_mount::clean(
            &self.store,
            self.mounter.as_ref(),
            None,
        )?)
    }

    /// Finishes or undoes interrupted commits, and removes snapshot containers no snapshot
    /// names (a crash between a metadata write and the container's removal).
    pub(crate) fn recover(&self) -> Result<(), SnapshotError> {
        let _lock = self.store.lock_snapshots()?;
        let _layers_in_use = self.store.use_layers()?;
        // Before anything is written or removed. Finishing or undoing a commit below
        // leaves which containers no row names as it was.
        let scan = lamina_mount::record::scan(&self.store)?;
        let unnamed = self.unnamed_containers(&scan)?;
        self.refuse_a_database_older_than_the_store(&unnamed)?;
        // Before lost containers are made again under new numbers: a crashed Prepare's
        // container is numbered as the next number, and a rebuild would collide with it
        // and fail until one more start.
        for container in unnamed {
            let id = container.id();
            tracing::info!(container = %id, "removing a container no snapshot names");
            self.delete_container(id)?;
        }
        // Before interrupted commits, so one undone below has its container to go back to.
        self.rebuild_lost_containers(&crate::rebuild::foreign_names(&scan))?;
        let interrupted = self.index().interrupted_commits()?;
        for key in interrupted {
            let Some(mut active) = self.index().get(&key)? else {
                continue;
            };
            let Some(committing) = active.committing.clone() else {
                continue;
            };
            if self.store.has_layer(&committing.layer) {
                tracing::info!(key, "finishing an interrupted commit");
                // Left as it is on failure (`check` reports it; the next start or a
                // Commit again finishes it): one snapshot must not stop every start.
                if let Err(e) = self.finish_commit(&key, active) {
                    tracing::error!(key, error = %e, "finishing an interrupted commit failed; it stays unfinished");
                }
                continue;
            }
            let dir = self
                .store
                .layout()
                .container(active.container.as_deref().unwrap_or_default());
            if dir.exists() {
                tracing::info!(key, "undoing an interrupted commit");
                self.restore_upper(&active, &committing.layer)?;
                // The upper is back for good before the row says nothing is in flight
                // (the database's sync may commit nothing else; see Prepare).
                lamina_store::sync_dir(&dir)?;
            } else {
                // Lost with the Prepare's directories, and not made again (logged above):
                // nothing to put back, and failing here would stop every start.
                tracing::warn!(
                    key,
                    "an interrupted commit's container is gone: the snapshot stays active, without a container"
                );
            }
            active.committing = None;
            self.index().update(&key, &active)?;
        }
        Ok(())
    }

    /// Whether `name` is a snapshot's, or the name a recorded commit intent will give one
    /// (but `except`'s own): either way no other snapshot may take it.
    pub(crate) fn name_taken(
        &self,
        name: &str,
        except: Option<&str>,
    ) -> Result<bool, SnapshotError> {
        let index = self.index();
        if index.contains(name)? {
            return Ok(true);
        }
        Ok(index
            .commit_intents()?
            .iter()
            .any(|(key, committing)| Some(key.as_str()) != except && committing.name == name))
    }

    /// Snapshot containers no row names.
    fn unnamed_containers(
        &self,
        scan: &lamina_mount::record::Scan,
    ) -> Result<Vec<lamina_mount::record::Container>, SnapshotError> {
        let named = self.index().containers()?;
        Ok(scan
            .containers
            .iter()
            .filter(|c| is_snapshot_container(c) && !named.contains(c.id()))
            .cloned()
            .collect())
    }

    /// A crash leaves at most the container of the Prepare in flight (numbered as the
    /// database's next number: its row and the counter are written together) and those of
    /// Removes whose row went first (numbered below). One numbered past the next number
    /// was made after the database last wrote: the database is older than the store (a
    /// restored backup), and every container it does not know would be wrongly removed.
    fn refuse_a_database_older_than_the_store(
        &self,
        unnamed: &[lamina_mount::record::Container],
    ) -> Result<(), SnapshotError> {
        let next = self.index().next_container_number()?;
        let newer: Vec<&str> = unnamed
            .iter()
            .map(|c| c.id())
            .filter(|id| container_number(id).is_some_and(|n| n > next))
            .collect();
        if newer.is_empty() {
            return Ok(());
        }
        Err(SnapshotError::FailedPrecondition(format!(
            "snapshot containers {} are newer than {} (its next number is {next}): the database is older than the store (restored from a backup?); restore the current one, or remove those containers with `lamina delete` before starting",
            newer.join(", "),
            self.store.layout().snapshot_db().display()
        )))
    }

    /// Puts an interrupted commit's upper back from the layer staging directory, if it
    /// got that far; a fresh empty one if a clean removed the staging meanwhile.
    fn restore_upper(&self, snapshot: &SnapshotRecord, layer: &Digest) -> Result<(), StoreError> {
        let id = snapshot.container.clone().unwrap_or_default();
        let upper = self.store.container_dirs(&id).upper;
        let staged = self
            .store
            .layout()
            .tmp()
            .join(format!("layer-{}", layer.hex()))
            .join("diff");
        // An upper that is there and empty may be one recovery just made again (see
        // `rebuild.rs`): the staged files, if any, are the snapshot's.
        if upper.exists() && !(staged.exists() && fs::remove_dir(&upper).is_ok()) {
            return Ok(());
        }
        if staged.exists() {
            return fs::rename(&staged, &upper).map_err(StoreError::io("restoring", &upper));
        }
        tracing::warn!(container = %id, "an interrupted commit's files are gone: its upper starts empty");
        fs::create_dir(&upper).map_err(StoreError::io("creating", &upper))
    }
}

/// The layer a commit makes: the chain ID an unpack extracted (see
/// [`extraction_target`]; from the commit's labels or the active snapshot's), so image
/// layers are shared with `lamina create`; else a digest of the name and the time, unique
/// to this commit.
fn commit_layer(
    name: &str,
    key: &str,
    labels: &BTreeMap<String, String>,
    active_labels: &BTreeMap<String, String>,
) -> Digest {
    extraction_target(key, labels)
        .or_else(|| extraction_target(key, active_labels))
        .unwrap_or_else(|| Digest::of(format!("lamina snapshot {name} {}", now_ns()).as_bytes()))
}
