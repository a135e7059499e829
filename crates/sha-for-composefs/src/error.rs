//! The error type of the calls composefs makes; hashing in memory never fails, so none is
//! ever built.

/// Never returned: `sha2` cannot fail. Kept so composefs's `Result`s type-check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorStack(());

impl std::fmt::Display for ErrorStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("hashing failed")
    }
}

impl std::error::Error for ErrorStack {}
