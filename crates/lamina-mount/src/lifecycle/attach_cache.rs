//! Answers of [`crate::attach`] kept for a caller that asks for the same container's
//! mounts again and again (containerd asks Mounts at every container start, after
//! Prepare answered the same). An answer that follows from the container's record alone
//! ([`crate::providers`] says which) is given again, without the ID lock, the parse and
//! the layer links, while the record's bytes are the ones it was worked out from: a
//! record is only ever replaced whole, so equal bytes are the same record. Any other
//! answer (a rootfs lamina mounts, checked or mounted again when asked) is worked out
//! every time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lamina_store::{ContainerRecord, Store};
use lamina_sys::Mounter;

use crate::RootfsError;
use crate::lifecycle::attach::attach_read;
use crate::providers::Attach;

/// The most record and answer bytes kept: past it the cache starts again empty. Entries
/// of removed containers are dropped by [`AttachCache::forget`], or by this.
const MOST_BYTES: usize = 8 << 20;

/// See the module docs. Shared by every thread of one process.
#[derive(Debug, Default)]
pub struct AttachCache {
    kept: Mutex<Kept>,
    hits: AtomicU64,
}

#[derive(Debug, Default)]
struct Kept {
    entries: HashMap<String, Entry>,
    bytes: usize,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The record as stored when the answer was worked out.
    stored: Vec<u8>,
    /// The same record, parsed, for the caller's `belongs`.
    record: ContainerRecord,
    attach: Attach,
}

impl Entry {
    fn size(&self, id: &str) -> usize {
        let answer = match &self.attach {
            Attach::Bind { source, .. } => source.as_os_str().len(),
            Attach::Overlay { options } => options.iter().map(String::len).sum(),
        };
        id.len() + self.stored.len() * 2 + answer
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
            None => Err(lamina_store::StoreError::NotFound(id.into()).into()),
        }
    }

    /// [`crate::attach_if`], from a kept answer while container `id`'s record is
    /// unchanged. `belongs` is asked of the record either way.
    pub fn attach_if(
        &self,
        store: &Store,
        mounter: &dyn Mounter,
        id: &str,
        belongs: impl FnOnce(&ContainerRecord) -> bool,
    ) -> Result<Option<Attach>, RootfsError> {
        if let Some(entry) = self.kept(id) {
            // Unreadable or gone: the full answer says why.
            if store.record_bytes(id).ok().flatten().as_ref() == Some(&entry.stored) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(belongs(&entry.record).then_some(entry.attach));
            }
            self.forget(id);
        }
        let Some(answer) = attach_read(store, mounter, id, belongs)? else {
            return Ok(None);
        };
        if let Some((stored, record)) = answer.from_record {
            let attach = answer.attach.clone();
            self.keep(
                id,
                Entry {
                    stored,
                    record,
                    attach,
                },
            );
        }
        Ok(Some(answer.attach))
    }

    /// How many answers were given from what was kept.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Drops what is kept of container `id` (removed: its answer will not be asked).
    pub fn forget(&self, id: &str) {
        let mut kept = self.lock();
        if let Some(entry) = kept.entries.remove(id) {
            kept.bytes -= entry.size(id);
        }
    }

    fn kept(&self, id: &str) -> Option<Entry> {
        self.lock().entries.get(id).cloned()
    }

    fn keep(&self, id: &str, entry: Entry) {
        let size = entry.size(id);
        let mut kept = self.lock();
        if let Some(old) = kept.entries.remove(id) {
            kept.bytes -= old.size(id);
        }
        if kept.bytes + size > MOST_BYTES {
            *kept = Kept::default();
        }
        if size <= MOST_BYTES {
            kept.bytes += size;
            kept.entries.insert(id.to_string(), entry);
        }
    }

    /// The map stays whole if a holder panicked: every change to it is one step.
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}
