//! Deterministic test images, built in code. The default is a two-layer busybox image
//! that boots in runc and exercises everything the importer must get right: a plain
//! whiteout, an opaque directory, hardlinks, a setuid file, symlinks and a PAX xattr.
//!
//! The same image is written as an OCI layout, an oci-archive, a docker-archive, and
//! (its base layer) a plain rootfs tar, so every source form is tested on one image.

mod image;
mod layer;
mod raw_tar;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub mod estargz;
pub mod zstd_chunked;
pub use image::{
    BuiltImage, Layer, StoredLayer, build_image, build_image_from, build_image_with_cmd,
    descriptor, tar_dir, write_docker_archive, write_oci_layout,
};
use lamina_image::{Compression, Platform};
pub use layer::{LayerBuilder, SAMPLE_MTIME};
pub use raw_tar::RawTar;
pub use tar::EntryType;

/// Where Debian's busybox-static puts its binary.
pub const DEFAULT_BUSYBOX: &str = "/usr/bin/busybox";

/// Applets the base layer links to busybox.
const APPLETS: &[&str] = &[
    "sh", "cat", "ls", "echo", "test", "stat", "id", "touch", "mkdir", "rm", "sleep", "true",
    "false", "head", "wc", "grep", "env", "readlink", "sync",
];

/// The env the sample image's config carries.
pub const SAMPLE_ENV: &[&str] = &["PATH=/usr/local/bin:/usr/bin:/bin", "LAMINA_SAMPLE=1"];

/// The ref name and docker tag the sample is written under.
pub const SAMPLE_REF: &str = "latest";
pub const SAMPLE_TAG: &str = "lamina/sample:latest";

/// Base layer: busybox, its applet links, /etc, and content the top layer hides.
pub fn base_layer(busybox: &[u8]) -> io::Result<Vec<u8>> {
    base_layer_builder(busybox)?.finish()
}

/// [`base_layer`] before it is finished, for entries after its own.
pub fn base_layer_builder(busybox: &[u8]) -> io::Result<LayerBuilder> {
    let mut l = LayerBuilder::new()
        .dir("bin", 0o755)?
        .file("bin/busybox", 0o755, busybox)?;
    for applet in APPLETS {
        l = l.symlink(&format!("bin/{applet}"), "busybox")?;
    }
    l.dir("etc", 0o755)?
        .file(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        )?
        .file("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n")?
        .file("etc/hosts", 0o644, b"127.0.0.1 localhost\n")?
        .hardlink("etc/hosts.hardlink", "etc/hosts")?
        .dir("tmp", 0o1777)?
        .dir("root", 0o700)?
        .dir("proc", 0o555)?
        .dir("sys", 0o555)?
        .dir("dev", 0o755)?
        .dir("old", 0o755)?
        .file("old/gone.txt", 0o644, b"the top layer whites this out\n")?
        .file("old/kept.txt", 0o644, b"kept\n")?
        .dir("opq", 0o755)?
        .file(
            "opq/base-only.txt",
            0o644,
            b"hidden by the opaque top dir\n",
        )
}

/// Top layer: a new file with an xattr, a whiteout, an opaque dir, a setuid file and a
/// hardlink created within the layer.
pub fn top_layer() -> io::Result<Vec<u8>> {
    LayerBuilder::new()
        .file_with_xattrs(
            "top.txt",
            0o644,
            b"from the top layer\n",
            &[("user.lamina", b"sample")],
        )?
        .hardlink("top.hardlink", "top.txt")?
        .whiteout("old/gone.txt")?
        .dir("opq", 0o755)?
        .opaque("opq")?
        .file("opq/top-only.txt", 0o644, b"only the top layer's opq\n")?
        .dir("usr", 0o755)?
        .dir("usr/local", 0o755)?
        .dir("usr/local/bin", 0o755)?
        .file("usr/local/bin/suid-tool", 0o4755, b"#!/bin/sh\necho suid\n")?
        .finish()
}

/// The sample image for this host: base layer gzip, top layer zstd.
pub fn busybox_image(busybox_path: &Path) -> io::Result<BuiltImage> {
    let busybox = fs::read(busybox_path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{}: {e} (install Debian's busybox-static)",
                busybox_path.display()
            ),
        )
    })?;
    let layers = [
        Layer {
            tar: base_layer(&busybox)?,
            compression: Compression::Gzip,
        },
        Layer {
            tar: top_layer()?,
            compression: Compression::Zstd,
        },
    ];
    build_image(&layers, SAMPLE_ENV, &Platform::host())
}

/// Paths of one image written in every format.
#[derive(Debug, Clone)]
pub struct SampleFiles {
    pub oci_layout: PathBuf,
    pub oci_archive: PathBuf,
    pub docker_archive: PathBuf,
    pub rootfs_tar: PathBuf,
}

impl SampleFiles {
    /// The four image references, in the forms `lamina create` takes.
    pub fn references(&self) -> [String; 4] {
        [
            format!("oci://{}:{SAMPLE_REF}", self.oci_layout.display()),
            format!("oci-archive://{}:{SAMPLE_REF}", self.oci_archive.display()),
            format!("docker-archive://{}", self.docker_archive.display()),
            self.rootfs_tar.display().to_string(),
        ]
    }
}

/// Writes `image` under `dir` as `layout/`, `image.oci.tar`, `image.docker.tar` and
/// (its base layer alone) `rootfs.tar`.
pub fn write_all_formats(image: &BuiltImage, dir: &Path) -> io::Result<SampleFiles> {
    fs::create_dir_all(dir)?;
    let files = SampleFiles {
        oci_layout: dir.join("layout"),
        oci_archive: dir.join("image.oci.tar"),
        docker_archive: dir.join("image.docker.tar"),
        rootfs_tar: dir.join("rootfs.tar"),
    };
    write_oci_layout(
        &files.oci_layout,
        &[image],
        &[(image.manifest.clone(), Some(SAMPLE_REF))],
    )?;
    tar_dir(&files.oci_layout, &files.oci_archive)?;
    write_docker_archive(image, SAMPLE_TAG, &files.docker_archive)?;
    fs::write(&files.rootfs_tar, &image.layers[0].1)?;
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_deterministic() {
        let fake_busybox = tempfile::NamedTempFile::new().unwrap();
        fs::write(fake_busybox.path(), b"not really busybox").unwrap();
        let a = busybox_image(fake_busybox.path()).unwrap();
        let b = busybox_image(fake_busybox.path()).unwrap();
        assert_eq!(a.manifest.digest, b.manifest.digest);
        assert_eq!(a.layers.len(), 2);
    }
}
