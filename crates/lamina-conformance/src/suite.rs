//! The suite body, written once and run by every rig: each lifecycle row, the pool
//! cycle, each fault row and the recovery cases. A row that fails is recorded and tidied
//! away, so one report names every failing row.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::adapter::{self, Gone, Made};
use crate::rig::Rig;
use crate::table::{
    self, Expect, FaultRow, PLAIN, PoolSetup, Request, Row, Spec, Step, Teardown, Upper,
};

/// A file every image-backed rootfs shows (the sample image's base layer).
const IMAGE_FILE: &str = "etc/hosts";
const IMAGE_FILE_DATA: &[u8] = b"127.0.0.1 localhost\n";
/// What a row writes into a read-write rootfs.
const WRITTEN: &str = "conformance/written.txt";

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub rig: String,
    pub passed: Vec<String>,
    pub failed: Vec<(String, String)>,
    /// Rows marked with a known lamina bug that failed: (row, failure, bug).
    pub known_bugs: Vec<(String, String, &'static str)>,
    /// Rows marked with a known bug that passed: the mark is stale.
    pub unexpectedly_passed: Vec<String>,
    pub skipped: Vec<(String, &'static str)>,
    pub took: Duration,
}

impl Report {
    /// Fails the test naming every failing row; prints the tally either way.
    pub fn assert_passed(&self) {
        eprintln!(
            "conformance on {}: {} passed, {} failed, {} known lamina bugs, {} skipped, in {:.1?}",
            self.rig,
            self.passed.len(),
            self.failed.len(),
            self.known_bugs.len(),
            self.skipped.len(),
            self.took
        );
        for (row, why) in &self.skipped {
            eprintln!("  skipped: {row}: {why}");
        }
        for (row, failure, bug) in &self.known_bugs {
            eprintln!("  KNOWN LAMINA BUG: {row}: {bug}\n    {failure}");
        }
        let mut problems: Vec<String> = self
            .failed
            .iter()
            .map(|(row, why)| format!("FAILED {row}: {why}"))
            .collect();
        problems.extend(
            self.unexpectedly_passed
                .iter()
                .map(|row| format!("PASSED but marked as a known bug (remove the mark): {row}")),
        );
        assert!(
            problems.is_empty(),
            "conformance on {}:\n{}",
            self.rig,
            problems.join("\n")
        );
    }
}

/// Runs every case of the suite against `rig`.
pub fn run(rig: &dyn Rig) -> Report {
    let start = Instant::now();
    let mut report = Report {
        rig: rig.name().to_string(),
        ..Report::default()
    };
    // One import for every row: a container that is recorded and never mounted keeps
    // the image's layers in the store through each row's `clean`.
    adapter::create_unmounted(rig.store(), rig.mounter(), rig.image(), "pin")
        .unwrap_or_else(|e| panic!("{}: creating the pin container: {e}", rig.name()));

    // A quota store runs the rows only it serves; every other store runs the rest.
    let quota_store = rig.quota_store();
    for (n, row) in table::lifecycle_rows().iter().enumerate() {
        let id = format!("row{n}");
        if row.request.needs_quota_store() != quota_store {
            let why = match quota_store {
                true => "a quota store runs only the rows that need one",
                false => "needs a store on btrfs with quotas",
            };
            report.skipped.push((row.name.to_string(), why));
            continue;
        }
        record(&mut report, rig, row.name, row.known_bug, &id, || {
            lifecycle(rig, row, &id)
        });
    }
    // Each named row again for a caller that mounts the rootfs itself.
    for (n, row) in table::lifecycle_rows().iter().enumerate() {
        let plain_named = matches!(row.request.ask, table::Ask::Named(_))
            && !row.request.ephemeral
            && row.request.disk_limit.is_none()
            && matches!(row.expect, Expect::Created { .. });
        if !plain_named || row.request.needs_quota_store() != quota_store {
            continue;
        }
        let id = format!("unmounted{n}");
        let name = format!("{} --without-mount", row.name);
        record(&mut report, rig, &name, None, &id, || {
            without_mount(rig, row, &id)
        });
    }
    for (n, row) in table::fault_rows().iter().enumerate() {
        let id = format!("fault{n}");
        if quota_store {
            report.skipped.push((
                row.name.to_string(),
                "a quota store runs only the rows that need one",
            ));
            continue;
        }
        if !rig.can_inject(row.call) {
            report
                .skipped
                .push((row.name.to_string(), "this rig cannot inject that fault"));
            continue;
        }
        record(&mut report, rig, row.name, row.known_bug, &id, || {
            fault(rig, row, &id)
        });
    }
    // (name, body, needs an immutable file)
    type Case = (&'static str, fn(&dyn Rig, &str), bool);
    let cases: [Case; 4] = [
        (
            "pool: fill, claim, refill, drain, fill again",
            pool_cycle,
            false,
        ),
        (
            "clean keeps a pool's standing order when all its slots were claimed",
            clean_keeps_standing_order,
            false,
        ),
        (
            "check lists a pending delete; --repair repairs it and says so",
            pending_delete_is_listed_and_repaired,
            false,
        ),
        (
            "check --repair does not say repaired for a pending delete it could not remove (immutable file)",
            unremovable_pending_delete_is_not_repaired,
            true,
        ),
    ];
    for (n, (name, case, immutable)) in cases.into_iter().enumerate() {
        let id = format!("case{n}");
        if quota_store {
            report.skipped.push((
                name.to_string(),
                "a quota store runs only the rows that need one",
            ));
            continue;
        }
        if immutable && !rig.supports_immutable() {
            report
                .skipped
                .push((name.to_string(), "this rig cannot make a file immutable"));
            continue;
        }
        record(&mut report, rig, name, None, &id, || case(rig, &id));
    }

    // The pin goes last; then the store must be as empty as it began.
    let finished = catch_unwind(AssertUnwindSafe(|| {
        let store = rig.store();
        let m = rig.mounter();
        assert_eq!(adapter::delete(store, m, "pin").unwrap(), Gone::Removed);
        adapter::clean(store, m).unwrap();
        assert_clean(rig, "pin");
        assert_eq!(
            adapter::store_leftovers(store),
            Vec::<PathBuf>::new(),
            "layers, flattened trees, shared mounts, pools, containers or trash left"
        );
    }));
    if let Err(panic) = finished {
        report
            .failed
            .push(("final: store empty after the last row".into(), text(&panic)));
    }
    report.took = start.elapsed();
    report
}

fn record(
    report: &mut Report,
    rig: &dyn Rig,
    name: &str,
    known_bug: Option<&'static str>,
    id: &str,
    body: impl FnOnce(),
) {
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let name = format!("{name} [{id}]");
    match (outcome, known_bug) {
        (Ok(()), None) => report.passed.push(name),
        (Ok(()), Some(_)) => report.unexpectedly_passed.push(name),
        (Err(panic), bug) => {
            tidy(rig, id);
            match bug {
                Some(bug) => report.known_bugs.push((name, text(&panic), bug)),
                None => report.failed.push((name, text(&panic))),
            }
        }
    }
}

fn text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
}

/// After a failed row: take away whatever it left, so later rows start clean.
fn tidy(rig: &dyn Rig, id: &str) {
    let (store, m) = (rig.store(), rig.mounter());
    let _ = adapter::delete(store, m, id);
    let _ = adapter::reap(store, m);
    let _ = adapter::drain(store, m);
    let _ = adapter::clean(store, m);
    let _ = adapter::check(store, m, true);
}

/// The store holds nothing of container `id`, nothing is mounted under it, no trash, and
/// `check` finds nothing (and `--repair` claims to have repaired nothing).
fn assert_clean(rig: &dyn Rig, id: &str) {
    let (store, m) = (rig.store(), rig.mounter());
    assert!(!adapter::container_exists(store, id), "{id} still listed");
    let dir = adapter::container_dir(store, id);
    assert!(!dir.exists(), "{} is left", dir.display());
    assert_eq!(
        adapter::trash_entries(store),
        Vec::<PathBuf>::new(),
        "trash"
    );
    assert_eq!(
        rig.mounts_under_store(),
        Vec::<PathBuf>::new(),
        "mounts left"
    );
    let checked = adapter::check(store, m, false).unwrap();
    assert!(
        checked.ok && checked.problems.is_empty(),
        "check: {checked:?}"
    );
    let repaired = adapter::check(store, m, true).unwrap();
    assert!(
        repaired.ok && repaired.problems.is_empty(),
        "check --repair: {repaired:?}"
    );
}

fn fill(rig: &dyn Rig, setup: &PoolSetup, size: Option<usize>) -> (usize, usize) {
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    match setup {
        PoolSetup::None => (0, 0),
        PoolSetup::Overlays {
            flavour,
            disk_limit,
            ..
        } => adapter::fill_overlays(store, m, image, flavour, *disk_limit, size)
            .unwrap_or_else(|e| panic!("pool fill: {e}")),
        PoolSetup::Uppers { upper, .. } => adapter::fill_uppers(store, m, *upper, size)
            .unwrap_or_else(|e| panic!("pool fill: {e}")),
    }
}

fn pool_size(setup: &PoolSetup) -> usize {
    match setup {
        PoolSetup::None => 0,
        PoolSetup::Overlays { size, .. } | PoolSetup::Uppers { size, .. } => *size,
    }
}

/// create → write → unmount → mount (contents and read-only-ness kept) → delete →
/// reap → (pool refill, drain) → clean → check.
fn lifecycle(rig: &dyn Rig, row: &Row, id: &str) {
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    let size = pool_size(&row.pool);
    if row.pool != PoolSetup::None {
        assert_eq!(fill(rig, &row.pool, Some(size)), (size, size), "pool fill");
    }
    let created = adapter::create(store, m, image, id, &row.request);
    match row.expect {
        Expect::Refused(refusal) => {
            let err = created.expect_err("create was refused");
            assert_eq!(adapter::refusal(&err), Some(refusal), "{err}");
            assert!(!adapter::container_dir(store, id).exists(), "left a dir");
            if row.pool != PoolSetup::None {
                assert_eq!(adapter::drain(store, m).unwrap(), size, "drain");
            }
        }
        Expect::Created {
            spec,
            read_only,
            from_pool,
        } => {
            let made = created.unwrap_or_else(|e| panic!("create: {e}"));
            assert_eq!(made.spec, spec, "the strategy recorded");
            assert_eq!(made.read_only, read_only, "read-only recorded");
            assert_eq!(made.from_pool, from_pool, "claimed from a pool");
            use_and_remount(rig, &made);
            delete_and_reap(rig, id, spec.teardown);
            if row.pool != PoolSetup::None {
                let claimed = usize::from(from_pool);
                assert_eq!(fill(rig, &row.pool, None), (claimed, size), "refill");
                assert_eq!(adapter::drain(store, m).unwrap(), size, "drain");
            }
        }
    }
    adapter::clean(store, m).unwrap();
    assert_clean(rig, id);
}

/// A named row for a caller that mounts the rootfs itself: nothing mounted on the
/// rootfs, and attach answers what to mount — the overlay's options, the directory a
/// read-only provider binds, or (an overlay only lamina mounts: volatile, composefs) the
/// rootfs, mounted now. A named `pooled` is refused: its slots are mounted already.
fn without_mount(rig: &dyn Rig, row: &Row, id: &str) {
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    let Expect::Created {
        spec, read_only, ..
    } = row.expect
    else {
        return;
    };
    let created = adapter::create_without_mount(store, m, image, id, &row.request);
    if spec.provider == table::Provider::POOLED {
        let err = created.expect_err("a named pooled whose caller mounts is refused");
        assert_eq!(
            adapter::refusal(&err),
            Some(table::Refusal::PoolWithoutMount),
            "{err}"
        );
        assert!(!adapter::container_dir(store, id).exists(), "left a dir");
    } else {
        let made = created.unwrap_or_else(|e| panic!("create --without-mount: {e}"));
        assert_eq!(made.spec, spec, "the strategy recorded");
        assert!(
            !m.is_mountpoint(&made.rootfs).unwrap(),
            "the rootfs was mounted"
        );
        assert!(!adapter::recorded_mounted(store, id), "recorded as mounted");
        let lamina_mounts = spec.flavour.volatile || spec.flavour.composefs;
        match adapter::attach(store, m, id).unwrap_or_else(|e| panic!("attach: {e}")) {
            adapter::Attached::Bind(source, ro) => {
                assert_eq!(ro, read_only, "attach's read-only");
                if lamina_mounts {
                    assert_eq!(source, made.rootfs, "a bind of the rootfs lamina mounts");
                    assert!(m.is_mountpoint(&made.rootfs).unwrap(), "mounted by attach");
                } else {
                    assert!(
                        spec.provider != table::Provider::FRESH && source.starts_with(store.root()),
                        "a bind of {} for {spec:?}",
                        source.display()
                    );
                }
            }
            adapter::Attached::Overlay(options) => {
                // Any provider that mounts an overlay of the container's own (fresh, and
                // the ones generated rows name) answers its options.
                assert!(
                    !lamina_mounts
                        && !spec.provider.binds()
                        && spec.provider != table::Provider::POOLED,
                    "overlay options for {spec:?}"
                );
                assert!(
                    options.iter().any(|o| o.starts_with("lowerdir=")),
                    "{options:?}"
                );
            }
        }
        delete_and_reap(rig, id, spec.teardown);
    }
    adapter::clean(store, m).unwrap();
    assert_clean(rig, id);
}

/// Checks a freshly made container's rootfs, writes into it (read-write) or is refused
/// (read-only), unmounts and mounts it, and checks both held.
fn use_and_remount(rig: &dyn Rig, made: &Made) {
    let (store, m) = (rig.store(), rig.mounter());
    let id = made.id.as_str();
    assert!(m.is_mountpoint(&made.rootfs).unwrap(), "rootfs mounted");
    assert!(adapter::recorded_mounted(store, id), "recorded as mounted");
    assert_eq!(rig.read(made, IMAGE_FILE).unwrap(), IMAGE_FILE_DATA);
    assert_eq!(rig.is_read_only(made), made.read_only, "read-only rootfs");
    if made.read_only {
        assert!(rig.write(made, WRITTEN, id.as_bytes()).is_err(), "wrote");
    } else {
        rig.write(made, WRITTEN, id.as_bytes()).unwrap();
        assert_eq!(rig.read(made, WRITTEN).unwrap(), id.as_bytes());
    }

    adapter::unmount(store, m, id).unwrap_or_else(|e| panic!("unmount: {e}"));
    assert!(!m.is_mountpoint(&made.rootfs).unwrap(), "unmounted");
    assert!(!adapter::recorded_mounted(store, id), "recorded unmounted");
    adapter::mount(store, m, id).unwrap_or_else(|e| panic!("mount: {e}"));
    assert!(m.is_mountpoint(&made.rootfs).unwrap(), "mounted again");
    assert!(
        adapter::recorded_mounted(store, id),
        "recorded mounted again"
    );
    assert_eq!(
        rig.is_read_only(made),
        made.read_only,
        "read-only-ness after unmount + mount"
    );
    assert_eq!(rig.read(made, IMAGE_FILE).unwrap(), IMAGE_FILE_DATA);
    if !made.read_only {
        assert_eq!(
            rig.read(made, WRITTEN).unwrap(),
            id.as_bytes(),
            "a write survives unmount + mount"
        );
    }
    attach_stats_and_commit(rig, made);
}

/// What a caller that mounts for itself is told (lamina mounted this rootfs: a bind of
/// it), what the container uses, and which upper a commit would publish.
fn attach_stats_and_commit(rig: &dyn Rig, made: &Made) {
    let (store, m) = (rig.store(), rig.mounter());
    let id = made.id.as_str();
    assert_eq!(
        adapter::attach(store, m, id).unwrap_or_else(|e| panic!("attach: {e}")),
        adapter::Attached::Bind(made.rootfs.clone(), made.read_only),
        "attach of a rootfs lamina mounted"
    );
    let (total, exclusive) = adapter::usage(store, m, id).unwrap_or_else(|e| panic!("stats: {e}"));
    assert!(
        total >= exclusive,
        "stats: {total} total < {exclusive} written"
    );
    if made.read_only {
        return;
    }
    match adapter::upper_to_commit(store, m, id) {
        Ok(upper) => {
            assert_eq!(made.spec.flavour.upper, Upper::Store, "committable upper");
            assert_eq!(
                std::fs::read(upper.join(WRITTEN)).unwrap(),
                id.as_bytes(),
                "the upper a commit publishes holds the container's write"
            );
        }
        Err(e) => assert!(
            adapter::upper_not_committable(&e) && made.spec.flavour.upper != Upper::Store,
            "commit of an upper on the store's filesystem: {e}"
        ),
    }
}

fn delete_and_reap(rig: &dyn Rig, id: &str, teardown: Teardown) {
    let (store, m) = (rig.store(), rig.mounter());
    let gone = adapter::delete(store, m, id).unwrap_or_else(|e| panic!("delete: {e}"));
    assert!(!adapter::container_exists(store, id), "listed after delete");
    match teardown {
        Teardown::Inline => {
            assert_eq!(gone, Gone::Removed, "inline delete");
            assert!(!adapter::container_dir(store, id).exists());
            assert_eq!(adapter::reap(store, m).unwrap(), (0, 0), "nothing to reap");
        }
        Teardown::Deferred => {
            assert_eq!(gone, Gone::Deferred, "deferred delete");
            assert_eq!(adapter::trash_entries(store).len(), 1, "queued in trash");
            assert_eq!(adapter::reap(store, m).unwrap(), (1, 0), "reaped");
        }
    }
    assert_eq!(adapter::trash_entries(store), Vec::<PathBuf>::new());
    assert_eq!(adapter::delete(store, m, id).unwrap(), Gone::NotFound);
}

/// Each fault row: the step fails with an error, leaves no half-made container or mount,
/// `check` lists exactly `row.left`, and the container (if any) still goes cleanly.
fn fault(rig: &dyn Rig, row: &FaultRow, id: &str) {
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    let arm = || assert!(rig.inject(row.call, row.errno), "arming {:?}", row.call);
    let mut made = None;
    match row.step {
        Step::Create => {
            arm();
            let err = adapter::create(store, m, image, id, &row.request).expect_err("create fails");
            assert_eq!(adapter::refusal(&err), None, "{err}");
            assert!(!adapter::container_exists(store, id));
            assert!(!adapter::container_dir(store, id).exists(), "half-made dir");
        }
        Step::PoolFill => {
            let table::Ask::Named(Spec { flavour, .. }) = row.request.ask else {
                panic!("a pool fault row names its flavour")
            };
            arm();
            let filled = adapter::fill_overlays(store, m, image, &flavour, None, Some(2));
            assert!(filled.is_err(), "pool fill fails: {filled:?}");
        }
        Step::Mount | Step::Unmount | Step::Delete | Step::Reap | Step::Clean => {
            let c = adapter::create(store, m, image, id, &row.request)
                .unwrap_or_else(|e| panic!("setting up: create: {e}"));
            if !c.read_only {
                rig.write(&c, WRITTEN, id.as_bytes()).unwrap();
            }
            match row.step {
                Step::Mount => {
                    adapter::unmount(store, m, id).unwrap();
                    arm();
                    assert!(adapter::mount(store, m, id).is_err(), "mount fails");
                }
                Step::Unmount => {
                    arm();
                    assert!(adapter::unmount(store, m, id).is_err(), "unmount fails");
                }
                Step::Delete => {
                    arm();
                    assert!(adapter::delete(store, m, id).is_err(), "delete fails");
                }
                Step::Reap => {
                    assert_eq!(adapter::delete(store, m, id).unwrap(), Gone::Deferred);
                    arm();
                    // The reaper logs what it cannot tear down and leaves it queued.
                    assert_eq!(adapter::reap(store, m).unwrap(), (0, 1), "reap");
                    assert_eq!(adapter::trash_entries(store).len(), 1, "still queued");
                }
                _ => {
                    assert_eq!(adapter::delete(store, m, id).unwrap(), Gone::Deferred);
                    arm();
                    // Like the reaper, clean logs what it cannot tear down.
                    adapter::clean(store, m).unwrap_or_else(|e| panic!("clean: {e}"));
                    assert_eq!(adapter::trash_entries(store).len(), 1, "still queued");
                }
            }
            match row.step {
                Step::Mount | Step::Unmount => {
                    assert!(!m.is_mountpoint(&c.rootfs).unwrap(), "rootfs mounted");
                    assert!(!adapter::recorded_mounted(store, id), "recorded mounted");
                }
                Step::Delete => {
                    // Nothing of it went: still listed, mounted, and its writes there.
                    assert!(adapter::container_exists(store, id), "still listed");
                    assert!(m.is_mountpoint(&c.rootfs).unwrap(), "still mounted");
                    assert!(adapter::recorded_mounted(store, id), "recorded mounted");
                    assert_eq!(rig.read(&c, WRITTEN).unwrap(), id.as_bytes());
                }
                _ => {}
            }
            if !matches!(row.step, Step::Reap | Step::Clean) {
                made = Some(c);
            }
        }
    }
    if matches!(row.step, Step::Create | Step::PoolFill) {
        assert_eq!(
            rig.mounts_under_store(),
            Vec::<PathBuf>::new(),
            "half-made mounts"
        );
    }
    let checked = adapter::check(store, m, false).unwrap();
    let kinds: Vec<&str> = checked.problems.iter().map(|p| p.kind.as_str()).collect();
    assert_eq!(kinds, row.left, "check lists what is left: {checked:?}");
    assert!(checked.problems.iter().all(|p| !p.repaired));
    assert_eq!(checked.ok, row.left.is_empty(), "{checked:?}");
    if !row.left.is_empty() {
        // The fault is spent: a repair fixes each and says so.
        let repaired = adapter::check(store, m, true).unwrap();
        let found: Vec<(&str, bool)> = repaired
            .problems
            .iter()
            .map(|p| (p.kind.as_str(), p.repaired))
            .collect();
        let expected: Vec<(&str, bool)> = row.left.iter().map(|k| (*k, true)).collect();
        assert_eq!(found, expected, "check --repair: {repaired:?}");
        assert!(repaired.ok, "{repaired:?}");
    }

    // What is left still works: a failed mount can be retried, and everything goes.
    if let Some(made) = &made {
        if row.step == Step::Mount {
            adapter::mount(store, m, id).unwrap_or_else(|e| panic!("mount again: {e}"));
            assert_eq!(rig.is_read_only(made), made.read_only);
            if !made.read_only {
                assert_eq!(rig.read(made, WRITTEN).unwrap(), id.as_bytes());
            }
        }
        delete_and_reap(rig, id, made.spec.teardown);
    }
    let _ = adapter::drain(store, m);
    adapter::clean(store, m).unwrap();
    assert_clean(rig, id);
}

/// Pool fill, claim, refill, drain and fill again, for each read-write flavour.
fn pool_cycle(rig: &dyn Rig, id: &str) {
    use table::{METACOPY, METACOPY_VOLATILE, Upper, VOLATILE};
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    for flavour in [
        PLAIN,
        METACOPY,
        VOLATILE,
        METACOPY_VOLATILE,
        PLAIN.on(Upper::Disk),
        VOLATILE.on(Upper::Memory),
    ] {
        let fill = |size| {
            adapter::fill_overlays(store, m, image, &flavour, None, size)
                .unwrap_or_else(|e| panic!("{flavour:?}: pool fill: {e}"))
        };
        assert_eq!(fill(Some(2)), (2, 2), "{flavour:?}: fill");
        assert_eq!(fill(Some(2)), (0, 2), "{flavour:?}: a full pool");
        let teardown = if flavour.upper == Upper::Store {
            Teardown::Inline
        } else {
            Teardown::Deferred
        };
        let spec = Spec::pooled(flavour, teardown);
        let made = adapter::create(store, m, image, id, &Request::named(spec))
            .unwrap_or_else(|e| panic!("{flavour:?}: claim: {e}"));
        assert!(made.from_pool, "{flavour:?}: claimed");
        assert_eq!(made.spec, spec, "{flavour:?}");
        use_and_remount(rig, &made);
        assert_eq!(
            fill(None),
            (1, 2),
            "{flavour:?}: refill to the standing order"
        );
        delete_and_reap(rig, id, teardown);
        assert_eq!(adapter::drain(store, m).unwrap(), 2, "{flavour:?}: drain");
        assert_eq!(fill(None), (0, 0), "{flavour:?}: drain cancels the order");
        assert_eq!(fill(Some(1)), (1, 1), "{flavour:?}: fill again");
        assert_eq!(adapter::drain(store, m).unwrap(), 1, "{flavour:?}: drain");
        adapter::clean(store, m).unwrap();
        assert_clean(rig, id);
    }
}

/// Guard: `clean` keeps a pool's standing order when every slot was claimed.
fn clean_keeps_standing_order(rig: &dyn Rig, id: &str) {
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    let fill = |size| adapter::fill_overlays(store, m, image, &PLAIN, None, size).unwrap();
    assert_eq!(fill(Some(1)), (1, 1));
    let spec = Spec::pooled(PLAIN, Teardown::Inline);
    let made = adapter::create(store, m, image, id, &Request::named(spec)).unwrap();
    assert!(made.from_pool);
    adapter::clean(store, m).unwrap();
    assert_eq!(fill(None), (1, 1), "the standing order survived clean");
    delete_and_reap(rig, id, Teardown::Inline);
    assert_eq!(adapter::drain(store, m).unwrap(), 1);
    adapter::clean(store, m).unwrap();
    assert_clean(rig, id);
}

/// A deferred delete nobody reaped: `check` lists exactly it, unrepaired; `--repair`
/// reaps it and says repaired.
fn pending_delete_is_listed_and_repaired(rig: &dyn Rig, id: &str) {
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    let spec = Spec::fresh(PLAIN, Teardown::Deferred);
    let made = adapter::create(store, m, image, id, &Request::named(spec)).unwrap();
    rig.write(&made, WRITTEN, b"x").unwrap();
    assert_eq!(adapter::delete(store, m, id).unwrap(), Gone::Deferred);
    let checked = adapter::check(store, m, false).unwrap();
    assert!(!checked.ok, "{checked:?}");
    let found = kinds(&checked);
    assert_eq!(found, [("pending_delete", false)], "{checked:?}");
    let repaired = adapter::check(store, m, true).unwrap();
    let found = kinds(&repaired);
    assert_eq!(found, [("pending_delete", true)], "{repaired:?}");
    assert!(repaired.ok);
    adapter::clean(store, m).unwrap();
    assert_clean(rig, id);
}

/// Clears the immutable flag of whatever it names when dropped, so a failing row leaves
/// nothing the scratch filesystem's teardown cannot remove.
struct Unpin<'a> {
    rig: &'a dyn Rig,
    paths: Vec<PathBuf>,
}

