//! containerd's snapshotter testsuite (`snapshots/testsuite`), the cases that apply,
//! ported to lamina's gRPC API: a real `lamina daemon --containerd-socket` on a
//! loop-backed ext4 store, its answers mounted with mount(8) as containerd's shim mounts
//! them, files written and read back through those mounts.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// A test that cannot set up must stop loudly.
#![allow(clippy::unwrap_used)]

use lamina_snapshot_index::StoreSnapshots;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_integration::proof::{EXPECTED as MERGED, SCRIPT as PROOF};
use lamina_integration::scratch::{FsKind, mounts_under};
use lamina_integration::snapshotter::{Api, Daemon, Labels, Mounted, labels};
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root, sample_image, wait_until};
use lamina_snapshotter::proto::containerd::services::snapshots::v1::Kind;
use lamina_snapshotter::proto::containerd::types::Mount;
use tonic::Code;

/// Fields drop in order: client, then daemon, then the filesystem (and every mount on it).
struct Fixture {
    api: Api,
    daemon: Daemon,
    fs: ScratchFs,
}

fn fixture() -> Fixture {
    fixture_on(ScratchFs::ext4(512))
}

/// [`fixture`] on `fs`.
fn fixture_on(fs: ScratchFs) -> Fixture {
    require_root();
    let daemon = Daemon::start(
        &fs.path().join("store"),
        &fs.path().join("lamina.sock"),
        &[],
    );
    Fixture {
        api: Api::connect(&daemon.socket),
        daemon,
        fs,
    }
}

fn none() -> Labels {
    Labels::new()
}

fn classic() -> Labels {
    labels(&[("containerd.io/snapshot/lamina.strategy", "classic")])
}

/// Prepares `key` on `parent`, lets `write` change its files through a real mount, and
/// commits it as `name`.
fn commit_with(api: &Api, name: &str, key: &str, parent: &str, write: impl FnOnce(&Path)) {
    let mounts = api.prepare(key, parent, none()).expect("prepare");
    {
        let mounted = Mounted::new(&mounts);
        write(mounted.path());
    }
    api.commit(name, key, none()).expect("commit");
}

/// The container record behind snapshot `key` (an active snapshot or a view).
fn record_of(store: &Path, key: &str) -> serde_json::Value {
    lamina_integration::records::rootfs_of(store, &container_of(store, key))
}

/// The container (`images/<id>`) behind snapshot `key`, from the snapshot metadata (read
/// beside the running daemon, as `lamina check` reads it).
fn container_of(store: &Path, key: &str) -> String {
    let store = lamina_store::Store::open(store).unwrap();
    let index = store.snapshots().unwrap();
    index.get(key).unwrap().unwrap().container.unwrap()
}

/// The directory (`images/<id>`) of the container behind snapshot `key`.
fn container_dir(store: &Path, key: &str) -> PathBuf {
    store.join("images").join(container_of(store, key))
}

/// Every regular file beneath `dir`.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap().flatten() {
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn prepare_commit_chains_carry_files_whiteouts_and_copy_ups() {
    let f = fixture();
    commit_with(&f.api, "c1", "p1", "", |root| {
        fs::write(root.join("foo"), "one").unwrap();
        fs::write(root.join("bar"), "doomed").unwrap();
        fs::create_dir(root.join("dir")).unwrap();
        fs::write(root.join("dir/kept"), "kept").unwrap();
    });
    commit_with(&f.api, "c2", "p2", "c1", |root| {
        assert_eq!(read(&root.join("foo")), "one", "a child sees its parent");
        fs::write(root.join("foo"), "two").unwrap();
        fs::remove_file(root.join("bar")).unwrap();
        fs::write(root.join("baz"), "new").unwrap();
    });
    // Under the default strategy (auto: metacopy, which this kernel passes) a chown
    // copies up metadata only; the commit must still make a complete layer of it.
    let mounts = f.api.prepare("p3", "c2", none()).unwrap();
    let record = record_of(&f.daemon.store, "p3");
    assert!(record.to_string().contains("metacopy=on"), "{record}");
    {
        let mounted = Mounted::new(&mounts);
        let kept = mounted.path().join("dir/kept");
        rustix::fs::chown(&kept, Some(rustix::fs::Uid::from_raw(1234)), None).unwrap();
    }
    f.api.commit("c3", "p3", none()).unwrap();
    let chowned: Vec<_> = files_under(&f.daemon.store.join("layers"))
        .into_iter()
        .filter(|p| p.ends_with("diff/dir/kept") && fs::metadata(p).unwrap().uid() == 1234)
        .collect();
    assert_eq!(chowned.len(), 1, "c3's layer holds the chowned file");
    assert_eq!(
        read(&chowned[0]),
        "kept",
        "with its data, not a metadata-only copy"
    );
    for file in files_under(&f.daemon.store.join("layers")) {
        let marker = rustix::fs::lgetxattr(&file, "trusted.overlay.metacopy", &mut [0u8; 0][..]);
        assert!(marker.is_err(), "{} is still metadata-only", file.display());
    }

    let view = f.api.view("v", "c3").expect("view");
    let mounted = Mounted::new(&view);
    let root = mounted.path();
    assert_eq!(read(&root.join("foo")), "two");
    assert!(!root.join("bar").exists(), "deleted in c2: whited out");
    assert_eq!(read(&root.join("baz")), "new");
    assert_eq!(
        read(&root.join("dir/kept")),
        "kept",
        "chowned file keeps its data"
    );
    assert_eq!(fs::metadata(root.join("dir/kept")).unwrap().uid(), 1234);
    drop(mounted);

    for (key, kind, parent) in [
        ("c1", Kind::Committed, ""),
        ("c2", Kind::Committed, "c1"),
        ("c3", Kind::Committed, "c2"),
        ("v", Kind::View, "c3"),
    ] {
        let info = f.api.stat(key).expect("stat");
        assert_eq!(
            (info.kind, info.parent.as_str()),
            (kind as i32, parent),
            "{key}"
        );
    }
    for key in ["p1", "p2", "p3"] {
        assert_eq!(
            f.api.stat(key).unwrap_err().code(),
            Code::NotFound,
            "{key} was committed"
        );
    }
}

