//! `container_record`: a container's `container.json` is input too (torn by a crash,
//! edited by hand), and lamina unmounts, binds and removes the paths it names. Property:
//! reading any bytes as a record never panics or hangs, and a record that is accepted names
//! its own container and only paths inside the store, with no `..`.

use std::path::{Component, Path};

use lamina_store::Store;

const ID: &str = "fuzzed";

/// Returns whether the input was accepted as a record.
pub fn container_record(data: &[u8]) -> bool {
    let scratch = crate::scratch::dir();
    let store = Store::init(&scratch.path().join("store")).expect("making a store");
    let dir = store.layout().container(ID);
    std::fs::create_dir(&dir).expect("making the container directory");
    // As a symlink's target where one can hold it (a first record's form), else a file.
    let record = dir.join("container.json");
    let as_symlink = !data.is_empty() && !data.contains(&0) && data.len() <= 4095;
    if !as_symlink
        || std::os::unix::fs::symlink(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(data),
            &record,
        )
        .is_err()
    {
        std::fs::write(&record, data).expect("writing the record");
    }

    let scan = lamina_mount::record::scan(&store).expect("scanning never fails on a bad record");
    let Ok(container) = lamina_mount::record::read(&store, ID) else {
        assert!(
            scan.containers.is_empty(),
            "a record refused alone was listed"
        );
        return false;
    };
    assert_eq!(
        container.id(),
        ID,
        "an accepted record names its own container"
    );
    let rootfs = &container.rootfs;
    for path in rootfs.lease.iter().chain(rootfs.bind_source.iter()) {
        assert!(
            inside(path, store.root()),
            "{} is outside the store",
            path.display()
        );
    }
    true
}

fn inside(path: &Path, root: &Path) -> bool {
    path.starts_with(root)
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}
