//! The kernel probe, for real (needs root), on a loop-backed ext4 store.

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

/// A daemon's pool refill, a Prepare and a composefs build can all find the cache missing
/// at once: in one process they share the scratch directory's and temporary file's names,
/// so they probe one at a time and every one gets the kernel's real answer.
#[test]
fn probes_of_one_process_at_once_all_get_the_whole_answer() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let store = Store::init(&fs.path().join("store")).unwrap();
    let mounter = RealMounter::new();
    let start = std::sync::Barrier::new(4);
    let answers: Vec<_> = std::thread::scope(|s| {
        let probing: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    probe(&store, &mounter, false)
                })
            })
            .collect();
        probing.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for answer in &answers {
        let answer = answer.as_ref().unwrap();
        assert!(answer.metacopy && answer.volatile, "{answer:?}");
        assert_eq!(answer.max_lower_layers, 500, "{answer:?}");
        assert_eq!(answer, answers[0].as_ref().unwrap());
    }
    assert!(mounts_under(store.root()).is_empty(), "probe left a mount");
    assert_eq!(
        std::fs::read_dir(store.layout().tmp()).unwrap().count(),
        0,
        "probe left scratch dirs"
    );
}