/// A file copied up by metadata inside a renamed directory has no redirect of its own:
/// overlay finds its data at the directory's old name, following the directory's
/// redirect (in the upper, or in a committed layer below), and the commit must fill it
/// from there: after `mv a c; chmod 600 c/f` not from the lower's own `c/f`, and without
/// failing when the lower has none.
#[test]
fn a_metadata_only_copy_in_a_renamed_directory_is_filled_from_where_overlay_finds_it() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    commit_with(&f.api, "c1", "p1", "", |root| {
        for (dir, text) in [("a", "AAAA"), ("c", "CCCC"), ("x", "XXXX")] {
            fs::create_dir(root.join(dir)).unwrap();
            fs::write(root.join(dir).join("f"), text).unwrap();
        }
    });
    // A committed layer whose directory `y` redirects to c1's `x`.
    commit_with(&f.api, "c2", "p2", "c1", |root| {
        fs::rename(root.join("x"), root.join("y")).unwrap();
        fs::write(root.join("y/new"), "n").unwrap();
    });
    let mounts = f.api.prepare("p3", "c2", none()).unwrap();
    assert!(
        record_of(&f.daemon.store, "p3")
            .to_string()
            .contains("metacopy=on")
    );
    {
        let mounted = Mounted::new(&mounts);
        let root = mounted.path();
        fs::remove_dir_all(root.join("c")).unwrap();
        fs::rename(root.join("a"), root.join("c")).unwrap();
        for file in ["c/f", "y/f"] {
            fs::set_permissions(root.join(file), fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert_eq!(read(&root.join("c/f")), "AAAA", "what the container sees");
        assert_eq!(read(&root.join("y/f")), "XXXX", "what the container sees");
    }
    f.api.commit("c3", "p3", none()).unwrap();
    let layers = f.daemon.store.join("layers");
    for (rel, text) in [("diff/c/f", "AAAA"), ("diff/y/f", "XXXX")] {
        let filled: Vec<_> = files_under(&layers)
            .into_iter()
            .filter(|p| p.ends_with(rel) && fs::metadata(p).unwrap().mode() & 0o777 == 0o600)
            .collect();
        assert_eq!(filled.len(), 1, "c3's layer holds {rel}");
        assert_eq!(read(&filled[0]), text, "{rel} holds what the container saw");
    }
    let view = f.api.view("v", "c3").expect("view");
    let mounted = Mounted::new(&view);
    assert_eq!(read(&mounted.path().join("c/f")), "AAAA");
    assert_eq!(read(&mounted.path().join("y/f")), "XXXX");
}

/// The lookups overlay makes through renames the container, or a committed layer, made:
/// a redirect part-way along an absolute one, a directory moved out of a renamed one, a
/// metadata-only file renamed out of a renamed directory, and directories moved into new
/// (opaque) ones. The commit fills each with the data the container saw, as the kernel's
/// lookup finds it (guards against wrong data for the first two and a failed commit for
/// the rest).
#[test]
fn metadata_only_copies_are_filled_through_every_kind_of_rename() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture();
    let files = [
        ("a/c/f", "DATA-B"),
        ("c/f", "WRONG-B"),
        ("a2/y/f", "DATA-A"),
        ("x/y/f", "WRONG-A"),
        ("e/f", "DATA-E"),
        ("g/f", "DATA-G"),
        ("etc/conf", "DATA-H"),
        ("n/b/c/f", "DATA-N"),
    ];
    commit_with(&f.api, "c1", "p1", "", |root| {
        for (rel, text) in files {
            fs::create_dir_all(root.join(rel).parent().unwrap()).unwrap();
            fs::write(root.join(rel), text).unwrap();
        }
    });
    commit_with(&f.api, "c2", "p2", "c1", |root| {
        fs::rename(root.join("a/c"), root.join("a/b")).unwrap();
        fs::remove_dir_all(root.join("x")).unwrap();
        fs::rename(root.join("a2"), root.join("x")).unwrap();
        fs::rename(root.join("e"), root.join("x2")).unwrap();
        // `q` and `q/r` are new, so opaque; `cc` redirects to `/n/bb/c`, through `bb`'s
        // own redirect to `n/b`.
        fs::rename(root.join("n/b"), root.join("n/bb")).unwrap();
        fs::create_dir_all(root.join("q/r")).unwrap();
        fs::rename(root.join("n/bb/c"), root.join("q/r/cc")).unwrap();
    });
    let mounts = f.api.prepare("p3", "c2", none()).unwrap();
    let expected = [
        ("zb/f", "DATA-B"),
        ("za/f", "DATA-A"),
        ("ge", "DATA-E"),
        ("o/g2/f", "DATA-G"),
        ("backup/conf", "DATA-H"),
        ("q/cc2/f2", "DATA-N"),
    ];
    {
        let mounted = Mounted::new(&mounts);
        let root = mounted.path();
        fs::rename(root.join("a/b"), root.join("zb")).unwrap();
        fs::rename(root.join("x/y"), root.join("za")).unwrap();
        fs::rename(root.join("x2/f"), root.join("ge")).unwrap();
        fs::create_dir(root.join("o")).unwrap();
        fs::rename(root.join("g"), root.join("o/g2")).unwrap();
        fs::create_dir(root.join("backup")).unwrap();
        fs::rename(root.join("etc/conf"), root.join("backup/conf")).unwrap();
        fs::set_permissions(root.join("q/r/cc/f"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::rename(root.join("q/r/cc"), root.join("q/cc2")).unwrap();
        fs::rename(root.join("q/cc2/f"), root.join("q/cc2/f2")).unwrap();
        for (rel, text) in expected {
            fs::set_permissions(root.join(rel), fs::Permissions::from_mode(0o600)).unwrap();
            assert_eq!(
                read(&root.join(rel)),
                text,
                "what the container sees at {rel}"
            );
        }
    }
    f.api.commit("c3", "p3", none()).unwrap();
    let layers = f.daemon.store.join("layers");
    for (rel, text) in expected {
        let filled: Vec<_> = files_under(&layers)
            .into_iter()
            .filter(|p| {
                p.ends_with(format!("diff/{rel}"))
                    && fs::metadata(p).unwrap().mode() & 0o777 == 0o600
            })
            .collect();
        assert_eq!(filled.len(), 1, "c3's layer holds {rel}");
        assert_eq!(read(&filled[0]), text, "{rel} holds what the container saw");
    }
}

/// A Commit of a snapshot whose overlay is still mounted (containerd mounts it, lamina
/// cannot unmount it) is refused, naming the mount: its container could go on writing
/// the published layer every snapshot and container on it shares. Unmounted, the same
/// commit goes through, whole.
#[test]
fn a_commit_of_a_snapshot_still_mounted_is_refused_naming_the_mount() {
    commit_refused_while_mounted(fixture());
    // btrfs shows each subvolume's own device to `stat`, not in the mount table: guards
    // against a bind of an upper on btrfs going unseen.
    commit_refused_while_mounted(fixture_on(ScratchFs::loop_backed(
        FsKind::Btrfs,
        512,
        false,
    )));
}

fn commit_refused_while_mounted(f: Fixture) {
    let mounts = f.api.prepare("p", "", none()).unwrap();
    let mounted = Mounted::new(&mounts);
    fs::write(mounted.path().join("f"), "written").unwrap();
    let refused = f.api.commit("c", "p", none()).unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    let at = mounted.path().display().to_string();
    assert!(
        refused.message().contains("still mounted at") && refused.message().contains(&at),
        "{refused:?}"
    );
    assert_eq!(
        f.api.stat("p").unwrap().kind,
        Kind::Active as i32,
        "nothing recorded"
    );
    drop(mounted);
    f.api.commit("c", "p", none()).unwrap();
    let view = f.api.view("v", "c").unwrap();
    let mounted = Mounted::new(&view);
    assert_eq!(read(&mounted.path().join("f")), "written");
    // On a parent the answer is an overlay, found by its upper.
    let on_parent = f.api.prepare("p2", "c", none()).unwrap();
    assert_eq!(on_parent[0].r#type, "overlay", "{on_parent:?}");
    let mounted = Mounted::new(&on_parent);
    let refused = f.api.commit("c2", "p2", none()).unwrap_err();
    assert!(
        refused.message().contains("still mounted at"),
        "{refused:?}"
    );
    drop(mounted);
    f.api.commit("c2", "p2", none()).unwrap();
}

#[test]
fn views_are_read_only_and_keys_are_unique() {
    let f = fixture();
    commit_with(&f.api, "base", "p", "", |root| {
        fs::write(root.join("file"), "x").unwrap()
    });
    let view = f.api.view("view", "base").expect("view");
    let mounted = Mounted::new(&view);
    let err = fs::write(mounted.path().join("new"), "y").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_erofs()), "{err}");
    assert_eq!(read(&mounted.path().join("file")), "x");
    drop(mounted);

    assert_eq!(
        f.api.view("view", "base").unwrap_err().code(),
        Code::AlreadyExists
    );
    assert_eq!(
        f.api.prepare("view", "base", none()).unwrap_err().code(),
        Code::AlreadyExists
    );
    assert_eq!(
        f.api.prepare("x", "missing", none()).unwrap_err().code(),
        Code::NotFound
    );
    f.api.prepare("active", "base", none()).unwrap();
    let err = f.api.prepare("on-active", "active", none()).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    let err = f.api.commit("c", "view", none()).unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "a view cannot be committed: {err}"
    );
    assert_eq!(
        f.api.commit("base", "active", none()).unwrap_err().code(),
        Code::AlreadyExists,
        "a committed name is taken"
    );
}

fn libc_erofs() -> i32 {
    rustix::io::Errno::ROFS.raw_os_error()
}

#[test]
fn a_parent_with_children_cannot_be_removed() {
    let f = fixture();
    commit_with(&f.api, "parent", "p", "", |_| {});
    f.api.prepare("child", "parent", none()).unwrap();
    let err = f.api.remove("parent").unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("child"), "{err}");
    f.api.remove("child").unwrap();
    f.api.remove("parent").unwrap();
    assert_eq!(f.api.stat("parent").unwrap_err().code(), Code::NotFound);
    assert_eq!(f.api.remove("parent").unwrap_err().code(), Code::NotFound);
    // Cleanup collects the removed layer and finishes deferred deletes.
    f.api.cleanup().unwrap();
    assert_eq!(
        fs::read_dir(f.daemon.store.join("layers")).unwrap().count(),
        0
    );
    wait_until("deferred deletes", || {
        fs::read_dir(f.daemon.store.join("images")).unwrap().count() == 0
    });
    assert!(mounts_under(&f.daemon.store).is_empty());
}

