//! The criterion micro-benchmark's table, read back from criterion's own output
//! (`<dir>/create-delete/<case>/new/estimates.json`), so `run-all` regenerates it with
//! the scenario tables.

use std::path::Path;

use crate::report::Table;
use crate::stats::{human, ratio};

/// criterion's group for `benches/create_delete.rs`.
pub const GROUP: &str = "create-delete";
/// The baseline case: the same overlay mounted and unmounted with bare syscalls.
pub const KERNEL_FLOOR: &str = "kernel-floor";

/// (case id, `--strategy` list, read-only) for each strategy measured.
pub const CASES: &[(&str, &str, bool)] = &[
    ("classic", "classic", false),
    ("metacopy", "metacopy", false),
    ("volatile", "volatile", false),
    ("deferred", "deferred", false),
    ("pooled", "pooled", false),
    ("auto", "auto", false),
    ("classic-read-only", "classic", true),
    ("shared-ro", "shared-ro", true),
    ("direct", "direct", true),
];

pub fn create_delete(dir: &Path) -> Result<Table, String> {
    let mut table = Table::new(
        "create-delete",
        &["case", "median", "95% interval", "vs kernel floor"],
    );
    let floor = median(dir, KERNEL_FLOOR)?;
    let ids = std::iter::once(KERNEL_FLOOR).chain(CASES.iter().map(|c| c.0));
    for id in ids {
        let (m, lo, hi) = median(dir, id)?;
        table.row(vec![
            format!("`{id}`"),
            human(m),
            format!("{} – {}", human(lo), human(hi)),
            ratio(m, floor.0),
        ]);
    }
    Ok(table)
}

type Estimate = (
    std::time::Duration,
    std::time::Duration,
    std::time::Duration,
);

fn median(dir: &Path, id: &str) -> Result<Estimate, String> {
    let path = dir.join(GROUP).join(id).join("new/estimates.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let m = &json["median"];
    let ns = |v: &serde_json::Value| {
        v.as_f64()
            .map(|n| std::time::Duration::from_nanos(n as u64))
            .ok_or(format!("{}: no median estimate", path.display()))
    };
    Ok((
        ns(&m["point_estimate"])?,
        ns(&m["confidence_interval"]["lower_bound"])?,
        ns(&m["confidence_interval"]["upper_bound"])?,
    ))
}
