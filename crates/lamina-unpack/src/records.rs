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
            // unread (the iterator steps over its data), as containerd does.
            EntryType::XGlobalHeader => Ok(Member::Record),
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
        let mut name = self
            .long_name
            .unwrap_or_else(|| header.path_bytes().into_owned());
        let mut link = self
            .long_link
            .or_else(|| header.link_name_bytes().map(|l| l.into_owned()));
        let mut meta = Meta {
            mode: header.mode().unwrap_or(0o644),
            uid: header.uid().unwrap_or(0) as u32,
            gid: header.gid().unwrap_or(0) as u32,
            mtime: header.mtime().unwrap_or(0) as i64,
            xattrs: Vec::new(),
        };
        if let Some(pax) = &self.pax {
            // PAX `path` wins over a GNU long name and the header, as in Go's archive/tar
            // (containerd's reader).
            let fields = apply_pax(pax, &mut meta, size, &name)?;
            name = fields.path.unwrap_or(name);
            link = fields.linkpath.or(link);
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

/// The PAX fields that replace header fields.
#[derive(Debug, Default)]
struct PaxFields {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
}

fn apply_pax(pax: &[u8], meta: &mut Meta, size: u64, name: &[u8]) -> Result<PaxFields, Refusal> {
    let mut fields = PaxFields::default();
    for record in tar::PaxExtensions::new(pax) {
        let record =
            record.map_err(|e| Refusal::entry(name, format!("malformed PAX record: {e}")))?;
        let (key, value) = (record.key_bytes(), record.value_bytes());
        let number = || {
            std::str::from_utf8(value)
                .ok()
                .and_then(|s| s.split('.').next()?.parse::<i64>().ok())
        };
        match key {
            b"path" => fields.path = Some(value.to_vec()),
            b"linkpath" => fields.linkpath = Some(value.to_vec()),
            b"uid" => meta.uid = number().unwrap_or(meta.uid as i64) as u32,
            b"gid" => meta.gid = number().unwrap_or(meta.gid as i64) as u32,
            b"mtime" => meta.mtime = number().unwrap_or(meta.mtime),
            // The raw reader steps over the header's size; a different PAX size would
            // make lamina and other readers see different archives.
            b"size" if number() != i64::try_from(size).ok() => {
                return Err(Refusal::entry(
                    name,
                    format!(
                        "PAX size `{}` differs from the header's {size} bytes (entries past \
                         8 GiB are not supported)",
                        crate::shown(value)
                    ),
                ));
            }
            _ if key.starts_with(b"GNU.sparse.") => {
                return Err(Refusal::entry(name, SPARSE_REFUSED));
            }
            _ => {
                if let Some(xattr) = key.strip_prefix(b"SCHILY.xattr.")
                    && !metadata::is_reserved_xattr(xattr)
                {
                    meta.xattrs.push((xattr.to_vec(), value.to_vec()));
                }
            }
        }
    }
    Ok(fields)
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
