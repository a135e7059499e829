//! Hostile image documents and image-level streams, through the real CLI: oversized
//! documents, an image for another platform, image strings holding control characters,
//! and a plain rootfs tar that is a decompression bomb. Every refusal must give exit 1 and
//! one line on stdout, leave the scratch filesystem (store included) exactly as it was,
//! and leave a store that `lamina check` finds clean. `docs/security.md` lists the cases.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use lamina_image::{MAX_DOCUMENT_BYTES, Platform};
use lamina_integration::hostile::{self, gzip};
use lamina_integration::scratch::mounts_under;
use lamina_integration::tree::Tree;
use lamina_integration::{Lamina, Output, ScratchFs, require_root};
use lamina_sample::{BuiltImage, LayerBuilder, write_docker_archive, write_oci_layout};

/// flock files and per-boot caches: created on use, holding no state anyone trusts.
const NOT_STATE: &[&str] = &["store/locks", "store/run"];

/// The most any one `lamina` call here may take before it is killed. Generous: every call
/// finishes in well under a second; it bounds a regression (a bomb read through to the
/// end) so that it fails the test instead of hanging it.
const PROCESS_TIMEOUT_SECS: &str = "120";

/// A fresh store that already holds the good base layer.
struct Scene {
    fs: ScratchFs,
    lamina: Lamina,
}

fn scene() -> Scene {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let base = hostile::write(&fs.path().join("base"), &hostile::base_only());
    let out = lamina.run(&["create", "--without-mount", &base, "warm"]);
    assert_eq!(out.code, 0, "{out:?}");
    Scene { fs, lamina }
}

impl Scene {
    fn dir(&self, name: &str) -> PathBuf {
        self.fs.path().join(name)
    }

    /// `lamina --store STORE ARGS...` under coreutils `timeout`.
    fn run(&self, args: &[&str]) -> Output {
        let out = Command::new("timeout")
            .arg(PROCESS_TIMEOUT_SECS)
            .arg(lamina_integration::lamina::binary())
            .arg("--store")
            .arg(&self.lamina.store)
            .args(args)
            .output()
            .expect("running lamina under timeout");
        let out = Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        assert_ne!(
            out.code, 124,
            "lamina {args:?} was still running after {PROCESS_TIMEOUT_SECS} s"
        );
        out
    }

    /// Runs `create FLAGS IMAGE hostile` and checks everything a refusal promises: exit 1,
    /// one line naming each of `mentions`, no control character on stdout or stderr, the
    /// scratch filesystem unchanged, no mount, and `lamina check` clean.
    fn refused(&self, image: &str, flags: &[&str], mentions: &[&str]) -> Output {
        let before = Tree::of(self.fs.path(), NOT_STATE);
        let mut args = vec!["create"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&[image, "hostile"]);
        let out = self.run(&args);
        assert_eq!(out.code, 1, "refused with exit 1: {out:?}");
        assert_eq!(out.stdout.lines().count(), 1, "one line: {out:?}");
        for m in mentions {
            assert!(out.stdout.contains(m), "expected `{m}` in: {}", out.stdout);
        }
        assert_no_control_characters(&out);
        let after = Tree::of(self.fs.path(), NOT_STATE);
        assert!(before == after, "changed:\n{}", before.diff(&after));
        assert!(mounts_under(&self.lamina.store).is_empty());
        assert_check_is_clean(&self.lamina);
        out
    }

    /// Runs `create FLAGS IMAGE accepted`, then deletes the container.
    fn accepted(&self, image: &str, flags: &[&str]) {
        let rootfs = self.lamina.create_with(flags, image, "accepted");
        assert!(rootfs.join("etc/hostname").exists(), "{}", rootfs.display());
        self.lamina.delete_and_assert_gone("accepted", image);
        assert_check_is_clean(&self.lamina);
    }
}

fn assert_check_is_clean(lamina: &Lamina) {
    let report = lamina.run(&["check"]).json();
    assert_eq!(report["ok"], true, "check after a refusal: {report}");
}

