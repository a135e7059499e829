//! `stats` and `capacity`: Garden's questions about disk, answered in GrootFS's JSON.

use lamina_store::{ContainerUsage, Store};
use serde::Serialize;

/// `{"disk_usage":{...}}`, with `quota_size_bytes` when the container has a disk limit.
#[derive(Debug, Serialize)]
pub struct Stats {
    pub disk_usage: ContainerUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_size_bytes: Option<u64>,
}

pub fn of(store: &Store, id: &str) -> anyhow::Result<Stats> {
    let record = store.record(id)?;
    Ok(Stats {
        disk_usage: store.container_usage(&record)?,
        quota_size_bytes: record.disk_limit.map(|limit| limit.bytes),
    })
}

/// The configured size, else what `init-store` recorded, else the store filesystem's.
pub fn capacity(store: &Store, configured: Option<u64>) -> anyhow::Result<u64> {
    if let Some(bytes) = configured.or(store.properties().store_size_bytes) {
        return Ok(bytes);
    }
    Ok(store.filesystem_size()?)
}
