//! Pulling from a real registry (Debian's docker-registry on 127.0.0.1, images pushed
//! with skopeo): by tag and by digest, a multi-platform index, a tampered blob, htpasswd
//! credentials good and bad, and the registry dying mid-pull.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;

use lamina_image::spec::{self, Index};
use lamina_image::{Compression, Digest, Platform};
use lamina_integration::registry::Registry;
use lamina_integration::scratch::mounts_under;
use lamina_integration::tree::Tree;
use lamina_integration::{Bundle, Lamina, ScratchFs, hostile, require_root};
use lamina_sample::{LayerBuilder, build_image, descriptor, write_oci_layout};

fn insecure(registry: &Registry) -> [String; 2] {
    ["--insecure-registry".into(), registry.host.clone()]
}

fn run(lamina: &Lamina, registry: &Registry, args: &[&str]) -> lamina_integration::Output {
    let flags = insecure(registry);
    let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    lamina.run(&all)
}

/// Pushes the busybox sample (built under `fs`) to `registry` as `repo_tag`.
fn push_sample(registry: &Registry, fs: &ScratchFs, repo_tag: &str) {
    let dir = fs.path().join("img");
    lamina_integration::sample_image(&dir);
    registry.push(&dir.join("layout"), "latest", repo_tag);
}

#[test]
fn pull_by_tag_and_digest_then_boot_it() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_sample(&registry, &fs, "sample/busybox:v1");
    let lamina = Lamina::init(&fs.path().join("store"));

    let by_tag = registry.reference("sample/busybox:v1");
    let out = run(&lamina, &registry, &["pull", &by_tag]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.json()["layers"], 2);
    // A second pull resumes from the store: nothing is fetched or changed.
    let layers = Tree::of(&lamina.store.join("layers"), &[]);
    let again = run(&lamina, &registry, &["pull", &by_tag]);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(layers, Tree::of(&lamina.store.join("layers"), &[]));

    let by_digest = registry.reference(&format!(
        "sample/busybox@{}",
        registry.digest("sample/busybox:v1")
    ));
    let out = run(&lamina, &registry, &["create", &by_digest, "pulled"]);
    assert_eq!(out.code, 0, "{out:?}");
    let bundle = Bundle::new(&lamina.rootfs("pulled"), false);
    let booted = bundle.run(
        "pulled",
        "cat /etc/os-release >/dev/null; echo booted-from-registry",
    );
    assert_eq!(booted.code, 0, "{booted:?}");
    assert!(booted.stdout.contains("booted-from-registry"), "{booted:?}");
    lamina.delete_and_assert_gone("pulled", "registry");
}

