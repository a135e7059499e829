//! The composefs provider through the binary (issue 24): file contents stored once across
//! images, one metadata image per image, `clean` collecting both when nothing uses them,
//! crash leftovers swept, and the requests it cannot serve refused with the reason. The
//! merged-content proof under runc and the lifecycle steps are in `strategies.rs` and the
//! conformance suite, which run composefs beside every other strategy.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_integration::scratch::{mounts_under, used_bytes};
use lamina_integration::{Lamina, ScratchFs, require_root, sample_image};

/// The sample's references: [oci layout (2 layers), ..., rootfs.tar (1 layer)].
const TWO_LAYERS: usize = 0;
const ONE_LAYER: usize = 3;

/// A store on a scratch ext4 (removed on drop) and the sample's two-layer image.
fn store_with_sample() -> (ScratchFs, Lamina, String) {
    require_root();
    let fs = ScratchFs::ext4(256);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = files.references()[TWO_LAYERS].clone();
    (fs, lamina, image)
}

/// Every object file under `objects/<ab>/`.
fn objects(store: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for fan_out in std::fs::read_dir(store.join("objects")).unwrap() {
        let fan_out = fan_out.unwrap().path();
        for object in std::fs::read_dir(&fan_out).unwrap() {
            found.push(object.unwrap().path());
        }
    }
    found.sort();
    found
}

/// The metadata images (`<top>.erofs`; each has a `.digest` beside it).
fn images(store: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store.join("composefs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".erofs"))
        .collect();
    names.sort();
    names
}

#[test]
fn two_images_share_their_files_objects_and_clean_collects_what_nothing_uses() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let refs = files.references();

    let two = lamina.create_with(&["--strategy", "composefs"], &refs[TWO_LAYERS], "two");
    let after_one = objects(&lamina.store);
    assert!(!after_one.is_empty(), "busybox is past the inline limit");
    let one = lamina.create_with(&["--strategy", "composefs"], &refs[ONE_LAYER], "one");
    // The one-layer image is the two-layer image's base: every file it has that is
    // past the inline limit is already an object.
    assert_eq!(objects(&lamina.store), after_one, "no new object");
    assert_eq!(images(&lamina.store).len(), 2, "a metadata image per image");
    let busybox = |rootfs: &Path| std::fs::read(rootfs.join("bin/busybox")).unwrap();
    assert_eq!(busybox(&two), busybox(&one));
    // Each object is the layer's own inode: the import copied no data.
    let layer_busybox = std::fs::read_dir(lamina.store.join("layers"))
        .unwrap()
        .map(|l| l.unwrap().path().join("diff/bin/busybox"))
        .find(|p| p.exists())
        .unwrap();
    let ino = layer_busybox.metadata().unwrap().ino();
    assert!(
        after_one.iter().any(|o| o.metadata().unwrap().ino() == ino),
        "busybox's object is a link to the layer's file"
    );

    // In use, nothing of either goes.
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["composefs_images_removed"], 0, "{cleaned}");
    assert_eq!(cleaned["objects_removed"], 0, "{cleaned}");

    lamina.delete_and_assert_gone("one", "composefs one layer");
    let cleaned = lamina.run(&["clean"]).json();
    // The one-layer image's base is also the two-layer image's bottom layer: its own
    // metadata image goes, the objects stay for the other.
    assert_eq!(cleaned["composefs_images_removed"], 1, "{cleaned}");
    assert_eq!(cleaned["objects_removed"], 0, "{cleaned}");
    assert_eq!(objects(&lamina.store), after_one);

    lamina.delete_and_assert_gone("two", "composefs two layers");
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["composefs_images_removed"], 1, "{cleaned}");
    assert_eq!(cleaned["objects_removed"], after_one.len(), "{cleaned}");
    // Only the store's mark of its one-time repair stays (composefs_snapshot_copies.rs).
    let left: Vec<_> = std::fs::read_dir(lamina.store.join("composefs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        ["snapshot-objects-copied"],
        "images and their digests gone"
    );
    assert!(objects(&lamina.store).is_empty());
    assert!(mounts_under(&lamina.store).is_empty());
    let check = lamina.run(&["check"]).json();
    assert_eq!(check["ok"], true, "{check}");
}

