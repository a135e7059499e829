//! The hostile-input corpus, through the real CLI. Every refused case must give exit 1 and
//! one line on stdout naming the layer and the entry (or the document) at fault, and leave
//! the scratch filesystem — the store and everything beside it — exactly as it was: no
//! partial layer, no container, no temp dir, no mount, nothing written outside. The
//! accepted cases are legitimate layers that look alarming; they must import, and stay
//! inside their layer.
//!
//! Each case builds its image in code; `docs/security.md` lists what each one proves.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lamina_image::{Compression, Platform};
use lamina_integration::hostile::{self, gzip};
use lamina_integration::scratch::mounts_under;
use lamina_integration::tree::Tree;
use lamina_integration::{Lamina, Output, ScratchFs, require_root};
use lamina_sample::{EntryType, Layer, LayerBuilder, RawTar};

/// A fresh store that already holds the base layer (imported by a `--without-mount`
/// create), plus a `victim/` directory beside it for escapes to aim at.
struct Scene {
    fs: ScratchFs,
    lamina: Lamina,
    victim: PathBuf,
}

/// flock files and per-boot caches: created on use, holding no state anyone trusts.
const NOT_STATE: &[&str] = &["store/locks", "store/run"];

fn scene() -> Scene {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let victim = fs.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("file"), "keep").unwrap();
    let base = hostile::write(&fs.path().join("base"), &hostile::base_only());
    let out = lamina.run(&["create", "--without-mount", &base, "warm"]);
    assert_eq!(out.code, 0, "{out:?}");
    Scene { fs, lamina, victim }
}

impl Scene {
    fn dir(&self, name: &str) -> PathBuf {
        self.fs.path().join(name)
    }

    fn write(&self, image: &lamina_sample::BuiltImage) -> String {
        hostile::write(&self.dir("img"), image)
    }

    /// A layout whose top layer is `tar`, gzipped.
    fn top(&self, tar: Vec<u8>) -> String {
        self.write(&hostile::with_top(gzip(tar)))
    }

    /// Runs `create` and checks everything a refusal promises; returns the output.
    fn refused(&self, image: &str, flags: &[&str], mentions: &[&str]) -> Output {
        let before = Tree::of(self.fs.path(), NOT_STATE);
        let mut args = flags.to_vec();
        args.extend_from_slice(&["create", image, "hostile"]);
        let out = self.lamina.run(&args);
        assert_eq!(out.code, 1, "refused with exit 1: {out:?}");
        assert_eq!(out.stdout.lines().count(), 1, "one line: {out:?}");
        for m in mentions {
            assert!(out.stdout.contains(m), "expected `{m}` in: {}", out.stdout);
        }
        let after = Tree::of(self.fs.path(), NOT_STATE);
        assert!(before == after, "changed:\n{}", before.diff(&after));
        assert!(mounts_under(&self.lamina.store).is_empty());
        out
    }

    /// A refused layer: also names layer 1 and `entry`.
    fn refused_entry(&self, image: &str, entry: &str, mentions: &[&str]) {
        let out = self.refused(image, &[], mentions);
        assert!(out.stdout.contains("layer 1 (sha256:"), "{}", out.stdout);
        assert!(
            out.stdout.contains(&format!("entry `{entry}`")),
            "names entry `{entry}`: {}",
            out.stdout
        );
    }

    /// An accepted layer: create succeeds; returns the rootfs for checks, then deletes.
    fn accepted(&self, image: &str, check: impl FnOnce(&Path)) {
        let before_outside = Tree::of(self.fs.path(), &["store", "img"]);
        let rootfs = self.lamina.create(image, "accepted");
        check(&rootfs);
        self.lamina
            .delete_and_assert_gone("accepted", "accepted case");
        assert_eq!(before_outside, Tree::of(self.fs.path(), &["store", "img"]));
        assert_eq!(
            fs::read_to_string(self.victim.join("file")).unwrap(),
            "keep"
        );
        assert_eq!(fs::read_dir(&self.victim).unwrap().count(), 1);
    }
}

