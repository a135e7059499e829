//! Memory pressure for stall S2: an anonymous allocation takes most of the free memory,
//! then a thread streams through a sparse file larger than what is left, so the page
//! cache is refilled and reclaimed continuously (kswapd and direct reclaim, shrinkers
//! included) for as long as the guard lives. Reading holes costs no disk I/O, so the
//! pressure is memory pressure, not an I/O load that would muddy the measurement.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::host;

#[derive(Debug)]
pub struct MemoryPressure {
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
    _hog: Vec<u8>,
    file: PathBuf,
}

impl MemoryPressure {
    /// Leaves `headroom` bytes of memory available, then cycles a sparse file of
    /// `file_bytes` in `dir` through the page cache. Returns once reclaim is visible in
    /// /proc/vmstat or after `settle` (the caller's pgscan delta shows which).
    pub fn start(dir: &Path, headroom: u64, file_bytes: u64, settle: Duration) -> Self {
        let hog_bytes = host::mem_available().saturating_sub(headroom) as usize;
        let mut hog = vec![0u8; hog_bytes];
        // Touch every page so the allocation is resident, not just reserved.
        for page in hog.chunks_mut(4096) {
            page[0] = 1;
        }
        let file = dir.join("pressure.sparse");
        File::create(&file)
            .and_then(|f| f.set_len(file_bytes))
            .expect("creating the sparse pressure file");
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let stop = stop.clone();
            let file = file.clone();
            std::thread::spawn(move || stream(&file, &stop))
        };
        let before = host::pgscan();
        let deadline = Instant::now() + settle;
        while host::pgscan() == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            stop,
            reader: Some(reader),
            _hog: hog,
            file,
        }
    }
}

fn stream(file: &Path, stop: &AtomicBool) {
    let mut buf = vec![0u8; 1 << 20];
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut f) = File::open(file) else { return };
        while !stop.load(Ordering::Relaxed) {
            match f.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }
}

impl Drop for MemoryPressure {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let _ = std::fs::remove_file(&self.file);
    }
}
