//! A registry that misbehaves (`integration/src/hostile_registry.rs`): bodies longer than
//! their descriptors (endless), bodies that stall, and a pull stuck on one holding store
//! locks. Every pull must end, soon, with one line naming what failed; nothing partial may
//! be left in the store; and nobody waits for ever behind a stuck pull.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use lamina_image::{Compression, Digest, Platform};
use lamina_integration::hostile_registry::{HostileRegistry, Misbehaviour};
use lamina_integration::{Lamina, Output, ScratchFs, hostile, require_root, wait_until};
use lamina_sample::{BuiltImage, Layer, LayerBuilder};

/// What "fails fast" means here: well under the registry's own 60 s hold, so a lamina that
/// waits for the server to give up fails these tests.
const FAST: Duration = Duration::from_secs(20);

/// No lamina call in this file may run longer than this; one that does is killed.
const WATCHDOG: Duration = Duration::from_secs(90);

/// One uncompressed layer holding a 64 KiB file. Uncompressed, so nothing but the blob's
/// length bounds how much of it the importer reads: past the tar's end it keeps hashing.
fn one_layer_image() -> BuiltImage {
    let tar = LayerBuilder::new()
        .file("data", 0o644, &hostile::noise(64 * 1024))
        .and_then(LayerBuilder::finish)
        .unwrap();
    hostile::build(
        vec![Layer {
            tar,
            compression: Compression::None,
        }],
        &Platform::host(),
    )
}

fn layer_digest(image: &BuiltImage) -> Digest {
    image.layers[0].0.clone()
}

/// The layer's chain ID (one layer: its diffID), which names its lock.
fn chain_id(image: &BuiltImage) -> Digest {
    Digest::of(&image.layers[0].1)
}

/// A running `lamina` we started; killed (by its own handle) if the test fails first.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `lamina --store S --log-level warn --insecure-registry ADDR ARGS...`, killing it
/// after [`WATCHDOG`]; returns its output and how long it ran.
fn run(lamina: &Lamina, registry: &HostileRegistry, args: &[&str]) -> (Output, Duration) {
    let mut all = vec!["--insecure-registry", registry.addr.as_str()];
    all.extend_from_slice(args);
    let started = Instant::now();
    let mut child = Running(
        lamina
            .command(&all)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let code = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status.code().unwrap_or(-1);
        }
        if started.elapsed() > WATCHDOG {
            break -1; // killed on drop below
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = started.elapsed();
    let _ = child.0.kill();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let out = Output {
        code,
        stdout: stdout.trim_end().to_string(),
        stderr,
    };
    (out, elapsed)
}

/// A failure in one line, within [`FAST`], whose line holds every one of `needles`.
fn assert_failed_fast(out: &Output, elapsed: Duration, needles: &[&str]) {
    eprintln!("{elapsed:?}: {}", out.stdout);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(elapsed < FAST, "took {elapsed:?}: {out:?}");
    assert!(!out.stdout.contains('\n'), "one line: {out:?}");
    for needle in needles {
        assert!(out.stdout.contains(needle), "missing `{needle}`: {out:?}");
    }
}

/// No layer, no leftover in `tmp/`, and `check` finds nothing wrong.
fn assert_store_untouched(lamina: &Lamina) {
    assert_eq!(lamina.entries("layers"), 0, "a layer was published");
    assert_eq!(lamina.entries("tmp"), 0, "tmp/ leftovers");
    let check = lamina.run(&["check"]);
    assert_eq!(check.code, 0, "{check:?}");
    assert_eq!(check.json()["ok"], true, "{check:?}");
}

#[test]
fn an_endless_layer_body_fails_fast_naming_its_digest_and_leaves_nothing() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = one_layer_image();
    let digest = layer_digest(&image);
    let registry = HostileRegistry::start(
        "hostile/endless",
        "v1",
        &image,
        &format!("blobs/{digest}"),
        Misbehaviour::Endless,
    );

    let (out, elapsed) = run(&lamina, &registry, &["pull", &registry.reference()]);
    assert_failed_fast(
        &out,
        elapsed,
        &[&digest.to_string(), &registry.addr, "runs past the"],
    );
    assert_eq!(registry.faulty_requests(), 1, "{:?}", registry.paths());
    assert_store_untouched(&lamina);
}

