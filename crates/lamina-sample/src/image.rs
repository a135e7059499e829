//! Assembling layers into an image and writing it in each source format lamina reads.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

use lamina_image::spec::{self, Descriptor, ImageConfig, Index, Manifest, PlatformSpec, RootFs};
use lamina_image::{Compression, Digest, Platform};

/// One layer: its uncompressed tar and how to store it.
#[derive(Debug, Clone)]
pub struct Layer {
    pub tar: Vec<u8>,
    pub compression: Compression,
}

/// A built image: every blob by digest, plus the manifest descriptor that roots them.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub blobs: BTreeMap<Digest, Vec<u8>>,
    pub manifest: Descriptor,
    pub config: ImageConfig,
    pub config_digest: Digest,
    /// (stored blob digest, uncompressed tar) per layer, bottom-most first.
    pub layers: Vec<(Digest, Vec<u8>)>,
}

/// Builds an image for `platform` from `layers` with environment `env` and command
/// `/bin/sh`.
pub fn build_image(layers: &[Layer], env: &[&str], platform: &Platform) -> io::Result<BuiltImage> {
    build_image_with_cmd(layers, env, &["/bin/sh"], platform)
}

/// Builds an image for `platform` from `layers` with environment `env` and command `cmd`
/// (what a runtime runs when its caller names none, as CRI's sandbox image is run).
pub fn build_image_with_cmd(
    layers: &[Layer],
    env: &[&str],
    cmd: &[&str],
    platform: &Platform,
) -> io::Result<BuiltImage> {
    let stored = layers
        .iter()
        .map(|layer| {
            let (blob, media_type) = compress(&layer.tar, layer.compression)?;
            Ok(StoredLayer {
                blob,
                media_type,
                diff_id: Digest::of(&layer.tar),
                annotations: BTreeMap::new(),
                tar: layer.tar.clone(),
            })
        })
        .collect::<io::Result<Vec<_>>>()?;
    build_image_from(stored, env, cmd, platform)
}

/// A layer as the registry holds it: its blob, media type and annotations, and the diff ID
/// and tar it stands for.
#[derive(Debug, Clone)]
pub struct StoredLayer {
    pub blob: Vec<u8>,
    pub media_type: &'static str,
    pub diff_id: Digest,
    pub annotations: BTreeMap<String, String>,
    /// The uncompressed tar (for eStargz, without its TOC entry).
    pub tar: Vec<u8>,
}

/// Builds an image for `platform` from layers already stored, with environment `env` and
/// command `cmd`.
pub fn build_image_from(
    layers: Vec<StoredLayer>,
    env: &[&str],
    cmd: &[&str],
    platform: &Platform,
) -> io::Result<BuiltImage> {
    let mut blobs = BTreeMap::new();
    let mut layer_descs = Vec::new();
    let mut diff_ids = Vec::new();
    let mut stored = Vec::new();
    for layer in layers {
        let digest = Digest::of(&layer.blob);
        let mut desc = descriptor(layer.media_type, &digest, layer.blob.len());
        desc.annotations = layer.annotations;
        layer_descs.push(desc);
        diff_ids.push(layer.diff_id);
        stored.push((digest.clone(), layer.tar));
        blobs.insert(digest, layer.blob);
    }
    let mut config = ImageConfig {
        architecture: platform.architecture.clone(),
        os: platform.os.clone(),
        rootfs: RootFs {
            kind: "layers".into(),
            diff_ids,
        },
        ..ImageConfig::default()
    };
    config.config.env = Some(env.iter().map(|s| s.to_string()).collect());
    config.config.cmd = Some(cmd.iter().map(|s| s.to_string()).collect());
    let config_bytes = serde_json::to_vec(&config)?;
    let config_digest = Digest::of(&config_bytes);
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(spec::OCI_MANIFEST.into()),
        config: descriptor(spec::OCI_CONFIG, &config_digest, config_bytes.len()),
        layers: layer_descs,
    };
    blobs.insert(config_digest.clone(), config_bytes);
    let manifest_bytes = serde_json::to_vec(&manifest)?;
    let manifest_digest = Digest::of(&manifest_bytes);
    let mut manifest_desc = descriptor(spec::OCI_MANIFEST, &manifest_digest, manifest_bytes.len());
    manifest_desc.platform = Some(PlatformSpec {
        architecture: platform.architecture.clone(),
        os: platform.os.clone(),
        variant: platform.variant.clone(),
    });
    blobs.insert(manifest_digest, manifest_bytes);
    Ok(BuiltImage {
        blobs,
        manifest: manifest_desc,
        config,
        config_digest,
        layers: stored,
    })
}

