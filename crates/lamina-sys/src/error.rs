use std::fmt;
use std::path::PathBuf;

pub use rustix::io::Errno;

/// A failed mount operation: which operation, on which path, the errno, and whatever
/// the kernel explained through the filesystem context (overlay says a lot there).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct MountError {
    pub op: &'static str,
    pub path: PathBuf,
    pub errno: Errno,
    pub detail: String,
}

impl MountError {
    pub fn new(op: &'static str, path: impl Into<PathBuf>, errno: Errno) -> Self {
        Self {
            op,
            path: path.into(),
            errno,
            detail: String::new(),
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.errno)?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}
