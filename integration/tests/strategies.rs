//! One conformance suite, run under every strategy and each combination that makes
//! sense: runc boots the merged image (contents, whiteouts, opaque dirs, setuid,
//! hardlinks), containers are isolated from each other, read-only ones refuse writes,
//! delete leaves no mount and no file once the reaper is done, and `clean` recovers what
//! a crash leaves. Each strategy's mount is also checked for what it promises.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use lamina_integration::proof::{BASE_EXPECTED, EXPECTED, SCRIPT, fstype, super_options};
use lamina_integration::scratch::mounts_under;
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root, sample_image, wait_until};

/// The sample's references: [oci layout (2 layers), ..., rootfs.tar (1 layer)].
const TWO_LAYERS: usize = 0;
const ONE_LAYER: usize = 3;

struct Case {
    /// `--strategy` value, or "" for the default (auto).
    strategy: &'static str,
    flags: &'static [&'static str],
    image: usize,
}

const fn case(strategy: &'static str, flags: &'static [&'static str], image: usize) -> Case {
    Case {
        strategy,
        flags,
        image,
    }
}

const CASES: &[Case] = &[
    case("classic", &[], TWO_LAYERS),
    case("metacopy", &[], TWO_LAYERS),
    case("volatile", &[], TWO_LAYERS),
    case("metacopy,volatile", &[], TWO_LAYERS),
    case("deferred", &[], TWO_LAYERS),
    case("volatile,deferred", &[], TWO_LAYERS),
    case("pooled", &[], TWO_LAYERS),
    case("pooled,metacopy,volatile,deferred", &[], TWO_LAYERS),
    case("isolated", &[], TWO_LAYERS),
    case("isolated-memory", &[], TWO_LAYERS),
    case("isolated,metacopy,volatile", &[], TWO_LAYERS),
    case("pooled,isolated", &[], TWO_LAYERS),
    case("", &[], TWO_LAYERS),
    case("", &["--ephemeral"], TWO_LAYERS),
    case("", &["--disk-limit-size-bytes", "67108864"], TWO_LAYERS),
    case("classic", &["--read-only"], TWO_LAYERS),
    case("shared-ro", &[], TWO_LAYERS),
    case("shared-ro", &[], ONE_LAYER),
    case("direct", &[], TWO_LAYERS),
    case("direct", &[], ONE_LAYER),
    case("", &["--read-only"], TWO_LAYERS),
    case("", &["--read-only"], ONE_LAYER),
    case("composefs", &[], TWO_LAYERS),
    case("composefs", &[], ONE_LAYER),
    case("composefs,volatile,deferred", &[], TWO_LAYERS),
    case("composefs", &["--read-only"], TWO_LAYERS),
    case("composefs,isolated-memory", &[], TWO_LAYERS),
    case("pooled,composefs", &[], TWO_LAYERS),
];

impl Case {
    fn name(&self) -> String {
        let strategy = if self.strategy.is_empty() {
            "auto"
        } else {
            self.strategy
        };
        format!("{strategy} {} image#{}", self.flags.join(" "), self.image)
    }

    fn args<'a>(&'a self, image: &'a str, id: &'a str) -> Vec<&'a str> {
        let mut args = vec!["create"];
        if !self.strategy.is_empty() {
            args.extend(["--strategy", self.strategy]);
        }
        args.extend(self.flags);
        args.extend([image, id]);
        args
    }
}

fn record(lamina: &Lamina, id: &str) -> serde_json::Value {
    lamina_integration::records::rootfs_of(&lamina.store, id)
}

