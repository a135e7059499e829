//! Named store-wide locks (`locks/<name>.lock`, flock). A flock dies with its process, so
//! a crash never leaves a lock held; whoever takes it next finds the dead holder's work
//! half done and finishes or removes it.
//!
//! A *live* holder can still hold a lock for ever: a pull stuck on a registry, a process
//! stopped by a debugger. So no wait here is unbounded: a waiter polls with a non-blocking
//! flock and gives up after the store's lock timeout with an error naming the lock and the
//! process holding it (read from `/proc/locks`), instead of hanging its caller (Garden, a
//! `clean` from cron) with it.

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;

use crate::{Store, StoreError, lock_holders};

/// Opens (making it if needed) the lock file at `path`. Its contents are never read, so
/// it is not truncated: `File::create`'s `O_TRUNC` makes the filesystem update an empty
/// file's times, one journal transaction per lock taken, which every create and delete
/// paid several times over (docs/benchmarks.md, process per call). Only a regular file
/// is a lock (see [`crate::regular_file`]).
pub(crate) fn open_lock_file(path: &std::path::Path) -> std::io::Result<File> {
    crate::regular_file::open(
        path,
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false),
    )
}

/// How long a lock wait lasts unless [`Store::with_lock_timeout`] says otherwise: long
/// enough to queue behind a legitimate multi-gigabyte import of the same layer, short
/// enough that a wedged holder surfaces as an error within minutes.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest sleep between two attempts: short enough that a waiter picks up a lock
/// soon after it is released, long enough that hundreds of waiters cost nothing.
const MAX_POLL: Duration = Duration::from_millis(50);

/// A waiter that has waited this long says so in the log, naming the holder.
const REPORT_AFTER: Duration = Duration::from_secs(1);

/// A held store lock, released on drop.
#[derive(Debug)]
pub struct StoreLock {
    _file: Flocked,
}

/// A file this process holds an flock on, unlocked explicitly when dropped. Closing the
/// fd alone would not do: a child another thread forked keeps a copy of the open file
/// until it execs, and the lock with it, so a lock "released" by closing could still
/// look held to the next `try` (a daemon spawning mkfs while a create releases a slot).
/// `LOCK_UN` releases the open file's lock whatever other copies of the fd exist.
#[derive(Debug)]
pub struct Flocked(File);

impl Flocked {
    /// `file`, whose flock the caller just took.
    pub fn new(file: File) -> Self {
        Flocked(file)
    }
}

impl Drop for Flocked {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(self.0.as_fd(), FlockOperation::Unlock);
    }
}

impl Store {
    /// Bounds every wait for a store lock this store makes (default
    /// [`DEFAULT_LOCK_TIMEOUT`]).
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// Waits (at most the lock timeout) for and takes the lock called `name`.
    pub fn lock(&self, name: &str) -> Result<StoreLock, StoreError> {
        self.wait_for_lock(name, false)
    }

    /// Takes the lock called `name`, shared or exclusive, waiting at most the lock timeout.
    fn wait_for_lock(&self, name: &str, shared: bool) -> Result<StoreLock, StoreError> {
        let path = self.layout.lock(name);
        let file = open_lock_file(&path).map_err(StoreError::io("creating lock", &path))?;
        self.wait_for_flock(&file, &path, shared)?;
        Ok(StoreLock {
            _file: Flocked::new(file),
        })
    }

