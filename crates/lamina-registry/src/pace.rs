//! A floor under how fast a registry sends. The stall timeout (ureq's per-read timeout)
//! restarts on every byte, so a registry that drips one byte a second never trips it and
//! holds the pull, and for a layer its store lock, for as long as it likes. As with curl's
//! `--speed-limit`/`--speed-time`, each window of `--registry-timeout-seconds` must bring
//! [`MIN_RATE`] bytes a second's worth, or the read fails.
//!
//! A window starts at the first read and ends as soon as its quota is in; the next one
//! starts then. A window that runs out first fails the next read, at once; the read that
//! finds it so waits at most the stall timeout, so a dripping body fails within two
//! windows.

use std::fmt;
use std::io::{self, Read};
use std::time::{Duration, Instant};

use crate::blob_stream::is_timeout;
use crate::redact;

/// The slowest a registry may send a body (bytes a second, averaged over a window of
/// `--registry-timeout-seconds`). Low enough that no working link comes near it; high
/// enough that a drip of a few bytes a second fails in seconds, not days.
pub const MIN_RATE: u64 = 1024;

/// Reads `inner`, failing with [`TooSlow`] when a window brings less than its quota.
pub(crate) struct MinRate<R> {
    inner: R,
    window: Duration,
    quota: u64,
    /// When the current window began; `None` until the first read, so time the caller
    /// spends before reading is not held against the registry.
    began: Option<Instant>,
    /// Bytes the current window has brought.
    got: u64,
    /// The window that ran out, reported at the next read: the bytes of the read that
    /// found it were handed on, so counts stay true.
    short: Option<TooSlow>,
}

impl<R: Read> MinRate<R> {
    pub(crate) fn new(inner: R, window: Duration) -> Self {
        let quota = (MIN_RATE as f64 * window.as_secs_f64()).ceil() as u64;
        Self {
            inner,
            window,
            quota: quota.max(1),
            began: None,
            got: 0,
            short: None,
        }
    }
}

impl<R: Read> Read for MinRate<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(short) = self.short.take() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, short));
        }
        let began = *self.began.get_or_insert_with(Instant::now);
        let n = self.inner.read(buf)?;
        if n == 0 {
            return Ok(0); // the body ended: nothing more to wait for
        }
        self.got += n as u64;
        if self.got >= self.quota {
            self.began = Some(Instant::now());
            self.got = 0;
        } else if began.elapsed() >= self.window {
            self.short = Some(TooSlow {
                got: self.got,
                window: self.window,
            });
        }
        Ok(n)
    }
}

/// A window that brought less than its quota.
#[derive(Debug)]
pub(crate) struct TooSlow {
    got: u64,
    window: Duration,
}

impl fmt::Display for TooSlow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "too slow: {} bytes in {} s, under the minimum of {MIN_RATE} bytes/s \
             (--registry-timeout-seconds)",
            self.got,
            self.window.as_secs_f64()
        )
    }
}

impl std::error::Error for TooSlow {}

/// The [`TooSlow`] inside a read error, if that is why it failed.
pub(crate) fn too_slow(e: &io::Error) -> Option<&TooSlow> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<TooSlow>())
}

/// Why reading a document or token failed, for a one-line error: too slow, stalled for
/// `stall`, or the transport's own words with any URL's query hidden.
pub(crate) fn read_failure(e: &io::Error, stall: Duration) -> String {
    if let Some(slow) = too_slow(e) {
        return slow.to_string();
    }
    if is_timeout(e) {
        return format!(
            "no data for {} s: the registry stalled (--registry-timeout-seconds)",
            stall.as_secs_f64()
        );
    }
    redact::text(&e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One byte per read, each after `pause`.
    struct Drip(Duration);

    impl Read for Drip {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            std::thread::sleep(self.0);
            buf[0] = b'x';
            Ok(1)
        }
    }

    #[test]
    fn a_drip_fails_once_a_window_passes_short_of_its_quota() {
        // A 50 ms window wants 52 bytes; one byte every 20 ms can never bring them.
        let mut slow = MinRate::new(Drip(Duration::from_millis(20)), Duration::from_millis(50));
        let mut out = Vec::new();
        let err = slow.read_to_end(&mut out).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(too_slow(&err).is_some(), "{err}");
        assert!(out.len() < 52, "{} bytes", out.len());
        let text = read_failure(&err, Duration::from_millis(50));
        assert!(text.starts_with("too slow: "), "{text}");
        assert!(text.contains("under the minimum of 1024 bytes/s"), "{text}");
    }

    #[test]
    fn a_fast_body_and_an_ended_one_read_whole() {
        // Every read of a full buffer meets the quota, so no window can run out.
        let mut fast = MinRate::new(io::repeat(b'x').take(1 << 20), Duration::from_millis(1));
        let mut out = Vec::new();
        fast.read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), 1 << 20);
        let mut short = MinRate::new(&b"tiny"[..], Duration::from_secs(60));
        out.clear();
        short.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"tiny");
    }
}