/// What `auto` must pick, given what the probe found.
fn expected_auto(case: &Case, probe: &serde_json::Value) -> Option<String> {
    if !case.strategy.is_empty() {
        return None;
    }
    if case.flags.contains(&"--read-only") {
        let kind = if case.image == ONE_LAYER {
            "direct"
        } else {
            "shared-ro"
        };
        return Some(format!("{kind},deferred"));
    }
    let mut names = Vec::new();
    if case.flags.contains(&"--disk-limit-size-bytes") {
        names.push("isolated");
    }
    if probe["metacopy"] == true {
        names.push("metacopy");
    }
    if case.flags.contains(&"--ephemeral") {
        names.push("volatile");
    }
    names.push("deferred");
    Some(names.join(","))
}

fn assert_isolated_or_read_only(case: &str, read_only: bool, a: &Path, b: &Path) {
    let written = std::fs::write(a.join("host-write.txt"), "a");
    if read_only {
        let err = written.expect_err(case);
        assert_eq!(
            err.raw_os_error(),
            Some(30),
            "{case}: EROFS expected: {err}"
        );
    } else {
        written.unwrap();
        assert!(
            !b.join("host-write.txt").exists(),
            "{case}: B sees A's write"
        );
    }
}

/// Rewrites `links N` lines with N >= 2 to `links 2`.
fn at_least_two_links(stdout: &str) -> String {
    stdout
        .lines()
        .map(
            |line| match line.strip_prefix("links ").map(str::parse::<u64>) {
                Some(Ok(n)) if n >= 2 => "links 2".to_string(),
                _ => line.to_string(),
            },
        )
        .map(|line| line + "\n")
        .collect()
}

