//! A store whose layers keep their data in `objects/` (`init-store --layer-data
//! objects`, issue 40's "each content once, by default"): two images sharing files are
//! stored once on ext4 and xfs, every strategy reads them back, and no view shows
//! another image's link count or change time. Through the binary, on real mounts.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_integration::scratch::{mounts_under, used_bytes};
use lamina_integration::{FsKind, Lamina, ScratchFs, require_root};

#[test]
fn two_images_sharing_files_are_stored_once_on_ext4_and_every_view_keeps_its_own_inodes() {
    stored_once_and_every_view_keeps_its_own_inodes(FsKind::Ext4);
}

#[test]
fn two_images_sharing_files_are_stored_once_on_xfs_and_every_view_keeps_its_own_inodes() {
    stored_once_and_every_view_keeps_its_own_inodes(FsKind::Xfs);
}

/// The strategies a view is made with, and whether each is read-only.
const VIEWS: [(&str, bool); 4] = [
    ("classic", false),
    ("shared-ro", true),
    ("direct", true),
    ("composefs", false),
];

/// 40 files of 256 KiB (the second image layers them in four, the last ten with another
/// mode), a small file, a hardlink pair and a setuid file with a capability.
fn files() -> Vec<(String, Vec<u8>)> {
    let mut rng = lamina_integration::rng::Xorshift::new(40);
    (0..40)
        .map(|i| {
            let data: Vec<u8> = (0..(256 << 10) / 8)
                .flat_map(|_| rng.next_u64().to_le_bytes())
                .collect();
            (format!("data/file{i:02}"), data)
        })
        .collect()
}

fn other_mode(path: &str) -> bool {
    path >= "data/file30"
}

fn image(dir: &Path, name: &str, layers: Vec<Vec<u8>>) -> String {
    let layers: Vec<lamina_sample::Layer> = layers
        .into_iter()
        .map(|tar| lamina_sample::Layer {
            tar,
            compression: lamina_image::Compression::None,
        })
        .collect();
    let dir = dir.join(name);
    let image =
        lamina_sample::build_image(&layers, &["PATH=/bin"], &lamina_image::Platform::host())
            .unwrap();
    lamina_sample::write_oci_layout(&dir, &[&image], &[(image.manifest.clone(), Some("x"))])
        .unwrap();
    format!("oci://{}:x", dir.display())
}

fn layer(part: &[(String, Vec<u8>)], second: bool, extra: bool) -> Vec<u8> {
    let mut layer = lamina_sample::LayerBuilder::new()
        .dir("data", 0o755)
        .unwrap();
    for (path, data) in part {
        let mode = if second && other_mode(path) {
            0o600
        } else {
            0o644
        };
        layer = layer.file(path, mode, data).unwrap();
    }
    if extra {
        let big = vec![7u8; 8192];
        layer = layer
            .file("data/small", 0o644, b"small")
            .unwrap()
            .file("data/linked", 0o644, &big)
            .unwrap()
            .hardlink("data/linked-too", "data/linked")
            .unwrap()
            .file_with_xattrs(
                "data/ping",
                0o4755,
                &vec![9u8; 4096],
                &[("security.capability", CAP_NET_RAW)],
            )
            .unwrap()
            .symlink("data/link", "file00")
            .unwrap()
            .file("data/gone", 0o644, &vec![1u8; 4096])
            .unwrap();
    }
    layer.finish().unwrap()
}

/// `security.capability` v2 granting CAP_NET_RAW (bit 13), permitted and effective.
const CAP_NET_RAW: &[u8] = &[
    0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// Link count and change time of every non-directory under `root`.
fn inode_facts(root: &Path) -> BTreeMap<PathBuf, (u64, i64, i64)> {
    let mut facts = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_path_buf();
                facts.insert(rel, (meta.nlink(), meta.ctime(), meta.ctime_nsec()));
            }
        }
    }
    facts
}