/// No raw carriage return, escape, or other control character but the line ends: an image
/// string must not be able to rewrite the terminal or forge a line.
fn assert_no_control_characters(out: &Output) {
    for (name, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let bad: Vec<char> = text
            .chars()
            .filter(|c| c.is_control() && *c != '\n')
            .collect();
        assert!(bad.is_empty(), "raw {bad:?} on {name}: {text:?}");
    }
}

/// A platform that is not this host's.
fn foreign_platform() -> Platform {
    let arch = if Platform::host().architecture == "s390x" {
        "riscv64"
    } else {
        "s390x"
    };
    Platform::parse(&format!("linux/{arch}")).unwrap()
}

/// Past the document limit by a margin.
fn oversized() -> usize {
    MAX_DOCUMENT_BYTES as usize + 4096
}

// ---- class 11: image documents past the size bound ------------------------------------

#[test]
fn oversized_manifest_is_refused_before_it_is_parsed() {
    let s = scene();
    let mut image = hostile::base_only();
    // Not JSON at all: were it parsed, the error would say "is not valid".
    hostile::set_manifest(&mut image, vec![b'{'; oversized()]);
    let img = hostile::write(&s.dir("img"), &image);
    let out = s.refused(
        &img,
        &[],
        &[
            &format!("manifest {}", image.manifest.digest),
            &format!(
                "is {} bytes, past the {MAX_DOCUMENT_BYTES}-byte limit",
                oversized()
            ),
        ],
    );
    assert!(!out.stdout.contains("not valid"), "{}", out.stdout);
}

#[test]
fn oversized_config_is_refused_before_it_is_parsed() {
    let s = scene();
    let mut image = hostile::base_only();
    // Valid JSON, padded with whitespace: the old 16 MiB bound read and used it.
    let mut config = image.blobs[&image.config_digest].clone();
    config.resize(oversized(), b' ');
    hostile::set_config(&mut image, config);
    let img = hostile::write(&s.dir("img"), &image);
    s.refused(
        &img,
        &[],
        &[
            &format!("image config {}", image.config_digest),
            &format!("past the {MAX_DOCUMENT_BYTES}-byte limit for an image document"),
        ],
    );
}

#[test]
fn oversized_index_is_refused_before_it_is_parsed() {
    let s = scene();
    let dir = s.dir("img");
    let img = hostile::write(&dir, &hostile::base_only());
    let mut index = fs::read(dir.join("index.json")).unwrap();
    index.resize(oversized(), b' ');
    fs::write(dir.join("index.json"), index).unwrap();
    s.refused(
        &img,
        &[],
        &["`index.json` is", "-byte limit for an image document"],
    );
}

// ---- class 10: an image for another platform --------------------------------------------

#[test]
fn foreign_architecture_only_image_is_refused_unless_asked_for() {
    let s = scene();
    let foreign = foreign_platform();
    let host = Platform::host();
    let mut image = hostile::build(vec![gzip(hostile::base_layer())], &foreign);
    let img = hostile::write(&s.dir("img"), &image);
    let both = [
        format!("image is for {foreign}"),
        format!("this host's platform {host}"),
        format!("--platform {foreign}"),
    ];
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    s.refused(&img, &[], &both);
    s.refused(&img, &["--platform", &host.to_string()], &both[..1]);
    s.accepted(&img, &["--platform", &foreign.to_string()]);

    // With no platform on the index entry, the config still says which it is.
    image.manifest.platform = None;
    let img = hostile::write(&s.dir("img2"), &image);
    let out = s.refused(&img, &[], &both);
    assert!(out.stdout.contains("its config"), "{}", out.stdout);

    // A docker-archive declares its platform in its config only.
    let archive = s.dir("foreign.docker.tar");
    write_docker_archive(&image, "foreign:latest", &archive).unwrap();
    let img = format!("docker-archive://{}", archive.display());
    s.refused(&img, &[], &both);
    s.accepted(&img, &["--platform", &foreign.to_string()]);
}

