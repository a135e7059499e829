//! `lamina daemon --metrics-address`: a real daemon on a loop-backed ext4 store, its
//! `/metrics` scraped over HTTP and read by a strict parser of the Prometheus text format
//! (`lamina_integration::prometheus`) after snapshot calls, Garden creates and pool fills;
//! and its log, for how often its reaper tries a container it cannot tear down.
//! The daemon picks a free port itself (`127.0.0.1:0`) and logs it, so no port is
//! guessed, and nothing waits but on a condition polled against a deadline.

// A test that cannot set up must stop loudly.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lamina_integration::lamina::binary;
use lamina_integration::prometheus::{Exposition, scrape};
use lamina_integration::snapshotter::{Api, Daemon, Labels, Mounted};
use lamina_integration::{Lamina, ScratchFs, require_root, sample_image, wait_until};
use tonic::Code;

/// Fields drop in order: client, then daemon, then the filesystem (and every mount on it).
struct Fixture {
    api: Api,
    daemon: Daemon,
    address: String,
    fs: ScratchFs,
}

fn fixture() -> Fixture {
    require_root();
    let fs = ScratchFs::ext4(512);
    let daemon = Daemon::start(
        &fs.path().join("store"),
        &fs.path().join("lamina.sock"),
        &["--metrics-address", "127.0.0.1:0", "--log-level", "debug"],
    );
    let address = metrics_address(&daemon.store.with_extension("daemon.log"));
    Fixture {
        api: Api::connect(&daemon.socket),
        daemon,
        address,
        fs,
    }
}

/// The daemon's log lines (JSON) with message `message`, in order.
fn log_lines(log: &Path, message: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["fields"]["message"] == message)
        .collect()
}

/// The address a daemon given `127.0.0.1:0` bound, from the line it logs when it starts
/// serving metrics (the last one: the log is appended to across restarts).
fn metrics_address(log: &Path) -> String {
    let mut address = None;
    wait_until("the daemon logging its metrics address", || {
        address = log_lines(log, "serving metrics at /metrics")
            .last()
            .and_then(|l| l["fields"]["address"].as_str().map(str::to_string));
        address.is_some()
    });
    address.unwrap()
}

/// Scrapes until `done` holds for the page, and returns that page: for what the daemon
/// measures off the scrape (containers, the store's bytes).
fn scrape_until(address: &str, what: &str, done: impl Fn(&Exposition) -> bool) -> Exposition {
    let mut page = None;
    wait_until(what, || {
        let scraped = scrape(address);
        let ok = done(&scraped);
        page = Some(scraped);
        ok
    });
    page.unwrap()
}

fn snapshots(page: &Exposition) -> [Option<f64>; 3] {
    ["active", "committed", "view"].map(|kind| page.value("lamina_snapshots", &[("kind", kind)]))
}

fn calls(page: &Exposition, method: &str, code: &str) -> f64 {
    page.value(
        "lamina_snapshots_calls_total",
        &[("method", method), ("code", code)],
    )
    .unwrap_or(0.0)
}

