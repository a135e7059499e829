//! The overlay options a caller that mounts for itself (containerd) is handed must fit
//! one page of mount(2) options, in each form containerd mounts them.

use lamina_store::Store;

use crate::RootfsError;

/// One page: what mount(2) takes as its options, and so what a caller mounting the
/// overlay from an option string can pass.
const PAGE: usize = 4096;

/// `spec`'s options for a caller that mounts the overlay itself, each layer named by its
/// short link (`l/<name>`, see `lamina-store/src/layer_links.rs`). containerd mounts
/// lowerdirs that share a directory from inside it, by their bare names, and the options
/// must then fit one page. It mounts the same answer read-only too (a diff, an image's
/// user lookup): the upper joins the front of `lowerdir` and `workdir` goes, so the
/// lowers share only the store's root and each costs two bytes more. A chain too deep
/// for either form is refused here, naming its depth, rather than handed to a mount that
/// fails with "mount options is too long".
pub(crate) fn options_for_one_page(
    store: &Store,
    mut spec: lamina_sys::OverlaySpec,
) -> Result<Vec<String>, RootfsError> {
    spec.lowers = spec
        .lowers
        .iter()
        .map(|lower| store.short_lower(lower))
        .collect::<Result<_, _>>()?;
    let options = spec.option_strings();
    let longest =
        compacted_read_write(&spec, &options).max(compacted_read_only(store, &spec, &options));
    if longest > PAGE {
        return Err(RootfsError::Refused(format!(
            "an overlay of {} layers cannot be mounted from one page of mount options ({longest} bytes even with short layer names); images this deep need a flattened lower",
            spec.lowers.len()
        )));
    }
    Ok(options)
}

/// The options' size as containerd passes them to mount(2), each counted with its comma:
/// `lowerdir` as bare names inside `l/`.
fn compacted_read_write(spec: &lamina_sys::OverlaySpec, options: &[String]) -> usize {
    let names: usize = spec.lowers.iter().map(|l| name_len(l) + 1).sum();
    options
        .iter()
        .map(|o| match o.starts_with("lowerdir=") {
            true => "lowerdir=".len() + names,
            false => o.len() + 1,
        })
        .sum()
}

/// The same for containerd's read-only form: `lowerdir=<upper>:<lowers>` relative to the
/// store's root (`l/<name>`), no `upperdir` or `workdir`, plus `ro`.
fn compacted_read_only(store: &Store, spec: &lamina_sys::OverlaySpec, options: &[String]) -> usize {
    let relative = |p: &std::path::Path| {
        p.strip_prefix(store.root())
            .map_or(p.as_os_str().len(), |r| r.as_os_str().len())
    };
    let upper = spec.upper.as_deref().map_or(0, |u| relative(u) + 1);
    let lowers: usize = spec.lowers.iter().map(|l| relative(l) + 1).sum();
    let rest: usize = options
        .iter()
        .filter(|o| {
            !["lowerdir=", "upperdir=", "workdir="]
                .iter()
                .any(|k| o.starts_with(k))
        })
        .map(|o| o.len() + 1)
        .sum();
    "lowerdir=".len() + upper + lowers + rest + "ro,".len()
}

fn name_len(path: &std::path::Path) -> usize {
    path.file_name().map_or(0, |n| n.len())
}
