//! Deciding what a tar entry is — name, link target, kind, size, owner, mode, xattrs —
//! from its header and the extension records before it, before anything touches the
//! filesystem.
//!
//! The `tar` crate's cooked iterator buffers a GNU long-name or PAX record whole, however
//! large it declares itself, and applies a PAX `size` the raw header does not show. So
//! lamina reads the archive raw and assembles entries here: every record's size is checked
//! *before* a byte of it is buffered, names past PATH_MAX are refused, global headers are
//! skipped without side effects, and any type lamina does not unpack — sparse files, which
//! would turn a few hundred bytes into gigabytes of written-out holes, and unknown types —
//! is refused with the entry's name.

use std::io::Read;

use tar::EntryType;

use crate::entry_path::PATH_MAX;
use crate::metadata::{self, Meta};

/// Largest PAX extended header lamina buffers. Real ones hold a name, a link target, a
/// few numbers and xattrs (each at most 64 KiB on Linux): a few KiB in practice.
pub const MAX_PAX_RECORD: u64 = 1024 * 1024;

/// The extension records read so far that describe the next entry.
#[derive(Debug, Default)]
pub struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

/// What a raw archive member was.
#[derive(Debug)]
pub enum Member {
    /// An extension record (long name, long link, PAX) now held in [`Pending`], or a
    /// global PAX header, skipped.
    Record,
    /// An entry to unpack, described by everything before it.
    Entry(Described),
}

/// How an entry is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Directory,
    File,
    Symlink(Vec<u8>),
    Hardlink(Vec<u8>),
    /// A character or block device with its device number, or a FIFO.
    Node {
        kind: EntryType,
        major: u32,
        minor: u32,
    },
}

/// An entry, fully decided.
#[derive(Debug)]
pub struct Described {
    pub name: Vec<u8>,
    pub kind: Kind,
    /// Bytes of data that follow the header in the archive.
    pub size: u64,
    pub meta: Meta,
}

