//! File capabilities survive a uid-mapped store (issue 20, class 7). With
//! `--chown-layers`, import chowns every layer file to the mapped ids, and chown makes
//! the kernel drop `security.capability`: lamina writes it back, a v3 value with its
//! rootid shifted to the mapped root, a v2 value as it was. An idmapped store chowns
//! nothing and keeps the image's value on disk.

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

/// An image whose top layer holds a v3 (`ping3`, rootid 0) and a v2 (`ping2`) capable
/// file, and a setuid one with a capability too (`both`).
fn capable_image(dir: &Path) -> String {
    let v3 = cap_v3(CAP_NET_RAW, 0);
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

/// `name` in the stored layer that holds it.
fn in_layer(lamina: &Lamina, name: &str) -> PathBuf {
    std::fs::read_dir(lamina.store.join("layers"))
        .unwrap()
        .map(|l| l.unwrap().path().join("diff").join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("no layer holds {name}"))
}

#[test]
fn chowned_layers_keep_file_capabilities_with_a_v3_rootid_shifted_to_the_mapped_root() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let lamina = mapped_store(&fs, &["--chown-layers"]);
    let image = capable_image(&fs.path().join("img"));
    let rootfs = lamina.create(&image, "capable");

    for place in [rootfs.clone(), in_layer(&lamina, "bin/ping3").join("../..")] {
        let ping3 = place.join("bin/ping3");
        let meta = std::fs::metadata(&ping3).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (MAPPED_ROOT, MAPPED_ROOT));
        assert_eq!(
            capability(&ping3),
            Some(cap_v3(CAP_NET_RAW, MAPPED_ROOT)),
            "{}: v3 keeps cap_net_raw, rooted at the mapped root",
            ping3.display()
        );
        let ping2 = place.join("bin/ping2");
        assert_eq!(std::fs::metadata(&ping2).unwrap().uid(), MAPPED_ROOT);
        assert_eq!(
            capability(&ping2),
            Some(cap_v2(CAP_NET_RAW)),
            "{}: v2 written back unchanged (and not turned into v3)",
            ping2.display()
        );
        let both = place.join("bin/both");
        let meta = std::fs::metadata(&both).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o4755, "setuid restored too");
        assert_eq!(capability(&both), Some(cap_v2(CAP_NET_RAW)));
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

    let layer = in_layer(&lamina, "bin/ping3").join("../..");
    let meta = std::fs::metadata(layer.join("bin/ping3")).unwrap();
    assert_eq!(meta.uid(), 0, "idmapped: nothing is chowned on disk");
    assert_eq!(
        capability(&layer.join("bin/ping3")),
        Some(cap_v3(CAP_NET_RAW, 0))
    );
    assert_eq!(
        capability(&layer.join("bin/ping2")),
        Some(cap_v2(CAP_NET_RAW))
    );
    // Through the idmapped rootfs the files belong to the mapped root and still carry
    // their capability.
    for name in ["bin/ping3", "bin/ping2", "bin/both"] {
        let path = rootfs.join(name);
        assert_eq!(
            std::fs::metadata(&path).unwrap().uid(),
            MAPPED_ROOT,
            "{name}"
        );
        let cap = capability(&path).unwrap_or_else(|| panic!("{name} lost its capability"));
        assert_eq!(cap[4..8], CAP_NET_RAW.to_le_bytes(), "{name}: {cap:?}");
    }
    lamina.delete_and_assert_gone("capable", "idmapped store");
}
