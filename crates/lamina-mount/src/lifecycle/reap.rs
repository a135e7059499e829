//! The reaper: what a deferred delete leaves in `trash/`, torn down after unlinking each
//! container's written files through its mount (or shutting an isolated container's own
//! upper filesystem down), so their dirty pages are dropped instead of written back.
//! Containers whose uppers share the store's filesystem are unmounted one at a time per
//! store, so they never queue on that filesystem's sync, and their files are unlinked as
//! many at once as its locks allow (two on ext4 given two CPUs, else one); those with an
//! upper filesystem of their own have no shared sync to queue on and go a few at once.
//!
//! One reaper runs per store (the `reaper` lock, which `check`, `clean` and
//! `delete-store` take too). While it holds that lock a reaper also holds `reaping`, which
//! only reapers take. A reaper a delete starts lingers a while after `trash/` is empty,
//! and a deferred delete that finds `reaping` held starts none: a burst of deletes pays
//! one process start, not one each.
//!
//! Invariant: a container renamed into `trash/` before a delete found `reaping` held is
//! torn down by that reaper (or one after it). The delete lets go of the container's lock
//! before it looks at `reaping`, and the reaper, after it lets go of both its locks,
//! looks at `trash/` once more and takes them back for any container no one holds that
//! it has not failed. Anyone else holding `reaper` makes a delete start a reaper, which
//! waits for it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lamina_store::{Store, StoreError};
use lamina_sys::Mounter;

use crate::model::record::{self, Container};
use crate::{RootfsError, uppers::isolated};

/// What a reaper did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reaped {
    pub removed: usize,
    /// Left in `trash/` for the next reaper (busy, or an error that was logged).
    pub failed: usize,
}

/// How often a lingering reaper looks for more trash.
const LINGER_POLL: Duration = Duration::from_millis(10);

/// How long after a container's teardown failed (a busy rootfs) the same reaper tries it
/// again; each further failure doubles the wait, up to [`LONGEST_RETRY`]. A container
/// whose process stays in its rootfs costs a walk of its upper per try, so the daemon's
/// reaper, which lives as long as the daemon, must not try it every pass.
const RETRY_FAILED: Duration = Duration::from_secs(1);
const LONGEST_RETRY: Duration = Duration::from_secs(60);

/// Longest a reaper keeps its lock while deletes keep coming: then it lets go for
/// [`YIELD`], so a `clean`, `check --repair` or `delete-store` waiting for it (they look
/// every 50 ms) gets a turn.
const MAX_HOLD: Duration = Duration::from_secs(5);
const YIELD: Duration = Duration::from_millis(150);

/// Containers one pass locks and tears down: each lock is an open file.
const PASS: usize = 256;

/// Containers on upper filesystems of their own torn down at once. Such a teardown
/// (shutdown, two unmounts, a loop device's release) mostly waits on the kernel — a
/// journal write, RCU grace periods, kernel threads stopping — so a few overlap well even
/// on two cores. They share only the store's filesystem, where each image file is
/// fsynced (ext4's journal abort) and unlinked. Four at once took 0.5–0.75× of one at a
/// time for ten containers (docs/benchmarks.md, S1).
const OWN_FS_AT_ONCE: usize = 4;

/// How long a container in `trash/` without its lock file is left alone: that is an
/// inline delete (or a reaper) removing it, whose lock went first; one a crash left
/// half-removed is old, and is finished.
const REMOVAL_IN_FLIGHT: Duration = Duration::from_secs(2);

/// Tears down everything in `trash/` no one else holds. A second reaper waits for the
/// first, then finds what is left (usually nothing).
pub fn reap(store: &Store, mounter: &dyn Mounter) -> Result<Reaped, RootfsError> {
    reap_lingering(store, mounter, Duration::ZERO)
}

/// [`reap`], then, still the store's reaper, looking for more trash (every 10 ms) until
/// none came for `linger` (see the module's invariant).
pub fn reap_lingering(
    store: &Store,
    mounter: &dyn Mounter,
    linger: Duration,
) -> Result<Reaped, RootfsError> {
    reap_with(store, mounter, linger, &mut Failed::new())
}

/// A reaper that runs again and again (the daemon's): it remembers the containers whose
/// teardown failed and tries each again only once its wait is over.
#[derive(Debug, Default)]
pub struct Reaper {
    failed: Failed,
}

impl Reaper {
    /// [`reap`], with what earlier calls failed still waiting its turn.
    pub fn reap(&mut self, store: &Store, mounter: &dyn Mounter) -> Result<Reaped, RootfsError> {
        reap_with(store, mounter, Duration::ZERO, &mut self.failed)
    }
}