/// Why a member cannot be unpacked. `name` is the entry's name when it is known.
#[derive(Debug)]
pub struct Refusal {
    pub name: Option<Vec<u8>>,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(name) => write!(f, "entry `{}`: {}", crate::shown(name), self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl Refusal {
    fn record(message: String) -> Self {
        Self {
            name: None,
            message,
        }
    }

    fn entry(name: &[u8], message: impl Into<String>) -> Self {
        Self {
            name: Some(name.to_vec()),
            message: message.into(),
        }
    }
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }

    /// Reads one raw member: an extension record is stored (or skipped), anything else
    /// is described using, and clearing, what was stored.
    pub fn read<R: Read>(&mut self, member: &mut tar::Entry<'_, R>) -> Result<Member, Refusal> {
        let size = member.size();
        match member.header().entry_type() {
            EntryType::GNULongName => {
                let name = read_record(member, "GNU long-name", PATH_MAX as u64)?;
                store_once(&mut self.long_name, trim_nuls(name), "long-name")?;
                Ok(Member::Record)
            }
            EntryType::GNULongLink => {
                let link = read_record(member, "GNU long-link", PATH_MAX as u64)?;
                store_once(&mut self.long_link, trim_nuls(link), "long-link")?;
                Ok(Member::Record)
            }
            EntryType::XHeader => {
                let pax = read_record(member, "PAX", MAX_PAX_RECORD)?;
                store_once(&mut self.pax, pax, "PAX")?;
                Ok(Member::Record)
            }
            // Defaults for the rest of the archive that OCI does not use: skipped
            // unread (the iterator steps over its data), as containerd does. Bounded like
            // a PAX record (Go's reader caps it the same), and never between an entry's
            // own records and the entry: Go drops those records there, GNU tar keeps them.
            EntryType::XGlobalHeader => {
                if size > MAX_PAX_RECORD {
                    return Err(Refusal::record(format!(
                        "PAX global header declares {size} bytes, past the \
                         {MAX_PAX_RECORD}-byte limit for it"
                    )));
                }
                if !self.is_empty() {
                    return Err(Refusal::record(
                        "a PAX global header separates an entry from its extension records; \
                         tar readers disagree on what that means"
                            .into(),
                    ));
                }
                Ok(Member::Record)
            }
            kind => {
                let pending = std::mem::take(self);
                pending.describe(member, kind, size).map(Member::Entry)
            }
        }
    }

    fn describe<R: Read>(
        self,
        member: &tar::Entry<'_, R>,
        kind: EntryType,
        size: u64,
    ) -> Result<Described, Refusal> {
        let header = member.header();
        let header_name = header.path_bytes().into_owned();
        let fields = match &self.pax {
            Some(pax) => parse_pax(pax).map_err(|why| Refusal::entry(&header_name, why))?,
            None => Vec::new(),
        };
        let pax_value = |key: &[u8]| {
            fields
                .iter()
                .rev()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
        };
        // Go's reader lets a GNU long name win over a PAX path, GNU tar the other way
        // round: an entry that has both means two different files, so it is refused.
        let name = pick_name(self.long_name, pax_value(b"path"), header_name, "name")?;
        let link = match (self.long_link, pax_value(b"linkpath")) {
            (None, None) => header.link_name_bytes().map(|l| l.into_owned()),
            (long, pax) => Some(pick_name(long, pax, Vec::new(), "link target")?),
        };
        let mut meta = Meta {
            mode: header.mode().unwrap_or(0o644),
            uid: header.uid().unwrap_or(0) as u32,
            gid: header.gid().unwrap_or(0) as u32,
            mtime: header.mtime().unwrap_or(0) as i64,
            xattrs: Vec::new(),
        };
        apply_pax(&fields, &mut meta, size, &name)?;
        // Go's reader and GNU tar read no data after these types, whatever the size
        // field says; the raw reader would skip `size` bytes, and the two would then see
        // different archives.
        let header_only = !matches!(kind, EntryType::Regular | EntryType::Continuous);
        if header_only && size != 0 && kind != EntryType::GNUSparse {
            return Err(Refusal::entry(
                &name,
                format!(
                    "a {kind:?} entry declares {size} bytes of data; tar readers disagree on \
                     whether they follow"
                ),
            ));
        }
        // Old tars mark a directory by a trailing `/` on a regular file's name: Go and
        // GNU tar make it a directory, a plain reader a file.
        if !header_only && name.ends_with(b"/") {
            return Err(Refusal::entry(
                &name,
                "a file entry whose name ends in `/`: tar readers disagree on whether it is \
                 a directory",
            ));
        }
        let kind = match kind {
            EntryType::Directory => Kind::Directory,
            EntryType::Regular | EntryType::Continuous => Kind::File,
            EntryType::Symlink | EntryType::Link => {
                let target = link.ok_or_else(|| Refusal::entry(&name, "link without a target"))?;
                if target.len() >= PATH_MAX {
                    return Err(Refusal::entry(
                        &name,
                        format!(
                            "link target is {} bytes long, past PATH_MAX ({PATH_MAX})",
                            target.len()
                        ),
                    ));
                }
                if kind == EntryType::Symlink {
                    Kind::Symlink(target)
                } else {
                    Kind::Hardlink(target)
                }
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => Kind::Node {
                kind,
                major: header.device_major().ok().flatten().unwrap_or(0),
                minor: header.device_minor().ok().flatten().unwrap_or(0),
            },
            EntryType::GNUSparse => return Err(Refusal::entry(&name, SPARSE_REFUSED)),
            other => {
                return Err(Refusal::entry(
                    &name,
                    format!(
                        "unknown tar entry type `{}` (0x{:02x}): refused rather than guessed at",
                        crate::shown(&[other.as_byte()]),
                        other.as_byte()
                    ),
                ));
            }
        };
        Ok(Described {
            name,
            kind,
            size,
            meta,
        })
    }
}

const SPARSE_REFUSED: &str = "sparse files are not supported: a sparse entry's holes would be \
     written out as data, so a few bytes of tar could fill the disk";

/// Applies the PAX records that change an entry's metadata, and refuses those lamina does
/// not unpack (sparse files) or that would make it read a different archive than other
/// readers (a `size` other than the header's).
fn apply_pax(
    fields: &[PaxRecord<'_>],
    meta: &mut Meta,
    size: u64,
    name: &[u8],
) -> Result<(), Refusal> {
    let refuse = |why: String| Refusal::entry(name, why);
    for &(key, value) in fields {
        let id = || -> Result<u32, Refusal> {
            decimal(value)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    refuse(format!(
                        "PAX {} `{}` is not an id",
                        crate::shown(key),
                        crate::shown(value)
                    ))
                })
        };
        match key {
            b"uid" => meta.uid = id()?,
            b"gid" => meta.gid = id()?,
            b"mtime" => {
                // Seconds, with an optional fraction (which overlay keeps no use for).
                let whole = value.split(|&b| b == b'.').next().unwrap_or_default();
                let (negative, digits) = match whole.strip_prefix(b"-") {
                    Some(digits) => (true, digits),
                    None => (false, whole),
                };
                let secs = decimal(digits)
                    .and_then(|n| i64::try_from(n).ok())
                    .ok_or_else(|| {
                        refuse(format!("PAX mtime `{}` is not a time", crate::shown(value)))
                    })?;
                meta.mtime = if negative { -secs } else { secs };
            }
            // The raw reader steps over the header's size; a different PAX size would
            // make lamina and other readers see different archives.
            b"size" if decimal(value) != Some(size) => {
                return Err(refuse(format!(
                    "PAX size `{}` differs from the header's {size} bytes (entries past \
                     8 GiB are not supported)",
                    crate::shown(value)
                )));
            }
            _ if key.starts_with(b"GNU.sparse.") => return Err(refuse(SPARSE_REFUSED.into())),
            _ => {
                if let Some(xattr) = key.strip_prefix(b"SCHILY.xattr.")
                    && !metadata::is_reserved_xattr(xattr)
                {
                    meta.xattrs.push((xattr.to_vec(), value.to_vec()));
                }
            }
        }
    }
    Ok(())
}

/// Plain decimal digits only: no sign, no fraction, no spaces, at most 19 of them.
fn decimal(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// One PAX record: key and value, as bytes.
type PaxRecord<'a> = (&'a [u8], &'a [u8]);

/// Parses a PAX extended header strictly (`LEN KEY=VALUE\n`, records filling the header
/// exactly), as Go's reader and GNU tar do. The `tar` crate's parser stops at the first
/// blank line, which would let records after it slip past every check here.
fn parse_pax(mut data: &[u8]) -> Result<Vec<PaxRecord<'_>>, String> {
    let malformed = |why: &str| format!("malformed PAX extended header: {why}");
    let mut fields = Vec::new();
    while !data.is_empty() {
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| malformed("a record without a length"))?;
        let len = decimal(&data[..space])
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > space + 1 && n <= data.len())
            .ok_or_else(|| malformed("a record length that does not fit"))?;
        let (record, rest) = data.split_at(len);
        let body = record[space + 1..]
            .strip_suffix(b"\n")
            .ok_or_else(|| malformed("a record not ended by a newline"))?;
        let equals = body
            .iter()
            .position(|&b| b == b'=')
            .filter(|&at| at > 0)
            .ok_or_else(|| malformed("a record without a key"))?;
        let (key, value) = (&body[..equals], &body[equals + 1..]);
        if matches!(key, b"path" | b"linkpath") && value.contains(&0) {
            return Err(malformed("a name with a NUL byte"));
        }
        fields.push((key, value));
        data = rest;
    }
    Ok(fields)
}

