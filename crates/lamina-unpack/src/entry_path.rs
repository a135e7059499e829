//! Turning a tar entry's raw name into components beneath the layer root, refusing any
//! name that tries to leave it. Done lexically, before anything touches the filesystem.

use std::fmt;

/// A tar name split into components, none of them empty, `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPath {
    components: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathRejection {
    Absolute,
    DotDot,
    Nul,
}

impl fmt::Display for PathRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathRejection::Absolute => "absolute path escapes the layer root",
            PathRejection::DotDot => "`..` component escapes the layer root",
            PathRejection::Nul => "name contains a NUL byte",
        })
    }
}

impl EntryPath {
    /// Parses a tar name (`./a/b/`, `a//b`, `a/./b` are all `a/b`). A leading `/` and any
    /// `..` are refused rather than clamped: a layer that contains them was not made by a
    /// well-behaved tool, and guessing what it meant is how unpackers get escaped.
    pub fn parse(raw: &[u8]) -> Result<Self, PathRejection> {
        if raw.contains(&0) {
            return Err(PathRejection::Nul);
        }
        if raw.starts_with(b"/") {
            return Err(PathRejection::Absolute);
        }
        let mut components = Vec::new();
        for part in raw.split(|&b| b == b'/') {
            match part {
                b"" | b"." => {}
                b".." => return Err(PathRejection::DotDot),
                name => components.push(name.to_vec()),
            }
        }
        Ok(Self { components })
    }

    /// The layer root itself (`./`).
    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    pub fn parent(&self) -> &[Vec<u8>] {
        &self.components[..self.components.len().saturating_sub(1)]
    }

    pub fn name(&self) -> Option<&[u8]> {
        self.components.last().map(Vec::as_slice)
    }

    pub fn components(&self) -> &[Vec<u8>] {
        &self.components
    }

    /// Joined with `/`, for openat2 and error messages.
    pub fn join(parts: &[Vec<u8>]) -> Vec<u8> {
        parts.join(&b'/')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(raw: &str) -> Vec<String> {
        let p = EntryPath::parse(raw.as_bytes()).unwrap();
        p.components()
            .iter()
            .map(|c| String::from_utf8(c.clone()).unwrap())
            .collect()
    }

    #[test]
    fn normalises_dots_and_slashes() {
        assert_eq!(parts("./usr//bin/./sh"), ["usr", "bin", "sh"]);
        assert_eq!(parts("etc/"), ["etc"]);
        assert!(EntryPath::parse(b"./").unwrap().is_root());
    }

    #[test]
    fn refuses_escapes() {
        assert_eq!(
            EntryPath::parse(b"../etc/passwd"),
            Err(PathRejection::DotDot)
        );
        assert_eq!(EntryPath::parse(b"a/../../b"), Err(PathRejection::DotDot));
        assert_eq!(EntryPath::parse(b"a/.."), Err(PathRejection::DotDot));
        assert_eq!(
            EntryPath::parse(b"/etc/passwd"),
            Err(PathRejection::Absolute)
        );
        assert_eq!(EntryPath::parse(b"a\0b"), Err(PathRejection::Nul));
    }

    #[test]
    fn keeps_non_utf8_names() {
        let p = EntryPath::parse(b"dir/\xff\xfe").unwrap();
        assert_eq!(p.name(), Some(&b"\xff\xfe"[..]));
    }
}
