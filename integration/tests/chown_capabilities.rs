//! File capabilities survive a uid-mapped store (issue 20, class 7). With
//! `--chown-layers`, import chowns every layer file to the mapped ids, and chown makes
//! the kernel drop `security.capability`: lamina writes it back as v3, its rootid shifted
//! like an owner (a v2 value's implied rootid 0 too, so the image's root's capability is
//! the mapped root's). An idmapped store chowns nothing and keeps the value on disk.

// The test reads and changes the host as a user or attacker would, not through
// lamina's kernel seam.
#![allow(clippy::disallowed_methods)]
// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lamina_image::Compression;
use lamina_integration::{Lamina, ScratchFs, hostile, require_root};
use lamina_sample::{Layer, LayerBuilder};

/// The host uid (and gid) the container's root maps to.
const MAPPED_ROOT: u32 = 100_000;
const CAP_NET_RAW: u32 = 1 << 13;
const EFFECTIVE: u32 = 0x1;

/// `struct vfs_cap_data` revision 2: magic, permitted and inheritable, two words each.
fn cap_v2(permitted: u32) -> Vec<u8> {
    let mut value = (0x0200_0000 | EFFECTIVE).to_le_bytes().to_vec();
    for word in [permitted, 0, 0, 0] {
        value.extend(word.to_le_bytes());
    }
    value
}

/// Revision 3: revision 2 plus the rootid of the namespace it is valid in.
fn cap_v3(permitted: u32, rootid: u32) -> Vec<u8> {
    let mut value = (0x0300_0000 | EFFECTIVE).to_le_bytes().to_vec();
    for word in [permitted, 0, 0, 0, rootid] {
        value.extend(word.to_le_bytes());
    }
    value
}

/// The raw `security.capability` of `path`, if any.
fn capability(path: &Path) -> Option<Vec<u8>> {
    let mut buf = [0u8; 64];
    rustix::fs::lgetxattr(path, "security.capability", &mut buf)
        .ok()
        .map(|n| buf[..n].to_vec())
}

/// An image whose top layer holds capable files: `ping3` (v3, rootid 0), `ping2` (v2),
/// `ping1000` (v3, rootid 1000: valid where uid 1000 is root), and `both` (setuid too).
fn capable_image(dir: &Path) -> String {
    let v3 = cap_v3(CAP_NET_RAW, 0);
    let v3_1000 = cap_v3(CAP_NET_RAW, 1000);
    let v2 = cap_v2(CAP_NET_RAW);
    let tar = LayerBuilder::new()
        .dir("bin", 0o755)
        .and_then(|b| {
            b.file_with_xattrs("bin/ping3", 0o755, b"v3\n", &[("security.capability", &v3)])
        })
        .and_then(|b| {
            b.file_with_xattrs("bin/ping2", 0o755, b"v2\n", &[("security.capability", &v2)])
        })
        .and_then(|b| {
            b.file_with_xattrs(
                "bin/ping1000",
                0o755,
                b"v3 1000\n",
                &[("security.capability", &v3_1000)],
            )
        })
        .and_then(|b| {
            b.file_with_xattrs(
                "bin/both",
                0o4755,
                b"both\n",
                &[("security.capability", &v2)],
            )
        })
        .and_then(LayerBuilder::finish)
        .unwrap();
    let image = hostile::with_top(Layer {
        tar,
        compression: Compression::Gzip,
    });
    hostile::write(dir, &image)
}

fn mapped_store(fs: &ScratchFs, extra: &[&str]) -> Lamina {
    let lamina = Lamina::new(&fs.path().join("store"));
    let mut args = vec![
        "init-store",
        "--uid-mapping",
        "0:100000:65536",
        "--gid-mapping",
        "0:100000:65536",
    ];
    args.extend_from_slice(extra);
    let out = lamina.run(&args);
    assert_eq!(out.code, 0, "{out:?}");
    lamina
}

/// The `diff/` of the stored layer that holds `name`.
fn layer_with(lamina: &Lamina, name: &str) -> PathBuf {
    std::fs::read_dir(lamina.store.join("layers"))
        .unwrap()
        .map(|l| l.unwrap().path().join("diff"))
        .find(|diff| diff.join(name).exists())
        .unwrap_or_else(|| panic!("no layer holds {name}"))
}

#[test]
fn chowned_layers_keep_file_capabilities_with_a_v3_rootid_shifted_to_the_mapped_root() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let lamina = mapped_store(&fs, &["--chown-layers"]);
    let image = capable_image(&fs.path().join("img"));
    let rootfs = lamina.create(&image, "capable");

    let rooted_at_mapped_root = cap_v3(CAP_NET_RAW, MAPPED_ROOT);
    for place in [rootfs.clone(), layer_with(&lamina, "bin/ping3")] {
        for (name, expected, mode) in [
            ("bin/ping3", &rooted_at_mapped_root, 0o755),
            ("bin/ping2", &rooted_at_mapped_root, 0o755),
            (
                "bin/ping1000",
                &cap_v3(CAP_NET_RAW, MAPPED_ROOT + 1000),
                0o755,
            ),
            ("bin/both", &rooted_at_mapped_root, 0o4755),
        ] {
            let path = place.join(name);
            let meta = std::fs::metadata(&path).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid()),
                (MAPPED_ROOT, MAPPED_ROOT),
                "{}",
                path.display()
            );
            assert_eq!(meta.mode() & 0o7777, mode, "{}", path.display());
            assert_eq!(
                capability(&path).as_ref(),
                Some(expected),
                "{}: keeps cap_net_raw, rooted at the (shifted) root",
                path.display()
            );
        }
    }
    lamina.delete_and_assert_gone("capable", "chowned store");
}

#[test]
fn idmapped_layers_keep_file_capabilities_as_the_image_has_them() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let lamina = mapped_store(&fs, &[]);
    let image = capable_image(&fs.path().join("img"));
    let rootfs = lamina.create(&image, "capable");

    let layer = layer_with(&lamina, "bin/ping3");
    let meta = std::fs::metadata(layer.join("bin/ping3")).unwrap();
    assert_eq!(meta.uid(), 0, "idmapped: nothing is chowned on disk");
    // As the unpacker wrote them: real root's v3 with rootid 0 is stored as v2.
    for (name, expected) in [
        ("bin/ping3", cap_v2(CAP_NET_RAW)),
        ("bin/ping2", cap_v2(CAP_NET_RAW)),
        ("bin/ping1000", cap_v3(CAP_NET_RAW, 1000)),
        ("bin/both", cap_v2(CAP_NET_RAW)),
    ] {
        assert_eq!(capability(&layer.join(name)), Some(expected), "{name}");
    }
    // Through the idmapped rootfs the kernel shows each value rooted at the mapped root:
    // the very bytes a chowned store now keeps on disk.
    for (name, expected) in [
        ("bin/ping3", cap_v3(CAP_NET_RAW, MAPPED_ROOT)),
        ("bin/ping2", cap_v3(CAP_NET_RAW, MAPPED_ROOT)),
        ("bin/ping1000", cap_v3(CAP_NET_RAW, MAPPED_ROOT + 1000)),
        ("bin/both", cap_v3(CAP_NET_RAW, MAPPED_ROOT)),
    ] {
        let path = rootfs.join(name);
        assert_eq!(
            std::fs::metadata(&path).unwrap().uid(),
            MAPPED_ROOT,
            "{name}"
        );
        assert_eq!(capability(&path), Some(expected), "{name}");
    }
    lamina.delete_and_assert_gone("capable", "idmapped store");
}
