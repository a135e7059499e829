//! The daemon's Prometheus metrics: `lamina daemon --metrics-address HOST:PORT` serves
//! `GET /metrics` in the Prometheus text exposition format (version 0.0.4), encoded by
//! `prometheus-client`. docs/containerd.md ("Metrics") lists every metric.
//!
//! Two sorts of number:
//! - What the daemon did since it started — calls of the snapshots service and the layers
//!   its commits imported — is counted as it happens (`Activity`: atomics that commits
//!   and the gRPC server's tower layer, `observe.rs`, bump).
//! - What the store holds — snapshots, containers, pools, trash, bytes — is read from the
//!   store when scraped (`StoreCollector`), never mirrored in memory, so a `lamina
//!   create`, `delete` or `clean` run beside the daemon shows too. Most are one query or
//!   a readdir. Two cost a walk: the store's bytes (`du` of the whole store) and the
//!   containers by kind (every container's record read), so each is measured off the
//!   scrape, at most once per [`STORE_BYTES_MAX_AGE`] / [`CONTAINERS_MAX_AGE`], and a
//!   scrape serves the last measurement (`Measured`): a scrape never waits on a walk
//!   that could take minutes on a large store, and scraping often walks no more.

use std::net::TcpListener;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use lamina_store::Store;

use crate::Snapshotter;

/// How old the store's bytes may be before a scrape has them measured again.
pub const STORE_BYTES_MAX_AGE: Duration = Duration::from_secs(60);
/// How old the containers by kind may be before a scrape has them counted again.
pub const CONTAINERS_MAX_AGE: Duration = Duration::from_secs(5);

/// Upper bounds of the call duration buckets, in seconds: from a Stat (well under a
/// millisecond) to a Prepare that formats an isolated upper or a Cleanup that collects
/// many layers (seconds).
const CALL_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A call of the snapshots service, by method and gRPC status code.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CallLabels {
    pub(crate) method: &'static str,
    pub(crate) code: &'static str,
}

/// The method a duration was of.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct MethodLabels {
    pub(crate) method: &'static str,
}

type Durations = Family<MethodLabels, Histogram, fn() -> Histogram>;

fn call_histogram() -> Histogram {
    Histogram::new(CALL_BUCKETS)
}

/// What a snapshotter did since it was opened, counted as it happens. Cheap to clone:
/// every clone counts into the same atomics.
#[derive(Debug, Clone)]
pub(crate) struct Activity {
    pub(crate) calls: Family<CallLabels, Counter>,
    pub(crate) durations: Durations,
    /// Layers a commit published into the store (containerd's unpacks, mostly).
    pub(crate) layer_imports: Counter,
    /// Their bytes, as the layer records them (the allocated size of the committed upper).
    pub(crate) imported_bytes: Counter,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            calls: Family::default(),
            durations: Family::new_with_constructor(call_histogram as fn() -> Histogram),
            layer_imports: Counter::default(),
            imported_bytes: Counter::default(),
        }
    }
}

impl Activity {
    /// One call of `method` that ended with `code`, after `elapsed`.
    pub(crate) fn call(&self, method: &'static str, code: &'static str, elapsed: Duration) {
        self.calls.get_or_create(&CallLabels { method, code }).inc();
        self.durations
            .get_or_create(&MethodLabels { method })
            .observe(elapsed.as_secs_f64());
    }

    /// A layer of `bytes` published into the store.
    pub(crate) fn imported(&self, bytes: u64) {
        self.layer_imports.inc();
        self.imported_bytes.inc_by(bytes);
    }
}

/// Everything `/metrics` shows, for one store and, when the daemon serves containerd,
/// its snapshotter.
#[derive(Debug)]
pub struct Exporter {
    registry: Registry,
}

impl Exporter {
    pub fn new(store: Store, snapshotter: Option<Snapshotter>) -> Exporter {
        let mut registry = Registry::with_prefix("lamina");
        if let Some(snapshotter) = &snapshotter {
            let activity = snapshotter.activity.clone();
            registry.register(
                "snapshots_calls",
                "Calls of the containerd snapshots service, by method and gRPC status code",
                activity.calls,
            );
            registry.register_with_unit(
                "snapshots_call_duration",
                "How long calls of the containerd snapshots service took, until their answer's headers, by method",
                Unit::Seconds,
                activity.durations,
            );
            registry.register(
                "layer_imports",
                "Layers the snapshots service's commits published into the store",
                activity.layer_imports,
            );
            registry.register_with_unit(
                "layer_imported",
                "Bytes of the layers the snapshots service's commits published into the store",
                Unit::Bytes,
                activity.imported_bytes,
            );
        }
        registry.register_collector(Box::new(StoreCollector {
            store,
            snapshotter,
            store_bytes: Measured::new(STORE_BYTES_MAX_AGE),
            containers: Measured::new(CONTAINERS_MAX_AGE),
        }));
        Exporter { registry }
    }

