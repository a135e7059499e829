//! Lazy pulling's data path for real: a FUSE filesystem (lamina-lazy) serving an eStargz
//! layer's files from its chunks, read directly, through overlay's data-only lower as a
//! composefs rootfs reaches them, and through a mapping of that overlay file (which no
//! fanotify event would have covered); a range read fetches only the chunks that cover it,
//! and a chunk that cannot be fetched fails the read with EIO, never zeros.

#![allow(clippy::unwrap_used)]

use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lamina_image::lazy::LazyFile;
use lamina_image::lazy::estargz::{FOOTER_SIZE, read_toc, toc_offset};
use lamina_integration::{ScratchFs, require_root};
use lamina_lazy::{ChunkSource, LazyObject, ObjectsFs};
use lamina_sample::LayerBuilder;

/// 300 KiB no two 64 KiB chunks of which are alike.
fn big() -> Vec<u8> {
    (0..300 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect()
}

/// A blob in memory that counts what is fetched of it and can be made to fail.
struct Blob {
    bytes: Vec<u8>,
    fetches: AtomicU64,
    fetched_bytes: AtomicU64,
    failing: AtomicBool,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Arc<Blob> {
        Arc::new(Blob {
            bytes,
            fetches: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            failing: AtomicBool::new(false),
        })
    }
}

impl ChunkSource for Blob {
    fn fetch(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(io::Error::other("the registry is gone"));
        }
        self.fetches.fetch_add(1, Ordering::SeqCst);
        self.fetched_bytes.fetch_add(end - start, Ordering::SeqCst);
        Ok(self.bytes[start as usize..end as usize].to_vec())
    }
}

/// The layer's files, from its eStargz blob's TOC.
fn layer() -> (Vec<u8>, Vec<LazyFile>) {
    let tar = LayerBuilder::new()
        .file("big", 0o755, &big())
        .and_then(|b| b.file("small", 0o644, b"small\n"))
        .and_then(LayerBuilder::finish)
        .unwrap();
    let layer = lamina_sample::estargz::estargz(&tar, 64 * 1024).unwrap();
    let len = layer.blob.len() as u64;
    let offset = toc_offset(&layer.blob[(len - FOOTER_SIZE) as usize..], len).unwrap();
    let toc = read_toc(
        &layer.blob[offset as usize..(len - FOOTER_SIZE) as usize],
        &layer.toc_digest,
    )
    .unwrap();
    let files = toc.files(offset).unwrap();
    (layer.blob, files)
}

/// One object per file, named by its digest, its sparse copy in `copies`.
fn objects_of(files: &[LazyFile], copies: &Path) -> Vec<LazyObject> {
    files
        .iter()
        .map(|file| LazyObject {
            name: file.digest.hex().into(),
            file: file.clone(),
            copy: copies.join(file.digest.hex()),
        })
        .collect()
}

/// Unmounts `target` when dropped (a test that fails leaves no mount).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A composefs-shaped overlay over `objects` as its data-only lower: `meta/<name>` a
/// metacopy file redirecting to `/<object>`.
fn overlay_over(dir: &Path, objects: &Path, name: &str, object: &str, size: u64) -> Mounted {
    let meta = dir.join("meta");
    let merged = dir.join("merged");
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::create_dir_all(&merged).unwrap();
    let file = meta.join(name);
    std::fs::File::create(&file).unwrap().set_len(size).unwrap();
    xattr(&file, "trusted.overlay.metacopy", b"");
    xattr(
        &file,
        "trusted.overlay.redirect",
        format!("/{object}").as_bytes(),
    );
    let options = format!(
        "lowerdir={}::{},metacopy=on,redirect_dir=follow",
        meta.display(),
        objects.display()
    );
    let status = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged)
        .status()
        .unwrap();
    assert!(status.success(), "mounting the overlay");
    Mounted(merged)
}

