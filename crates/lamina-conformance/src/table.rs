//! The conformance table, in terms of the strategy model (provider × upper flavour ×
//! teardown), not of lamina's current API: [`crate::adapter`] is the one place that
//! translates. A row is a request (named strategy or `auto`, read-only, ephemeral, disk
//! limit), the pool it meets, and what must come of it.

use lamina_sys::Errno;

/// Where a rootfs comes from: the provider's name as lamina's model spells it (its
/// record's `provider` tag and its `--strategy` word), so a provider added to the model
/// needs nothing here: the generated rows carry its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provider(pub &'static str);

impl Provider {
    /// A read-write (or read-only) overlay mounted for this container.
    pub const FRESH: Provider = Provider("fresh");
    /// A pre-mounted read-write overlay claimed from the image's pool.
    pub const POOLED: Provider = Provider("pooled");
    /// A read-only bind of one shared read-only overlay per image.
    pub const SHARED_RO: Provider = Provider("shared-ro");
    /// A read-only bind of a plain directory (a layer, or a flattened tree).
    pub const DIRECT: Provider = Provider("direct");

    /// Whether its rootfs is a bind of a directory lamina keeps (no overlay of the
    /// container's own, so nothing for a caller to mount but that bind).
    pub fn binds(self) -> bool {
        self == Provider::SHARED_RO || self == Provider::DIRECT
    }
}

/// Which filesystem a read-write overlay's upper lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upper {
    /// The store's own filesystem.
    Store,
    /// A filesystem of the container's own, on a loop-mounted image file.
    Disk,
    /// A tmpfs of the container's own.
    Memory,
    /// A btrfs subvolume of the store's filesystem with a qgroup limit: only a store on
    /// btrfs with quotas serves it.
    Quota,
}

/// How a read-write overlay is mounted (what a pool slot must match).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flavour {
    pub metacopy: bool,
    pub volatile: bool,
    pub upper: Upper,
    /// The image as one composefs lower (metadata image + objects), not its layers.
    pub composefs: bool,
}

/// Who pays for the unmount at delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teardown {
    Inline,
    Deferred,
}

/// A fully resolved strategy: what a container record says it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub provider: Provider,
    pub flavour: Flavour,
    pub teardown: Teardown,
}

pub const PLAIN: Flavour = Flavour {
    metacopy: false,
    volatile: false,
    upper: Upper::Store,
    composefs: false,
};
pub const METACOPY: Flavour = Flavour {
    metacopy: true,
    ..PLAIN
};
pub const VOLATILE: Flavour = Flavour {
    volatile: true,
    ..PLAIN
};
pub const METACOPY_VOLATILE: Flavour = Flavour {
    metacopy: true,
    volatile: true,
    upper: Upper::Store,
    composefs: false,
};
pub const COMPOSEFS: Flavour = Flavour {
    composefs: true,
    ..PLAIN
};
pub const COMPOSEFS_VOLATILE: Flavour = Flavour {
    volatile: true,
    ..COMPOSEFS
};

impl Flavour {
    pub const fn on(self, upper: Upper) -> Flavour {
        Flavour { upper, ..self }
    }
}

impl Request {
    /// Whether only a store on btrfs with quotas serves this request.
    pub fn needs_quota_store(&self) -> bool {
        matches!(self.ask, Ask::Named(spec) if spec.flavour.upper == Upper::Quota)
    }
}

impl Spec {
    pub const fn new(provider: Provider, flavour: Flavour, teardown: Teardown) -> Spec {
        Spec {
            provider,
            flavour,
            teardown,
        }
    }

    pub const fn fresh(flavour: Flavour, teardown: Teardown) -> Spec {
        Spec::new(Provider::FRESH, flavour, teardown)
    }

    pub const fn pooled(flavour: Flavour, teardown: Teardown) -> Spec {
        Spec::new(Provider::POOLED, flavour, teardown)
    }

    /// Read-only binds and isolated uppers are always torn down by the reaper.
    pub const fn shared_ro() -> Spec {
        Spec::new(Provider::SHARED_RO, PLAIN, Teardown::Deferred)
    }

    pub const fn direct() -> Spec {
        Spec::new(Provider::DIRECT, PLAIN, Teardown::Deferred)
    }
}

/// What the caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    Named(Spec),
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub ask: Ask,
    pub read_only: bool,
    pub ephemeral: bool,
    /// A disk limit in bytes.
    pub disk_limit: Option<u64>,
}

impl Request {
    pub const fn named(spec: Spec) -> Request {
        Request {
            ask: Ask::Named(spec),
            read_only: false,
            ephemeral: false,
            disk_limit: None,
        }
    }

