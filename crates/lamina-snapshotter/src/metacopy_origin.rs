//! Where overlay finds the data of a metadata-only copy-up: the lookup a commit repeats
//! to fill one in (`complete.rs`). It follows the kernel's (`fs/overlayfs/namei.c`):
//!
//! - A path is looked up one name at a time. Each directory has a stack of the lower
//!   layers it was found in as a directory, top-most first; the root's is every layer.
//! - The name asked of the layers below can be rewritten by a redirect
//!   (`trusted.overlay.redirect`, written when a directory or a metadata-only file is
//!   renamed). A relative redirect replaces one name; an absolute one (`/a/b`) is a path
//!   from every layer's root, and sends the lookup to the root's stack from the next layer
//!   on, whatever stack the parent had. A redirect met part-way along an absolute path in
//!   one layer rewrites that path for the layers below it, keeping what follows.
//! - An opaque directory, a whiteout, or a non-directory where a directory is needed
//!   stops the lookup: nothing below is seen. The first regular file found is the data.
//!
//! A file copied up by metadata inside a renamed directory has no redirect of its own:
//! its data is at the directory's old name (after `mv a c; chmod 600 c/f` it is not the
//! lower's `c/f`; after `mkdir /backup; mv /etc/conf /backup/` the lower has no
//! `backup/conf`). Every layer is reached beneath its root, no symlink followed
//! (`beneath::Tree`), as overlay follows none either.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
use std::rc::Rc;

use lamina_store::beneath::{Tree, pin_at, proc_path};
use lamina_sys::{At, HostFs};
use rustix::fs::FileType;
use rustix::io::Errno;

pub(crate) const REDIRECT: &str = "trusted.overlay.redirect";
const OPAQUE: &str = "trusted.overlay.opaque";
pub(crate) const METACOPY: &str = "trusted.overlay.metacopy";

/// One layer in which a directory was found, and the directory there (`O_PATH`): each
/// name is looked up from its parent's descriptor, so a deep path costs one lookup a
/// name, not one a name per name (as a walk from the root for each name would).
type Found = (usize, Rc<OwnedFd>);

/// The data of the metadata-only copy at `rel` in `upper` (whose own inode `pinned`
/// reaches), opened to read, from `lowers` (top-most first); `None` when no layer has it.
pub(crate) fn open_origin(
    host: &dyn HostFs,
    upper: &Tree,
    rel: &Path,
    pinned: &OwnedFd,
    lowers: &[Tree],
    objects: Option<&Tree>,
) -> io::Result<Option<File>> {
    let names: Vec<&OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::other(format!(
                "{}: not a plain path",
                rel.display()
            ))),
        })
        .collect::<io::Result<_>>()?;
    let Some((file_name, dir_names)) = names.split_last() else {
        return Ok(None);
    };
    let root: Vec<Found> = lowers
        .iter()
        .enumerate()
        .map(|(i, lower)| Ok((i, Rc::new(pin_at(lower.root(), Path::new(""))?.0))))
        .collect::<io::Result<_>>()?;
    let mut stack = root.clone();
    let (mut at, _) = pin_at(upper.root(), Path::new(""))?;
    for dir_name in dir_names {
        let (dir, _) = pin_at(at.as_fd(), Path::new(dir_name))?;
        // An opaque directory of the upper hides every layer below; its redirect, if
        // any, is not read (the kernel stops there too).
        stack = if marked(host, &dir, OPAQUE)? {
            Vec::new()
        } else {
            let mut lookup = Lookup::new(host, dir_name, redirect_of(host, &dir)?, true, objects);
            lookup.run(&root, &stack)?.dirs
        };
        at = dir;
    }
    let mut lookup = Lookup::new(host, file_name, redirect_of(host, pinned)?, false, objects);
    Ok(lookup.run(&root, &stack)?.file)
}

/// One name's lookup in the lower layers (the kernel's `ovl_lookup_data`).
struct Lookup<'h> {
    /// Reads the entries' overlay xattrs (the kernel seam).
    host: &'h dyn HostFs,
    /// The name asked: one name, or a path from the root (starting with `/`).
    name: Vec<u8>,
    /// Found as a directory (or looking for one, below a directory of the upper).
    is_dir: bool,
    stop: bool,
    /// The store's `objects/`, where a lower's stub (`lamina_store::object_layers`)
    /// keeps its data: a data-only layer, reached through a stub's redirect alone.
    objects: Option<&'h Tree>,
    /// The object the last stub met names, read when no layer has the data.
    data_only: Option<std::path::PathBuf>,
}