#[test]
fn a_crashed_image_build_is_swept_and_the_next_create_builds_it_whole() {
    let (_fs, lamina, image) = store_with_sample();
    let image = &image;

    // What a build killed mid-write leaves: a partial image in tmp/, unlocked.
    let top = "0".repeat(64);
    let staged = lamina
        .store
        .join("tmp")
        .join(format!("composefs-{top}-1-2"));
    std::fs::write(&staged, b"half an EROFS image").unwrap();
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["tmp_removed"], 1, "{cleaned}");
    assert!(!staged.exists());

    // A metadata image that is not an EROFS image is refused at mount, not served.
    let rootfs = lamina.create_with(&["--strategy", "composefs"], image, "a");
    assert!(rootfs.join("bin/busybox").exists());
    lamina.delete_and_assert_gone("a", "composefs");
    let built = images(&lamina.store);
    assert_eq!(built.len(), 1);
    let path = lamina.store.join("composefs").join(&built[0]);
    damage_unmounted(&path);
    let out = lamina.run(&["create", "--strategy", "composefs", image, "b"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("EROFS"), "names the image: {out:?}");
    assert!(!lamina.store.join("images/b").exists(), "nothing half-made");
    assert!(mounts_under(&lamina.store).is_empty());
}

#[test]
fn requests_composefs_cannot_serve_are_refused_with_the_reason() {
    let (_fs, lamina, image) = store_with_sample();
    let image = &image;
    for (args, expect) in [
        (
            vec!["create", "--strategy", "shared-ro,composefs"],
            "no upper for `composefs`",
        ),
        (
            vec!["create", "--strategy", "direct,composefs"],
            "no upper for `composefs`",
        ),
    ] {
        let mut args = args.clone();
        args.extend([image.as_str(), "x"]);
        let out = lamina.run(&args);
        assert_eq!(out.code, 1, "{args:?}: {out:?}");
        assert!(out.stdout.contains(expect), "{args:?}: {out:?}");
        assert!(!lamina.store.join("images/x").exists(), "{args:?}");
    }
    assert!(mounts_under(&lamina.store).is_empty());
}

#[test]
fn check_verify_names_a_tampered_object_and_image() {
    let (_fs, lamina, image) = store_with_sample();
    let image = &image;
    lamina.create_with(&["--strategy", "composefs"], image, "a");
    let verified = lamina.run(&["check", "--verify"]).json();
    assert_eq!(verified["ok"], true, "{verified}");

    // One byte of an object changed (the layer's own inode: the layer changes too).
    let object = objects(&lamina.store).into_iter().next().unwrap();
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();
    let out = lamina.run(&["check", "--verify"]);
    assert_eq!(out.code, 1, "{out:?}");
    let report: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let problems = report["problems"].as_array().unwrap();
    assert!(
        problems.iter().any(|p| p["kind"] == "bad_object"
            && p["path"] == object.to_str().unwrap()
            && p["detail"].as_str().unwrap().contains("metadata images of")),
        "{report}"
    );
    // Without --verify nothing reads the objects.
    assert_eq!(lamina.run(&["check"]).json()["ok"], true);
    bytes[0] ^= 0xff;
    std::fs::write(&object, &bytes).unwrap();

    // A metadata image changed: named; in use, so --repair leaves it.
    let built = lamina
        .store
        .join("composefs")
        .join(&images(&lamina.store)[0]);
    let mut image_bytes = std::fs::read(&built).unwrap();
    let last = image_bytes.len() - 1;
    image_bytes[last] ^= 0xff;
    std::fs::write(&built, &image_bytes).unwrap();
    let out = lamina.run(&["check", "--verify", "--repair"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("bad_composefs_image"), "{out:?}");
    assert!(built.exists(), "in use: left in place");
    // Unused, --repair removes it and the next create builds it whole again.
    lamina.delete_and_assert_gone("a", "composefs");
    let repaired = lamina.run(&["check", "--verify", "--repair"]).json();
    assert_eq!(repaired["problems"][0]["repaired"], true, "{repaired}");
    assert!(!built.exists());
    let rootfs = lamina.create_with(&["--strategy", "composefs"], image, "b");
    assert!(rootfs.join("bin/busybox").exists());
    assert_eq!(lamina.run(&["check", "--verify"]).json()["ok"], true);
    lamina.delete_and_assert_gone("b", "composefs");
}

/// An OCI layout of one layer, `tar`, at `dir`; its `oci://` reference.
fn one_layer_image(dir: &Path, tar: Vec<u8>) -> String {
    use lamina_image::{Compression, Platform};
    let layer = lamina_sample::Layer {
        tar,
        compression: Compression::None,
    };
    let image = lamina_sample::build_image(&[layer], &["PATH=/bin"], &Platform::host()).unwrap();
    lamina_sample::write_oci_layout(dir, &[&image], &[(image.manifest.clone(), Some("latest"))])
        .unwrap();
    format!("oci://{}:latest", dir.display())
}

/// EROFS stores an inode's xattr count in a byte and sizes in 16 bits, and the crate's
/// writer truncates past them silently; on XFS a 64 KiB value would become forged
/// overlay redirects. Such files are refused, naming the entry; classic serves them.
#[test]
fn xattrs_past_what_an_erofs_inode_holds_are_refused_naming_the_file() {
    require_root();
    let fs = ScratchFs::loop_backed(lamina_integration::FsKind::Xfs, 512, false);
    let lamina = Lamina::init(&fs.path().join("store"));
    let big = vec![b'x'; 40 << 10];
    let many: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("user.s{i:03}"), vec![b'v']))
        .collect();
    let many: Vec<(&str, &[u8])> = many
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    for (name, xattrs) in [("big", vec![("user.big", big.as_slice())]), ("many", many)] {
        let tar = lamina_sample::LayerBuilder::new()
            .dir("etc", 0o755)
            .unwrap()
            .file_with_xattrs("etc/victim", 0o644, &[b'V'; 100], &xattrs)
            .unwrap()
            .finish()
            .unwrap();
        let image = one_layer_image(&fs.path().join(name), tar);
        let rootfs = lamina.create_with(&["--strategy", "classic"], &image, "classic");
        assert_eq!(
            std::fs::read(rootfs.join("etc/victim")).unwrap(),
            [b'V'; 100]
        );
        lamina.delete_and_assert_gone("classic", name);
        let out = lamina.run(&["create", "--strategy", "composefs", &image, "x"]);
        assert_eq!(out.code, 1, "{name}: {out:?}");
        assert!(
            out.stdout.contains("etc/victim") && out.stdout.contains("xattrs"),
            "{name}: names the file: {out:?}"
        );
        assert!(!lamina.store.join("images/x").exists());
    }
    assert!(mounts_under(&lamina.store).is_empty());
}

