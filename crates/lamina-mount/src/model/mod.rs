//! What a container's rootfs *is*, as one typed value: a provider (how the rootfs comes
//! to exist) × an upper flavour (for the overlay providers: metacopy, volatile, where the
//! upper lives) × a teardown (how delete ends it). Every lifecycle step decides what to do
//! by matching on this, once; nothing re-parses a strategy string.
//!
//! `--strategy` lists ([`Strategies`]) are the operator's words for it; `choose` turns a
//! list and a request into a [`Model`], refusing combinations that mean nothing. The
//! container record stores the model itself (see `record.rs`). Each step that depends
//! on the provider matches on it once, in `crate::providers`.

use std::fmt;

use serde::{Deserialize, Serialize};

pub mod record;
pub mod strategy;

use crate::{Strategies, UpperBackend};

/// One container's rootfs: provider and teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    #[serde(flatten)]
    pub provider: Provider,
    pub teardown: Teardown,
}

/// How the rootfs comes to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "kebab-case")]
pub enum Provider {
    /// An overlay mounted for this container (GrootFS's way; `classic` when the flavour is
    /// plain). With `read_only`, the same overlay mounted read-only.
    Fresh {
        #[serde(flatten)]
        flavour: Flavour,
        read_only: bool,
    },
    /// A pre-mounted read-write overlay claimed from the image's pool (stall S2). Pools
    /// hold read-write overlays only, so there is no read-only pooled rootfs.
    Pooled {
        #[serde(flatten)]
        flavour: Flavour,
    },
    /// A read-only bind of the image's one shared read-only overlay (stall S4).
    SharedRo,
    /// A read-only bind of the layer, or of a flattened tree of hardlinks: no overlay (S5).
    Direct,
    /// An overlay mounted for this container whose indexed layers are lazy: their trees
    /// are metacopy files redirecting into objects a FUSE server fetches on demand
    /// (`providers/lazy`). Its flavour is [`Flavour::LAZY`].
    Lazy { read_only: bool },
}

/// How an overlay's upper behaves: what a pool slot must match to serve a create.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Flavour {
    /// `metacopy=on`: metadata changes copy up metadata only (stall S3).
    pub metacopy: bool,
    /// `volatile`: no sync of the upper filesystem (stall S1); writes may not survive a crash.
    pub volatile: bool,
    /// The upper on a filesystem of the container's own, and of what; `None`: in the
    /// container's directory on the store's filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolated: Option<UpperBackend>,
    /// The lowers are the image's composefs metadata image and the store's objects
    /// (`composefs.rs`), not its layer directories.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub composefs: bool,
}

/// How `delete` ends a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Teardown {
    /// Unmount and remove before `delete` returns (GrootFS's way).
    Inline,
    /// One rename into `trash/`; the reaper discards, unmounts and removes later (S1).
    Deferred,
}

impl Model {
    /// GrootFS's rootfs: a fresh plain overlay, removed inline.
    pub const CLASSIC: Model = Model {
        provider: Provider::Fresh {
            flavour: Flavour::PLAIN,
            read_only: false,
        },
        teardown: Teardown::Inline,
    };

    /// The model a concrete (not `auto`) strategy list names, for a rootfs that must be
    /// read-only or not. Teardown is deferred wherever inline would make the caller wait
    /// for what only the reaper should do: an isolated upper (loop detach, image removal)
    /// and the read-only binds (a lease release or nothing at all). A quota upper's
    /// subvolume goes in one ioctl, so `isolated-quota` is inline unless `deferred`.
    pub fn named(s: Strategies, read_only: bool) -> Result<Model, String> {
        if s.auto {
            return Err("strategy `auto` is resolved per request, not a model".into());
        }
        let flavour = Flavour::of(s);
        let provider = if s.lazy {
            Provider::Lazy { read_only }
        } else if s.shared_ro {
            Provider::SharedRo
        } else if s.direct {
            Provider::Direct
        } else if s.pooled {
            if read_only {
                return Err("strategy `pooled` serves read-write overlays; it does not combine with --read-only (use shared-ro or direct)".into());
            }
            Provider::Pooled { flavour }
        } else {
            Provider::Fresh { flavour, read_only }
        };
        let deferred =
            s.deferred || provider.binds() || flavour.isolated.is_some_and(own_filesystem);
        Ok(Model {
            provider,
            teardown: if deferred {
                Teardown::Deferred
            } else {
                Teardown::Inline
            },
        })
    }

