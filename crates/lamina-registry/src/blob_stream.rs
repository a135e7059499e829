//! A blob's HTTP body held to its descriptor: exactly `size` bytes, no more and no fewer.
//! A registry (or a man in the middle of a plain-HTTP one) decides how long a body is; the
//! manifest, which the digest pins, decides how long it should be. Without this bound an
//! endless body is read for as long as it lasts (the importer drains a blob to hash it),
//! and a body that stops sending is waited for without end.
//!
//! Every error here is one line naming the blob's digest and where it came from.

use std::io::{self, Read};
use std::time::Duration;

use crate::pace::too_slow;
use crate::redact;

/// Reads blob `digest` from `inner`, failing once the body runs past `size` bytes, ends
/// before it, stalls for the transport's per-read timeout, or (`inner` being a
/// [`crate::pace::MinRate`]) comes too slowly.
pub(crate) struct BlobStream<R> {
    inner: R,
    digest: String,
    /// `registry HOST` or a non-distributable layer's URL (redacted and bounded).
    from: String,
    size: u64,
    read: u64,
    /// How long a read may make no progress (the agent's per-read timeout), for messages.
    stall: Duration,
}

impl<R: Read> BlobStream<R> {
    pub(crate) fn new(inner: R, digest: &str, from: String, size: u64, stall: Duration) -> Self {
        Self {
            inner,
            digest: digest.to_string(),
            from,
            size,
            read: 0,
            stall,
        }
    }

    fn fail(&self, kind: io::ErrorKind, what: String) -> io::Error {
        io::Error::new(
            kind,
            format!("blob {} from {}: {what}", self.digest, self.from),
        )
    }

    /// A transport error, named; a timeout says the registry stalled, a body under the
    /// minimum rate that it was too slow.
    fn failed_read(&self, e: io::Error) -> io::Error {
        if let Some(slow) = too_slow(&e) {
            return self.fail(
                io::ErrorKind::TimedOut,
                format!("{slow}; {} of {} bytes read", self.read, self.size),
            );
        }
        if is_timeout(&e) {
            return self.fail(
                io::ErrorKind::TimedOut,
                format!(
                    "no data for {} s after {} of {} bytes: the registry stalled \
                     (--registry-timeout-seconds)",
                    self.stall.as_secs_f64(),
                    self.read,
                    self.size
                ),
            );
        }
        io::Error::new(
            e.kind(),
            format!(
                "blob {}: reading from {}: {}",
                self.digest,
                self.from,
                redact::text(&e.to_string())
            ),
        )
    }
}

impl<R: Read> Read for BlobStream<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let remaining = self.size - self.read;
        if remaining == 0 {
            // All the descriptor's bytes are in; the body must end here. One probe byte
            // tells an honest end from a body that goes on.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe) {
                Ok(0) => Ok(0),
                Ok(_) => Err(self.fail(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the body runs past the {} bytes its descriptor declares",
                        self.size
                    ),
                )),
                Err(e) => Err(self.failed_read(e)),
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(remaining).unwrap_or(usize::MAX));
        match self.inner.read(&mut buf[..want]) {
            Ok(0) => Err(self.fail(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the body ended after {} of the {} bytes its descriptor declares",
                    self.read, self.size
                ),
            )),
            Ok(n) => {
                self.read += n as u64;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => Err(self.failed_read(e)),
        }
    }
}

/// Whether a read failed because the transport's timeout ran out. ureq reports its own
/// timeouts as an `ureq::Error` inside the `io::Error`.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    if matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    ) {
        return true;
    }
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(|inner| matches!(inner, ureq::Error::Timeout(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:0123";

    fn stream(body: impl Read, size: u64) -> BlobStream<impl Read> {
        BlobStream::new(
            body,
            DIGEST,
            "registry 127.0.0.1:5000".into(),
            size,
            Duration::from_secs(60),
        )
    }

    fn read_all(mut r: impl Read) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        r.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn a_body_of_the_declared_size_reads_whole() {
        assert_eq!(read_all(stream(&b"hello"[..], 5)).unwrap(), b"hello");
        assert_eq!(read_all(stream(&b""[..], 0)).unwrap(), b"");
    }

    #[test]
    fn an_endless_body_fails_one_byte_past_the_declared_size() {
        let mut endless = stream(io::repeat(b'x'), 29);
        let mut out = Vec::new();
        let err = endless.read_to_end(&mut out).unwrap_err().to_string();
        assert_eq!(out.len(), 29, "nothing past the declared size is handed on");
        assert!(
            err.contains(DIGEST) && err.contains("127.0.0.1:5000"),
            "{err}"
        );
        assert!(err.contains("runs past the 29 bytes"), "{err}");
    }

    #[test]
    fn a_short_body_fails_naming_how_far_it_got() {
        let err = read_all(stream(&b"0123456789"[..], 29))
            .unwrap_err()
            .to_string();
        assert!(err.contains(DIGEST), "{err}");
        assert!(err.contains("ended after 10 of the 29 bytes"), "{err}");
    }

    /// Ten bytes, then the transport's per-read timeout.
    struct Stalls(bool);

    impl Read for Stalls {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if std::mem::replace(&mut self.0, true) {
                return Err(io::Error::other(ureq::Error::Timeout(
                    ureq::Timeout::PerRead,
                )));
            }
            buf[..10].copy_from_slice(b"0123456789");
            Ok(10)
        }
    }

    #[test]
    fn a_broken_connection_says_where_the_bytes_came_from() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "Peer disconnected",
                ))
            }
        }
        let err = read_all(stream(Broken, 29)).unwrap_err().to_string();
        assert!(
            err.contains("reading from registry 127.0.0.1:5000: Peer disconnected"),
            "{err}"
        );
        assert!(err.contains(DIGEST), "{err}");
    }

    #[test]
    fn a_body_under_the_minimum_rate_is_too_slow_naming_the_blob() {
        /// One byte every 20 ms: a 50 ms window wants 52.
        struct Drip;
        impl Read for Drip {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                std::thread::sleep(Duration::from_millis(20));
                buf[0] = b'x';
                Ok(1)
            }
        }
        let slow = crate::pace::MinRate::new(Drip, Duration::from_millis(50));
        let err = read_all(stream(slow, 29)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let err = err.to_string();
        let prefix = format!("blob {DIGEST} from registry 127.0.0.1:5000: too slow: ");
        assert!(err.starts_with(&prefix), "{err}");
        assert!(err.contains(" of 29 bytes read"), "{err}");
    }

    #[test]
    fn a_stalled_body_is_a_timeout_naming_the_blob() {
        let err = read_all(stream(Stalls(false), 29)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let err = err.to_string();
        assert!(
            err.contains(DIGEST) && err.contains("127.0.0.1:5000"),
            "{err}"
        );
        assert!(
            err.contains("stalled") && err.contains("after 10 of 29"),
            "{err}"
        );
    }
}
