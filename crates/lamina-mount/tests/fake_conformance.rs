//! The strategy conformance suite (crates/lamina-conformance) against the fake mounter:
//! every row of the table, the pool cycle, every injected fault and the recovery cases,
//! without root. The same body runs on the real kernel in integration/tests/conformance.rs.

use lamina_conformance::{FakeRig, run};

#[test]
fn every_strategy_passes_the_conformance_suite_on_the_fake() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let rig = FakeRig::new(tmp.path());
    let report = run(&rig);
    let unmounted = report
        .passed
        .iter()
        .filter(|name| name.contains(" --without-mount ["))
        .count();
    assert!(unmounted > 40, "{unmounted} --without-mount rows passed");
    report.assert_passed();
}

/// The rows only a store on btrfs with quotas serves (`isolated-quota`), on a fake whose
/// store has quotas.
#[test]
fn the_quota_rows_pass_the_conformance_suite_on_a_fake_quota_store() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let rig = FakeRig::with_quotas(tmp.path());
    let report = run(&rig);
    assert!(
        report
            .passed
            .iter()
            .any(|name| name.contains("isolated-quota")),
        "no quota row ran: {report:?}"
    );
    report.assert_passed();
}