/// Containers whose teardown failed: when to try each again, and how long it waited last.
type Failed = HashMap<PathBuf, (Instant, Duration)>;

/// Notes that `dir`'s teardown failed: its wait doubles from [`RETRY_FAILED`].
fn note_failure(failed: &mut Failed, dir: PathBuf) {
    let wait = failed
        .get(&dir)
        .map_or(RETRY_FAILED, |(_, last)| (*last * 2).min(LONGEST_RETRY));
    failed.insert(dir, (Instant::now() + wait, wait));
}

fn reap_with(
    store: &Store,
    mounter: &dyn Mounter,
    linger: Duration,
    failed: &mut Failed,
) -> Result<Reaped, RootfsError> {
    let mut reaped = Reaped::default();
    let mut lock = Some(reaper_locks(store.lock("reaper")?, store)?);
    let mut held_since = Instant::now();
    while lock.is_some() {
        let mut quiet_since = Instant::now();
        let mut done = false;
        loop {
            let yield_at = held_since + MAX_HOLD;
            if drain(store, mounter, failed, &mut reaped, yield_at)? {
                quiet_since = Instant::now();
            }
            if Instant::now() >= yield_at {
                break;
            }
            if quiet_since.elapsed() >= linger {
                done = true;
                break;
            }
            std::thread::sleep(LINGER_POLL);
        }
        store.pause_point("reaper-letting-go");
        lock = None;
        if !done {
            std::thread::sleep(YIELD);
            held_since = Instant::now();
        }
        if claimable(store, failed)? {
            // None: another reaper, or a clean, took the lock and the container with it.
            lock = match store.try_lock("reaper")? {
                Some(reaper) => Some(reaper_locks(reaper, store)?),
                None => None,
            };
        }
    }
    reaped.failed = failed.keys().filter(|dir| dir.exists()).count();
    Ok(reaped)
}

/// `reaper`, and `reaping` taken under it (only a `reaper` holder takes it, so it is
/// free).
fn reaper_locks(
    reaper: lamina_store::StoreLock,
    store: &Store,
) -> Result<(lamina_store::StoreLock, lamina_store::StoreLock), RootfsError> {
    let reaping = store.lock("reaping")?;
    Ok((reaper, reaping))
}

/// Whether a reaper is at work on the store (it holds `reaping`): a deferred delete then
/// leaves its container to it (see the module's invariant) instead of starting another.
/// An unanswerable lock says no, so a reaper is started.
pub fn reaper_running(store: &Store) -> bool {
    matches!(store.try_lock("reaping"), Ok(None))
}

/// Containers in `trash/` this reaper may try now: not failed, or failed long enough ago,
/// and not being removed by someone else.
fn due(store: &Store, failed: &Failed) -> Result<Vec<PathBuf>, RootfsError> {
    let now = Instant::now();
    Ok(store
        .trash_entries()?
        .into_iter()
        .filter(|dir| failed.get(dir).is_none_or(|(again, _)| *again <= now))
        .filter(|dir| !removal_in_flight(dir))
        .collect())
}

/// Whether a container this reaper has not failed is in `trash/` with no one holding it.
fn claimable(store: &Store, failed: &Failed) -> Result<bool, RootfsError> {
    Ok(store
        .trash_entries()?
        .iter()
        .filter(|dir| !failed.contains_key(*dir) && !removal_in_flight(dir))
        .any(|dir| matches!(store.try_lock_dir(dir), Ok(Some(_)))))
}

/// A container directory whose lock file is gone and that changed within
/// [`REMOVAL_IN_FLIGHT`]: someone is removing it (the lock file goes first).
fn removal_in_flight(dir: &Path) -> bool {
    !dir.join(lamina_store::LOCK_FILE).exists()
        && std::fs::symlink_metadata(dir)
            .and_then(|m| m.modified())
            .is_ok_and(|changed| changed.elapsed().is_ok_and(|age| age < REMOVAL_IN_FLIGHT))
}