/// Guards three lifecycle gaps: a metadata image removed by hand is noticed and built
/// again; a staging copy at the top of `objects/` is collected; a composefs pool's image
/// is never collected under its mounted slots.
#[test]
fn three_lifecycle_gaps_stay_closed() {
    let (_fs, lamina, image) = store_with_sample();
    let image = &image;

    // `--without-mount`: the options name the image's shared EROFS mount and the
    // objects, and mount as Garden would mount them.
    let spec = lamina
        .run(&[
            "create",
            "--without-mount",
            "--strategy",
            "composefs",
            image,
            "w",
        ])
        .json();
    let options: Vec<&str> = spec["mounts"][0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap())
        .collect();
    let lowerdir = options.iter().find(|o| o.starts_with("lowerdir=")).unwrap();
    assert!(lowerdir.contains(".mnt/rootfs::"), "{options:?}");
    let target = lamina.rootfs("w");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options.join(",")])
        .arg(&target)
        .status()
        .unwrap();
    assert!(mounted.success(), "{options:?}");
    assert!(std::fs::read(target.join("bin/busybox")).unwrap().len() > 64);
    let unmounted = std::process::Command::new("umount").arg(&target).status();
    assert!(unmounted.unwrap().success());
    // After a host restart unmounted the image, the same options fail to mount (no
    // `rootfs/` under the bare mount point) instead of giving an empty root.
    let mnt = lamina
        .store
        .join("composefs")
        .join(images(&lamina.store)[0].replace(".erofs", ".mnt"));
    assert!(
        std::process::Command::new("umount")
            .arg(&mnt)
            .status()
            .unwrap()
            .success()
    );
    let remounted = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options.join(",")])
        .arg(&target)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        !remounted.success(),
        "an unmounted image must not mount as an empty root"
    );
    lamina.delete_and_assert_gone("w", "composefs --without-mount");

    let rootfs = lamina.create_with(&["--strategy", "composefs"], image, "a");
    let built = lamina
        .store
        .join("composefs")
        .join(&images(&lamina.store)[0]);
    std::fs::remove_file(&built).unwrap();
    let out = lamina.run(&["check"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("missing_composefs_image"), "{out:?}");
    lamina.run(&["unmount", "a"]).ok();
    lamina.run(&["mount", "a"]).ok();
    assert!(built.is_file(), "mount built it again");
    assert!(rootfs.join("bin/busybox").exists());
    assert_eq!(lamina.run(&["check", "--verify"]).json()["ok"], true);

    let pool = lamina
        .run(&[
            "pool",
            "fill",
            image,
            "--size",
            "1",
            "--strategy",
            "pooled,composefs",
        ])
        .json();
    assert_eq!(pool["ready"], 1, "{pool}");
    lamina.delete_and_assert_gone("a", "composefs");
    let planted = lamina.store.join("objects").join(".staging-left-1");
    std::fs::write(&planted, b"half a copy").unwrap();
    let cleaned = lamina.run(&["clean"]).json();
    assert!(!planted.exists(), "{cleaned}");
    assert_eq!(
        cleaned["composefs_images_removed"], 0,
        "the pool's image stays: {cleaned}"
    );
    let slot = lamina
        .run(&["create", "--strategy", "pooled,composefs", image, "b"])
        .json();
    let slot = PathBuf::from(slot["root"]["path"].as_str().unwrap());
    assert!(std::fs::read(slot.join("bin/busybox")).unwrap().len() > 64);
    lamina.delete_and_assert_gone("b", "pooled composefs");
    lamina.run(&["pool", "drain"]).json();
    // The image's EROFS mount stays until `clean` finds nothing uses the image.
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["composefs_images_removed"], 1, "{cleaned}");
    assert!(mounts_under(&lamina.store).is_empty());
}

