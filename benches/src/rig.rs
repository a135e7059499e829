//! One benchmark store on a filesystem of its own: a loop-backed ext4 or xfs with direct
//! I/O (so a sync costs what it costs on a disk), created for a scenario and removed —
//! every mount beneath it included — when the rig is dropped, even on panic.

use std::fs;
use std::time::{Duration, Instant};

use lamina_image::Image;
use lamina_integration::{FsKind, ScratchFs};
use lamina_mount::{CreateOptions, Created, Deleted, Strategies};
use lamina_store::Store;
use lamina_sys::RealMounter;

#[derive(Debug)]
pub struct Rig {
    pub kind: FsKind,
    pub store: Store,
    pub mounter: RealMounter,
    // Dropped last: unmounts everything the scenario left and frees the loop device.
    pub fs: ScratchFs,
}

impl Rig {
    pub fn new(kind: FsKind, size_mb: u64) -> Self {
        // xfs refuses filesystems under 300 MB.
        Self::on(kind, ScratchFs::loop_backed(kind, size_mb.max(512), true))
    }

    /// A btrfs rig with quotas enabled: where `isolated-quota` puts each upper in a
    /// subvolume with a qgroup limit.
    pub fn btrfs_with_quotas(size_mb: u64) -> Self {
        let fs = ScratchFs::loop_backed(FsKind::Btrfs, size_mb.max(512), true);
        let out = std::process::Command::new("btrfs")
            .args(["quota", "enable"])
            .arg(fs.path())
            .output()
            .expect("btrfs-progs");
        assert!(out.status.success(), "btrfs quota enable: {out:?}");
        Self::on(FsKind::Btrfs, fs)
    }

    /// A rig whose store shares file content across images (`init-store
    /// --share-file-content`).
    pub fn sharing_file_content(kind: FsKind, size_mb: u64) -> Self {
        let properties = lamina_store::StoreProperties {
            shared_file_content: true,
            ..Default::default()
        };
        Self::with(
            kind,
            ScratchFs::loop_backed(kind, size_mb.max(512), true),
            &properties,
        )
    }

    /// A rig whose store keeps its layers' data in `objects/` (`init-store --layer-data
    /// objects`).
    pub fn layer_data_in_objects(kind: FsKind, size_mb: u64) -> Self {
        let properties = lamina_store::StoreProperties {
            layer_data_in_objects: true,
            ..Default::default()
        };
        Self::with(
            kind,
            ScratchFs::loop_backed(kind, size_mb.max(512), true),
            &properties,
        )
    }

    fn on(kind: FsKind, fs: ScratchFs) -> Self {
        Self::with(kind, fs, &lamina_store::StoreProperties::default())
    }

    fn with(kind: FsKind, fs: ScratchFs, properties: &lamina_store::StoreProperties) -> Self {
        let store =
            Store::init_with(&fs.path().join("store"), properties).expect("initialising the store");
        let mounter = RealMounter::new();
        // The probe runs once per store and boot, then is read from run/probe.json; do it
        // now so no scenario's first create pays it.
        lamina_mount::probe::probe(&store, &mounter, false).expect("probing overlay support");
        Self {
            kind,
            store,
            mounter,
            fs,
        }
    }

    /// A directory on the rig's filesystem, outside the store, for images and scratch.
    pub fn scratch(&self, name: &str) -> std::path::PathBuf {
        let dir = self.fs.path().join(name);
        fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    /// Resolves `reference` and imports its layers, so creates measure a warm image.
    pub fn warm(&self, reference: &str) -> Image {
        let image = crate::images::resolve(reference);
        self.store
            .import(&image)
            .expect("importing a benchmark image");
        image
    }

    pub fn create(&self, image: &Image, id: &str, strategies: &str, read_only: bool) -> Created {
        self.create_with(image, id, &options(strategies, read_only))
    }

    /// Creates with options beyond a strategy list (disk limits, overlay options).
    pub fn create_with(&self, image: &Image, id: &str, options: &CreateOptions) -> Created {
        lamina_mount::create(&self.store, &self.mounter, image, id, options)
            .unwrap_or_else(|e| panic!("create {id} ({}): {e}", options.strategies))
    }

    /// Times one create.
    pub fn timed_create(
        &self,
        image: &Image,
        id: &str,
        strategies: &str,
        read_only: bool,
    ) -> Duration {
        let start = Instant::now();
        self.create(image, id, strategies, read_only);
        start.elapsed()
    }

    pub fn delete(&self, id: &str) -> Deleted {
        lamina_mount::delete(&self.store, &self.mounter, id)
            .unwrap_or_else(|e| panic!("delete {id}: {e}"))
    }

    /// Times one delete as its caller sees it (a deferred delete returns before the
    /// reaper has done the work).
    pub fn timed_delete(&self, id: &str) -> Duration {
        let start = Instant::now();
        self.delete(id);
        start.elapsed()
    }

    /// Runs the reaper until `trash/` is empty.
    pub fn reap_all(&self) {
        loop {
            lamina_mount::reap(&self.store, &self.mounter).expect("reaping");
            if self
                .store
                .trash_entries()
                .expect("listing trash")
                .is_empty()
            {
                return;
            }
        }
    }

    /// Deletes every container and reaps, leaving the store as it was after `warm`.
    pub fn delete_all(&self) {
        for record in self.store.containers().expect("listing containers") {
            self.delete(&record.id);
        }
        self.reap_all();
    }

    /// Whether nothing of any container is left: no container, nothing in trash.
    pub fn no_trace(&self) -> bool {
        self.store.containers().is_ok_and(|c| c.is_empty())
            && self.store.trash_entries().is_ok_and(|t| t.is_empty())
    }

    pub fn fs_name(&self) -> &'static str {
        self.kind.name()
    }
}

/// Create options for the strategy list `strategies`.
pub fn options(strategies: &str, read_only: bool) -> CreateOptions {
    CreateOptions {
        strategies: Strategies::parse(strategies).expect("strategy list"),
        read_only,
        ..CreateOptions::default()
    }
}
