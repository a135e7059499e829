//! The lifecycle steps the front-ends call, one function each: create, attach, mount and
//! unmount, stats, delete and reap, init and delete a store.

pub mod attach;
pub mod attach_cache;
pub mod create;
pub mod delete;
pub mod delete_store;
pub mod init_store;
pub(crate) mod one_step;
pub mod reap;
pub mod remount;
pub mod stats;
