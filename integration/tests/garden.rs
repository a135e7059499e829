//! Garden's image-plugin contract through the binary: `stats`, `capacity`, `clean` with a
//! threshold and `create --with-clean`, uid/gid-mapped stores booted in a user namespace
//! by runc, and locking between separate processes (including a killed one).

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use lamina_integration::{Bundle, Lamina, ScratchFs, require_root, sample_image, wait_until};

/// A store on a fresh loop-backed ext4, the sample image (two layers) and its base layer
/// alone as a rootfs tar (sharing that layer).
fn setup(fs: &ScratchFs, init: &[&str]) -> (Lamina, String, String) {
    let refs = sample_image(&fs.path().join("image")).references();
    let lamina = Lamina::new(&fs.path().join("store"));
    let mut args = vec!["init-store"];
    args.extend_from_slice(init);
    let out = lamina.run(&args);
    assert_eq!(out.code, 0, "{out:?}");
    (lamina, refs[0].clone(), refs[3].clone())
}

fn layers(lamina: &Lamina) -> usize {
    lamina.entries("layers")
}

/// The uncompressed sizes import recorded for a container's layers.
fn image_bytes(lamina: &Lamina, id: &str) -> u64 {
    let record = lamina_integration::records::record_json(
        &lamina.store.join("images").join(id).join("container.json"),
    );
    record["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|chain| {
            let hex = chain.as_str().unwrap().trim_start_matches("sha256:");
            let layer: serde_json::Value = serde_json::from_slice(
                &std::fs::read(lamina.store.join("layers").join(hex).join("layer.json")).unwrap(),
            )
            .unwrap();
            layer["size"].as_u64().unwrap()
        })
        .sum()
}

#[test]
fn stats_reports_what_the_container_wrote_on_top_of_its_image() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image, _) = setup(&fs, &[]);
    let limit = ["--disk-limit-size-bytes", "67108864"];
    let rootfs = lamina.create_with(&limit, &image, "limited");
    let plain = lamina.create(&image, "plain");

    let before = lamina.run(&["stats", "limited"]).json();
    std::fs::write(rootfs.join("written"), vec![1u8; 3 << 20]).unwrap();
    std::fs::write(plain.join("written"), vec![1u8; 1 << 20]).unwrap();

    let stats = lamina.run(&["stats", "limited"]).json();
    let usage = &stats["disk_usage"];
    let exclusive = usage["exclusive_bytes_used"].as_u64().unwrap();
    let before_exclusive = before["disk_usage"]["exclusive_bytes_used"]
        .as_u64()
        .unwrap();
    assert!(exclusive >= before_exclusive + (3 << 20), "{stats}");
    assert_eq!(
        usage["total_bytes_used"].as_u64().unwrap(),
        exclusive + image_bytes(&lamina, "limited"),
        "{stats}"
    );
    // An inclusive limit: what is left of it once the image is counted.
    let image = image_bytes(&lamina, "limited");
    assert_eq!(usage["quota_size_bytes"], 67108864 - image, "{stats}");
    assert_eq!(usage["committed_space_bytes"], 67108864, "{stats}");

    // By rootfs path too (Garden passes either), and no quota without a limit.
    let by_path = lamina.run(&["stats", plain.to_str().unwrap()]).json();
    let plain_exclusive = by_path["disk_usage"]["exclusive_bytes_used"]
        .as_u64()
        .unwrap();
    assert!((1 << 20..3 << 20).contains(&plain_exclusive), "{by_path}");
    assert_eq!(by_path["disk_usage"]["quota_size_bytes"], 0, "{by_path}");
    assert_eq!(
        by_path["disk_usage"]["committed_space_bytes"],
        image_bytes(&lamina, "plain"),
        "{by_path}"
    );

    let missing = lamina.run(&["stats", "nope"]);
    assert_eq!(missing.code, 1);
    assert!(
        missing.stdout.contains("`nope`") && !missing.stdout.contains('\n'),
        "{missing:?}"
    );
    lamina.delete_and_assert_gone("limited", "stats");
    lamina.delete_and_assert_gone("plain", "stats");
}

