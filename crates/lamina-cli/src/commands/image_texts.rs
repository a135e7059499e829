//! GrootFS's words for a local image that is not there, or a directory given as a rootfs
//! tar (create_tar_test.go, create_oci_test.go): what Garden shows and operators grep for.
//! lamina-image words these failures its own way for every caller; the Garden-facing CLI
//! answers first, in GrootFS's text, with the reference after it where GrootFS gives none.

use lamina_image::{ImageRef, shown};

/// Refuses `reference` in GrootFS's words if its file or directory is missing, or if it
/// names a directory as a rootfs tar; anything else is for lamina-image to judge.
pub fn check_local(reference: &ImageRef) -> anyhow::Result<()> {
    let path = reference.path();
    let shown_path = shown(&path.display().to_string());
    match (std::fs::metadata(path), reference) {
        (Err(e), ImageRef::RootfsTar { .. }) if e.kind() == std::io::ErrorKind::NotFound => {
            // Go's text for the stat GrootFS makes, which create_tar_test.go reads.
            anyhow::bail!("stat {shown_path}: no such file or directory")
        }
        // GrootFS's words, then lamina's own (which earlier lamina printed alone).
        (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => anyhow::bail!(
            "Image source doesn't exist: image `{}`: {shown_path} does not exist",
            shown(&reference.to_string())
        ),
        // Exactly GrootFS's line: create_tar_test.go matches the whole of it.
        (Ok(meta), ImageRef::RootfsTar { .. }) if meta.is_dir() => {
            anyhow::bail!("invalid base image: directory provided instead of a tar file")
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(reference: &str) -> String {
        let reference = ImageRef::parse(reference).unwrap();
        check_local(&reference).unwrap_err().to_string()
    }

    #[test]
    fn missing_images_and_directories_get_grootfs_texts() {
        assert_eq!(
            refusal("/no/such/image.tar"),
            "stat /no/such/image.tar: no such file or directory"
        );
        assert_eq!(
            refusal("oci:///no/such/layout:latest"),
            "Image source doesn't exist: image `oci:///no/such/layout:latest`: /no/such/layout does not exist"
        );
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            refusal(dir.path().to_str().unwrap()),
            "invalid base image: directory provided instead of a tar file"
        );
        let layout = format!("oci://{}", dir.path().display());
        assert!(check_local(&ImageRef::parse(&layout).unwrap()).is_ok());
    }
}
