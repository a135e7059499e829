//! What no container needs any more: `clean` (finish what crashes left, collect unused
//! layers, shared mounts, pool slots and composefs objects) and `check`.

pub mod check;
pub mod clean;
pub(crate) mod collect;
pub(crate) mod composefs_collect;
pub(crate) mod composefs_verify;
pub(crate) mod layer_verify;