#[test]
fn snapshot_calls_move_the_call_counters_histograms_and_snapshot_gauges() {
    let f = fixture();
    let page = scrape(&f.address);
    assert_eq!(snapshots(&page), [Some(0.0); 3], "an empty store");
    assert_eq!(page.sum("lamina_snapshots_calls_total", &[]), 0.0);
    assert_eq!(page.value("lamina_layer_imports_total", &[]), Some(0.0));
    assert_eq!(
        page.value("lamina_layer_imported_bytes_total", &[]),
        Some(0.0)
    );
    assert_eq!(page.value("lamina_reaper_backlog_entries", &[]), Some(0.0));
    assert!(
        page.value("lamina_store_filesystem_size_bytes", &[])
            .unwrap()
            > 0.0
    );

    assert_eq!(f.api.stat("missing").unwrap_err().code(), Code::NotFound);
    let written = 256 * 1024;
    let mounts = f.api.prepare("p1", "", Labels::new()).unwrap();
    {
        let mounted = Mounted::new(&mounts);
        std::fs::write(mounted.path().join("data"), vec![7u8; written]).unwrap();
    }
    let page = scrape(&f.address);
    assert_eq!(snapshots(&page), [Some(1.0), Some(0.0), Some(0.0)]);

    f.api.commit("c1", "p1", Labels::new()).unwrap();
    f.api.prepare("p2", "c1", Labels::new()).unwrap();
    f.api.view("v1", "c1").unwrap();
    assert_eq!(
        f.api.prepare("p2", "c1", Labels::new()).unwrap_err().code(),
        Code::AlreadyExists
    );
    let page = scrape(&f.address);
    assert_eq!(snapshots(&page), [Some(1.0), Some(1.0), Some(1.0)]);
    assert_eq!(page.value("lamina_layer_imports_total", &[]), Some(1.0));
    let imported = page
        .value("lamina_layer_imported_bytes_total", &[])
        .unwrap();
    assert!(imported >= written as f64, "{imported} bytes imported");
    for (method, code, n) in [
        ("Stat", "NotFound", 1.0),
        ("Prepare", "OK", 2.0),
        ("Prepare", "AlreadyExists", 1.0),
        ("Commit", "OK", 1.0),
        ("View", "OK", 1.0),
    ] {
        assert_eq!(calls(&page, method, code), n, "{method} {code}");
    }
    // The parser checked every histogram's buckets rise to `+Inf` = `_count`.
    let prepare = [("method", "Prepare")];
    assert_eq!(
        page.value("lamina_snapshots_call_duration_seconds_count", &prepare),
        Some(3.0)
    );
    assert!(
        page.value("lamina_snapshots_call_duration_seconds_sum", &prepare)
            .unwrap()
            > 0.0
    );
    assert_eq!(
        page.family("lamina_snapshots_call_duration_seconds")
            .unwrap()
            .kind,
        "histogram"
    );

    // Counted off the scrape, at most every few seconds: polled until they show.
    scrape_until(&f.address, "p2's and v1's containers counted", |page| {
        page.sum("lamina_containers", &[("owner", "containerd")]) == 2.0
    });
    // Measured when first scraped (the store nearly empty), then at most once a minute:
    // present, not fresh.
    let page = scrape_until(&f.address, "the store's bytes measured", |page| {
        page.value("lamina_store_bytes", &[])
            .is_some_and(|b| b > 0.0)
    });
    let measured = page
        .value("lamina_store_measured_timestamp_seconds", &[])
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        measured > now - 600.0 && measured <= now,
        "{measured} vs {now}"
    );

    f.api.remove("v1").unwrap();
    f.api.remove("p2").unwrap();
    let page = scrape(&f.address);
    assert_eq!(snapshots(&page), [Some(0.0), Some(1.0), Some(0.0)]);
    assert_eq!(calls(&page, "Remove", "OK"), 2.0);
    scrape_until(&f.address, "removed containers uncounted", |page| {
        page.sum("lamina_containers", &[("owner", "containerd")]) == 0.0
    });

    // One debug line per call, with its method, code and duration.
    let total = page.sum("lamina_snapshots_calls_total", &[]);
    let log = f.daemon.store.with_extension("daemon.log");
    wait_until("a log line for every call", || {
        log_lines(&log, "snapshots call").len() as f64 >= total
    });
    let lines = log_lines(&log, "snapshots call");
    assert_eq!(lines.len() as f64, total, "{lines:?}");
    let stat = &lines[0]["fields"];
    assert_eq!(
        (&stat["method"], &stat["code"]),
        (&"Stat".into(), &"NotFound".into())
    );
    assert!(stat["ms"].as_f64().is_some(), "{stat}");
}

