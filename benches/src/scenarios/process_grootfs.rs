//! Process per call against GrootFS, the image plugin lamina replaces: the same rootfs tar
//! (how Cloud Foundry hands Garden its stack), `create` and `delete` as separate
//! processes, interleaved call by call with `/bin/true` and with lamina's `classic` and
//! `auto`, on one XFS filesystem (GrootFS's overlay driver wants XFS). `auto`'s delete is
//! a rename into `trash/`; its reaper's teardown is waited out before the next round, so
//! it never runs beside a timed call.
//!
//! Runs when `GROOTFS_BIN` names a GrootFS binary (its `tardis` beside it, as GrootFS's
//! release installs them); `scripts/grootfs-suite` builds one from GrootFS's source.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::report::Table;
use crate::rig::Rig;
use crate::stats::{Samples, human, ratio};

/// The GrootFS comparison table, when `GROOTFS_BIN` is set and `rig` is XFS.
pub fn table(rig: &Rig, lamina: &Path, calls: usize) -> Option<Table> {
    let grootfs = PathBuf::from(std::env::var_os("GROOTFS_BIN")?);
    if rig.fs_name() != "xfs" {
        return None;
    }
    let tar = lamina_integration::sample_image(&rig.scratch("grootfs-image")).rootfs_tar;
    let tar = tar.display().to_string();
    let grootfs_store = rig.scratch("grootfs-store");
    let path = match (grootfs.parent(), std::env::var_os("PATH")) {
        (Some(dir), Some(path)) => {
            let mut dirs = vec![dir.to_path_buf()];
            dirs.extend(std::env::split_paths(&path));
            std::env::join_paths(dirs).expect("PATH")
        }
        _ => std::env::var_os("PATH").unwrap_or_default(),
    };
    let groot = |args: &[&str]| {
        let mut command = Command::new(&grootfs);
        command
            .env("PATH", &path)
            .arg("--store")
            .arg(&grootfs_store)
            .args(args);
        command
    };
    let lamina_call = |args: &[&str]| {
        let mut command = Command::new(lamina);
        command.arg("--store").arg(rig.store.root()).args(args);
        command
    };
    must(groot(&["init-store"]));
    // Warm: each plugin has imported the tar once before the timed calls.
    must(groot(&["create", &tar, "warm"]));
    must(groot(&["delete", "warm"]));
    for strategy in ["classic", "auto"] {
        must(lamina_call(&[
            "create",
            "--strategy",
            strategy,
            &tar,
            "warm",
        ]));
        must(lamina_call(&["delete", "warm"]));
    }
    let mut spawns = Samples::new();
    let mut times: [Samples; 6] = Default::default();
    // `auto` defers its teardown to a reaper: it is waited out before the next round, so
    // it never runs beside another plugin's timed call.
    let trash_empty = || {
        lamina_integration::wait_until("the reaper to empty trash", || {
            rig.store.trash_entries().is_ok_and(|t| t.is_empty())
        })
    };
    for i in 0..calls {
        trash_empty();
        spawns.push(timed(Command::new("/bin/true")));
        let id = format!("g-{i}");
        times[0].push(timed(groot(&["create", &tar, &id])));
        times[1].push(timed(groot(&["delete", &id])));
        for (n, strategy) in ["classic", "auto"].into_iter().enumerate() {
            let id = format!("{strategy}-{i}");
            times[2 + 2 * n].push(timed(lamina_call(&[
                "create",
                "--strategy",
                strategy,
                &tar,
                &id,
            ])));
            times[3 + 2 * n].push(timed(lamina_call(&["delete", &id])));
        }
    }
    lamina_integration::wait_until("background reaper", || rig.no_trace());
    let p50: Vec<Duration> = times.iter().map(|t| t.summary().p50).collect();
    let spawn = spawns.summary().p50;
    let own = |d: Duration| human(d.saturating_sub(spawn));
    let mut table = Table::new(
        "process-grootfs",
        &[
            "fs",
            "image",
            "calls",
            "`/bin/true` p50",
            "GrootFS create / delete p50",
            "`classic` create / delete p50",
            "`auto` create / delete p50 (delete: a rename; the reaper's teardown is not timed)",
            "create+delete vs GrootFS: `classic` / `auto`",
            "lamina's own part (p50 − `/bin/true`), create / delete: `classic`; `auto`",
        ],
    );
    table.row(vec![
        rig.fs_name().into(),
        "rootfs tar".into(),
        calls.to_string(),
        human(spawn),
        format!("{} / {}", human(p50[0]), human(p50[1])),
        format!("{} / {}", human(p50[2]), human(p50[3])),
        format!("{} / {}", human(p50[4]), human(p50[5])),
        format!(
            "{} / {}",
            ratio(p50[2] + p50[3], p50[0] + p50[1]),
            ratio(p50[4] + p50[5], p50[0] + p50[1])
        ),
        format!(
            "{} / {}; {} / {}",
            own(p50[2]),
            own(p50[3]),
            own(p50[4]),
            own(p50[5])
        ),
    ]);
    Some(table)
}

/// Runs `command` to success, its output captured.
fn must(mut command: Command) {
    let out = command.output().expect("running a plugin");
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One call, spawned as Garden spawns a plugin (stdout and stderr captured), timed to its
/// exit; it must succeed.
fn timed(mut command: Command) -> Duration {
    let t = Instant::now();
    let out = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("running a plugin");
    let elapsed = t.elapsed();
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    elapsed
}