#[test]
fn every_strategy_passes_the_conformance_suite_and_boots_in_runc() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let references = files.references();
    let probe = lamina.run(&["probe"]).json();

    for (i, case) in CASES.iter().enumerate() {
        let name = case.name();
        let image = references[case.image].as_str();
        if case.strategy.contains("pooled") {
            let fill = [
                "pool",
                "fill",
                image,
                "--size",
                "2",
                "--strategy",
                case.strategy,
            ];
            assert_eq!(lamina.run(&fill).json()["ready"], 2, "{name}");
        }
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        let spec = lamina.run(&case.args(image, &a)).json();
        lamina.run(&case.args(image, &b)).json();
        let (rootfs_a, rootfs_b) = (lamina.rootfs(&a), lamina.rootfs(&b));
        let rec = record(&lamina, &a);
        let strategy = rec["strategy"].as_str().unwrap().to_string();
        let read_only = rec["read_only"] == true;
        assert_eq!(
            spec["root"]["readonly"] == true,
            read_only,
            "{name}: root.readonly printed for, and only for, read-only rootfs: {spec}"
        );
        if let Some(expected) = expected_auto(case, &probe) {
            assert_eq!(strategy, expected, "{name}: auto's choice");
        }

        // What each strategy promises about its mount.
        let options = super_options(&rootfs_a).unwrap_or_else(|| panic!("{name}: not mounted"));
        let kind = fstype(&rootfs_a).unwrap();
        // composefs's files are metacopy inodes: it always mounts with metacopy on.
        assert_eq!(
            options.contains("metacopy=on"),
            strategy.contains("metacopy") || strategy.contains("composefs"),
            "{name}: {options}"
        );
        if strategy.contains("composefs") {
            assert_eq!(
                options.matches("lowerdir").count(),
                1,
                "{name}: one lower (the metadata image) whatever the layers: {options}"
            );
            let objects = lamina.store.join("objects");
            assert!(
                options.contains(&format!("datadir+={},", objects.display())),
                "{name}: the store's objects as the data-only lower: {options}"
            );
        }
        assert_eq!(
            options.contains("volatile"),
            strategy.contains("volatile"),
            "{name}: {options}"
        );
        if strategy.contains("pooled") {
            assert!(
                options.contains("/tmp/pool-"),
                "{name}: mounted ahead of time as a pool slot: {options}"
            );
        }
        if strategy.contains("shared-ro") {
            let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
            assert_eq!(
                dev(&rootfs_a),
                dev(&rootfs_b),
                "{name}: one shared superblock"
            );
            assert_eq!(kind, "overlay", "{name}");
        }
        if strategy.contains("direct") {
            assert_eq!(kind, "ext4", "{name}: no overlay in the path");
        }
        if strategy.contains("isolated") {
            let upper_fs = |id: &str| lamina.store.join("images").join(id).join("upperfs");
            let want = if strategy.contains("isolated-memory") {
                "tmpfs"
            } else {
                "ext4"
            };
            assert_eq!(fstype(&upper_fs(&a)).as_deref(), Some(want), "{name}");
            assert!(
                options.contains("/upperfs/upper,"),
                "{name}: upper on its own filesystem: {options}"
            );
            let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
            assert_ne!(
                dev(&upper_fs(&a)),
                dev(&upper_fs(&b)),
                "{name}: a superblock per container"
            );
        }

        let bundle = Bundle::new(&rootfs_a, read_only);
        let run_id = format!("lamina-conf-{i}-{}", std::process::id());
        let write = if read_only {
            "; echo x > /new.txt 2>/dev/null && echo WROTE || echo refused"
        } else {
            "; /bin/busybox chmod 600 /etc/hosts && echo written > /new.txt && echo wrote"
        };
        let out = bundle.run(&run_id, &format!("{SCRIPT}{write}"));
        let tail = if read_only { "refused\n" } else { "wrote\n" };
        let merged = if case.image == ONE_LAYER {
            BASE_EXPECTED
        } else {
            EXPECTED
        };
        let expected = format!("{merged}{tail}");
        // A flattened tree (direct) links the layers' own inodes, so once one exists in
        // the store, every view of those layers — overlays included — shows the higher
        // link counts (docs/strategies.md, direct). Hardlinks must still be hardlinks.
        let stdout = at_least_two_links(&out.stdout);
        assert_eq!(
            (out.code, stdout.as_str()),
            (0, expected.as_str()),
            "{name}: {}",
            out.stderr
        );
        assert!(out.stdout.ends_with(tail), "{name}: {out:?}");
        drop(bundle);
        assert_isolated_or_read_only(&name, read_only, &rootfs_a, &rootfs_b);
        if !read_only {
            assert!(
                !rootfs_b.join("new.txt").exists(),
                "{name}: B sees A's write"
            );
        }

        lamina.delete_and_assert_gone(&a, &name);
        if case.strategy.contains("pooled") {
            // Wait for the background refill the claims started, then release the pool.
            lamina
                .run(&["pool", "fill", image, "--strategy", case.strategy])
                .json();
            lamina.run(&["pool", "drain"]).json();
        }
        lamina.delete_and_assert_gone(&b, &name);
        assert!(
            lamina.entries("shared") <= 1,
            "{name}: shared mounts left (only `empty` may stay)"
        );
    }
}

#[test]
fn clean_recovers_crash_leftovers_under_every_kind_of_rootfs() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = &files.references()[TWO_LAYERS];

    for (i, strategy) in [
        "classic",
        "metacopy,volatile",
        "deferred",
        "shared-ro",
        "direct",
        "isolated",
        "isolated-memory,volatile",
    ]
    .iter()
    .enumerate()
    {
        let (doomed, half) = (format!("d{i}"), format!("h{i}"));
        lamina.create_with(&["--strategy", strategy], image, &doomed);
        lamina.create_with(&["--strategy", strategy], image, &half);
        // A create that crashed after mounting, before writing its record.
        let half_record = lamina
            .store
            .join("images")
            .join(&half)
            .join("container.json");
        std::fs::remove_file(half_record).unwrap();
        // A delete that crashed after moving the container to trash, before teardown.
        let trash = lamina.store.join("trash").join(format!("{doomed}.crashed"));
        std::fs::rename(lamina.store.join("images").join(&doomed), &trash).unwrap();

        let report = lamina.run(&["clean"]).json();
        assert_eq!(report["reaped"], 1, "{strategy}: {report}");
        assert_eq!(report["crashed_creates"], 1, "{strategy}: {report}");
        assert!(
            mounts_under(&lamina.store).is_empty(),
            "{strategy}: {:?}",
            mounts_under(&lamina.store)
        );
        for dir in ["images", "trash"] {
            assert_eq!(lamina.entries(dir), 0, "{strategy}: {dir}/ not empty");
        }
        lamina.wait_loop_devices_released(strategy);
    }
}