#[test]
fn a_multi_platform_index_gives_this_hosts_image() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let registry = Registry::start(&fs.path().join("registry"), None);
    let layout = fs.path().join("multi");
    let for_platform = |platform: &Platform, marker: &str| {
        let top = LayerBuilder::new()
            .file("platform", 0o644, marker.as_bytes())
            .unwrap()
            .finish()
            .unwrap();
        build_image(
            &[hostile::gzip(hostile::base_layer()), hostile::gzip(top)],
            &[],
            platform,
        )
        .unwrap()
    };
    let host = for_platform(&Platform::host(), "host");
    let other = Platform {
        os: "linux".into(),
        architecture: "s390x".into(),
        variant: None,
    };
    let foreign = for_platform(&other, "s390x");
    let index = Index {
        schema_version: 2,
        media_type: Some(spec::OCI_INDEX.into()),
        manifests: vec![foreign.manifest.clone(), host.manifest.clone()],
    };
    let index_bytes = serde_json::to_vec(&index).unwrap();
    let index_digest = Digest::of(&index_bytes);
    let root = descriptor(spec::OCI_INDEX, &index_digest, index_bytes.len());
    write_oci_layout(&layout, &[&host, &foreign], &[(root, Some("multi"))]).unwrap();
    fs::write(
        layout.join("blobs/sha256").join(index_digest.hex()),
        &index_bytes,
    )
    .unwrap();
    registry.push(&layout, "multi", "multi/app:v1");

    let lamina = Lamina::init(&fs.path().join("store"));
    let out = run(
        &lamina,
        &registry,
        &["create", &registry.reference("multi/app:v1"), "multi"],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        fs::read_to_string(lamina.rootfs("multi").join("platform")).unwrap(),
        "host"
    );
    lamina.delete_and_assert_gone("multi", "multi-platform");

    let out = run(
        &lamina,
        &registry,
        &[
            "pull",
            "--platform",
            "linux/arm64",
            &registry.reference("multi/app:v1"),
        ],
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.contains("no image for platform linux/arm64"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_tampered_blob_is_refused_and_leaves_no_layer() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let registry = Registry::start(&fs.path().join("registry"), None);
    let image = hostile::with_top_file("payload", b"genuine", Compression::Gzip);
    let layout = fs.path().join("img");
    hostile::write(&layout, &image);
    registry.push(&layout, hostile::TAG, "tampered/app:v1");
    // The registry now serves other bytes under the top layer's digest.
    let evil = LayerBuilder::new()
        .file("payload", 0o644, b"evil!!!")
        .unwrap()
        .finish()
        .unwrap();
    let evil = build_image(&[hostile::gzip(evil)], &[], &Platform::host()).unwrap();
    fs::write(
        registry.blob_file(&image.layers[1].0.to_string()),
        &evil.blobs[&evil.layers[0].0],
    )
    .unwrap();

    let lamina = Lamina::init(&fs.path().join("store"));
    let out = run(
        &lamina,
        &registry,
        &["create", &registry.reference("tampered/app:v1"), "t"],
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1);
    assert!(out.stdout.contains("layer 1 (sha256:"), "{}", out.stdout);
    assert!(out.stdout.contains("digest mismatch"), "{}", out.stdout);
    assert_eq!(lamina.entries("images"), 0);
    assert_eq!(lamina.entries("tmp"), 0);
    assert!(
        lamina.entries("layers") <= 1,
        "only the genuine base layer may stay"
    );
    assert!(mounts_under(&lamina.store).is_empty());
}

#[test]
fn htpasswd_credentials_good_and_bad() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let password = "pa55-w0rd-never-printed";
    let registry = Registry::start(&fs.path().join("registry"), Some(("alice", password)));
    push_sample(&registry, &fs, "private/app:v1");
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = registry.reference("private/app:v1");

    let none = run(&lamina, &registry, &["pull", &image]);
    assert_eq!(none.code, 1, "{none:?}");
    assert!(none.stdout.contains("wants credentials"), "{}", none.stdout);

    let wrong = run(
        &lamina,
        &registry,
        &[
            "--username",
            "alice",
            "--password",
            "nope-wrong",
            "pull",
            &image,
        ],
    );
    assert_eq!(wrong.code, 1, "{wrong:?}");
    assert!(
        wrong.stdout.contains("credentials were refused"),
        "{}",
        wrong.stdout
    );
    assert!(!wrong.stdout.contains("nope-wrong") && !wrong.stderr.contains("nope-wrong"));

    let good = run(
        &lamina,
        &registry,
        &[
            "--username",
            "alice",
            "--password",
            password,
            "--log-level",
            "debug",
            "pull",
            &image,
        ],
    );
    assert_eq!(good.code, 0, "{good:?}");
    assert!(
        !good.stdout.contains(password) && !good.stderr.contains(password),
        "credentials leaked into output"
    );
    assert_eq!(lamina.entries("layers"), 2);
}

