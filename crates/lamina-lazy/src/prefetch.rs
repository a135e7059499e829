//! Prefetch: the chunks an image marks as read at start, fetched in a few large requests
//! as soon as its layer is served, so a starting container waits one round trip for
//! them instead of one per file. eStargz marks them by order: the files its producer saw
//! read come first in the blob, followed by a `.prefetch.landmark` entry
//! (`lamina_image::lazy::estargz::prefetch_end`); everything before the landmark is
//! prefetched.
//!
//! Each piece's chunks are claimed as a read claims them (`Fetching`) just before the
//! piece is fetched, so a read wanting one waits for that one request rather than
//! fetching it again, and a read of a chunk in a later piece fetches it itself; each is
//! checked against its digest as a read checks it, and one that fails goes back to
//! `Missing` for a read to fetch itself: a prefetch never fails a read. At most
//! [`MAX_PREFETCH_BYTES`] of the blob are prefetched, whatever the landmark says.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use lamina_image::lazy::{chunk_from, inflate_member};

use crate::objects_fs::{ObjectsFs, State};

/// The most one prefetch request asks for (members are never split across requests).
const PIECE_BYTES: u64 = 16 << 20;
/// A prefetch's requests in flight at once.
const PIECES_AT_ONCE: usize = 4;
/// The most of a blob a prefetch fetches: an image's producer says what is read at
/// start, and a landmark past this (hostile, or a huge image) is taken as read there.
pub const MAX_PREFETCH_BYTES: u64 = 512 << 20;

/// What a prefetch brought.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Prefetched {
    /// Chunks made present.
    pub chunks: usize,
    /// Bytes of the blob fetched for them.
    pub bytes: u64,
    /// Chunks it claimed but could not make present (left for reads).
    pub failed: usize,
}

/// One request's worth: the blob's bytes `start..end` and the chunks (object, chunk)
/// whose members lie in it, in blob order.
struct Piece {
    start: u64,
    end: u64,
    chunks: Vec<(usize, usize)>,
}

impl ObjectsFs {
    /// Fetches every missing chunk whose member ends at or before `end` in the blob (the
    /// prefetch region, at most [`MAX_PREFETCH_BYTES`]), [`PIECES_AT_ONCE`] requests at a
    /// time.
    pub fn prefetch(&self, end: u64) -> Prefetched {
        self.prefetch_within(end, MAX_PREFETCH_BYTES)
    }