#[test]
fn the_background_reaper_finishes_a_deferred_delete_on_its_own() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let rootfs = lamina.create_with(
        &["--strategy", "volatile,deferred"],
        &files.references()[0],
        "r",
    );
    std::fs::write(rootfs.join("big.bin"), vec![7u8; 8 << 20]).unwrap();
    let out = lamina.run(&["delete", "r"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        !rootfs.exists(),
        "gone from its public path when delete returns"
    );
    wait_until("the reaper", || lamina.entries("trash") == 0);
    assert!(mounts_under(&lamina.store).is_empty());
    let log = std::fs::read_to_string(lamina.store.join("run/background.log")).unwrap_or_default();
    // lager's lines (the default format): 2 is error, 3 fatal.
    for line in log.lines() {
        let entry: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(entry["log_level"].as_u64() < Some(2), "{log}");
    }
}

#[test]
fn unbuildable_requests_are_refused_with_the_reason() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = &files.references()[0];

    let rootfs = lamina.create_with(&["--ephemeral", "--strategy", "classic"], image, "eph");
    assert!(super_options(&rootfs).unwrap().contains("volatile"));
    lamina.delete_and_assert_gone("eph", "ephemeral");

    for (list, expect) in [
        ("fast", "unknown strategy `fast`"),
        ("direct,volatile", "no upper for `volatile`"),
        ("auto,deferred", "does not combine"),
    ] {
        let out = lamina.run(&["create", "--strategy", list, image, "x"]);
        assert_eq!(out.code, 1, "{out:?}");
        assert!(out.stdout.contains(expect), "{out:?}");
    }
    // tmpfs has no trusted xattrs for metacopy's copy-up check.
    let probe = lamina.run(&["probe"]).json();
    if probe["metacopy"] == false {
        let out = lamina.run(&["create", "--strategy", "metacopy", image, "x"]);
        assert!(
            out.stdout.contains("strategy metacopy is not available"),
            "{out:?}"
        );
    }
    assert!(!lamina.store.join("images/x").exists());
    assert!(mounts_under(&lamina.store).is_empty());
}

#[test]
fn the_daemon_reaps_deletes_and_refills_pools_as_tasks() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = &files.references()[0];
    let fill = ["pool", "fill", image, "--size", "1", "--strategy", "pooled"];
    assert_eq!(lamina.run(&fill).json()["ready"], 1);

    let mut daemon = std::process::Command::new(lamina_integration::lamina::binary())
        .args([
            "--store",
            lamina.store.to_str().unwrap(),
            "--log-level",
            "warn",
            "daemon",
        ])
        .arg("--interval-ms=50")
        .spawn()
        .unwrap();
    // Two claims from a pool of one: the daemon (or the CLI's own refill) restores it.
    let slots = |l: &Lamina| -> usize {
        std::fs::read_dir(l.store.join("pool"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| std::fs::read_dir(e.path()).unwrap().count())
            .sum()
    };
    lamina.create_with(&["--strategy", "pooled,deferred"], image, "p");
    lamina.run(&["delete", "p"]).ok();
    wait_until("the daemon's reaping and refill", || {
        lamina.entries("trash") == 0 && slots(&lamina) >= 1
    });
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    assert!(!lamina.store.join("images/p").exists());
    let report = lamina.run(&["clean"]).json();
    assert_eq!(report["pool_released"], 0, "ready slots stay: {report}");
    assert_eq!(lamina.run(&["pool", "drain"]).json()["released"], 1);
    assert!(mounts_under(&lamina.store).is_empty());
}
