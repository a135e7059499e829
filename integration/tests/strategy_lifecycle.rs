//! Where a strategy meets a lifecycle step (issue 21's defects, each found by using the CLI
//! as an operator would): a read-only container stays read-only across `unmount` and
//! `mount`; a strategy the operator names is honoured or refused with a clear error, never
//! silently replaced; `auto` with a disk limit claims from a pool filled for that limit.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;

use lamina_integration::scratch::mounts_under;
use lamina_integration::{Lamina, Output, ScratchFs, require_root, sample_image};

fn setup(fs: &ScratchFs) -> (Lamina, String) {
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    (lamina, image)
}

/// The strategy the `created rootfs` log line reports.
fn created_strategy(out: &Output) -> String {
    out.stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "lamina.create.created rootfs")
        .map(|v| {
            v["data"]["strategy"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_else(|| panic!("no `created rootfs` line: {out:?}"))
}

fn create(lamina: &Lamina, flags: &[&str], image: &str, id: &str) -> Output {
    let mut args = vec!["--log-level", "info", "create"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[image, id]);
    lamina.run(&args)
}

#[test]
fn a_read_only_container_comes_back_read_only_after_unmount_and_mount() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, image) = setup(&fs);
    for strategy in ["classic", "metacopy", "shared-ro", "direct"] {
        let id = format!("ro-{strategy}");
        let rootfs = lamina.create_with(&["--read-only", "--strategy", strategy], &image, &id);
        for step in ["unmount", "mount"] {
            let out = lamina.run(&[step, &id]);
            assert_eq!(out.code, 0, "{strategy} {step}: {out:?}");
        }
        let err = fs::write(rootfs.join("etc/written"), "x").unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::ROFS.raw_os_error()),
            "{strategy}: {err}"
        );
        lamina.delete_and_assert_gone(&id, strategy);
    }
}

#[test]
fn a_named_pooled_strategy_is_served_from_its_pool_or_refused() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, image) = setup(&fs);

    // The default fill makes overlays of auto's flavour, which a named `pooled` claims.
    assert_eq!(lamina.run(&["pool", "fill", "--size", "1", &image]).code, 0);
    let out = create(&lamina, &["--strategy", "pooled"], &image, "filled");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(created_strategy(&out).contains("pooled"), "{out:?}");
    lamina.delete_and_assert_gone("filled", "pooled");

    // No pool of that flavour was filled: refused, and nothing of it is left.
    let out = create(&lamina, &["--strategy", "pooled,volatile"], &image, "named");
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("has no slot ready"), "{}", out.stdout);
    assert!(!lamina.store.join("images/named").exists());

    let out = create(
        &lamina,
        &["--read-only", "--strategy", "pooled"],
        &image,
        "ro",
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.contains("does not combine with --read-only"),
        "{}",
        out.stdout
    );

    let filled = lamina.run(&[
        "pool",
        "fill",
        "--size",
        "1",
        "--strategy",
        "pooled",
        &image,
    ]);
    assert_eq!(filled.code, 0, "{filled:?}");
    let out = create(&lamina, &["--strategy", "pooled"], &image, "named");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(created_strategy(&out).contains("pooled"), "{out:?}");

    lamina.delete_and_assert_gone("named", "pooled");
    assert_eq!(lamina.run(&["pool", "drain"]).code, 0);
    assert!(mounts_under(&lamina.store).is_empty());
}

#[test]
fn auto_with_a_disk_limit_claims_from_a_pool_filled_for_that_limit() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, image) = setup(&fs);
    let limit = "67108864";
    let filled = lamina.run(&[
        "pool",
        "fill",
        "--size",
        "1",
        "--strategy",
        "pooled,isolated",
        "--disk-limit-size-bytes",
        limit,
        &image,
    ]);
    assert_eq!(filled.code, 0, "{filled:?}");
    let out = create(
        &lamina,
        &["--disk-limit-size-bytes", limit],
        &image,
        "limited",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let strategy = created_strategy(&out);
    assert!(
        strategy.contains("pooled"),
        "claimed from the pool: {strategy}"
    );
    lamina.delete_and_assert_gone("limited", "limited");
    assert_eq!(lamina.run(&["pool", "drain"]).code, 0);
    assert!(mounts_under(&lamina.store).is_empty());
}

/// `chattr FLAG PATH`, which must succeed.
fn chattr(flag: &str, path: &std::path::Path) {
    let ok = std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "chattr {flag} {}", path.display());
}