#[test]
fn an_endless_config_or_manifest_is_refused_at_its_bound() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = one_layer_image();

    // The config has a descriptor: one byte past its size is refused.
    let config = format!("blobs/{}", image.config_digest);
    let registry = HostileRegistry::start(
        "hostile/config",
        "v1",
        &image,
        &config,
        Misbehaviour::Endless,
    );
    let (out, elapsed) = run(&lamina, &registry, &["pull", &registry.reference()]);
    assert_failed_fast(
        &out,
        elapsed,
        &[&image.config_digest.to_string(), "its descriptor declares"],
    );
    drop(registry);

    // A manifest by tag has none: the document limit (4 MiB) bounds it.
    let registry = HostileRegistry::start(
        "hostile/manifest",
        "v1",
        &image,
        "manifests/v1",
        Misbehaviour::Endless,
    );
    let (out, elapsed) = run(&lamina, &registry, &["pull", &registry.reference()]);
    assert_failed_fast(
        &out,
        elapsed,
        &["manifests/v1", &registry.addr, "4194304-byte limit"],
    );
    assert_store_untouched(&lamina);
}

#[test]
fn a_layer_body_that_stalls_times_out_naming_its_digest_and_registry() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = one_layer_image();
    let digest = layer_digest(&image);
    let registry = HostileRegistry::start(
        "hostile/stall",
        "v1",
        &image,
        &format!("blobs/{digest}"),
        Misbehaviour::StallAfter(10),
    );

    let (out, elapsed) = run(
        &lamina,
        &registry,
        &[
            "--registry-timeout-seconds",
            "2",
            "pull",
            &registry.reference(),
        ],
    );
    assert_failed_fast(
        &out,
        elapsed,
        &[
            &digest.to_string(),
            &format!("registry {}", registry.addr),
            "no data for 2 s after 10 of",
            "stalled",
        ],
    );
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}: {out:?}");
    assert_store_untouched(&lamina);
}

#[test]
fn waiters_behind_a_stuck_pull_give_up_naming_the_lock_and_its_holder() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = one_layer_image();
    let digest = layer_digest(&image);
    let registry = HostileRegistry::start(
        "hostile/stuck",
        "v1",
        &image,
        &format!("blobs/{digest}"),
        Misbehaviour::StallAfter(10),
    );

    // A pull that will sit on the stalled blob longer than this test lasts, holding the
    // layer's lock and its share of `layers-in-use`.
    let reference = registry.reference();
    let stuck = Running(
        lamina
            .command(&[
                "--insecure-registry",
                registry.addr.as_str(),
                "--registry-timeout-seconds",
                "300",
                "pull",
                &reference,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let holder = format!("pid {} (`", stuck.0.id());
    wait_until("the stuck pull asking for the blob", || {
        registry.faulty_requests() == 1
    });

    let (second, elapsed) = run(
        &lamina,
        &registry,
        &["--lock-timeout-seconds", "2", "pull", &reference],
    );
    let layer_lock = format!("store lock `layer-{}`", chain_id(&image).hex());
    assert_failed_fast(&second, elapsed, &[&layer_lock, &holder, " pull "]);
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}: {second:?}");

    let (clean, elapsed) = run(
        &lamina,
        &registry,
        &["--lock-timeout-seconds", "2", "clean"],
    );
    assert_failed_fast(
        &clean,
        elapsed,
        &["store lock `layers-in-use`", &holder, " pull "],
    );
    assert_eq!(registry.faulty_requests(), 1, "only the stuck pull asked");

    // Once the holder is gone, the same commands go through and leave a sound store.
    drop(stuck);
    let clean = lamina.run(&["--lock-timeout-seconds", "2", "clean"]);
    assert_eq!(clean.code, 0, "{clean:?}");
    assert_store_untouched(&lamina);
}
