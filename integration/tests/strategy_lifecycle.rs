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
        .find(|v| v["fields"]["message"] == "created rootfs")
        .map(|v| {
            v["fields"]["strategy"]
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

    // The default fill makes overlays of auto's flavor; `pooled` alone means classic ones.
    assert_eq!(lamina.run(&["pool", "fill", "--size", "1", &image]).code, 0);
    let out = create(&lamina, &["--strategy", "pooled"], &image, "named");
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
