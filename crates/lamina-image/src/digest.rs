//! Content digests, hashing readers, and OCI chain IDs.

use std::fmt;
use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::ImageError;

/// A validated `sha256:<64 lowercase hex>` digest. Only sha256 is accepted: it is what
/// every image tool writes, and a strict parser keeps blob paths derived from a digest
/// from ever containing anything but hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

impl Digest {
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let shown = || crate::shown(s);
        let hex = s.strip_prefix("sha256:").ok_or_else(|| {
            ImageError::new(format!("digest `{}` is not a sha256 digest", shown()))
        })?;
        Self::from_hex(hex)
            .ok_or_else(|| ImageError::new(format!("digest `{}` is malformed", shown())))
    }

    pub fn from_hex(hex: &str) -> Option<Self> {
        let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| Self {
            hex: hex.to_string(),
        })
    }

    pub fn of(bytes: &[u8]) -> Self {
        Self {
            hex: hex::encode(Sha256::digest(bytes)),
        }
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// OCI chain IDs: the first is the first diffID, each next one is
/// `sha256(previous_chain_id + " " + diff_id)`. A chain ID names a layer together with
/// everything under it, so two images share a stored layer only when their stacks agree.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff_id in diff_ids {
        out.push(next_chain_id(out.last(), diff_id));
    }
    out
}

/// The chain ID of layer `diff_id` on top of the layer whose chain ID is `parent` (none
/// for a base layer).
pub fn next_chain_id(parent: Option<&Digest>, diff_id: &Digest) -> Digest {
    match parent {
        None => diff_id.clone(),
        Some(prev) => Digest::of(format!("{prev} {diff_id}").as_bytes()),
    }
}

/// Hashes and counts everything read through it, and refuses to read more than `limit`
/// bytes (a decompression bomb stops here, not when the disk is full).
#[derive(Debug)]
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
    limit: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        Self::with_limit(inner, u64::MAX)
    }

    pub fn with_limit(inner: R, limit: u64) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
            limit,
        }
    }

    /// Reads to the end, then returns the digest and byte count of everything read.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((
            Digest {
                hex: hex::encode(self.hasher.finalize()),
            },
            self.count,
        ))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        if self.count > self.limit {
            return Err(io::Error::other(format!(
                "stream exceeds the limit of {} bytes",
                self.limit
            )));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_is_strict() {
        let ok = format!("sha256:{}", "a".repeat(64));
        assert_eq!(Digest::parse(&ok).unwrap().to_string(), ok);
        for bad in [
            "sha512:aa",
            "sha256:../../etc",
            &format!("sha256:{}", "A".repeat(64)),
            "aa",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn chain_ids_follow_the_oci_definition() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], Digest::of(format!("{a} {b}").as_bytes()));
    }

    /// A chain of four, against values computed outside lamina (Python's hashlib, from
    /// the OCI image spec's definition): a chain that hashed the wrong predecessor, or
    /// the diff ID twice, differs from the third layer on.
    #[test]
    fn a_chain_of_four_matches_independently_computed_ids() {
        let diff_ids: Vec<Digest> = [b"a", b"b", b"c", b"d"]
            .iter()
            .map(|bytes| Digest::of(*bytes))
            .collect();
        let expected = [
            "sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb",
            "sha256:51c0c8ace48498d6f5fee6b0592cc06f2da0f3cbe09c5a34a97dce85c3889676",
            "sha256:2fce7f8ce91bcf0a1428b36e1024639fdbd9469eea762dba98aa749631885106",
            "sha256:06fbcbb60fe359170a9d90b2d31086f6677f54d88742cc992bff6403e12d943b",
        ];
        let chain: Vec<String> = chain_ids(&diff_ids)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(chain, expected);
    }

    #[test]
    fn hashing_reader_hashes_counts_and_limits() {
        let (d, n) = HashingReader::new(&b"hello"[..]).finish().unwrap();
        assert_eq!((d, n), (Digest::of(b"hello"), 5));
        assert!(
            HashingReader::with_limit(&b"hello"[..], 3)
                .finish()
                .is_err()
        );
    }
}