    /// Every model a `--strategy` list names, read-only or not: each list of the names
    /// the parser takes (but `auto`, which names none), in a stable order. The
    /// conformance table is generated from this, so a model nobody listed fails nothing
    /// only if the parser refuses it too.
    pub fn all() -> Vec<Model> {
        let names: Vec<&str> = crate::model::strategy::NAMES
            .iter()
            .copied()
            .filter(|n| *n != "auto" && *n != "classic")
            .collect();
        let mut all = Vec::new();
        for set in 0u32..(1 << names.len()) {
            let list: Vec<&str> = (0..names.len())
                .filter(|i| set & (1 << i) != 0)
                .map(|i| names[i])
                .collect();
            let list = if list.is_empty() {
                "classic".to_string()
            } else {
                list.join(",")
            };
            let Ok(strategies) = Strategies::parse(&list) else {
                continue;
            };
            for read_only in [false, true] {
                if let Ok(model) = Model::named(strategies, read_only)
                    && !all.contains(&model)
                {
                    all.push(model);
                }
            }
        }
        all
    }

    /// The model a container made again gets (recovery after a crash): a pooled one is a
    /// fresh read-write overlay of the same flavour, which is what a claimed slot was.
    pub fn remade(self) -> Model {
        match self.provider {
            Provider::Pooled { flavour } => Model {
                provider: Provider::Fresh {
                    flavour,
                    read_only: false,
                },
                ..self
            },
            Provider::Fresh { .. }
            | Provider::SharedRo
            | Provider::Direct
            | Provider::Lazy { .. } => self,
        }
    }

    /// The overlay flavour, for the providers that mount an overlay.
    pub fn flavour(&self) -> Option<Flavour> {
        self.provider.flavour()
    }

    pub fn read_only(&self) -> bool {
        match self.provider {
            Provider::Fresh { read_only, .. } | Provider::Lazy { read_only } => read_only,
            Provider::Pooled { .. } => false,
            Provider::SharedRo | Provider::Direct => true,
        }
    }

    /// The flavour of a rootfs the container writes to (a read-write overlay): what the
    /// reaper discards before unmounting, and what `unmount` syncs.
    pub fn writable(&self) -> Option<Flavour> {
        match self.provider {
            Provider::Fresh {
                flavour,
                read_only: false,
            }
            | Provider::Pooled { flavour } => Some(flavour),
            Provider::Lazy { read_only: false } => Some(Flavour::LAZY),
            Provider::Fresh {
                read_only: true, ..
            }
            | Provider::Lazy { read_only: true }
            | Provider::SharedRo
            | Provider::Direct => None,
        }
    }

    /// A volatile upper: the kernel marks its work dir at every mount, and only lamina's
    /// clean `unmount` removes the mark.
    pub fn volatile(&self) -> bool {
        self.flavour().is_some_and(|f| f.volatile)
    }

    /// Lowers are the image's composefs metadata image over the store's objects.
    pub fn composefs(&self) -> bool {
        self.flavour().is_some_and(|f| f.composefs)
    }

    /// Copy-ups are metadata-only (metacopy, and composefs, whose files are metacopy
    /// inodes): what a committed upper needs filled from its lowers.
    pub fn metadata_copy_up(&self) -> bool {
        self.flavour().is_some_and(|f| f.metacopy || f.composefs)
    }

    /// A read-only bind of a directory lamina keeps elsewhere: no upper of its own.
    pub fn binds(&self) -> bool {
        self.provider.binds()
    }

    /// The upper's own filesystem, if it has one.
    pub fn upper_backend(&self) -> Option<UpperBackend> {
        self.flavour().and_then(|f| f.isolated)
    }

    /// An overlay whose upper is a plain directory of its container's (`upper/`), not on a
    /// filesystem of its own: what is there whether or not anything is mounted.
    pub fn upper_in_container_dir(&self) -> bool {
        self.flavour().is_some_and(|f| f.isolated.is_none())
    }

