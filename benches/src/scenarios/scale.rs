//! Scale: create latency as live rootfs accumulate (10, 100, 1000: every mount lamina
//! makes lengthens the mount table the kernel and lamina walk), and an image of 200
//! layers (one `lowerdir+` per layer, so no option-string limit).

use std::time::Instant;

use lamina_image::Image;

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};

const STRATEGIES: &[&str] = &["classic", "auto"];

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let live_counts = ctx.mode.pick(vec![10, 100, 1000], vec![2, 4]);
    let samples = ctx.mode.pick(50, 3);
    let layers = ctx.mode.pick(200, 5);
    let mut live_table = Table::new(
        "scale-live",
        &[
            "fs",
            "strategy",
            "live rootfs",
            "create p50",
            "create p99",
            "p50 vs fewest live",
        ],
    );
    let mut layers_table = Table::new(
        "scale-layers",
        &[
            "fs",
            "strategy",
            "layers",
            "import",
            "create p50",
            "create p99",
            "p50 vs classic",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 2048);
        let image = rig.warm(&crate::images::sample(&rig.scratch("image")));
        for strategy in STRATEGIES {
            let mut first = None;
            let mut live = 0;
            for &count in &live_counts {
                progress(&format!(
                    "scale {} {strategy} with {count} live",
                    rig.fs_name()
                ));
                while live < count {
                    rig.create(&image, &format!("live-{live}"), strategy, false);
                    live += 1;
                }
                let s = timed_creates(&rig, &image, strategy, samples).summary();
                let base = *first.get_or_insert(s.p50);
                live_table.row(vec![
                    rig.fs_name().into(),
                    format!("`{strategy}`"),
                    count.to_string(),
                    human(s.p50),
                    human(s.p99),
                    ratio(s.p50, base),
                ]);
            }
            rig.delete_all();
        }

        progress(&format!("scale {} {layers}-layer image", rig.fs_name()));
        let reference = crate::images::many_layers(&rig.scratch("layers"), layers);
        let image = crate::images::resolve(&reference);
        let t = Instant::now();
        rig.store.import(&image).unwrap();
        let import = t.elapsed();
        let mut classic = None;
        for strategy in STRATEGIES {
            let s = timed_creates(&rig, &image, strategy, samples).summary();
            let base = *classic.get_or_insert(s.p50);
            layers_table.row(vec![
                rig.fs_name().into(),
                format!("`{strategy}`"),
                layers.to_string(),
                human(import),
                human(s.p50),
                human(s.p99),
                ratio(s.p50, base),
            ]);
        }
    }
    vec![live_table, layers_table]
}

/// `n` timed creates, each deleted (untimed) before the next, so the live count holds.
fn timed_creates(rig: &Rig, image: &Image, strategy: &str, n: usize) -> Samples {
    let samples = (0..n)
        .map(|i| {
            let id = format!("timed-{i}");
            let t = rig.timed_create(image, &id, strategy, false);
            rig.delete(&id);
            t
        })
        .collect();
    rig.reap_all();
    samples
}