/// A container that nests its directories 20 000 deep costs `stats`, `clean
/// --threshold-bytes` and its own delete nothing more than time (guards against walks
/// and removals that cost a call a level, and a removal that overflows the stack and
/// aborts).
#[test]
fn a_container_nesting_twenty_thousand_directories_is_measured_and_deleted() {
    use rustix::fs::{Mode, OFlags};
    require_root();
    let fs = ScratchFs::ext4(1024);
    let (lamina, image, _) = setup(&fs, &[]);
    let rootfs = lamina.create(&image, "deep");
    let mut at = rustix::fs::open(&rootfs, OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..20_000 {
        rustix::fs::mkdirat(&at, "d", Mode::from_raw_mode(0o755)).unwrap();
        at = rustix::fs::openat(&at, "d", OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
    drop(at);
    let stats = lamina.run(&["stats", "deep"]);
    assert_eq!(stats.code, 0, "{stats:?}");
    let written = stats.json()["disk_usage"]["exclusive_bytes_used"]
        .as_u64()
        .unwrap();
    assert!(written >= 20_000 * 4096, "{stats:?}");
    let clean = lamina.run(&["clean", "--threshold-bytes", "1"]);
    assert_eq!(clean.code, 0, "{clean:?}");
    lamina.delete_and_assert_gone("deep", "a deep tree");
}

#[test]
fn capacity_comes_from_config_then_init_store_then_the_filesystem() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let (lamina, _, _) = setup(&fs, &["--store-size-bytes", "123456789"]);
    assert_eq!(
        lamina.run(&["capacity"]).json(),
        serde_json::json!({ "capacity": 123456789 })
    );
    let config = fs.path().join("config.yml");
    std::fs::write(&config, "init:\n  store_size_bytes: 999\nunknown_key: 1\n").unwrap();
    let from_config = lamina.run(&["--config", config.to_str().unwrap(), "capacity"]);
    assert_eq!(from_config.json()["capacity"], 999);

    // Initialising again with another size is refused, naming both.
    let again = lamina.run(&["init-store", "--store-size-bytes", "5"]);
    assert_eq!(again.code, 1);
    assert!(
        again.stdout.contains("123456789") && again.stdout.contains("store size 5"),
        "{again:?}"
    );

    let bare = Lamina::init(&fs.path().join("bare"));
    let capacity = bare.run(&["capacity"]).json()["capacity"].as_u64().unwrap();
    assert!(
        (200 << 20..=256 << 20).contains(&capacity),
        "the 256 MiB filesystem's size: {capacity}"
    );
}

#[test]
fn clean_removes_unused_layers_only_past_the_threshold_and_create_can_trigger_it() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image, base) = setup(&fs, &[]);
    lamina.create(&image, "two-layers");
    lamina.create(&base, "base-only");
    lamina.delete_and_assert_gone("two-layers", "clean");
    assert_eq!(layers(&lamina), 2);

    let skipped = lamina
        .run(&["clean", "--threshold-bytes", "100000000000"])
        .json();
    assert_eq!(skipped["skipped"], true, "{skipped}");
    assert!(
        skipped["message"]
            .as_str()
            .unwrap()
            .starts_with("threshold not reached"),
        "{skipped}"
    );
    assert_eq!(layers(&lamina), 2);

    let cleaned = lamina.run(&["clean", "--threshold-bytes", "1"]).json();
    assert_eq!(cleaned["layers_removed"], 1, "{cleaned}");
    assert_eq!(layers(&lamina), 1);
    // The layer a container still uses is intact: it boots.
    let bundle = Bundle::new(&lamina.rootfs("base-only"), false);
    let out = bundle.run(
        &format!("lamina-clean-{}", std::process::id()),
        "cat /etc/hosts >/dev/null && /bin/busybox true && echo ok",
    );
    assert_eq!(out.stdout.trim(), "ok", "{out:?}");
    drop(bundle);

    // --with-clean cleans in the background after the create; a config's with_clean is
    // overridden by --without-clean.
    lamina.create(&image, "again");
    lamina.delete_and_assert_gone("again", "clean");
    let config = fs.path().join("config.yml");
    std::fs::write(
        &config,
        "create:\n  with_clean: true\nclean:\n  threshold_bytes: 1\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    lamina.create_with(&["--without-clean"], &base, "quiet");
    lamina.run(&["reap"]).ok();
    assert_eq!(layers(&lamina), 2, "--without-clean cleaned");
    let out = lamina.run(&["--config", config, "create", &base, "cleaning"]);
    assert_eq!(out.code, 0, "{out:?}");
    wait_until("the background clean after --with-clean", || {
        layers(&lamina) == 1
    });
    for id in ["base-only", "quiet", "cleaning"] {
        lamina.delete_and_assert_gone(id, "clean");
    }
}

/// Makes `store`'s ancestors searchable by the container's mapped root (temp dirs are
/// private to host root), as a Garden host's store path is.
fn open_path_to(path: &Path) {
    for dir in path.ancestors().filter(|d| d.starts_with("/tmp/")) {
        let mode = std::fs::metadata(dir).unwrap().mode();
        std::fs::set_permissions(
            dir,
            std::os::unix::fs::PermissionsExt::from_mode(mode | 0o055),
        )
        .unwrap();
    }
}

const HOST_ROOT: u32 = 100000;

/// A runc container in a user namespace (0 → 100000, 65536 ids) on a store made with
/// those mappings sees its rootfs as its own root's, and writes it.
fn boot_as_mapped_root(extra_init: &[&str]) -> (ScratchFs, Lamina, PathBuf) {
    require_root();
    let fs = ScratchFs::ext4(512);
    let mut init = vec![
        "--uid-mapping",
        "0:100000:65536",
        "--gid-mapping",
        "0:100000:65536",
    ];
    init.extend_from_slice(extra_init);
    let (lamina, image, _) = setup(&fs, &init);
    open_path_to(&lamina.store);
    let rootfs = lamina.create(&image, "mapped");
    let bundle = Bundle::new(&rootfs, false);
    bundle.in_user_namespace(HOST_ROOT, 65536);
    let out = bundle.run(
        &format!("lamina-userns-{}", std::process::id()),
        "id -u; stat -c '%u:%g' / /bin/busybox /etc/hosts; stat -c %a /usr/local/bin/suid-tool; \
         echo new > /etc/new && echo more >> /etc/hosts && mkdir /root/x && echo wrote",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines,
        ["0", "0:0", "0:0", "0:0", "4755", "wrote"],
        "the container's root owns its rootfs: {out:?}"
    );
    drop(bundle);
    let upper = lamina.store.join("images/mapped/upper");
    for written in ["etc/new", "etc/hosts", "root/x"] {
        let meta = std::fs::metadata(upper.join(written)).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (HOST_ROOT, HOST_ROOT),
            "{written} in the upper belongs to the mapped root on the host"
        );
    }
    (fs, lamina, rootfs)
}