fn layer() -> LayerBuilder {
    LayerBuilder::new().file("fine.txt", 0o644, b"ok").unwrap()
}

fn raw(b: LayerBuilder, kind: EntryType, name: &str, link: Option<&str>) -> LayerBuilder {
    b.raw(
        kind,
        name,
        link,
        if kind == EntryType::Regular {
            b"pwned"
        } else {
            b""
        },
    )
    .unwrap()
}

fn pax(b: LayerBuilder, name: &[u8], link: Option<&[u8]>, extra: &[(&str, &[u8])]) -> LayerBuilder {
    let kind = if link.is_some() {
        EntryType::Link
    } else {
        EntryType::Regular
    };
    b.pax(kind, name, link, b"data", extra).unwrap()
}

// ---- names that leave the layer --------------------------------------------------------

#[test]
fn dot_dot_traversal() {
    let s = scene();
    let name = "../../../../../../../../../tmp/lamina-escape-dotdot";
    let img = s.top(
        raw(layer(), EntryType::Regular, name, None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, name, &["`..` component escapes the layer root"]);
    assert!(!Path::new("/tmp/lamina-escape-dotdot").exists());
}

#[test]
fn absolute_path() {
    let s = scene();
    let name = "/tmp/lamina-escape-absolute";
    let img = s.top(
        raw(layer(), EntryType::Regular, name, None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, name, &["absolute path escapes the layer root"]);
    assert!(!Path::new(name).exists());
}

#[test]
fn symlink_to_outside_then_a_write_through_it() {
    let s = scene();
    let b = layer()
        .symlink("escape", s.victim.to_str().unwrap())
        .unwrap();
    let img = s.top(
        raw(b, EntryType::Regular, "escape/planted", None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(
        &img,
        "escape/planted",
        &["`escape` is a symlink; refusing to write through it"],
    );
}

#[test]
fn relative_symlink_climbing_out_then_a_write_through_it() {
    let s = scene();
    let b = layer().symlink("up", "../../../../../../../..").unwrap();
    let img = s.top(
        raw(b, EntryType::Regular, "up/tmp/lamina-escape-up", None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "up/tmp/lamina-escape-up", &["`up` is a symlink"]);
    assert!(!Path::new("/tmp/lamina-escape-up").exists());
}

#[test]
fn symlink_loop_then_a_write_through_it() {
    let s = scene();
    let b = layer()
        .symlink("a", "b")
        .unwrap()
        .symlink("b", "a")
        .unwrap();
    let img = s.top(raw(b, EntryType::Regular, "a/x", None).finish().unwrap());
    s.refused_entry(&img, "a/x", &["`a` is a symlink"]);
}

#[test]
fn directory_replaced_by_a_symlink_then_written_through() {
    let s = scene();
    let b = layer()
        .dir("d", 0o755)
        .unwrap()
        .file("d/inside", 0o644, b"x")
        .unwrap();
    let b = raw(b, EntryType::Symlink, "d", Some(s.victim.to_str().unwrap()));
    let img = s.top(
        raw(b, EntryType::Regular, "d/planted", None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "d", &["appears earlier in this layer as a directory"]);
}

// ---- hardlinks ---------------------------------------------------------------------------

#[test]
fn hardlink_to_outside() {
    let s = scene();
    let img = s.top(
        raw(
            layer(),
            EntryType::Link,
            "evil",
            Some("../../../../../etc/passwd"),
        )
        .finish()
        .unwrap(),
    );
    s.refused_entry(
        &img,
        "evil",
        &["hardlink target `../../../../../etc/passwd`", "`..`"],
    );
}

#[test]
fn hardlink_to_an_absolute_target() {
    let s = scene();
    let img = s.top(
        raw(layer(), EntryType::Link, "evil", Some("/etc/passwd"))
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "evil", &["hardlink target `/etc/passwd`", "absolute"]);
}

#[test]
fn hardlink_to_a_missing_target() {
    let s = scene();
    let img = s.top(
        raw(layer(), EntryType::Link, "evil", Some("nowhere"))
            .finish()
            .unwrap(),
    );
    s.refused_entry(
        &img,
        "evil",
        &["hardlink target `nowhere` does not exist in this layer"],
    );
}

#[test]
fn hardlink_through_a_symlinked_directory() {
    let s = scene();
    let b = layer().symlink("out", s.victim.to_str().unwrap()).unwrap();
    let img = s.top(
        raw(b, EntryType::Link, "evil", Some("out/file"))
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "evil", &["hardlink target `out/file`", "symlink"]);
}

// ---- whiteouts and opaque markers ----------------------------------------------------------

#[test]
fn whiteout_of_dot_dot() {
    let s = scene();
    let img = s.top(
        raw(layer(), EntryType::Regular, "etc/.wh...", None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "etc/.wh...", &["whiteout names no entry"]);
}

#[test]
fn whiteout_inside_a_symlinked_directory() {
    let s = scene();
    let b = layer().symlink("d", s.victim.to_str().unwrap()).unwrap();
    let img = s.top(
        raw(b, EntryType::Regular, "d/.wh.file", None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "d/.wh.file", &["`d` is a symlink"]);
}

#[test]
fn opaque_marker_inside_a_symlinked_directory() {
    let s = scene();
    let b = layer().symlink("d", s.victim.to_str().unwrap()).unwrap();
    let img = s.top(
        raw(b, EntryType::Regular, "d/.wh..wh..opq", None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "d/.wh..wh..opq", &["`d` is a symlink"]);
}

#[test]
fn opaque_marker_at_the_layer_root() {
    let s = scene();
    let img = s.top(
        raw(layer(), EntryType::Regular, ".wh..wh..opq", None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, ".wh..wh..opq", &["opaque marker at the layer root"]);
}

#[test]
fn whiteout_of_an_entry_of_the_same_layer() {
    let s = scene();
    let img = s.top(layer().whiteout("fine.txt").unwrap().finish().unwrap());
    s.refused_entry(&img, ".wh.fine.txt", &["which this layer itself holds"]);
}

// ---- duplicates, sizes, names --------------------------------------------------------------

#[test]
fn directory_then_file_at_one_path() {
    let s = scene();
    let b = layer()
        .dir("x", 0o755)
        .unwrap()
        .file("x/inner", 0o644, b"i")
        .unwrap();
    let img = s.top(b.file("x", 0o644, b"now a file").unwrap().finish().unwrap());
    s.refused_entry(&img, "x", &["appears earlier in this layer as a directory"]);
}

#[test]
fn huge_declared_size() {
    let s = scene();
    let tar = layer().lying_entry("huge", 1 << 40, &[7; 1024]).unwrap();
    let img = s.top(tar);
    s.refused_entry(
        &img,
        "huge",
        &["declares 1099511627776 bytes", "per-layer limit"],
    );
}

#[test]
fn decompression_bomb_past_the_configured_limit() {
    let s = scene();
    let bomb = vec![0u8; 48 << 20];
    let tar = layer()
        .file("bomb", 0o644, &bomb)
        .unwrap()
        .finish()
        .unwrap();
    let img = s.top(tar);
    let out = s.refused(
        &img,
        &["--max-layer-bytes", "16777216"],
        &["layer 1 (sha256:", "limit of 16777216 bytes"],
    );
    assert!(out.stdout.contains("entry `bomb`"), "{}", out.stdout);
}

#[test]
fn name_past_path_max() {
    let s = scene();
    let name = [b"deep/".repeat(900), b"f".to_vec()].concat();
    let img = s.top(pax(layer(), &name, None, &[]).finish().unwrap());
    // Error lines show at most 512 bytes of a name, then its length.
    let shown = format!(
        "{}… (4501 bytes in all)",
        "deep/".repeat(900).split_at(512).0
    );
    s.refused_entry(&img, &shown, &["past PATH_MAX"]);
}

#[test]
fn component_past_name_max() {
    let s = scene();
    let name = "n".repeat(300);
    let img = s.top(pax(layer(), name.as_bytes(), None, &[]).finish().unwrap());
    s.refused_entry(&img, &name, &["300 bytes long, past NAME_MAX"]);
}

#[test]
fn control_characters_in_a_name_stay_on_one_line() {
    let s = scene();
    let name = "../x\n{\"level\":\"forged\"}\x1b[2J";
    let img = s.top(
        raw(layer(), EntryType::Regular, name, None)
            .finish()
            .unwrap(),
    );
    s.refused_entry(&img, "../x\\n{\"level\":\"forged\"}\\u{1b}[2J", &["`..`"]);
}

#[test]
fn non_utf8_name_that_escapes() {
    let s = scene();
    let img = s.top(pax(layer(), b"../caf\xe9", None, &[]).finish().unwrap());
    s.refused_entry(&img, "../caf\u{fffd}", &["`..`"]);
}

// ---- broken streams ------------------------------------------------------------------------

/// A layout whose top layer blob is `blob` as written, the manifest still naming the
/// good blob's digest and size.
fn with_broken_blob(
    s: &Scene,
    compression: Compression,
    cut: impl FnOnce(&[u8]) -> Vec<u8>,
) -> String {
    let big: Vec<u8> = hostile::noise(256 << 10);
    let tar = layer()
        .file("payload", 0o644, &big)
        .unwrap()
        .finish()
        .unwrap();
    let image = hostile::with_top(Layer { tar, compression });
    let img = s.write(&image);
    let digest = image.layers[1].0.clone();
    let broken = cut(&image.blobs[&digest]);
    hostile::overwrite_blob(&s.dir("img"), &digest, &broken);
    img
}

#[test]
fn truncated_gzip() {
    let s = scene();
    let img = with_broken_blob(&s, Compression::Gzip, |b| b[..b.len() / 2].to_vec());
    s.refused_entry(&img, "payload", &["writing file"]);
}

#[test]
fn truncated_zstd() {
    let s = scene();
    let img = with_broken_blob(&s, Compression::Zstd, |b| b[..b.len() / 2].to_vec());
    s.refused_entry(&img, "payload", &["writing file"]);
}

#[test]
fn corrupted_gzip() {
    let s = scene();
    let img = with_broken_blob(&s, Compression::Gzip, |b| {
        let mut b = b.to_vec();
        let mid = b.len() / 2;
        b[mid..mid + 64].copy_from_slice(&[0x55; 64]);
        b
    });
    s.refused_entry(&img, "payload", &["corrupt gzip stream"]);
}

#[test]
fn non_tar_garbage() {
    let s = scene();
    let img = s.write(&hostile::with_top(gzip(hostile::noise(4096))));
    let out = s.refused(&img, &[], &["layer 1 (sha256:", "reading layer tar"]);
    assert!(!out.stdout.contains("entry `"), "{}", out.stdout);
}

// ---- documents that lie --------------------------------------------------------------------

#[test]
fn blob_digest_mismatch() {
    let s = scene();
    let image = hostile::with_top(gzip(layer().finish().unwrap()));
    let img = s.write(&image);
    let digest = image.layers[1].0.clone();
    // Shorter than the real blob: a longer one is refused by its size before it is read.
    let other = hostile::build(
        vec![gzip(LayerBuilder::new().finish().unwrap())],
        &Platform::host(),
    );
    let other_blob = other.blobs[&other.layers[0].0].clone();
    hostile::overwrite_blob(&s.dir("img"), &digest, &other_blob);
    s.refused(&img, &[], &["layer 1 (sha256:", "blob digest mismatch"]);
}

#[test]
fn diff_id_mismatch() {
    let s = scene();
    let mut image = hostile::with_top(gzip(layer().finish().unwrap()));
    hostile::edit_config(&mut image, |c| {
        c["rootfs"]["diff_ids"][1] = format!("sha256:{}", "ab".repeat(32)).into();
    });
    let img = s.write(&image);
    s.refused(&img, &[], &["layer 1 (sha256:", "diffID mismatch"]);
}

#[test]
fn manifest_naming_a_missing_blob() {
    let s = scene();
    let image = hostile::with_top(gzip(layer().finish().unwrap()));
    let img = s.write(&image);
    let digest = image.layers[1].0.clone();
    fs::remove_file(s.dir("img/blobs/sha256").join(digest.hex())).unwrap();
    s.refused(&img, &[], &[digest.hex(), "missing"]);
}

#[test]
fn index_without_a_matching_platform() {
    let s = scene();
    let foreign = |arch: &str| {
        let platform = Platform {
            os: "linux".into(),
            architecture: arch.into(),
            variant: None,
        };
        hostile::build(vec![gzip(hostile::base_layer())], &platform)
    };
    let (s390x, riscv) = (foreign("s390x"), foreign("riscv64"));
    let dir = s.dir("img");
    lamina_sample::write_oci_layout(
        &dir,
        &[&s390x, &riscv],
        &[
            (s390x.manifest.clone(), Some(hostile::TAG)),
            (riscv.manifest.clone(), Some(hostile::TAG)),
        ],
    )
    .unwrap();
    let img = format!("oci://{}:{}", dir.display(), hostile::TAG);
    s.refused(
        &img,
        &[],
        &["no image for platform", "linux/s390x, linux/riscv64"],
    );
}

#[test]
fn malformed_manifest_json() {
    let s = scene();
    let mut image = hostile::with_top(gzip(layer().finish().unwrap()));
    hostile::set_manifest(&mut image, br#"{"schemaVersion":2,"layers":[{"#.to_vec());
    let img = s.write(&image);
    s.refused(&img, &[], &["manifest"]);
}

#[test]
fn malformed_config_json() {
    let s = scene();
    let mut image = hostile::with_top(gzip(layer().finish().unwrap()));
    hostile::set_config(&mut image, b"{\"rootfs\": nope}".to_vec());
    let img = s.write(&image);
    s.refused(&img, &[], &["config"]);
}

#[test]
fn config_with_fewer_diff_ids_than_layers() {
    let s = scene();
    let mut image = hostile::with_top(gzip(layer().finish().unwrap()));
    hostile::edit_config(&mut image, |c| {
        c["rootfs"]["diff_ids"].as_array_mut().unwrap().pop();
    });
    let img = s.write(&image);
    s.refused(&img, &[], &["diff"]);
}

#[test]
fn docker_archive_naming_a_layer_outside_it() {
    let s = scene();
    let staging = s.dir("docker");
    fs::create_dir(&staging).unwrap();
    let image = hostile::base_only();
    fs::write(
        staging.join("config.json"),
        &image.blobs[&image.config_digest],
    )
    .unwrap();
    let manifest = serde_json::json!([{ "Config": "config.json", "RepoTags": ["evil:latest"], "Layers": ["../../../../../etc/hostname"] }]);
    fs::write(staging.join("manifest.json"), manifest.to_string()).unwrap();
    let archive = s.dir("docker.tar");
    lamina_sample::tar_dir(&staging, &archive).unwrap();
    fs::remove_dir_all(&staging).unwrap();
    s.refused(
        &format!("docker-archive://{}", archive.display()),
        &[],
        &["../../../../../etc/hostname"],
    );
}

// ---- alarming but legitimate: accepted, and contained ----------------------------------------

#[test]
fn setuid_files_are_kept_inside_the_layer() {
    let s = scene();
    let img = s.top(
        layer()
            .file("bin-su", 0o4755, b"#!/bin/sh\n")
            .unwrap()
            .finish()
            .unwrap(),
    );
    s.accepted(&img, |rootfs| {
        let mode = fs::metadata(rootfs.join("bin-su"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o7777,
            0o4755,
            "images ship su and ping: the bit stays"
        );
    });
}

#[test]
fn non_utf8_names_are_kept_byte_for_byte() {
    let s = scene();
    let img = s.top(pax(layer(), b"caf\xe9", None, &[]).finish().unwrap());
    s.accepted(&img, |rootfs| {
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9");
        assert_eq!(fs::read(rootfs.join(name)).unwrap(), b"data");
    });
}

#[test]
fn smuggled_overlay_xattrs_are_dropped() {
    let s = scene();
    let extra: &[(&str, &[u8])] = &[
        ("SCHILY.xattr.trusted.overlay.redirect", b"/etc"),
        ("SCHILY.xattr.trusted.overlay.metacopy", b""),
        ("SCHILY.xattr.user.kept", b"yes"),
    ];
    let img = s.top(pax(layer(), b"decoy", None, extra).finish().unwrap());
    s.accepted(&img, |rootfs| {
        let layer = s.lamina.store.join("layers");
        let decoys: Vec<PathBuf> = fs::read_dir(&layer)
            .unwrap()
            .map(|e| e.unwrap().path().join("diff/decoy"))
            .filter(|p| p.exists())
            .collect();
        assert_eq!(decoys.len(), 1);
        assert_eq!(xattr(&decoys[0], "trusted.overlay.redirect"), None);
        assert_eq!(xattr(&decoys[0], "trusted.overlay.metacopy"), None);
        assert_eq!(xattr(&decoys[0], "user.kept").as_deref(), Some(&b"yes"[..]));
        assert_eq!(fs::read(rootfs.join("decoy")).unwrap(), b"data");
    });
}

#[test]
fn symlinks_pointing_anywhere_are_kept_as_links() {
    let s = scene();
    let b = layer()
        .symlink("loop-a", "loop-b")
        .unwrap()
        .symlink("loop-b", "loop-a")
        .unwrap();
    let b = b
        .symlink("passwd", "/etc/passwd")
        .unwrap()
        .symlink("up", "../../../..")
        .unwrap();
    let img = s.top(b.finish().unwrap());
    s.accepted(&img, |rootfs| {
        assert_eq!(
            fs::read_link(rootfs.join("loop-a")).unwrap(),
            Path::new("loop-b")
        );
        assert_eq!(
            fs::read_link(rootfs.join("passwd")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert_eq!(
            fs::read_link(rootfs.join("up")).unwrap(),
            Path::new("../../../..")
        );
    });
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let n = rustix::fs::lgetxattr(path, name, &mut buf).ok()?;
    buf.truncate(n);
    Some(buf)
}

// ---- records and entry types that exhaust memory, disk or time, or delete files ----------

/// A top layer of `fine.txt` followed by the raw members `build` writes.
fn raw_top(s: &Scene, build: impl FnOnce(&mut RawTar) -> &mut RawTar) -> String {
    let mut tar = RawTar::default();
    tar.file("fine.txt", b"ok");
    s.top(build(&mut tar).finish())
}

#[test]
fn old_gnu_sparse_entry_whose_holes_would_fill_the_disk() {
    let s = scene();
    // 1 byte of data at the end of a 640 MiB file: 354 bytes of gzip, 640 MiB written
    // by a reader that writes holes out.
    let img = raw_top(&s, |t| {
        t.gnu_sparse("holes", 640 << 20, (640 << 20) - 1, b"x")
    });
    s.refused_entry(&img, "holes", &["sparse files are not supported"]);
}

#[test]
fn pax_sparse_entry() {
    let s = scene();
    let img = raw_top(&s, |t| {
        t.pax(&[("GNU.sparse.major", b"1"), ("GNU.sparse.minor", b"0")])
            .file("GNUSparseFile.0/holes", b"1\n0\n1\n")
    });
    s.refused_entry(
        &img,
        "GNUSparseFile.0/holes",
        &["sparse files are not supported"],
    );
}

#[test]
fn entries_each_under_the_limit_that_pass_it_together() {
    let s = scene();
    let img = raw_top(&s, |t| t.file("a", &[1; 6 << 20]).file("b", &[2; 6 << 20]));
    s.refused(
        &img,
        &["--max-layer-bytes", "10485760"],
        &[
            "entry `b`",
            "bringing the layer to",
            "limit of 10485760 bytes",
        ],
    );
}

#[test]
fn gnu_long_name_record_of_3_gib() {
    let s = scene();
    // Declares 3 GiB, holds 64 KiB: a reader that buffers it first needs the 3 GiB.
    let img = raw_top(&s, |t| {
        t.member(b'L', "././@LongLink", 3 << 30, &[b'n'; 64 << 10])
    });
    let out = s.refused(
        &img,
        &[],
        &[
            "GNU long-name record declares 3221225472 bytes",
            "layer 1 (sha256:",
        ],
    );
    assert!(out.stdout.len() < 600, "a short line: {}", out.stdout);
}

#[test]
fn pax_record_of_256_mib() {
    let s = scene();
    let img = raw_top(&s, |t| t.member(b'x', "pax", 256 << 20, &[b'p'; 64 << 10]));
    s.refused(&img, &[], &["PAX record declares 268435456 bytes"]);
}

#[test]
fn pax_name_of_900_kib_gives_a_bounded_line() {
    let s = scene();
    let name = format!("{}x", "n/".repeat(450 << 10));
    let img = raw_top(&s, |t| t.pax(&[("path", name.as_bytes())]).file("x", b"x"));
    let out = s.refused(&img, &[], &["past PATH_MAX", "bytes in all)"]);
    assert!(out.stdout.len() < 1200, "{} bytes", out.stdout.len());
}

#[test]
fn global_header_at_an_earlier_path_deletes_nothing() {
    let s = scene();
    let img = raw_top(&s, |t| {
        t.member(b'5', "etc", 0, b"")
            .file("etc/passwd", b"root:x:0:0::/root:/bin/sh\n")
            .member(b'g', "etc/passwd", 0, b"")
            .member(b'g', "made/by/global", 0, b"")
    });
    s.accepted(&img, |rootfs| {
        assert_eq!(
            fs::read(rootfs.join("etc/passwd")).unwrap(),
            b"root:x:0:0::/root:/bin/sh\n"
        );
        assert!(!rootfs.join("made").exists());
    });
}

#[test]
fn unknown_entry_type_is_refused_naming_the_entry() {
    let s = scene();
    let img = raw_top(&s, |t| {
        t.member(b'5', "etc", 0, b"")
            .file("etc/passwd", b"root")
            .member(b'Q', "etc/passwd", 0, b"")
    });
    s.refused_entry(&img, "etc/passwd", &["unknown tar entry type `Q`"]);
}

#[test]
fn directory_with_data_hiding_an_entry_other_readers_skip() {
    let s = scene();
    // Go and GNU tar read a header right after a directory's, whatever its size says;
    // a reader that skips the size would unpack `hidden`, which they never list.
    let mut inner = RawTar::default();
    inner.file("hidden", b"x");
    let inner = inner.finish();
    let img = raw_top(&s, |t| t.member(b'5', "d", 512, &inner[..512]));
    s.refused_entry(&img, "d", &["declares 512 bytes of data"]);
}

#[test]
fn gnu_long_name_and_pax_path_on_one_entry() {
    let s = scene();
    let img = raw_top(&s, |t| {
        t.member(b'L', "././@LongLink", 9, b"gnu_name\0")
            .pax(&[("path", b"pax_name")])
            .file("header_name", b"x")
    });
    s.refused_entry(
        &img,
        "pax_name",
        &["both a GNU long name record and a PAX one"],
    );
}
