//! A container record names paths that lamina later unmounts, binds and removes (a
//! shared-mount lease, the source of a read-only bind). A record is input like any other
//! — torn by a crash, edited by hand — so a path in it is used only if it has the exact
//! shape lamina writes, inside this store: [`Layout::names`] is that check, which
//! lamina-mount applies to its part of the record (anything else makes the record bad,
//! [`crate::StoreError::BadRecord`]).

use std::path::{Component, Path};

use crate::Layout;

/// Largest `container.json` read: real ones are a few KiB.
pub const MAX_RECORD_BYTES: u64 = 1024 * 1024;

impl Layout {
    /// Whether `path` is this store's root followed by one of `shapes` (`*`: any one
    /// plain name): how a path read from a record is checked before lamina unmounts,
    /// binds or removes it.
    pub fn names(&self, path: &Path, shapes: &[&[&str]]) -> bool {
        has_shape(path, self, shapes)
    }
}

/// Whether `path` is this store's root followed by one of `shapes` (`*`: any one plain
/// name). The root is compared as written, or else as both resolve: a store reached
/// through a symlink names the same files.
fn has_shape(path: &Path, layout: &Layout, shapes: &[&[&str]]) -> bool {
    let parts: Vec<Component<'_>> = path.components().collect();
    shapes.iter().any(|shape| {
        let Some(split) = parts.len().checked_sub(shape.len()) else {
            return false;
        };
        let tail_fits = parts[split..].iter().zip(shape.iter()).all(|(part, want)| {
            matches!(part, Component::Normal(name) if *want == "*" || name.to_str() == Some(want))
        });
        let prefix: std::path::PathBuf = parts[..split].iter().collect();
        let plain = parts[..split]
            .iter()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        tail_fits && plain && same_dir(&prefix, layout.root())
    })
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout::new(Path::new("/var/lib/lamina"))
    }

    #[test]
    fn only_the_shapes_lamina_writes_pass() {
        let l = layout();
        let lease = |p: &str| has_shape(Path::new(p), &l, &[&["shared", "*", "users", "*"]]);
        assert!(lease("/var/lib/lamina/shared/abc/users/1-2-3"));
        assert!(!lease("/var/lib/lamina/shared/../../victim/users/x"));
        assert!(!lease("/var/lib/lamina/shared/abc/../users/x"));
        assert!(!lease("/etc/shared/abc/users/x"));
        assert!(!lease("/var/lib/lamina/shared/abc/users"));
        assert!(!lease("shared/abc/users/x"));
    }
}