    pub const fn auto() -> Request {
        Request {
            ask: Ask::Auto,
            read_only: false,
            ephemeral: false,
            disk_limit: None,
        }
    }

    pub const fn read_only(self) -> Request {
        Request {
            read_only: true,
            ..self
        }
    }

    pub const fn ephemeral(self) -> Request {
        Request {
            ephemeral: true,
            ..self
        }
    }

    pub const fn limited(self, bytes: u64) -> Request {
        Request {
            disk_limit: Some(bytes),
            ..self
        }
    }
}

/// A pool made before the row's create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSetup {
    None,
    /// Pre-mounted overlays of the image in `flavour`; `size` 0 leaves a standing order
    /// with no slot ready.
    Overlays {
        flavour: Flavour,
        disk_limit: Option<u64>,
        size: usize,
    },
    /// Bare upper filesystems (no image) of this kind.
    Uppers {
        upper: Upper,
        size: usize,
    },
}

/// Why a create is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A named `pooled` found no slot of its flavour.
    PoolEmpty,
    /// A named `pooled` with a read-only rootfs.
    PoolReadOnly,
    /// A disk limit without an isolated upper.
    DiskLimitNeedsIsolated,
    /// A named `pooled` whose caller mounts the rootfs itself: a slot is mounted already.
    PoolWithoutMount,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Created {
        spec: Spec,
        read_only: bool,
        from_pool: bool,
    },
    Refused(Refusal),
}

/// One lifecycle row.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub name: &'static str,
    pub request: Request,
    pub pool: PoolSetup,
    pub expect: Expect,
    /// A lamina bug this row reproduces: its failure is reported, not fatal.
    pub known_bug: Option<&'static str>,
}

/// 64 MiB: the disk limit the table uses (the sample image fits many times over).
pub const LIMIT: u64 = 64 << 20;

const fn row(name: &'static str, request: Request, expect: Expect) -> Row {
    Row {
        name,
        request,
        pool: PoolSetup::None,
        expect,
        known_bug: None,
    }
}

const fn made(spec: Spec, read_only: bool, from_pool: bool) -> Expect {
    Expect::Created {
        spec,
        read_only,
        from_pool,
    }
}

const fn with_pool(mut r: Row, pool: PoolSetup) -> Row {
    r.pool = pool;
    r
}

const fn overlays(flavour: Flavour, size: usize) -> PoolSetup {
    PoolSetup::Overlays {
        flavour,
        disk_limit: None,
        size,
    }
}

