//! The CLI surface Garden and operators' scripts rely on: output shapes, one-line errors
//! on stdout, exit codes, config and logs.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use lamina_integration::lamina::run_raw;
use lamina_integration::scratch::mounts_under;
use lamina_integration::{Lamina, ScratchFs, require_root, sample_image};

#[test]
fn create_prints_grootfs_runtime_spec_and_list_shows_it() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    // At info (the default is GrootFS's fatal), a create logs what it made.
    let out = lamina.run(&[
        "--log-level",
        "info",
        "create",
        &files.references()[0],
        "web-1",
    ]);
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    let rootfs = lamina.rootfs("web-1");
    let expected = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": { "env": lamina_sample::SAMPLE_ENV },
        "root": { "path": rootfs },
    });
    assert_eq!(out.json(), expected);
    assert_eq!(
        lamina.run(&["list"]).stdout,
        rootfs.parent().unwrap().display().to_string()
    );
    // Logs are JSON lines on stderr.
    for line in out.stderr.lines() {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
    }
    assert!(out.stderr.contains("created rootfs"));
    lamina.delete_and_assert_gone("web-1", "web-1");
}

#[test]
fn errors_are_one_line_on_stdout_with_exit_1() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let uninit = Lamina::new(&fs.path().join("not-a-store"));
    let image = &files.references()[0];

    let out = uninit.run(&["create", image, "x"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stdout
            .starts_with("Store path is not initialized. Please run init-store.")
            && out.stdout.contains("not-a-store"),
        "{out:?}"
    );

    let lamina = Lamina::init(&fs.path().join("store"));
    lamina.create(image, "dup");
    let cases = [
        (
            vec!["create", image.as_str(), "dup"],
            "image for id `dup` already exists",
        ),
        (
            vec!["create", image.as_str(), "a/b"],
            "id `a/b` contains invalid characters: `/`",
        ),
        (
            vec!["create", "oci:///no/such/layout", "m"],
            "/no/such/layout does not exist",
        ),
        (vec!["create", "relative.tar", "m"], "absolute path"),
        // What cannot print as one line is refused, and named escaped.
        (
            vec!["create", image.as_str(), "victim\nzzz"],
            "id `victim\\nzzz` contains invalid characters: a control character",
        ),
        (
            vec!["create", image.as_str(), "esc\u{1b}[31m"],
            "id `esc\\u{1b}[31m` contains invalid characters: a control character",
        ),
    ];
    for (args, expect) in cases {
        let out = lamina.run(&args);
        assert_eq!(out.code, 1, "{args:?}: {out:?}");
        assert_eq!(out.stdout.lines().count(), 1, "{args:?}: {out:?}");
        assert!(out.stdout.contains(expect), "{args:?}: {out:?}");
    }
    // The failed creates left nothing: only `dup` exists.
    assert_eq!(
        lamina.run(&["list"]).stdout,
        lamina.store.join("images/dup").display().to_string()
    );
    assert_eq!(
        std::fs::read_dir(lamina.store.join("images"))
            .unwrap()
            .count(),
        1
    );
    lamina.delete_and_assert_gone("dup", "dup");
}

#[test]
fn delete_of_a_missing_container_succeeds_with_a_message() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let out = lamina.run(&["delete", "never-existed"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("never-existed") && out.stdout.contains("not found"),
        "{out:?}"
    );
    // GrootFS's delete_test.go: a path outside the store is reported, and exits 0.
    let outside = lamina.run(&["delete", "/somewhere/else/rootfs"]);
    assert_eq!(outside.code, 0, "{outside:?}");
    assert_eq!(
        outside.stdout, "path `/somewhere/else/rootfs` is outside store path",
        "{outside:?}"
    );
}

