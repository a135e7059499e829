//! Where the targets write: tmpfs when there is one (a fuzzer makes and removes a directory
//! per input; on this machine's root filesystem that is 25x slower).

use std::path::PathBuf;

pub fn dir() -> tempfile::TempDir {
    let base = std::env::var_os("LAMINA_FUZZ_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
        .unwrap_or_else(std::env::temp_dir);
    tempfile::Builder::new()
        .prefix("lamina-fuzz-")
        .tempdir_in(base)
        .expect("making a scratch directory")
}
