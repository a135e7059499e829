//! A layer's chunks from its registry: each member a byte range of the layer's blob,
//! through the client's authentication, retries and timeouts (`Client::read_range`).

use std::io;

use lamina_registry::Client;

use crate::ChunkSource;

/// Blob `digest` (`size` bytes by its descriptor) of the repository `client` speaks to.
#[derive(Debug)]
pub struct RegistryBlob {
    pub client: Client,
    pub digest: String,
    pub size: u64,
}

impl ChunkSource for RegistryBlob {
    fn fetch(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
        let len = end
            .checked_sub(start)
            .ok_or_else(|| io::Error::other("a member that ends before it starts"))?;
        self.client
            .read_range(&self.digest, self.size, start, len)
            .map_err(io::Error::other)
    }
}
