//! Calls that change snapshots and wait for the store's snapshot lock — held here as a
//! `lamina` command holds it — hold no more than a few of the daemon's threads, however
//! many containerd sends; reads are answered meanwhile; once the lock is free, every
//! waiting call is answered. Told to stop, the daemon does not wait out such a call, and
//! told twice, it does not drain.

// The test holds the store's lock with flock, as another process does.
#![allow(clippy::disallowed_methods)]
// A test that cannot set up must stop loudly.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use lamina_integration::snapshotter::{Api, Daemon, labels};
use lamina_integration::{ScratchFs, require_root};
use lamina_snapshotter::proto::containerd::services::snapshots::v1 as api;
use lamina_snapshotter::proto::containerd::services::snapshots::v1::snapshots_client::SnapshotsClient;
use tonic::Code;

/// What a Prepare is answered.
type PrepareAnswer = Result<tonic::Response<api::PrepareSnapshotResponse>, tonic::Status>;

/// What a Stat is answered.
type StatAnswer = Result<tonic::Response<api::StatSnapshotResponse>, tonic::Status>;

/// A Prepare's answer, or the Stat's turn.
type Call<'a> = Pin<Box<dyn Future<Output = PrepareAnswer> + 'a>>;

/// How many changing calls the daemon runs at once.
const TURNS: usize = 24;

/// Calls sent at once: far more than the daemon runs at once, fewer than tokio's
/// blocking threads, so without the bound each would hold a thread.
const WAITING: usize = 200;

#[test]
fn calls_waiting_for_the_snapshot_lock_hold_few_threads_and_reads_go_on() {
    require_root();
    let held = Held::new(|daemon| {
        let api = Api::connect(&daemon.socket);
        api.prepare("taken", "", labels(&[])).unwrap();
    });
    let Held {
        client,
        runtime,
        lock,
        daemon,
        fs: _fs,
    } = &held;
    let pid = daemon.pid().unwrap();
    // Each waits for the lock, then finds the key taken.
    let keys = std::iter::repeat_n("taken".to_string(), WAITING);
    let answers = prepares_then(runtime, client, keys, "taken", |stat| {
        let threads = threads_of(pid);
        let stat = stat.expect("Stat was not answered while Prepares waited for the lock");
        assert_eq!(stat.unwrap().into_inner().info.unwrap().name, "taken");
        // The runtime's thread, the calls' and the daemon's own (reaper, pools, metrics).
        assert!(
            threads < 40,
            "{threads} threads in the daemon with {WAITING} calls waiting for the lock"
        );
        rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::Unlock).unwrap();
    });
    assert_eq!(answers.len(), WAITING);
    for answer in &answers {
        assert_eq!(answer.as_ref().unwrap_err().code(), Code::AlreadyExists);
    }
}

#[test]
fn a_stop_does_not_wait_out_a_call_waiting_for_the_lock() {
    require_root();
    let mut held = Held::new(|_| {});
    // Every one a turn but the last, which waits for one (docs/containerd.md: 24 run at
    // once).
    let keys = (0..=TURNS).map(|n| format!("waits-{n}"));
    let answers = prepares_then(&held.runtime, &held.client, keys, "waits-0", |stat| {
        assert_eq!(stat.unwrap().unwrap_err().code(), Code::NotFound);
        // The lock's timeout is 600 s; the daemon drains for 20 s and gives the calls'
        // threads 2 s more, inside the packaged unit's TimeoutStopSec=30.
        let stopped = held.daemon.stop_within(Duration::from_secs(30));
        assert!(stopped, "the daemon did not stop: {}", held.daemon.log());
    });
    // The one without a turn was refused at the stop; those waiting for the lock were
    // cut when the daemon exited.
    let refused = answers[TURNS].as_ref().unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("stopping"), "{refused:?}");
    for answer in &answers[..TURNS] {
        let cut = answer.as_ref().unwrap_err();
        assert!(!cut.message().contains("stopping"), "{cut:?}");
    }
    assert!(
        held.daemon
            .log()
            .contains("calls still in flight: stopping without them"),
        "{}",
        held.daemon.log()
    );
}