/// The one name an entry has: from a GNU record, a PAX record, or else the header. Both
/// records at once, or a record that is empty, are refused.
fn pick_name(
    long: Option<Vec<u8>>,
    pax: Option<&[u8]>,
    header: Vec<u8>,
    what: &str,
) -> Result<Vec<u8>, Refusal> {
    let shown_header = header.clone();
    let name = match (long, pax) {
        (Some(_), Some(pax)) => {
            return Err(Refusal::entry(
                pax,
                format!(
                    "both a GNU long {what} record and a PAX one; tar readers disagree on which wins"
                ),
            ));
        }
        (Some(long), None) => long,
        (None, Some(pax)) => pax.to_vec(),
        (None, None) => return Ok(header),
    };
    if name.is_empty() {
        return Err(Refusal::entry(
            &shown_header,
            format!("its {what} record is empty"),
        ));
    }
    Ok(name)
}

/// Reads an extension record's data, refusing it by its declared size first.
fn read_record<R: Read>(
    member: &mut tar::Entry<'_, R>,
    what: &str,
    max: u64,
) -> Result<Vec<u8>, Refusal> {
    let size = member.size();
    if size > max {
        return Err(Refusal::record(format!(
            "{what} record declares {size} bytes, past the {max}-byte limit for it"
        )));
    }
    let mut data = Vec::with_capacity(size as usize);
    member
        .read_to_end(&mut data)
        .map_err(|e| Refusal::record(format!("reading {what} record: {e}")))?;
    Ok(data)
}

fn store_once(slot: &mut Option<Vec<u8>>, value: Vec<u8>, what: &str) -> Result<(), Refusal> {
    if slot.is_some() {
        return Err(Refusal::record(format!(
            "two {what} records describe the same entry"
        )));
    }
    *slot = Some(value);
    Ok(())
}

/// GNU tar NUL-terminates long names.
fn trim_nuls(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last() == Some(&0) {
        bytes.pop();
    }
    bytes
}