/// Tears down every container due in `trash/` that no one holds, [`PASS`] at a time,
/// until a pass finds none or `until` has passed; returns whether it tried any. One held
/// (an inline delete removing its own, a deferred delete between its rename and its
/// return) is left for a later pass.
fn drain(
    store: &Store,
    mounter: &dyn Mounter,
    failed: &mut Failed,
    reaped: &mut Reaped,
    until: Instant,
) -> Result<bool, RootfsError> {
    let mut tried_any = false;
    loop {
        failed.retain(|dir, _| dir.exists());
        let mut pending = due(store, failed)?;
        if pending.is_empty() || Instant::now() >= until {
            return Ok(tried_any);
        }
        pending.truncate(PASS);
        // One read of the mount table per pass, not one per container: with a thousand
        // binds mounted, each read costs about a millisecond. Listed after `pending`, so
        // it includes every pending container's mounts (renames carry mounts along).
        let trash = store.layout().trash();
        let mut mounted = by_entry(&trash, mounter.mounts_under(&trash)?);
        let mut held = Vec::new();
        for dir in pending {
            // Held while it is judged, torn down and removed: not anyone else's to touch
            // meanwhile (both removing one tree fails one of them with ENOENT).
            let lock = match store.try_lock_dir(&dir) {
                Ok(Some(lock)) => lock,
                Ok(None) => continue,
                Err(e) => {
                    // Said, and tried again later: skipped silently, it would stay in
                    // trash for ever.
                    tracing::warn!(dir = %dir.display(), error = %e, "reaper left a container in trash");
                    note_failure(failed, dir);
                    continue;
                }
            };
            let record = record::read_in(store, &dir).unwrap_or(None);
            let mounts = dir
                .file_name()
                .and_then(|name| mounted.remove(name))
                .unwrap_or_default();
            let rootfs = rootfs_use(mounter, &dir, record.as_ref(), &mounts);
            held.push(Held {
                dir,
                record,
                mounts,
                lock,
                rootfs,
            });
        }
        if held.is_empty() {
            return Ok(tried_any);
        }
        tried_any = true;
        // One still in use is left untouched, not walked or shut down: its unmount
        // would fail busy anyway, and a reaper may come by every second.
        let mut done = Vec::new();
        let (mut own, mut shared) = (Vec::new(), Vec::new());
        for h in held {
            match &h.rootfs {
                RootfsUse::Busy(rootfs) => {
                    let why = format!("a process is still in its rootfs ({})", rootfs.display());
                    done.push((h.dir, Err(RootfsError::Refused(why))));
                }
                _ if on_own_upper_fs(h.record.as_ref()) => own.push(h),
                _ => shared.push(h),
            }
        }
        // Discard the written data of every pending container on the store's filesystem
        // before the first unmount there: each unmount syncs that whole filesystem, so
        // one container's unmount would otherwise write back the data of every container
        // still waiting here. As many at once as that filesystem's locks allow.
        let discards = lamina_sys::unlinks_at_once(&store.layout().trash());
        at_once(shared.iter().collect(), discards, |h: &Held| {
            // Only an optimisation: a panic here leaves the data to the unmount.
            let discarded = contained(&h.dir, || {
                discard(h);
                Ok(())
            });
            if let Err(e) = discarded {
                tracing::warn!(dir = %h.dir.display(), error = %e, "reaper could not discard a container's data");
            }
        });
        // All unmounted before anything of the pass is removed from the store's
        // filesystem (their own directories, or an isolated container's image): each
        // unmount syncs that filesystem, and a removal before it would give it a journal
        // commit to wait for.
        let unmounted: Vec<_> = shared
            .into_iter()
            .map(|h| {
                let result = contained(&h.dir, || unmount_in(mounter, &h.dir, &h.mounts));
                (h, result)
            })
            .collect();
        done.extend(at_once(own, OWN_FS_AT_ONCE, |h: Held| {
            let dir = h.dir.clone();
            let result = contained(&dir, || {
                discard(&h);
                tear_down_held(store, mounter, h)
            });
            (dir, result)
        }));
        for (h, unmounted) in unmounted {
            let dir = h.dir.clone();
            let result =
                unmounted.and_then(|()| contained(&dir, || remove_held(store, mounter, h)));
            done.push((dir, result));
        }
        for (dir, result) in done {
            match result {
                Ok(()) => {
                    reaped.removed += 1;
                    failed.remove(&dir);
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "reaper left a container in trash");
                    note_failure(failed, dir);
                }
            }
        }
    }
}

/// Runs `work` for the container in `dir`; a panic becomes its error, so the container
/// waits its turn like any that failed and the rest of the pass goes on.
fn contained<R>(
    dir: &Path,
    work: impl FnOnce() -> Result<R, RootfsError>,
) -> Result<R, RootfsError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(RootfsError::Refused(format!(
            "tearing {} down panicked: {why}",
            dir.display()
        )))
    })
}

/// A container in `trash/` the reaper holds.
struct Held {
    dir: PathBuf,
    /// Its record, if readable.
    record: Option<Container>,
    /// What is mounted in it, deepest first.
    mounts: Vec<PathBuf>,
    lock: lamina_store::DirLock,
    rootfs: RootfsUse,
}

