//! Layer unpack: whatever the tar says, nothing appears or changes outside the layer
//! directory.

use std::fs;
use std::path::Path;

/// Unpacks `data` as a layer tar into `<scratch>/layer/`, beside a `victim/` directory
/// holding one file and a `sentinel` file, then checks that the scratch directory still
/// holds exactly those three and that neither neighbour changed. An error is fine: the
/// property is containment, not acceptance.
pub fn unpack_layer(data: &[u8]) {
    let scratch = crate::scratch::dir();
    let root = scratch.path();
    let layer = root.join("layer");
    let victim = root.join("victim");
    fs::create_dir(&layer).expect("mkdir layer");
    fs::create_dir(&victim).expect("mkdir victim");
    fs::write(victim.join("file"), "keep").expect("write victim");
    fs::write(root.join("sentinel"), "keep").expect("write sentinel");

    let _ = lamina_unpack::unpack_limited(data, &layer, 64 << 20);

    assert_eq!(
        names(root),
        ["layer", "sentinel", "victim"],
        "escaped into the scratch dir"
    );
    assert_eq!(names(&victim), ["file"], "wrote into victim/");
    assert_eq!(fs::read(victim.join("file")).expect("victim file"), b"keep");
    assert_eq!(fs::read(root.join("sentinel")).expect("sentinel"), b"keep");
    let meta = fs::symlink_metadata(&layer).expect("layer dir");
    assert!(meta.is_dir(), "the layer directory itself was replaced");
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
