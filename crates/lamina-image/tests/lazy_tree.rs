//! A layer's index as the tree changes it makes, by the tar unpacker's rules: the same
//! sample layer read from its eStargz TOC and its zstd:chunked manifest gives the same
//! changes, and what the unpacker would refuse refuses the index.

#![allow(clippy::unwrap_used)]

use lamina_image::Digest;
use lamina_image::lazy::estargz::{FOOTER_SIZE, Toc, read_toc, toc_offset};
use lamina_image::lazy::tree::{Change, LayerTree, NodeKind};
use lamina_image::lazy::zstd_chunked::{
    MANIFEST_CHECKSUM_ANNOTATION, MANIFEST_POSITION_ANNOTATION, ManifestPosition, read_manifest,
};
use lamina_sample::LayerBuilder;

fn sample_tar() -> Vec<u8> {
    LayerBuilder::new()
        .dir("etc", 0o755)
        .and_then(|b| b.file("etc/small", 0o4644, b"small\n"))
        .and_then(|b| {
            b.file_with_xattrs(
                "x",
                0o644,
                b"x",
                &[("user.k", b"v"), ("trusted.overlay.redirect", b"/etc")],
            )
        })
        .and_then(|b| b.symlink("link", "etc/small"))
        .and_then(|b| b.hardlink("hard", "etc/small"))
        .and_then(|b| b.whiteout("etc/gone"))
        .and_then(|b| b.dir("opq", 0o755))
        .and_then(|b| b.opaque("opq"))
        .and_then(LayerBuilder::finish)
        .unwrap()
}

fn estargz_toc(tar: &[u8]) -> (u64, Toc) {
    let layer = lamina_sample::estargz::estargz(tar, 4096).unwrap();
    let len = layer.blob.len() as u64;
    let offset = toc_offset(&layer.blob[(len - FOOTER_SIZE) as usize..], len).unwrap();
    let member = &layer.blob[offset as usize..(len - FOOTER_SIZE) as usize];
    (offset, read_toc(member, &layer.toc_digest).unwrap())
}

fn estargz_tree(tar: &[u8]) -> LayerTree {
    let (offset, toc) = estargz_toc(tar);
    toc.tree(offset).unwrap()
}

fn zstd_tree(tar: &[u8]) -> LayerTree {
    let layer = lamina_sample::zstd_chunked::zstd_chunked(tar, 4096).unwrap();
    let position = ManifestPosition::parse(
        &layer.annotations[MANIFEST_POSITION_ANNOTATION],
        layer.blob.len() as u64,
    )
    .unwrap();
    let compressed =
        &layer.blob[position.offset as usize..(position.offset + position.length) as usize];
    let checksum = Digest::parse(&layer.annotations[MANIFEST_CHECKSUM_ANNOTATION]).unwrap();
    read_manifest(compressed, &position, &checksum)
        .unwrap()
        .tree(position.offset)
        .unwrap()
}

fn shown(tree: &LayerTree) -> Vec<String> {
    let path = |p: &lamina_unpack::EntryPath| {
        String::from_utf8_lossy(&lamina_unpack::EntryPath::join(p.components())).into_owned()
    };
    tree.changes
        .iter()
        .map(|c| match c {
            Change::Node(n) => {
                let kind = match &n.kind {
                    NodeKind::File(i) => format!("file {} bytes", tree.files[*i].size),
                    NodeKind::Hardlink(target) => format!("hardlink to {}", path(target)),
                    NodeKind::Symlink(target) => {
                        format!("symlink to {}", String::from_utf8_lossy(target))
                    }
                    other => format!("{other:?}"),
                };
                let xattrs: Vec<String> = n
                    .xattrs
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{}={}",
                            String::from_utf8_lossy(k),
                            String::from_utf8_lossy(v)
                        )
                    })
                    .collect();
                format!(
                    "{} {kind} {:o} {}:{} {xattrs:?}",
                    path(&n.path),
                    n.mode,
                    n.uid,
                    n.gid
                )
            }
            Change::Whiteout(p) => format!("whiteout {}", path(p)),
            Change::Opaque(p) => format!("opaque {}", path(p)),
        })
        .collect()
}

