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

/// A Prepare's answer, or the Stat's turn.
type Call<'a> = Pin<
    Box<
        dyn Future<Output = Result<tonic::Response<api::PrepareSnapshotResponse>, tonic::Status>>
            + 'a,
    >,
>;

/// How many changing calls the daemon runs at once.
const TURNS: usize = 24;

/// Calls sent at once: far more than the daemon runs at once, fewer than tokio's
/// blocking threads, so without the bound each would hold a thread.
const WAITING: usize = 200;

#[test]
fn calls_waiting_for_the_snapshot_lock_hold_few_threads_and_reads_go_on() {
    require_root();
    let fs = ScratchFs::ext4(128);
    let store = fs.path().join("store");
    let daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
    let api = Api::connect(&daemon.socket);
    api.prepare("taken", "", labels(&[])).unwrap();

    let (lock, runtime, client) = hold_the_lock_and_connect(&daemon);
    let pid = daemon.pid().unwrap();
    let answers = runtime.block_on(async {
        // Each waits for the lock, then finds the key taken.
        let prepares = (0..WAITING).map(|_| {
            let mut client = client.clone();
            Box::pin(async move {
                client
                    .prepare(api::PrepareSnapshotRequest {
                        key: "taken".into(),
                        ..Default::default()
                    })
                    .await
            }) as Call
        });
        let mut stat_client = client.clone();
        // Polled after every Prepare was (`in_order`), so sent after them on the same
        // connection: when it is answered, the daemon has taken up every one.
        let reads = Box::pin(async move {
            let stat = tokio::time::timeout(
                Duration::from_secs(60),
                stat_client.stat(api::StatSnapshotRequest {
                    key: "taken".into(),
                    ..Default::default()
                }),
            )
            .await;
            let threads = threads_of(pid);
            let stat = stat.expect("Stat was not answered while Prepares waited for the lock");
            assert_eq!(stat.unwrap().into_inner().info.unwrap().name, "taken");
            // The runtime's thread, the calls' and the daemon's own (reaper, pools, metrics).
            assert!(
                threads < 40,
                "{threads} threads in the daemon with {WAITING} calls waiting for the lock"
            );
            rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::Unlock).unwrap();
            Err(tonic::Status::ok("the Stat"))
        }) as Call;
        in_order(prepares.chain(std::iter::once(reads)).collect()).await
    });
    assert_eq!(answers.len(), WAITING + 1);
    for answer in &answers[..WAITING] {
        assert_eq!(answer.as_ref().unwrap_err().code(), Code::AlreadyExists);
    }
    drop(client);
    drop(runtime);
    drop(api);
    drop(daemon);
    drop(fs);
}

#[test]
fn a_stop_does_not_wait_out_a_call_waiting_for_the_lock() {
    require_root();
    let fs = ScratchFs::ext4(128);
    let store = fs.path().join("store");
    let mut daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
    let (lock, runtime, client) = hold_the_lock_and_connect(&daemon);
    let answers = runtime.block_on(async {
        // Every one a turn but the last, which waits for one (docs/containerd.md: 24 run
        // at once).
        let prepares = (0..TURNS + 1).map(|n| {
            let mut client = client.clone();
            Box::pin(async move {
                client
                    .prepare(api::PrepareSnapshotRequest {
                        key: format!("waits-{n}"),
                        ..Default::default()
                    })
                    .await
            }) as Call<'_>
        });
        let mut stat_client = client.clone();
        let daemon = &mut daemon;
        let stop = Box::pin(async move {
            // Answered (NotFound) once the daemon has taken up the Prepares before it.
            let stat = stat_client
                .stat(api::StatSnapshotRequest {
                    key: "waits-0".into(),
                    ..Default::default()
                })
                .await;
            assert_eq!(stat.unwrap_err().code(), Code::NotFound);
            // The lock's timeout is 600 s; the daemon drains for 20 s and gives the
            // calls' threads 2 s more, inside the packaged unit's TimeoutStopSec=30.
            let stopped = daemon.stop_within(Duration::from_secs(30));
            assert!(stopped, "the daemon did not stop: {}", daemon.log());
            Err(tonic::Status::ok("the stop"))
        }) as Call<'_>;
        in_order(prepares.chain(std::iter::once(stop)).collect()).await
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
        daemon
            .log()
            .contains("calls still in flight: stopping without them"),
        "{}",
        daemon.log()
    );
    drop(lock);
    drop(client);
    drop(runtime);
    drop(daemon);
    drop(fs);
}

#[test]
fn a_second_signal_ends_the_drain() {
    require_root();
    let fs = ScratchFs::ext4(128);
    let store = fs.path().join("store");
    let mut daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
    let (lock, runtime, client) = hold_the_lock_and_connect(&daemon);
    let pid = daemon.pid().unwrap().to_string();
    let answers = runtime.block_on(async {
        let mut prepare_client = client.clone();
        let prepare = Box::pin(async move {
            prepare_client
                .prepare(api::PrepareSnapshotRequest {
                    key: "waits".into(),
                    ..Default::default()
                })
                .await
        }) as Call<'_>;
        let mut stat_client = client.clone();
        let daemon = &mut daemon;
        let stop = Box::pin(async move {
            let stat = stat_client
                .stat(api::StatSnapshotRequest {
                    key: "waits".into(),
                    ..Default::default()
                })
                .await;
            assert_eq!(stat.unwrap_err().code(), Code::NotFound);
            let status = std::process::Command::new("kill")
                .arg(&pid)
                .status()
                .unwrap();
            assert!(status.success());
            // Signals close together may arrive as one: the second once the first is seen.
            lamina_integration::wait_until("the daemon to see the first signal", || {
                daemon.log().contains("signalled: stopping")
            });
            // The drain is 20 s; the calls' threads are given 2 s after it ends.
            let stopped = daemon.stop_within(Duration::from_secs(12));
            assert!(stopped, "the daemon drained on: {}", daemon.log());
            Err(tonic::Status::ok("the stop"))
        }) as Call<'_>;
        in_order(vec![prepare, stop]).await
    });
    assert!(answers[0].is_err(), "{answers:?}");
    assert!(
        daemon.log().contains("signalled again: stopping now"),
        "{}",
        daemon.log()
    );
    drop(lock);
    drop(client);
    drop(runtime);
    drop(daemon);
    drop(fs);
}

/// The store's snapshot lock, held as a `lamina` command holds it, and a client of the
/// daemon on a runtime of one thread.
fn hold_the_lock_and_connect(
    daemon: &Daemon,
) -> (
    std::fs::File,
    tokio::runtime::Runtime,
    SnapshotsClient<tonic::transport::Channel>,
) {
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .open(daemon.store.join("locks/snapshots.lock"))
        .unwrap();
    rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = runtime
        .block_on(lamina_snapshotter::connect(&daemon.socket))
        .unwrap();
    (lock, runtime, client)
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
