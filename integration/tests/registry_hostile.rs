//! A registry that misbehaves (`integration/src/hostile_registry.rs`): bodies longer than
//! their descriptors (endless), bodies that stall or drip, a port that never connects,
//! layer `urls` lists that are long, odd or huge, redirects whose `Location` carries a
//! secret, and a pull stuck on one holding store locks. Every pull must end, soon, with
//! one line naming what failed and no secret; nothing partial may be left in the store;
//! and nobody waits for ever behind a stuck pull.
//!
//! The later tests bound lamina with coreutils `timeout` rather than timing it: exit 124
//! (killed) is the failure, and the error text says which bound lamina applied.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lamina_image::{Compression, Digest, Platform};
use lamina_integration::hostile_registry::{Blackhole, HostileRegistry, Misbehaviour, TOKEN_PATH};
use lamina_integration::http::{HttpServer, Response};
use lamina_integration::{Lamina, Output, ScratchFs, hostile, require_root, wait_until};
use lamina_sample::{BuiltImage, Layer, LayerBuilder};

/// What "fails fast" means here: well under the registry's own 60 s hold, so a lamina that
/// waits for the server to give up fails these tests.
const FAST: Duration = Duration::from_secs(20);

/// No lamina call in this file may run longer than this; one that does is killed.
const WATCHDOG: Duration = Duration::from_secs(90);

/// How long coreutils `timeout` lets one bounded lamina run: well past what the bounds
/// below allow (about 2 × 2 s for a drip, 5 × 1 s and 3.75 s of backoff for a dead port),
/// well short of what lamina took without them (for ever, bar the server's 60 s hold; or
/// 5 × 15 s of connect timeout).
const BOUND: &str = "40";

/// The tag every hostile registry here serves its image as.
const TAG: &str = "v1";

const DRIP: Misbehaviour = Misbehaviour::Drip(Duration::from_millis(1500));

/// One uncompressed layer holding a 64 KiB file. Uncompressed, so nothing but the blob's
/// length bounds how much of it the importer reads: past the tar's end it keeps hashing.
fn one_layer_image() -> BuiltImage {
    layered_image(1)
}

/// `count` uncompressed layers, each holding a different 64 KiB file.
fn layered_image(count: usize) -> BuiltImage {
    let layers = (0..count)
        .map(|i| Layer {
            tar: LayerBuilder::new()
                .file(&format!("data{i}"), 0o644, &hostile::noise(64 * 1024))
                .and_then(LayerBuilder::finish)
                .unwrap(),
            compression: Compression::None,
        })
        .collect();
    hostile::build(layers, &Platform::host())
}

/// The layer's chain ID (one layer: its diffID), which names its lock.
fn chain_id(image: &BuiltImage) -> Digest {
    Digest::of(&image.layers[0].1)
}

/// `image` with its first layer's `urls` set to `urls`.
fn with_layer_urls(mut image: BuiltImage, urls: &[String]) -> BuiltImage {
    hostile::edit_manifest(&mut image, |m| {
        m["layers"][0]["urls"] = serde_json::json!(urls);
    });
    image
}

/// The registry path of the blob `digest`, as [`HostileRegistry`] faults it.
fn blob(digest: &Digest) -> String {
    format!("blobs/{digest}")
}

/// Serves `image` as `repository:`[`TAG`], honestly but for `faults`.
fn serve(repository: &str, image: &BuiltImage, faults: &[(&str, Misbehaviour)]) -> HostileRegistry {
    HostileRegistry::start_with(repository, TAG, image, faults, false)
}

/// [`one_layer_image`] served with its layer's blob misbehaving as `how`.
struct FaultyLayer {
    image: BuiltImage,
    /// The faulty layer's (blob) digest.
    digest: Digest,
    registry: HostileRegistry,
}

impl FaultyLayer {
    fn serve(repository: &str, how: Misbehaviour) -> FaultyLayer {
        let image = one_layer_image();
        let digest = image.layers[0].0.clone();
        let registry = serve(repository, &image, &[(&blob(&digest), how)]);
        FaultyLayer {
            image,
            digest,
            registry,
        }
    }
}

/// A fresh store on a tmpfs of its own, and ways to point lamina at a registry.
struct Scene {
    lamina: Lamina,
    /// Declared after `lamina`, so unmounted only once the store is done with.
    _fs: ScratchFs,
}

impl Scene {
    fn new() -> Scene {
        require_root();
        let fs = ScratchFs::tmpfs();
        let lamina = Lamina::init(&fs.path().join("store"));
        Scene { lamina, _fs: fs }
    }