    /// An overlay only lamina mounts (a caller binds it): a volatile one (see
    /// [`Model::volatile`]), a composefs one, whose lower is lamina's own EROFS mount, or
    /// a lazy one, whose data-only lowers are lamina's own FUSE mounts (and which
    /// containerd's parsing of `lowerdir=` would not keep apart).
    pub fn mounted_by_lamina_only(&self) -> bool {
        self.volatile() || self.composefs() || matches!(self.provider, Provider::Lazy { .. })
    }

    /// A read-write rootfs whose writes are written back at unmount (not a tmpfs upper):
    /// what the reaper unlinks first so no unmount waits on their writeback.
    pub fn writes_back(&self) -> bool {
        self.writable()
            .is_some_and(|f| f.isolated != Some(UpperBackend::Memory))
    }

    pub fn deferred(&self) -> bool {
        self.teardown == Teardown::Deferred
    }

    /// The strategy list that names this model, as `--strategy` and logs spell it.
    pub fn strategies(&self) -> Strategies {
        let mut s = match self.provider {
            Provider::Fresh { flavour, .. } => flavour.strategies(),
            Provider::Pooled { flavour } => Strategies {
                pooled: true,
                ..flavour.strategies()
            },
            Provider::SharedRo => Strategies {
                shared_ro: true,
                ..Strategies::CLASSIC
            },
            Provider::Direct => Strategies {
                direct: true,
                ..Strategies::CLASSIC
            },
            Provider::Lazy { .. } => Strategies {
                lazy: true,
                ..Strategies::CLASSIC
            },
        };
        s.deferred = self.deferred();
        s
    }
}

/// Whether an isolated upper of `backend` is a filesystem of its own (a loop-mounted
/// image or a tmpfs), whose teardown is always the reaper's; a quota upper is a subvolume
/// of the store's filesystem.
pub fn own_filesystem(backend: UpperBackend) -> bool {
    backend != UpperBackend::Quota
}

impl Provider {
    pub fn flavour(&self) -> Option<Flavour> {
        match *self {
            Provider::Fresh { flavour, .. } | Provider::Pooled { flavour } => Some(flavour),
            Provider::Lazy { .. } => Some(Flavour::LAZY),
            Provider::SharedRo | Provider::Direct => None,
        }
    }

    /// The provider's name: its record's `provider` tag, and the `--strategy` word that
    /// names it (none for `fresh`, which a list names by leaving every provider out).
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Fresh { .. } => "fresh",
            Provider::Pooled { .. } => "pooled",
            Provider::SharedRo => "shared-ro",
            Provider::Direct => "direct",
            Provider::Lazy { .. } => "lazy",
        }
    }

    /// A read-only bind of a directory lamina keeps elsewhere (no upper of its own).
    pub fn binds(&self) -> bool {
        matches!(self, Provider::SharedRo | Provider::Direct)
    }

    /// What a record of this provider must name, and nothing else may: the directory
    /// its rootfs binds, and the lease that keeps that directory mounted.
    pub fn names(&self) -> Names {
        match self {
            Provider::SharedRo => Names {
                bind_source: true,
                lease: true,
                bind_shapes: &[&["shared", "*", "rootfs"]],
                own_idmap: false,
            },
            Provider::Direct => Names {
                bind_source: true,
                lease: false,
                bind_shapes: &[&["flat", "*"], &["layers", "*", "diff"]],
                own_idmap: false,
            },
            Provider::Fresh { .. } => Names {
                own_idmap: true,
                ..Names::default()
            },
            Provider::Pooled { .. } | Provider::Lazy { .. } => Names::default(),
        }
    }
}

/// What a provider's record names, and may name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Names {
    pub bind_source: bool,
    pub lease: bool,
    /// The shapes (below the store's root; `*` one name) a bind source may have: the
    /// image's shared mount, or its flattened tree, never the other's (a direct bind of a
    /// shared mount holds no lease, and the mount could go from under it).
    pub bind_shapes: &'static [&'static [&'static str]],
    /// The record may carry an idmap of the container's own (a mount nothing shares).
    pub own_idmap: bool,
}