fn a_layer_file_owner(lamina: &Lamina) -> u32 {
    let layers = std::fs::read_dir(lamina.store.join("layers")).unwrap();
    let busybox = layers
        .map(|l| l.unwrap().path().join("diff/bin/busybox"))
        .find(|p| p.exists())
        .unwrap();
    std::fs::metadata(busybox).unwrap().uid()
}

#[test]
fn a_mapped_store_idmaps_its_layers_for_a_runc_user_namespace() {
    let (fs, lamina, _) = boot_as_mapped_root(&[]);
    assert_eq!(
        a_layer_file_owner(&lamina),
        0,
        "idmapped: the layers on disk stay as the image has them"
    );
    // Mount options cannot express idmapped layers: --without-mount says so.
    let image = sample_image(&fs.path().join("image2")).references()[0].clone();
    let out = lamina.run(&["create", "--without-mount", &image, "unmounted"]);
    assert_eq!(out.code, 1);
    assert!(out.stdout.contains("--chown-layers"), "{out:?}");
    assert!(!lamina.store.join("images/unmounted").exists());
    // Re-initialising with the same mappings is fine; with others it is refused.
    assert_eq!(
        lamina
            .run(&[
                "init-store",
                "--uid-mapping",
                "0:100000:65536",
                "--gid-mapping",
                "0:100000:65536"
            ])
            .code,
        0
    );
    let other = lamina.run(&[
        "init-store",
        "--uid-mapping",
        "0:200000:1",
        "--gid-mapping",
        "0:200000:1",
    ]);
    assert_eq!(other.code, 1, "{other:?}");
    lamina.delete_and_assert_gone("mapped", "idmapped store");
}

#[test]
fn a_mapped_store_with_chowned_layers_boots_a_runc_user_namespace_too() {
    let (fs, lamina, _) = boot_as_mapped_root(&["--chown-layers"]);
    assert_eq!(
        a_layer_file_owner(&lamina),
        HOST_ROOT,
        "chowned: the layers on disk belong to the mapped root"
    );
    // The options a --without-mount caller mounts need no idmapping here.
    let image = sample_image(&fs.path().join("image2")).references()[0].clone();
    let spec = lamina
        .run(&["create", "--without-mount", &image, "unmounted"])
        .json();
    assert_eq!(spec["mounts"][0]["type"], "overlay", "{spec}");
    lamina.delete_and_assert_gone("mapped", "chowned store");
    lamina.delete_and_assert_gone("unmounted", "chowned store");
}

