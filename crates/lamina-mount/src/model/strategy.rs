//! Mount strategies a caller can ask for. Each answers one documented overlay stall
//! (docs/strategies.md); the read-write ones combine, and `classic` alone is GrootFS's
//! behaviour. `auto` (the default) is resolved per request by [`crate::choose`].

use std::fmt;

/// A set of strategies as `--strategy` takes them: `classic` is the empty set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Strategies {
    /// Choose per request (read-only or not, pool, probe, `--ephemeral`).
    pub auto: bool,
    /// `metacopy=on`: chown/chmod/touch copy up metadata only (stall S3).
    pub metacopy: bool,
    /// `volatile`: no sync of the upper filesystem at unmount (stall S1); the container's
    /// writes do not survive a crash, which an ephemeral container never needs.
    pub volatile: bool,
    /// `delete` only renames the container away; a reaper unmounts it later, after
    /// discarding the data it would otherwise write back (stall S1).
    pub deferred: bool,
    /// Claim a pre-mounted overlay from the image's pool, no mount syscall (stall S2).
    pub pooled: bool,
    /// Read-only: a read-only bind of one shared read-only overlay per image (stall S4).
    pub shared_ro: bool,
    /// Read-only: a read-only bind of the layer itself, or of a flattened tree of
    /// hardlinks into the layers — no overlay at all (stall S5).
    pub direct: bool,
    /// The upper on a filesystem of the container's own (stall S1's neighbour sync and
    /// S3's shared rename lock), and a hard disk limit: a loop-mounted image file, or
    /// a tmpfs for `isolated-memory`; or, for `isolated-quota`, a btrfs subvolume with a
    /// qgroup limit (a disk limit only: it shares the store's filesystem).
    pub isolated: Option<UpperBackend>,
    /// The image as one composefs lower: an EROFS metadata image of the merged layers
    /// whose files point into the store's content-addressed objects (one lower whatever
    /// the layer count; each file's content stored once). Implies `metacopy`'s options.
    pub composefs: bool,
    /// Lazy pulling: a layer that carries an index (eStargz, zstd:chunked) is fetched as
    /// its index alone, its files served on demand (`providers/lazy`); the others are
    /// pulled whole. Implies `metacopy`.
    pub lazy: bool,
}

/// What an isolated container's own upper filesystem is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpperBackend {
    /// A sparse image file in the container's directory, formatted and loop-mounted.
    Disk,
    /// A tmpfs: nothing is ever written back; for ephemeral containers that write little.
    Memory,
    /// A btrfs subvolume of the store's own filesystem with a qgroup limit: the disk
    /// limit without a filesystem, loop device or kernel thread per container. Needs a
    /// store on btrfs with quotas enabled.
    Quota,
}

/// Every name `--strategy` accepts, in the order `Display` prints them.
pub const NAMES: &[&str] = &[
    "auto",
    "shared-ro",
    "direct",
    "isolated",
    "isolated-memory",
    "isolated-quota",
    "composefs",
    "lazy",
    "pooled",
    "metacopy",
    "volatile",
    "deferred",
    "classic",
];

impl Strategies {
    pub const CLASSIC: Strategies = Strategies {
        auto: false,
        metacopy: false,
        volatile: false,
        deferred: false,
        pooled: false,
        shared_ro: false,
        direct: false,
        isolated: None,
        composefs: false,
        lazy: false,
    };

    pub const AUTO: Strategies = Strategies {
        auto: true,
        ..Strategies::CLASSIC
    };

    /// Whether these strategies serve a chain with lazy layers (`auto` picks `lazy` for
    /// one; a list naming `lazy` is it).
    pub fn serve_lazy_layers(&self) -> bool {
        self.auto || self.lazy
    }

    /// Parses a comma-separated list such as `metacopy,volatile` and refuses
    /// combinations that cannot mean anything.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut set = Strategies::default();
        for name in list.split(',').map(str::trim) {
            match name {
                "classic" => {}
                "auto" => set.auto = true,
                "metacopy" => set.metacopy = true,
                "volatile" => set.volatile = true,
                "deferred" => set.deferred = true,
                "pooled" => set.pooled = true,
                "shared-ro" => set.shared_ro = true,
                "direct" => set.direct = true,
                "composefs" => set.composefs = true,
                "lazy" => set.lazy = true,
                "isolated" | "isolated-memory" | "isolated-quota" => {
                    let backend = match name {
                        "isolated" => UpperBackend::Disk,
                        "isolated-memory" => UpperBackend::Memory,
                        _ => UpperBackend::Quota,
                    };
                    if set.isolated.is_some_and(|b| b != backend) {
                        return Err("strategies `isolated`, `isolated-memory` and `isolated-quota` are backends for one upper: pick one".into());
                    }
                    set.isolated = Some(backend);
                }
                other => {
                    return Err(format!(
                        "unknown strategy `{other}` (available: {})",
                        NAMES.join(", ")
                    ));
                }
            }
        }
        set.check()?;
        Ok(set)
    }

    fn check(&self) -> Result<(), String> {
        if self.auto && *self != Strategies::AUTO {
            return Err(format!(
                "strategy `auto` chooses by itself and does not combine with `{}`",
                Strategies {
                    auto: false,
                    ..*self
                }
            ));
        }
        if self.shared_ro && self.direct {
            return Err("strategies `shared-ro` and `direct` are two ways to give a read-only rootfs: pick one".into());
        }
        if self.pooled && self.isolated == Some(UpperBackend::Quota) {
            return Err("strategy `isolated-quota` makes a subvolume in about a millisecond and pools none: it does not combine with `pooled`".into());
        }
        if self.lazy {
            for (on, name) in [
                (self.shared_ro, "shared-ro"),
                (self.direct, "direct"),
                (self.pooled, "pooled"),
                (self.isolated.is_some(), "isolated"),
                (self.composefs, "composefs"),
                (self.volatile, "volatile"),
            ] {
                if on {
                    return Err(format!(
                        "strategy `lazy` mounts an overlay of its own over lazily served layers: it does not combine with `{name}`"
                    ));
                }
            }
        }
        if let Some(ro) = self.read_only_kind() {
            for (on, name) in [
                (self.metacopy, "metacopy"),
                (self.volatile, "volatile"),
                (self.pooled, "pooled"),
                (self.isolated.is_some(), "isolated"),
                (self.composefs, "composefs"),
            ] {
                if on {
                    return Err(format!(
                        "strategy `{ro}` gives a read-only rootfs, which has no upper for `{name}` to change"
                    ));
                }
            }
        }
        Ok(())
    }

    /// `shared-ro` or `direct` when this set gives a read-only bind.
    pub fn read_only_kind(&self) -> Option<&'static str> {
        if self.shared_ro {
            Some("shared-ro")
        } else if self.direct {
            Some("direct")
        } else {
            None
        }
    }

    /// Overlay options this set adds to a read-write mount.
    pub fn overlay_options(&self) -> Vec<(String, Option<String>)> {
        let mut options = Vec::new();
        // composefs files are metacopy inodes: overlay follows their redirects only with
        // metacopy on.
        if self.metacopy || self.composefs || self.lazy {
            // metacopy needs redirect_dir; say so rather than rely on the kernel's implication.
            options.push(("redirect_dir".to_string(), Some("on".to_string())));
            options.push(("metacopy".to_string(), Some("on".to_string())));
        }
        if self.volatile {
            options.push(("volatile".to_string(), None));
        }
        options
    }
}