/// docs/registry.md has operators export `LAMINA_REGISTRY_PASSWORD` rather than pass
/// `--password`; exported for every command, it must not fail the ones that name no
/// user (guards against every delete failing with "--username and --password go
/// together"), while a `--password` flag without `--username` is still refused. The
/// variable also sends these lines to clap rather than to the fast reader of Garden's
/// lines (fast_args.rs), so both readers are exercised.
#[test]
fn a_registry_password_in_the_environment_alone_fails_nothing() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let store = lamina.store.to_str().expect("utf-8 store");
    let run = |env: Option<&str>, args: &[&str]| {
        let mut command = Command::new(lamina_integration::lamina::binary());
        command.args(["--store", store]).args(args);
        command.env_remove("LAMINA_REGISTRY_PASSWORD");
        if let Some(value) = env {
            command.env("LAMINA_REGISTRY_PASSWORD", value);
        }
        command.output().expect("running lamina")
    };
    let exported = run(Some("secret"), &["delete", "never-existed"]);
    assert!(exported.status.success(), "{exported:?}");
    let flag_alone = run(None, &["--password", "secret", "delete", "never-existed"]);
    assert_eq!(flag_alone.status.code(), Some(1), "{flag_alone:?}");
    assert_eq!(
        String::from_utf8_lossy(&flag_alone.stdout).trim(),
        "--username and --password go together",
        "{flag_alone:?}"
    );
    // With the variable exported, a create is read (by clap) exactly as without it.
    let image = &sample_image(&fs.path().join("image")).references()[0];
    let created = run(Some("secret"), &["create", image, "with-env"]);
    assert!(created.status.success(), "{created:?}");
    let spec: serde_json::Value =
        serde_json::from_slice(&created.stdout).expect("runtime spec JSON");
    assert_eq!(
        spec["root"]["path"],
        lamina
            .store
            .join("images/with-env/rootfs")
            .display()
            .to_string()
    );
    lamina.delete_and_assert_gone("with-env", "created with the password exported");
}