    /// Runs `lamina --store S --log-level warn --insecure-registry ADDR ARGS...`, killing
    /// it after [`WATCHDOG`]; returns its output and how long it ran.
    fn run(&self, registry: &HostileRegistry, args: &[&str]) -> (Output, Duration) {
        let started = Instant::now();
        let mut child = Running(
            self.lamina
                .command(&insecure(&registry.addr, args))
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
        let out = Output {
            code,
            stdout: drain(child.0.stdout.take()).trim_end().to_string(),
            stderr: drain(child.0.stderr.take()),
        };
        (out, elapsed)
    }

    /// [`Scene::run`] of `OPTIONS... pull REFERENCE` for `registry`'s image.
    fn pull(&self, registry: &HostileRegistry, options: &[&str]) -> (Output, Duration) {
        self.run(registry, &pull(options, &registry.reference()))
    }

    /// Runs `timeout BOUND lamina --store S --log-level warn --insecure-registry INSECURE
    /// ARGS...`. Exit 124 means it ran past [`BOUND`] and was killed.
    fn run_bounded(&self, insecure_registry: &str, args: &[&str]) -> Output {
        let inner = self.lamina.command(&insecure(insecure_registry, args));
        let out = Command::new("timeout")
            .args(["--kill-after=5", BOUND])
            .arg(inner.get_program())
            .args(inner.get_args())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).trim_end().to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// [`Scene::run_bounded`] of `OPTIONS... pull REFERENCE` for `registry`'s image.
    fn pull_bounded(&self, registry: &HostileRegistry, options: &[&str]) -> Output {
        self.run_bounded(&registry.addr, &pull(options, &registry.reference()))
    }

    /// No layer, no leftover in `tmp/`, and `check` finds nothing wrong.
    fn assert_store_untouched(&self) {
        assert_eq!(self.lamina.entries("layers"), 0, "a layer was published");
        assert_eq!(self.lamina.entries("tmp"), 0, "tmp/ leftovers");
        let check = self.lamina.run(&["check"]);
        assert_eq!(check.code, 0, "{check:?}");
        assert_eq!(check.json()["ok"], true, "{check:?}");
    }
}

/// `--insecure-registry ADDR ARGS...`.
fn insecure<'a>(addr: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["--insecure-registry", addr];
    all.extend_from_slice(args);
    all
}

/// `OPTIONS... pull REFERENCE`.
fn pull<'a>(options: &[&'a str], reference: &'a str) -> Vec<&'a str> {
    let mut all = options.to_vec();
    all.extend(["pull", reference]);
    all
}

/// All of a child's piped output.
fn drain(pipe: Option<impl Read>) -> String {
    let mut text = String::new();
    pipe.unwrap().read_to_string(&mut text).unwrap();
    text
}

/// A running `lamina` we started; killed (by its own handle) if the test fails first.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Exit 1 with one line of output holding every one of `needles`.
fn assert_failed_in_one_line(out: &Output, needles: &[&str]) {
    assert_eq!(out.code, 1, "{out:?}");
    assert!(!out.stdout.contains('\n'), "one line: {out:?}");
    for needle in needles {
        assert!(out.stdout.contains(needle), "missing `{needle}`: {out:?}");
    }
}

/// A failure in one line, within [`FAST`], whose line holds every one of `needles`.
fn assert_failed_fast(out: &Output, elapsed: Duration, needles: &[&str]) {
    eprintln!("{elapsed:?}: {}", out.stdout);
    assert!(elapsed < FAST, "took {elapsed:?}: {out:?}");
    assert_failed_in_one_line(out, needles);
}

/// Failed by itself (not killed by `timeout`), in one line holding every one of `needles`.
fn assert_failed_saying(out: &Output, needles: &[&str]) {
    eprintln!("{}", out.stdout);
    assert_ne!(out.code, 124, "still running after {BOUND} s: {out:?}");
    assert_failed_in_one_line(out, needles);
}

/// No `SECRET` anywhere lamina wrote, and no line of stderr past 4 KiB.
fn assert_no_secret_and_short_lines(out: &Output) {
    for (name, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(!text.contains("SECRET"), "{name} shows the query: {out:?}");
    }
    let longest = out.stderr.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "a {longest}-byte stderr line");
}

#[test]
fn an_endless_layer_body_fails_fast_naming_its_digest_and_leaves_nothing() {
    let scene = Scene::new();
    let FaultyLayer {
        digest, registry, ..
    } = FaultyLayer::serve("hostile/endless", Misbehaviour::Endless);

    let (out, elapsed) = scene.pull(&registry, &[]);
    assert_failed_fast(
        &out,
        elapsed,
        &[&digest.to_string(), &registry.addr, "runs past the"],
    );
    assert_eq!(registry.faulty_requests(), 1, "{:?}", registry.paths());
    scene.assert_store_untouched();
}