    /// Flocks `file` (the lock file at `path`), polling until it is free or the lock
    /// timeout has passed; then fails naming the lock and who holds it.
    pub(crate) fn wait_for_flock(
        &self,
        file: &File,
        path: &Path,
        shared: bool,
    ) -> Result<(), StoreError> {
        let op = if shared {
            FlockOperation::NonBlockingLockShared
        } else {
            FlockOperation::NonBlockingLockExclusive
        };
        let started = Instant::now();
        let mut pause = Duration::from_millis(1);
        let mut reported = false;
        loop {
            match rustix::fs::flock(file.as_fd(), op) {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {}
                Err(e) => return Err(StoreError::errno("locking", path)(e)),
            }
            let waited = started.elapsed();
            if waited >= self.lock_timeout {
                return Err(StoreError::LockTimeout {
                    lock: lock_name(path),
                    path: path.to_path_buf(),
                    waited_secs: waited.as_secs(),
                    holders: lock_holders::describe(file),
                });
            }
            if !reported && waited >= REPORT_AFTER {
                reported = true;
                tracing::info!(
                    lock = lock_name(path),
                    holders = lock_holders::describe(file),
                    timeout_s = self.lock_timeout.as_secs(),
                    "waiting for a store lock"
                );
            }
            std::thread::sleep(pause.min(self.lock_timeout - waited));
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    /// Takes the lock called `name` if nobody holds it.
    pub fn try_lock(&self, name: &str) -> Result<Option<StoreLock>, StoreError> {
        let path = self.layout.lock(name);
        let file = open_lock_file(&path).map_err(StoreError::io("creating lock", &path))?;
        match rustix::fs::flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(StoreLock {
                _file: Flocked::new(file),
            })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(StoreError::errno("locking", &path)(e)),
        }
    }
}

/// A lock file's name as errors show it: `clean`, `layers-in-use`, `layer-<hex>`.
fn lock_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// Held shared by every process that needs layers to stay (a create from import until its
/// record names them, a pool fill, a refill) and exclusively by layer collection, which
/// therefore never removes a layer a create in flight is about to use.
const LAYERS_IN_USE: &str = "layers-in-use";

impl Store {
    /// Waits (at most the lock timeout) until no collection runs, then keeps layers from
    /// being collected until the returned lock drops.
    pub fn use_layers(&self) -> Result<StoreLock, StoreError> {
        self.wait_for_lock(LAYERS_IN_USE, true)
    }