#[test]
fn without_mount_prints_an_overlay_the_caller_can_mount() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let spec = lamina
        .run(&["create", "--without-mount", &files.references()[1], "nm"])
        .json();
    let rootfs = lamina.rootfs("nm");
    assert!(mounts_under(&rootfs).is_empty(), "nothing mounted");
    let mount = &spec["mounts"][0];
    assert_eq!(
        (&mount["destination"], &mount["type"], &mount["source"]),
        (&"/".into(), &"overlay".into(), &"overlay".into())
    );
    let options: Vec<&str> = mount["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    // Mount it as Garden would, with exactly the printed options.
    let status = Command::new("mount")
        .args([
            "-t",
            "overlay",
            "overlay",
            "-o",
            &options.join(","),
            rootfs.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(rootfs.join("top.txt")).unwrap(),
        "from the top layer\n"
    );
    assert!(!rootfs.join("old/gone.txt").exists());
    lamina.delete_and_assert_gone("nm", "without-mount");
}

#[test]
fn config_file_sets_store_and_log_file_and_flags_win() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let store = fs.path().join("from-config");
    let log = fs.path().join("lamina.log");
    let config = fs.path().join("config.yml");
    std::fs::write(
        &config,
        format!("store: {}\nlog_level: debug\nlog_file: {}\nclean:\n  threshold_bytes: 5\nunknown_key: 1\n", store.display(), log.display()),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    assert_eq!(run_raw(&["--config", config, "init-store"]).code, 0);
    let out = run_raw(&["--config", config, "create", &files.references()[3], "cfg"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(store.join("images/cfg/rootfs").exists());
    assert!(out.stderr.is_empty(), "logs went to the log file: {out:?}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged
            .lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
    );
    // lager's lines (the CLI's default), at the configured level: debug and info.
    assert!(
        logged.contains("\"log_level\":0") || logged.contains("\"log_level\":1"),
        "{logged}"
    );

    // --store on the command line wins over the config's store.
    let other = Lamina::init(&fs.path().join("flag-store"));
    let out = run_raw(&[
        "--config",
        config,
        "--store",
        other.store.to_str().unwrap(),
        "list",
    ]);
    assert_eq!(out.stdout, "Store empty", "{out:?}");
    assert_eq!(run_raw(&["--config", config, "delete", "cfg"]).code, 0);
    assert_eq!(run_raw(&["--config", config, "reap"]).code, 0);
    assert!(mounts_under(fs.path()).iter().all(|m| m == fs.path()));
}

#[test]
fn an_unknown_log_level_is_refused() {
    let out = run_raw(&["--log-level", "verbose", "list"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("log level `verbose`"), "{out:?}");
}

/// `--version` says which build answers: the release, the commit it was built from (the
/// checkout's, when built from one), the target and the profile.
#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = run_raw(&["--version"]);
    assert_eq!(out.code, 0, "{out:?}");
    let line = out.stdout.trim();
    assert!(line.starts_with("lamina 0."), "{line}");
    assert!(line.contains("(commit "), "{line}");
    assert!(
        line.contains("x86_64") || line.contains("aarch64"),
        "{line}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    // Built from this checkout (the tests build the binary they run, and a new commit
    // rebuilds it): its commit.
    if let Some(head) = head {
        assert!(
            line.contains(&format!("(commit {head}")),
            "{line} (HEAD {head})"
        );
    }
}

/// `lamina daemon` execs `lamina-daemon` from `lamina`'s own directory, and only one that
/// no one but root (or lamina's owner) could have put there.
#[test]
// The test plants files as another user would, outside lamina's seam.
#[allow(clippy::disallowed_methods)]
fn daemon_runs_only_a_trusted_lamina_daemon_beside_lamina() {
    use std::os::unix::fs::PermissionsExt;
    require_root();
    let fs = ScratchFs::tmpfs();
    let dir = fs.path().join("bin");
    std::fs::create_dir(&dir).unwrap();
    let lamina = dir.join("lamina");
    std::fs::copy(lamina_integration::lamina::binary(), &lamina).unwrap();
    let daemon = |dir_mode: u32| {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(dir_mode)).unwrap();
        let out = Command::new(&lamina)
            .args([
                "--store",
                fs.path().join("store").to_str().unwrap(),
                "daemon",
            ])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };

    let (code, stdout) = daemon(0o755);
    assert_eq!(code, Some(1));
    assert!(
        stdout.contains("lamina-daemon is not installed beside this lamina"),
        "{stdout}"
    );

    // A directory anyone may add files to, as a shared sticky directory is.
    let planted = dir.join("lamina-daemon");
    std::fs::write(&planted, "#!/bin/sh\necho planted\n").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, stdout) = daemon(0o1777);
    assert_eq!(code, Some(1));
    assert!(!stdout.contains("planted"), "{stdout}");
    assert!(
        stdout.contains("writable by its group or others"),
        "{stdout}"
    );

    // Owned by someone else.
    std::os::unix::fs::chown(&planted, Some(65534), None).unwrap();
    let (code, stdout) = daemon(0o755);
    assert_eq!(code, Some(1));
    assert!(stdout.contains("owned by uid 65534"), "{stdout}");

    // Root's own, in root's own directory: run, keeping the arguments.
    std::os::unix::fs::chown(&planted, Some(0), None).unwrap();
    std::fs::write(&planted, "#!/bin/sh\necho \"$@\"\n").unwrap();
    let (code, stdout) = daemon(0o755);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.trim_end().ends_with("daemon"), "{stdout}");
}

/// A warm create names a rootfs tar's layer from the store's memo of its digest
/// (`run/tar-digests/`), not by reading the tar again; a tar rewritten in place, even at
/// the same size with its modification time put back, is named by its new content.
#[test]
fn a_rootfs_tar_rewritten_in_place_is_named_by_its_new_content() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let tar = fs.path().join("rootfs.tar");
    let write = |content: &[u8]| {
        std::fs::write(
            &tar,
            lamina_sample::RawTar::default()
                .file("greeting", content)
                .finish(),
        )
        .unwrap()
    };
    write(b"first");
    // A tar written this recently is hashed on every create, not remembered: coarse
    // timestamps could hide a second write (lamina_image's tar_memo).
    std::thread::sleep(lamina_image::TAR_SETTLED + std::time::Duration::from_millis(100));
    let lamina = Lamina::init(&fs.path().join("store"));
    let tar_arg = tar.display().to_string();
    lamina.run(&["create", &tar_arg, "one"]);
    lamina.run(&["create", &tar_arg, "two"]);
    let memos = std::fs::read_dir(fs.path().join("store/run/tar-digests")).unwrap();
    assert_eq!(memos.count(), 1, "one memo for one tar path");
    let greeting = |id: &str| std::fs::read(lamina.rootfs(id).join("greeting")).unwrap();
    assert_eq!(greeting("two"), b"first");

    // A memo that names other content (as a write the identity could not show would
    // leave it): the import's digest check refuses the tar and forgets the memo, and the
    // next create hashes the tar again.
    let memo_path = std::fs::read_dir(fs.path().join("store/run/tar-digests"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut memo: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&memo_path).unwrap()).unwrap();
    memo["diff_id"] = lamina_image::Digest::of(b"other content")
        .to_string()
        .into();
    std::fs::write(&memo_path, serde_json::to_vec(&memo).unwrap()).unwrap();
    let refused = lamina.run(&["create", &tar_arg, "stale"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert!(refused.stdout.contains("diffID"), "{refused:?}");
    assert!(!memo_path.exists(), "the refused import forgot the memo");
    lamina.run(&["create", &tar_arg, "again"]);
    assert_eq!(greeting("again"), b"first");
    lamina.run(&["delete", "again"]);

    let mtime = std::fs::metadata(&tar).unwrap().modified().unwrap();
    write(b"other");
    std::fs::File::options()
        .write(true)
        .open(&tar)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    lamina.run(&["create", &tar_arg, "three"]);
    assert_eq!(greeting("three"), b"other");
    assert_eq!(greeting("one"), b"first");
    for id in ["one", "two", "three"] {
        lamina.run(&["delete", id]);
    }
}