    /// [`ObjectsFs::prefetch`] of no more than the blob's first `most` bytes.
    fn prefetch_within(&self, end: u64, most: u64) -> Prefetched {
        let pieces = self.plan_prefetch(end.min(most));
        let next = AtomicUsize::new(0);
        let total = Mutex::new(Prefetched::default());
        std::thread::scope(|scope| {
            for _ in 0..PIECES_AT_ONCE.min(pieces.len()) {
                scope.spawn(|| {
                    while let Some(piece) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let done = self.fetch_piece(piece);
                        let mut total = total.lock().unwrap_or_else(PoisonError::into_inner);
                        total.chunks += done.chunks;
                        total.bytes += done.bytes;
                        total.failed += done.failed;
                    }
                });
            }
        });
        total.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// The missing chunks of the prefetch region, cut into pieces (not claimed yet).
    fn plan_prefetch(&self, end: u64) -> Vec<Piece> {
        let mut claimed = Vec::new();
        for (n, served) in self.objects.iter().enumerate() {
            let state = served.state.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, chunk) in served.object.file.chunks.iter().enumerate() {
                if !chunk.zeros && chunk.member.1 <= end && state[i] == State::Missing {
                    claimed.push((n, i));
                }
            }
        }
        let member = |(n, i): (usize, usize)| self.objects[n].object.file.chunks[i].member;
        claimed.sort_by_key(|c| member(*c));
        let mut pieces: Vec<Piece> = Vec::new();
        for c in claimed {
            let (start, stop) = member(c);
            match pieces.last_mut() {
                Some(piece) if stop.max(piece.end) - piece.start <= PIECE_BYTES => {
                    piece.end = piece.end.max(stop);
                    piece.chunks.push(c);
                }
                _ => pieces.push(Piece {
                    start,
                    end: stop,
                    chunks: vec![c],
                }),
            }
        }
        pieces
    }

    /// Claims what of `planned` is still missing, fetches the span of it and settles each
    /// chunk: present if its bytes checked and were written, missing again otherwise (a
    /// panic included).
    fn fetch_piece(&self, planned: &Piece) -> Prefetched {
        let mut chunks = Vec::new();
        for &(n, i) in &planned.chunks {
            let served = &self.objects[n];
            let mut state = served.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state[i] == State::Missing {
                state[i] = State::Fetching;
                chunks.push((n, i));
            }
        }
        let member = |&(n, i): &(usize, usize)| self.objects[n].object.file.chunks[i].member;
        let (Some(start), Some(end)) = (
            chunks.iter().map(|c| member(c).0).min(),
            chunks.iter().map(|c| member(c).1).max(),
        ) else {
            return Prefetched::default();
        };
        let piece = Piece { start, end, chunks };
        let piece = &piece;
        let mut settle = SettleMany {
            fs: self,
            left: piece.chunks.clone(),
        };
        let Ok(bytes) = self.source.fetch(piece.start, piece.end) else {
            return Prefetched {
                failed: piece.chunks.len(),
                ..Prefetched::default()
            };
        };
        let mut copies: HashMap<usize, File> = HashMap::new();
        let mut present = Vec::new();
        let mut inflated: Option<((u64, u64), Vec<u8>)> = None;
        // A member that would not decompress is not tried again for its other chunks.
        let mut broken: Option<(u64, u64)> = None;
        for (k, &(n, i)) in piece.chunks.iter().enumerate() {
            let chunk = &self.objects[n].object.file.chunks[i];
            if broken == Some(chunk.member) {
                continue;
            }
            if inflated.as_ref().is_none_or(|(m, _)| *m != chunk.member) {
                // Decompressed once, as far as the furthest chunk of it in this piece.
                let upto = piece.chunks[k..]
                    .iter()
                    .map(|&(n, i)| &self.objects[n].object.file.chunks[i])
                    .take_while(|c| c.member == chunk.member)
                    .map(|c| c.inner_offset + c.size)
                    .max()
                    .unwrap_or(0);
                let from = (chunk.member.0 - piece.start) as usize;
                let to = (chunk.member.1 - piece.start) as usize;
                inflated = bytes
                    .get(from..to)
                    .and_then(|member| inflate_member(member, chunk.codec, upto).ok())
                    .map(|whole| (chunk.member, whole));
            }
            let Some((_, whole)) = &inflated else {
                broken = Some(chunk.member);
                continue;
            };
            let written = chunk_from(whole, chunk)
                .map_err(io::Error::other)
                .and_then(|checked| {
                    let copy = match copies.entry(n) {
                        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                        std::collections::hash_map::Entry::Vacant(e) => e.insert(
                            File::options()
                                .write(true)
                                .open(&self.objects[n].object.copy)?,
                        ),
                    };
                    copy.write_all_at(&checked, chunk.file_offset)
                });
            if written.is_ok() {
                present.push((n, i));
            }
        }
        settle.settle(&present, State::Present);
        let failed = settle.left.len();
        drop(settle);
        Prefetched {
            chunks: present.len(),
            bytes: bytes.len() as u64,
            failed,
        }
    }
}

/// Chunks of several objects a prefetch claimed and has not settled: marked `Missing`
/// again when dropped, so no read waits for them for ever.
struct SettleMany<'a> {
    fs: &'a ObjectsFs,
    left: Vec<(usize, usize)>,
}

impl SettleMany<'_> {
    /// Marks `these` (among those left) `state`, and wakes the reads waiting.
    fn settle(&mut self, these: &[(usize, usize)], state: State) {
        let mut by_object: HashMap<usize, Vec<usize>> = HashMap::new();
        for &(n, i) in these {
            by_object.entry(n).or_default().push(i);
        }
        for (n, chunks) in by_object {
            let served = &self.fs.objects[n];
            let mut states = served.state.lock().unwrap_or_else(PoisonError::into_inner);
            for i in chunks {
                states[i] = state;
            }
            served.settled.notify_all();
        }
        let these: std::collections::HashSet<&(usize, usize)> = these.iter().collect();
        self.left.retain(|c| !these.contains(c));
    }
}