    /// Waits (at most the lock timeout) for every holder of [`Store::use_layers`] to
    /// finish; while held, nobody starts to use layers.
    pub fn collect_layers_lock(&self) -> Result<StoreLock, StoreError> {
        self.lock(LAYERS_IN_USE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::init(&dir.path().join("store")).unwrap();
        (dir, store)
    }

    /// Whatever sits at a lock's path, the lock is refused at once, naming what is there:
    /// a FIFO with no reader blocked the open for ever before (and a device's open may act
    /// on the device); a symlink is not followed.
    #[test]
    fn a_lock_path_that_is_not_a_regular_file_is_refused_without_waiting() {
        let (_dir, store) = store();
        let locks = store.layout().locks();
        let fifo = locks.join("fifo.lock");
        fifo_at(&fifo);
        std::os::unix::fs::symlink(&fifo, locks.join("link.lock")).unwrap();
        std::fs::create_dir(locks.join("dir.lock")).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(locks.join("socket.lock")).unwrap();
        for (name, what) in [
            ("socket", "this is a socket"),
            ("fifo", "a FIFO"),
            ("link", "a symlink"),
            ("dir", "Is a directory"),
        ] {
            let locking = store.clone();
            let err = promptly(move || locking.lock(name).map(|_| ()).unwrap_err().to_string());
            assert!(err.contains(what), "{name}: {err}");
            assert!(err.contains(&format!("{name}.lock")), "{name}: {err}");
        }
        // A FIFO with a reader opens; it is refused for what it is.
        use std::os::unix::fs::OpenOptionsExt;
        let _reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(&fifo)
            .unwrap();
        let err = store.lock("fifo").unwrap_err().to_string();
        assert!(err.contains("this is a FIFO"), "{err}");
        assert!(store.lock("regular").is_ok());
    }

    /// A container's own lock that is not a regular file (a FIFO would block a delete for
    /// ever) is answered at once, and taken for no lock: nobody can be holding it, and
    /// one such directory must not fail a `clean`, `check` or delete of every other
    /// container. The delete that waits on it goes ahead.
    #[test]
    fn a_containers_lock_that_is_not_a_regular_file_is_taken_for_none_at_once() {
        let (_dir, store) = store();
        let dir = store.layout().container("c");
        std::fs::create_dir_all(&dir).unwrap();
        fifo_at(&dir.join("lock"));
        let waiting = store.clone();
        let waited = promptly(move || waiting.wait_for_container("c").map(|l| l.is_some()));
        assert!(waited.unwrap(), "the delete goes ahead");
        let trying = store.clone();
        let fifo_dir = dir.clone();
        let tried = promptly(move || trying.try_lock_dir(&fifo_dir).map(|l| l.is_some()));
        assert!(tried.unwrap(), "nobody holds it");

        // Its record, read by every delete, check, clean and list, is refused at once.
        fifo_at(&dir.join("container.json"));
        let reading = store.clone();
        let read = promptly(move || reading.record("c").map(|_| ()).unwrap_err().to_string());
        assert!(read.contains("this is a FIFO"), "{read}");

        // A directory or a symlink where the lock should be.
        std::fs::remove_file(dir.join("lock")).unwrap();
        std::fs::create_dir(dir.join("lock")).unwrap();
        assert!(store.try_lock_dir(&dir).unwrap().is_some());
        std::fs::remove_dir(dir.join("lock")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("lock")).unwrap();
        assert!(store.try_lock_dir(&dir).unwrap().is_some());
        // A regular lock held elsewhere is still held.
        std::fs::remove_file(dir.join("lock")).unwrap();
        std::fs::write(dir.join("lock"), "").unwrap();
        let holder = std::fs::File::open(dir.join("lock")).unwrap();
        rustix::fs::flock(&holder, rustix::fs::FlockOperation::LockExclusive).unwrap();
        assert!(store.try_lock_dir(&dir).unwrap().is_none());
    }

    /// A FIFO at `path`, with nobody at either end: what an attacker would plant.
    #[allow(clippy::disallowed_methods)]
    fn fifo_at(path: &Path) {
        let mode = rustix::fs::Mode::from_raw_mode(0o600);
        rustix::fs::mknodat(rustix::fs::CWD, path, rustix::fs::FileType::Fifo, mode, 0).unwrap();
    }

    /// `work`'s answer within 5 s, else a failure: a regression that blocks the open
    /// fails the test instead of hanging the suite (the blocked thread dies with it).
    fn promptly<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(work()));
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(answer) => answer,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("blocked for 5 s opening a lock")
            }
            Err(e) => panic!("the opening thread died: {e}"),
        }
    }

    #[test]
    fn a_held_lock_times_out_naming_the_lock_and_this_process_as_holder() {
        let (_dir, store) = store();
        let _held = store.lock("clean").unwrap();
        let impatient = store.clone().with_lock_timeout(Duration::from_millis(200));
        let started = Instant::now();
        let err = impatient.lock("clean").unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        assert!(err.contains("store lock `clean`"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "the holder is this process: {err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn collection_times_out_behind_a_user_of_layers_and_users_share() {
        let (_dir, store) = store();
        let user = store.use_layers().unwrap();
        let impatient = store.clone().with_lock_timeout(Duration::from_millis(100));
        // Users share the lock at once; a collector waits for them and gives up.
        let _second_user = impatient.use_layers().unwrap();
        let err = impatient.collect_layers_lock().unwrap_err().to_string();
        assert!(err.contains("store lock `layers-in-use`"), "{err}");
        drop(user);
        drop(_second_user);
        impatient.collect_layers_lock().unwrap();
    }

    #[test]
    fn a_waiter_takes_the_lock_once_its_holder_lets_go() {
        let (_dir, store) = store();
        let held = store.lock("reaper").unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            drop(held);
        });
        let started = Instant::now();
        store.lock("reaper").unwrap();
        assert!(started.elapsed() >= Duration::from_millis(100));
        releaser.join().unwrap();
    }

    #[test]
    fn a_dropped_lock_is_free_though_a_copy_of_its_fd_lives_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let file = File::create(&path).unwrap();
        rustix::fs::flock(file.as_fd(), FlockOperation::LockExclusive).unwrap();
        // What a child forked by another thread holds until it execs.
        let copy = file.try_clone().unwrap();
        drop(Flocked::new(file));
        let other = File::open(&path).unwrap();
        assert!(
            rustix::fs::flock(other.as_fd(), FlockOperation::NonBlockingLockExclusive).is_ok(),
            "released, whoever else has the open file"
        );
        drop(copy);
    }
}