#[test]
fn the_registry_dying_mid_pull_fails_cleanly_and_a_retry_succeeds() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let mut registry = Registry::start(&fs.path().join("registry"), None);
    // Big enough, uncompressed, that the pull is still streaming when the registry dies.
    let image = hostile::with_top_file("big", &hostile::noise(192 << 20), Compression::None);
    let layout = fs.path().join("img");
    hostile::write(&layout, &image);
    registry.push(&layout, hostile::TAG, "big/app:v1");
    fs::remove_dir_all(&layout).unwrap();
    let lamina = Lamina::init(&fs.path().join("store"));
    let reference = registry.reference("big/app:v1");

    let flags = insecure(&registry);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend_from_slice(&["pull", &reference]);
    let pull = lamina
        .command(&args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let staging = lamina.store.join("tmp");
    lamina_integration::wait_until("the pull to start streaming", || {
        fs::read_dir(&staging).unwrap().any(|e| {
            let path = e.unwrap().path();
            lamina_integration::lamina::dir_size(&path) > 8 << 20
        })
    });
    registry.stop();
    let out = pull.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(stdout.trim().lines().count(), 1, "{stdout}");
    assert!(stdout.contains("layer 1 (sha256:"), "{stdout}");
    assert!(
        stdout.contains(&format!("reading from registry {}", registry.host)),
        "{stdout}"
    );
    assert_eq!(lamina.entries("tmp"), 0, "no partial layer: {stdout}");
    assert!(lamina.entries("layers") <= 1, "{stdout}");

    registry.restart();
    let out = run(&lamina, &registry, &["pull", &reference]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(lamina.entries("layers"), 2);
}

#[test]
fn bearer_tokens_from_a_token_service() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let password = "t0ken-secret-never-printed";
    let registry = Registry::with_tokens(&fs.path().join("registry"), ("bob", password));
    push_sample(&registry, &fs, "tokened/app:v1");
    let tokens = registry.token_service.as_ref().unwrap();
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = registry.reference("tokened/app:v1");
    let asked = tokens.requests().len();

    let none = run(&lamina, &registry, &["pull", &image]);
    assert_eq!(none.code, 1, "{none:?}");
    assert!(
        none.stdout.contains("token service wants credentials"),
        "{}",
        none.stdout
    );
    let wrong = run(
        &lamina,
        &registry,
        &[
            "--username",
            "bob",
            "--password",
            "wrong-one",
            "pull",
            &image,
        ],
    );
    assert_eq!(wrong.code, 1, "{wrong:?}");
    assert!(
        wrong
            .stdout
            .contains("token service refused the credentials"),
        "{}",
        wrong.stdout
    );
    assert_eq!(lamina.entries("layers"), 0);

    let good = run(
        &lamina,
        &registry,
        &[
            "--username",
            "bob",
            "--password",
            password,
            "--log-level",
            "debug",
            "pull",
            &image,
        ],
    );
    assert_eq!(good.code, 0, "{good:?}");
    assert_eq!(lamina.entries("layers"), 2);
    let leaked = |out: &lamina_integration::Output, secret: &str| {
        out.stdout.contains(secret) || out.stderr.contains(secret)
    };
    assert!(!leaked(&good, password) && !leaked(&wrong, "wrong-one"));
    // lamina asked the realm the registry named, for pull on this repository only, as
    // the service the registry named; the token itself never shows in output.
    let requests = tokens.requests();
    let ours = &requests[asked..];
    assert_eq!(ours.len(), 3, "one token request per pull: {ours:?}");
    for request in ours {
        assert_eq!(request.params("scope"), ["repository:tokened/app:pull"]);
        assert_eq!(
            request.params("service"),
            [lamina_integration::token_service::SERVICE]
        );
    }
    assert!(
        !good.stderr.contains("eyJ"),
        "a JWT leaked: {}",
        good.stderr
    );
}

/// A non-distributable layer is fetched from its `urls`, in order, as GrootFS does: the
/// registry does not even hold its blob.
#[test]
fn a_non_distributable_layer_comes_from_its_urls() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_sample(&registry, &fs, "foreign/app:base");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&registry.manifest("foreign/app:base")).unwrap();
    let top = manifest["layers"].as_array().unwrap().len() - 1;
    let digest = manifest["layers"][top]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = fs::read(registry.blob_file(&digest)).unwrap();
    let served = format!("/layers/{digest}");
    let server = {
        let served = served.clone();
        lamina_integration::http::HttpServer::start(move |request| {
            if request.path == served {
                lamina_integration::http::Response::ok("application/octet-stream", blob.clone())
            } else {
                lamina_integration::http::Response::status(404)
            }
        })
    };
    let gone = server.url("/gone/layer.tar.gz");
    let layer = &mut manifest["layers"][top];
    let media_type = layer["mediaType"].as_str().unwrap().replace(
        "application/vnd.oci.image.layer.v1.",
        "application/vnd.oci.image.layer.nondistributable.v1.",
    );
    layer["mediaType"] = media_type.into();
    layer["urls"] = serde_json::json!([gone, server.url(&served)]);
    registry.put_manifest(
        "foreign/app:v1",
        spec::OCI_MANIFEST,
        manifest.to_string().as_bytes(),
    );
    fs::remove_file(registry.blob_file(&digest)).unwrap();

    let lamina = Lamina::init(&fs.path().join("store"));
    let out = run(
        &lamina,
        &registry,
        &["create", &registry.reference("foreign/app:v1"), "foreign"],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/gone/layer.tar.gz", served.as_str()]);
    assert!(lamina.rootfs("foreign").join("bin/busybox").exists());
    lamina.delete_and_assert_gone("foreign", "registry");
}

