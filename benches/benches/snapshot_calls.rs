//! What one read-only snapshot call costs: Stat and Mounts of one active snapshot, through
//! containerd 1.6 and straight on each proxy's own socket, lamina against containerd's
//! overlayfs snapshotter served as a proxy plugin like lamina (`overlayfs-proxy`, the same
//! gRPC hop; full runs only, where a Go toolchain can build it). Calls alternate between
//! the snapshotters in a balanced sequence, so all see the same host. What the container
//! cycle's Mounts step (`containerd_scale`) is made of, without the cycle's syncs around
//! it.
//!
//! `cargo bench -p lamina-benches --bench snapshot_calls`; another build's daemon with
//! `LAMINA_BIN=<its lamina>`. Under `cargo test` it runs a few calls against the
//! built-in overlayfs, to prove it still runs. Needs root and Debian's containerd.

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use lamina_benches::containerd_rig::{self, OVERLAY_PROXY, top_layer};
use lamina_benches::order::{balanced_count, balanced_sequence};
use lamina_benches::stats::Samples;
use lamina_integration::snapshotter::{Api, labels};
use lamina_integration::{ScratchFs, require_root};

const NAMESPACE: &str = "calls";
const KEY: &str = "calls-active";

fn main() {
    require_root();
    let full = std::env::args().any(|a| a == "--bench");
    let calls = if full { 2000 } else { 3 };
    let fs = ScratchFs::ext4(1024);
    let (daemon, proxy, ctd) = containerd_rig::start_for_run(full, &fs, NAMESPACE);
    // Who is measured, how it is reached, and the snapshot's key there.
    let mut subjects: Vec<(String, Api, String)> = Vec::new();
    let baseline = match &proxy {
        Some(_) => OVERLAY_PROXY,
        None => "overlayfs",
    };
    for name in [baseline, "lamina"] {
        let api = Api::via_containerd(&ctd.socket, name, NAMESPACE);
        let parent = top_layer(&api);
        api.prepare(KEY, &parent, labels(&[("containerd.io/gc.root", "bench")]))
            .unwrap();
        subjects.push((format!("`{name}` via containerd"), api, KEY.to_string()));
    }
    let own: Vec<(&str, &Path)> = match &proxy {
        Some(proxy) => vec![
            (OVERLAY_PROXY, proxy.socket.as_path()),
            ("lamina", daemon.socket.as_path()),
        ],
        None => vec![("lamina", daemon.socket.as_path())],
    };
    for (name, socket) in own {
        // containerd's key for the snapshot there ends with the key it was given.
        let api = Api::connect(socket);
        let key = api
            .list(&["kind==active"])
            .unwrap()
            .into_iter()
            .find(|k| k.ends_with(&format!("/{KEY}")))
            .unwrap();
        subjects.push((format!("`{name}` on its own socket"), api, key));
    }

    let mut stat = vec![Samples::new(); subjects.len()];
    let mut mounts = vec![Samples::new(); subjects.len()];
    // Each call of each subject follows every other equally often, Stat and Mounts alike.
    let kinds = subjects.len() * 2;
    let calls = balanced_count(kinds, calls);
    for &call in balanced_sequence(kinds).iter().cycle().take(calls * kinds) {
        let (_, api, key) = &subjects[call / 2];
        match call % 2 {
            0 => stat[call / 2].push(timed(|| drop(api.stat(key).unwrap()))),
            _ => mounts[call / 2].push(timed(|| drop(api.mounts(key).unwrap()))),
        }
    }

    println!("| snapshotter | calls | Stat p50 | Mounts p50 | Mounts − Stat |");
    println!("|---|---|---|---|---|");
    for (i, (name, _, _)) in subjects.iter().enumerate() {
        let (s, m) = (stat[i].summary().p50, mounts[i].summary().p50);
        println!(
            "| {name} | {calls} | {} | {} | {:+.0} µs |",
            us(s),
            us(m),
            (m.as_secs_f64() - s.as_secs_f64()) * 1e6
        );
    }
    for (_, api, _) in subjects.iter().take(2) {
        api.remove(KEY).unwrap();
    }
    drop(ctd);
    drop(proxy);
    drop(daemon);
}

fn timed(call: impl FnOnce()) -> Duration {
    let t = Instant::now();
    call();
    t.elapsed()
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}
