//! lamina's strategy conformance suite, in the spirit of containerd's snapshotter
//! testsuite: one table of every valid provider × flavour × teardown (and `auto` with
//! each kind of request), each row run through create → write → unmount → mount →
//! delete → reap → clean → check, plus pool cycles, injected faults and recovery cases.
//!
//! The body ([`suite::run`]) is written once, against a [`rig::Rig`]: the fake mounter
//! (`crates/lamina-mount/tests/fake_conformance.rs`, no root) or the real kernel on
//! loop-backed ext4 and xfs (`integration/tests/conformance.rs`, root). Only
//! [`adapter`] touches lamina's strategy and lifecycle API.

// A conformance check fails loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

pub mod adapter;
pub mod rig;
pub mod suite;
pub mod table;

pub use rig::{FakeRig, RealRig, Rig};
pub use suite::{Report, run};