/// What a [`Lookup`] found: the layers the name is a directory in, or its data.
#[derive(Default)]
struct Outcome {
    dirs: Vec<Found>,
    file: Option<File>,
}

impl<'h> Lookup<'h> {
    /// The lookup of `own`, as the upper's entry (with `redirect`, if it has one) asks it
    /// of the layers below; `dir`: the upper's entry is a directory.
    fn new(
        host: &'h dyn HostFs,
        own: &OsStr,
        redirect: Option<Vec<u8>>,
        dir: bool,
        objects: Option<&'h Tree>,
    ) -> Self {
        Lookup {
            host,
            name: redirect.unwrap_or_else(|| own.as_bytes().to_vec()),
            is_dir: dir,
            stop: false,
            objects,
            data_only: None,
        }
    }

    fn absolute(&self) -> bool {
        self.name.first() == Some(&b'/')
    }

    /// Asks the layers of `parents` (the parent directory's stack), or every layer from
    /// the root once the name is an absolute path.
    fn run(&mut self, root: &[Found], parents: &[Found]) -> io::Result<Outcome> {
        let mut from_root = self.absolute();
        let mut stack = if from_root {
            root.to_vec()
        } else {
            parents.to_vec()
        };
        let mut outcome = Outcome::default();
        let mut k = 0;
        while !self.stop
            && let Some((layer, parent)) = stack.get(k).cloned()
        {
            k += 1;
            match self.in_layer(&root[layer].1, &parent)? {
                Some(Entry::Dir(dir)) => outcome.dirs.push((layer, Rc::new(dir))),
                Some(Entry::File(fd)) => {
                    outcome.file = Some(File::open(proc_path(&fd))?);
                    return Ok(outcome);
                }
                None => {}
            }
            if self.absolute() && !from_root {
                // The layers below this one, each from its root.
                from_root = true;
                stack = root[layer + 1..].to_vec();
                k = 0;
            }
        }
        // No layer had the data: the data-only lower, as overlay looks there last.
        if let (Some(objects), Some(object)) = (self.objects, self.data_only.take()) {
            outcome.file = Some(objects.open_regular(&object)?);
        }
        Ok(outcome)
    }

    /// The name in one layer (whose root is `layer_root`): a single name under `parent`,
    /// or a path walked from the layer's root a name at a time (a redirect on the way
    /// rewrites what follows for the layers below, and this layer's walk goes on from the
    /// directory it found).
    fn in_layer(&mut self, layer_root: &OwnedFd, parent: &OwnedFd) -> io::Result<Option<Entry>> {
        if !self.absolute() {
            let name = OsStr::from_bytes(&self.name).to_os_string();
            return self.single(parent, &name, 0, &[], true);
        }
        let mut base: Option<OwnedFd> = None;
        // Bytes of the name left to walk, the leading `/` of the next name included.
        let mut rem = self.name.len();
        loop {
            let start = self.name.len() - rem + 1;
            let rest = &self.name[start..];
            let len = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
            let end = len == rest.len();
            let name = OsStr::from_bytes(&rest[..len]).to_os_string();
            let post = self.name[start + len..].to_vec();
            let from = base.as_ref().unwrap_or(layer_root);
            match self.single(from, &name, start, &post, end)? {
                Some(Entry::Dir(dir)) if !end => base = Some(dir),
                found => return Ok(found),
            }
            rem = post.len();
        }
    }