// ---- class 9: control characters in image strings -------------------------------------

/// What a hostile string tries: return to the line start, erase it, print a fake success.
const FORGERY: &str = "\r\x1b[2KOK created rootfs\n";

#[test]
fn control_characters_in_a_layer_media_type_are_escaped() {
    let s = scene();
    let mut image = hostile::with_top(gzip(hostile::base_layer()));
    hostile::edit_manifest(&mut image, |m| {
        m["layers"][1]["mediaType"] = format!("application/x{FORGERY}").into();
    });
    let img = hostile::write(&s.dir("img"), &image);
    s.refused(
        &img,
        &[],
        &[
            "unsupported media type",
            "\\r\\u{1b}[2KOK created rootfs\\n",
        ],
    );
}

#[test]
fn control_characters_in_a_ref_name_are_escaped() {
    let s = scene();
    let image = hostile::base_only();
    let dir = s.dir("img");
    let name = format!("evil{FORGERY}");
    write_oci_layout(&dir, &[&image], &[(image.manifest.clone(), Some(&name))]).unwrap();
    s.refused(
        &format!("oci://{}:other", dir.display()),
        &[],
        &["no image named `other`", "evil\\r\\u{1b}[2K"],
    );
}

#[test]
fn control_characters_in_docker_repo_tags_are_escaped() {
    let s = scene();
    let archive = s.dir("img.docker.tar");
    write_docker_archive(&hostile::base_only(), &format!("evil{FORGERY}"), &archive).unwrap();
    s.refused(
        &format!("docker-archive://{}:other:latest", archive.display()),
        &[],
        &["no image tagged `other:latest`", "evil\\r\\u{1b}[2K"],
    );
}

#[test]
fn control_characters_in_a_declared_platform_are_escaped() {
    let s = scene();
    let mut image = hostile::base_only();
    hostile::edit_config(&mut image, |c| {
        c["architecture"] = format!("arm64{FORGERY}").into();
    });
    image.manifest.platform = None;
    let img = hostile::write(&s.dir("img"), &image);
    s.refused(&img, &[], &["image is for linux/arm64\\r\\u{1b}[2K"]);
}

// ---- class 5: a plain rootfs tar that is a decompression bomb ---------------------------

/// A zstd frame of `blocks` RLE blocks, each 128 KiB of zeros: 4 bytes per 128 KiB.
fn zstd_zero_frame(blocks: usize) -> Vec<u8> {
    // Magic; frame header descriptor 0 (no content size, not single-segment, no
    // checksum); window descriptor 0x38: a 128 KiB window (exponent 7), one block's worth.
    let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38];
    for i in 0..blocks {
        let last = u32::from(i + 1 == blocks);
        // Block header, 3 bytes little-endian: last-block bit, type 1 (RLE), size 128 KiB.
        let header = (128 * 1024) << 3 | 1 << 1 | last;
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.push(0);
    }
    frame
}

#[test]
fn zstd_rootfs_tar_bomb_is_refused_at_the_layer_limit() {
    let s = scene();
    // 128 concatenated frames of 1 GiB of zeros each: 4 MiB on disk, 128 GiB decoded.
    // The hashing pass that names a rootfs tar used to read all of it before any limit.
    let frame = zstd_zero_frame(8192);
    let bomb = s.dir("bomb.tar.zst");
    fs::write(&bomb, frame.repeat(128)).unwrap();
    s.refused(
        bomb.to_str().unwrap(),
        &["--max-layer-bytes", "1048576"],
        &["layer 0", "limit of 1048576 bytes"],
    );
}