/// A person at a terminal sees a bar per layer; a supervisor reading a pipe gets a JSON
/// log line per layer instead, and on a second pull that each layer was already there.
#[test]
fn progress_is_bars_on_a_terminal_and_log_lines_otherwise() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_sample(&registry, &fs, "sample/busybox:v1");
    let image = registry.reference("sample/busybox:v1");
    let layer_names: Vec<String> = {
        let manifest: serde_json::Value =
            serde_json::from_slice(&registry.manifest("sample/busybox:v1")).unwrap();
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, l)| format!("layer {i} ({})", l["digest"].as_str().unwrap()))
            .collect()
    };
    let log_lines = |out: &lamina_integration::Output, message: &str| -> Vec<String> {
        out.stderr
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            // lager's lines (the CLI's default): `lamina.<command>.<message>`.
            .filter(|l| {
                l["message"]
                    .as_str()
                    .is_some_and(|m| m.ends_with(&format!(".{message}")))
            })
            .map(|l| l["data"]["layer"].as_str().unwrap().to_string())
            .collect()
    };

    let piped = Lamina::init(&fs.path().join("piped"));
    let first = run(&piped, &registry, &["--log-level", "info", "pull", &image]);
    assert_eq!(first.json()["layers"], 2);
    let mut fetched = log_lines(&first, "fetching layer");
    fetched.sort();
    assert_eq!(fetched, layer_names, "{}", first.stderr);
    assert!(
        !first.stderr.contains('\u{1b}'),
        "no terminal codes in a pipe"
    );
    let second = run(&piped, &registry, &["--log-level", "info", "pull", &image]);
    assert_eq!(second.json()["layers"], 2);
    assert!(log_lines(&second, "fetching layer").is_empty());
    let mut present = log_lines(&second, "layer already in the store");
    present.sort();
    assert_eq!(present, layer_names);

    let person = Lamina::init(&fs.path().join("person"));
    let flags = insecure(&registry);
    let (code, screen) = person.run_on_terminal(&[&flags[0], &flags[1], "pull", &image]);
    assert_eq!(code, 0, "{screen}");
    for (i, name) in layer_names.iter().enumerate() {
        let digest = &name[name.find("sha256:").unwrap()..];
        let label = format!("layer {i} {}", &digest[..7 + 12]);
        let bar = screen
            .lines()
            .flat_map(|l| l.split('\r'))
            .rfind(|l| l.contains(&label))
            .unwrap_or_else(|| panic!("no bar for {label}: {screen:?}"));
        assert!(bar.contains("done"), "{label} did not finish: {bar:?}");
    }
    assert!(screen.contains("\"top_chain_id\""), "{screen}");
    let (code, screen) = person.run_on_terminal(&[&flags[0], &flags[1], "pull", &image]);
    assert_eq!(code, 0, "{screen}");
    assert_eq!(
        screen.matches("already in the store").count(),
        2,
        "{screen}"
    );
}

/// Lazy pulling reads parts of a layer: the registry serves a byte range of a blob (206
/// with its Content-Range), and a range past the blob's end, empty or too long is refused
/// before any request.
#[test]
fn a_blob_is_read_by_byte_range() {
    require_root();
    let fs = ScratchFs::ext4(256);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_sample(&registry, &fs, "sample:latest");
    let client = registry.client("sample:latest");
    let manifest: serde_json::Value =
        serde_json::from_slice(&registry.manifest("sample:latest")).unwrap();
    let layer = &manifest["layers"][0];
    let digest = layer["digest"].as_str().unwrap().to_string();
    let size = layer["size"].as_u64().unwrap();
    let blob = fs::read(registry.blob_file(&digest)).unwrap();
    assert_eq!(blob.len() as u64, size);
    let got = client.read_range(&digest, size, 100, 4096).unwrap();
    assert_eq!(got, blob[100..4196]);
    let tail = client.read_range(&digest, size, size - 51, 51).unwrap();
    assert_eq!(tail, blob[blob.len() - 51..]);
    for (start, len) in [
        (size - 10, 11),
        (0, 0),
        (0, lamina_registry::MAX_RANGE_BYTES + 1),
    ] {
        let err = client.read_range(&digest, size, start, len).unwrap_err();
        assert!(err.to_string().contains(&digest), "{err}");
    }
}
