//! Garden's `stats`: what one container uses, and its disk limit. It runs holding the
//! container's ID, like every other step on it, so it never measures a container a
//! create is still making or a delete is taking apart.

use lamina_store::{ContainerUsage, Store};
use serde::Serialize;

use crate::RootfsError;
use crate::one_step::holding_id;
use crate::record;

/// `{"disk_usage":{...}}`, with `quota_size_bytes` when the container has a disk limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stats {
    pub disk_usage: ContainerUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_size_bytes: Option<u64>,
}

/// What container `id` uses: the image's layers plus what it wrote, which is its upper
/// wherever its model put it (its own filesystem, for an isolated upper).
pub fn stats(store: &Store, id: &str) -> Result<Stats, RootfsError> {
    lamina_store::validate_id(id)?;
    holding_id(store, id, || {
        let container = record::read(store, id)?;
        let upper = container.dirs(store).upper;
        Ok(Stats {
            disk_usage: store.container_usage(&container.record, &upper)?,
            quota_size_bytes: container.record.disk_limit.map(|limit| limit.bytes),
        })
    })
}