#[test]
fn a_second_signal_ends_the_drain() {
    require_root();
    let mut held = Held::new(|_| {});
    let pid = held.daemon.pid().unwrap().to_string();
    let keys = std::iter::once("waits".to_string());
    let answers = prepares_then(&held.runtime, &held.client, keys, "waits", |stat| {
        assert_eq!(stat.unwrap().unwrap_err().code(), Code::NotFound);
        let status = std::process::Command::new("kill")
            .arg(&pid)
            .status()
            .unwrap();
        assert!(status.success());
        // Signals close together may arrive as one: the second once the first is seen.
        lamina_integration::wait_until("the daemon to see the first signal", || {
            held.daemon.log().contains("signalled: stopping")
        });
        // The drain is 20 s; the calls' threads are given 2 s after it ends.
        let stopped = held.daemon.stop_within(Duration::from_secs(12));
        assert!(stopped, "the daemon drained on: {}", held.daemon.log());
    });
    assert!(answers[0].is_err(), "{answers:?}");
    assert!(
        held.daemon.log().contains("signalled again: stopping now"),
        "{}",
        held.daemon.log()
    );
}

/// A Prepare of each of `keys`, each waiting for the lock or its turn; then a Stat of
/// `stat_key`, sent after them on the same connection, so that once it is answered the
/// daemon has taken up every one; then `then` with the Stat's answer (none within 60 s).
/// The Prepares' answers.
fn prepares_then(
    runtime: &tokio::runtime::Runtime,
    client: &SnapshotsClient<tonic::transport::Channel>,
    keys: impl Iterator<Item = String>,
    stat_key: &str,
    then: impl FnOnce(Option<StatAnswer>),
) -> Vec<PrepareAnswer> {
    runtime.block_on(async {
        let prepares: Vec<Call<'_>> = keys
            .map(|key| {
                let mut client = client.clone();
                Box::pin(async move {
                    client
                        .prepare(api::PrepareSnapshotRequest {
                            key,
                            ..Default::default()
                        })
                        .await
                }) as Call<'_>
            })
            .collect();
        let count = prepares.len();
        let mut stat_client = client.clone();
        let stat_key = stat_key.to_string();
        let stat = Box::pin(async move {
            let stat = tokio::time::timeout(
                Duration::from_secs(60),
                stat_client.stat(api::StatSnapshotRequest {
                    key: stat_key,
                    ..Default::default()
                }),
            )
            .await;
            then(stat.ok());
            Err(tonic::Status::ok("the Stat"))
        }) as Call<'_>;
        let mut answers =
            in_order(prepares.into_iter().chain(std::iter::once(stat)).collect()).await;
        answers.truncate(count);
        answers
    })
}

/// A daemon on its own scratch filesystem, the store's snapshot lock held as a `lamina`
/// command holds it, and a client on a runtime of one thread. Fields drop in order: the
/// client, its runtime, the lock, then the daemon, then the filesystem.
struct Held {
    client: SnapshotsClient<tonic::transport::Channel>,
    runtime: tokio::runtime::Runtime,
    lock: std::fs::File,
    daemon: Daemon,
    fs: ScratchFs,
}

impl Held {
    /// Starts the daemon, runs `before` (the lock not yet held), then holds the lock.
    fn new(before: impl FnOnce(&Daemon)) -> Held {
        let fs = ScratchFs::ext4(128);
        let store = fs.path().join("store");
        let daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
        before(&daemon);
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .open(store.join("locks/snapshots.lock"))
            .unwrap();
        rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(lamina_snapshotter::connect(&daemon.socket))
            .unwrap();
        Held {
            client,
            runtime,
            lock,
            daemon,
            fs,
        }
    }
}

/// Every one of `calls` to its end, each polled in turn, first to last, on every poll.
async fn in_order<'a, T>(mut calls: Vec<Pin<Box<dyn Future<Output = T> + 'a>>>) -> Vec<T> {
    let mut done: Vec<Option<T>> = calls.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (call, slot) in calls.iter_mut().zip(done.iter_mut()) {
            if slot.is_none()
                && let Poll::Ready(answer) = call.as_mut().poll(cx)
            {
                *slot = Some(answer);
            }
        }
        match done.iter().all(Option::is_some) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