/// What a tree shows of one entry: type and mode, owner, size, device, mtime, xattrs,
/// link target, content hash — everything but link counts and inode numbers, which
/// differ by design (classic shows the layer's inode, which composefs's objects link).
fn describe(root: &Path) -> std::collections::BTreeMap<PathBuf, String> {
    use sha2::Digest as _;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    let mut inodes: std::collections::HashMap<u64, Vec<PathBuf>> = std::collections::HashMap::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let mut xattrs: Vec<(String, Vec<u8>)> = xattr_names(&path)
                .into_iter()
                .filter(|n| {
                    !n.starts_with("trusted.overlay.") && !n.starts_with("security.selinux")
                })
                .map(|n| {
                    let v = get_xattr(&path, &n);
                    (n, v)
                })
                .collect();
            xattrs.sort();
            let kind = meta.file_type();
            let body = if kind.is_file() {
                let data = std::fs::read(&path).unwrap();
                hex::encode(sha2::Sha256::digest(&data))
            } else if kind.is_symlink() {
                std::fs::read_link(&path).unwrap().display().to_string()
            } else {
                String::new()
            };
            if kind.is_file() {
                inodes.entry(meta.ino()).or_default().push(rel.clone());
            }
            out.insert(
                rel,
                format!(
                    "mode {:o} owner {}:{} size {} rdev {:x} mtime {}.{} xattrs {:?} body {body}",
                    meta.mode(),
                    meta.uid(),
                    meta.gid(),
                    if kind.is_dir() { 0 } else { meta.len() },
                    meta.rdev(),
                    meta.mtime(),
                    meta.mtime_nsec(),
                    xattrs,
                ),
            );
            if kind.is_dir() {
                stack.push(path);
            }
        }
    }
    // Hardlinks: names of one inode within this tree (the link count itself differs).
    for mut names in inodes.into_values().filter(|n| n.len() > 1) {
        names.sort();
        for name in &names {
            let entry = out.get_mut(name).unwrap();
            entry.push_str(&format!(" hardlinked with {names:?}"));
        }
    }
    out
}