    /// One name looked up in the directory `dir` of a layer (the kernel's
    /// `ovl_lookup_single`): `prelen` bytes of the asked name come before it and `post`
    /// after it; `last`: it is the name's last element.
    fn single(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        prelen: usize,
        post: &[u8],
        last: bool,
    ) -> io::Result<Option<Entry>> {
        let (fd, stat) = match pin_at(dir.as_fd(), Path::new(name)) {
            Ok(pinned) => pinned,
            Err(e) if matches!(Errno::from_io_error(&e), Some(Errno::NOENT | Errno::NOTDIR)) => {
                return Ok(None);
            }
            // A symlink: a non-directory, which ends the lookup as the kernel's does.
            Err(e) if Errno::from_io_error(&e) == Some(Errno::LOOP) => {
                self.stop = true;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                if last {
                    self.is_dir = true;
                }
                if marked(self.host, &fd, OPAQUE)? {
                    self.stop = true;
                } else {
                    self.follow(&fd, prelen, post)?;
                }
                Ok(Some(Entry::Dir(fd)))
            }
            // A lower's own metadata-only copy (a layer committed without its data filled
            // in, by an older lamina or elsewhere) holds no data: the lookup goes on below
            // it, where its redirect says; taken for the data, it would fill the file with
            // zeros.
            FileType::RegularFile if last && !self.is_dir && has(self.host, &fd, METACOPY)? => {
                // A layer's stub names its object: where overlay reads the data if no
                // layer below has the redirect's path (the data-only lower comes last).
                if self.objects.is_some()
                    && let Some(redirect) = redirect_of(self.host, &fd)?
                    && let Some(object) = lamina_store::object_layers::object_of_redirect(&redirect)
                {
                    self.data_only = Some(object);
                }
                self.follow(&fd, prelen, post)?;
                Ok(None)
            }
            FileType::RegularFile if last && !self.is_dir => {
                self.stop = true;
                Ok(Some(Entry::File(fd)))
            }
            // A whiteout, or a non-directory on the way or where a directory was found
            // above: what is below is hidden.
            _ => {
                self.stop = true;
                Ok(None)
            }
        }
    }
}

impl<'h> Lookup<'h> {
    /// Takes the redirect of the entry `fd` pins, if it has one, as the name the layers
    /// below are asked (the kernel's `ovl_check_redirect`): an absolute one with what
    /// follows it, a relative one in place of this name. An absolute redirect goes on
    /// even where an opaque directory above it on the way had stopped the lookup: after
    /// `mkdir -p q/r; mv a/b/c q/r/cc` in one layer, a file moved out of `cc` in the next
    /// is found only so, and its commit fails otherwise.
    fn follow(&mut self, fd: &OwnedFd, prelen: usize, post: &[u8]) -> io::Result<()> {
        let Some(redirect) = redirect_of(self.host, fd)? else {
            return Ok(());
        };
        let mut name = if redirect.first() == Some(&b'/') {
            self.stop = false;
            redirect
        } else {
            [&self.name[..prelen], &redirect[..]].concat()
        };
        name.extend_from_slice(post);
        self.name = name;
        Ok(())
    }
}

/// What one layer has at a name.
enum Entry {
    Dir(OwnedFd),
    File(OwnedFd),
}

/// The redirect of the entry `fd` pins, if it has one: one name, or a path from the
/// root. Anything else (`..`, `.`, an empty name, a `/` in a relative one) is refused,
/// as the kernel refuses it.
fn redirect_of(host: &dyn HostFs, fd: &OwnedFd) -> io::Result<Option<Vec<u8>>> {
    let Some(raw) = host.get_xattr(At::Fd(fd.as_fd()), OsStr::new(REDIRECT))? else {
        return Ok(None);
    };
    let plain = |name: &[u8]| !name.is_empty() && name != b"." && name != b"..";
    let valid = match raw.strip_prefix(b"/") {
        Some(path) => path.split(|&b| b == b'/').all(plain),
        None => plain(&raw) && !raw.contains(&b'/'),
    };
    if !valid {
        return Err(io::Error::other(format!(
            "redirect {:?} is neither a name nor a path from the root",
            OsStr::from_bytes(&raw)
        )));
    }
    Ok(Some(raw))
}

/// Whether the entry `fd` pins has xattr `name`, whatever its value.
pub(crate) fn has(host: &dyn HostFs, fd: &OwnedFd, name: &str) -> io::Result<bool> {
    Ok(host
        .get_xattr(At::Fd(fd.as_fd()), OsStr::new(name))?
        .is_some())
}

