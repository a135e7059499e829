//! A TCP proxy on 127.0.0.1 that adds a round-trip delay and counts the bytes it
//! carries back: how the lazy-pulling bench puts a registry "far away". This kernel has
//! no `sch_netem` (`CONFIG_NET_SCH_NETEM` is not set), so the delay is a delay line in
//! userspace: each direction holds every read for half the round trip before writing it
//! on, without holding back the reads behind it (latency, not a bandwidth cap), so a
//! request and its answer cost one round trip more, as on a network with that RTT.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running proxy; it stops accepting when dropped (connections open stay until closed).
#[derive(Debug)]
pub struct DelayProxy {
    /// `127.0.0.1:PORT`, to give as the registry's host.
    pub host: String,
    /// Bytes carried from the registry to its clients so far.
    fetched: Arc<AtomicU64>,
}

impl DelayProxy {
    /// Proxies to `upstream` (`host:port`) with `rtt` added to every round trip.
    pub fn start(upstream: &str, rtt: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the delay proxy");
        let host = listener.local_addr().expect("its address").to_string();
        let fetched = Arc::new(AtomicU64::new(0));
        let (upstream, counter) = (upstream.to_string(), fetched.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let half = rtt / 2;
                let (c2, s2) = (
                    client.try_clone().expect("a clone"),
                    server.try_clone().expect("a clone"),
                );
                delay_line(client, server, half, None);
                delay_line(s2, c2, half, Some(counter.clone()));
            }
        });
        DelayProxy { host, fetched }
    }

    /// Bytes carried from the registry so far.
    pub fn fetched(&self) -> u64 {
        self.fetched.load(Ordering::Relaxed)
    }
}

/// Copies `from` to `to`, each read written `delay` after it arrived; counts the bytes
/// in `count`.
fn delay_line(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    count: Option<Arc<AtomicU64>>,
) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
            if let Some(count) = &count {
                count.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