impl Drop for SettleMany<'_> {
    fn drop(&mut self) {
        let left = std::mem::take(&mut self.left);
        self.settle(&left, State::Missing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChunkSource, LazyObject};
    use lamina_image::lazy::estargz::{FOOTER_SIZE, PREFETCH_LANDMARK, prefetch_end, toc_offset};
    use std::sync::Arc;

    /// A blob in memory that records each range fetched.
    struct Recording {
        blob: Vec<u8>,
        fetched: Mutex<Vec<(u64, u64)>>,
    }

    impl ChunkSource for Recording {
        fn fetch(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
            self.fetched.lock().unwrap().push((start, end));
            Ok(self.blob[start as usize..end as usize].to_vec())
        }
    }

    fn data(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// An eStargz layer of `a` and `b` (read at start), the landmark, then `c`, in
    /// 64 KiB chunks, served from memory.
    fn served(dir: &std::path::Path) -> (ObjectsFs, Arc<Recording>, u64) {
        let tar = lamina_sample::LayerBuilder::new()
            .file("a", 0o644, &data(1, 200 << 10))
            .and_then(|l| l.file("b", 0o644, &data(2, 100 << 10)))
            .and_then(|l| l.file(PREFETCH_LANDMARK, 0o644, &[0x0f]))
            .and_then(|l| l.file("c", 0o644, &data(3, 300 << 10)))
            .and_then(|l| l.finish())
            .unwrap();
        let layer = lamina_sample::estargz::estargz(&tar, 64 << 10).unwrap();
        let footer = &layer.blob[layer.blob.len() - FOOTER_SIZE as usize..];
        let offset = toc_offset(footer, layer.blob.len() as u64).unwrap();
        let files = layer.toc.files(offset).unwrap();
        let end = prefetch_end(&files).expect("a landmark");
        let objects = files
            .into_iter()
            .enumerate()
            .map(|(n, file)| LazyObject {
                name: format!("o{n}").into(),
                copy: dir.join(format!("copy-{n}")),
                file,
            })
            .collect();
        let source = Arc::new(Recording {
            blob: layer.blob,
            fetched: Mutex::default(),
        });
        (
            ObjectsFs::new(objects, source.clone()).unwrap(),
            source,
            end,
        )
    }

    fn states(fs: &ObjectsFs, n: usize) -> Vec<State> {
        fs.objects[n].state.lock().unwrap().clone()
    }

    #[test]
    fn what_precedes_the_landmark_comes_in_one_request_checked_and_reads_fetch_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        let (fs, source, end) = served(dir.path());
        let got = fs.prefetch(end);
        assert_eq!(source.fetched.lock().unwrap().len(), 1, "one request");
        assert_eq!(
            (got.chunks, got.failed),
            (4 + 2, 0),
            "a's 4 chunks and b's 2"
        );
        assert!(got.bytes <= end);
        for (n, name) in [(0, "a"), (1, "b")] {
            assert!(
                states(&fs, n).iter().all(|s| *s == State::Present),
                "{name} is present"
            );
        }
        let c = fs
            .objects
            .iter()
            .position(|o| o.object.file.name == "c")
            .unwrap();
        assert!(states(&fs, c).iter().all(|s| *s == State::Missing));
        // A read of what was prefetched fetches nothing and reads the file's bytes.
        fs.fill(0, 0, 200 << 10).unwrap();
        assert_eq!(source.fetched.lock().unwrap().len(), 1);
        assert_eq!(
            std::fs::read(&fs.objects[0].object.copy).unwrap(),
            data(1, 200 << 10)
        );
        // A second prefetch finds nothing missing.
        assert_eq!(fs.prefetch(end), Prefetched::default());
    }

    #[test]
    fn a_prefetch_stops_at_its_bound_whatever_the_landmark_says() {
        let dir = tempfile::tempdir().unwrap();
        let (fs, source, end) = served(dir.path());
        // The bound falls inside `b`: `a` comes whole, `b`'s chunks past it do not.
        let a_end = fs.objects[0].object.file.chunks.last().unwrap().member.1;
        let got = fs.prefetch_within(end, a_end);
        assert_eq!((got.chunks, got.failed), (4, 0));
        assert!(
            source
                .fetched
                .lock()
                .unwrap()
                .iter()
                .all(|(_, e)| *e <= a_end)
        );
        assert!(states(&fs, 1).iter().all(|s| *s == State::Missing));
    }

    #[test]
    fn a_chunk_whose_member_is_broken_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (mut fs, source, end) = served(dir.path());
        // `a`'s second chunk's member, its deflate stream broken.
        let (start, stop) = fs.objects[0].object.file.chunks[1].member;
        let mut blob = source.blob.clone();
        for byte in &mut blob[(start + 12) as usize..(stop - 8) as usize] {
            *byte = 0xff;
        }
        fs.source = Arc::new(Recording {
            blob,
            fetched: Mutex::default(),
        });
        let got = fs.prefetch(end);
        assert_eq!((got.chunks, got.failed), (5, 1), "{got:?}");
        let a = states(&fs, 0);
        assert_eq!(a[1], State::Missing, "left to a read, which fails it");
        assert!(
            a.iter()
                .enumerate()
                .all(|(i, s)| i == 1 || *s == State::Present)
        );
        assert!(fs.fill(0, 64 << 10, 65 << 10).is_err());
    }

    #[test]
    fn a_prefetch_that_fails_leaves_its_chunks_to_reads() {
        struct Failing;
        impl ChunkSource for Failing {
            fn fetch(&self, _: u64, _: u64) -> io::Result<Vec<u8>> {
                Err(io::Error::other("the registry is gone"))
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let (mut fs, source, end) = served(dir.path());
        fs.source = Arc::new(Failing);
        let got = fs.prefetch(end);
        assert_eq!((got.chunks, got.failed), (0, 6));
        assert!(states(&fs, 0).iter().all(|s| *s == State::Missing));
        // The reads fetch for themselves once the registry answers.
        fs.source = source;
        fs.fill(1, 0, 100 << 10).unwrap();
        assert_eq!(
            std::fs::read(&fs.objects[1].object.copy).unwrap(),
            data(2, 100 << 10)
        );
    }
}