pub fn descriptor(media_type: &str, digest: &Digest, size: usize) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest: digest.clone(),
        size: size as u64,
        platform: None,
        annotations: BTreeMap::new(),
        urls: Vec::new(),
    }
}

/// Compresses deterministically (gzip with a zero mtime, zstd at a fixed level).
fn compress(tar: &[u8], compression: Compression) -> io::Result<(Vec<u8>, &'static str)> {
    Ok(match compression {
        Compression::None => (tar.to_vec(), "application/vnd.oci.image.layer.v1.tar"),
        Compression::Gzip => {
            let mut enc = flate2::GzBuilder::new()
                .mtime(0)
                .write(Vec::new(), flate2::Compression::default());
            enc.write_all(tar)?;
            (enc.finish()?, "application/vnd.oci.image.layer.v1.tar+gzip")
        }
        Compression::Zstd => (
            zstd::encode_all(tar, 3)?,
            "application/vnd.oci.image.layer.v1.tar+zstd",
        ),
    })
}

/// Writes an OCI image layout whose index.json lists `roots`, each tagged with its
/// `org.opencontainers.image.ref.name` when a name is given.
pub fn write_oci_layout(
    dir: &Path,
    images: &[&BuiltImage],
    roots: &[(Descriptor, Option<&str>)],
) -> io::Result<()> {
    fs::create_dir_all(dir.join("blobs/sha256"))?;
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    for image in images {
        for (digest, blob) in &image.blobs {
            fs::write(dir.join("blobs/sha256").join(digest.hex()), blob)?;
        }
    }
    let manifests = roots
        .iter()
        .map(|(desc, name)| {
            let mut desc = desc.clone();
            if let Some(name) = name {
                desc.annotations
                    .insert(spec::REF_NAME_ANNOTATION.into(), name.to_string());
            }
            desc
        })
        .collect();
    let index = Index {
        schema_version: 2,
        media_type: Some(spec::OCI_INDEX.into()),
        manifests,
    };
    fs::write(dir.join("index.json"), serde_json::to_vec(&index)?)
}

/// A tar of the files under `dir`, sorted, with deterministic headers.
pub fn tar_dir(dir: &Path, out: &Path) -> io::Result<()> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    files.sort();
    let mut tar = tar::Builder::new(fs::File::create(out)?);
    for rel in files {
        let data = fs::read(dir.join(&rel))?;
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_mtime(crate::SAMPLE_MTIME);
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, &rel, data.as_slice())?;
    }
    tar.into_inner()?.flush()
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<std::path::PathBuf>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, out)?;
        } else {
            out.push(
                path.strip_prefix(root)
                    .map_err(io::Error::other)?
                    .to_path_buf(),
            );
        }
    }
    Ok(())
}

/// Writes `docker save` format: manifest.json, `<hex>.json` config, `<diffid>/layer.tar`.
pub fn write_docker_archive(image: &BuiltImage, repo_tag: &str, out: &Path) -> io::Result<()> {
    let staging = tempdir_beside(out)?;
    let config_name = format!("{}.json", image.config_digest.hex());
    fs::write(
        staging.join(&config_name),
        &image.blobs[&image.config_digest],
    )?;
    let mut layer_names = Vec::new();
    for (_, tar) in &image.layers {
        let name = format!("{}/layer.tar", Digest::of(tar).hex());
        fs::create_dir_all(staging.join(name.trim_end_matches("/layer.tar")))?;
        fs::write(staging.join(&name), tar)?;
        layer_names.push(name);
    }
    let manifest = serde_json::json!([{ "Config": config_name, "RepoTags": [repo_tag], "Layers": layer_names }]);
    fs::write(
        staging.join("manifest.json"),
        serde_json::to_vec(&manifest)?,
    )?;
    let result = tar_dir(&staging, out);
    fs::remove_dir_all(&staging)?;
    result
}

fn tempdir_beside(out: &Path) -> io::Result<std::path::PathBuf> {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = out.with_file_name(format!(".{name}.staging-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    Ok(dir)
}
