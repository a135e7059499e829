//! The strategy conformance suite (crates/lamina-conformance) on the real kernel: the
//! same table, pool cycle and recovery cases the fake runs, on a store on a loop-backed
//! ext4 and on a loop-backed xfs, and the rows only a quota store serves on a
//! loop-backed btrfs with quotas. Faults are injected in front of the real mounter (the
//! failing call never reaches the kernel; every rollback does); the immutable-file case
//! runs here only.

use lamina_conformance::{RealRig, run};
use lamina_integration::scratch::mounts_under;
use lamina_integration::{FsKind, ScratchFs, require_root};
use lamina_store::StoreProperties;

/// One filesystem at a time. Two rigs in one process interfere: a child another thread
/// spawns (mkfs, losetup, mount) inherits, until it execs, the descriptor of a slot lock
/// the other rig just released, and that rig's `pool drain` then skips the slot as busy.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn conformance_on(kind: FsKind) {
    conformance_in(kind, || ScratchFs::loop_backed(kind, 1024, false));
}

fn conformance_in(kind: FsKind, fs: impl FnOnce() -> ScratchFs) {
    conformance_with(kind, fs, &StoreProperties::default());
}

/// The suite on the filesystem `fs` makes, made once the lock is held: its mkfs, losetup
/// and mount children would otherwise inherit, until they exec, descriptors another
/// rig's reaper holds inside a container's mounts, and that unmount then fails busy.
fn conformance_with(kind: FsKind, fs: impl FnOnce() -> ScratchFs, properties: &StoreProperties) {
    require_root();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let fs = fs();
    // Dropped in reverse order: the rig (store, mounter), then the filesystem, which
    // unmounts whatever a failing row left beneath it.
    let report = {
        let rig = RealRig::with_properties(kind.name(), fs.path(), properties);
        run(&rig)
    };
    let left = mounts_under(fs.path());
    assert_eq!(
        left.len(),
        1,
        "only the scratch filesystem is mounted: {left:?}"
    );
    report.assert_passed();
}

#[test]
fn every_strategy_passes_the_conformance_suite_on_ext4() {
    conformance_on(FsKind::Ext4);
}

#[test]
fn every_strategy_passes_the_conformance_suite_on_xfs() {
    conformance_on(FsKind::Xfs);
}

/// Every strategy on a store whose layers keep their data in objects (docs/store.md):
/// each layer file a stub that overlay reads through `objects/`.
#[test]
fn every_strategy_passes_the_conformance_suite_on_a_store_of_object_layers() {
    let properties = StoreProperties {
        layer_data_in_objects: true,
        ..StoreProperties::default()
    };
    conformance_with(
        FsKind::Ext4,
        || ScratchFs::loop_backed(FsKind::Ext4, 1024, false),
        &properties,
    );
}

/// The rows only a store on btrfs with quotas serves (`isolated-quota`), on one.
#[test]
fn the_quota_rows_pass_the_conformance_suite_on_btrfs_with_quotas() {
    require_root();
    conformance_in(FsKind::Btrfs, || ScratchFs::btrfs_with_quotas(1024));
}
