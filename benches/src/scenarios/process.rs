//! Process per call: `lamina create` and `lamina delete` as separate processes, the way
//! Garden calls an image plugin, on a warm image. Includes process start, store open,
//! (for `auto`) reading the cached probe, and printing the runtime spec.

use std::time::Instant;

use lamina_integration::{Lamina, wait_until};

use super::{Ctx, progress};
use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human};

pub fn run(ctx: &Ctx) -> Vec<Table> {
    let calls = ctx.mode.pick(100, 3);
    let mut table = Table::new(
        "process",
        &[
            "fs",
            "strategy",
            "calls",
            "create p50",
            "create p99",
            "delete p50",
            "delete p99",
            "create+delete p50 vs classic",
        ],
    );
    for &kind in &ctx.filesystems {
        let rig = Rig::new(kind, 512);
        let reference = crate::images::sample(&rig.scratch("image"));
        rig.warm(&reference);
        let lamina = Lamina::new(rig.store.root());
        let mut classic = None;
        for strategy in ["classic", "auto"] {
            progress(&format!("process {} {strategy} × {calls}", rig.fs_name()));
            // The first auto create probes the store's filesystem; that is a one-off
            // per boot, not a per-call cost.
            lamina.create_with(&["--strategy", strategy], &reference, "warmup");
            lamina.run(&["delete", "warmup"]);
            let mut creates = Samples::new();
            let mut deletes = Samples::new();
            for i in 0..calls {
                let id = format!("p-{i}");
                let t = Instant::now();
                lamina.create_with(&["--strategy", strategy], &reference, &id);
                creates.push(t.elapsed());
                let t = Instant::now();
                let out = lamina.run(&["delete", &id]);
                deletes.push(t.elapsed());
                assert_eq!(out.code, 0, "delete {id}: {out:?}");
            }
            // `auto` deletes are deferred to a detached `lamina reap`.
            wait_until("background reaper", || rig.no_trace());
            let (c, d) = (creates.summary(), deletes.summary());
            let both = c.p50 + d.p50;
            let base = *classic.get_or_insert(both);
            table.row(vec![
                rig.fs_name().into(),
                format!("`{strategy}`"),
                calls.to_string(),
                human(c.p50),
                human(c.p99),
                human(d.p50),
                human(d.p99),
                crate::stats::ratio(both, base),
            ]);
        }
    }
    vec![table]
}