impl fmt::Display for Strategies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [
            (self.auto, "auto"),
            (self.shared_ro, "shared-ro"),
            (self.direct, "direct"),
            (self.isolated == Some(UpperBackend::Disk), "isolated"),
            (
                self.isolated == Some(UpperBackend::Memory),
                "isolated-memory",
            ),
            (self.isolated == Some(UpperBackend::Quota), "isolated-quota"),
            (self.composefs, "composefs"),
            (self.lazy, "lazy"),
            (self.pooled, "pooled"),
            (self.metacopy, "metacopy"),
            (self.volatile, "volatile"),
            (self.deferred, "deferred"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if names.is_empty() {
            f.write_str("classic")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_combine_and_print_back() {
        assert_eq!(Strategies::parse("classic").unwrap(), Strategies::CLASSIC);
        let both = Strategies::parse("volatile, metacopy").unwrap();
        assert_eq!(both.to_string(), "metacopy,volatile");
        assert_eq!(both.overlay_options().len(), 3);
        let isolated = Strategies::parse("isolated-memory,volatile").unwrap();
        assert_eq!(isolated.isolated, Some(UpperBackend::Memory));
        assert_eq!(isolated.to_string(), "isolated-memory,volatile");
        assert_eq!(crate::Flavour::of(isolated).strategies(), isolated);
        let all_rw = Strategies::parse("deferred,pooled,volatile,metacopy").unwrap();
        assert_eq!(all_rw.to_string(), "pooled,metacopy,volatile,deferred");
        assert_eq!(
            Strategies::parse(&all_rw.to_string()).unwrap(),
            all_rw,
            "what a record stores parses back"
        );
        assert_eq!(
            Strategies::parse("shared-ro,deferred").unwrap().to_string(),
            "shared-ro,deferred"
        );
        assert_eq!(Strategies::parse("auto").unwrap(), Strategies::AUTO);
        let quota = Strategies::parse("metacopy,isolated-quota").unwrap();
        assert_eq!(quota.isolated, Some(UpperBackend::Quota));
        assert_eq!(quota.to_string(), "isolated-quota,metacopy");
        assert_eq!(Strategies::parse(&quota.to_string()).unwrap(), quota);
        let composefs = Strategies::parse("volatile,composefs").unwrap();
        assert!(composefs.composefs);
        assert_eq!(composefs.to_string(), "composefs,volatile");
        assert_eq!(
            Strategies::parse(&composefs.to_string()).unwrap(),
            composefs
        );
        assert!(
            composefs
                .overlay_options()
                .contains(&("metacopy".to_string(), Some("on".to_string()))),
            "composefs needs metacopy to follow its redirects"
        );
    }

    #[test]
    fn meaningless_combinations_are_refused_by_name() {
        for (list, expect) in [
            ("fast", "unknown strategy `fast`"),
            ("auto,metacopy", "does not combine with `metacopy`"),
            ("shared-ro,direct", "pick one"),
            ("direct,volatile", "no upper for `volatile`"),
            ("shared-ro,pooled", "no upper for `pooled`"),
            ("direct,isolated", "no upper for `isolated`"),
            ("isolated,isolated-memory", "pick one"),
            ("isolated-quota,isolated", "pick one"),
            ("pooled,isolated-quota", "does not combine with `pooled`"),
            ("shared-ro,isolated-quota", "no upper for `isolated`"),
            ("direct,composefs", "no upper for `composefs`"),
            ("lazy,pooled", "does not combine with `pooled`"),
            ("lazy,shared-ro", "does not combine with `shared-ro`"),
            ("lazy,composefs", "does not combine with `composefs`"),
        ] {
            let err = Strategies::parse(list).unwrap_err();
            assert!(err.contains(expect), "{list}: {err}");
        }
    }
}
