//! Answers of [`crate::attach`] kept for a caller that asks for the same container's
//! mounts again and again (containerd asks Mounts at every container start, after
//! Prepare answered the same). An answer that follows from the container's record alone
//! ([`crate::providers`] says which) is given again, without the parse and the options,
//! while three things hold, each checked on every answer:
//! - nobody holds the container's ID (a create, delete, mount or commit of it in
//!   flight), before and after the reads below: otherwise the answer waits for it,
//!   worked out under the ID as before;
//! - the record's bytes are the ones it was worked out from: a record is only ever
//!   replaced whole, so equal bytes are the same record;
//! - each layer's short link (`l/<name>`, which the overlay options name) is the one the
//!   answer names: a link removed behind lamina's back is made again under the ID, perhaps
//!   under another name.
//!
//! Any other answer (a rootfs lamina mounts, checked or mounted again when asked) is
//! worked out every time.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lamina_store::{ContainerRecord, Store, StoreError};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::lifecycle::attach::attach_keeping;
use crate::providers::Attach;

/// The most memory the kept answers are counted at: past it the cache starts again
/// empty. Entries of removed containers are dropped by [`AttachCache::forget`].
const MOST_BYTES: usize = 8 << 20;

/// What a parsed string or digest costs beside its JSON text, counted per list entry.
const PER_ENTRY: usize = 64;

/// See the module docs. Shared by every thread of one process.
#[derive(Debug, Default)]
pub struct AttachCache {
    kept: Mutex<Kept>,
    hits: AtomicU64,
}

#[derive(Debug, Default)]
struct Kept {
    entries: HashMap<String, Arc<Entry>>,
    bytes: usize,
}

impl Kept {
    /// Removes `id`'s entry and its count: the one place an entry leaves but a reset.
    fn take(&mut self, id: &str) -> Option<Arc<Entry>> {
        let entry = self.entries.remove(id)?;
        self.bytes -= entry.size(id);
        Some(entry)
    }
}

#[derive(Debug)]
struct Entry {
    /// The record as stored when the answer was worked out.
    stored: Vec<u8>,
    /// The same record, parsed, for the caller's `belongs`.
    record: ContainerRecord,
    /// The short link of each of the record's layers, as the answer names them.
    links: Vec<PathBuf>,
    attach: Attach,
}

impl Entry {
    /// What it holds, counted generously: the parsed record's lists cost more than their
    /// JSON.
    fn size(&self, id: &str) -> usize {
        let answer = match &self.attach {
            Attach::Bind { source, .. } => source.as_os_str().len(),
            Attach::Overlay { options } => options.iter().map(|o| o.len() + PER_ENTRY).sum(),
        };
        let lists = self.record.env.len() + self.record.layers.len() + self.links.len();
        id.len() + self.stored.len() * 2 + lists * PER_ENTRY + answer
    }
}

impl AttachCache {
    /// [`crate::attach`], kept.
    pub fn attach(
        &self,
        store: &Store,
        mounter: &dyn Mounter,
        id: &str,
    ) -> Result<Attach, RootfsError> {
        match self.attach_if(store, mounter, id, |_| true)? {
            Some(attach) => Ok(attach),
            None => Err(StoreError::NotFound(id.into()).into()),
        }
    }

    /// [`crate::attach_if`], from a kept answer while it stands (see the module docs).
    /// `belongs` is asked of the record either way.
    pub fn attach_if(
        &self,
        store: &Store,
        mounter: &dyn Mounter,
        id: &str,
        belongs: impl FnOnce(&ContainerRecord) -> bool,
    ) -> Result<Option<Attach>, RootfsError> {
        if let Some(entry) = self.kept(id) {
            if still_current(store, id, &entry) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(belongs(&entry.record).then(|| entry.attach.clone()));
            }
            self.forget_entry(id, &entry);
        }
        // Kept under the ID, as worked out: a delete that follows forgets it.
        attach_keeping(store, mounter, id, belongs, |attach, from| {
            if let Ok(Some(links)) = made_links(store, &from.record)
                && names_links(attach, &links, &store.layout().links())
            {
                let entry = Entry {
                    stored: from.stored,
                    record: from.record,
                    links,
                    attach: attach.clone(),
                };
                self.keep(id, entry);
            }
        })
    }

    /// How many answers were given from what was kept.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Drops what is kept of container `id`. Call after it is deleted: a Mounts during
    /// the delete would keep it again.
    pub fn forget(&self, id: &str) {
        self.lock().take(id);
    }

    /// Drops `entry` if it is still what is kept of `id` (another thread may have kept a
    /// newer one meanwhile).
    fn forget_entry(&self, id: &str, entry: &Arc<Entry>) {
        let mut kept = self.lock();
        if kept.entries.get(id).is_some_and(|e| Arc::ptr_eq(e, entry)) {
            kept.take(id);
        }
    }

    fn kept(&self, id: &str) -> Option<Arc<Entry>> {
        self.lock().entries.get(id).cloned()
    }

    fn keep(&self, id: &str, entry: Entry) {
        let size = entry.size(id);
        if size > MOST_BYTES {
            return;
        }
        let mut kept = self.lock();
        kept.take(id);
        if kept.bytes + size > MOST_BYTES {
            *kept = Kept::default();
        }
        kept.bytes += size;
        kept.entries.insert(id.to_string(), Arc::new(entry));
    }

    /// The map stays whole if a holder panicked: every change to it is one step.
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `entry`'s answer is still the one container `id` would get. Nobody may hold
/// the ID before the record is read nor after the links are. Every step writes the record
/// at most once, whole, so the bytes read are the record as it stood either before a step
/// that started after the first check or after one that ended before the second: an
/// instant of the call with no step in flight.
fn still_current(store: &Store, id: &str, entry: &Entry) -> bool {
    !store.id_held(id)
        // Unreadable or gone: the full answer says why.
        && store.record_bytes(id).ok().flatten().as_ref() == Some(&entry.stored)
        && made_links(store, &entry.record).is_ok_and(|now| now.as_ref() == Some(&entry.links))
        && !store.id_held(id)
}

