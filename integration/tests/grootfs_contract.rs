//! GrootFS's CLI contract, as its integration specs (`cloudfoundry/grootfs`,
//! `integration/*_test.go`) state it, driven through the `lamina` binary: the flags
//! GrootFS accepts, its usage errors (one line on stdout, exit 1), the messages operators
//! grep for, its config conventions and its output shapes. Each test names the spec file
//! its expectations come from and its `Context`/`It` wording, as in cloudfoundry/grootfs
//! (checked at its commit d6def04). `scripts/grootfs-suite` runs those specs themselves
//! against lamina (docs/garden.md); these tests keep what they found in our own CI.
//! Local images only.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;

use lamina_integration::lamina::run_raw;
use lamina_integration::scratch::mounts_under;
use lamina_integration::{Lamina, Output, ScratchFs, require_root, sample_image, wait_until};

/// A failure as GrootFS reports one: exit 1 and exactly one line on stdout, which starts
/// with GrootFS's text (lamina may add detail after it, never instead of it).
#[track_caller]
fn assert_fails_with(out: &Output, text: &str) {
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    assert!(out.stdout.starts_with(text), "want `{text}`: {out:?}");
}

/// Success with exactly `line` on stdout.
#[track_caller]
fn assert_says(out: &Output, line: &str) {
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, line, "{out:?}");
}

/// grootfs main.go's global flags, which every spec's runner passes (`--tardis-bin`,
/// `--newuidmap-bin`, `--newgidmap-bin`, `--metron-endpoint`, `--driver`) and
/// `--log-level fatal`, GrootFS's default: accepted, and meaningless to lamina.
#[test]
fn grootfs_global_flags_are_accepted_and_ignored() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let ignored = [
        "--tardis-bin",
        "/usr/bin/tardis",
        "--newuidmap-bin",
        "/usr/bin/newuidmap",
        "--newgidmap-bin",
        "/usr/bin/newgidmap",
        "--metron-endpoint",
        "127.0.0.1:3457",
        "--driver",
        "overlay-xfs",
        "--log-level",
        "fatal",
    ];
    let mut args = ignored.to_vec();
    args.push("list");
    let out = lamina.run(&args);
    assert_says(&out, "Store empty");
    assert!(out.stderr.is_empty(), "fatal logs only errors: {out:?}");
    // After the command too: they are global.
    let mut args = vec!["list"];
    args.extend_from_slice(&ignored);
    assert_says(&lamina.run(&args), "Store empty");
}