    /// The metrics as Prometheus text, read now. Blocks on the store (queries, readdirs,
    /// statfs): call it off an async runtime's workers.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
        {
            // Only a formatter error, which writing to a String never returns.
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        text
    }
}

/// A value measured off the caller's thread, at most once per `max_age`: [`Measured::get`]
/// answers the last measurement at once (none before the first has finished) and, if it
/// is older than `max_age` and none is running, starts the next. Started only by a get,
/// so a daemon nobody scrapes walks nothing.
#[derive(Debug)]
struct Measured<T> {
    max_age: Duration,
    state: Arc<Mutex<MeasuredState<T>>>,
}

#[derive(Debug)]
struct MeasuredState<T> {
    /// The last value and when it was measured.
    value: Option<(T, SystemTime)>,
    /// When the last measurement ended; one running has not finished.
    ended: Option<Instant>,
    running: bool,
}

impl<T: Clone + Send + 'static> Measured<T> {
    fn new(max_age: Duration) -> Self {
        Measured {
            max_age,
            state: Arc::new(Mutex::new(MeasuredState {
                value: None,
                ended: None,
                running: false,
            })),
        }
    }

    /// The last value, starting `measure` on a thread of its own if it is due. A failed
    /// measurement keeps the last value and is tried again `max_age` later, not on every
    /// scrape.
    fn get(
        &self,
        what: &'static str,
        measure: impl FnOnce() -> Result<T, String> + Send + 'static,
    ) -> Option<(T, SystemTime)> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // From the end of the last one: a walk longer than `max_age` (a big store) is not
        // followed straight away by the next.
        let due = !state.running && state.ended.is_none_or(|s| s.elapsed() >= self.max_age);
        if due {
            state.running = true;
            let shared = self.state.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("metrics-{what}"))
                .spawn(move || {
                    // Marks the measurement over however it ends, a panic included.
                    let over = Over(shared.clone());
                    let measured = measure();
                    drop(over);
                    let mut state = shared.lock().unwrap_or_else(PoisonError::into_inner);
                    match measured {
                        Ok(value) => state.value = Some((value, SystemTime::now())),
                        Err(e) => tracing::warn!(error = %e, "measuring {what} for metrics failed"),
                    }
                });
            if let Err(e) = spawned {
                state.running = false;
                tracing::warn!(error = %e, "could not start measuring {what} for metrics");
            }
        }
        state.value.clone()
    }
}

/// Ends a measurement in its state when dropped.
struct Over<T>(Arc<Mutex<MeasuredState<T>>>);

impl<T> Drop for Over<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        state.running = false;
        state.ended = Some(Instant::now());
    }
}

/// The containers in `images/`, each by who made it and its rootfs's provider.
type ContainerCounts = Vec<((&'static str, &'static str), u64)>;

/// Reads what the store holds on each scrape (see the module's comment).
#[derive(Debug)]
struct StoreCollector {
    store: Store,
    snapshotter: Option<Snapshotter>,
    store_bytes: Measured<u64>,
    containers: Measured<ContainerCounts>,
}

/// A gauge's samples: labels and value.
type Samples<V = u64> = Vec<(Vec<(&'static str, String)>, V)>;

/// Writes one gauge family; none at all if `samples` could not be read (the scrape
/// shows the metric missing rather than a made-up zero).
fn gauge<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    samples: Option<Samples<V>>,
) -> Result<(), std::fmt::Error> {
    let Some(samples) = samples else {
        return Ok(());
    };
    let mut metric = encoder.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, value) in &samples {
        metric.encode_family(labels)?.encode_gauge(value)?;
    }
    Ok(())
}

/// `result`'s value, or none, logged, if reading it failed.
fn read<T, E: std::fmt::Display>(what: &str, result: Result<T, E>) -> Option<T> {
    result
        .map_err(|e| tracing::warn!(error = %e, "reading {what} for metrics failed"))
        .ok()
}

fn one<V>(value: V) -> Samples<V> {
    vec![(Vec::new(), value)]
}