fn xattr_names(path: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::llistxattr(path, &mut buf).unwrap();
    buf[..n]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn get_xattr(path: &Path, name: &str) -> Vec<u8> {
    let mut buf = vec![0u8; 64 << 10];
    let n = rustix::fs::lgetxattr(path, name, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

/// The merged-content proof, file for file: an image of two layers with every kind of
/// entry a layer holds — devices, a FIFO, xattrs (file capabilities included), setuid,
/// hardlinks, symlinks, a whiteout, an opaque directory, a file replaced by a directory
/// — looks the same through composefs as through classic. (runc boots the sample image's
/// merged proof under composefs in `strategies.rs`.)
#[test]
fn composefs_shows_every_kind_of_entry_as_classic_does() {
    use tar::EntryType;
    require_root();
    let fs = ScratchFs::ext4(256);
    let lamina = Lamina::init(&fs.path().join("store"));
    let capability: &[u8] = &[
        1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let base = lamina_sample::LayerBuilder::new()
        .dir("dev2", 0o755)
        .and_then(|l| l.node(EntryType::Char, "dev2/null", (1, 3), (0, 0)))
        .and_then(|l| l.node(EntryType::Block, "dev2/loop7", (7, 7), (0, 6)))
        .and_then(|l| l.node(EntryType::Fifo, "dev2/pipe", (0, 0), (1000, 1000)))
        .and_then(|l| l.dir("data", 0o750))
        .and_then(|l| {
            l.file_with_xattrs(
                "data/ping",
                0o755,
                &[7u8; 5000],
                &[("security.capability", capability), ("user.note", b"kept")],
            )
        })
        .and_then(|l| l.file("data/small", 0o600, b"tiny"))
        .and_then(|l| l.file("data/suid", 0o4755, &[1u8; 300]))
        .and_then(|l| l.hardlink("data/suid-link", "data/suid"))
        .and_then(|l| l.file("data/gone", 0o644, b"whited out"))
        .and_then(|l| l.dir("opaque", 0o755))
        .and_then(|l| l.file("opaque/below", 0o644, b"hidden by the top layer"))
        .and_then(|l| l.file("becomes-dir", 0o644, b"a file below"))
        .and_then(|l| l.symlink("data/link", "ping"))
        .and_then(lamina_sample::LayerBuilder::finish)
        .unwrap();
    let top = lamina_sample::LayerBuilder::new()
        .whiteout("data/gone")
        .and_then(|l| l.opaque("opaque"))
        .and_then(|l| l.file("opaque/above", 0o644, b"the top layer's"))
        .and_then(|l| l.dir("becomes-dir", 0o711))
        .and_then(|l| l.file("becomes-dir/inside", 0o644, &[3u8; 100]))
        .and_then(lamina_sample::LayerBuilder::finish)
        .unwrap();
    let layers = [base, top].map(|tar| lamina_sample::Layer {
        tar,
        compression: lamina_image::Compression::None,
    });
    let built =
        lamina_sample::build_image(&layers, &["PATH=/bin"], &lamina_image::Platform::host())
            .unwrap();
    let layout = fs.path().join("kinds");
    lamina_sample::write_oci_layout(
        &layout,
        &[&built],
        &[(built.manifest.clone(), Some("latest"))],
    )
    .unwrap();
    let image = format!("oci://{}:latest", layout.display());

    let classic = lamina.create_with(&["--strategy", "classic"], &image, "classic");
    let composefs = lamina.create_with(&["--strategy", "composefs"], &image, "composefs");
    let (want, got) = (describe(&classic), describe(&composefs));
    assert!(want.len() > 12, "{want:#?}");
    let entry = |p: &str| want.get(Path::new(p)).cloned().unwrap_or_default();
    assert!(entry("data/suid").contains("hardlinked with"), "{want:#?}");
    assert!(entry("dev2/null").contains("mode 20660") && entry("dev2/null").contains("rdev 103"));
    assert!(
        entry("data/ping").contains("security.capability"),
        "{want:#?}"
    );
    for (path, entry) in &want {
        assert_eq!(got.get(path), Some(entry), "{}", path.display());
    }
    assert_eq!(got.len(), want.len(), "{got:#?}");
    assert!(!composefs.join("data/gone").exists() && composefs.join("opaque/above").exists());
    assert!(!composefs.join("opaque/below").exists());
    lamina.delete_and_assert_gone("classic", "classic");
    lamina.delete_and_assert_gone("composefs", "composefs");
}

/// Second review's findings: a repaired image went on being served from its old mount;
/// objects were collected under running containers when their image file was gone; a
/// busy mount failed every `clean`.
#[test]
fn second_lifecycle_gaps_stay_closed() {
    let (_fs, lamina, image) = store_with_sample();
    let image = &image;
    let hosts = |rootfs: &Path| std::fs::read_to_string(rootfs.join("etc/hosts")).unwrap();

    // Damaged in place while mounted and unused: repair takes the mount with it.
    let a = lamina.create_with(&["--strategy", "composefs"], image, "a");
    let good = hosts(&a);
    assert!(good.contains("localhost"), "{good}");
    lamina.delete_and_assert_gone("a", "composefs");
    let built = lamina
        .store
        .join("composefs")
        .join(&images(&lamina.store)[0]);
    let mut bytes = std::fs::read(&built).unwrap();
    let at = bytes.windows(9).position(|w| w == b"localhost").unwrap();
    bytes[at..at + 9].copy_from_slice(b"EVILHOST!");
    std::fs::write(&built, &bytes).unwrap();
    // What the mount caches of the old bytes goes, so it would show the damage.
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let repaired = lamina.run(&["check", "--verify", "--repair"]).json();
    assert_eq!(repaired["ok"], true, "{repaired}");
    let b = lamina.create_with(&["--strategy", "composefs"], image, "b");
    assert_eq!(
        hosts(&b),
        good,
        "the rebuilt image is what a new container sees"
    );

    // An in-use image whose file is gone keeps every object.
    std::fs::remove_file(&built).unwrap();
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["objects_removed"], 0, "{cleaned}");
    let busybox = std::fs::read(lamina.store.join("images/b/rootfs/bin/busybox")).unwrap();
    assert!(busybox.len() > 64);
    lamina.run(&["check", "--repair"]).json();
    assert!(built.is_file(), "repair built it again");

    // A process inside the unused image's mount: clean keeps it, and finishes later.
    lamina.delete_and_assert_gone("b", "composefs");
    lamina.create_with(&["--strategy", "composefs"], image, "c");
    lamina.delete_and_assert_gone("c", "composefs");
    let mnt = built.with_extension("mnt");
    let mut holder = std::process::Command::new("sleep")
        .arg("60")
        .current_dir(mnt.join("rootfs"))
        .spawn()
        .unwrap();
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["composefs_images_removed"], 0, "{cleaned}");
    assert!(built.is_file());
    holder.kill().unwrap();
    holder.wait().unwrap();
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["composefs_images_removed"], 1, "{cleaned}");
    assert!(mounts_under(&lamina.store).is_empty());
}

/// Issue 24's store-bytes target: two images holding the same files, layered
/// differently, are stored once on disk in a store that shares file content
/// (`init-store --share-file-content`). An import links a file whose content and
/// metadata are already an object's to it, on every filesystem; a file of the same
/// content but another mode keeps its own inode, and a composefs build makes it share the
/// object's extents where the filesystem can (xfs, btrfs; ext4 keeps its copy). No view
/// shows two of its files as one inode.
#[test]
fn files_two_images_share_are_stored_once_on_an_ext4_store() {
    files_two_images_share_are_stored_once(lamina_integration::FsKind::Ext4);
}

#[test]
fn files_two_images_share_are_stored_once_on_an_xfs_store() {
    files_two_images_share_are_stored_once(lamina_integration::FsKind::Xfs);
}

#[test]
fn files_two_images_share_are_stored_once_on_a_btrfs_store() {
    files_two_images_share_are_stored_once(lamina_integration::FsKind::Btrfs);
}

fn files_two_images_share_are_stored_once(kind: lamina_integration::FsKind) {
    require_root();
    let fs = ScratchFs::loop_backed(kind, 512, false);
    let lamina = Lamina::new(&fs.path().join("store"));
    let out = lamina.run(&["init-store", "--share-file-content"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("(file content shared across images)"),
        "{out:?}"
    );
    let mut rng = lamina_integration::rng::Xorshift::new(24);
    let files: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            let data: Vec<u8> = (0..(256 << 10) / 8)
                .flat_map(|_| rng.next_u64().to_le_bytes())
                .collect();
            (format!("data/file{i:02}"), data)
        })
        .collect();
    let unique: u64 = files.iter().map(|(_, d)| d.len() as u64).sum();
    // The last ten files of the second image have another mode: never one inode with
    // the first image's.
    let other_mode = |path: &str| path >= "data/file30";
    let layer_of = |part: &[(String, Vec<u8>)], second: bool| {
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
        let tar = layer.finish().unwrap();
        lamina_sample::Layer {
            tar,
            compression: lamina_image::Compression::None,
        }
    };
    let write = |name: &str, layers: Vec<lamina_sample::Layer>| {
        let dir = fs.path().join(name);
        let platform = lamina_image::Platform::host();
        let image = lamina_sample::build_image(&layers, &["PATH=/bin"], &platform).unwrap();
        lamina_sample::write_oci_layout(&dir, &[&image], &[(image.manifest.clone(), Some("x"))])
            .unwrap();
        format!("oci://{}:x", dir.display())
    };
    let one = write("one", vec![layer_of(&files, false)]);
    let four = write(
        "four",
        files.chunks(10).map(|part| layer_of(part, true)).collect(),
    );

    let before = used_bytes(fs.path());
    let a = lamina.create_with(&["--strategy", "composefs"], &one, "a");
    let b = lamina.create_with(&["--strategy", "composefs"], &four, "b");
    let grew = used_bytes(fs.path()) - before;
    let unshared = match kind {
        lamina_integration::FsKind::Ext4 => unique / 4,
        _ => 0,
    };
    assert!(
        (grew as f64) < 1.1 * unique as f64 + unshared as f64,
        "the store grew by {grew} bytes for {unique} unique bytes in two images"
    );
    for (path, data) in &files {
        assert_eq!(&std::fs::read(a.join(path)).unwrap(), data, "{path} in a");
        assert_eq!(&std::fs::read(b.join(path)).unwrap(), data, "{path} in b");
    }
    // Classic containers read the same inodes; none shows two of its files as one.
    let first = lamina.create_with(&["--strategy", "classic"], &one, "c1");
    let second = lamina.create_with(&["--strategy", "classic"], &four, "c2");
    let mut inodes = std::collections::HashSet::new();
    for (path, data) in &files {
        assert_eq!(&std::fs::read(second.join(path)).unwrap(), data, "{path}");
        let meta = std::fs::metadata(second.join(path)).unwrap();
        assert!(inodes.insert(meta.ino()), "{path} is another file's inode");
        let same = meta.ino() == std::fs::metadata(first.join(path)).unwrap().ino();
        assert_eq!(same, !other_mode(path), "{path}: shared {same}");
        assert_eq!(
            meta.mode() & 0o777,
            if other_mode(path) { 0o600 } else { 0o644 }
        );
    }
    for id in ["a", "b", "c1", "c2"] {
        lamina.delete_and_assert_gone(id, id);
    }
    let check = lamina.run(&["check", "--verify"]).json();
    assert_eq!(check["ok"], true, "{check}");
}