/// Every valid named strategy, read-only where that means something, `auto` with each
/// kind of request, and the known-defect guards.
pub fn lifecycle_rows() -> Vec<Row> {
    use Teardown::{Deferred, Inline};
    let disk = |f: Flavour| f.on(Upper::Disk);
    let mut rows = Vec::new();

    // Every model the parser names, generated from lamina's model: a model nobody
    // listed here runs anyway. A pooled one is claimed from a pool of exactly its flavour.
    for named in crate::adapter::every_named() {
        let (spec, read_only) = (named.spec, named.read_only);
        let name = leak(format!(
            "{}{}",
            crate::adapter::list(&spec),
            if named.asks_read_only {
                " --read-only"
            } else {
                ""
            }
        ));
        let mut request = Request::named(spec);
        request.read_only = named.asks_read_only;
        let pooled = spec.provider == Provider::POOLED;
        let generated = row(name, request, made(spec, read_only, pooled));
        rows.push(if pooled {
            with_pool(generated, overlays(spec.flavour, 2))
        } else {
            generated
        });
    }
    // `--ephemeral` adds volatile to a named strategy.
    rows.push(row(
        "metacopy --ephemeral",
        Request::named(Spec::fresh(METACOPY, Inline)).ephemeral(),
        made(Spec::fresh(METACOPY_VOLATILE, Inline), false, false),
    ));
    let spec = Spec::fresh(disk(PLAIN), Deferred);
    rows.push(row(
        "isolated --disk-limit",
        Request::named(spec).limited(LIMIT),
        made(spec, false, false),
    ));
    let spec = Spec::fresh(PLAIN.on(Upper::Quota), Inline);
    rows.push(row(
        "isolated-quota --disk-limit",
        Request::named(spec).limited(LIMIT),
        made(spec, false, false),
    ));

    // auto, per kind of request (this suite's rigs pass the metacopy probe).
    let auto_rw = Spec::fresh(METACOPY, Deferred);
    rows.push(row("auto", Request::auto(), made(auto_rw, false, false)));
    rows.push(row(
        "auto --read-only (multi-layer: shared-ro)",
        Request::auto().read_only(),
        made(Spec::shared_ro(), true, false),
    ));
    rows.push(row(
        "auto --ephemeral",
        Request::auto().ephemeral(),
        made(Spec::fresh(METACOPY_VOLATILE, Deferred), false, false),
    ));
    rows.push(row(
        "auto --disk-limit",
        Request::auto().limited(LIMIT),
        made(Spec::fresh(disk(METACOPY), Deferred), false, false),
    ));
    rows.push(with_pool(
        row(
            "auto, pool ready",
            Request::auto(),
            made(Spec::pooled(METACOPY, Deferred), false, true),
        ),
        overlays(METACOPY, 1),
    ));
    rows.push(with_pool(
        row(
            "auto, pool of the plain flavour ready",
            Request::auto(),
            made(Spec::pooled(PLAIN, Deferred), false, true),
        ),
        overlays(PLAIN, 1),
    ));
    rows.push(with_pool(
        row(
            "auto, pool empty",
            Request::auto(),
            made(auto_rw, false, false),
        ),
        overlays(METACOPY, 0),
    ));
    rows.push(with_pool(
        row(
            "auto --ephemeral, volatile pool ready",
            Request::auto().ephemeral(),
            made(Spec::pooled(METACOPY_VOLATILE, Deferred), false, true),
        ),
        overlays(METACOPY_VOLATILE, 1),
    ));
    rows.push(with_pool(
        row(
            "auto, bare isolated upper ready",
            Request::auto(),
            made(Spec::fresh(disk(METACOPY), Deferred), false, true),
        ),
        PoolSetup::Uppers {
            upper: Upper::Disk,
            size: 1,
        },
    ));
    // Guard: auto with a disk limit claims from a pool filled `pooled,isolated` with the
    // same limit.
    rows.push(with_pool(
        row(
            "auto --disk-limit, pool `pooled,isolated` of that limit ready",
            Request::auto().limited(LIMIT),
            made(Spec::pooled(disk(PLAIN), Deferred), false, true),
        ),
        PoolSetup::Overlays {
            flavour: disk(PLAIN),
            disk_limit: Some(LIMIT),
            size: 1,
        },
    ));

    // Refusals. Guard: a named `pooled` meeting a pool of another flavour is refused, not
    // served fresh.
    rows.push(with_pool(
        row(
            "pooled with only a volatile pool: refused",
            Request::named(Spec::pooled(PLAIN, Inline)),
            Expect::Refused(Refusal::PoolEmpty),
        ),
        overlays(VOLATILE, 1),
    ));
    rows.push(row(
        "pooled with no pool: refused",
        Request::named(Spec::pooled(METACOPY, Inline)),
        Expect::Refused(Refusal::PoolEmpty),
    ));
    rows.push(with_pool(
        row(
            "pooled --read-only: refused",
            Request::named(Spec::pooled(PLAIN, Inline)).read_only(),
            Expect::Refused(Refusal::PoolReadOnly),
        ),
        overlays(PLAIN, 1),
    ));
    rows.push(row(
        "classic --disk-limit: refused",
        Request::named(Spec::fresh(PLAIN, Inline)).limited(LIMIT),
        Expect::Refused(Refusal::DiskLimitNeedsIsolated),
    ));
    rows
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A lifecycle step a fault is injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Create,
    /// `mount` after an `unmount`.
    Mount,
    Unmount,
    /// An inline `delete`.
    Delete,
    /// The reaper's pass after a deferred `delete`.
    Reap,
    /// `clean` finishing a deferred `delete` nobody reaped.
    Clean,
    PoolFill,
}

/// Which mounter call fails (the fake's injections today; more kinds go here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// The next overlay mount or upper-filesystem mount.
    NextMount,
    /// The next overlay mount, while upper-filesystem mounts succeed.
    NextOverlayMount,
    /// The next syncfs.
    NextSync,
    /// The next unmount (a busy rootfs: EBUSY).
    NextUnmount,
}

/// One fault row: `step` of a container asked as `request`, with `call` failing `errno`.
#[derive(Debug, Clone, Copy)]
pub struct FaultRow {
    pub name: &'static str,
    pub request: Request,
    pub step: Step,
    pub call: Call,
    pub errno: Errno,
    /// What `check` must list afterwards (kinds), before any repair; `check --repair`
    /// must then say each was repaired, and leave the store consistent.
    pub left: &'static [&'static str],
    pub known_bug: Option<&'static str>,
}