#[test]
fn both_indexes_of_a_layer_give_the_changes_its_tar_makes() {
    let tar = sample_tar();
    let from_estargz = shown(&estargz_tree(&tar));
    assert_eq!(
        from_estargz,
        [
            "etc Dir 755 0:0 []",
            "etc/small file 6 bytes 4644 0:0 []",
            "x file 1 bytes 644 0:0 [\"user.k=v\"]",
            "link symlink to etc/small 777 0:0 []",
            "hard hardlink to etc/small 644 0:0 []",
            "whiteout etc/gone",
            "opq Dir 755 0:0 []",
            "opaque opq",
        ],
        "overlay's own xattrs dropped, as on import"
    );
    assert_eq!(shown(&zstd_tree(&tar)), from_estargz);
}

#[test]
fn what_the_unpacker_refuses_refuses_the_index() {
    let (offset, toc) = estargz_toc(&sample_tar());
    let changed = |f: &dyn Fn(&mut Toc)| {
        let mut toc = toc.clone();
        f(&mut toc);
        toc.tree(offset)
    };
    let named = |name: &'static str| {
        move |toc: &mut Toc| {
            toc.entries
                .iter_mut()
                .find(|e| e.name == "link")
                .unwrap()
                .name = name.into();
        }
    };
    for name in ["../escape", "/etc/abs", "etc/../../x", "a\0b"] {
        assert!(changed(&named(name)).is_err(), "{name:?}");
    }
    assert!(
        changed(&named("./etc/")).is_err(),
        "a name given twice once cleaned"
    );
    assert!(
        changed(&named(".wh..wh..opq")).is_err(),
        "opaque at the layer root"
    );
    assert!(
        changed(&|toc: &mut Toc| {
            toc.entries
                .iter_mut()
                .find(|e| e.name == "hard")
                .unwrap()
                .link_name = "nowhere".into();
        })
        .is_err(),
        "a hardlink to no file of the layer"
    );
    // One name is one thing in a layer, as on the tar path.
    let renamed = |from: &'static str, to: &'static str| {
        move |toc: &mut Toc| {
            toc.entries
                .iter_mut()
                .find(|e| e.name == from)
                .unwrap()
                .name = to.into();
        }
    };
    assert!(
        changed(&renamed("etc/.wh.gone", ".wh.x")).is_err(),
        "a whiteout of this layer's x"
    );
    assert!(
        changed(&renamed("etc/.wh.gone", ".wh.etc")).is_err(),
        "a whiteout of a directory this layer fills"
    );
    assert!(
        changed(&renamed("opq", "x/inside")).is_err(),
        "an entry inside a file"
    );
    assert!(
        changed(&renamed("link", "etc/small/inside")).is_err(),
        "an entry inside a file, deeper"
    );
    assert!(
        changed(&renamed("x", "etc")).is_err(),
        "a file where this layer has a directory"
    );
    let deep: &'static str = Box::leak("d/".repeat(129).into_boxed_str());
    assert!(changed(&renamed("link", deep)).is_err(), "deeper than 128");
    for target in ["", "a\0b"] {
        assert!(
            changed(&|toc: &mut Toc| {
                toc.entries
                    .iter_mut()
                    .find(|e| e.name == "link")
                    .unwrap()
                    .link_name = target.into();
            })
            .is_err(),
            "a symlink target {target:?}"
        );
    }
    assert!(
        changed(&|toc: &mut Toc| {
            let e = toc.entries.iter_mut().find(|e| e.name == "link").unwrap();
            e.kind = "char".into();
            e.dev_major = 1 << 12;
        })
        .is_err(),
        "a device number past Linux's"
    );
    assert!(
        changed(&|toc: &mut Toc| {
            toc.entries
                .iter_mut()
                .find(|e| e.name == "etc")
                .unwrap()
                .uid = u32::MAX;
        })
        .is_err(),
        "an owner of -1"
    );
    assert!(
        changed(&|toc: &mut Toc| {
            let e = toc.entries.iter_mut().find(|e| e.name == "x").unwrap();
            e.xattrs.insert("user.bad".into(), "not base64!".into());
        })
        .is_err(),
        "an xattr value that is not base64"
    );
}