/// Sets xattr `name` on `path`, as composefs's image gives overlay its markers.
#[allow(clippy::disallowed_methods)] // the test makes overlay's markers by hand
fn xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::setxattr(path, name, value, rustix::fs::XattrFlags::empty())
        .unwrap_or_else(|e| panic!("setting {name} on {}: {e}", path.display()));
}

#[test]
fn a_lazy_file_is_read_through_fuse_overlay_and_a_mapping_and_fails_with_eio() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let (bytes, files) = layer();
    let blob = Blob::new(bytes);
    let copies = fs.path().join("copies");
    std::fs::create_dir_all(&copies).unwrap();
    let objects: Vec<LazyObject> = objects_of(&files, &copies);
    let big_file = files.iter().find(|f| f.name == "big").unwrap();
    let big_name = big_file.digest.hex().to_string();
    let mountpoint = fs.path().join("objects");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let session = ObjectsFs::new(objects, blob.clone())
        .unwrap()
        .mount(&mountpoint)
        .unwrap();

    // A range read fetches the one chunk that covers it.
    let file = std::fs::File::open(mountpoint.join(&big_name)).unwrap();
    let mut buf = vec![0; 4096];
    file.read_exact_at(&mut buf, 100 * 1024).unwrap();
    assert_eq!(buf, big()[100 * 1024..104 * 1024]);
    assert_eq!(blob.fetches.load(Ordering::SeqCst), 1, "one chunk of five");

    // Through overlay's data-only lower, read and mapped: every byte, each chunk once.
    let overlay = overlay_over(fs.path(), &mountpoint, "big", &big_name, big_file.size);
    let through = overlay.0.join("big");
    assert_eq!(std::fs::read(&through).unwrap(), big());
    // Each chunk's member once (adjacent ones a read wants are fetched in one request).
    let members: u64 = big_file
        .chunks
        .iter()
        .map(|c| c.member.1 - c.member.0)
        .sum();
    assert_eq!(blob.fetched_bytes.load(Ordering::SeqCst), members);
    assert!(blob.fetches.load(Ordering::SeqCst) <= 5);
    let mapped = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import hashlib, mmap; f=open({:?},'rb'); m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ); print(hashlib.sha256(m[:]).hexdigest())",
            through.display().to_string()
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&mapped.stdout).trim(),
        big_file.digest.hex(),
        "{mapped:?}"
    );

    // The registry gone: a read of what was never fetched fails, it does not read zeros.
    blob.failing.store(true, Ordering::SeqCst);
    let small = files.iter().find(|f| f.name == "small").unwrap();
    let err = std::fs::read(mountpoint.join(small.digest.hex())).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(5), "EIO: {err}");
    // What was fetched stays readable.
    assert_eq!(std::fs::read(&through).unwrap(), big());
    drop(overlay);
    drop(session);
}