/// Command flags from create.go (`--with-mount`, `--skip-layer-validation`,
/// `--threshold-bytes`, `--clean-log-file`, `--insecure-registry`) and init_store_test.go
/// (`--store-size-bytes`, `--with-direct-io`, `--rootless`); clean_test.go's
/// `--threshold-bytes`; delete_store_test.go's plain `delete-store`.
#[test]
fn grootfs_command_flags_are_accepted() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::new(&fs.path().join("store"));
    // GrootFS's --rootless takes the USER:GROUP whose subordinate ids map the store;
    // lamina refuses it rather than make an unmapped store where a mapped one was meant.
    let out = lamina.run(&["init-store", "--rootless", "groot:groot"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("--uid-mapping"), "{out:?}");
    assert!(!lamina.store.exists(), "nothing was made");
    let out = lamina.run(&[
        "init-store",
        "--store-size-bytes",
        "500000000",
        "--with-direct-io",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(lamina.run(&["capacity"]).json()["capacity"], 500000000);

    // create.go: `--with-clean` with its own threshold and log file.
    let clean_log = fs.path().join("clean.log");
    let rootfs = lamina.create_with(
        &[
            // At info (the default is GrootFS's fatal) the clean says it finished.
            "--log-level",
            "info",
            "--with-mount",
            "--skip-layer-validation",
            "--insecure-registry",
            "registry.example:5000",
            "--with-clean",
            "--threshold-bytes",
            "0",
            "--clean-log-file",
            clean_log.to_str().unwrap(),
        ],
        &files.references()[0],
        "flags",
    );
    assert!(rootfs.join("bin/busybox").exists(), "--with-mount mounts");
    // The background clean logs to --clean-log-file; wait for it to finish.
    wait_until("the --with-clean clean", || {
        std::fs::read_to_string(&clean_log).is_ok_and(|l| l.contains("cleaned store"))
    });
    lamina.delete_and_assert_gone("flags", "flags");

    let clean = lamina.run(&["clean", "--threshold-bytes", "0"]).json();
    assert_eq!(clean["skipped"], false, "{clean}");
    let out = lamina.run(&["delete-store"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!lamina.store.exists());
}

/// Usage errors: create_tar_test.go ("when required args are not provided"),
/// create_test.go ("when the disk limit value is invalid", "when both without-clean and
/// with-clean flags are given"), clean_test.go ("but it lower than 0"), stats_test.go
/// ("when the image id is not provided"), delete_test.go ("when the id is not provided").
/// GrootFS prints one line on stdout and exits 1; `--help` and `--version` still succeed.
#[test]
fn usage_errors_are_one_line_on_stdout_with_exit_1() {
    let store = "/nonexistent/lamina-contract-store";
    let cases: &[(&[&str], &str)] = &[
        (
            &["create", "--disk-limit-size-bytes", "-200", "/i.tar", "x"],
            "invalid argument: disk limit cannot be negative",
        ),
        (
            &["create", "--disk-limit-size-bytes=-200", "/i.tar", "x"],
            "invalid argument: disk limit cannot be negative",
        ),
        (
            &["clean", "--threshold-bytes", "-1"],
            "invalid argument: clean threshold cannot be negative",
        ),
        (
            &["create", "--threshold-bytes", "-1", "/i.tar", "x"],
            "invalid argument: clean threshold cannot be negative",
        ),
        (
            &["create", "--with-clean", "--without-clean", "/i.tar", "x"],
            "with-clean and without-clean cannot be used together",
        ),
        (&["create", "/i.tar"], "invalid arguments"),
        (&["create", "/i.tar", "x", "extra"], "invalid arguments"),
        (&["delete"], "id was not specified"),
        (&["delete", ""], "id was not specified"),
        (
            &["stats"],
            "invalid arguments - usage: stats [options] <id|image path>",
        ),
        (&["stats", ""], "invalid arguments - usage: stats"),
        (
            &["create", "--no-such-flag", "/i.tar", "x"],
            "unexpected argument",
        ),
        (&["--no-such-flag", "list"], "unexpected argument"),
        (
            &["create", "--disk-limit-size-bytes", "lots", "/i.tar", "x"],
            "invalid value 'lots'",
        ),
        (&["no-such-command"], "unrecognized subcommand"),
    ];
    for (args, text) in cases {
        let mut full = vec!["--store", store];
        full.extend_from_slice(args);
        let out = run_raw(&full);
        assert_fails_with(&out, text);
        assert!(
            out.stderr.is_empty(),
            "{args:?}: nothing on stderr: {out:?}"
        );
    }
    assert!(!std::path::Path::new(store).exists(), "nothing was made");

    for answer in [&["--help"][..], &["--version"], &["create", "--help"]] {
        let out = run_raw(answer);
        assert_eq!(out.code, 0, "{answer:?}: {out:?}");
        assert!(!out.stdout.is_empty(), "{answer:?}: {out:?}");
    }
}

/// The messages operators grep for, where GrootFS prints them: create_test.go ("when the
/// id is already being used", "when the id contains invalid characters", "when the store
/// isn't initialized"), create_tar_test.go ("when the provided base image is a
/// directory"), create_oci_test.go ("when the total size of compressed layers is greater
/// than the quota"), delete_test.go ("when the image ID doesn't exist", "when a path to an
/// image does not exist", "when the path provided doesn't belong to the `--store`
/// provided"), stats_test.go ("when the image id doesn't exist"), clean_test.go ("and the
/// total is less than the threshold").
#[test]
fn messages_operators_grep_for() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let image = files.references()[3].clone();

    let uninit = Lamina::new(&fs.path().join("uninitialised"));
    assert_fails_with(
        &uninit.run(&["create", &image, "x"]),
        "Store path is not initialized. Please run init-store.",
    );

    let lamina = Lamina::init(&fs.path().join("store"));
    lamina.create(&image, "taken");
    assert_fails_with(
        &lamina.run(&["create", &image, "taken"]),
        "image for id `taken` already exists",
    );
    assert_fails_with(
        &lamina.run(&["create", &image, "a/b"]),
        "id `a/b` contains invalid characters: `/`",
    );
    let dir = fs.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    assert_fails_with(
        &lamina.run(&["create", dir.to_str().unwrap(), "from-dir"]),
        "invalid base image: directory provided instead of a tar file",
    );
    assert_fails_with(
        &lamina.run(&["create", "--disk-limit-size-bytes", "1", &image, "tiny"]),
        "layers exceed disk quota",
    );

    // delete: whatever is not there is already deleted, so exit 0.
    assert_says(
        &lamina.run(&["delete", "non-existing-id"]),
        "Image `non-existing-id` not found. Skipping delete.",
    );
    let fake = lamina.store.join("images/non_existing");
    assert_says(
        &lamina.run(&["delete", fake.to_str().unwrap()]),
        "Image `non_existing` not found. Skipping delete.",
    );
    let outside = "/Iamnot/in/the/storage/images/1234/rootfs";
    assert_says(
        &lamina.run(&["delete", outside]),
        &format!("path `{outside}` is outside store path"),
    );

    assert_fails_with(
        &lamina.run(&["stats", "not-here"]),
        "Image `not-here` not found.",
    );

    let clean = lamina.run(&["clean", "--threshold-bytes", "100000000000"]);
    assert_eq!(clean.code, 0, "{clean:?}");
    assert!(
        clean.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("threshold not reached: skipping clean"),
        "{clean:?}"
    );

    // The refusals left nothing behind: only `taken` is listed.
    assert_says(
        &lamina.run(&["list"]),
        &lamina.store.join("images/taken").display().to_string(),
    );
    lamina.delete_and_assert_gone("taken", "messages");
}

/// Config conventions: create_test.go ("--config global flag") and GrootFS's config
/// builder: every key present, empty strings meaning unset; capacity_test.go ("emits init
/// store size"): `capacity` answers from `init.store_size_bytes` before `init-store`;
/// delete_test.go ("when the store doesn't exist"): `delete` succeeds.
#[test]
fn config_keys_that_are_empty_are_unset_and_missing_stores_are_fine() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let store = fs.path().join("store");
    let config = fs.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "store: {}\nlog_level: \"\"\nlog_file: \"\"\ninit:\n  store_size_bytes: 4242\ncreate:\n  strategy: \"\"\n",
            store.display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();

    let capacity = run_raw(&["--config", config, "capacity"]);
    assert_says(&capacity, r#"{"capacity":4242}"#);
    assert!(!store.exists(), "capacity made no store");

    let delete = run_raw(&["--config", config, "delete", "some-id"]);
    assert_says(&delete, "Image `some-id` not found. Skipping delete.");

    let init = run_raw(&["--config", config, "init-store"]);
    // An empty log_file is no file (opening "" would fail the command).
    assert_eq!(init.code, 0, "{init:?}");
    assert_says(&run_raw(&["--config", config, "list"]), "Store empty");
    // log_file "" is no file: the failure's log line goes to stderr.
    let stats = run_raw(&["--config", config, "stats", "missing"]);
    assert_fails_with(&stats, "Image `missing` not found.");
    assert!(stats.stderr.contains("command failed"), "{stats:?}");
}

/// Output shapes: list_test.go ("lists all images in the store path", "when there are no
/// existing images"), stats_test.go (`disk_usage` with the quota and committed space, with
/// and without a disk limit), init_store_test.go ("returns a newly created store path",
/// "sets the ownership to the caller user").
#[test]
fn list_stats_and_init_store_have_grootfs_shapes() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let files = sample_image(&fs.path().join("image"));
    let image = files.references()[0].clone();
    let lamina = Lamina::init(&fs.path().join("store"));
    let meta = std::fs::metadata(&lamina.store).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o700);
    assert_eq!(
        (meta.uid(), meta.gid()),
        (0, 0),
        "owned by the caller (root)"
    );
    assert_says(&lamina.run(&["list"]), "Store empty");

    let limit: u64 = 64 << 20;
    let limit_text = limit.to_string();
    lamina.create_with(&["--disk-limit-size-bytes", &limit_text], &image, "limited");
    lamina.create(&image, "plain");
    let listed = lamina.run(&["list"]);
    assert_eq!(listed.code, 0, "{listed:?}");
    let mut lines: Vec<&str> = listed.stdout.lines().collect();
    lines.sort_unstable();
    let dir = |id: &str| lamina.store.join("images").join(id).display().to_string();
    assert_eq!(lines, [dir("limited"), dir("plain")], "{listed:?}");

    let usage = |id: &str| lamina.run(&["stats", id]).json()["disk_usage"].clone();
    let plain = usage("plain");
    let image_bytes = plain["total_bytes_used"].as_u64().unwrap()
        - plain["exclusive_bytes_used"].as_u64().unwrap();
    assert!(image_bytes > 0, "{plain}");
    assert_eq!(plain["quota_size_bytes"], 0, "{plain}");
    assert_eq!(plain["committed_space_bytes"], image_bytes, "{plain}");
    let limited = usage("limited");
    assert_eq!(
        limited["quota_size_bytes"],
        limit - image_bytes,
        "{limited}"
    );
    assert_eq!(limited["committed_space_bytes"], limit, "{limited}");

    lamina.delete_and_assert_gone("limited", "shapes");
    lamina.delete_and_assert_gone("plain", "shapes");
    assert!(mounts_under(&lamina.store).is_empty());
}