fn stored_once_and_every_view_keeps_its_own_inodes(kind: FsKind) {
    require_root();
    let fs = ScratchFs::loop_backed(kind, 512, false);
    let lamina = Lamina::new(&fs.path().join("store"));
    let out = lamina.run(&["init-store", "--layer-data", "objects"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("(layer data in objects"), "{out:?}");
    let files = files();
    let unique: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    let one = image(fs.path(), "one", vec![layer(&files, false, true)]);
    let mut four_layers: Vec<Vec<u8>> = files
        .chunks(10)
        .map(|part| layer(part, true, false))
        .collect();
    // The second image hides one of its own files with a whiteout.
    four_layers[0] = {
        let mut first = files[..10].to_vec();
        first.push(("data/hidden".into(), vec![3u8; 4096]));
        layer(&first, true, false)
    };
    four_layers.push(
        lamina_sample::LayerBuilder::new()
            .whiteout("data/hidden")
            .unwrap()
            .finish()
            .unwrap(),
    );
    let four = image(fs.path(), "four", four_layers);

    let before = used_bytes(fs.path());
    lamina.run(&["pull", &one]).ok();
    lamina.run(&["pull", &four]).ok();
    let grew = settled_used_bytes(fs.path()) - before;
    let extra = 8192 + 4096 * 3;
    assert!(
        (grew as f64) <= 1.1 * (unique + extra) as f64,
        "the store grew by {grew} bytes for {unique} unique bytes in two images"
    );

    // Views of the first image, and what they show before the second image is used.
    let mut first_views = Vec::new();
    for (strategy, read_only) in VIEWS {
        let id = format!("one-{strategy}");
        let mut flags = vec!["--strategy", strategy];
        if read_only {
            flags.push("--read-only");
        }
        let rootfs = lamina.create_with(&flags, &one, &id);
        for (path, data) in &files {
            assert_eq!(
                &std::fs::read(rootfs.join(path)).unwrap(),
                data,
                "{strategy} {path}"
            );
        }
        let ping = std::fs::metadata(rootfs.join("data/ping")).unwrap();
        assert_eq!(ping.mode() & 0o7777, 0o4755, "{strategy}");
        assert_eq!(
            xattr(&rootfs.join("data/ping"), "security.capability"),
            Some(CAP_NET_RAW.to_vec()),
            "{strategy}"
        );
        assert_eq!(std::fs::read(rootfs.join("data/small")).unwrap(), b"small");
        assert_eq!(
            std::fs::metadata(rootfs.join("data/linked")).unwrap().ino(),
            std::fs::metadata(rootfs.join("data/linked-too"))
                .unwrap()
                .ino(),
            "{strategy}: the image's own hardlink"
        );
        assert_eq!(
            std::fs::read_link(rootfs.join("data/link")).unwrap(),
            Path::new("file00")
        );
        let facts = inode_facts(&rootfs);
        for (path, (nlink, ..)) in &facts {
            let own = if path.to_string_lossy().starts_with("data/linked") {
                2
            } else {
                1
            };
            assert_eq!(*nlink, own, "{strategy} {}", path.display());
        }
        first_views.push((strategy, rootfs, facts));
    }

    // Views of the second image: the same bytes, their own modes, the whiteout applied.
    for (strategy, read_only) in VIEWS {
        let id = format!("four-{strategy}");
        let mut flags = vec!["--strategy", strategy];
        if read_only {
            flags.push("--read-only");
        }
        let rootfs = lamina.create_with(&flags, &four, &id);
        for (path, data) in &files {
            assert_eq!(
                &std::fs::read(rootfs.join(path)).unwrap(),
                data,
                "{strategy} {path}"
            );
            let mode = std::fs::metadata(rootfs.join(path)).unwrap().mode() & 0o777;
            let want = if other_mode(path) { 0o600 } else { 0o644 };
            assert_eq!(mode, want, "{strategy} {path}");
        }
        assert!(!rootfs.join("data/hidden").exists(), "{strategy}: whiteout");
        for (path, (nlink, ..)) in inode_facts(&rootfs) {
            assert_eq!(nlink, 1, "{strategy} {}", path.display());
        }
    }
    // Nothing the second image did shows in the first image's views.
    for (strategy, rootfs, facts) in &first_views {
        assert_eq!(
            &inode_facts(rootfs),
            facts,
            "{strategy}: another image shows"
        );
    }

    // A write in a read-write view changes its own copy only.
    let writable = lamina.rootfs("one-classic");
    std::fs::write(writable.join("data/file00"), b"changed").unwrap();
    let other = lamina.rootfs("four-classic");
    assert_eq!(
        std::fs::read(other.join("data/file00")).unwrap(),
        files[0].1
    );
    let check = lamina.run(&["check", "--verify"]).json();
    assert_eq!(check["ok"], true, "{check}");

    // A changed object is named as the layer file it holds the data of.
    let object = any_object(&lamina.store);
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();
    // A missing one too, as the file it held the data of.
    let aside = lamina.store.join("object-aside");
    std::fs::rename(&object, &aside).unwrap();
    let check = lamina.run(&["check", "--verify"]);
    assert!(
        check.stdout.contains("bad_layer_file")
            && check.stdout.contains("/diff/data/")
            && check.stdout.contains("the object holding its data is gone"),
        "{check:?}"
    );
    std::fs::rename(&aside, &object).unwrap();
    let check = lamina.run(&["check", "--verify"]);
    assert!(
        check.stdout.contains("bad_layer_file") && check.stdout.contains("its content changed"),
        "{check:?}"
    );
    bytes[100] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();

    // Deleted and cleaned: the objects go with the layers that named them.
    for (strategy, _) in VIEWS {
        for image in ["one", "four"] {
            let id = format!("{image}-{strategy}");
            lamina.delete_and_assert_gone(&id, &id);
        }
    }
    let cleaned = lamina.run(&["clean"]).json();
    assert!(
        cleaned["objects_removed"].as_u64().unwrap() >= 40,
        "{cleaned}"
    );
    assert_eq!(objects(&lamina.store), 0, "{cleaned}");
    assert!(mounts_under(&lamina.store).is_empty());
}

/// [`used_bytes`] once it stops changing: xfs frees a removed file's blocks in the
/// background (the second image's copies, dropped for the objects the first made).
fn settled_used_bytes(path: &Path) -> u64 {
    let mut last = used_bytes(path);
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = used_bytes(path);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// Objects under the store's `objects/`.
fn objects(store: &Path) -> usize {
    let mut count = 0;
    for fan_out in std::fs::read_dir(store.join("objects")).unwrap() {
        count += std::fs::read_dir(fan_out.unwrap().path()).unwrap().count();
    }
    count
}

/// One short-named object (a layer stub's data).
fn any_object(store: &Path) -> PathBuf {
    for fan_out in std::fs::read_dir(store.join("objects")).unwrap() {
        for object in std::fs::read_dir(fan_out.unwrap().path()).unwrap() {
            let path = object.unwrap().path();
            if path.file_name().unwrap().len() == 20 {
                return path;
            }
        }
    }
    panic!("no object");
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::lgetxattr(path, name, &mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}