#[test]
fn an_endless_config_or_manifest_is_refused_at_its_bound() {
    let scene = Scene::new();
    let image = one_layer_image();

    // The config has a descriptor: one byte past its size is refused.
    let config = blob(&image.config_digest);
    let registry = serve(
        "hostile/config",
        &image,
        &[(&config, Misbehaviour::Endless)],
    );
    let (out, elapsed) = scene.pull(&registry, &[]);
    assert_failed_fast(
        &out,
        elapsed,
        &[&image.config_digest.to_string(), "its descriptor declares"],
    );
    drop(registry);

    // A manifest by tag has none: the document limit (4 MiB) bounds it.
    let registry = serve(
        "hostile/manifest",
        &image,
        &[("manifests/v1", Misbehaviour::Endless)],
    );
    let (out, elapsed) = scene.pull(&registry, &[]);
    assert_failed_fast(
        &out,
        elapsed,
        &["manifests/v1", &registry.addr, "4194304-byte limit"],
    );
    scene.assert_store_untouched();
}

#[test]
fn a_layer_body_that_stalls_times_out_naming_its_digest_and_registry() {
    let scene = Scene::new();
    let FaultyLayer {
        digest, registry, ..
    } = FaultyLayer::serve("hostile/stall", Misbehaviour::StallAfter(10));

    let (out, elapsed) = scene.pull(&registry, &["--registry-timeout-seconds", "2"]);
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
    scene.assert_store_untouched();
}

