//! Walks of what containers wrote, reused for a while. CRI asks for the Usage of every
//! active snapshot every 10 s (`stats_collect_period`); where the upper has no account of
//! its own (a filesystem or qgroup of its own answers in constant time, and is read anew
//! every time) the answer is a walk whose cost grows with the container's files. A walk
//! is reused for 50 times as long as it took, kept between [`MIN_REUSE`] and
//! [`MAX_REUSE`] — so walking costs about 1/50 of a thread per snapshot, and an answer is
//! at most a minute old — and never once the store's filesystem has grown or shrunk by
//! [`TRIPWIRE_BYTES`] since: a container writing fast is walked again at once, as
//! without reuse, so the kubelet's eviction sees it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lamina_mount::Walked;

/// How long a walk is reused at least.
const MIN_REUSE: Duration = Duration::from_secs(20);
/// How long a walk is reused at most.
const MAX_REUSE: Duration = Duration::from_secs(60);
/// How many times as long as it took a walk is reused, within those bounds.
const REUSE_PER_WALK: u32 = 50;
/// A change in the store filesystem's used bytes that ends every reuse.
const TRIPWIRE_BYTES: u64 = 256 << 20;
/// Entries kept before expired ones are dropped (walks of snapshots removed or
/// committed since, including one that ended after its snapshot was forgotten).
const PRUNE_ABOVE: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Entry {
    walked: Walked,
    until: Instant,
    /// The store filesystem's used bytes when the walk was kept.
    store_used: u64,
}

#[derive(Debug, Default)]
pub(crate) struct UsageCache {
    /// (snapshot key, its container) → the walk kept.
    entries: Mutex<HashMap<(String, String), Entry>>,
}

impl UsageCache {
    /// The walk of `key`'s container `id` still to be trusted, with the store's
    /// filesystem now using `store_used()` bytes (asked only when a walk is kept).
    pub(crate) fn get(
        &self,
        key: &str,
        id: &str,
        store_used: impl FnOnce() -> u64,
    ) -> Option<Walked> {
        let entry = {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            *entries.get(&(key.to_string(), id.to_string()))?
        };
        (Instant::now() < entry.until && store_used().abs_diff(entry.store_used) < TRIPWIRE_BYTES)
            .then_some(entry.walked)
    }

    /// Keeps `walked`, made with the store's filesystem using `store_used` bytes.
    pub(crate) fn put(&self, key: &str, id: &str, walked: Walked, store_used: u64) {
        let reuse = walked
            .took
            .saturating_mul(REUSE_PER_WALK)
            .clamp(MIN_REUSE, MAX_REUSE);
        let entry = Entry {
            walked,
            until: Instant::now() + reuse,
            store_used,
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= PRUNE_ABOVE {
            let now = Instant::now();
            entries.retain(|_, entry| entry.until > now);
        }
        entries.insert((key.to_string(), id.to_string()), entry);
    }

    /// Forgets `key`'s walks (it was removed or committed).
    pub(crate) fn forget(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|(k, _), _| k != key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walked() -> Walked {
        Walked {
            bytes: 7,
            inodes: 2,
            took: Duration::from_millis(1),
        }
    }

    #[test]
    fn a_walk_is_reused_for_its_key_and_container_until_forgotten() {
        let cache = UsageCache::default();
        cache.put("k", "snap-1", walked(), 1 << 30);
        assert_eq!(cache.get("k", "snap-1", || 1 << 30), Some(walked()));
        assert_eq!(
            cache.get("k", "snap-2", || 1 << 30),
            None,
            "another container"
        );
        cache.forget("k");
        assert_eq!(cache.get("k", "snap-1", || 1 << 30), None);
    }

    #[test]
    fn a_store_that_grew_or_shrank_much_ends_the_reuse() {
        let cache = UsageCache::default();
        cache.put("k", "snap-1", walked(), 1 << 30);
        assert!(
            cache
                .get("k", "snap-1", || (1 << 30) + (255 << 20))
                .is_some()
        );
        assert!(
            cache
                .get("k", "snap-1", || (1 << 30) + TRIPWIRE_BYTES)
                .is_none()
        );
        assert!(
            cache
                .get("k", "snap-1", || (1 << 30) - TRIPWIRE_BYTES)
                .is_none()
        );
    }
}