/// An image of `layers` layers, each adding a file past the inline limit (an object)
/// and, with `xattr`, a value larger than an EROFS inode holds on the first.
fn deep_image(dir: &Path, layers: usize, xattr: Option<&[u8]>) -> String {
    let tars: Vec<lamina_sample::Layer> = (0..layers)
        .map(|i| {
            let data = format!("layer {i} ").repeat(20);
            let mut layer = lamina_sample::LayerBuilder::new().dir("d", 0o755).unwrap();
            layer = match xattr {
                Some(value) if i == 0 => layer
                    .file_with_xattrs("d/f0", 0o644, data.as_bytes(), &[("user.big", value)])
                    .unwrap(),
                _ => layer
                    .file(&format!("d/f{i}"), 0o644, data.as_bytes())
                    .unwrap(),
            };
            lamina_sample::Layer {
                tar: layer.finish().unwrap(),
                compression: lamina_image::Compression::None,
            }
        })
        .collect();
    let platform = lamina_image::Platform::host();
    let image = lamina_sample::build_image(&tars, &["PATH=/bin"], &platform).unwrap();
    lamina_sample::write_oci_layout(dir, &[&image], &[(image.manifest.clone(), Some("x"))])
        .unwrap();
    format!("oci://{}:x", dir.display())
}

