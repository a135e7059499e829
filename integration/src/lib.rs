//! Support for lamina's end-to-end tests (and benchmarks): scratch filesystems that clean
//! up every mount beneath them even when a test fails, the `lamina` binary, runc bundles.
//! All of it needs root.

pub mod containerd;
pub mod cri;
pub mod delay_proxy;
pub mod hostile;
pub mod hostile_registry;
pub mod http;
pub mod lamina;
pub mod lazy_image;
pub mod prometheus;
pub mod proof;
pub mod recorded_fs;
pub mod recording_disk;
pub mod records;
pub mod registry;
pub mod rng;
pub mod runc;
pub mod scratch;
pub mod snapshotter;
pub mod token_service;
pub mod tree;

pub use lamina::{Lamina, Output};
pub use runc::Bundle;
pub use scratch::{FsKind, LoopOptions, ScratchFs, SecondDevice};

/// End-to-end tests need root; say so plainly instead of failing obscurely.
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "lamina's integration tests mount filesystems and run runc: run them as root"
    );
}

/// Polls `done` every 50 ms until it holds; fails the test after 30 s, naming `what` is
/// late. For work lamina finishes in the background (reaper, pool refills).
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not finish in 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Writes the busybox sample image in every format under `dir`.
/// A busybox image `layers` deep: the sample's base layer, then one layer per file
/// `/deep/<n>` (n from 1), written in every format under `dir`. For the depths containerd
/// and overlay must take.
pub fn deep_image(dir: &std::path::Path, layers: usize) -> lamina_sample::SampleFiles {
    use lamina_sample::{Layer, LayerBuilder};
    let busybox = std::fs::read(lamina_sample::DEFAULT_BUSYBOX)
        .expect("Debian's busybox-static (scripts/test installs it)");
    let mut all = vec![Layer {
        tar: lamina_sample::base_layer(&busybox).expect("base layer"),
        compression: lamina_image::Compression::Gzip,
    }];
    for n in 1..layers {
        let tar = LayerBuilder::new()
            .dir("deep", 0o755)
            .and_then(|b| b.file(&format!("deep/{n}"), 0o644, format!("{n}\n").as_bytes()))
            .and_then(LayerBuilder::finish)
            .expect("a deep layer");
        all.push(Layer {
            tar,
            compression: lamina_image::Compression::Gzip,
        });
    }
    let image = lamina_sample::build_image(&all, &[], &lamina_image::Platform::host())
        .expect("building a deep image");
    lamina_sample::write_all_formats(&image, dir).expect("writing a deep image")
}

pub fn sample_image(dir: &std::path::Path) -> lamina_sample::SampleFiles {
    let busybox = std::path::Path::new(lamina_sample::DEFAULT_BUSYBOX);
    assert!(
        busybox.exists(),
        "{} is missing: install Debian's busybox-static (scripts/test does)",
        busybox.display()
    );
    let image = lamina_sample::busybox_image(busybox).expect("building the sample image");
    lamina_sample::write_all_formats(&image, dir).expect("writing the sample image")
}
