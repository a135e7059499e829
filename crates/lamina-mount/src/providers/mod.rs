//! The providers: how a container's rootfs comes to exist. One module each; the
//! dispatch from a [`crate::Provider`] to its module is in this file.

pub mod direct;
pub mod pooled;
pub mod shared_ro;
