//! Named files of an image source, wherever they live: a directory (OCI layout) or a tar
//! archive (oci-archive, docker-archive). A tar is indexed once — each member's offset and
//! length — and members are then read in place, so nothing is extracted to disk first.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::ImageError;
use crate::documents::{MAX_DOCUMENT_BYTES, check_document_size};

/// Where a member's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobLocation {
    File(PathBuf),
    Range {
        archive: PathBuf,
        offset: u64,
        len: u64,
    },
    /// Fetched when opened: a registry blob, streamed straight into the importer.
    Remote(RemoteBlob),
}

/// Opens a fresh stream of a remote blob (each open is a new request).
pub type RemoteOpener = dyn Fn() -> io::Result<Box<dyn Read + Send>> + Send + Sync;

/// A blob somewhere else (a registry, a non-distributable layer's URL), opened on demand.
#[derive(Clone)]
pub struct RemoteBlob {
    /// Where it comes from, for logs and errors (never credentials).
    pub from: String,
    pub size: u64,
    pub opener: std::sync::Arc<RemoteOpener>,
}

impl std::fmt::Debug for RemoteBlob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteBlob")
            .field("from", &self.from)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Two remote blobs are the same location when they come from the same place.
impl PartialEq for RemoteBlob {
    fn eq(&self, other: &Self) -> bool {
        self.from == other.from && self.size == other.size
    }
}

impl Eq for RemoteBlob {}

impl BlobLocation {
    pub fn open(&self) -> io::Result<Box<dyn Read + Send>> {
        match self {
            BlobLocation::File(path) => Ok(Box::new(File::open(path)?)),
            BlobLocation::Range {
                archive,
                offset,
                len,
            } => {
                let mut file = File::open(archive)?;
                file.seek(SeekFrom::Start(*offset))?;
                Ok(Box::new(file.take(*len)))
            }
            BlobLocation::Remote(remote) => (remote.opener)(),
        }
    }

    pub fn size(&self) -> io::Result<u64> {
        match self {
            BlobLocation::File(path) => Ok(std::fs::metadata(path)?.len()),
            BlobLocation::Range { len, .. } => Ok(*len),
            BlobLocation::Remote(remote) => Ok(remote.size),
        }
    }
}

/// Member files of a source, by relative name (`index.json`, `blobs/sha256/<hex>`).
#[derive(Debug)]
pub enum Members {
    Dir(PathBuf),
    Tar {
        archive: PathBuf,
        index: HashMap<String, (u64, u64)>,
    },
}

impl Members {
    pub fn dir(path: &Path) -> Self {
        Members::Dir(path.to_path_buf())
    }

    /// Indexes the regular files of a tar archive. Members are read raw and described
    /// by lamina-unpack's record rules, so a long-name or PAX record is refused by its
    /// declared size before it is buffered, and member data is seeked over, not read.
    pub fn tar(archive: &Path) -> Result<Self, ImageError> {
        let shown_archive = crate::shown(&archive.display().to_string());
        let fail = |e: io::Error| {
            let e = crate::shown(&e.to_string());
            ImageError::new(format!("reading archive {shown_archive}: {e}"))
        };
        let file = File::open(archive).map_err(fail)?;
        let mut tar = tar::Archive::new(file);
        let mut index = HashMap::new();
        let mut pending = lamina_unpack::Pending::default();
        for member in tar.entries_with_seek().map_err(fail)?.raw(true) {
            let mut member = member.map_err(fail)?;
            let position = member.raw_file_position();
            let described = match pending.read(&mut member) {
                Ok(lamina_unpack::Member::Record) => continue,
                Ok(lamina_unpack::Member::Entry(described)) => described,
                Err(refusal) => {
                    return Err(ImageError::new(format!(
                        "reading archive {shown_archive}: {refusal}"
                    )));
                }
            };
            if described.kind != lamina_unpack::Kind::File {
                continue;
            }
            let name = normalise(&String::from_utf8_lossy(&described.name));
            index.insert(name, (position, described.size));
        }
        Ok(Members::Tar {
            archive: archive.to_path_buf(),
            index,
        })
    }

    pub fn locate(&self, name: &str) -> Option<BlobLocation> {
        let name = normalise(name);
        match self {
            Members::Dir(root) => {
                // Names come from untrusted manifests: never let one leave the layout.
                if name.split('/').any(|c| c == ".." || c.is_empty()) {
                    return None;
                }
                let path = root.join(&name);
                path.is_file().then_some(BlobLocation::File(path))
            }
            Members::Tar { archive, index } => {
                index.get(&name).map(|&(offset, len)| BlobLocation::Range {
                    archive: archive.clone(),
                    offset,
                    len,
                })
            }
        }
    }

    pub fn source(&self) -> &Path {
        match self {
            Members::Dir(p) => p,
            Members::Tar { archive, .. } => archive,
        }
    }

    /// Reads a document member (a JSON file) whole. Its size is checked against
    /// [`MAX_DOCUMENT_BYTES`] before a byte is read, and the read stops there even if the
    /// member grows meanwhile.
    pub fn read(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let shown_name = crate::shown(name);
        let source = crate::shown(&self.source().display().to_string());
        let missing = || ImageError::new(format!("{source}: `{shown_name}` is missing"));
        let loc = self.locate(name).ok_or_else(missing)?;
        let fail = |e: io::Error| ImageError::new(format!("{source}: reading `{shown_name}`: {e}"));
        let size = loc.size().map_err(fail)?;
        check_document_size(&format!("`{shown_name}`"), size)?;
        // Room for the whole document and one byte more: read in one call, not in
        // doubling steps from 32 bytes (its size is bounded just above).
        let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(0).saturating_add(1));
        loc.open()
            .map_err(fail)?
            .take(MAX_DOCUMENT_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(fail)?;
        check_document_size(&format!("`{shown_name}`"), buf.len() as u64)?;
        Ok(buf)
    }
}

fn normalise(name: &str) -> String {
    name.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}
