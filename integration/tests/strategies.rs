//! One conformance suite, run under every strategy combination: runc boots the merged
//! image, writes stay in the container, delete leaves nothing, and each strategy's mount
//! really carries what it promises.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use lamina_integration::proof::{EXPECTED, SCRIPT, super_options};
use lamina_integration::scratch::mounts_under;
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root, sample_image};

const COMBINATIONS: &[&str] = &["classic", "metacopy", "volatile", "metacopy,volatile"];

fn has_xattr(path: &Path, name: &str) -> bool {
    rustix::fs::lgetxattr(path, name, &mut [0u8; 256]).is_ok()
}

#[test]
fn every_strategy_boots_in_runc_and_keeps_its_promises() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = &files.references()[0];

    for (i, list) in COMBINATIONS.iter().enumerate() {
        let id = format!("s{i}");
        let rootfs = lamina.create_with(&["--strategy", list], image, &id);
        let options =
            super_options(&rootfs).unwrap_or_else(|| panic!("{list}: rootfs not mounted"));
        assert_eq!(
            options.contains("metacopy=on"),
            list.contains("metacopy"),
            "{list}: {options}"
        );
        assert_eq!(
            options.contains("volatile"),
            list.contains("volatile"),
            "{list}: {options}"
        );
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(lamina.store.join("images").join(&id).join("container.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(record["strategy"], *list);

        let bundle = Bundle::new(&rootfs, false);
        let run_id = format!("lamina-strategy-{i}-{}", std::process::id());
        let out = bundle.run(
            &run_id,
            &format!("{SCRIPT}; /bin/busybox chmod 600 /etc/hosts && echo written > /new.txt"),
        );
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (0, EXPECTED),
            "{list}: {}",
            out.stderr
        );
        drop(bundle);

        // chmod copied /etc/hosts up: with metacopy, metadata only; without, data too.
        let upper = lamina.store.join("images").join(&id).join("upper");
        let copied = upper.join("etc/hosts");
        assert_eq!(
            has_xattr(&copied, "trusted.overlay.metacopy"),
            list.contains("metacopy"),
            "{list}"
        );
        assert_eq!(
            std::fs::read_to_string(upper.join("new.txt")).unwrap(),
            "written\n"
        );

        lamina.delete_and_assert_gone(&id, list);
    }
}

#[test]
fn ephemeral_means_volatile_and_unbuilt_or_unknown_strategies_are_refused() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = &files.references()[0];

    let rootfs = lamina.create_with(&["--ephemeral"], image, "eph");
    assert!(super_options(&rootfs).unwrap().contains("volatile"));
    lamina.delete_and_assert_gone("eph", "ephemeral");

    for (list, expect) in [
        ("pooled", "not implemented yet"),
        ("fast", "unknown strategy `fast`"),
    ] {
        let out = lamina.run(&["create", "--strategy", list, image, "x"]);
        assert_eq!(out.code, 1, "{out:?}");
        assert!(out.stdout.contains(expect), "{out:?}");
    }
    assert!(!lamina.store.join("images/x").exists());
    assert!(mounts_under(&lamina.store).is_empty());
}
