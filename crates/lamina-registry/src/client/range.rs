//! Byte ranges of a blob (HTTP `Range`), for lazy pulling: an index read from a layer's
//! end, and the chunks a container reads, without the rest of the layer. A registry that
//! answers a range with the whole blob (200) does not serve ranges, and the caller pulls
//! the layer whole instead. The bytes are not checked here: the caller checks each chunk
//! against the digest its verified index gives.

use std::io::Read;

use crate::pace::{MinRate, read_failure};
use crate::{Client, RegistryError, redact};

/// The most one range may ask: a chunk or an index, never a layer.
pub const MAX_RANGE_BYTES: u64 = 64 << 20;

impl Client {
    /// Bytes `start..start + len` of blob `digest`, which its descriptor says is
    /// `blob_size` long. Refused before any request for an empty range, one past the
    /// blob's end or longer than [`MAX_RANGE_BYTES`]; an error for an answer that is not
    /// exactly that range (`206` with a matching `Content-Range`, `len` bytes).
    pub fn read_range(
        &self,
        digest: &str,
        blob_size: u64,
        start: u64,
        len: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        let what = format!("blob {digest} bytes {start}+{len}");
        if len == 0 || len > MAX_RANGE_BYTES {
            return Err(self.error(&format!("{what}: a range is 1 to {MAX_RANGE_BYTES} bytes")));
        }
        let end = start
            .checked_add(len)
            .filter(|end| *end <= blob_size)
            .ok_or_else(|| self.error(&format!("{what}: past the blob's {blob_size} bytes")))?;
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.repository);
        let response = self.get(&url, "*/*", true, Some((start, end - 1)))?;
        let status = response.status().as_u16();
        if status != 206 {
            return Err(self.error(&format!(
                "{what}: {} answered HTTP {status}, not a range (206): it does not serve ranges",
                redact::url(&url)
            )));
        }
        let content_range = response
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let expected = format!("bytes {start}-{}/", end - 1);
        let total = content_range.strip_prefix(&expected);
        if !total.is_some_and(|t| t == "*" || t == blob_size.to_string()) {
            return Err(self.error(&format!(
                "{what}: the registry answered Content-Range `{content_range}`"
            )));
        }
        let mut body = Vec::new();
        MinRate::new(
            response.into_body().into_reader(),
            self.options.stall_timeout,
        )
        .take(len + 1)
        .read_to_end(&mut body)
        .map_err(|e| {
            self.error(&format!(
                "reading {what}: {}",
                read_failure(&e, self.options.stall_timeout)
            ))
        })?;
        if body.len() as u64 != len {
            return Err(self.error(&format!("{what}: the registry sent {} bytes", body.len())));
        }
        Ok(body)
    }
}