pub fn fault_rows() -> Vec<FaultRow> {
    use Teardown::{Deferred, Inline};
    let fault = |name, request, step, call, errno| FaultRow {
        name,
        request,
        step,
        call,
        errno,
        left: &[],
        known_bug: None,
    };
    let classic = Request::named(Spec::fresh(PLAIN, Inline));
    let isolated = Request::named(Spec::fresh(PLAIN.on(Upper::Disk), Deferred));
    let memory = Request::named(Spec::fresh(PLAIN.on(Upper::Memory), Deferred));
    vec![
        fault(
            "create classic: overlay mount fails",
            classic,
            Step::Create,
            Call::NextMount,
            Errno::IO,
        ),
        fault(
            "create metacopy,volatile,deferred: overlay mount fails",
            Request::named(Spec::fresh(METACOPY_VOLATILE, Deferred)),
            Step::Create,
            Call::NextOverlayMount,
            Errno::NOMEM,
        ),
        fault(
            "create isolated: overlay mount fails over its own upper filesystem",
            isolated,
            Step::Create,
            Call::NextOverlayMount,
            Errno::IO,
        ),
        fault(
            "create isolated-memory: its tmpfs mount fails",
            memory,
            Step::Create,
            Call::NextMount,
            Errno::NOMEM,
        ),
        fault(
            "create shared-ro: the shared overlay mount fails",
            Request::named(Spec::shared_ro()),
            Step::Create,
            Call::NextMount,
            Errno::IO,
        ),
        fault(
            "create auto --disk-limit: overlay mount fails",
            Request::auto().limited(LIMIT),
            Step::Create,
            Call::NextOverlayMount,
            Errno::IO,
        ),
        fault(
            "mount classic after unmount: overlay mount fails",
            classic,
            Step::Mount,
            Call::NextMount,
            Errno::IO,
        ),
        fault(
            "mount classic --read-only after unmount: overlay mount fails",
            classic.read_only(),
            Step::Mount,
            Call::NextMount,
            Errno::IO,
        ),
        fault(
            "mount isolated after unmount: overlay mount fails",
            isolated,
            Step::Mount,
            Call::NextOverlayMount,
            Errno::IO,
        ),
        fault(
            "unmount volatile: syncfs reports a writeback error",
            Request::named(Spec::fresh(VOLATILE, Inline)),
            Step::Unmount,
            Call::NextSync,
            Errno::IO,
        ),
        fault(
            "delete classic: the rootfs is busy",
            classic,
            Step::Delete,
            Call::NextUnmount,
            Errno::BUSY,
        ),
        FaultRow {
            left: &["pending_delete"],
            ..fault(
                "reap classic,deferred: the rootfs is busy",
                Request::named(Spec::fresh(PLAIN, Deferred)),
                Step::Reap,
                Call::NextUnmount,
                Errno::BUSY,
            )
        },
        FaultRow {
            left: &["pending_delete"],
            ..fault(
                "reap isolated: the overlay on its own filesystem is busy",
                isolated,
                Step::Reap,
                Call::NextUnmount,
                Errno::BUSY,
            )
        },
        FaultRow {
            left: &["pending_delete"],
            ..fault(
                "reap shared-ro: the bind is busy",
                Request::named(Spec::shared_ro()),
                Step::Reap,
                Call::NextUnmount,
                Errno::BUSY,
            )
        },
        FaultRow {
            left: &["pending_delete"],
            ..fault(
                "clean finishing a deferred delete: the rootfs is busy",
                Request::named(Spec::fresh(METACOPY, Deferred)),
                Step::Clean,
                Call::NextUnmount,
                Errno::BUSY,
            )
        },
        fault(
            "pool fill pooled: a slot's overlay mount fails",
            Request::named(Spec::pooled(PLAIN, Inline)),
            Step::PoolFill,
            Call::NextMount,
            Errno::IO,
        ),
        fault(
            "pool fill pooled,isolated: a slot's overlay mount fails",
            Request::named(Spec::pooled(PLAIN.on(Upper::Disk), Deferred)),
            Step::PoolFill,
            Call::NextOverlayMount,
            Errno::IO,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows are generated from lamina's model; this holds them to it, so a table
    /// written by hand again would fail on the first model it leaves out.
    #[test]
    fn the_table_has_a_row_for_every_model_the_parser_names() {
        let rows = lifecycle_rows();
        let every = crate::adapter::every_named();
        assert!(every.len() > 40, "only {} models", every.len());
        for named in every {
            let (spec, read_only) = (named.spec, named.read_only);
            let covered = rows.iter().any(|row| {
                matches!(row.request.ask, Ask::Named(asked) if asked == spec)
                    && matches!(row.expect, Expect::Created { spec: s, read_only: r, .. } if s == spec && r == read_only)
            });
            assert!(covered, "no row for {spec:?} (read-only: {read_only})");
        }
    }
}
