//! One torn container record (issue 20, class 8) costs its own container, never the
//! store: `list` shows every healthy container and names the bad one on stderr, `check`
//! reports it as `bad_record`, `clean` goes on past it (keeping every layer, since what
//! the bad container uses is unknown), and `delete` still removes it, mounts and all.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use lamina_integration::scratch::mounts_under;
use lamina_integration::{FsKind, Lamina, Output, ScratchFs, hostile, require_root, sample_image};

/// The damaged containers, each with what its `container.json` is overwritten with.
fn torn_records(valid: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("torn-empty", Vec::new()),
        ("torn-garbage", b"\x00\x17{{not json at all".to_vec()),
        ("torn-truncated", valid[..valid.len() / 2].to_vec()),
        ("torn-isolated", Vec::new()),
    ]
}

fn report_of(out: &Output) -> serde_json::Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn problems_of_kind(report: &serde_json::Value, kind: &str) -> Vec<serde_json::Value> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == kind)
        .cloned()
        .collect()
}

fn kinds(report: &serde_json::Value) -> BTreeSet<String> {
    report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap().to_string())
        .collect()
}

/// The rootfs of each image directory `list` printed (GrootFS prints `<store>/images/<id>`).
fn listed(out: &Output) -> Vec<PathBuf> {
    out.stdout
        .lines()
        .map(|dir| PathBuf::from(dir).join("rootfs"))
        .collect()
}