/// Damages metadata image `image` while nothing has it mounted, as after a host restart
/// unmounted it: its mount goes, and its bytes are no EROFS image.
fn damage_unmounted(image: &Path) {
    let mount = image.with_extension("mnt");
    let status = std::process::Command::new("umount")
        .arg(&mount)
        .status()
        .unwrap();
    assert!(status.success(), "unmounting {}", mount.display());
    std::fs::write(image, b"not an erofs image").unwrap();
}

/// Waits (up to 60 s: a loaded machine) for `path` to exist.
fn wait_for(path: &Path) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

fn strategy_of(lamina: &Lamina, id: &str) -> String {
    lamina_integration::records::rootfs_of(&lamina.store, id)["strategy"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The lowers of the overlay mounted on `rootfs` (data-only ones not counted).
fn lowers_of(rootfs: &Path) -> usize {
    let options = lamina_integration::proof::super_options(rootfs).unwrap();
    options
        .split(',')
        .filter(|o| o.starts_with("lowerdir"))
        .map(|o| o.split("::").next().unwrap().split(':').count())
        .sum()
}

/// Where the metadata image of container `id`'s image is.
fn metadata_image_of(lamina: &Lamina, id: &str) -> PathBuf {
    let store = lamina_store::Store::open(&lamina.store).unwrap();
    let container = lamina_mount::record::read(&store, id).unwrap();
    lamina_mount::composefs::image_path(&store, container.record.layers.last().unwrap())
}

/// `auto` and a deep image (docs/strategies.md, auto): the first create is served from
/// the layers and starts the metadata image's build in the background; `clean` keeps the
/// image while a container is made of it, and creates after the build mount it as one
/// lower. Garden's `--without-mount` keeps to the layers; an image that fails to mount
/// falls back to them and is recorded as refused.
#[test]
fn auto_mounts_a_deep_image_through_composefs_once_a_background_build_made_it() {
    require_root();
    let fs = ScratchFs::loop_backed(lamina_integration::FsKind::Xfs, 512, false);
    let lamina = Lamina::init(&fs.path().join("store"));
    let layers = lamina_mount::COMPOSEFS_FROM_LAYERS;
    let image = deep_image(&fs.path().join("deep"), layers, None);
    let first = lamina.create_with(&[], &image, "first");
    assert_eq!(strategy_of(&lamina, "first"), "metacopy,deferred");
    assert_eq!(lowers_of(&first), layers);
    let built = metadata_image_of(&lamina, "first");
    assert!(
        wait_for(&built),
        "the background build made {}",
        built.display()
    );
    // Nothing mounts it yet, but a container is made of its image: clean keeps it, so a
    // `--with-clean` create does not remove it again.
    let cleaned = lamina.run(&["clean"]).json();
    assert_eq!(cleaned["composefs_images_removed"], 0, "{cleaned}");
    let second = lamina.create_with(&[], &image, "second");
    assert_eq!(strategy_of(&lamina, "second"), "composefs,deferred");
    assert_eq!(lowers_of(&second), 1, "one lower for {layers} layers");
    for i in 0..layers {
        let path = format!("d/f{i}");
        assert_eq!(
            std::fs::read(first.join(&path)).unwrap(),
            std::fs::read(second.join(&path)).unwrap(),
            "{path}"
        );
    }
    // A caller that mounts the printed options itself gets the layers: their
    // directories outlive a host restart, the image's mount does not.
    let out = lamina.run(&["create", "--without-mount", &image, "garden"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(strategy_of(&lamina, "garden"), "metacopy,deferred");
    assert!(!out.stdout.contains(".mnt/rootfs"), "{}", out.stdout);
    // One layer fewer: the layers, and nothing built.
    let shallow = deep_image(&fs.path().join("shallow"), layers - 1, None);
    lamina.create_with(&[], &shallow, "shallow");
    assert_eq!(strategy_of(&lamina, "shallow"), "metacopy,deferred");
    for id in ["first", "second", "garden", "shallow"] {
        lamina.delete_and_assert_gone(id, id);
    }
    let left = mounts_under(&lamina.store);
    assert!(
        left.iter()
            .all(|m| m.extension().is_some_and(|e| e == "mnt")),
        "only the image's mount: {left:?}"
    );

    // The image damaged while unmounted (as after a host restart): auto's next create
    // falls back to the layers, records the refusal, and does not try it again.
    damage_unmounted(&built);
    let third = lamina.create_with(&[], &image, "third");
    assert_eq!(strategy_of(&lamina, "third"), "metacopy,deferred");
    assert_eq!(lowers_of(&third), layers);
    let mark = lamina_mount::composefs_auto::refused_path(&built);
    assert!(mark.is_file(), "the failed mount is recorded");
    let fourth = lamina.create_with(&[], &image, "fourth");
    assert_eq!(strategy_of(&lamina, "fourth"), "metacopy,deferred");
    for rootfs in [&third, &fourth] {
        assert_eq!(
            std::fs::read(rootfs.join("d/f0")).unwrap(),
            "layer 0 ".repeat(20).into_bytes()
        );
    }
    // `check --verify --repair` removes the damaged image and forgets the refusal
    // with it: the next create builds it again in the background.
    let repaired = lamina.run(&["check", "--verify", "--repair"]);
    assert!(
        !built.exists() && !mark.exists(),
        "{} {}",
        repaired.stdout,
        repaired.stderr
    );
    lamina.create_with(&[], &image, "fifth");
    assert!(wait_for(&built), "built again");
    let sixth = lamina.create_with(&[], &image, "sixth");
    assert_eq!(strategy_of(&lamina, "sixth"), "composefs,deferred");
    assert_eq!(lowers_of(&sixth), 1);
    for id in ["third", "fourth", "fifth", "sixth"] {
        lamina.delete_and_assert_gone(id, id);
    }
    lamina.run(&["clean"]).ok();
    assert!(mounts_under(&lamina.store).is_empty());
}

/// A build `auto` started that refuses the image (an xattr past what an EROFS inode
/// holds) is recorded: later creates keep to the layers without building again, `clean`
/// keeps the refusal while the image is in the store and forgets it with the image's
/// layers. The hidden command builds only a real chain of imported layers.
#[test]
fn a_refused_background_build_is_recorded_until_the_image_goes() {
    require_root();
    let fs = ScratchFs::loop_backed(lamina_integration::FsKind::Xfs, 512, false);
    let lamina = Lamina::init(&fs.path().join("store"));
    let layers = lamina_mount::COMPOSEFS_FROM_LAYERS;
    let big = vec![b'x'; 40 << 10];
    let refused = deep_image(&fs.path().join("refused"), layers, Some(&big));
    lamina.create_with(&[], &refused, "r1");
    let image_path = metadata_image_of(&lamina, "r1");
    let mark = lamina_mount::composefs_auto::refused_path(&image_path);
    assert!(
        wait_for(&mark),
        "the refusal is recorded at {}",
        mark.display()
    );
    let why = std::fs::read_to_string(&mark).unwrap();
    assert!(why.contains("xattrs"), "{why}");
    let cleaned = lamina.run(&["clean"]).json();
    assert!(
        mark.exists(),
        "kept while the image is in the store: {cleaned}"
    );
    lamina.create_with(&[], &refused, "r2");
    assert_eq!(strategy_of(&lamina, "r2"), "metacopy,deferred");
    assert!(!image_path.exists());

    // Only the whole chain: its top alone, or the layers out of order, are refused.
    let store = lamina_store::Store::open(&lamina.store).unwrap();
    let chain = lamina_mount::record::read(&store, "r2")
        .unwrap()
        .record
        .layers;
    let names: Vec<String> = chain.iter().map(ToString::to_string).collect();
    for args in [
        vec![names[layers - 1].as_str()],
        names.iter().rev().map(String::as_str).collect(),
    ] {
        let mut full = vec!["build-metadata-image"];
        full.extend(args);
        let out = lamina.run(&full);
        assert_eq!(out.code, 1, "{out:?}");
        assert!(out.stdout.contains("not a chain"), "{out:?}");
    }
    assert!(!image_path.exists());

    for id in ["r1", "r2"] {
        lamina.delete_and_assert_gone(id, id);
    }
    let cleaned = lamina.run(&["clean"]).json();
    assert!(
        !mark.exists(),
        "forgotten with the image's layers: {cleaned}"
    );
    assert!(mounts_under(&lamina.store).is_empty());
}
