//! runc boots rootfs lamina creates from every source form, on a loop-backed ext4 store.

use lamina_integration::proof::{EXPECTED as MERGED, SCRIPT as PROOF};
use lamina_integration::scratch::mounts_under;
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root, sample_image};

fn unique(name: &str) -> String {
    format!("lamina-{name}-{}", std::process::id())
}

#[test]
fn runc_boots_every_image_form_and_delete_leaves_nothing() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let [oci, oci_archive, docker_archive, rootfs_tar] = files.references();

    for (i, image) in [&oci, &oci_archive, &docker_archive]
        .into_iter()
        .enumerate()
    {
        let id = format!("c{i}");
        let rootfs = lamina.create(image, &id);
        let bundle = Bundle::new(&rootfs, false);
        let out = bundle.run(&unique(&id), PROOF);
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, MERGED),
            "{image}: {}",
            out.stderr
        );
        drop(bundle);
        lamina.delete_and_assert_gone(&id, image);
    }

    // The plain rootfs tar is the base layer alone: nothing whited out, nothing opaque.
    let rootfs = lamina.create(&rootfs_tar, "plain");
    let bundle = Bundle::new(&rootfs, false);
    let out = bundle.run(
        &unique("plain"),
        "cat /old/gone.txt; ls /opq; test ! -e /top.txt && echo no-top",
    );
    assert_eq!(
        out.stdout, "the top layer whites this out\nbase-only.txt\nno-top\n",
        "{}",
        out.stderr
    );
    drop(bundle);
    let path = rootfs.to_str().unwrap();
    assert_eq!(
        lamina.run(&["delete", path]).code,
        0,
        "delete by rootfs path"
    );
    // Deferred by default: wait for the reaper, then nothing may be left.
    lamina.run(&["reap"]).json();
    assert!(mounts_under(&lamina.store).is_empty());
    assert_eq!(lamina.run(&["list"]).stdout, "Store empty");
}

#[test]
fn writes_in_one_container_are_invisible_in_another() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = &files.references()[0];
    let a = lamina.create(image, "a");
    let b = lamina.create(image, "b");

    let bundle_a = Bundle::new(&a, false);
    let out = bundle_a.run(&unique("iso-a"), "echo mine > /written.txt && rm /top.txt && echo changed > /old/kept.txt && cat /written.txt");
    assert_eq!(out.stdout, "mine\n", "{}", out.stderr);
    let bundle_b = Bundle::new(&b, false);
    let out = bundle_b.run(
        &unique("iso-b"),
        "test ! -e /written.txt && echo isolated; cat /top.txt /old/kept.txt",
    );
    assert_eq!(
        out.stdout, "isolated\nfrom the top layer\nkept\n",
        "{}",
        out.stderr
    );

    // A's writes went to its upper dir only; the shared layers are untouched.
    assert_eq!(
        std::fs::read_to_string(lamina.store.join("images/a/upper/written.txt")).unwrap(),
        "mine\n"
    );
    let layers = std::fs::read_dir(lamina.store.join("layers")).unwrap();
    for layer in layers {
        let diff = layer.unwrap().path().join("diff");
        assert!(!diff.join("written.txt").exists());
        if diff.join("old/kept.txt").exists() {
            assert_eq!(
                std::fs::read_to_string(diff.join("old/kept.txt")).unwrap(),
                "kept\n"
            );
        }
    }
    drop((bundle_a, bundle_b));
    for id in ["a", "b"] {
        lamina.delete_and_assert_gone(id, id);
    }
}