#[test]
fn a_small_zstd_rootfs_tar_still_imports() {
    let s = scene();
    let tar = LayerBuilder::new()
        .dir("etc", 0o755)
        .and_then(|b| b.file("etc/hostname", 0o644, b"zstd\n"))
        .and_then(LayerBuilder::finish)
        .unwrap();
    let path = s.dir("rootfs.tar.zst");
    let built: BuiltImage = hostile::build(
        vec![lamina_sample::Layer {
            tar,
            compression: lamina_image::Compression::Zstd,
        }],
        &Platform::host(),
    );
    let (digest, _) = &built.layers[0];
    fs::write(&path, &built.blobs[digest]).unwrap();
    s.accepted(path.to_str().unwrap(), &["--max-layer-bytes", "1048576"]);
}

// ---- found by review: partial platforms, variants, C1 controls, archives, blobs ----------

#[test]
fn a_config_naming_only_a_foreign_architecture_is_refused() {
    let s = scene();
    let foreign = foreign_platform();
    let mut image = hostile::build(vec![gzip(hostile::base_layer())], &Platform::host());
    image.manifest.platform = None;
    hostile::edit_config(&mut image, |config| {
        config["architecture"] = foreign.architecture.clone().into();
        config["os"] = "".into();
    });
    let img = hostile::write(&s.dir("img"), &image);
    s.refused(
        &img,
        &[],
        &[&format!("image is for /{}", foreign.architecture)],
    );
}

#[test]
fn arm64_means_arm64_v8() {
    let s = scene();
    let arm64 = Platform::parse("linux/arm64").unwrap();
    let image = hostile::build(vec![gzip(hostile::base_layer())], &arm64);
    let img = hostile::write(&s.dir("img"), &image);
    s.accepted(&img, &["--platform", "linux/arm64/v8"]);
}

#[test]
fn del_and_c1_controls_in_the_env_are_escaped_in_the_json() {
    let s = scene();
    let mut image = hostile::build(vec![gzip(hostile::base_layer())], &Platform::host());
    hostile::edit_config(&mut image, |config| {
        config["config"]["Env"] = serde_json::json!(["X=\u{9b}2J\u{7f}\u{85}"]);
    });
    let img = hostile::write(&s.dir("img"), &image);
    let out = s.run(&["create", &img, "c1"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_no_control_characters(&out);
    let spec: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        spec["process"]["env"][0], "X=\u{9b}2J\u{7f}\u{85}",
        "same value"
    );
    s.lamina.delete_and_assert_gone("c1", "c1");
}

#[test]
fn a_docker_archive_with_a_2_gib_long_name_record_is_refused_by_its_size() {
    let s = scene();
    let archive = s.dir("longname.docker.tar");
    let mut tar = lamina_sample::RawTar::default();
    tar.member(b'L', "././@LongLink", 2 << 30, &[b'n'; 512]);
    fs::write(&archive, tar.finish()).unwrap();
    let img = format!("docker-archive://{}", archive.display());
    s.refused(
        &img,
        &[],
        &["GNU long-name record declares 2147483648 bytes"],
    );
}

#[test]
fn a_layout_blob_longer_than_its_descriptor_is_refused_unread() {
    let s = scene();
    let image = hostile::with_top_file("f", b"data", lamina_image::Compression::Gzip);
    let img = hostile::write(&s.dir("img"), &image);
    let (top, _) = &image.layers[1];
    let blob = s.dir("img/blobs/sha256").join(top.hex());
    // A sparse gigabyte after the real bytes: reading it would cost the gigabyte.
    let file = fs::OpenOptions::new().write(true).open(&blob).unwrap();
    file.set_len(1 << 30).unwrap();
    s.refused(
        &img,
        &[],
        &["blob size mismatch", &format!("blob has {}", 1u64 << 30)],
    );
}

#[test]
fn an_image_of_501_layers_is_refused_before_any_import() {
    let s = scene();
    let layers = (0..501)
        .map(|i| {
            let tar = LayerBuilder::new()
                .file(&format!("f{i}"), 0o644, b"x")
                .and_then(LayerBuilder::finish)
                .unwrap();
            gzip(tar)
        })
        .collect();
    let image = hostile::build(layers, &Platform::host());
    let img = hostile::write(&s.dir("img"), &image);
    s.refused(&img, &[], &["501 layers", "at most 500"]);
}