/// Whether the entry `fd` pins has xattr `name` set to `y` (overlay's opaque mark).
fn marked(host: &dyn HostFs, fd: &OwnedFd, name: &str) -> io::Result<bool> {
    Ok(host
        .get_xattr(At::Fd(fd.as_fd()), OsStr::new(name))?
        .as_deref()
        == Some(b"y"))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    fn mark(path: &Path, name: &str, value: &[u8]) {
        lamina_sys::HostFs::set_xattr(
            &lamina_sys::RealHost,
            lamina_sys::At::Path(path),
            std::ffi::OsStr::new(name),
            value,
        )
        .unwrap();
    }

    /// A lower layer's own metadata-only copy is looked through, following its redirect,
    /// as the kernel does: the data is in the layer below. Guards against the fill taking
    /// the empty copy for the data and writing zeros.
    #[test]
    fn a_lower_layers_metadata_only_copy_is_looked_through() {
        let base = tempfile::tempdir_in(
            Some("/dev/shm")
                .filter(|p| Path::new(p).is_dir())
                .unwrap_or("/tmp"),
        )
        .unwrap();
        let (upper, middle, bottom) = (
            base.path().join("upper"),
            base.path().join("middle"),
            base.path().join("bottom"),
        );
        for dir in [&upper, &middle, &bottom] {
            fs::create_dir(dir).unwrap();
        }
        fs::write(bottom.join("f"), "F-data").unwrap();
        fs::write(bottom.join("h"), "H-data").unwrap();
        // The middle layer copied f's metadata only, and renamed h to h2 the same way.
        for (name, redirect) in [("f", None), ("h2", Some(&b"/h"[..]))] {
            fs::File::create(middle.join(name))
                .unwrap()
                .set_len(6)
                .unwrap();
            mark(&middle.join(name), super::METACOPY, b"");
            if let Some(to) = redirect {
                mark(&middle.join(name), super::REDIRECT, to);
            }
            fs::File::create(upper.join(name))
                .unwrap()
                .set_len(6)
                .unwrap();
            mark(&upper.join(name), super::METACOPY, b"");
        }
        let filled = crate::complete::complete_metacopies(
            &lamina_sys::RealHost,
            &upper,
            &[middle.clone(), bottom.clone()],
            None,
        )
        .unwrap();
        assert_eq!(filled, 2);
        assert_eq!(fs::read_to_string(upper.join("f")).unwrap(), "F-data");
        assert_eq!(fs::read_to_string(upper.join("h2")).unwrap(), "H-data");
    }

    /// A layer's stub (a store whose layers keep their data in objects) is filled from
    /// the object its redirect names, looked for last, as overlay does: a layer below
    /// with a file at that path would be what the container read (an import keeps its
    /// files whole above such a layer: `object_layers::could_shadow_objects`), and
    /// without the objects the commit fails rather than fill zeros.
    #[test]
    fn a_stub_below_is_filled_from_its_object_and_only_from_it() {
        let base = tempfile::tempdir_in(
            Some("/dev/shm")
                .filter(|p| Path::new(p).is_dir())
                .unwrap_or("/tmp"),
        )
        .unwrap();
        let dirs: Vec<_> = ["upper", "layer", "decoy", "objects/ab"]
            .iter()
            .map(|d| base.path().join(d))
            .collect();
        for dir in &dirs {
            fs::create_dir_all(dir).unwrap();
        }
        let (upper, layer, decoy) = (&dirs[0], &dirs[1], &dirs[2]);
        let name = "ab/qwertyuiopasdfghjklz";
        fs::write(base.path().join("objects").join(name), "object").unwrap();
        // A layer below the stub's holds a file at the object's path.
        fs::create_dir(decoy.join("ab")).unwrap();
        fs::write(decoy.join(name), "decoy!").unwrap();
        fs::File::create(layer.join("f"))
            .unwrap()
            .set_len(6)
            .unwrap();
        mark(&layer.join("f"), super::METACOPY, b"");
        mark(
            &layer.join("f"),
            super::REDIRECT,
            format!("/{name}").as_bytes(),
        );
        let copy_up = || {
            fs::File::create(upper.join("f"))
                .unwrap()
                .set_len(6)
                .unwrap();
            mark(&upper.join("f"), super::METACOPY, b"");
        };
        copy_up();
        let lowers = [layer.clone(), decoy.clone()];
        let objects = base.path().join("objects");
        let fill = |objects: Option<&Path>| {
            fs::remove_file(upper.join("f")).unwrap();
            copy_up();
            crate::complete::complete_metacopies(&lamina_sys::RealHost, upper, &lowers, objects)
                .map(|filled| (filled, fs::read_to_string(upper.join("f")).unwrap()))
        };
        assert_eq!(fill(Some(&objects)).unwrap(), (1, "decoy!".into()));
        fs::remove_file(decoy.join(name)).unwrap();
        assert_eq!(fill(Some(&objects)).unwrap(), (1, "object".into()));
        let err = fill(None).unwrap_err();
        assert!(err.to_string().contains("no lower layer has"), "{err}");
    }
}