impl Flavour {
    /// No option at all: classic's upper.
    pub const PLAIN: Flavour = Flavour {
        metacopy: false,
        volatile: false,
        isolated: None,
        composefs: false,
    };

    /// A lazy overlay's: its lazy layers' files are metacopy inodes, whose redirects
    /// overlay follows only with metacopy on.
    pub const LAZY: Flavour = Flavour {
        metacopy: true,
        ..Flavour::PLAIN
    };

    /// The flavour a strategy list asks for (its metacopy, volatile, isolated and
    /// composefs).
    pub fn of(s: Strategies) -> Flavour {
        Flavour {
            metacopy: s.metacopy,
            volatile: s.volatile,
            isolated: s.isolated,
            composefs: s.composefs,
        }
    }

    /// The strategy list that names this flavour alone (how pool targets spell it).
    pub fn strategies(&self) -> Strategies {
        Strategies {
            metacopy: self.metacopy,
            volatile: self.volatile,
            isolated: self.isolated,
            composefs: self.composefs,
            ..Strategies::CLASSIC
        }
    }

    /// Overlay options this flavour adds to a read-write mount.
    pub fn overlay_options(&self) -> Vec<(String, Option<String>)> {
        self.strategies().overlay_options()
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.strategies().fmt(f)
    }
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.strategies().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(list: &str, read_only: bool) -> Result<Model, String> {
        Model::named(Strategies::parse(list).unwrap(), read_only)
    }

    #[test]
    fn every_concrete_list_names_a_model_that_prints_back() {
        for list in [
            "classic",
            "metacopy",
            "volatile,deferred",
            "pooled,metacopy,volatile",
            "isolated,metacopy",
            "isolated-memory,volatile",
            "pooled,isolated",
            "isolated-quota,metacopy",
            "isolated-quota,volatile,deferred",
            "composefs",
            "composefs,isolated-memory,volatile",
        ] {
            let model = named(list, false).unwrap();
            let again = named(&model.to_string(), false).unwrap();
            assert_eq!(again, model, "{list} → {model}");
        }
        assert_eq!(named("classic", false).unwrap(), Model::CLASSIC);
    }

    #[test]
    fn every_model_is_named_by_the_list_it_prints() {
        let all = Model::all();
        for model in &all {
            let again = named(&model.to_string(), model.read_only()).unwrap();
            assert_eq!(again, *model, "{model}");
        }
        println!("{} models", all.len());
        for model in &all {
            println!(
                "{model}{}",
                if model.read_only() {
                    " --read-only"
                } else {
                    ""
                }
            );
        }
        assert!(all.contains(&Model::CLASSIC));
    }

    #[test]
    fn binds_and_isolated_uppers_are_always_deferred_and_pooled_is_never_read_only() {
        assert!(named("shared-ro", false).unwrap().deferred());
        assert!(named("direct", true).unwrap().read_only());
        assert!(named("isolated", false).unwrap().deferred());
        assert!(!named("metacopy", false).unwrap().deferred());
        assert!(!named("isolated-quota", false).unwrap().deferred());
        assert!(named("isolated-quota,deferred", false).unwrap().deferred());
        let ro = named("classic", true).unwrap();
        assert!(ro.read_only() && ro.flavour() == Some(Flavour::PLAIN));
        let err = named("pooled", true).unwrap_err();
        assert!(err.contains("does not combine with --read-only"), "{err}");
        assert!(Model::named(Strategies::AUTO, false).is_err());
    }

    #[test]
    fn the_record_form_is_tagged_by_provider() {
        let model = named("pooled,isolated-memory,volatile", false).unwrap();
        let json = serde_json::to_value(model).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "provider": "pooled",
                "metacopy": false,
                "volatile": true,
                "isolated": "memory",
                "teardown": "deferred",
            })
        );
        assert_eq!(serde_json::from_value::<Model>(json).unwrap(), model);
        let bad = serde_json::json!({"provider": "teleport", "teardown": "inline"});
        assert!(serde_json::from_value::<Model>(bad).is_err());
    }
}