impl StoreCollector {
    fn snapshots(&self) -> Option<Samples> {
        let snapshotter = self.snapshotter.as_ref()?;
        let counts = read("snapshots", snapshotter.index().count_by_kind())?;
        Some(
            counts
                .iter()
                .map(|(kind, n)| (vec![("kind", kind.as_str().to_string())], *n))
                .collect(),
        )
    }

    fn containers(&self) -> Option<Samples> {
        let store = self.store.clone();
        let (counts, _) = self.containers.get("containers", move || {
            count_containers(&store).map_err(|e| e.to_string())
        })?;
        Some(
            counts
                .into_iter()
                .map(|((owner, provider), n)| {
                    let labels = vec![
                        ("owner", owner.to_string()),
                        ("provider", provider.to_string()),
                    ];
                    (labels, n)
                })
                .collect(),
        )
    }

    fn pools(&self) -> (Samples, Samples) {
        let (mut slots, mut targets) = (Vec::new(), Vec::new());
        for pool in lamina_mount::pool::depths(&self.store) {
            let labels = vec![
                ("pool", pool.name),
                (
                    "image",
                    pool.image.map(|d| d.to_string()).unwrap_or_default(),
                ),
            ];
            if let Some(target) = pool.target {
                targets.push((labels.clone(), target as u64));
            }
            slots.push((labels, pool.slots as u64));
        }
        (slots, targets)
    }
}

/// Counts the containers in `images/` by who made them (`containerd`: a snapshot's;
/// `garden`: `lamina create`'s) and by their rootfs's provider; a container whose record
/// cannot be read counts under provider `unreadable`.
fn count_containers(store: &Store) -> Result<ContainerCounts, lamina_store::StoreError> {
    let scan = lamina_mount::record::scan(store)?;
    let mut counts: std::collections::BTreeMap<(&'static str, &'static str), u64> =
        Default::default();
    for container in &scan.containers {
        let owner = if crate::snapshotter::is_snapshot_container(container) {
            "containerd"
        } else {
            "garden"
        };
        *counts
            .entry((owner, container.model().provider.name()))
            .or_default() += 1;
    }
    for bad in &scan.bad {
        let owner = if bad.id.starts_with(crate::snapshotter::CONTAINER_PREFIX) {
            "containerd"
        } else {
            "garden"
        };
        *counts.entry((owner, "unreadable")).or_default() += 1;
    }
    Ok(counts.into_iter().collect())
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        gauge(
            &mut encoder,
            "snapshots",
            "containerd snapshots in the store, by kind.",
            None,
            self.snapshots(),
        )?;
        gauge(
            &mut encoder,
            "containers",
            &format!(
                "Containers in the store's images/, by who made them (containerd, garden) and their rootfs's provider; counted at most every {} s.",
                CONTAINERS_MAX_AGE.as_secs()
            ),
            None,
            self.containers(),
        )?;
        let store = self.store.clone();
        let bytes = self.store_bytes.get("store bytes", move || {
            store.usage().map_err(|e| e.to_string())
        });
        gauge(
            &mut encoder,
            "store",
            &format!(
                "Bytes the store uses on its filesystem, as du -x counts them; measured at most every {} s, off the scrape.",
                STORE_BYTES_MAX_AGE.as_secs()
            ),
            Some(Unit::Bytes),
            bytes.as_ref().map(|(b, _)| one(*b)),
        )?;
        gauge(
            &mut encoder,
            "store_measured_timestamp",
            "When lamina_store_bytes was measured, in seconds since the epoch.",
            Some(Unit::Seconds),
            bytes.as_ref().map(|(_, at)| {
                one(at
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64()))
            }),
        )?;
        let fs = read(
            "the store's filesystem",
            rustix::fs::statvfs(self.store.root()),
        );
        gauge(
            &mut encoder,
            "store_filesystem_size",
            "Size of the filesystem the store is on.",
            Some(Unit::Bytes),
            fs.as_ref()
                .map(|fs| one(fs.f_blocks.saturating_mul(fs.f_frsize))),
        )?;
        gauge(
            &mut encoder,
            "store_filesystem_available",
            "Bytes of the store's filesystem available to unprivileged users.",
            Some(Unit::Bytes),
            fs.as_ref()
                .map(|fs| one(fs.f_bavail.saturating_mul(fs.f_frsize))),
        )?;
        let (slots, targets) = self.pools();
        gauge(
            &mut encoder,
            "pool_slots",
            "Slots in each pool (pre-mounted overlays, or bare upper filesystems), by pool and image top chain ID.",
            None,
            Some(slots),
        )?;
        gauge(
            &mut encoder,
            "pool_target_slots",
            "The size each pool's target asks refills to restore.",
            None,
            Some(targets),
        )?;
        let trash = read("the trash", self.store.trash_entries());
        gauge(
            &mut encoder,
            "reaper_backlog_entries",
            "Deleted containers in trash/ waiting for the reaper to unmount and remove them.",
            None,
            trash.map(|t| one(t.len() as u64)),
        )?;
        Ok(())
    }
}

