//! Usage answers that cost a walk of what a container wrote, reused for a while. CRI asks
//! for the Usage of every active snapshot every 10 s (`stats_collect_period`); where the
//! upper has no account of its own (a filesystem or qgroup of its own answers in constant
//! time) the answer is a walk whose cost grows with the container's files. A walk's answer
//! is reused for [`MIN_REUSE`], or for [`REUSE_PER_WALK`] times as long as the walk took if
//! that is longer: walking then takes at most 1/50 of a thread per snapshot, whatever
//! the containers write, and an answer is at most that old.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::info::Usage;

/// How long a walk's answer is reused at least.
pub(crate) const MIN_REUSE: Duration = Duration::from_secs(30);
/// How many times as long as its walk took an answer is reused, at least.
const REUSE_PER_WALK: u32 = 50;
/// Entries kept before expired ones are dropped (snapshots removed or committed leave
/// theirs behind until then).
const PRUNE_ABOVE: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct UsageCache {
    /// (snapshot key, its container) → (when the walk ended, until when it holds, answer).
    entries: Mutex<HashMap<(String, String), (Instant, Usage)>>,
}

impl UsageCache {
    /// The reused answer for `key`'s container `id`, if one still holds.
    pub(crate) fn get(&self, key: &str, id: &str) -> Option<Usage> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (until, usage) = entries.get(&(key.to_string(), id.to_string()))?;
        (Instant::now() < *until).then_some(*usage)
    }

    /// Keeps `usage`, which a walk that took `took` measured.
    pub(crate) fn put(&self, key: &str, id: &str, usage: Usage, took: Duration) {
        let until = Instant::now() + MIN_REUSE.max(took.saturating_mul(REUSE_PER_WALK));
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= PRUNE_ABOVE {
            let now = Instant::now();
            entries.retain(|_, (until, _)| *until > now);
        }
        entries.insert((key.to_string(), id.to_string()), (until, usage));
    }

    /// Forgets `key`'s answers (it was removed or committed).
    pub(crate) fn forget(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|(k, _), _| k != key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_reused_for_its_key_and_container_until_forgotten() {
        let cache = UsageCache::default();
        let usage = Usage {
            bytes: 7,
            inodes: 2,
        };
        cache.put("k", "snap-1", usage, Duration::from_millis(1));
        assert_eq!(cache.get("k", "snap-1"), Some(usage));
        assert_eq!(
            cache.get("k", "snap-2"),
            None,
            "another container under the key"
        );
        cache.forget("k");
        assert_eq!(cache.get("k", "snap-1"), None);
    }
}