/// Layer directories in the store.
fn layer_dirs(store: &Path) -> BTreeSet<String> {
    fs::read_dir(store.join("layers"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_torn_record_costs_its_own_container_and_never_the_store() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let lamina = Lamina::init(&fs.path().join("store"));
    let store = lamina.store.clone();
    let image = sample_image(&fs.path().join("img")).references()[0].clone();

    // A layer only a deleted container used: collectable, unless something is unknown.
    let spare_image = hostile::write(
        &fs.path().join("spare"),
        &hostile::with_top_file("spare.txt", b"spare\n", lamina_image::Compression::Gzip),
    );
    lamina.create(&spare_image, "spare");
    assert_eq!(lamina.run(&["delete", "spare"]).code, 0);

    let healthy: Vec<PathBuf> = ["healthy-a", "healthy-z"]
        .iter()
        .map(|id| lamina.create(&image, id))
        .collect();
    let valid =
        lamina_integration::records::record_bytes(&store.join("images/healthy-a/container.json"));
    let torn = torn_records(&valid);
    for (id, bytes) in &torn {
        let flags: &[&str] = if *id == "torn-isolated" {
            &["--strategy", "isolated-memory"]
        } else {
            &[]
        };
        lamina.create_with(flags, &image, id);
        lamina_integration::records::overwrite_record(
            &store.join("images").join(id).join("container.json"),
            bytes,
        );
    }
    let torn_ids: BTreeSet<&str> = torn.iter().map(|(id, _)| *id).collect();
    let layers_with_spare = layer_dirs(&store);

    // list: the healthy ones on stdout, each bad one named once on stderr, exit 0.
    // Read at warn: the default, GrootFS's fatal, logs no warnings.
    let list = lamina.run(&["--log-level", "warn", "list"]);
    assert_eq!(list.code, 0, "{list:?}");
    assert_eq!(listed(&list), healthy, "{list:?}");
    for id in &torn_ids {
        let naming: Vec<&str> = list
            .stderr
            .lines()
            .filter(|l| l.contains(&format!("\"{id}\"")))
            .collect();
        assert_eq!(naming.len(), 1, "stderr names `{id}` once: {list:?}");
        assert!(naming[0].contains("unreadable"), "{list:?}");
    }

    // check: one bad_record per torn container, at its record; nothing else is broken
    // (their mounts are theirs, not orphans). --repair cannot rebuild them and leaves
    // their rootfs mounted.
    for args in [&["check"][..], &["check", "--repair"][..]] {
        let out = lamina.run(args);
        assert_eq!(out.code, 1, "{args:?}: {out:?}");
        let report = report_of(&out);
        assert_eq!(report["ok"], false);
        assert_eq!(
            kinds(&report),
            BTreeSet::from(["bad_record".to_string()]),
            "{args:?}: {report}"
        );
        let bad = problems_of_kind(&report, "bad_record");
        let paths: BTreeSet<PathBuf> = bad
            .iter()
            .map(|p| PathBuf::from(p["path"].as_str().unwrap()))
            .collect();
        let expected: BTreeSet<PathBuf> = torn_ids
            .iter()
            .map(|id| store.join("images").join(id).join("container.json"))
            .collect();
        assert_eq!(paths, expected, "{report}");
        assert!(bad.iter().all(|p| p["repaired"] == false), "{report}");
        for (id, _) in &torn {
            assert!(
                mounts_under(&store.join("images").join(id)).contains(&lamina.rootfs(id)),
                "{args:?} left `{id}`'s rootfs mounted"
            );
        }
    }

    // clean: goes on past the bad records, reports them, and keeps every layer.
    let cleaned = lamina.run(&["clean"]);
    assert_eq!(cleaned.code, 0, "{cleaned:?}");
    let report = report_of(&cleaned);
    let named: BTreeSet<&str> = report["bad_records"]
        .as_array()
        .unwrap_or_else(|| panic!("no bad_records: {report}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(named, torn_ids, "{report}");
    assert_eq!(report["layers_removed"], 0, "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("kept every layer"),
        "{report}"
    );
    assert_eq!(
        layer_dirs(&store),
        layers_with_spare,
        "no layer collected while a record is unreadable"
    );

    // delete: each torn container goes, with everything mounted in it (an isolated
    // one's own upper filesystem too).
    for id in &torn_ids {
        let dir = store.join("images").join(id);
        let out = lamina.run(&["delete", id]);
        assert_eq!(out.code, 0, "delete {id}: {out:?}");
        assert!(!dir.exists(), "{id} still in images/");
        assert!(mounts_under(&dir).is_empty(), "{id} left mounts");
    }
    assert_eq!(lamina.entries("trash"), 0);
    let leftover: Vec<PathBuf> = mounts_under(&store)
        .into_iter()
        .filter(|m| !healthy.iter().any(|h| m.starts_with(h.parent().unwrap())))
        .filter(|m| *m != store)
        .collect();
    assert!(leftover.is_empty(), "mounts left: {leftover:?}");

    // The store is whole again: check passes, list is quiet, clean collects.
    let check = lamina.run(&["check"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert_eq!(report_of(&check)["ok"], true);
    let list = lamina.run(&["list"]);
    assert_eq!(list.code, 0, "{list:?}");
    assert_eq!(listed(&list), healthy);
    assert!(!list.stderr.contains("unreadable"), "{list:?}");
    let cleaned = report_of(&lamina.run(&["clean"]));
    assert!(cleaned.get("bad_records").is_none(), "{cleaned}");
    assert!(
        cleaned["layers_removed"].as_u64().unwrap() >= 1,
        "{cleaned}"
    );

    for (id, rootfs) in ["healthy-a", "healthy-z"].iter().zip(&healthy) {
        assert!(rootfs.join("bin/busybox").is_file(), "{id} still mounted");
        lamina.delete_and_assert_gone(id, "healthy");
    }
}

/// A record is input too: one whose lease or bind source climbs out of the store with
/// `..` (or names another container) is a bad record, so `delete` tears the container
/// down by what is mounted in its own directory and never removes what the record names.
#[test]
fn record_paths_that_leave_the_store_are_never_followed() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = sample_image(&fs.path().join("sample")).references()[0].clone();
    let victim = fs.path().join("victim");
    fs::create_dir_all(victim.join("users")).unwrap();
    fs::write(victim.join("keep"), "keep").unwrap();
    let escapes = [
        (
            "lease",
            format!("{}/shared/../../victim/users/x", lamina.store.display()),
        ),
        (
            "bind_source",
            format!("{}/shared/../../victim", lamina.store.display()),
        ),
        ("id", "someone-else".to_string()),
    ];
    for (field, value) in &escapes {
        let id = format!("hostile-{}", field.replace('_', "-"));
        lamina.create_with(&["--strategy", "classic"], &image, &id);
        let path = lamina.store.join("images").join(&id).join("container.json");
        let mut record = lamina_integration::records::record_json(&path);
        // Each path is made to fit a provider that has it, so only its shape is wrong.
        let rootfs = &mut record["rootfs"];
        match *field {
            "lease" => {
                rootfs["provider"] = "shared-ro".into();
                let source = lamina.store.join("shared/x/rootfs");
                rootfs["bind_source"] = source.display().to_string().into();
                rootfs["lease"] = value.clone().into();
            }
            "bind_source" => {
                rootfs["provider"] = "direct".into();
                rootfs["bind_source"] = value.clone().into();
            }
            _ => record[*field] = value.clone().into(),
        }
        lamina_integration::records::overwrite_record(&path, &serde_json::to_vec(&record).unwrap());

        let check = lamina.run(&["check"]);
        let report = report_of(&check);
        let bad = problems_of_kind(&report, "bad_record");
        assert_eq!(bad.len(), 1, "{field}: {report}");
        let out = lamina.run(&["delete", &id]);
        assert_eq!(out.code, 0, "{field}: {out:?}");
        assert!(!lamina.store.join("images").join(&id).exists(), "{field}");
        assert_eq!(
            fs::read_to_string(victim.join("keep")).unwrap(),
            "keep",
            "{field}"
        );
        assert!(victim.join("users").is_dir(), "{field}");
    }
    assert!(mounts_under(&lamina.store).is_empty());
    assert_eq!(lamina.run(&["check"]).code, 0);
}

/// A create's first record is a symlink's target, or written with `O_DIRECT`, with no
/// flush (docs/store.md, "Durability of records"). What a container fsyncs after its
/// create returns must bring
/// its record through a power cut with it: a buffered record would come back empty (the
/// container's fsync commits the record's rename before its data), and the container,
/// data and all, would be unreadable. A container created after that fsync comes back
/// whole or not at all, never with an empty record. On xfs and ext4, the filesystems
/// where the record skips the flush.
#[test]
fn a_record_survives_a_power_cut_whenever_its_containers_fsync_does() {
    require_root();
    for kind in [FsKind::Xfs, FsKind::Ext4] {
        let fs = ScratchFs::loop_backed(kind, 512, false);
        let lamina = Lamina::init(&fs.path().join("store"));
        let image = sample_image(&fs.path().join("img")).references()[0].clone();
        let rootfs = lamina.create_with(&["--strategy", "classic"], &image, "synced");
        let committed = rootfs.join("etc/committed");
        let mut file = fs::File::create(&committed).unwrap();
        std::io::Write::write_all(&mut file, b"txn 42\n").unwrap();
        file.sync_all().unwrap();
        drop(file);
        fs::File::open(rootfs.join("etc"))
            .unwrap()
            .sync_all()
            .unwrap();
        lamina.create_with(&["--strategy", "classic"], &image, "unsynced");

        fs.crash_and_remount();

        let record = lamina.store.join("images/synced/container.json");
        let bytes = lamina_integration::records::record_bytes(&record);
        let parsed: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{kind:?}: the record came back torn ({e}): {bytes:?}"));
        assert_eq!(parsed["id"], "synced", "{kind:?}");
        let mounted = lamina.run(&["mount", "synced"]);
        assert_eq!(mounted.code, 0, "{kind:?}: {mounted:?}");
        assert_eq!(fs::read(&committed).unwrap(), b"txn 42\n", "{kind:?}");

        let unsynced = lamina.store.join("images/unsynced/container.json");
        if lamina_integration::records::record_exists(&unsynced) {
            let bytes = lamina_integration::records::record_bytes(&unsynced);
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .unwrap_or_else(|e| panic!("{kind:?}: torn ({e}): {bytes:?}"));
        }
        // Whatever came back is a container or a crashed create; nothing is unreadable.
        let cleaned = report_of(&lamina.run(&["clean"]));
        assert!(cleaned.get("bad_records").is_none(), "{kind:?}: {cleaned}");
        for id in ["synced", "unsynced"] {
            assert_eq!(lamina.run(&["delete", id]).code, 0, "{kind:?} {id}");
        }
        assert_eq!(lamina.run(&["check"]).code, 0, "{kind:?}");
    }
}

/// A layer holding no file data (an empty commit, a layer of directories, empty files and
/// short symlinks) is published without a `syncfs` on journaled xfs and ext4: its record
/// is written direct, and the rename that publishes it is logged after every change to
/// its tree. After a power cut that follows any later fsync (what the snapshot metadata's
/// next transaction does), the layer is whole: its record reads and its tree is there.
/// With a buffered record and no sync, the record comes back empty.
#[test]
fn a_metadata_only_layer_survives_a_power_cut_after_a_later_fsync() {
    require_root();
    for kind in [FsKind::Xfs, FsKind::Ext4] {
        let fs = ScratchFs::loop_backed(kind, 512, false);
        let root = fs.path().join("store");
        let store = lamina_store::Store::init(&root).unwrap();
        let diff = fs.path().join("upper");
        fs::create_dir_all(diff.join("a/b")).unwrap();
        fs::write(diff.join("a/empty"), b"").unwrap();
        std::os::unix::fs::symlink("a/b", diff.join("short")).unwrap();
        let chain = lamina_image::Digest::of(b"a layer of metadata only");
        assert!(store.publish_layer_dir(&chain, &diff).unwrap());
        a_later_fsync(&fs);

        fs.crash_and_remount();

        let store = lamina_store::Store::open(&root).unwrap();
        let record = store
            .layer_record(&chain)
            .unwrap_or_else(|e| panic!("{kind:?}: the layer came back torn: {e}"));
        assert_eq!(record.chain_id, chain, "{kind:?}");
        let written = store.layout().layer(&chain).join("layer.json");
        assert_eq!(
            fs::metadata(&written).unwrap().len(),
            4096,
            "{kind:?}: the record took the direct write (padded to a block), not the sync"
        );
        let tree = store.layout().layer_diff(&chain);
        assert!(tree.join("a/b").is_dir(), "{kind:?}");
        assert_eq!(
            fs::metadata(tree.join("a/empty")).unwrap().len(),
            0,
            "{kind:?}"
        );
        assert_eq!(
            fs::read_link(tree.join("short")).unwrap(),
            Path::new("a/b"),
            "{kind:?}"
        );
    }
}

/// A layer with file data, published the way an import publishes it, without a `syncfs`
/// on journaled xfs and ext4: its own files are written to the device and waited for
/// before the rename, so after a power cut that follows any later fsync (the journal
/// commit that carries the rename) every file is whole, a large one and a hardlinked one
/// (written back once) included. Without the write-back, xfs and ext4 bring the files
/// back empty or short (`layer_write_back.rs` proves that through a containerd commit).
#[test]
fn a_layer_with_data_survives_a_power_cut_after_a_later_fsync() {
    require_root();
    for kind in [FsKind::Xfs, FsKind::Ext4] {
        let fs = ScratchFs::loop_backed(kind, 512, false);
        let root = fs.path().join("store");
        let store = lamina_store::Store::init(&root).unwrap();
        let diff = fs.path().join("upper");
        fs::create_dir_all(diff.join("bin")).unwrap();
        let files: Vec<(String, Vec<u8>)> = (0..30u32)
            .map(|i| {
                let len = if i == 0 {
                    3 << 20
                } else {
                    1 + i as usize * 3001
                };
                let bytes = (0..len)
                    .map(|j| (i as usize * 13 + j / 512) as u8)
                    .collect();
                (format!("bin/tool-{i}"), bytes)
            })
            .collect();
        for (name, bytes) in &files {
            fs::write(diff.join(name), bytes).unwrap();
        }
        fs::hard_link(diff.join("bin/tool-1"), diff.join("bin/alias")).unwrap();
        let chain = lamina_image::Digest::of(b"a layer with data");
        assert!(store.publish_layer_dir(&chain, &diff).unwrap());
        a_later_fsync(&fs);

        fs.crash_and_remount();

        let store = lamina_store::Store::open(&root).unwrap();
        store
            .layer_record(&chain)
            .unwrap_or_else(|e| panic!("{kind:?}: the layer came back torn: {e}"));
        let tree = store.layout().layer_diff(&chain);
        for (name, bytes) in &files {
            let kept = fs::read(tree.join(name)).unwrap();
            assert!(
                kept == *bytes,
                "{kind:?}: {name} came back changed ({} bytes)",
                kept.len()
            );
        }
        assert_eq!(
            fs::read(tree.join("bin/alias")).unwrap(),
            files[1].1,
            "{kind:?}"
        );
    }
}

/// An image config may be up to 4 MiB, and its environment goes into the container's
/// record, which readers refuse past 1 MiB. Such a create is refused when the record is
/// written, naming the limit, and leaves nothing: no container that `list` cannot show.
#[test]
fn a_record_past_the_limit_is_refused_at_create_and_leaves_nothing() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let mut image = hostile::base_only();
    hostile::edit_config(&mut image, |config| {
        config["config"]["Env"] = serde_json::json!([format!("BIG={}", "x".repeat(1_100_000))]);
    });
    let reference = hostile::write(&fs.path().join("big-env"), &image);
    let out = lamina.run(&["create", &reference, "big"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("1048576-byte limit"), "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    assert!(!lamina.store.join("images/big").exists());
    assert!(mounts_under(&lamina.store).is_empty());
    assert_eq!(lamina.run(&["check"]).code, 0);
}

/// A file made and fsynced on `fs`: a journal commit that carries everything logged
/// before it, as the snapshot metadata's next transaction does.
fn a_later_fsync(fs: &ScratchFs) {
    let mut later = fs::File::create(fs.path().join("later")).unwrap();
    std::io::Write::write_all(&mut later, b"a later transaction").unwrap();
    later.sync_all().unwrap();
}