/// Whether a `lamina ... reap` of `store` runs (the background reaper a deferred delete
/// starts), by the command lines in /proc.
fn background_reaper_running(store: &std::path::Path) -> bool {
    let store = store.to_string_lossy();
    fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        args.iter().any(|a| a == "reap") && args.iter().any(|a| *a == store)
    })
}

#[test]
fn check_repair_says_repaired_only_when_a_pending_delete_is_gone() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let (lamina, image) = setup(&fs);
    let rootfs = lamina.create_with(&["--strategy", "deferred"], &image, "stuck");
    fs::write(rootfs.join("etc/pinned"), "x").unwrap();
    let pinned = lamina.store.join("images/stuck/upper/etc/pinned");
    chattr("+i", &pinned);
    assert_eq!(lamina.run(&["delete", "stuck"]).code, 0);
    let reaped = lamina.run(&["reap"]).json();
    assert_eq!(reaped["failed"], 1, "{reaped}");
    let pinned_in_trash = fs::read_dir(lamina.store.join("trash"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("upper/etc/pinned");

    // The reaper `delete` started in the background may not have run yet (under load it
    // can start after the `reap` above): while it holds its lock, its queue is in flight,
    // which check does not report. Wait for it to end.
    lamina_integration::wait_until("the background reaper to end", || {
        !background_reaper_running(&lamina.store)
    });
    let report = lamina.run(&["check", "--repair"]);
    assert_eq!(report.code, 1, "{report:?}");
    let json: serde_json::Value = serde_json::from_str(&report.stdout).unwrap();
    assert_eq!(json["ok"], false, "{json}");
    let pending: Vec<_> = json["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "pending_delete")
        .collect();
    assert_eq!(pending.len(), 1, "{json}");
    assert_eq!(pending[0]["repaired"], false, "{json}");

    chattr("-i", &pinned_in_trash);
    let json = lamina.run(&["check", "--repair"]).json();
    assert_eq!(json["ok"], true, "{json}");
    assert_eq!(lamina.entries("trash"), 0);
}

#[test]
fn clean_keeps_the_standing_order_of_a_pool_whose_slots_all_went() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, image) = setup(&fs);
    assert_eq!(lamina.run(&["pool", "fill", "--size", "1", &image]).code, 0);
    // A host restart takes the slot's mount: `clean` removes the stale slot, emptying the
    // pool, but the operator still wants one ready.
    let slots = mounts_under(&lamina.store.join("pool"));
    assert_eq!(slots.len(), 1, "{slots:?}");
    let ok = std::process::Command::new("umount")
        .arg(&slots[0])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let report = lamina.run(&["clean"]).json();
    assert_eq!(report["pool_released"], 1, "{report}");
    let refill = lamina.run(&["pool", "refill"]).json();
    assert_eq!(refill["added"], 1, "the pool is still wanted: {refill}");
    assert_eq!(lamina.run(&["pool", "drain"]).code, 0);
    assert!(mounts_under(&lamina.store).is_empty());
}

/// A drain that meets a fill in flight (a refill after a claim, or an operator's fill)
/// waits for it and leaves nothing: no slot the fill adds outlives the drain, and no
/// standing order is left for a later refill.
#[test]
fn a_drain_waits_for_a_fill_in_flight_and_leaves_nothing() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let (lamina, image) = setup(&fs);
    assert_eq!(lamina.run(&["pool", "fill", "--size", "1", &image]).code, 0);
    // A fill to two that stops with its slot made, not yet in the pool.
    let mut fill = lamina
        .command(&["pool", "fill", "--size", "2", &image])
        .env("LAMINA_PAUSE_AT", "pool-slot-made")
        .env("LAMINA_PAUSE_SECS", "2")
        .spawn()
        .unwrap();
    let run = lamina.store.join("run");
    lamina_integration::wait_until("the fill to stop at its pause point", || {
        fs::read_dir(&run).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("paused-pool-slot-made")
        })
    });
    assert_eq!(lamina.run(&["pool", "drain"]).code, 0);
    assert!(fill.wait().unwrap().success());
    let left: Vec<_> = fs::read_dir(lamina.store.join("pool"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left after the drain: {left:?}");
    assert_eq!(lamina.run(&["pool", "refill"]).code, 0);
    assert!(
        fs::read_dir(lamina.store.join("pool"))
            .unwrap()
            .next()
            .is_none()
    );
    assert!(mounts_under(&lamina.store).is_empty());
}
