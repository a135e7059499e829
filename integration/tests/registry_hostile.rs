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

/// How long coreutils `timeout` lets one bounded lamina run: well past what the bounds
/// below allow (about 2 × 2 s for a drip, 5 × 1 s and 3.75 s of backoff for a dead port),
/// well short of what lamina took without them (for ever, bar the server's 60 s hold; or
/// 5 × 15 s of connect timeout).
const BOUND: &str = "40";

/// Runs `timeout BOUND lamina --store S --log-level warn --insecure-registry INSECURE
/// ARGS...`. Exit 124 means it ran past [`BOUND`] and was killed.
fn run_bounded(lamina: &Lamina, insecure: &str, args: &[&str]) -> Output {
    let mut all = vec!["--insecure-registry", insecure];
    all.extend_from_slice(args);
    let inner = lamina.command(&all);
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

/// Failed by itself (not killed by `timeout`), in one line holding every one of `needles`.
fn assert_failed_saying(out: &Output, needles: &[&str]) {
    eprintln!("{}", out.stdout);
    assert_ne!(out.code, 124, "still running after {BOUND} s: {out:?}");
    assert_eq!(out.code, 1, "{out:?}");
    assert!(!out.stdout.contains('\n'), "one line: {out:?}");
    for needle in needles {
        assert!(out.stdout.contains(needle), "missing `{needle}`: {out:?}");
    }
}

const DRIP: Misbehaviour = Misbehaviour::Drip(Duration::from_millis(1500));

#[test]
fn a_dripping_layer_body_fails_as_too_slow_naming_its_digest_and_registry() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = one_layer_image();
    let digest = layer_digest(&image);
    let registry = HostileRegistry::start(
        "hostile/drip",
        "v1",
        &image,
        &format!("blobs/{digest}"),
        DRIP,
    );

    // A byte every 1.5 s never trips a 2 s stall timeout; only the rate floor ends it.
    let out = run_bounded(
        &lamina,
        &registry.addr,
        &[
            "--registry-timeout-seconds",
            "2",
            "pull",
            &registry.reference(),
        ],
    );
    assert_failed_saying(
        &out,
        &[
            &digest.to_string(),
            &format!("registry {}", registry.addr),
            "too slow: ",
            "under the minimum of 1024 bytes/s",
        ],
    );
    assert_store_untouched(&lamina);
}

#[test]
fn dripping_layers_imported_in_parallel_all_end() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = layered_image(3);
    let paths: Vec<String> = image
        .layers
        .iter()
        .map(|(digest, _)| format!("blobs/{digest}"))
        .collect();
    let faults: Vec<(&str, Misbehaviour)> = paths.iter().map(|p| (p.as_str(), DRIP)).collect();
    let registry = HostileRegistry::start_with("hostile/drips", "v1", &image, &faults, false);

    // Three layers in flight at once, each holding its layer lock: every one must end.
    let out = run_bounded(
        &lamina,
        &registry.addr,
        &[
            "--registry-timeout-seconds",
            "2",
            "pull",
            &registry.reference(),
        ],
    );
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
    assert_store_untouched(&lamina);
}

#[test]
fn a_dripping_manifest_or_token_response_fails_as_too_slow() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = one_layer_image();

    let registry = HostileRegistry::start("hostile/manifest", "v1", &image, "manifests/v1", DRIP);
    let out = run_bounded(
        &lamina,
        &registry.addr,
        &[
            "--registry-timeout-seconds",
            "2",
            "pull",
            &registry.reference(),
        ],
    );
    assert_failed_saying(&out, &[&registry.addr, "reading manifests/v1: too slow: "]);
    drop(registry);

    // The registry wants a Bearer token; its realm drips the answer.
    let registry =
        HostileRegistry::start_with("hostile/token", "v1", &image, &[(TOKEN_PATH, DRIP)], true);
    let out = run_bounded(
        &lamina,
        &registry.addr,
        &[
            "--registry-timeout-seconds",
            "2",
            "pull",
            &registry.reference(),
        ],
    );
    let realm = format!(
        "reading the token from http://{}{TOKEN_PATH}",
        registry.addr
    );
    assert_failed_saying(&out, &[&realm, "too slow: "]);
    assert_eq!(registry.faulty_requests(), 1, "{:?}", registry.paths());
    assert_store_untouched(&lamina);
}

#[test]
fn a_registry_port_that_never_connects_fails_at_the_configured_timeout() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let blackhole = Blackhole::start();

    // Five attempts of 1 s each plus 3.75 s of backoff; with a fixed 15 s connect timeout
    // this took 79 s.
    let reference = format!("docker://{}/hostile/blackhole:v1", blackhole.addr);
    let out = run_bounded(
        &lamina,
        &blackhole.addr,
        &["--registry-timeout-seconds", "1", "pull", &reference],
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

/// `image` with its first layer's `urls` set to `urls`.
fn with_layer_urls(mut image: BuiltImage, urls: &[String]) -> BuiltImage {
    hostile::edit_manifest(&mut image, |m| {
        m["layers"][0]["urls"] = serde_json::json!(urls);
    });
    image
}

#[test]
fn a_layer_is_fetched_from_at_most_three_of_its_urls_and_only_over_http() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let elsewhere = HttpServer::start(|_| Response::status(404));
    let mut urls = vec![format!("ftp://{}/u/0", elsewhere.addr)];
    urls.extend((1..=5).map(|i| elsewhere.url(&format!("/u/{i}"))));
    let image = with_layer_urls(one_layer_image(), &urls);
    let registry = HostileRegistry::start_with("hostile/urls", "v1", &image, &[], false);

    // The first three entries are looked at: ftp is skipped, /u/1 and /u/2 answer 404,
    // and the registry has the blob.
    let out = run_bounded(&lamina, &registry.addr, &["pull", &registry.reference()]);
    assert_eq!(out.code, 0, "{out:?}");
    let asked: Vec<String> = elsewhere.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(asked, ["/u/1", "/u/2"], "{out:?}");
    assert!(out.stderr.contains("not http or https"), "{out:?}");
    assert!(out.stderr.contains("ignoring the rest"), "{out:?}");
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
fn a_malformed_redirect_never_shows_its_signed_query() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = one_layer_image();
    let registry = HostileRegistry::start(
        "hostile/redirect",
        "v1",
        &image,
        "manifests/v1",
        Misbehaviour::RedirectTo("/v2/x y?X-Amz-Signature=SECRET&X-Amz-Credential=SECRET"),
    );

    // ureq's error quotes the Location whole; lamina retries it (with a log line each
    // time) and then fails.
    let out = run_bounded(&lamina, &registry.addr, &["pull", &registry.reference()]);
    assert_failed_saying(
        &out,
        &["manifests/v1", "location header is malformed", "?…"],
    );
    assert!(out.stderr.contains("retrying registry request"), "{out:?}");
    assert_no_secret_and_short_lines(&out);
}

#[test]
fn huge_or_malformed_layer_urls_make_short_log_lines_without_their_queries() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let lamina = Lamina::init(&fs.path().join("store"));
    let elsewhere = HttpServer::start(|_| Response::status(404));
    let huge = elsewhere.url(&format!("/{}?sig=SECRET", "a".repeat(100_000)));
    let urls = [huge, "http:///?sig=SECRET".to_string()];
    let image = with_layer_urls(one_layer_image(), &urls);
    let registry = HostileRegistry::start_with("hostile/huge-urls", "v1", &image, &[], false);

    let out = run_bounded(&lamina, &registry.addr, &["pull", &registry.reference()]);
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
