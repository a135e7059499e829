//! `openssl::hash` as composefs uses it: a reusable hasher for one of three digests.

use sha2::Digest as _;

use crate::error::ErrorStack;

/// Which digest a [`Hasher`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageDigest(Kind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sha256,
    Sha384,
    Sha512,
}

impl MessageDigest {
    pub fn sha256() -> Self {
        Self(Kind::Sha256)
    }

    pub fn sha384() -> Self {
        Self(Kind::Sha384)
    }

    pub fn sha512() -> Self {
        Self(Kind::Sha512)
    }

    pub fn size(&self) -> usize {
        match self.0 {
            Kind::Sha256 => 32,
            Kind::Sha384 => 48,
            Kind::Sha512 => 64,
        }
    }
}

#[derive(Clone)]
enum State {
    Sha256(sha2::Sha256),
    Sha384(sha2::Sha384),
    Sha512(sha2::Sha512),
}

/// A running hash; [`Hasher::finish`] returns the digest and starts over, as OpenSSL's does.
#[derive(Clone)]
pub struct Hasher(State);

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hasher").finish_non_exhaustive()
    }
}

impl Hasher {
    pub fn new(digest: MessageDigest) -> Result<Self, ErrorStack> {
        Ok(Self(match digest.0 {
            Kind::Sha256 => State::Sha256(sha2::Sha256::new()),
            Kind::Sha384 => State::Sha384(sha2::Sha384::new()),
            Kind::Sha512 => State::Sha512(sha2::Sha512::new()),
        }))
    }

    pub fn update(&mut self, data: &[u8]) -> Result<(), ErrorStack> {
        match &mut self.0 {
            State::Sha256(h) => h.update(data),
            State::Sha384(h) => h.update(data),
            State::Sha512(h) => h.update(data),
        }
        Ok(())
    }

    pub fn finish(&mut self) -> Result<DigestBytes, ErrorStack> {
        let bytes = match &mut self.0 {
            State::Sha256(h) => h.finalize_reset().to_vec(),
            State::Sha384(h) => h.finalize_reset().to_vec(),
            State::Sha512(h) => h.finalize_reset().to_vec(),
        };
        Ok(DigestBytes(bytes))
    }
}

impl std::io::Write for Hasher {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.update(buf).map_err(std::io::Error::other)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A finished digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestBytes(Vec<u8>);

impl std::ops::Deref for DigestBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for DigestBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn digests_match_the_published_test_vectors_and_finish_starts_over() {
        let mut h = Hasher::new(MessageDigest::sha256()).unwrap();
        h.update(b"a").unwrap();
        h.update(b"bc").unwrap();
        assert_eq!(
            hex(&h.finish().unwrap()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        h.update(b"abc").unwrap();
        assert_eq!(
            hex(&h.finish().unwrap()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let mut h = Hasher::new(MessageDigest::sha384()).unwrap();
        h.update(b"abc").unwrap();
        assert_eq!(
            hex(&h.finish().unwrap()),
            "cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed\
             8086072ba1e7cc2358baeca134c825a7"
        );
        let mut h = Hasher::new(MessageDigest::sha512()).unwrap();
        h.update(b"abc").unwrap();
        assert_eq!(
            hex(&h.finish().unwrap()),
            "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
             2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"
        );
        assert_eq!(MessageDigest::sha384().size(), 48);
    }
}
