//! Opening a file of the store that must be a regular one: a lock, a container's record,
//! a layer's file. Only root can put anything else in the store, but a FIFO there would
//! block the open until a reader or writer came, and every create, delete, `clean` or
//! `check` that opened it with it. So the open does not wait (`O_NONBLOCK`, which flock
//! and reads of a regular file ignore), does not follow a symlink, and anything but a
//! regular file is refused, naming what it is. (A device is refused after its open has
//! run.)

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;

/// Opens the regular file at `path` to read; a missing one is `NotFound`, as from
/// `File::open`.
pub fn open_regular_file(path: &Path) -> std::io::Result<File> {
    open(path, OpenOptions::new().read(true))
}

/// Opens the regular file at `path` to write at its end; a missing one is `NotFound`.
pub fn open_regular_file_to_append(path: &Path) -> std::io::Result<File> {
    open(path, OpenOptions::new().append(true))
}

/// The bytes of the regular file at `path`, as `fs::read` reads them, for a file of the
/// store that must be one: a record, a marker, a layer's `layer.json`. Anything else is
/// refused at once, so a FIFO there cannot hang `check` or `stats`.
pub fn read_regular_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular_file(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// [`read_regular_file`] for a file its reader bounds: one longer than `most` bytes is
/// refused ("too large") after reading at most one byte past the bound.
pub fn read_regular_file_at_most(path: &Path, most: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open_regular_file(path)?
        .take(most + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > most {
        return Err(std::io::Error::other("too large"));
    }
    Ok(bytes)
}

/// [`read_regular_file`] as UTF-8, as `fs::read_to_string` reads it.
pub fn read_regular_to_string(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_regular_file(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Refuses `path` if something other than a regular file is there (nothing there is
/// fine): for a file a library opens itself, as SQLite opens its database and log.
pub fn refuse_non_regular(path: &Path) -> std::io::Result<()> {
    match path.symlink_metadata() {
        Ok(meta) if meta.file_type().is_symlink() => Err(not_regular("a symlink")),
        Ok(meta) if !meta.file_type().is_file() => {
            Err(not_regular(file_type_name(meta.file_type())))
        }
        _ => Ok(()),
    }
}

/// Opens `path` as `how` says, refusing anything but a regular file.
pub(crate) fn open(path: &Path, how: &mut OpenOptions) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = how
        .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW).bits() as i32)
        .open(path)
        .map_err(|e| refused_open(path, e))?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(file_type_name(kind)));
    }
    Ok(file)
}

/// An open's error, said as what is at `path` when that is why (the path itself a
/// symlink: `ELOOP`; a FIFO or socket with nobody at the other end: `ENXIO`); else as
/// the kernel said it (a loop in a parent directory is `ELOOP` too).
fn refused_open(path: &Path, e: std::io::Error) -> std::io::Error {
    let why = rustix::io::Errno::from_io_error(&e);
    if !matches!(why, Some(rustix::io::Errno::LOOP | rustix::io::Errno::NXIO)) {
        return e;
    }
    match path.symlink_metadata() {
        Ok(meta) if meta.file_type().is_symlink() => not_regular("a symlink"),
        Ok(meta) if !meta.file_type().is_file() => not_regular(file_type_name(meta.file_type())),
        _ => e,
    }
}

fn not_regular(what: &str) -> std::io::Error {
    std::io::Error::other(format!("it must be a regular file, and this is {what}"))
}

/// What a file that is not a regular one is, for the error.
fn file_type_name(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}