/// Unmounts and removes a held container; its lock is let go once it is removed.
fn tear_down_held(store: &Store, mounter: &dyn Mounter, held: Held) -> Result<(), RootfsError> {
    unmount_in(mounter, &held.dir, &held.mounts)?;
    remove_held(store, mounter, held)
}

/// [`remove_trashed`] of a held container; its lock is let go once it is removed.
fn remove_held(store: &Store, mounter: &dyn Mounter, held: Held) -> Result<(), RootfsError> {
    let Held {
        dir, record, lock, ..
    } = held;
    let result = remove_trashed(store, mounter, &dir, record.as_ref());
    drop(lock);
    result
}

/// What the reaper knows of a trashed container's rootfs mount, asked once per try.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RootfsUse {
    /// A process is in the rootfs mounted here: the container is left untouched this
    /// time.
    Busy(PathBuf),
    /// Nobody is in it (in lamina's mount namespace): its own upper filesystem may be
    /// shut down.
    Idle,
    /// Not asked: not mounted here, no record, or mounts beneath it, which teardown
    /// unmounts first (the mount is busy until then).
    NotAsked,
}

/// Whether a container's upper is on a superblock of its own (`isolated`,
/// `isolated-memory`): its unmount syncs nothing of anyone else's.
fn on_own_upper_fs(container: Option<&Container>) -> bool {
    container.is_some_and(|c| {
        matches!(
            c.model().upper_backend(),
            Some(crate::UpperBackend::Disk | crate::UpperBackend::Memory)
        )
    })
}

/// Runs `work` on every item, on the calling thread and up to `workers - 1` more, and
/// returns what each gave, in no particular order. A thread the system refuses is done
/// without: the caller works through what is left. A panic in `work` is re-raised once
/// every thread has stopped (the others finish the items still queued).
fn at_once<T: Send, R: Send>(
    items: Vec<T>,
    workers: usize,
    work: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let helpers = workers.min(items.len()).saturating_sub(1);
    let queue = std::sync::Mutex::new(items.into_iter());
    let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
    let drain = || {
        let mut done = Vec::new();
        while let Some(item) = next() {
            done.push(work(item));
        }
        done
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..helpers)
            .map_while(|_| std::thread::Builder::new().spawn_scoped(s, drain).ok())
            .collect();
        let mut done = drain();
        for handle in handles {
            done.extend(
                handle
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p)),
            );
        }
        done
    })
}

/// Whether the rootfs lamina mounted for the container in `dir` has a process in it (an
/// open file, a working directory), asked once per try ([`Mounter::in_use`]). One with
/// mounts beneath it is not asked. Left untouched, a busy container's written data may be
/// written back by another container's unmount meanwhile.
fn rootfs_use(
    mounter: &dyn Mounter,
    dir: &Path,
    container: Option<&Container>,
    mounts: &[PathBuf],
) -> RootfsUse {
    let Some(container) = container else {
        return RootfsUse::NotAsked;
    };
    let rootfs = container.dirs_in(dir.to_path_buf()).rootfs;
    if !mounts.contains(&rootfs)
        || mounts
            .iter()
            .any(|m| m != &rootfs && m.starts_with(&rootfs))
    {
        return RootfsUse::NotAsked;
    }
    match mounter.in_use(&rootfs) {
        true => RootfsUse::Busy(rootfs),
        false => RootfsUse::Idle,
    }
}

/// Unlinks a trashed read-write overlay's written files through its mount, so its
/// unmount — and every other unmount on the same upper filesystem — has nothing of it
/// to write back. Anything else (read-only binds, unmounted dirs) is left alone.
fn discard(held: &Held) {
    let (dir, mounts) = (&held.dir, &held.mounts);
    let Some(container) = held.record.as_ref().filter(|c| c.rootfs.mounted) else {
        return;
    };
    // Read-only, or a tmpfs upper that is never written back: nothing to save.
    if !container.model().writes_back() {
        return;
    }
    let dirs = container.dirs_in(dir.to_path_buf());
    // Its own upper filesystem is gone with it: stopped without its log flushed, its
    // files cost nothing, where unlinking them costs one journal entry each. Only when
    // nobody was in its rootfs (a process still there would read EIO from then on).
    let own_fs = dirs.upper_fs_mount();
    if container.model().upper_backend() == Some(crate::UpperBackend::Disk)
        && held.rootfs == RootfsUse::Idle
        && mounts.contains(&own_fs)
        && lamina_sys::shut_down_own_fs(&own_fs, &dirs.upper_image())
    {
        tracing::debug!(dir = %dir.display(), "shut its own upper filesystem down before unmount");
        return;
    }
    if mounts.contains(&dirs.rootfs) {
        let discarded = lamina_sys::unlink_written(&dirs.upper, &dirs.rootfs);
        tracing::debug!(dir = %dir.display(), discarded, "unlinked written files before unmount");
    }
}