/// Binds the metrics address now, so a daemon whose address is taken or malformed fails
/// at start, naming it.
pub fn bind(address: &str) -> Result<TcpListener, crate::ServeError> {
    let fail = |source| crate::ServeError::Metrics {
        address: address.to_string(),
        source,
    };
    // An IP and a port, not a name: a name would be looked up through NSS, which a static
    // binary can do only with the glibc it was built against (docs/security.md).
    let parsed: std::net::SocketAddr = address.parse().map_err(|_| {
        fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an IP address and port (e.g. 127.0.0.1:9464 or [::1]:9464)",
        ))
    })?;
    let listener = TcpListener::bind(parsed).map_err(fail)?;
    listener.set_nonblocking(true).map_err(fail)?;
    Ok(listener)
}

/// Serves `exporter` on `listener` from a thread of its own, for the life of the process.
pub fn spawn(listener: TcpListener, exporter: Exporter) -> Result<(), crate::ServeError> {
    let address = listener
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let fail = |source| crate::ServeError::Metrics {
        address: address.clone(),
        source,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(fail)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener).map_err(fail)?
    };
    tracing::info!(address = %address, "serving metrics at /metrics");
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(crate::metrics_http::serve(listener, Arc::new(exporter))))
        .map_err(fail)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activity_counts_calls_by_method_and_code_and_imports() {
        let activity = Activity::default();
        let mut registry = Registry::with_prefix("lamina");
        registry.register("snapshots_calls", "Calls", activity.calls.clone());
        registry.register_with_unit(
            "snapshots_call_duration",
            "Durations",
            Unit::Seconds,
            activity.durations.clone(),
        );
        registry.register("layer_imports", "Imports", activity.layer_imports.clone());
        registry.register_with_unit(
            "layer_imported",
            "Bytes",
            Unit::Bytes,
            activity.imported_bytes.clone(),
        );
        activity.call("Prepare", "OK", Duration::from_millis(3));
        activity.call("Prepare", "OK", Duration::from_millis(40));
        activity.call("Stat", "NotFound", Duration::from_micros(100));
        activity.imported(4096);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        for line in [
            "# TYPE lamina_snapshots_calls_total counter",
            "lamina_snapshots_calls_total{method=\"Prepare\",code=\"OK\"} 2",
            "lamina_snapshots_calls_total{method=\"Stat\",code=\"NotFound\"} 1",
            "# TYPE lamina_snapshots_call_duration_seconds histogram",
            "lamina_snapshots_call_duration_seconds_bucket{method=\"Prepare\",le=\"0.005\"} 1",
            "lamina_snapshots_call_duration_seconds_bucket{method=\"Prepare\",le=\"0.05\"} 2",
            "lamina_snapshots_call_duration_seconds_bucket{method=\"Prepare\",le=\"+Inf\"} 2",
            "lamina_snapshots_call_duration_seconds_count{method=\"Prepare\"} 2",
            "lamina_layer_imports_total 1",
            "lamina_layer_imported_bytes_total 4096",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }

    #[test]
    fn a_measurement_runs_off_the_caller_at_most_once_per_max_age() {
        let measured: Measured<u64> = Measured::new(Duration::from_secs(3600));
        let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let counted = runs.clone();
        // The first get starts a measurement and answers nothing yet: it does not wait.
        assert!(
            measured
                .get("test", move || {
                    rx.recv().ok();
                    Ok(counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 7)
                })
                .is_none()
        );
        tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let value = loop {
            if let Some((value, _)) = measured.get("test", || Ok(99)) {
                break value;
            }
            assert!(Instant::now() < deadline, "the measurement never finished");
            std::thread::sleep(Duration::from_millis(10));
        };
        // Gets within max_age answer the first measurement and start no other.
        assert_eq!(value, 7);
        assert_eq!(measured.get("test", || Ok(99)).map(|(v, _)| v), Some(7));
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
