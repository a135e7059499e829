//! Image references as Garden and operators write them.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::ImageError;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// `oci:///abs/layout[:REF]`: an OCI image layout directory.
    OciLayout {
        path: PathBuf,
        reference: Option<String>,
    },
    /// `oci-archive:///abs/image.tar[:REF]`: a tar of an OCI image layout.
    OciArchive {
        path: PathBuf,
        reference: Option<String>,
    },
    /// `docker-archive:///abs/saved.tar[:REPO:TAG]`: `docker save` output.
    DockerArchive {
        path: PathBuf,
        reference: Option<String>,
    },
    /// `/abs/rootfs.tar`: a plain root filesystem tar, imported as one layer.
    RootfsTar { path: PathBuf },
}

impl ImageRef {
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let bad = |why: &str| ImageError::new(format!("image `{s}`: {why}"));
        if let Some((scheme, rest)) = s.split_once("://") {
            if !rest.starts_with('/') {
                return Err(bad(
                    "the path after `://` must be absolute (three slashes: oci:///path)",
                ));
            }
            let (path, reference) = split_reference(rest);
            return match scheme {
                "oci" => Ok(ImageRef::OciLayout { path, reference }),
                "oci-archive" => Ok(ImageRef::OciArchive { path, reference }),
                "docker-archive" => Ok(ImageRef::DockerArchive { path, reference }),
                "docker" => Err(bad(
                    "registry references (docker://) are resolved by lamina-registry, not from local files",
                )),
                other => Err(bad(&format!(
                    "unknown scheme `{other}` (expected oci, oci-archive, docker-archive, or an absolute rootfs tar path)"
                ))),
            };
        }
        if !s.starts_with('/') {
            return Err(bad("a local rootfs tar must be given as an absolute path"));
        }
        Ok(ImageRef::RootfsTar {
            path: PathBuf::from(s),
        })
    }

    pub fn path(&self) -> &Path {
        match self {
            ImageRef::OciLayout { path, .. }
            | ImageRef::OciArchive { path, .. }
            | ImageRef::DockerArchive { path, .. }
            | ImageRef::RootfsTar { path } => path,
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (scheme, path, reference) = match self {
            ImageRef::OciLayout { path, reference } => ("oci://", path, reference),
            ImageRef::OciArchive { path, reference } => ("oci-archive://", path, reference),
            ImageRef::DockerArchive { path, reference } => ("docker-archive://", path, reference),
            ImageRef::RootfsTar { path } => ("", path, &None),
        };
        write!(f, "{scheme}{}", path.display())?;
        if let Some(r) = reference {
            write!(f, ":{r}")?;
        }
        Ok(())
    }
}

/// `/a/b:ref` → (`/a/b`, `ref`), unless the whole string names an existing file or the
/// part after the last `:` holds a `/` (then the colon belongs to the path). For a
/// docker-archive `REPO:TAG`, the split is at the first colon after the path's end.
fn split_reference(rest: &str) -> (PathBuf, Option<String>) {
    if Path::new(rest).exists() {
        return (PathBuf::from(rest), None);
    }
    let last_slash = rest.rfind('/').unwrap_or(0);
    match rest[last_slash..].find(':') {
        Some(i) if i > 1 => {
            let (path, reference) = rest.split_at(last_slash + i);
            (PathBuf::from(path), Some(reference[1..].to_string()))
        }
        _ => (PathBuf::from(rest), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(
            ImageRef::parse("oci:///img/layout:v1").unwrap(),
            ImageRef::OciLayout {
                path: "/img/layout".into(),
                reference: Some("v1".into())
            }
        );
        assert_eq!(
            ImageRef::parse("oci-archive:///img/a.tar").unwrap(),
            ImageRef::OciArchive {
                path: "/img/a.tar".into(),
                reference: None
            }
        );
        assert_eq!(
            ImageRef::parse("docker-archive:///img/s.tar:busybox:latest").unwrap(),
            ImageRef::DockerArchive {
                path: "/img/s.tar".into(),
                reference: Some("busybox:latest".into())
            }
        );
        assert_eq!(
            ImageRef::parse("/img/rootfs.tar").unwrap(),
            ImageRef::RootfsTar {
                path: "/img/rootfs.tar".into()
            }
        );
        assert_eq!(
            ImageRef::parse("oci:///a:b/layout").unwrap().path(),
            Path::new("/a:b/layout")
        );
    }

    #[test]
    fn refuses_relative_and_unknown() {
        for bad in [
            "oci://relative",
            "rootfs.tar",
            "ftp:///x",
            "docker://busybox",
        ] {
            let err = ImageRef::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