impl Drop for Unpin<'_> {
    fn drop(&mut self) {
        for path in &self.paths {
            self.rig.set_immutable(path, false);
        }
    }
}

/// Guard: `check --repair` does not say repaired for a pending delete whose trash entry
/// survives the reaper (an immutable file in its upper).
fn unremovable_pending_delete_is_not_repaired(rig: &dyn Rig, id: &str) {
    let (store, m, image) = (rig.store(), rig.mounter(), rig.image());
    let spec = Spec::fresh(PLAIN, Teardown::Deferred);
    let made = adapter::create(store, m, image, id, &Request::named(spec)).unwrap();
    rig.write(&made, WRITTEN, b"pinned").unwrap();
    let pinned = adapter::in_upper(&adapter::container_dir(store, id), WRITTEN);
    let mut unpin = Unpin {
        rig,
        paths: vec![pinned.clone()],
    };
    assert!(rig.set_immutable(&pinned, true), "chattr +i");
    assert_eq!(adapter::delete(store, m, id).unwrap(), Gone::Deferred);
    let trashed = adapter::trash_entries(store);
    assert_eq!(trashed.len(), 1);
    let pinned_in_trash = adapter::in_upper(&trashed[0], WRITTEN);
    unpin.paths.push(pinned_in_trash.clone());
    assert_eq!(adapter::reap(store, m).unwrap(), (0, 1), "the reaper fails");

    let repaired = adapter::check(store, m, true).unwrap();
    let found = kinds(&repaired);
    assert_eq!(found, [("pending_delete", false)], "{repaired:?}");
    assert!(!repaired.ok);

    rig.set_immutable(&pinned_in_trash, false);
    drop(unpin);
    let repaired = adapter::check(store, m, true).unwrap();
    assert!(repaired.ok, "{repaired:?}");
    adapter::clean(store, m).unwrap();
    assert_clean(rig, id);
}

/// What `check` found, as (problem kind, repaired) pairs.
fn kinds(checked: &adapter::Checked) -> Vec<(&str, bool)> {
    checked
        .problems
        .iter()
        .map(|p| (p.kind.as_str(), p.repaired))
        .collect()
}
