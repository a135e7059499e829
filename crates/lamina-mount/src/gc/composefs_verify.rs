//! `lamina check --verify` for composefs: every metadata image re-hashed against the
//! digest recorded when it was built, and every object re-hashed against its name. This
//! kernel has no fs-verity, so nothing else would notice a changed byte: overlay reads an
//! object's data as it is (a kernel with fs-verity would refuse it under
//! `verity=require`). Reads every byte of the store's objects: minutes on a large store.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use composefs::fsverity::{FsVerityHashValue, FsVerityHasher, compute_verity};

use crate::fsutil::entries;
use crate::fsutil::file_name;
use crate::lowers::composefs::{ObjectId, digest_path};
use lamina_store::{Store, StoreError};

/// A composefs file that is not what it was written as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    /// `bad_composefs_image`, `bad_object` or `missing_object`.
    pub kind: &'static str,
    pub path: PathBuf,
    pub detail: String,
    /// For an image: the image's top chain ID hex (to tell whether a container uses it).
    pub image_top: Option<String>,
}

/// Re-hashes every metadata image and object.
pub(crate) fn verify(store: &Store) -> Result<Vec<Damage>, StoreError> {
    let mut damage = Vec::new();
    // Object path (`ab/cdef…`) → the images that reference it.
    let mut users: HashMap<String, Vec<String>> = HashMap::new();
    let images_dir = store.layout().composefs();
    for image in entries(&images_dir)? {
        let name = file_name(&image);
        let Some(top) = name.strip_suffix(".erofs") else {
            continue;
        };
        let bad = |detail: String| Damage {
            kind: "bad_composefs_image",
            path: image.clone(),
            detail,
            image_top: Some(top.to_string()),
        };
        let bytes =
            lamina_store::read_regular_file(&image).map_err(StoreError::io("reading", &image))?;
        let recorded =
            lamina_store::read_regular_to_string(&digest_path(&image)).unwrap_or_default();
        let actual = compute_verity::<ObjectId>(&bytes).to_hex();
        if recorded.trim() != actual {
            damage.push(bad(format!(
                "its digest is {actual}, not the {} recorded when it was built",
                if recorded.is_empty() {
                    "(none)"
                } else {
                    recorded.trim()
                }
            )));
            continue;
        }
        match composefs::erofs::reader::collect_objects::<ObjectId>(&bytes) {
            Ok(objects) => {
                for object in objects {
                    users
                        .entry(object.to_object_pathname())
                        .or_default()
                        .push(top.to_string());
                }
            }
            Err(e) => damage.push(bad(format!("not a readable composefs image: {e:#}"))),
        }
    }
    let objects_dir = store.layout().objects();
    for fan_out in entries(&objects_dir)? {
        for object in entries(&fan_out)? {
            let rel = format!("{}/{}", file_name(&fan_out), file_name(&object));
            let images = users.remove(&rel);
            let Ok(expected) = ObjectId::from_object_pathname(rel.as_bytes()) else {
                continue; // a staging copy, not an object: `clean` removes it
            };
            let actual = hash_file(&object).map_err(StoreError::io("reading", &object))?;
            if actual != expected {
                damage.push(Damage {
                    kind: "bad_object",
                    path: object,
                    detail: format!(
                        "its content hashes to {}; {}",
                        actual.to_hex(),
                        used_by(images.as_deref())
                    ),
                    image_top: None,
                });
            }
        }
    }
    for (rel, images) in users {
        damage.push(Damage {
            kind: "missing_object",
            path: objects_dir.join(&rel),
            detail: format!("gone; {}", used_by(Some(&images))),
            image_top: None,
        });
    }
    Ok(damage)
}

fn used_by(images: Option<&[String]>) -> String {
    match images {
        Some(images) if !images.is_empty() => format!(
            "the metadata images of {} read it: delete their containers, then `lamina clean` and create them again",
            images.join(", ")
        ),
        _ => "no metadata image reads it (`lamina clean` removes it)".into(),
    }
}

fn hash_file(path: &Path) -> io::Result<ObjectId> {
    let mut hasher = FsVerityHasher::<ObjectId, 12>::new();
    io::copy(&mut lamina_store::open_regular_file(path)?, &mut hasher)?;
    Ok(hasher.digest())
}