#[test]
fn waiters_behind_a_stuck_pull_give_up_naming_the_lock_and_its_holder() {
    let scene = Scene::new();
    let FaultyLayer {
        image, registry, ..
    } = FaultyLayer::serve("hostile/stuck", Misbehaviour::StallAfter(10));

    // A pull that will sit on the stalled blob longer than this test lasts, holding the
    // layer's lock and its share of `layers-in-use`.
    let reference = registry.reference();
    let stuck = Running(
        scene
            .lamina
            .command(&insecure(
                &registry.addr,
                &pull(&["--registry-timeout-seconds", "300"], &reference),
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let holder = format!("pid {} (`", stuck.0.id());
    wait_until("the stuck pull asking for the blob", || {
        registry.faulty_requests() == 1
    });

    let (second, elapsed) = scene.pull(&registry, &["--lock-timeout-seconds", "2"]);
    let layer_lock = format!("store lock `layer-{}`", chain_id(&image).hex());
    assert_failed_fast(&second, elapsed, &[&layer_lock, &holder, " pull "]);
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}: {second:?}");

    let (clean, elapsed) = scene.run(&registry, &["--lock-timeout-seconds", "2", "clean"]);
    assert_failed_fast(
        &clean,
        elapsed,
        &["store lock `layers-in-use`", &holder, " pull "],
    );
    assert_eq!(registry.faulty_requests(), 1, "only the stuck pull asked");

    // Once the holder is gone, the same commands go through and leave a sound store.
    drop(stuck);
    let clean = scene.lamina.run(&["--lock-timeout-seconds", "2", "clean"]);
    assert_eq!(clean.code, 0, "{clean:?}");
    scene.assert_store_untouched();
}

#[test]
fn a_dripping_layer_body_fails_as_too_slow_naming_its_digest_and_registry() {
    let scene = Scene::new();
    let FaultyLayer {
        digest, registry, ..
    } = FaultyLayer::serve("hostile/drip", DRIP);

    // A byte every 1.5 s never trips a 2 s stall timeout; only the rate floor ends it.
    let out = scene.pull_bounded(&registry, &["--registry-timeout-seconds", "2"]);
    assert_failed_saying(
        &out,
        &[
            &digest.to_string(),
            &format!("registry {}", registry.addr),
            "too slow: ",
            "under the minimum of 1024 bytes/s",
        ],
    );
    scene.assert_store_untouched();
}

#[test]
fn dripping_layers_imported_in_parallel_all_end() {
    let scene = Scene::new();
    let image = layered_image(3);
    let paths: Vec<String> = image
        .layers
        .iter()
        .map(|(digest, _)| blob(digest))
        .collect();
    let faults: Vec<(&str, Misbehaviour)> = paths.iter().map(|p| (p.as_str(), DRIP)).collect();
    let registry = serve("hostile/drips", &image, &faults);

    // Three layers in flight at once, each holding its layer lock: every one must end.
    let out = scene.pull_bounded(&registry, &["--registry-timeout-seconds", "2"]);
    // The first layer to fail is the one reported (any of the three); the others are
    // cancelled at their next read.
    assert_failed_saying(&out, &["too slow: "]);
    assert!(
        image
            .layers
            .iter()
            .any(|(digest, _)| out.stdout.contains(&digest.to_string())),
        "names a layer: {out:?}"
    );
    assert_eq!(registry.faulty_requests(), 3, "{:?}", registry.paths());
    scene.assert_store_untouched();
}

#[test]
fn a_dripping_manifest_or_token_response_fails_as_too_slow() {
    let scene = Scene::new();
    let image = one_layer_image();

    let registry = serve("hostile/manifest", &image, &[("manifests/v1", DRIP)]);
    let out = scene.pull_bounded(&registry, &["--registry-timeout-seconds", "2"]);
    assert_failed_saying(&out, &[&registry.addr, "reading manifests/v1: too slow: "]);
    drop(registry);

    // The registry wants a Bearer token; its realm drips the answer.
    let registry =
        HostileRegistry::start_with("hostile/token", TAG, &image, &[(TOKEN_PATH, DRIP)], true);
    let out = scene.pull_bounded(&registry, &["--registry-timeout-seconds", "2"]);
    let realm = format!(
        "reading the token from http://{}{TOKEN_PATH}",
        registry.addr
    );
    assert_failed_saying(&out, &[&realm, "too slow: "]);
    assert_eq!(registry.faulty_requests(), 1, "{:?}", registry.paths());
    scene.assert_store_untouched();
}

#[test]
fn a_registry_port_that_never_connects_fails_at_the_configured_timeout() {
    let scene = Scene::new();
    let blackhole = Blackhole::start();

    // Five attempts of 1 s each plus 3.75 s of backoff; with a fixed 15 s connect timeout
    // this took 79 s.
    let reference = format!("docker://{}/hostile/blackhole:{TAG}", blackhole.addr);
    let out = scene.run_bounded(
        &blackhole.addr,
        &pull(&["--registry-timeout-seconds", "1"], &reference),
    );
    assert_failed_saying(
        &out,
        &[
            &format!("registry {}", blackhole.addr),
            "no connection within 1 s (--registry-timeout-seconds)",
            "gave up after 5 attempts",
        ],
    );
}

#[test]
fn a_layer_is_fetched_from_at_most_three_of_its_urls_and_only_over_http() {
    let scene = Scene::new();
    let elsewhere = HttpServer::start(|_| Response::status(404));
    let mut urls = vec![format!("ftp://{}/u/0", elsewhere.addr)];
    urls.extend((1..=5).map(|i| elsewhere.url(&format!("/u/{i}"))));
    let registry = serve(
        "hostile/urls",
        &with_layer_urls(one_layer_image(), &urls),
        &[],
    );

    // The first three entries are looked at: ftp is skipped, /u/1 and /u/2 answer 404,
    // and the registry has the blob.
    let out = scene.pull_bounded(&registry, &[]);
    assert_eq!(out.code, 0, "{out:?}");
    let asked: Vec<String> = elsewhere.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(asked, ["/u/1", "/u/2"], "{out:?}");
    assert!(out.stderr.contains("not http or https"), "{out:?}");
    assert!(out.stderr.contains("ignoring the rest"), "{out:?}");
}

#[test]
fn a_malformed_redirect_never_shows_its_signed_query() {
    let scene = Scene::new();
    let redirect =
        Misbehaviour::RedirectTo("/v2/x y?X-Amz-Signature=SECRET&X-Amz-Credential=SECRET");
    let registry = serve(
        "hostile/redirect",
        &one_layer_image(),
        &[("manifests/v1", redirect)],
    );

    // ureq's error quotes the Location whole; lamina retries it (with a log line each
    // time) and then fails.
    let out = scene.pull_bounded(&registry, &[]);
    assert_failed_saying(
        &out,
        &["manifests/v1", "location header is malformed", "?…"],
    );
    assert!(out.stderr.contains("retrying registry request"), "{out:?}");
    assert_no_secret_and_short_lines(&out);
}

#[test]
fn huge_or_malformed_layer_urls_make_short_log_lines_without_their_queries() {
    let scene = Scene::new();
    let elsewhere = HttpServer::start(|_| Response::status(404));
    let huge = elsewhere.url(&format!("/{}?sig=SECRET", "a".repeat(100_000)));
    let urls = [huge, "http:///?sig=SECRET".to_string()];
    let image = with_layer_urls(one_layer_image(), &urls);
    let registry = serve("hostile/huge-urls", &image, &[]);

    let out = scene.pull_bounded(&registry, &[]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stderr
            .matches("non-distributable layer URL failed")
            .count(),
        2,
        "{out:?}"
    );
    assert_no_secret_and_short_lines(&out);
}
