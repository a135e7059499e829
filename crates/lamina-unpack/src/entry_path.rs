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
    /// A component longer than NAME_MAX: no Linux filesystem can hold it.
    NameTooLong(usize),
    /// Longer than PATH_MAX as a whole.
    PathTooLong(usize),
}

/// Linux's NAME_MAX and PATH_MAX (including the terminating NUL).
const NAME_MAX: usize = 255;
pub(crate) const PATH_MAX: usize = 4096;

impl fmt::Display for PathRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&match self {
            PathRejection::Absolute => "absolute path escapes the layer root".into(),
            PathRejection::DotDot => "`..` component escapes the layer root".into(),
            PathRejection::Nul => "name contains a NUL byte".into(),
            PathRejection::NameTooLong(n) => {
                format!("a component is {n} bytes long, past NAME_MAX ({NAME_MAX})")
            }
            PathRejection::PathTooLong(n) => {
                format!("name is {n} bytes long, past PATH_MAX ({PATH_MAX})")
            }
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
        if raw.len() >= PATH_MAX {
            return Err(PathRejection::PathTooLong(raw.len()));
        }
        let mut components = Vec::new();
        for part in raw.split(|&b| b == b'/') {
            match part {
                b"" | b"." => {}
                b".." => return Err(PathRejection::DotDot),
                name if name.len() > NAME_MAX => {
                    return Err(PathRejection::NameTooLong(name.len()));
                }
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

/// Longest name [`shown`] prints whole; a longer one is cut, so an error naming it stays
/// one line of bounded length.
const SHOWN_MAX: usize = 512;

/// An entry name as error messages show it: lossy UTF-8 with control characters escaped,
/// so a name holding a newline or a terminal escape cannot break the one-line error or
/// forge log lines, and cut past [`SHOWN_MAX`] bytes with a marker saying how long it was.
pub fn shown(raw: &[u8]) -> String {
    let cut = &raw[..raw.len().min(SHOWN_MAX)];
    let mut out = String::with_capacity(cut.len());
    for c in String::from_utf8_lossy(cut).chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if raw.len() > SHOWN_MAX {
        out.push_str(&format!("… ({} bytes in all)", raw.len()));
    }
    out
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
    fn refuses_names_no_filesystem_holds() {
        let long = vec![b'a'; 256];
        assert_eq!(
            EntryPath::parse(&long),
            Err(PathRejection::NameTooLong(256))
        );
        let deep = b"abcdefgh/".repeat(512);
        assert_eq!(
            EntryPath::parse(&deep),
            Err(PathRejection::PathTooLong(4608))
        );
    }

    #[test]
    fn shown_names_stay_on_one_line() {
        assert_eq!(shown(b"a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
        assert_eq!(shown(b"caf\xe9"), "caf\u{fffd}");
    }

    #[test]
    fn shown_names_are_bounded() {
        let long = vec![b'a'; 1 << 20];
        let line = shown(&long);
        assert!(line.len() < SHOWN_MAX + 64, "{} bytes", line.len());
        assert!(line.ends_with("… (1048576 bytes in all)"), "{line}");
    }

    #[test]
    fn keeps_non_utf8_names() {
        let p = EntryPath::parse(b"dir/\xff\xfe").unwrap();
        assert_eq!(p.name(), Some(&b"\xff\xfe"[..]));
    }
}
