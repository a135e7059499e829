//! Deterministic layer tars: fixed times and owners, entries in the order written.

use std::io;

use tar::{EntryType, Header};

/// Every entry gets this mtime, so the same inputs always give the same digests.
pub const SAMPLE_MTIME: u64 = 1_700_000_000;

pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl std::fmt::Debug for LayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBuilder").finish_non_exhaustive()
    }
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> Self {
        let mut tar = tar::Builder::new(Vec::new());
        tar.mode(tar::HeaderMode::Deterministic);
        Self { tar }
    }

    fn header(kind: EntryType, mode: u32, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(SAMPLE_MTIME);
        h.set_size(size);
        h
    }

    pub fn dir(mut self, path: &str, mode: u32) -> io::Result<Self> {
        let mut h = Self::header(EntryType::Directory, mode, 0);
        self.tar.append_data(&mut h, path, io::empty())?;
        Ok(self)
    }

    pub fn file(mut self, path: &str, mode: u32, data: &[u8]) -> io::Result<Self> {
        let mut h = Self::header(EntryType::Regular, mode, data.len() as u64);
        self.tar.append_data(&mut h, path, data)?;
        Ok(self)
    }

    /// A file with PAX `SCHILY.xattr.*` records.
    pub fn file_with_xattrs(
        mut self,
        path: &str,
        mode: u32,
        data: &[u8],
        xattrs: &[(&str, &[u8])],
    ) -> io::Result<Self> {
        let records: Vec<(String, &[u8])> = xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), *v))
            .collect();
        self.tar
            .append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), *v)))?;
        self.file(path, mode, data)
    }

    /// A character or block device (`kind` `Char` or `Block`), or a FIFO, owned by
    /// `uid`:`gid`.
    pub fn node(
        mut self,
        kind: EntryType,
        path: &str,
        (major, minor): (u32, u32),
        (uid, gid): (u64, u64),
    ) -> io::Result<Self> {
        let mut h = Self::header(kind, 0o660, 0);
        h.set_device_major(major)?;
        h.set_device_minor(minor)?;
        h.set_uid(uid);
        h.set_gid(gid);
        self.tar.append_data(&mut h, path, io::empty())?;
        Ok(self)
    }

    pub fn symlink(mut self, path: &str, target: &str) -> io::Result<Self> {
        let mut h = Self::header(EntryType::Symlink, 0o777, 0);
        self.tar.append_link(&mut h, path, target)?;
        Ok(self)
    }

    pub fn hardlink(mut self, path: &str, target: &str) -> io::Result<Self> {
        let mut h = Self::header(EntryType::Link, 0o644, 0);
        self.tar.append_link(&mut h, path, target)?;
        Ok(self)
    }

    /// An OCI whiteout hiding `path` of the layers below.
    pub fn whiteout(self, path: &str) -> io::Result<Self> {
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        let marker = if dir.is_empty() {
            format!(".wh.{name}")
        } else {
            format!("{dir}/.wh.{name}")
        };
        self.file(&marker, 0o644, b"")
    }

    /// An OCI opaque marker: `dir` hides everything the layers below have in it.
    pub fn opaque(self, dir: &str) -> io::Result<Self> {
        self.file(&format!("{dir}/.wh..wh..opq"), 0o644, b"")
    }

    /// An entry whose name and link target are written into the header verbatim,
    /// bypassing the `tar` crate's path checks: how hostile test layers get `../` and
    /// absolute names past the builder. Names must fit the 100-byte ustar fields.
    pub fn raw(
        mut self,
        kind: EntryType,
        name: &str,
        link: Option<&str>,
        data: &[u8],
    ) -> io::Result<Self> {
        let mut h = Self::header(kind, 0o644, data.len() as u64);
        let fits = name.len() <= 100 && link.is_none_or(|l| l.len() <= 100);
        if !fits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "raw names must fit in 100 bytes",
            ));
        }
        h.as_old_mut().name = [0; 100];
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(link) = link {
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_cksum();
        self.tar.append(&h, data)?;
        Ok(self)
    }

    /// An entry named (and linked) by PAX records, byte for byte, plus any `extra` PAX
    /// records: how test layers get non-UTF-8 names, names past PATH_MAX, and xattrs a
    /// layer should not carry.
    pub fn pax(
        mut self,
        kind: EntryType,
        name: &[u8],
        link: Option<&[u8]>,
        data: &[u8],
        extra: &[(&str, &[u8])],
    ) -> io::Result<Self> {
        let mut records: Vec<(&str, &[u8])> = vec![("path", name)];
        if let Some(link) = link {
            records.push(("linkpath", link));
        }
        records.extend_from_slice(extra);
        self.tar.append_pax_extensions(records)?;
        let mut h = Self::header(kind, 0o644, data.len() as u64);
        h.as_old_mut().name[..11].copy_from_slice(b"pax-entry\0\0");
        h.set_cksum();
        self.tar.append(&h, data)?;
        Ok(self)
    }

    /// The tar so far plus one regular-file header that declares `declared` bytes but is
    /// followed by only `data`, and no end-of-archive marker: a stream that lies about
    /// its size and then stops.
    pub fn lying_entry(mut self, name: &str, declared: u64, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut h = Self::header(EntryType::Regular, 0o644, declared);
        h.set_path(name)?;
        h.set_cksum();
        let mut bytes = std::mem::take(self.tar.get_mut());
        bytes.extend_from_slice(h.as_bytes());
        bytes.extend_from_slice(data);
        Ok(bytes)
    }

    pub fn finish(self) -> io::Result<Vec<u8>> {
        self.tar.into_inner()
    }
}