#[test]
fn garden_containers_and_pools_show_by_kind_and_by_image() {
    let f = fixture();
    let files = sample_image(&f.fs.path().join("image"));
    let image = files.references()[0].clone();
    let lamina = Lamina::new(&f.daemon.store);
    let top = lamina.run(&["pull", &image]).json()["top_chain_id"]
        .as_str()
        .unwrap()
        .to_string();
    lamina.create_with(&["--strategy", "classic"], &image, "g1");
    let fill = [
        "pool",
        "fill",
        &image,
        "--size",
        "2",
        "--strategy",
        "pooled",
    ];
    assert_eq!(lamina.run(&fill).json()["ready"], 2);
    let page = scrape_until(&f.address, "g1 counted", |page| {
        page.value(
            "lamina_containers",
            &[("owner", "garden"), ("provider", "fresh")],
        ) == Some(1.0)
    });
    let pools = &page.family("lamina_pool_slots").unwrap().samples;
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(pools[0].labels["image"], top);
    assert_eq!(pools[0].value, 2.0);
    let pool = pools[0].labels["pool"].clone();
    assert_eq!(
        page.value(
            "lamina_pool_target_slots",
            &[("pool", &pool), ("image", &top)]
        ),
        Some(2.0)
    );
    // A claim takes a slot; the daemon's refill puts one back.
    lamina.create_with(&["--strategy", "pooled"], &image, "g2");
    scrape_until(&f.address, "g2 counted as pooled", |page| {
        page.value(
            "lamina_containers",
            &[("owner", "garden"), ("provider", "pooled")],
        ) == Some(1.0)
    });
    scrape_until(&f.address, "the pool refilled", |page| {
        page.value("lamina_pool_slots", &[("pool", &pool), ("image", &top)]) == Some(2.0)
    });
    lamina.run(&["pool", "drain"]).json();
    lamina.delete_and_assert_gone("g1", "metrics");
    lamina.delete_and_assert_gone("g2", "metrics");
}

/// A child process killed (SIGKILL) and reaped on drop, however the test ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits at most `limit` for `child` to exit; its status, or none if it still runs.
/// The daemon's reaper tries a deleted container it cannot tear down (a process is still
/// in its rootfs) again after 1 s, then 2 s, 4 s…, not on every pass of its loop (ten a
/// second): each try walks the container's upper. Once the process is gone, a reaper
/// removes it.
#[test]
fn the_daemons_reaper_waits_longer_each_time_a_busy_container_stays() {
    let f = fixture();
    let image = sample_image(&f.fs.path().join("image")).references()[0].clone();
    let lamina = Lamina::new(&f.daemon.store);
    let rootfs = lamina.create_with(&["--strategy", "deferred"], &image, "busy");
    std::fs::write(rootfs.join("written"), "x").unwrap();
    let busy = std::fs::File::open(rootfs.join("written")).unwrap();
    assert_eq!(lamina.run(&["delete", "busy"]).code, 0);
    let log = f.daemon.store.with_extension("daemon.log");
    let tries = || log_lines(&log, "reaper left a container in trash").len();
    wait_until("the daemon's reaper trying the busy container", || {
        tries() >= 1
    });
    // Tried again after 1 s and 3 s: three tries at most (thirty-five every 100 ms).
    std::thread::sleep(Duration::from_millis(3500));
    let tried = tries();
    assert!(tried <= 3, "tried {tried} times in 3.5 s");
    assert_eq!(lamina.entries("trash"), 1);

    drop(busy);
    let reaped = lamina.run(&["reap"]).json();
    assert_eq!(reaped["failed"], 0, "{reaped}");
    assert_eq!(lamina.entries("trash"), 0);
}

fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_daemon_without_containerd_serves_the_store_s_metrics() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    Lamina::init(&store);
    let log = dir.path().join("daemon.log");
    let mut daemon = Killed(
        Command::new(binary())
            .arg("--store")
            .arg(&store)
            .args(["daemon", "--metrics-address", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let address = metrics_address(&log);
    let page = scrape(&address);
    assert_eq!(page.value("lamina_reaper_backlog_entries", &[]), Some(0.0));
    assert!(page.family("lamina_pool_slots").is_some());
    assert!(
        page.family("lamina_snapshots").is_none(),
        "no snapshotter, no snapshots"
    );
    assert!(exit_within(&mut daemon.0, Duration::ZERO).is_none());
}

#[test]
fn a_taken_metrics_address_fails_the_start_naming_it() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let socket = dir.path().join("lamina.sock");
    let mut daemon = Killed(
        Command::new(binary())
            .arg("--store")
            .arg(dir.path().join("store"))
            .args(["daemon", "--containerd-socket"])
            .arg(&socket)
            .args(["--metrics-address", &address])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = exit_within(&mut daemon.0, Duration::from_secs(60))
        .expect("the daemon exits when its metrics address is taken");
    assert!(!status.success());
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut daemon.0.stdout.take().unwrap(), &mut stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stdout}");
    assert!(
        lines[0].contains(&format!("metrics address {address}")),
        "{stdout}"
    );
    assert!(!socket.exists(), "nothing served");
    drop(taken);
}