#[test]
fn walk_filters_select_by_name_parent_kind_and_labels() {
    let f = fixture();
    commit_with(&f.api, "c1", "p1", "", |_| {});
    f.api
        .prepare("a1", "c1", labels(&[("team", "red"), ("tier", "1")]))
        .unwrap();
    f.api
        .prepare("a2", "c1", labels(&[("team", "blue")]))
        .unwrap();
    f.api.view("v1", "c1").unwrap();

    let list = |filters: &[&str]| f.api.list(filters).expect("list");
    assert_eq!(list(&[]), ["a1", "a2", "c1", "v1"]);
    assert_eq!(list(&["kind==committed"]), ["c1"]);
    assert_eq!(list(&["parent==c1"]), ["a1", "a2", "v1"]);
    assert_eq!(list(&["labels.team==red"]), ["a1"]);
    assert_eq!(list(&["labels.team"]), ["a1", "a2"]);
    assert_eq!(
        list(&["labels.team==red,labels.tier==2"]),
        Vec::<String>::new()
    );
    assert_eq!(list(&["name==a2", "kind==view"]), ["a2", "v1"]);
    assert_eq!(list(&[r#"labels."team"!=red,kind==active"#]), ["a2"]);
    let err = f.api.list(&["labels.team=="]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
}

#[test]
fn usage_counts_what_a_snapshot_wrote() {
    let f = fixture();
    let mounts = f.api.prepare("p", "", none()).unwrap();
    let mounted = Mounted::new(&mounts);
    fs::create_dir(mounted.path().join("d")).unwrap();
    for i in 0..4 {
        fs::write(mounted.path().join(format!("d/f{i}")), vec![7u8; 8192]).unwrap();
    }
    drop(mounted);
    let (bytes, inodes) = f.api.usage("p").unwrap();
    assert!(bytes >= 4 * 8192, "{bytes} bytes");
    assert_eq!(inodes, 6, "the root, d and four files");
    f.api.commit("c", "p", none()).unwrap();
    assert_eq!(
        f.api.usage("c").unwrap(),
        (bytes, inodes),
        "a commit moves, not copies"
    );
    f.api.view("v", "c").unwrap();
    assert_eq!(f.api.usage("v").unwrap(), (0, 0), "a view writes nothing");
    assert_eq!(f.api.usage("nope").unwrap_err().code(), Code::NotFound);
}

/// containerd asks every active snapshot's Usage every 10 s. A walked upper's answer is
/// reused for a while (30 s at least), so many containers writing many files cost a
/// bounded share of the daemon; an upper with a filesystem of its own answers exactly,
/// every time, from its statfs.
#[test]
fn a_walked_usage_is_reused_and_an_isolated_upper_answers_each_time() {
    let f = fixture();
    commit_with(&f.api, "base", "base-key", "", |root| {
        fs::write(root.join("b"), "b").unwrap()
    });
    let write_files = |key: &str, from: usize| {
        let mounts = f.api.mounts(key).unwrap();
        let mounted = Mounted::new(&mounts);
        for i in from..from + 20 {
            fs::write(mounted.path().join(format!("f{i}")), vec![1u8; 4096]).unwrap();
        }
    };
    f.api.prepare("walked", "base", none()).unwrap();
    write_files("walked", 0);
    let first = f.api.usage("walked").unwrap();
    write_files("walked", 20);
    assert_eq!(f.api.usage("walked").unwrap(), first, "reused");
    // A snapshot made again under the key is measured anew.
    f.api.remove("walked").unwrap();
    f.api.prepare("walked", "base", none()).unwrap();
    assert!(f.api.usage("walked").unwrap().1 < first.1);

    let isolated = labels(&[("containerd.io/snapshot/lamina.strategy", "isolated-memory")]);
    f.api.prepare("own", "base", isolated).unwrap();
    write_files("own", 0);
    let before = f.api.usage("own").unwrap();
    write_files("own", 20);
    let after = f.api.usage("own").unwrap();
    assert!(after.1 >= before.1 + 20, "{before:?} then {after:?}");
}

#[test]
fn stat_and_update_change_labels_only() {
    let f = fixture();
    f.api
        .prepare("a", "", labels(&[("one", "1"), ("two", "2")]))
        .unwrap();
    let info = f.api.stat("a").unwrap();
    assert_eq!(info.labels, labels(&[("one", "1"), ("two", "2")]));
    let created = info.created_at.unwrap();

    let mut change = info.clone();
    change.labels = labels(&[("one", "uno")]);
    let updated = f.api.update(change.clone(), &["labels.one"]).unwrap();
    assert_eq!(updated.labels, labels(&[("one", "uno"), ("two", "2")]));
    let updated = f.api.update(change.clone(), &["labels.two"]).unwrap();
    assert_eq!(
        updated.labels,
        labels(&[("one", "uno")]),
        "absent from info: removed"
    );
    change.labels = labels(&[("three", "3")]);
    let updated = f.api.update(change.clone(), &[]).unwrap();
    assert_eq!(
        updated.labels,
        labels(&[("three", "3")]),
        "no paths: all replaced"
    );
    let later = updated.updated_at.unwrap();
    assert!((later.seconds, later.nanos) > (created.seconds, created.nanos));
    assert_eq!(f.api.stat("a").unwrap().labels, labels(&[("three", "3")]));

    let err = f.api.update(change.clone(), &["parent"]).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    change.name = "nope".into();
    assert_eq!(
        f.api.update(change, &[]).unwrap_err().code(),
        Code::NotFound
    );
}

#[test]
fn a_layer_lamina_already_has_answers_already_exists_and_boots() {
    let f = fixture();
    let files = sample_image(&f.fs.path().join("image"));
    let lamina = Lamina::new(&f.daemon.store);
    lamina.create(&files.references()[0], "garden");
    let record = lamina_integration::records::record_json(
        &f.daemon.store.join("images/garden/container.json"),
    );
    let chain: Vec<&str> = record["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    let reference = |chain_id: &str| labels(&[("containerd.io/snapshot.ref", chain_id)]);

    // What containerd's pull does for each layer: prepare with the ref label; on
    // AlreadyExists, find the committed snapshot with a filtered walk.
    let mut parent = String::new();
    for (i, chain_id) in chain.iter().enumerate() {
        let key = format!("default/{i}/extract-1 {chain_id}");
        let err = f
            .api
            .prepare(&key, &parent, reference(chain_id))
            .unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{err}");
        let filter =
            format!(r#"labels."containerd.io/snapshot.ref"=={chain_id},parent=="{parent}""#);
        let found = f.api.list(&[&filter]).unwrap();
        assert_eq!(found.len(), 1, "{filter}: {found:?}");
        assert_eq!(f.api.stat(&found[0]).unwrap().kind, Kind::Committed as i32);
        parent = found[0].clone();
    }
    assert_eq!(
        fs::read_dir(f.daemon.store.join("layers")).unwrap().count(),
        chain.len(),
        "no layer was extracted twice"
    );
    // A second namespace asking again finds the same snapshots.
    let err = f
        .api
        .prepare("other/9/extract-2 x", "", reference(chain[0]))
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    // With a pool of the image ready (filled for Garden), a container takes a
    // pre-mounted overlay: lamina answers a bind of it, no overlay mount on the way.
    let image = &files.references()[0];
    let filled = lamina.run(&["pool", "fill", "--size", "1", image]);
    assert_eq!(filled.code, 0, "{filled:?}");
    let pooled = f.api.prepare("pooled", &parent, none()).unwrap();
    assert_eq!(pooled[0].r#type, "bind", "{pooled:?}");
    let record = record_of(&f.daemon.store, "pooled");
    assert!(
        record["strategy"].as_str().unwrap().contains("pooled"),
        "{record}"
    );
    assert_eq!(record["mounted"], true);
    let mounted = Mounted::new(&pooled);
    assert_eq!(
        read(&mounted.path().join("top.txt")),
        "from the top layer\n"
    );
    drop(mounted);

    // A container on the shared layers boots in runc and sees the merged image.
    let mounts = f.api.prepare("container", &parent, classic()).unwrap();
    let mounted = Mounted::new(&mounts);
    let bundle = Bundle::new(mounted.path(), false);
    let out = bundle.run(&format!("lamina-snap-{}", std::process::id()), PROOF);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, MERGED),
        "{}",
        out.stderr
    );
}

#[test]
fn strategy_and_ephemeral_labels_pick_the_mount() {
    let f = fixture();
    commit_with(&f.api, "base", "p", "", |root| {
        fs::write(root.join("f"), "x").unwrap()
    });
    commit_with(&f.api, "top", "p2", "base", |root| {
        fs::write(root.join("g"), "y").unwrap()
    });
    let record = |key: &str| record_of(&f.daemon.store, key);
    let option = |m: &[Mount], want: &str| m[0].options.iter().any(|o| o == want);

    // An ephemeral snapshot gets a volatile upper, which lamina mounts itself (an overlay
    // containerd unmounted could not be mounted again): containerd binds it, twice over
    // as a task restart does.
    let ephemeral = labels(&[("containerd.io/snapshot/lamina.ephemeral", "true")]);
    let m = f.api.prepare("eph", "top", ephemeral).unwrap();
    assert_eq!(m[0].r#type, "bind", "{m:?}");
    let eph = record("eph");
    assert!(
        eph["strategy"].as_str().unwrap().contains("volatile"),
        "{eph}"
    );
    assert!(
        eph["mount_options"].to_string().contains("volatile"),
        "{eph}"
    );
    for _ in 0..2 {
        let mounted = Mounted::new(&f.api.mounts("eph").unwrap());
        assert_eq!(read(&mounted.path().join("g")), "y");
    }

    // containerd mounts other overlays itself, with the options the strategy chose.
    let m = f
        .api
        .prepare(
            "mc",
            "top",
            labels(&[("containerd.io/snapshot/lamina.strategy", "metacopy")]),
        )
        .unwrap();
    assert_eq!(m[0].r#type, "overlay", "{m:?}");
    assert!(option(&m, "metacopy=on"), "{m:?}");
    let mounted = Mounted::new(&m);
    assert_eq!(read(&mounted.path().join("g")), "y");
    drop(mounted);

    let m = f.api.prepare("cl", "top", classic()).unwrap();
    assert_eq!(record("cl")["strategy"], "classic");
    assert!(
        !option(&m, "metacopy=on") && !option(&m, "volatile"),
        "{m:?}"
    );

    // A view of a multi-layer image binds the image's one shared read-only overlay.
    let m = f.api.view("ro", "top").unwrap();
    assert_eq!(record("ro")["strategy"], "shared-ro,deferred");
    assert_eq!(
        (m[0].r#type.as_str(), option(&m, "ro")),
        ("bind", true),
        "{m:?}"
    );
    assert!(m[0].source.contains("/shared/"), "{m:?}");
    let again = f.api.view("ro2", "top").unwrap();
    assert_eq!(
        again[0].source, m[0].source,
        "one shared mount for every view"
    );

    let err = f
        .api
        .prepare(
            "bad",
            "top",
            labels(&[("containerd.io/snapshot/lamina.strategy", "bogus")]),
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .contains("containerd.io/snapshot/lamina.strategy"),
        "{err}"
    );
    assert!(err.message().contains("bogus"), "{err}");
}

#[test]
fn metadata_survives_restarts_and_a_crash_mid_commit() {
    require_root();
    let fs_ = ScratchFs::ext4(512);
    let store = fs_.path().join("store");
    let socket = fs_.path().join("lamina.sock");
    let mut daemon = Daemon::start_paused_at(&store, &socket, "commit-published");
    let api = Api::connect(&socket);
    let mounts = api.prepare("p1", "", none()).unwrap();
    {
        let mounted = Mounted::new(&mounts);
        fs::write(mounted.path().join("file"), "survives").unwrap();
    }
    api.prepare("other", "", labels(&[("keep", "me")])).unwrap();
    // The commit stops after publishing the layer, before the metadata says so: kill it.
    let committing = std::thread::spawn(move || api.commit("c1", "p1", none()));
    wait_until("the commit to reach its fault point", || {
        fs::read_dir(store.join("run")).unwrap().flatten().any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("paused-commit-published")
        })
    });
    daemon.crash_and_restart();
    assert!(
        committing.join().unwrap().is_err(),
        "the killed call failed"
    );

    let api = Api::connect(&socket);
    assert_eq!(
        api.stat("c1").unwrap().kind,
        Kind::Committed as i32,
        "recovery finished it"
    );
    assert_eq!(api.stat("p1").unwrap_err().code(), Code::NotFound);
    assert_eq!(api.stat("other").unwrap().labels, labels(&[("keep", "me")]));
    let view = api.view("v", "c1").unwrap();
    let mounted = Mounted::new(&view);
    assert_eq!(read(&mounted.path().join("file")), "survives");
    drop(mounted);

    // A clean restart keeps everything too, and mounts still answer.
    daemon.crash_and_restart();
    let api = Api::connect(&socket);
    assert_eq!(api.list(&[]).unwrap(), ["c1", "other", "v"]);
    assert!(api.mounts("v").is_ok());
    let containers = fs::read_dir(store.join("images")).unwrap().count();
    assert_eq!(
        containers, 2,
        "one per active or view; the committed one's is gone"
    );
    drop(api);
    drop(daemon);
}

/// Without `remap-ids` containerd chowns a copy of the image for the mapping — every
/// owner shifted by it, the root's too — commits it over the image, and prepares the
/// container on it with the mapping labels still on. lamina does not map that copy a
/// second time, whatever owns the image's root; an image not so chowned is mapped.
#[test]
fn an_image_containerd_chowned_for_a_mapping_is_not_mapped_again() {
    use std::os::unix::fs::{MetadataExt, chown};
    let f = fixture();
    let owner = |path: &Path| {
        let m = fs::metadata(path).unwrap();
        (m.uid(), m.gid())
    };
    commit_with(&f.api, "image", "p", "", |root| {
        fs::write(root.join("file"), "x").unwrap();
        chown(root.join("file"), Some(0), Some(0)).unwrap();
        chown(root, Some(1000), Some(1000)).unwrap();
    });
    commit_with(&f.api, "chowned", "q", "image", |root| {
        chown(root.join("file"), Some(100_000), Some(100_000)).unwrap();
        chown(root, Some(101_000), Some(101_000)).unwrap();
    });
    let mapping = labels(&[
        ("containerd.io/snapshot/uidmapping", "0:100000:65536"),
        ("containerd.io/snapshot/gidmapping", "0:100000:65536"),
    ]);
    let on_copy = f.api.prepare("c", "chowned", mapping.clone()).unwrap();
    {
        let m = Mounted::new(&on_copy);
        assert_eq!(owner(&m.path().join("file")), (100_000, 100_000));
        assert_eq!(owner(m.path()), (101_000, 101_000));
    }
    // On the image itself the mapping applies: its root-owned file is the mapped root's
    // (and so is `/`, an idmapped snapshot's upper root).
    let on_image = f.api.prepare("d", "image", mapping).unwrap();
    let m = Mounted::new(&on_image);
    assert_eq!(owner(&m.path().join("file")), (100_000, 100_000));
}

/// containerd's `uidmapping`/`gidmapping` labels (containerd 2.x's `remap-ids`): the
/// snapshot shows its layers through idmapped mounts — a file the image gives to root is
/// the mapped root's, with no chowned copy of the image — mounted by lamina and bound by
/// containerd, again after its rootfs was unmounted (a host restart). What such a
/// snapshot writes carries host ids, so it cannot be committed; bad labels are refused.
#[test]
fn uid_and_gid_mapping_labels_give_an_idmapped_rootfs() {
    use std::os::unix::fs::{MetadataExt, chown};
    let f = fixture();
    commit_with(&f.api, "base", "p", "", |root| {
        fs::write(root.join("root-owned"), "x").unwrap();
        chown(root.join("root-owned"), Some(0), Some(0)).unwrap();
        fs::write(root.join("seven-owned"), "y").unwrap();
        chown(root.join("seven-owned"), Some(7), Some(8)).unwrap();
    });
    let mapping = [
        ("containerd.io/snapshot/uidmapping", "0:100000:65536"),
        ("containerd.io/snapshot/gidmapping", "0:200000:65536"),
    ];
    let owner = |path: &Path| {
        let m = fs::metadata(path).unwrap();
        (m.uid(), m.gid())
    };
    let mounts = f.api.prepare("c", "base", labels(&mapping)).unwrap();
    assert_eq!(mounts[0].r#type, "bind", "lamina mounts it: {mounts:?}");
    {
        let m = Mounted::new(&mounts);
        assert_eq!(owner(&m.path().join("root-owned")), (100_000, 200_000));
        assert_eq!(owner(&m.path().join("seven-owned")), (100_007, 200_008));
        assert_eq!(
            owner(m.path()),
            (100_000, 200_000),
            "the mapped root owns /"
        );
        fs::write(m.path().join("written"), "z").unwrap();
    }
    // Unmounted behind lamina's back, as a host restart leaves it: Mounts mounts it
    // again, still idmapped, with what was written.
    let rootfs = container_dir(&f.daemon.store, "c").join("rootfs");
    rustix::mount::unmount(&rootfs, rustix::mount::UnmountFlags::empty()).unwrap();
    {
        let m = Mounted::new(&f.api.mounts("c").unwrap());
        assert_eq!(owner(&m.path().join("root-owned")), (100_000, 200_000));
        assert_eq!(read(&m.path().join("written")), "z");
    }
    // A read-only snapshot with the labels: the same, read-only.
    let view = f.api.view_with("v", "base", labels(&mapping)).unwrap();
    {
        let m = Mounted::new(&view);
        assert_eq!(owner(&m.path().join("seven-owned")), (100_007, 200_008));
        assert!(
            fs::write(m.path().join("nope"), "x").is_err(),
            "a view is read-only"
        );
    }

    let err = f.api.commit("layer", "c", none()).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    // Dropping the labels first changes nothing: the refusal reads the container's record,
    // which says idmapped, not the labels, which Update can remove.
    let mut info = f.api.stat("c").unwrap();
    info.labels.clear();
    f.api.update(info, &["labels"]).unwrap();
    let err = f.api.commit("layer", "c", none()).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("idmapped"), "{err}");
    let refused = |pairs: &[(&str, &str)]| {
        let err = f.api.prepare("bad", "base", labels(pairs)).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{pairs:?}: {err}");
    };
    refused(&mapping[..1]);
    refused(&[mapping[0], ("containerd.io/snapshot/gidmapping", "0:1:0")]);
    refused(&[
        mapping[0],
        mapping[1],
        ("containerd.io/snapshot/lamina.strategy", "shared-ro"),
    ]);
    for key in ["c", "v"] {
        f.api.remove(key).unwrap();
    }
    wait_until("deferred deletes", || {
        mounts_under(&f.daemon.store.join("images")).is_empty()
            && mounts_under(&f.daemon.store.join("trash")).is_empty()
    });
}

/// A store whose snapshots an earlier release kept in `snapshots/metadata.json` (one JSON
/// file, rewritten whole on every call) opens with them all in the database: same keys,
/// parents, labels, layers and containers, and container numbers not reused.
#[test]
fn a_store_with_json_metadata_is_migrated_on_first_open() {
    let mut f = fixture();
    commit_with(&f.api, "base", "p", "", |root| {
        fs::write(root.join("f"), "from the old store").unwrap()
    });
    f.api
        .prepare("active", "base", labels(&[("keep", "me")]))
        .unwrap();
    f.api.view("v", "base").unwrap();
    let store = f.fs.path().join("store");
    let before = f.api.list(&[]).unwrap();
    let active_container = container_of(&store, "active");
    f.daemon.stop_and_restart(|| {
        // What an earlier release kept, written from the records: the same shape, and
        // no database beside it.
        let opened = lamina_store::Store::open(&store).unwrap();
        let index = opened.snapshots().unwrap();
        let mut snapshots = std::collections::BTreeMap::new();
        index
            .for_each(|key, record| {
                snapshots.insert(key, record);
            })
            .unwrap();
        let old = serde_json::json!({
            "next_id": index.next_container_number().unwrap(),
            "snapshots": snapshots,
        });
        drop(index);
        for name in ["metadata.db", "metadata.db-wal", "metadata.db-shm"] {
            let _ = fs::remove_file(store.join("snapshots").join(name));
        }
        fs::write(
            store.join("snapshots/metadata.json"),
            serde_json::to_vec_pretty(&old).unwrap(),
        )
        .unwrap();
    });
    let api = Api::connect(&f.daemon.socket);
    assert_eq!(api.list(&[]).unwrap(), before);
    assert_eq!(
        api.stat("active").unwrap().labels,
        labels(&[("keep", "me")])
    );
    assert_eq!(api.stat("active").unwrap().parent, "base");
    assert_eq!(container_of(&store, "active"), active_container);
    let view = api.mounts("v").unwrap();
    {
        let mounted = Mounted::new(&view);
        assert_eq!(read(&mounted.path().join("f")), "from the old store");
    }
    api.prepare("new", "base", none()).unwrap();
    let numbers: std::collections::HashSet<_> = ["active", "v", "new"]
        .iter()
        .map(|key| container_of(&store, key))
        .collect();
    assert_eq!(
        numbers.len(),
        3,
        "a migrated store reuses no container number"
    );
    // The file an earlier release would read is a tombstone it cannot parse (it would
    // otherwise see no snapshots and remove their containers); the migrated one is kept.
    let tombstone = read(&store.join("snapshots/metadata.json"));
    assert!(
        tombstone.contains("lamina_snapshots_moved_to"),
        "{tombstone}"
    );
    assert!(store.join("snapshots/metadata.json.migrated").exists());
    for key in ["new", "active", "v"] {
        api.remove(key).unwrap();
    }
    api.remove("base").unwrap();
}

/// One row of the snapshotter's strategy table: the label, and what comes of it.
struct LabelRow {
    strategy: &'static str,
    /// The rootfs is read-only (a read-only strategy on Prepare).
    read_only: bool,
    /// Commit refuses it (its upper is on a filesystem of its own).
    commit_refused: bool,
    /// Prepare itself is refused with this code.
    refused: Option<Code>,
}

const fn rw(strategy: &'static str) -> LabelRow {
    LabelRow {
        strategy,
        read_only: false,
        commit_refused: false,
        refused: None,
    }
}

const fn own_upper(strategy: &'static str) -> LabelRow {
    LabelRow {
        commit_refused: true,
        ..rw(strategy)
    }
}

const fn read_only(strategy: &'static str) -> LabelRow {
    LabelRow {
        read_only: true,
        ..rw(strategy)
    }
}

/// The conformance table through gRPC (crates/lamina-conformance runs it against the
/// library): for each strategy label, Prepare on a two-layer parent → write through
/// containerd-style mounts → Mounts (the same answer, the write still there) → Commit →
/// View of the commit → Remove; then nothing is left mounted or stored.
#[test]
fn every_strategy_label_runs_prepare_write_mounts_commit_view_remove() {
    let f = fixture();
    commit_with(&f.api, "base", "p", "", |root| {
        fs::write(root.join("f"), "x").unwrap()
    });
    commit_with(&f.api, "top", "p2", "base", |root| {
        fs::write(root.join("g"), "y").unwrap()
    });
    let table = [
        rw("classic"),
        rw("metacopy"),
        rw("volatile"),
        rw("metacopy,volatile"),
        rw("deferred"),
        rw("metacopy,deferred"),
        rw("metacopy,volatile,deferred"),
        rw("auto"),
        own_upper("isolated"),
        own_upper("isolated,metacopy"),
        own_upper("isolated,volatile"),
        own_upper("isolated-memory"),
        own_upper("isolated-memory,metacopy,volatile"),
        rw("composefs"),
        rw("composefs,volatile"),
        own_upper("composefs,isolated-memory"),
        read_only("shared-ro"),
        read_only("direct"),
        // No pool of these layers: a named `pooled` is refused, never served fresh.
        LabelRow {
            refused: Some(Code::FailedPrecondition),
            ..rw("pooled")
        },
    ];
    let mut failures = Vec::new();
    for (n, row) in table.iter().enumerate() {
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| label_row(&f, n, row)));
        if let Err(panic) = outcome {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {why}", row.strategy));
            // Leave nothing of the failed row for the next.
            for key in [format!("a{n}"), format!("c{n}"), format!("v{n}")] {
                let _ = f.api.remove(&key);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    f.api.remove("top").unwrap();
    f.api.remove("base").unwrap();
    f.api.cleanup().unwrap();
    wait_until("deferred deletes", || {
        fs::read_dir(f.daemon.store.join("images")).unwrap().count() == 0
    });
    assert!(mounts_under(&f.daemon.store).is_empty());
    assert_eq!(
        fs::read_dir(f.daemon.store.join("layers")).unwrap().count(),
        0
    );
}

fn label_row(f: &Fixture, n: usize, row: &LabelRow) {
    let label = labels(&[("containerd.io/snapshot/lamina.strategy", row.strategy)]);
    let (active, committed, view) = (format!("a{n}"), format!("c{n}"), format!("v{n}"));
    let mounts = match (f.api.prepare(&active, "top", label), row.refused) {
        (Err(status), Some(code)) => {
            assert_eq!(status.code(), code, "{status}");
            assert!(status.message().contains(row.strategy), "{status}");
            assert_eq!(f.api.stat(&active).unwrap_err().code(), Code::NotFound);
            return;
        }
        (Ok(mounts), Some(code)) => panic!("prepare was not refused with {code:?}: {mounts:?}"),
        (Err(status), None) => panic!("prepare: {status}"),
        (Ok(mounts), None) => mounts,
    };
    let written = format!("written by {}", row.strategy);
    {
        let mounted = Mounted::new(&mounts);
        let root = mounted.path();
        assert_eq!(read(&root.join("f")), "x");
        assert_eq!(read(&root.join("g")), "y");
        let wrote = fs::write(root.join("new"), &written);
        if row.read_only {
            assert_eq!(
                wrote.unwrap_err().raw_os_error(),
                Some(libc_erofs()),
                "read-only"
            );
        } else {
            wrote.unwrap();
        }
    }
    let again = f.api.mounts(&active).unwrap();
    assert_eq!(again, mounts, "Mounts answers what Prepare did");
    if !row.read_only {
        let mounted = Mounted::new(&again);
        assert_eq!(read(&mounted.path().join("new")), written, "kept");
    }
    if row.read_only {
        // A read-only bind wrote nothing: committing it adds an empty layer.
        f.api.commit(&committed, &active, none()).unwrap();
        let mounts = f.api.view(&view, &committed).unwrap();
        {
            let mounted = Mounted::new(&mounts);
            assert_eq!(read(&mounted.path().join("g")), "y");
            assert!(!mounted.path().join("new").exists());
        }
        f.api.remove(&view).unwrap();
        f.api.remove(&committed).unwrap();
        return;
    }
    match f.api.commit(&committed, &active, none()) {
        Err(status) if row.commit_refused => {
            assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
            f.api.remove(&active).unwrap();
            return;
        }
        Err(status) => panic!("commit: {status}"),
        Ok(()) if row.commit_refused => panic!("commit of an isolated upper succeeded"),
        Ok(()) => {}
    }
    let mounts = f.api.view(&view, &committed).unwrap();
    {
        let mounted = Mounted::new(&mounts);
        assert_eq!(read(&mounted.path().join("new")), written, "committed");
        assert_eq!(read(&mounted.path().join("g")), "y");
    }
    f.api.remove(&view).unwrap();
    f.api.remove(&committed).unwrap();
    assert_eq!(f.api.stat(&committed).unwrap_err().code(), Code::NotFound);
}

/// A volatile snapshot's overlay is lamina's to mount: once it is gone behind lamina's
/// back (a host restart takes every mount, the kernel's marker stays), neither Mounts
/// nor Commit hands out or publishes an upper that may have lost writes; both refuse
/// with FailedPrecondition, and Remove still tears it down.
#[test]
fn a_volatile_snapshot_that_lost_its_mount_is_refused_not_bound_or_published() {
    let f = fixture();
    commit_with(&f.api, "base", "p", "", |root| {
        fs::write(root.join("f"), "x").unwrap()
    });
    let volatile = labels(&[("containerd.io/snapshot/lamina.strategy", "volatile")]);
    let m = f.api.prepare("v", "base", volatile).unwrap();
    assert_eq!(m[0].r#type, "bind", "{m:?}");
    {
        let mounted = Mounted::new(&m);
        fs::write(mounted.path().join("w"), "written").unwrap();
    }
    // What a reboot leaves: lamina's overlay gone, its volatile marker still there.
    let rootfs = PathBuf::from(&m[0].source);
    rustix::mount::unmount(&rootfs, rustix::mount::UnmountFlags::empty()).unwrap();

    let err = f.api.mounts("v").unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("not cleanly unmounted"), "{err:?}");
    let err = f.api.commit("c", "v", none()).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(f.api.view("c-view", "c").is_err(), "nothing was published");

    f.api.remove("v").unwrap();
    f.api.remove("base").unwrap();
    assert!(mounts_under(&f.daemon.store).is_empty());
}

/// `Mounts` names each layer by its short link (`l/<8 hex>`), so a deep chain fits the
/// one page of options containerd mounts from (`containerd.rs` runs 128 and 300 layers
/// through ctr). Past what a page can hold even so, `Prepare` refuses, naming the depth,
/// instead of answering with options no mount takes.
#[test]
fn deep_chains_mount_by_short_links_and_past_a_page_are_refused_naming_the_depth() {
    let f = fixture();
    let store = f.fs.path().join("store");
    let mut parent = String::new();
    let mut refused = None;
    for n in 0..500 {
        let key = format!("k{n}");
        match f.api.prepare(&key, &parent, classic()) {
            Ok(_) => {}
            Err(err) => {
                refused = Some((n, key, err));
                break;
            }
        }
        parent = format!("c{n}");
        f.api.commit(&parent, &key, none()).expect("commit");
        if n == 127 {
            let mounts = f.api.prepare("at128", &parent, classic()).unwrap();
            let lowers: Vec<&str> = mounts[0]
                .options
                .iter()
                .find_map(|o| o.strip_prefix("lowerdir="))
                .unwrap()
                .split(':')
                .collect();
            assert_eq!(lowers.len(), 128);
            for lower in &lowers {
                let link = Path::new(lower);
                assert_eq!(link.parent(), Some(store.join("l").as_path()), "{lower}");
                assert_eq!(link.file_name().unwrap().len(), 8, "{lower}");
                assert!(link.is_dir(), "{lower} resolves");
            }
            // mount(8) here would pass the absolute paths and overflow the page;
            // containerd mounts from inside `l/` (ctr runs it in `containerd.rs`).
            assert!(lowers.iter().map(|l| l.len() + 1).sum::<usize>() > 4096);
            f.api.remove("at128").unwrap();
        }
    }
    // About 370 layers fit: containerd also mounts the answer read-only, with the upper
    // at the front of `lowerdir`, where each layer costs `l/` more (docs/containerd.md).
    let (depth, key, err) = refused.expect("a chain of 500 was accepted");
    assert!(depth > 350, "refused at only {depth} layers: {err:?}");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains(&format!("{depth} layers")),
        "{err:?}"
    );
    assert!(err.message().contains("one page"), "{err:?}");
    assert_eq!(f.api.stat(&key).unwrap_err().code(), Code::NotFound);
    let left: Vec<_> = fs::read_dir(store.join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "the refused prepare left {left:?}");
}

/// `containerd.io/snapshot/max-size` gives an active snapshot a hard limit on what it
/// writes (the image not counted, as containerd's overlayfs snapshotter counts it): its
/// upper gets a filesystem of that size. Writes under it succeed, a write past it fails
/// with ENOSPC, and a snapshot without the label beside it is not limited. A value that
/// is not a number of bytes, is below 8 MiB or above the store's size, or a strategy that
/// cannot isolate, is refused.
#[test]
fn the_max_size_label_limits_what_a_snapshot_writes() {
    let f = fixture();
    commit_with(&f.api, "base", "p", "", |root| {
        fs::write(root.join("f"), "x").unwrap()
    });
    let limit = 16u64 << 20;
    let limited = labels(&[("containerd.io/snapshot/max-size", &limit.to_string())]);
    let mounts = f.api.prepare("small", "base", limited).unwrap();
    let free = f.api.prepare("free", "base", none()).unwrap();
    let upper_fs = container_dir(&f.daemon.store, "small").join("upperfs");
    {
        let small = Mounted::new(&mounts);
        let free = Mounted::new(&free);
        let chunk = vec![7u8; 1 << 20];
        let write = |dir: &Path, name: &str, mib: usize| -> std::io::Result<()> {
            let mut file = fs::File::create(dir.join(name))?;
            for _ in 0..mib {
                std::io::Write::write_all(&mut file, &chunk)?;
            }
            file.sync_all()
        };
        write(small.path(), "under", 8).expect("8 MiB under a 16 MiB limit");
        let err = write(small.path(), "over", 16).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc_enospc()), "{err}");
        write(free.path(), "big", 32).expect("the unlimited neighbour");

        // Usage comes from the upper filesystem's own statfs, not a walk of the upper:
        // a file beside the upper on that filesystem is counted too.
        fs::remove_file(small.path().join("over")).unwrap();
        write(&upper_fs, "beside-the-upper", 2).unwrap();
        let (bytes, inodes) = f.api.usage("small").unwrap();
        let mib = 1i64 << 20;
        assert!(
            (10 * mib..11 * mib).contains(&bytes),
            "{bytes} bytes: 8 MiB written, 2 MiB beside"
        );
        assert!(inodes >= 3, "{inodes}");
        fs::remove_file(upper_fs.join("beside-the-upper")).unwrap();
    }

    // A host restart leaves the upper filesystem unmounted; `Mounts` mounts it again
    // (it used to answer an overlay whose upperdir did not exist).
    let out = std::process::Command::new("umount")
        .arg(&upper_fs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let again = f.api.mounts("small").unwrap();
    {
        let small = Mounted::new(&again);
        assert_eq!(
            fs::metadata(small.path().join("under")).unwrap().len(),
            8 << 20
        );
    }
    // Not a number, below the smallest upper filesystem, more than the store holds (a
    // pod annotation can set it: that would be minutes of mkfs under the snapshot lock),
    // and a strategy that cannot isolate.
    for (value, strategy) in [
        ("ten", "auto"),
        ("0", "auto"),
        ("4096", "auto"),
        ("1000000000000000000", "auto"),
        ("18446744073709551615", "isolated-memory"),
        ("16777216", "classic"),
    ] {
        let label = labels(&[
            ("containerd.io/snapshot/max-size", value),
            ("containerd.io/snapshot/lamina.strategy", strategy),
        ]);
        let err = f.api.prepare("refused", "base", label).unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{value} {strategy}: {err:?}"
        );
        assert_eq!(f.api.stat("refused").unwrap_err().code(), Code::NotFound);
    }
    // Checked on a snapshot it would not limit too (no parent: an empty directory).
    let bad = labels(&[("containerd.io/snapshot/max-size", "ten")]);
    let err = f.api.prepare("no-parent", "", bad).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    for key in ["small", "free", "base"] {
        f.api.remove(key).unwrap();
    }
}

fn libc_enospc() -> i32 {
    28
}

/// Fills the filesystem `file` is on to its last block (root may use the reserved ones
/// too), so that what is written next fails with ENOSPC.
fn fill(file: &Path) {
    use std::io::Write;
    let mut out = fs::File::create(file).unwrap();
    for chunk in [1 << 20, 4096, 512] {
        let bytes = vec![0u8; chunk];
        while out.write_all(&bytes).is_ok() {}
    }
    let _ = out.sync_all();
}

/// A commit on a nearly full store fails at whichever step runs out of space first, and
/// never loses or strands what the snapshot wrote: the same commit, once space is freed,
/// succeeds and a view of it reads the files; meanwhile `check` reports a commit left
/// unfinished rather than calling the store sound. Tried with several amounts of space
/// left, so the failure falls on different steps (recording the intent, staging the
/// layer, its record, the rename, the committed row).
#[test]
fn a_commit_that_fails_on_a_full_store_is_finished_by_the_same_commit_again() {
    let f = fixture_on(ScratchFs::ext4(64));
    let store = f.fs.path().join("store");
    let lamina = Lamina::new(&store);
    let filler = f.fs.path().join("filler");
    let mut failures = 0;
    for (round, free_kib) in [0u64, 4, 8, 16, 32, 64, 128].into_iter().enumerate() {
        let (key, name) = (format!("w{round}"), format!("c{round}"));
        let mounts = f.api.prepare(&key, "", classic()).unwrap();
        {
            let mounted = Mounted::new(&mounts);
            fs::create_dir(mounted.path().join("dir")).unwrap();
            for n in 0..20 {
                fs::write(
                    mounted.path().join(format!("dir/{n}")),
                    format!("{round}:{n}"),
                )
                .unwrap();
            }
        }
        fill(&filler);
        let len = fs::metadata(&filler).unwrap().len();
        fs::OpenOptions::new()
            .write(true)
            .open(&filler)
            .unwrap()
            .set_len(len.saturating_sub(free_kib * 1024))
            .unwrap();
        if let Err(status) = f.api.commit(&name, &key, none()) {
            failures += 1;
            let check = lamina.run(&["check"]);
            let unfinished = check.stdout.contains("unfinished_commit");
            let record_says_committing = {
                let store = lamina_store::Store::open(&store).unwrap();
                let row = store
                    .snapshots_if_any()
                    .unwrap()
                    .unwrap()
                    .get(&key)
                    .unwrap();
                row.is_some_and(|row| row.committing.is_some())
            };
            assert_eq!(
                unfinished, record_says_committing,
                "round {round} ({status:?}): check and the snapshot's record disagree: {check:?}"
            );
            fs::remove_file(&filler).unwrap();
            f.api.commit(&name, &key, none()).unwrap_or_else(|e| {
                panic!(
                    "round {round}: the same commit again failed: {e:?}\n{}",
                    f.daemon.log()
                )
            });
        } else {
            fs::remove_file(&filler).unwrap();
        }
        let view = f.api.view(&format!("v{round}"), &name).unwrap();
        let mounted = Mounted::new(&view);
        for n in 0..20 {
            assert_eq!(
                read(&mounted.path().join(format!("dir/{n}"))),
                format!("{round}:{n}"),
                "round {round}: a file of the commit"
            );
        }
    }
    assert!(
        failures >= 2,
        "only {failures} rounds failed: the store was never full enough"
    );
    let check = lamina.run(&["check"]);
    assert_eq!(check.code, 0, "{check:?}");
}

/// Labels a pod author sets reach the snapshotter through CRI: one snapshot's are bounded
/// in bytes, and `List` answers stay within what a client receives in one message (here
/// tonic's 4 MiB default; containerd's for proxy plugins is 16 MiB) however large the
/// labels of many snapshots are together.
#[test]
fn label_bytes_are_bounded_and_list_messages_fit_a_clients_limit() {
    let f = fixture();
    let sized = |count: usize| -> Labels {
        (0..count)
            .map(|n| {
                (
                    format!("containerd.io/snapshot/pod.{n:03}"),
                    "v".repeat(4000),
                )
            })
            .collect()
    };
    let refused = f.api.prepare("too-many", "", sized(66)).unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("too-many"), "{refused:?}");
    for n in 0..40 {
        f.api.prepare(&format!("big-{n}"), "", sized(64)).unwrap();
    }
    let listed = f.api.list(&[]).unwrap();
    assert_eq!(listed.len(), 40);
    // Update may not grow them past the bound either.
    let mut info = f.api.stat("big-0").unwrap();
    info.labels
        .insert("containerd.io/snapshot/pod.more".into(), "v".repeat(8000));
    let refused = f.api.update(info, &["labels"]).unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

/// Prepares `key` with twenty files written through a real mount.
fn prepare_with_files(api: &Api, key: &str) {
    let mounts = api.prepare(key, "", classic()).unwrap();
    let mounted = Mounted::new(&mounts);
    fs::create_dir(mounted.path().join("dir")).unwrap();
    for n in 0..20 {
        fs::write(
            mounted.path().join(format!("dir/{n}")),
            format!("{key}:{n}"),
        )
        .unwrap();
    }
}

/// A view of committed `name` holds the files [`prepare_with_files`] wrote under `key`.
fn assert_committed_files(api: &Api, name: &str, key: &str) {
    let view = api.view(&format!("view-of-{name}"), name).unwrap();
    let mounted = Mounted::new(&view);
    for n in 0..20 {
        assert_eq!(
            read(&mounted.path().join(format!("dir/{n}"))),
            format!("{key}:{n}"),
            "{name}: a file of the commit"
        );
    }
}

/// A Commit that fails once its layer is published (the committed row not written, as
/// on a full disk) stays a commit in flight: `check` names it, `Cleanup` keeps its layer,
/// and a Commit again — under a new name, as containerd's retry comes (`ns/<seq>/name`) —
/// finishes it; no other snapshot may take the name it holds meanwhile. After a restart
/// instead, the daemon finishes it under the name it holds.
#[test]
fn a_commit_that_fails_after_its_layer_is_published_is_finished_not_lost() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let store = fs.path().join("store");
    let socket = fs.path().join("lamina.sock");
    let lamina = Lamina::new(&store);
    {
        let daemon = Daemon::start_failing_once_at(&store, &socket, "commit-published");
        let api = Api::connect(&daemon.socket);
        prepare_with_files(&api, "k");
        let failed = api.commit("ns/1/c", "k", none()).unwrap_err();
        assert_eq!(failed.code(), Code::Unknown, "{failed:?}");
        let check = lamina.run(&["check"]);
        assert_eq!(check.code, 1, "{check:?}");
        assert!(check.stdout.contains("unfinished_commit"), "{check:?}");
        assert!(
            check.stdout.contains("its files are in that layer"),
            "{check:?}"
        );
        // The name the commit holds is nobody else's meanwhile.
        let taken = api.prepare("ns/1/c", "", none()).unwrap_err();
        assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
        api.cleanup().unwrap();
        api.commit("ns/2/c", "k", none()).unwrap();
        assert_eq!(api.stat("ns/1/c").unwrap_err().code(), Code::NotFound);
        assert_eq!(api.stat("k").unwrap_err().code(), Code::NotFound);
        assert_committed_files(&api, "ns/2/c", "k");
    }
    {
        let mut daemon = Daemon::start_failing_once_at(&store, &socket, "commit-published");
        let api = Api::connect(&daemon.socket);
        prepare_with_files(&api, "r");
        api.commit("ns/3/r", "r", none()).unwrap_err();
        daemon.crash_and_restart();
        let api = Api::connect(&daemon.socket);
        assert_committed_files(&api, "ns/3/r", "r");
    }
    let check = lamina.run(&["check"]);
    assert_eq!(check.code, 0, "{check:?}");
}

/// A Commit that fails before its layer is published is undone at once: the snapshot is
/// active as it was (no unfinished commit), and the same Commit again succeeds.
#[test]
fn a_commit_that_fails_before_the_publish_is_undone_at_once() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let store = fs.path().join("store");
    let daemon =
        Daemon::start_failing_once_at(&store, &fs.path().join("lamina.sock"), "commit-publish");
    let api = Api::connect(&daemon.socket);
    prepare_with_files(&api, "u");
    let failed = api.commit("ns/1/u", "u", none()).unwrap_err();
    assert_eq!(failed.code(), Code::Unknown, "{failed:?}");
    let check = Lamina::new(&store).run(&["check"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert_eq!(api.stat("u").unwrap().kind, Kind::Active as i32);
    api.commit("ns/2/u", "u", none()).unwrap();
    assert_committed_files(&api, "ns/2/u", "u");
}

/// containerd 2.x sends a Commit's `parent` to rebase a snapshot prepared without it
/// (parallel unpack, to snapshotters listing `rebase`). The parent a snapshot was prepared
/// on commits as before; a snapshot prepared on another parent, or one that is not an
/// unpack, is refused rather than moved.
#[test]
fn a_commit_onto_another_parent_is_refused_and_onto_its_own_goes_through() {
    let f = fixture();
    commit_with(&f.api, "base", "base-key", "", |root| {
        fs::write(root.join("base"), "b").unwrap();
    });
    commit_with(&f.api, "other", "other-key", "", |_| {});
    f.api.prepare("top-key", "base", none()).unwrap();
    let refused = f
        .api
        .commit_onto("top", "top-key", "other", none())
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("prepared on `base`"),
        "{refused:?}"
    );
    assert_eq!(f.api.stat("top-key").unwrap().kind, Kind::Active as i32);
    f.api.commit_onto("top", "top-key", "base", none()).unwrap();
    assert_eq!(f.api.stat("top").unwrap().parent, "base");

    f.api.prepare("loose-key", "", none()).unwrap();
    let refused = f
        .api
        .commit_onto("loose", "loose-key", "base", none())
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("not one"), "{refused:?}");
}

/// An unpack's labels as containerd 2.x's unpacker sends them for layer `diff` on a
/// parent whose chain ID is `parent_chain` (none for the first layer), named
/// `chain`.
fn unpack_labels(
    chain: &lamina_image::Digest,
    diff: &lamina_image::Digest,
    parent_chain: Option<&lamina_image::Digest>,
) -> Labels {
    let mut pairs = vec![
        ("containerd.io/snapshot.ref".to_string(), chain.to_string()),
        (
            "containerd.io/snapshot/diff-id".to_string(),
            diff.to_string(),
        ),
    ];
    if let Some(parent) = parent_chain {
        pairs.push((
            "containerd.io/snapshot/parent-chain-id".to_string(),
            parent.to_string(),
        ));
    }
    pairs.into_iter().collect()
}

/// Parallel unpack: a layer prepared without its parent is answered as an overlay of its
/// upper alone (containerd writes whiteouts into `upperdir=` only for an overlay), and
/// committed onto the parent its chain ID was made from — never onto another.
#[test]
fn an_unpack_prepared_without_its_parent_is_rebased_onto_the_parent_of_its_chain() {
    use lamina_image::{Digest, next_chain_id};
    let f = fixture();
    let base_diff = Digest::of(b"base layer");
    let base_chain = next_chain_id(None, &base_diff);
    let base_key = format!("ns/1/extract-1 {base_chain}");
    let mounts = f
        .api
        .prepare(&base_key, "", unpack_labels(&base_chain, &base_diff, None))
        .unwrap();
    assert_eq!(mounts[0].r#type, "bind", "{mounts:?}");
    {
        let mounted = Mounted::new(&mounts);
        fs::write(mounted.path().join("gone"), "base").unwrap();
    }
    f.api.commit("base", &base_key, none()).unwrap();

    let top_diff = Digest::of(b"top layer");
    let top_chain = next_chain_id(Some(&base_chain), &top_diff);
    let top_key = format!("ns/2/extract-2 {top_chain}");
    let top_labels = unpack_labels(&top_chain, &top_diff, Some(&base_chain));
    let mounts = f.api.prepare(&top_key, "", top_labels).unwrap();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(mounts[0].r#type, "overlay", "{mounts:?}");
    let upper = mounts[0]
        .options
        .iter()
        .find_map(|o| o.strip_prefix("upperdir="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("no upperdir: {mounts:?}"));
    assert!(!mounts[0].options.iter().any(|o| o == "ro"), "{mounts:?}");
    assert_eq!(f.api.mounts(&top_key).unwrap(), mounts);
    // What containerd's applier writes for `.wh.gone`: a 0/0 device, straight in.
    let made = std::process::Command::new("mknod")
        .arg(upper.join("gone"))
        .args(["c", "0", "0"])
        .status()
        .unwrap();
    assert!(made.success());
    fs::write(upper.join("top"), "top").unwrap();

    // Another chain's layer name does not go onto this parent.
    let stray_diff = Digest::of(b"stray layer");
    let stray_chain = next_chain_id(Some(&top_chain), &stray_diff);
    let stray_key = format!("ns/3/extract-3 {stray_chain}");
    f.api
        .prepare(
            &stray_key,
            "",
            unpack_labels(&stray_chain, &stray_diff, Some(&top_chain)),
        )
        .unwrap();
    let refused = f
        .api
        .commit_onto("stray", &stray_key, "base", none())
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains(&stray_chain.to_string()),
        "{refused:?}"
    );

    // A Commit naming another layer than its Prepare did is checked as that layer.
    let renamed = labels(&[("containerd.io/snapshot.ref", &stray_chain.to_string())]);
    let refused = f
        .api
        .commit_onto("top", &top_key, "base", renamed)
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    // An unpack answered as a bind (no parent-chain-id: its whiteouts were applied as
    // deletions) is not rebased, whatever its labels say since.
    let bound_key = format!("ns/4/extract-4 {top_chain}");
    let mut bound_labels = unpack_labels(&top_chain, &top_diff, None);
    let mounts = f.api.prepare(&bound_key, "", bound_labels.clone()).unwrap();
    assert_eq!(mounts[0].r#type, "bind", "{mounts:?}");
    let mut info = f.api.stat(&bound_key).unwrap();
    bound_labels.insert(
        "containerd.io/snapshot/parent-chain-id".into(),
        base_chain.to_string(),
    );
    info.labels = bound_labels;
    f.api.update(info, &[]).unwrap();
    let refused = f
        .api
        .commit_onto("bound", &bound_key, "base", none())
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("parent-chain-id"), "{refused:?}");

    f.api.commit_onto("top", &top_key, "base", none()).unwrap();
    assert_eq!(f.api.stat("top").unwrap().parent, "base");
    let mounts = f.api.view("top-view", "top").unwrap();
    let mounted = Mounted::new(&mounts);
    assert!(
        !mounted.path().join("gone").exists(),
        "the whiteout was lost"
    );
    assert_eq!(
        fs::read_to_string(mounted.path().join("top")).unwrap(),
        "top"
    );
}

/// A rebase whose commit failed after its layer was published stands as an intent onto
/// its parent: the parent cannot be removed under it, and the commit, retried, lands on it.
#[test]
fn the_parent_of_an_unfinished_rebase_cannot_be_removed() {
    use lamina_image::{Digest, next_chain_id};
    require_root();
    let fs = ScratchFs::ext4(512);
    let (store, socket) = (fs.path().join("store"), fs.path().join("lamina.sock"));
    let base_diff = Digest::of(b"base layer");
    let base_chain = next_chain_id(None, &base_diff);
    {
        let daemon = Daemon::start(&store, &socket, &[]);
        let api = Api::connect(&daemon.socket);
        let base_key = format!("ns/1/extract-1 {base_chain}");
        api.prepare(&base_key, "", unpack_labels(&base_chain, &base_diff, None))
            .unwrap();
        api.commit("base", &base_key, none()).unwrap();
    }
    let daemon = Daemon::start_failing_once_at(&store, &socket, "commit-published");
    let api = Api::connect(&daemon.socket);
    let top_diff = Digest::of(b"top layer");
    let top_chain = next_chain_id(Some(&base_chain), &top_diff);
    let top_key = format!("ns/2/extract-2 {top_chain}");
    api.prepare(
        &top_key,
        "",
        unpack_labels(&top_chain, &top_diff, Some(&base_chain)),
    )
    .unwrap();
    assert!(api.commit_onto("top", &top_key, "base", none()).is_err());
    let refused = api.remove("base").unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(&top_key), "{refused:?}");
    // A retry naming no parent finishes the commit onto the one its intent recorded.
    api.commit("top", &top_key, none()).unwrap();
    assert_eq!(api.stat("top").unwrap().parent, "base");
}

/// A snapshot whose parent row is gone (a database changed behind the daemon's back) has
/// no layers below it: `check` names it.
#[test]
fn check_names_a_snapshot_whose_parent_is_gone() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let store = fs.path().join("store");
    {
        let daemon = Daemon::start(&store, &fs.path().join("lamina.sock"), &[]);
        let api = Api::connect(&daemon.socket);
        commit_with(&api, "base", "base-key", "", |root| {
            fs::write(root.join("b"), "b").unwrap()
        });
        commit_with(&api, "top", "top-key", "base", |root| {
            fs::write(root.join("t"), "t").unwrap()
        });
    }
    // (What the daemon's reaper had not torn down yet shows as pending deletes.)
    let before = Lamina::new(&store).run(&["check"]);
    assert!(
        !before.stdout.contains("snapshot_missing_parent"),
        "{before:?}"
    );
    {
        let opened = lamina_store::Store::open(&store).unwrap();
        let mut index = opened.snapshots().unwrap();
        index.remove("base").unwrap();
    }
    let check = Lamina::new(&store).run(&["check"]);
    assert_ne!(check.code, 0, "{check:?}");
    let said = format!("{}{}", check.stdout, check.stderr);
    assert!(said.contains("snapshot_missing_parent"), "{check:?}");
    assert!(said.contains("`top`"), "{check:?}");
}

/// An operator decides which strategies a snapshot's strategy label may name
/// (`--label-strategies`): through CRI a pod author sets the label. Another is refused
/// with `InvalidArgument`, naming it and what is allowed; snapshots without the label get
/// the daemon's own default whatever the list.
#[test]
fn label_strategies_bound_what_a_strategy_label_may_choose() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let daemon = Daemon::start(
        &fs.path().join("store"),
        &fs.path().join("lamina.sock"),
        &["--label-strategies", "auto, classic,metacopy"],
    );
    let api = Api::connect(&daemon.socket);
    let strategy = |list: &str| labels(&[("containerd.io/snapshot/lamina.strategy", list)]);
    let refused = api
        .prepare("pooled", "", strategy("metacopy,pooled"))
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains("`pooled`")
            && refused.message().contains("auto, classic, metacopy"),
        "{refused:?}"
    );
    api.prepare("allowed", "", strategy("metacopy")).unwrap();
    api.prepare("unlabelled", "", none()).unwrap();
    drop(api);
    drop(daemon);

    // A list naming no strategy fails the start, naming it.
    let out = Lamina::new(&fs.path().join("store")).run(&[
        "daemon",
        "--containerd-socket",
        fs.path().join("other.sock").to_str().unwrap(),
        "--label-strategies",
        "classic,fastest",
    ]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("unknown strategy `fastest`"), "{out:?}");
}

/// A snapshot's upper takes the owner of its parent's root, as containerd's overlayfs
/// gives it, so the merged root keeps the image's owner: what `ctr run --uidmap` needs of
/// an image chowned for its user namespace (its root must be writable by the mapped root).
#[test]
fn an_active_snapshots_root_keeps_its_parents_owner() {
    let f = fixture();
    commit_with(&f.api, "chowned", "chowned-key", "", |root| {
        fs::write(root.join("f"), "x").unwrap();
        std::os::unix::fs::chown(root, Some(100000), Some(100000)).unwrap();
    });
    let mounts = f.api.prepare("child", "chowned", none()).unwrap();
    let mounted = Mounted::new(&mounts);
    let root = fs::metadata(mounted.path()).unwrap();
    assert_eq!((root.uid(), root.gid()), (100000, 100000));
    // A snapshot of an image owned by root stays root's.
    commit_with(&f.api, "plain", "plain-key", "", |root| {
        fs::write(root.join("f"), "x").unwrap();
    });
    let mounts = f.api.prepare("plain-child", "plain", none()).unwrap();
    let mounted = Mounted::new(&mounts);
    assert_eq!(fs::metadata(mounted.path()).unwrap().uid(), 0);
}