/// Garden reads a delete's stdout to its end, and may kill the plugin's process group
/// once it has its answer. The reaper a deferred delete starts holds none of the caller's
/// streams while it waits, lives outside the caller's process group, and reaps once it
/// can.
#[test]
fn a_deferred_delete_answers_before_its_reaper_which_outlives_the_callers_group() {
    use std::os::unix::process::CommandExt;

    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image, _) = setup(&fs, &[]);
    lamina.create(&image, "deferred");
    // The reaper's lock, held here: the reaper can only wait, the delete must not.
    let lock = std::fs::File::create(lamina.store.join("locks/reaper.lock")).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    // Released once the delete has answered, or after a while whatever happens: a reaper
    // that kept the delete's stdout open shows as a slow delete, not a test that hangs.
    let (answered_tx, answered_rx) = std::sync::mpsc::channel::<()>();
    let release = std::thread::spawn(move || {
        let _ = answered_rx.recv_timeout(std::time::Duration::from_secs(15));
        drop(lock);
    });
    let started = std::time::Instant::now();
    let delete = lamina
        .command(&["delete", "deferred"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = rustix::process::Pid::from_child(&delete);
    let out = delete.wait_with_output().unwrap();
    let answered = started.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "deleted container `deferred`",
        "{out:?}"
    );
    assert!(
        answered < std::time::Duration::from_secs(10),
        "the delete's output ended only after {answered:?}: its reaper held it"
    );
    assert_eq!(lamina.entries("trash"), 1, "deferred, and not reaped yet");
    // As Garden may: whatever is left of the caller's process group is killed.
    let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    answered_tx.send(()).unwrap();
    release.join().unwrap();
    wait_until("the reaper", || lamina.entries("trash") == 0);
    assert!(!lamina.store.join("images/deferred").exists());
}

fn lamina_process(lamina: &Lamina, args: &[&str]) -> Command {
    lamina.command(args)
}

#[test]
fn concurrent_creates_deletes_and_cleans_from_separate_processes_all_succeed() {
    require_root();
    let fs = ScratchFs::ext4(1024);
    let (lamina, image, base) = setup(&fs, &[]);
    const WORKERS: usize = 8;
    const ROUNDS: usize = 4;
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for worker in 0..WORKERS {
            let (lamina, image, base) = (&lamina, &image, &base);
            handles.push(s.spawn(move || {
                for round in 0..ROUNDS {
                    let id = format!("w{worker}-r{round}");
                    let which = if (worker + round) % 2 == 0 {
                        image
                    } else {
                        base
                    };
                    let out = lamina_process(lamina, &["create", which, &id])
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "create {id}: {out:?}");
                    let busybox = lamina.rootfs(&id).join("bin/busybox");
                    assert!(busybox.exists(), "{id}: rootfs incomplete");
                    let out = lamina_process(lamina, &["delete", &id]).output().unwrap();
                    assert!(out.status.success(), "delete {id}: {out:?}");
                }
            }));
        }
        for _ in 0..2 {
            let lamina = &lamina;
            handles.push(s.spawn(move || {
                for _ in 0..ROUNDS * 2 {
                    let out = lamina_process(lamina, &["clean", "--threshold-bytes", "0"])
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "clean: {out:?}");
                }
            }));
        }
        for handle in handles {
            handle.join().unwrap();
        }
    });
    // Every container went; whatever the reapers left, a last clean finishes, and then
    // nothing is mounted and no layer is left.
    let report = lamina.run(&["clean"]).json();
    assert_eq!(report["reap_failed"], 0, "{report}");
    assert_eq!(lamina.entries("images"), 0);
    assert!(lamina_integration::scratch::mounts_under(&lamina.store).is_empty());
    assert_eq!(layers(&lamina), 0, "{report}");
}

#[test]
fn a_clean_killed_while_it_holds_the_layers_lock_blocks_nobody() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let (lamina, image, _) = setup(&fs, &[]);
    lamina.create(&image, "old");
    lamina.delete_and_assert_gone("old", "killed clean");

    let mut clean = lamina_process(&lamina, &["clean"])
        .env("LAMINA_PAUSE_AT", "collect-locked")
        .spawn()
        .unwrap();
    let paused = lamina
        .store
        .join(format!("run/paused-collect-locked.{}", clean.id()));
    wait_until("clean to reach the layers lock", || paused.exists());
    clean.kill().unwrap();
    clean.wait().unwrap();

    // The lock died with its holder: a create goes ahead (re-importing the layers the
    // dead clean had set aside), and the next clean removes what it left in tmp/.
    let out = Command::new("timeout")
        .arg("60")
        .arg(lamina_integration::lamina::binary())
        .args([
            "--store",
            lamina.store.to_str().unwrap(),
            "create",
            &image,
            "new",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "create after a killed clean: {out:?}");
    assert!(lamina.rootfs("new").join("bin/busybox").exists());
    let report = lamina.run(&["clean"]).json();
    assert!(report["tmp_removed"].as_u64().unwrap() >= 2, "{report}");
    assert_eq!(lamina.entries("tmp"), 0, "{report}");
    assert_eq!(layers(&lamina), 2, "the new container's layers stay");
    lamina.delete_and_assert_gone("new", "killed clean");
}
