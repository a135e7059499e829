//! lamina's benchmark scenarios: each reproduces one kernel stall on the classic path and
//! measures the strategies that exist for it, in the same run, on stores of their own
//! (loop-backed ext4 and xfs). `benches/scenarios.rs` runs them; `benches/run-all` runs
//! everything and regenerates docs/benchmarks.md.
//!
//! Why a harness of our own next to criterion: the stalls are tail latencies of single
//! operations inside a storm (one delete among ten in parallel), and criterion measures
//! the mean of repeated identical iterations. The scenarios time every operation and
//! report median, p99 and max; criterion keeps the micro-benchmarks (`create_delete`).

// A benchmark that cannot set up must stop loudly, not measure something else.
#![allow(clippy::unwrap_used)]

pub mod containerd_rig;
pub mod criterion_table;
pub mod host;
pub mod images;
pub mod order;
pub mod overlay_proxy;
pub mod pressure;
pub mod report;
pub mod rig;
pub mod scenarios;
pub mod stats;
