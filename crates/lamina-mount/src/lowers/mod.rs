//! What an overlay's lowers are: the image's layer directories (`plan`), or its composefs
//! metadata image over the store's objects (`composefs`).

pub mod composefs;
pub mod plan;
