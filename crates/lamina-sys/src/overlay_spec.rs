use std::path::PathBuf;

use crate::UserNsMaps;

/// Everything needed to mount one overlay. Built by the mount planner, consumed by a
/// [`crate::Mounter`], and rendered as classic option strings for callers (Garden's
/// `--without-mount`) that mount it themselves.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OverlaySpec {
    /// Lower layers, top-most first (overlay's own order).
    pub lowers: Vec<PathBuf>,
    /// Upper and work directories; both absent for a read-only overlay.
    pub upper: Option<PathBuf>,
    pub work: Option<PathBuf>,
    /// Extra overlay options in order, `("metacopy", Some("on"))` or `("volatile", None)`.
    pub options: Vec<(String, Option<String>)>,
    /// Mount the overlay read-only (MOUNT_ATTR_RDONLY).
    pub read_only: bool,
    /// A uid-mapped store: each lower is passed as an idmapped mount of a user namespace
    /// with these maps, so files owned by 0 on disk are the mapped root's. Mount options
    /// cannot say this: [`OverlaySpec::option_strings`] omits it.
    pub lower_idmap: Option<UserNsMaps>,
    /// Who owns the upper directory's root (the merged root dir shows its owner): the
    /// mapped root in a uid-mapped store. Set before mounting.
    pub upper_owner: Option<(u32, u32)>,
    /// Data-only lowers (`datadir+`, `::` in `lowerdir`): found only through a metacopy
    /// redirect (composefs's objects), never merged into the tree.
    pub data_lowers: Vec<PathBuf>,
}

impl OverlaySpec {
    /// The options as `mount -o` / runtime-spec strings, paths escaped the way
    /// overlay's option parser expects (`\`, `,` and `:` backslash-escaped).
    pub fn option_strings(&self) -> Vec<String> {
        let lowers: Vec<String> = self.lowers.iter().map(|p| escape(p)).collect();
        let data: String = self
            .data_lowers
            .iter()
            .map(|p| format!("::{}", escape(p)))
            .collect();
        let mut out = vec![format!("lowerdir={}{data}", lowers.join(":"))];
        if let Some(upper) = &self.upper {
            out.push(format!("upperdir={}", escape(upper)));
        }
        if let Some(work) = &self.work {
            out.push(format!("workdir={}", escape(work)));
        }
        for (key, value) in &self.options {
            match value {
                Some(v) => out.push(format!("{key}={v}")),
                None => out.push(key.clone()),
            }
        }
        if self.read_only {
            out.push("ro".to_string());
        }
        out
    }
}

fn escape(path: &std::path::Path) -> String {
    let mut s = String::new();
    for c in path.to_string_lossy().chars() {
        if matches!(c, '\\' | ',' | ':') {
            s.push('\\');
        }
        s.push(c);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_strings_keep_overlay_order_and_escape_separators() {
        let spec = OverlaySpec {
            lowers: vec!["/s/l/top".into(), "/s/l/a:b,c".into()],
            upper: Some("/s/u".into()),
            work: Some("/s/w".into()),
            options: vec![
                ("metacopy".into(), Some("on".into())),
                ("volatile".into(), None),
            ],
            read_only: false,
            ..OverlaySpec::default()
        };
        assert_eq!(
            spec.option_strings(),
            vec![
                "lowerdir=/s/l/top:/s/l/a\\:b\\,c",
                "upperdir=/s/u",
                "workdir=/s/w",
                "metacopy=on",
                "volatile"
            ]
        );
    }
}
