//! The scenarios, one module per stall (S1–S5) plus import, process-per-call and scale.
//! Each takes the run's [`Ctx`] and returns its tables; sizes come from the mode, so the
//! CI smoke pass runs exactly the code the full run does, only smaller.

use std::sync::OnceLock;
use std::time::Instant;

use lamina_integration::FsKind;

use crate::report::Table;

mod composefs;
mod copy_up;
mod density;
mod import;
mod isolated;
mod permission;
mod process;
mod process_grootfs;
mod publish;
mod reclaim;
mod scale;
mod teardown;

/// Full sizes (the documented run) or tiny ones (CI: proves every scenario executes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Smoke,
    Full,
}

impl Mode {
    /// `full` in a full run, `smoke` otherwise.
    pub fn pick<T>(self, full: T, smoke: T) -> T {
        match self {
            Mode::Full => full,
            Mode::Smoke => smoke,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Ctx {
    pub mode: Mode,
    pub filesystems: Vec<FsKind>,
}

pub type Scenario = fn(&Ctx) -> Vec<Table>;

/// Every scenario by the name `--only` takes, in run order.
pub const ALL: &[(&str, Scenario)] = &[
    ("s1-teardown", teardown::run),
    ("s1-publish", publish::run),
    ("s2-reclaim", reclaim::run),
    ("s3-copy-up", copy_up::run),
    ("s4-density", density::run),
    ("s5-permission", permission::run),
    ("import", import::run),
    ("process", process::run),
    ("scale", scale::run),
    ("isolated", isolated::run),
    ("composefs", composefs::run),
];

/// Prints a progress line with the time since the run started, so a long run is never
/// silent.
pub fn progress(message: &str) {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = START.get_or_init(Instant::now);
    eprintln!("[{:>7.1}s] {message}", start.elapsed().as_secs_f64());
}