/// `mounts` under `trash` (deepest first) grouped by the trash entry each is in, in the
/// same order: one lookup per container instead of a scan of every mount.
fn by_entry(trash: &Path, mounts: Vec<PathBuf>) -> HashMap<std::ffi::OsString, Vec<PathBuf>> {
    let mut grouped: HashMap<_, Vec<PathBuf>> = HashMap::new();
    for mount in mounts {
        let entry = mount
            .strip_prefix(trash)
            .ok()
            .and_then(|rel| rel.components().next())
            .map(|c| c.as_os_str().to_os_string());
        if let Some(entry) = entry {
            grouped.entry(entry).or_default().push(mount);
        }
    }
    grouped
}

/// Unmounts `mounts`: what is mounted in container directory `dir`, deepest first.
fn unmount_in(mounter: &dyn Mounter, dir: &Path, mounts: &[PathBuf]) -> Result<(), RootfsError> {
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    for mount in mounts {
        mounter
            .unmount(mount)
            .map_err(|e| RootfsError::unmounting(&name, e))?;
    }
    Ok(())
}

/// Removes container directory `dir`, nothing mounted in it any more, and drops the
/// shared-mount lease its record (`container`) names.
fn remove_trashed(
    store: &Store,
    mounter: &dyn Mounter,
    dir: &Path,
    container: Option<&Container>,
) -> Result<(), RootfsError> {
    isolated::delete_subvolume_in(mounter, dir)?;
    lamina_store::remove_tree(dir).map_err(StoreError::io("removing", dir))?;
    crate::providers::release(store, mounter, container)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    use super::{Failed, LONGEST_RETRY, RETRY_FAILED, at_once, note_failure};

    #[test]
    fn at_once_runs_its_workers_together_and_gives_every_result() {
        // The first three items each wait (at most 10 s) until three are running: they
        // meet only if three threads work at once.
        let (started, met) = (Mutex::new(0), Condvar::new());
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let mut results = at_once((0..40).collect(), 3, |i: u32| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            if i < 3 {
                let mut n = started.lock().unwrap();
                *n += 1;
                met.notify_all();
                let (n, _) = met
                    .wait_timeout_while(n, Duration::from_secs(10), |n| *n < 3)
                    .unwrap();
                assert_eq!(*n, 3, "three workers never ran at once");
            }
            running.fetch_sub(1, Ordering::SeqCst);
            i * 2
        });
        results.sort_unstable();
        assert_eq!(results, (0..40).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(
            most.load(Ordering::SeqCst),
            3,
            "never more than its workers"
        );
        assert!(at_once(Vec::<u32>::new(), 3, |i| i).is_empty());
        assert_eq!(
            at_once(vec![5u32], 0, |i| i),
            [5],
            "the caller works when alone"
        );
    }

    #[test]
    fn each_failure_doubles_the_wait_up_to_a_minute() {
        let (mut failed, dir) = (Failed::new(), std::path::PathBuf::from("/trash/busy"));
        let waits: Vec<Duration> = (0..10)
            .map(|_| {
                note_failure(&mut failed, dir.clone());
                failed[&dir].1
            })
            .collect();
        assert_eq!(waits[0], RETRY_FAILED);
        assert_eq!(waits[3], RETRY_FAILED * 8);
        assert_eq!(waits[9], LONGEST_RETRY);
        assert!(failed[&dir].0 > std::time::Instant::now() + RETRY_FAILED);
    }

    #[test]
    fn a_panicking_teardown_is_that_containers_error() {
        let dir = std::path::Path::new("/trash/odd");
        let err = super::contained(dir, || -> Result<(), crate::RootfsError> {
            panic!("a bug")
        })
        .unwrap_err();
        assert!(
            err.to_string().contains("/trash/odd down panicked: a bug"),
            "{err}"
        );
        assert!(super::contained(dir, || Ok(7)).is_ok_and(|n| n == 7));
    }

    #[test]
    #[should_panic(expected = "item 7")]
    fn a_panic_in_the_work_is_the_callers() {
        at_once((0..10).collect(), 2, |i: u32| assert_ne!(i, 7, "item {i}"));
    }
}