/// A store that is not there (list_test.go, clean_test.go, stats_test.go, delete_test.go:
/// "when the store doesn't exist"): `list` and `stats` fail, `clean` and `delete` have
/// nothing to do and succeed; each logs, as a lager line, the path it found nothing at or
/// the ID it was asked about. An existing directory that was never initialised holds no
/// image either: `stats` answers as for an unknown ID or a path outside the store.
#[test]
fn a_missing_store_is_reported_with_what_was_asked() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let missing = Lamina::new(&fs.path().join("invalid-store"));
    let store = missing.store.display().to_string();
    let no_store = format!("no store found at {store}");
    // At debug, as GrootFS's suite runs every command (groot_suite_test.go).

    let list = missing.run(&["--log-level", "debug", "list"]);
    assert_fails_with(&list, &no_store);
    assert!(
        list.stderr.contains(&format!(r#""error":"{no_store}""#)),
        "{list:?}"
    );

    let clean = missing.run(&["--log-level", "debug", "clean", "--threshold-bytes", "0"]);
    assert_eq!(clean.code, 0, "{clean:?}");
    assert!(clean.stderr.contains(&no_store), "{clean:?}");
    let report = clean.json();
    assert_eq!(report["skipped"], true, "{report}");
    assert!(report["message"].as_str().unwrap().starts_with(&no_store));

    let asked = "/path/to/random-id";
    let logged_id = format!(r#""id":"{asked}""#);
    let stats = missing.run(&["--log-level", "debug", "stats", asked]);
    assert_fails_with(&stats, &format!("path `{asked}` is outside store path"));
    assert!(stats.stderr.contains(&logged_id), "{stats:?}");
    let stats = missing.run(&["--log-level", "debug", "stats", "some-id"]);
    assert_fails_with(&stats, "Image `some-id` not found.");
    assert!(stats.stderr.contains(r#""id":"some-id""#), "{stats:?}");

    let delete = missing.run(&["--log-level", "debug", "delete", asked]);
    assert_says(&delete, &format!("path `{asked}` is outside store path"));
    assert!(delete.stderr.contains(&logged_id), "{delete:?}");
    assert!(!missing.store.exists(), "nothing was made");

    // stats_test.go's specs ask a store directory `init-store` never ran in.
    let bare = Lamina::new(&fs.path().join("bare"));
    std::fs::create_dir(&bare.store).unwrap();
    assert_fails_with(
        &bare.run(&["stats", "invalid-id"]),
        "Image `invalid-id` not found.",
    );
    let inside = bare.store.join("images/not-here");
    assert_fails_with(
        &bare.run(&["stats", inside.to_str().unwrap()]),
        "Image `not-here` not found.",
    );
    let outside = "/Iamnot/in/the/storage/images/1234/rootfs";
    assert_fails_with(
        &bare.run(&["stats", outside]),
        &format!("path `{outside}` is outside store path"),
    );
}

/// Local images that are not there or not a tar (create_tar_test.go, "when local image
/// does not exist", "when the provided base image is a directory"; create_oci_test.go,
/// "when the image does not exist"): GrootFS's texts, the directory's exactly (its spec
/// matches the whole line).
#[test]
fn missing_and_directory_images_have_grootfs_texts() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    assert_fails_with(
        &lamina.run(&["create", "/invalid/image", "x"]),
        "stat /invalid/image: no such file or directory",
    );
    assert_fails_with(
        &lamina.run(&["create", "oci:///cfgarden/sorry-not-here", "x"]),
        "Image source doesn't exist",
    );
    let dir = fs.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    let out = lamina.run(&["create", dir.to_str().unwrap(), "x"]);
    assert_fails_with(
        &out,
        "invalid base image: directory provided instead of a tar file",
    );
    assert_eq!(
        out.stdout, "invalid base image: directory provided instead of a tar file",
        "the whole line"
    );
    assert_says(&lamina.run(&["list"]), "Store empty");
}

/// A limit the layers fit as stored but not unpacked (create_oci_test.go, "when the total
/// size of compressed layer is less than the quota, but the uncompressed size is
/// bigger"): GrootFS's `uncompressed layer size exceeds quota`, where a limit the stored
/// layers exceed says `layers exceed disk quota` (messages_operators_grep_for).
#[test]
fn a_limit_only_the_unpacked_image_exceeds_is_worded_as_grootfs_does() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    // The layers' sizes as stored, from the layout's manifest.
    let layout = fs.path().join("image/layout");
    let blob = |digest: &str| {
        let path = layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(path).unwrap()).unwrap()
    };
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest = blob(index["manifests"][0]["digest"].as_str().unwrap());
    let stored: u64 = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    let limit = (stored + 1024).to_string();
    assert_fails_with(
        &lamina.run(&[
            "create",
            "--disk-limit-size-bytes",
            &limit,
            &files.references()[0],
            "x",
        ]),
        "uncompressed layer size exceeds quota",
    );
    assert_says(&lamina.run(&["list"]), "Store empty");
}

/// `--config` as GrootFS's runner writes it (create_test.go's "--config global flag",
/// capacity_test.go): every key, `store: ""` among them, beside a `--store` flag, which
/// names the store. `--without-mount` prints the overlay's data options as one string
/// ("Mount json output"), which its callers pass to mount(2) as they are.
#[test]
fn a_grootfs_config_with_store_flag_and_the_mount_it_prints() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let config = fs.path().join("config.yml");
    std::fs::write(
        &config,
        "store: \"\"\ntardis_bin: \"\"\nlog_level: \"\"\nlog_file: \"\"\ncreate:\n  with_clean: false\n  without_mount: true\n  disk_limit_size_bytes: 0\n  insecure_registries: []\nclean:\n  threshold_bytes: 0\ninit:\n  store_size_bytes: 190092\n  with_direct_io: false\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let lamina = Lamina::new(&fs.path().join("store"));
    assert_says(
        &lamina.run(&["--config", config, "capacity"]),
        r#"{"capacity":190092}"#,
    );
    // Without the flag, the empty key names no store: refused, not the default store.
    let out = run_raw(&["--config", config, "list"]);
    assert_fails_with(&out, "`store` is empty in the config");

    lamina.run(&["--config", config, "init-store"]).ok();
    let spec = lamina
        .run(&["--config", config, "create", &files.references()[0], "nm"])
        .json();
    let rootfs = lamina.rootfs("nm");
    assert!(
        mounts_under(&rootfs).is_empty(),
        "without_mount: nothing mounted"
    );
    let options = spec["mounts"][0]["options"].as_array().unwrap();
    assert_eq!(options.len(), 1, "{spec}");
    let data = options[0].as_str().unwrap();
    for key in ["lowerdir=", ",upperdir=", ",workdir="] {
        assert!(data.contains(key), "{data}");
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", data])
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(rootfs.join("bin/busybox").exists());
    lamina.delete_and_assert_gone("nm", "config");
}

/// init_store_test.go: "when the user is not root" fails in GrootFS's words, making
/// nothing; "when the given store path is already initialized" succeeds and logs
/// `store-already-initialized`.
#[test]
fn init_store_refuses_non_root_and_logs_a_store_already_there() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let store = fs.path().join("store");
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(lamina_integration::lamina::binary())
        .arg("--store")
        .arg(&store)
        .arg("init-store")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        stdout.trim_end(),
        format!(
            "store {} can only be initialized by Root user",
            store.display()
        )
    );
    assert!(!store.exists(), "nothing was made");

    let lamina = Lamina::init(&store);
    let again = lamina.run(&["--log-level", "debug", "init-store"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(
        again.stderr.contains("store-already-initialized"),
        "{again:?}"
    );
}

/// Where lamina differs (docs/garden.md): delete_test.go's "when it fails to delete the
/// image" and "when it fails to unmount the rootfs directory" bind a directory into the
/// container's directory and into its mounted rootfs, and GrootFS fails the delete.
/// lamina detaches those mounts and removes the container, and never removes a file
/// through them: what they showed is still there.
#[test]
fn delete_detaches_mounts_in_a_container_and_keeps_their_files() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let host = fs.path().join("host-data");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("precious"), "kept\n").unwrap();
    for (id, beneath) in [("beside", "mnt"), ("inside", "rootfs/mnt")] {
        lamina.create(&files.references()[3], id);
        let target = lamina.store.join("images").join(id).join(beneath);
        std::fs::create_dir(&target).unwrap();
        let bound = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&host)
            .arg(&target)
            .status()
            .unwrap();
        assert!(bound.success());
        lamina.delete_and_assert_gone(id, "a mount in the container");
        assert_eq!(
            std::fs::read_to_string(host.join("precious")).unwrap(),
            "kept\n",
            "{id}"
        );
    }
    assert!(
        mounts_under(&lamina.store).is_empty(),
        "nothing left mounted"
    );
}

/// Where lamina differs (docs/garden.md): stats_test.go's "when the image has no quotas"
/// expects 0 exclusive bytes, GrootFS's answer when no project quota measures the
/// container. lamina reports what a container without a limit wrote, and the image plus
/// that as its total.
#[test]
fn stats_without_a_limit_counts_what_the_container_wrote() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let rootfs = lamina.create(&files.references()[3], "writer");
    let usage = || lamina.run(&["stats", "writer"]).json()["disk_usage"].clone();
    let before = usage();
    std::fs::write(rootfs.join("written"), vec![7u8; 4 << 20]).unwrap();
    let after = usage();
    let grew = |key: &str| after[key].as_u64().unwrap() - before[key].as_u64().unwrap();
    assert!(grew("exclusive_bytes_used") >= 4 << 20, "{before} {after}");
    assert_eq!(grew("total_bytes_used"), grew("exclusive_bytes_used"));
    assert_eq!(after["quota_size_bytes"], 0, "{after}");
    lamina.delete_and_assert_gone("writer", "stats without a limit");
}
