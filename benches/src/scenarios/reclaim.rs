//! S2 create under reclaim: create latency while the host is idle and while it reclaims
//! memory hard (proved by /proc/vmstat's pgscan counters rising during the measurement).
//! Mounting allocates a superblock and registers a shrinker; before 6.7 that waited on
//! kswapd for seconds. `pooled` claims an overlay mounted ahead of time instead.

use std::time::Duration;

use lamina_image::Image;
use lamina_mount::Flavour;
use lamina_mount::pool::{self, PoolKind};

use super::{Ctx, progress};
use crate::host;
use crate::pressure::MemoryPressure;
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let creates = ctx.mode.pick(300, 5);
    // Full: leave 3 GiB and cycle an 8 GiB file through it. Smoke: a token load.
    let headroom = ctx.mode.pick(3u64 << 30, u64::MAX);
    let file = ctx.mode.pick(8u64 << 30, 64 << 20);
    // The token load may never reach reclaim; do not wait for it.
    let settle = ctx.mode.pick(Duration::from_secs(10), Duration::ZERO);
    let mut table = Table::new(
        "s2-reclaim",
        &[
            "fs",
            "host",
            "strategy",
            "creates",
            "create p50",
            "create p99",
            "max",
            "p99 vs classic",
            "pages scanned by reclaim meanwhile",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 1024);
        let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
        for under_pressure in [false, true] {
            let _pressure = under_pressure.then(|| {
                progress(&format!("S2 {}: building memory pressure", rig.fs_name()));
                MemoryPressure::start(&rig.scratch("pressure"), headroom, file, settle)
            });
            let mut classic_p99 = None;
            for strategy in ["classic", "pooled"] {
                progress(&format!(
                    "S2 {} {} {strategy}",
                    rig.fs_name(),
                    if under_pressure { "reclaiming" } else { "idle" }
                ));
                if strategy == "pooled" {
                    let kind = PoolKind::overlays(&image.chain_ids(), Flavour::PLAIN, None);
                    pool::fill(&rig.store, &rig.mounter, &kind, Some(creates)).unwrap();
                }
                let scanned_before = host::pgscan();
                let latencies = batch(&rig, &image, strategy, creates);
                let scanned = host::pgscan() - scanned_before;
                rig.delete_all();
                let s = latencies.summary();
                let base = *classic_p99.get_or_insert(s.p99);
                table.row(vec![
                    rig.fs_name().into(),
                    if under_pressure { "reclaiming" } else { "idle" }.into(),
                    format!("`{strategy}`"),
                    s.n.to_string(),
                    human(s.p50),
                    human(s.p99),
                    human(s.max),
                    ratio(s.p99, base),
                    scanned.to_string(),
                ]);
            }
        }
    }
    vec![table]
}

fn batch(rig: &Rig, image: &Image, strategy: &str, n: usize) -> Samples {
    (0..n)
        .map(|i| rig.timed_create(image, &format!("s2-{i}"), strategy, false))
        .collect()
}