/// Whether `attach` names exactly `links` as its short-linked lowers (in `links_dir`):
/// read apart from the answer, a link could have changed between the two.
fn names_links(attach: &Attach, links: &[PathBuf], links_dir: &std::path::Path) -> bool {
    match attach {
        Attach::Bind { .. } => links.is_empty(),
        Attach::Overlay { options } => {
            let lowers = options.iter().find_map(|o| o.strip_prefix("lowerdir="));
            let mut named: Vec<&str> = lowers
                .map(|l| {
                    l.split(':')
                        .filter(|p| std::path::Path::new(p).parent() == Some(links_dir))
                        .collect()
                })
                .unwrap_or_default();
            let mut wanted: Vec<String> = links.iter().map(|l| l.display().to_string()).collect();
            named.sort_unstable();
            wanted.sort_unstable();
            named == wanted
        }
    }
}

/// The short link of each of `record`'s layers, `None` if one is not made (the full
/// answer makes it, holding the ID).
fn made_links(store: &Store, record: &ContainerRecord) -> Result<Option<Vec<PathBuf>>, StoreError> {
    record
        .layers
        .iter()
        .map(|l| store.made_layer_link(l))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(bytes: usize) -> Entry {
        Entry {
            stored: vec![b' '; bytes],
            record: ContainerRecord {
                id: "c".into(),
                image: String::new(),
                image_id: lamina_image::Digest::of(&[]),
                layers: Vec::new(),
                env: Vec::new(),
                created_unix: 0,
                disk_limit: None,
                rootfs: Default::default(),
            },
            links: Vec::new(),
            attach: Attach::Bind {
                source: PathBuf::from("/s"),
                read_only: false,
            },
        }
    }

    #[test]
    fn what_is_kept_is_counted_and_bounded() {
        let cache = AttachCache::default();
        // Each counted at twice its bytes and a little more: three fit, a fourth not.
        let big = MOST_BYTES / 8;
        for id in ["a", "b", "c"] {
            cache.keep(id, entry(big));
        }
        let counted = cache.lock().bytes;
        assert!(
            counted > 3 * big * 2 - 1 && counted <= MOST_BYTES,
            "{counted}"
        );
        // Replacing one counts it once.
        cache.keep("a", entry(big));
        assert_eq!(cache.lock().bytes, counted);
        // Past the bound it starts again with the newest alone.
        cache.keep("d", entry(big));
        assert_eq!(cache.lock().entries.len(), 1);
        cache.forget("d");
        cache.forget("d");
        assert_eq!(cache.lock().bytes, 0);
        assert!(cache.lock().entries.is_empty());
        // Too large to keep at all.
        cache.keep("e", entry(MOST_BYTES));
        assert!(cache.lock().entries.is_empty());
    }

    #[test]
    fn an_entry_replaced_meanwhile_is_not_forgotten_for_the_old_one() {
        let cache = AttachCache::default();
        cache.keep("a", entry(10));
        let old = cache.kept("a").unwrap();
        cache.keep("a", entry(20));
        cache.forget_entry("a", &old);
        assert!(cache.kept("a").is_some_and(|e| e.stored.len() == 20));
        let size = cache.kept("a").unwrap().size("a");
        assert_eq!(cache.lock().bytes, size);
    }
}
