//! What a server fetched of one lazy layer's blob, kept so completion fetches only the
//! rest: every byte range a read (or the index) brought, written at its offset into a
//! sparse `blob.part` in the server's own copies directory, and the ranges in memory.
//! Completion fills the gaps (byte ranges, [`FILL_PIECE`] at a time), then hashes the
//! whole file against the manifest's digest before anything of it is trusted.
//!
//! Invariant: a range is listed only after its bytes were written whole, so a listed
//! range always holds what the registry served for it (which the digest then checks).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The most one request of a completion's fill asks for: bounds its memory.
pub const FILL_PIECE: u64 = 8 << 20;

/// A blob's fetched byte ranges, and their bytes on disk.
#[derive(Debug)]
pub struct Fetched {
    path: PathBuf,
    file: File,
    size: u64,
    /// Start → end, disjoint and not touching (merged as they come); `None` once
    /// [`Fetched::discard`]ed.
    ranges: Mutex<Option<BTreeMap<u64, u64>>>,
    /// Nothing more is written once set: what a completion hashed is what it imports.
    sealed: std::sync::atomic::AtomicBool,
}

impl Fetched {
    /// An empty record of a `size`-byte blob, its bytes to go to `path` (made `0600`).
    pub fn create(path: &Path, size: u64) -> io::Result<Fetched> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = File::options()
            .create_new(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(path)?;
        file.set_len(size)?;
        Ok(Fetched {
            path: path.to_path_buf(),
            file,
            size,
            ranges: Mutex::new(Some(BTreeMap::new())),
            sealed: Default::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps `bytes`, fetched from `start`, unless sealed. Bytes past the blob's end are
    /// not kept.
    pub fn record(&self, start: u64, bytes: &[u8]) -> io::Result<()> {
        self.keep(start, bytes, false)
    }

    /// Writes `bytes` at `start` and lists the range: not once discarded, nor once sealed
    /// unless `past_seal` (a completion's own fill, which comes before its seal).
    fn keep(&self, start: u64, bytes: &[u8], past_seal: bool) -> io::Result<()> {
        let end = start.saturating_add(bytes.len() as u64).min(self.size);
        if end <= start {
            return Ok(());
        }
        // Held while writing: a discard or a seal waits, and nothing is written after it.
        let mut ranges = self.ranges.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(ranges) = ranges.as_mut() else {
            return Ok(());
        };
        if !past_seal && self.sealed.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        self.file
            .write_all_at(&bytes[..(end - start) as usize], start)?;
        insert(ranges, start, end);
        Ok(())
    }

    /// Writes nothing more (a completion's reads and the import follow); gaps are
    /// filled by [`Fetched::fill`] first. Waits for a write in progress.
    pub fn seal(&self) {
        let _ranges = self.ranges.lock().unwrap_or_else(PoisonError::into_inner);
        self.sealed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Lets the bytes go (the layer is whole): the file is emptied and removed, and
    /// nothing is kept from now on.
    pub fn discard(&self) {
        let mut ranges = self.ranges.lock().unwrap_or_else(PoisonError::into_inner);
        *ranges = None;
        let _ = self.file.set_len(0);
        let _ = std::fs::remove_file(&self.path);
    }

    /// The ranges not yet fetched, in order.
    pub fn gaps(&self) -> Vec<(u64, u64)> {
        let ranges = self.ranges.lock().unwrap_or_else(PoisonError::into_inner);
        let mut gaps = Vec::new();
        let mut at = 0;
        for (&start, &end) in ranges.iter().flatten() {
            if start > at {
                gaps.push((at, start));
            }
            at = at.max(end);
        }
        if at < self.size {
            gaps.push((at, self.size));
        }
        gaps
    }

    /// Whether [`Fetched::discard`] let the bytes go.
    pub fn discarded(&self) -> bool {
        self.ranges
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }

    /// Bytes fetched so far.
    pub fn held(&self) -> u64 {
        let ranges = self.ranges.lock().unwrap_or_else(PoisonError::into_inner);
        ranges
            .iter()
            .flatten()
            .map(|(start, end)| end - start)
            .sum()
    }

    /// Fetches every gap with `fetch(start, len)`, [`FILL_PIECE`] at most per call.
    pub fn fill(&self, fetch: impl Fn(u64, u64) -> io::Result<Vec<u8>>) -> io::Result<()> {
        for (start, end) in self.gaps() {
            let mut at = start;
            while at < end {
                let len = (end - at).min(FILL_PIECE);
                let bytes = fetch(at, len)?;
                if bytes.len() as u64 != len {
                    return Err(io::Error::other(format!(
                        "the registry served {} bytes for a range of {len}",
                        bytes.len()
                    )));
                }
                self.keep(at, &bytes, true)?;
                at += len;
            }
        }
        Ok(())
    }
}

/// Adds `[start, end)` to `ranges`, merging what it overlaps or touches.
fn insert(ranges: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    let touching: Vec<u64> = ranges
        .range(..=end)
        .rev()
        .take_while(|(_, e)| **e >= start)
        .map(|(s, _)| *s)
        .collect();
    for s in touching {
        let e = ranges.remove(&s).unwrap_or(s);
        start = start.min(s);
        end = end.max(e);
    }
    ranges.insert(start, end);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetched(size: u64) -> (tempfile::TempDir, Fetched) {
        let dir = tempfile::tempdir().unwrap();
        let fetched = Fetched::create(&dir.path().join("blob.part"), size).unwrap();
        (dir, fetched)
    }

    #[test]
    fn gaps_are_what_no_range_covers_and_ranges_merge() {
        let (_dir, f) = fetched(100);
        assert_eq!(f.gaps(), vec![(0, 100)]);
        f.record(10, &[1; 10]).unwrap();
        f.record(40, &[2; 10]).unwrap();
        assert_eq!(f.gaps(), vec![(0, 10), (20, 40), (50, 100)]);
        // Overlapping both, and touching the second's end.
        f.record(15, &[3; 35]).unwrap();
        assert_eq!(f.gaps(), vec![(0, 10), (50, 100)]);
        assert_eq!(f.held(), 40);
        f.record(95, &[4; 20]).unwrap();
        assert_eq!(
            f.gaps(),
            vec![(0, 10), (50, 95)],
            "past the end is not kept"
        );
    }

    #[test]
    fn fill_fetches_only_the_gaps_in_bounded_pieces() {
        let size = FILL_PIECE * 2 + 100;
        let (_dir, f) = fetched(size);
        let blob: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        f.record(1000, &blob[1000..5000]).unwrap();
        let asked = Mutex::new(Vec::new());
        f.fill(|start, len| {
            asked.lock().unwrap().push((start, len));
            Ok(blob[start as usize..(start + len) as usize].to_vec())
        })
        .unwrap();
        let asked = asked.into_inner().unwrap();
        assert_eq!(asked[0], (0, 1000));
        assert!(asked.iter().all(|(_, len)| *len <= FILL_PIECE));
        assert!(
            asked
                .iter()
                .all(|(start, len)| start + len <= 1000 || *start >= 5000),
            "nothing fetched twice: {asked:?}"
        );
        assert_eq!(std::fs::read(f.path()).unwrap(), blob);
        assert!(f.gaps().is_empty());
        f.discard();
        assert!(!f.path().exists());
        f.record(0, &[1; 10]).unwrap();
        assert_eq!(f.held(), 0, "nothing kept after a discard");
    }

    #[test]
    fn a_short_answer_fails_the_fill() {
        let (_dir, f) = fetched(10);
        let err = f.fill(|_, _| Ok(vec![0; 3])).unwrap_err();
        assert!(err.to_string().contains("3 bytes"), "{err}");
    }
}