/// The same path from a real registry: the index read by ranges, each chunk fetched by
/// range the first time it is read; the registry stopped, a chunk never fetched fails its
/// read with EIO once the client's retries give up.
#[test]
fn a_lazy_layer_is_served_from_the_registry_and_fails_with_eio_once_it_stops() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let mut registry =
        lamina_integration::registry::Registry::start(&fs.path().join("registry"), None);
    let tar = LayerBuilder::new()
        .file("big", 0o755, &big())
        .and_then(|b| b.file("small", 0o644, b"small\n"))
        .and_then(LayerBuilder::finish)
        .unwrap();
    let stored = lamina_sample::estargz::estargz(&tar, 64 * 1024)
        .unwrap()
        .stored(&tar);
    let image = lamina_sample::build_image_from(
        vec![stored],
        &[],
        &["/big"],
        &lamina_image::Platform::host(),
    )
    .unwrap();
    let layout = fs.path().join("layout");
    lamina_sample::write_oci_layout(&layout, &[&image], &[(image.manifest.clone(), Some("v1"))])
        .unwrap();
    registry.push(&layout, "v1", "lazy/fuse:v1");

    let manifest: serde_json::Value =
        serde_json::from_slice(&registry.manifest("lazy/fuse:v1")).unwrap();
    let layer = &manifest["layers"][0];
    let digest = layer["digest"].as_str().unwrap().to_string();
    let size = layer["size"].as_u64().unwrap();
    let client = registry.client("lazy/fuse:v1");
    let footer = client
        .read_range(&digest, size, size - FOOTER_SIZE, FOOTER_SIZE)
        .unwrap();
    let offset = toc_offset(&footer, size).unwrap();
    let member = client
        .read_range(&digest, size, offset, size - FOOTER_SIZE - offset)
        .unwrap();
    let annotation = layer["annotations"][lamina_image::lazy::estargz::TOC_DIGEST_ANNOTATION]
        .as_str()
        .unwrap();
    let toc = read_toc(&member, &lamina_image::Digest::parse(annotation).unwrap()).unwrap();
    let files = toc.files(offset).unwrap();

    let copies = fs.path().join("copies");
    std::fs::create_dir_all(&copies).unwrap();
    let objects = objects_of(&files, &copies);
    let source = Arc::new(lamina_lazy::RegistryBlob {
        client,
        digest,
        size,
    });
    let mountpoint = fs.path().join("objects");
    std::fs::create_dir_all(&mountpoint).unwrap();
    let session = ObjectsFs::new(objects, source)
        .unwrap()
        .mount(&mountpoint)
        .unwrap();
    let big_file = files.iter().find(|f| f.name == "big").unwrap();
    let overlay = overlay_over(
        fs.path(),
        &mountpoint,
        "big",
        big_file.digest.hex(),
        big_file.size,
    );
    assert_eq!(std::fs::read(overlay.0.join("big")).unwrap(), big());

    registry.stop();
    let small = files.iter().find(|f| f.name == "small").unwrap();
    let err = std::fs::read(mountpoint.join(small.digest.hex())).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(5), "EIO: {err}");
    drop(overlay);
    drop(session);
}

/// The environment variable that makes [`serves_when_asked`] a server (a directory to
/// mount in), for the test that kills it.
const SERVE_IN: &str = "LAMINA_LAZY_SERVE_IN";

/// Not a test of its own: run by [`reads_fail_when_the_server_dies`] as a separate
/// process (this test binary again) that mounts the layer's objects at `$SERVE_IN/objects`,
/// says so in `$SERVE_IN/ready`, and serves until it is killed.
#[test]
fn serves_when_asked() {
    let Some(dir) = std::env::var_os(SERVE_IN).map(PathBuf::from) else {
        return;
    };
    let (bytes, files) = layer();
    let blob = Blob::new(bytes);
    let objects = objects_of(&files, &dir);
    let _session = ObjectsFs::new(objects, blob)
        .unwrap()
        .mount(&dir.join("objects"))
        .unwrap();
    std::fs::write(dir.join("ready"), "").unwrap();
    std::thread::sleep(std::time::Duration::from_secs(600));
}

#[test]
fn reads_fail_when_the_server_dies() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let dir = fs.path().to_path_buf();
    std::fs::create_dir_all(dir.join("objects")).unwrap();
    let mut server = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "serves_when_asked", "--nocapture"])
        .env(SERVE_IN, &dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mounted = Mounted(dir.join("objects"));
    lamina_integration::wait_until("the server to mount", || dir.join("ready").exists());
    let (_, files) = layer();
    let big_file = files.iter().find(|f| f.name == "big").unwrap();
    let file = std::fs::File::open(mounted.0.join(big_file.digest.hex())).unwrap();
    let mut buf = vec![0; 4096];
    file.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, big()[..4096]);
    server.kill().unwrap();
    server.wait().unwrap();
    // A range never fetched, after the server died: an error, not the copy's holes.
    let err = file.read_exact_at(&mut buf, 200 * 1024).unwrap_err();
    assert!(
        matches!(err.raw_os_error(), Some(107) | Some(5)),
        "ENOTCONN or EIO: {err}"
    );
    drop(file);
}
