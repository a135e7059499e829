//! Tars written header by header, so a header may declare a size its data does not have,
//! a type no builder writes, or a record far larger than any tool would: the shapes
//! hostile-layer tests feed the importer.

use tar::{EntryType, Header};

/// A tar written block by block, so headers may declare sizes their data does not have.
#[derive(Debug, Default)]
pub struct RawTar(Vec<u8>);

impl RawTar {
    /// A header of `kind` naming `name` that declares `size` bytes, followed by `data`
    /// (which may be shorter than `size`: the stream then ends early).
    pub fn member(&mut self, kind: u8, name: &str, size: u64, data: &[u8]) -> &mut Self {
        let mut h = Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(EntryType::new(kind));
        h.set_mode(0o644);
        h.set_size(size);
        h.set_cksum();
        self.push(&h, data)
    }

    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.member(b'0', name, data.len() as u64, data)
    }

    /// A PAX extended header (`x`) holding `records`, for the next member.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut body = Vec::new();
        for (key, value) in records {
            let rest = key.len() + value.len() + 3; // space, '=', newline
            let mut len = rest + 1;
            while len != rest + len.to_string().len() {
                len = rest + len.to_string().len();
            }
            body.extend_from_slice(format!("{len} {key}=").as_bytes());
            body.extend_from_slice(value);
            body.push(b'\n');
        }
        self.member(b'x', "pax", body.len() as u64, &body.clone())
    }

    /// An old-GNU sparse entry (`S`): `data` stored at `offset` of a file `real_size`
    /// long, the rest holes. A reader that writes holes out as zeros turns these few
    /// bytes into `real_size` bytes on disk.
    pub fn gnu_sparse(
        &mut self,
        name: &str,
        real_size: u64,
        offset: u64,
        data: &[u8],
    ) -> &mut Self {
        let mut h = Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(EntryType::GNUSparse);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        let gnu = h.as_gnu_mut().expect("a GNU header");
        let octal = |field: &mut [u8], n: u64| {
            let text = format!("{n:0width$o}", width = field.len() - 1);
            field[..text.len()].copy_from_slice(text.as_bytes());
        };
        octal(&mut gnu.realsize, real_size);
        octal(&mut gnu.sparse[0].offset, offset);
        octal(&mut gnu.sparse[0].numbytes, data.len() as u64);
        h.set_cksum();
        self.push(&h, data)
    }

    /// Appends header `h` and `data`, padded to whole blocks.
    fn push(&mut self, h: &Header, data: &[u8]) -> &mut Self {
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = data.len().div_ceil(512) * 512 - data.len();
        self.0.extend(std::iter::repeat_n(0, pad));
        self
    }

    /// The archive, with its end-of-archive blocks.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.0);
        out.extend(std::iter::repeat_n(0, 1024));
        out
    }
}
