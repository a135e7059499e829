//! The kernel probe, for real (needs root), on a tmpfs store.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use lamina_integration::scratch::mounts_under;
use lamina_integration::{ScratchFs, require_root};
use lamina_mount::probe::{cache_path, probe};
use lamina_store::Store;
use lamina_sys::RealMounter;

#[test]
fn probe_finds_what_this_kernel_supports_and_caches_it_per_kernel() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let store = Store::init(&fs.path().join("store")).unwrap();
    let mounter = RealMounter::new();

    let first = probe(&store, &mounter, false).unwrap();
    // Linux 6.18 (docs: shared kernel facts): every feature present, overlay's 500-layer limit.
    assert!(first.new_mount_api && first.lowerdir_plus, "{first:?}");
    assert!(
        first.metacopy && first.volatile && first.redirect_dir && first.idmapped_layers,
        "{first:?}"
    );
    assert_eq!(first.max_lower_layers, 500);
    assert!(mounts_under(store.root()).is_empty(), "probe left a mount");
    assert_eq!(
        std::fs::read_dir(store.layout().tmp()).unwrap().count(),
        0,
        "probe left scratch dirs"
    );

    // Same boot and kernel: the cache answers (a doctored value proves it was not re-probed).
    let cache = cache_path(&store);
    let mut cached: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    cached["max_lower_layers"] = 7.into();
    std::fs::write(&cache, serde_json::to_vec(&cached).unwrap()).unwrap();
    assert_eq!(probe(&store, &mounter, false).unwrap().max_lower_layers, 7);
    assert_eq!(
        probe(&store, &mounter, true).unwrap().max_lower_layers,
        500,
        "--refresh re-probes"
    );

    // Another kernel (or boot) in the cache: re-probed.
    cached["max_lower_layers"] = 7.into();
    cached["kernel"] = "4.14.60-old".into();
    std::fs::write(&cache, serde_json::to_vec(&cached).unwrap()).unwrap();
    assert_eq!(
        probe(&store, &mounter, false).unwrap().max_lower_layers,
        500
    );
}
