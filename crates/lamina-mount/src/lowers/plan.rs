//! Mount plans: which overlay a container (or a shared image mount) gets. `classic` is
//! GrootFS's fresh read-write overlay per container, the baseline every other strategy
//! is measured against; the option strategies add overlay options to it.

use std::path::{Path, PathBuf};

use lamina_image::Digest;
use lamina_store::{ContainerDirs, IdMap, Store};
use lamina_sys::{OverlaySpec, UserNsMaps};

use crate::Flavour;

/// Layer dirs top-most first, as overlay orders lowers.
pub fn lowers(store: &Store, chain_ids: &[Digest]) -> Vec<PathBuf> {
    chain_ids
        .iter()
        .rev()
        .map(|c| store.layout().layer_diff(c))
        .collect()
}

/// The classic plan: every layer as a lower, the container's own upper and work dirs.
pub fn classic(store: &Store, chain_ids: &[Digest], dirs: &ContainerDirs) -> OverlaySpec {
    let properties = store.properties();
    let mut spec = OverlaySpec {
        lowers: lowers(store, chain_ids),
        upper: Some(dirs.upper.clone()),
        work: Some(dirs.work.clone()),
        lower_idmap: lower_idmap(store),
        upper_owner: properties.mapped().then(|| {
            let map = &properties.id_map;
            (map.host_uid(0), map.host_gid(0))
        }),
        ..OverlaySpec::default()
    };
    object_data(&mut spec, store);
    spec
}

/// In a store whose layers keep their data in `objects/`, the layers' stubs read it
/// through `objects/` as a data-only lower, which overlay follows only with metacopy on.
fn object_data(spec: &mut OverlaySpec, store: &Store) {
    if store.properties().layer_data_in_objects {
        spec.data_lowers = vec![store.layout().objects()];
        let metacopy = METACOPY_OPTIONS.map(|(k, v)| (k.to_string(), Some(v.to_string())));
        add_options(spec, metacopy);
    }
}

/// What overlay needs to follow a metacopy redirect (metacopy needs redirect_dir; said
/// rather than left to the kernel's implication).
const METACOPY_OPTIONS: [(&str, &str); 2] = [("redirect_dir", "on"), ("metacopy", "on")];

/// Appends each of `options` `spec` does not have yet.
fn add_options(
    spec: &mut OverlaySpec,
    options: impl IntoIterator<Item = (String, Option<String>)>,
) {
    for (key, value) in options {
        if !spec.options.iter().any(|(k, _)| *k == key) {
            spec.options.push((key, value));
        }
    }
}

/// In a store that idmaps its layers, the user namespace maps to mount them with.
pub fn lower_idmap(store: &Store) -> Option<UserNsMaps> {
    let properties = store.properties();
    properties
        .idmaps_layers()
        .then(|| userns_maps(&properties.id_map))
}

/// A store's mappings in the form a user namespace is given them.
pub fn userns_maps(map: &IdMap) -> UserNsMaps {
    UserNsMaps {
        uid_map: map.uid_map_text(),
        gid_map: map.gid_map_text(),
    }
}

/// Gives `spec` a container's own idmap, if it has one: every lower mounted idmapped
/// with its maps, and the upper's root owned by its mapped root, as a uid-mapped store
/// does for all of its containers.
pub fn own_idmap(spec: &mut OverlaySpec, map: Option<&IdMap>) {
    if let Some(map) = map {
        spec.lower_idmap = Some(userns_maps(map));
        spec.upper_owner = Some((map.host_uid(0), map.host_gid(0)));
    }
}

/// The classic plan with the options `flavour` adds.
pub fn read_write(
    store: &Store,
    chain_ids: &[Digest],
    dirs: &ContainerDirs,
    flavour: Flavour,
) -> OverlaySpec {
    let mut spec = classic(store, chain_ids, dirs);
    if flavour.composefs {
        composefs_lowers(&mut spec, store, chain_ids);
    }
    let object_options = std::mem::replace(&mut spec.options, flavour.overlay_options());
    add_options(&mut spec, object_options);
    if flavour.composefs && composefs_sealed(store, chain_ids) {
        spec.options.push(("verity".into(), Some("require".into())));
    }
    spec
}

/// Whether the image's metadata image and objects are sealed with fs-verity (the
/// build marks them so where the store's filesystem can): overlay then reads a file's
/// data only from an object whose sealed digest is the one the image names.
fn composefs_sealed(store: &Store, chain_ids: &[Digest]) -> bool {
    chain_ids.last().is_some_and(|top| {
        crate::lowers::composefs::verity_path(&crate::lowers::composefs::image_path(store, top))
            .is_file()
    })
}

/// The image's mounted composefs metadata image as the only lower, the store's objects
/// as a data-only lower, instead of the layer directories. Whoever mounts the overlay
/// mounts the image first (`composefs::mounted`); it is never removed while a container
/// may use it.
fn composefs_lowers(spec: &mut OverlaySpec, store: &Store, chain_ids: &[Digest]) {
    spec.lowers = chain_ids
        .last()
        .map(|top| {
            crate::lowers::composefs::mount_path(store, top).join(crate::lowers::composefs::ROOTFS)
        })
        .into_iter()
        .collect();
    spec.lower_idmap = None;
    spec.data_lowers = vec![store.layout().objects()];
}

/// A read-only overlay of the layers alone. Overlay needs two lowers when there is no
/// upper, so a single-layer image gets `empty` (an empty directory) beneath it.
pub fn read_only(store: &Store, chain_ids: &[Digest], empty: &Path) -> OverlaySpec {
    let mut lowers = lowers(store, chain_ids);
    if lowers.len() == 1 {
        lowers.push(empty.to_path_buf());
    }
    let mut spec = OverlaySpec {
        lowers,
        read_only: true,
        lower_idmap: lower_idmap(store),
        ..OverlaySpec::default()
    };
    object_data(&mut spec, store);
    spec
}
