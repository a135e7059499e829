//! Registry credentials where operators keep them: a Docker `config.json`'s `auths`, and a
//! credential helper it names (a script this test writes), against Debian's
//! docker-registry behind htpasswd.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use lamina_integration::registry::Registry;
use lamina_integration::{Lamina, ScratchFs, require_root};

fn write_config(path: &Path, json: &str) {
    std::fs::write(path, json).unwrap();
}

/// `docker-credential-NAME` in `dir`, running `body` (sh).
fn helper(dir: &Path, name: &str, body: &str) {
    let path = dir.join(format!("docker-credential-{name}"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut file, format!("#!/bin/sh\n{body}\n").as_bytes()).unwrap();
}

#[test]
fn credentials_come_from_a_docker_config_and_its_credential_helpers() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let registry = Registry::start(&fs.path().join("registry"), Some(("alice", "s3cret")));
    let sample = fs.path().join("sample");
    lamina_integration::sample_image(&sample);
    registry.push(&sample.join("layout"), "latest", "private/app:v1");
    let image = registry.reference("private/app:v1");
    let host = registry.host.clone();
    let lamina = Lamina::init(&fs.path().join("store"));
    let config = fs.path().join("config.json");
    let file = config.to_str().unwrap();
    let create = |id: &str, extra: &[&str]| {
        let mut args = vec!["--insecure-registry", &host, "--registry-auth-file", file];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["create", &image, id]);
        let mut command = lamina.command(&args);
        command.env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", fs.path().display()),
        );
        command.output().unwrap()
    };

    // No entry for this registry: asked for credentials, refused.
    write_config(&config, r#"{"auths":{"other.example":{"auth":"eDp5"}}}"#);
    let out = create("none", &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("wants credentials"),
        "{out:?}"
    );

    // auths, filed under the registry's URL as `docker login` files it.
    write_config(
        &config,
        &format!(r#"{{"auths":{{"http://{host}/v1/":{{"auth":"YWxpY2U6czNjcmV0"}}}}}}"#),
    );
    let out = create("from-auths", &[]);
    assert!(out.status.success(), "{out:?}");

    // A credential helper for this registry, told the registry on stdin.
    helper(
        fs.path(),
        "lamina-test",
        r#"read host; [ "$host" = "$EXPECTED" ] || exit 1; printf '{"ServerURL":"%s","Username":"alice","Secret":"s3cret"}' "$host""#,
    );
    write_config(
        &config,
        &format!(r#"{{"credHelpers":{{"{host}":"lamina-test"}},"auths":{{}}}}"#),
    );
    let mut command = lamina.command(&[
        "--insecure-registry",
        &host,
        "--registry-auth-file",
        file,
        "create",
        &image,
        "from-helper",
    ]);
    command
        .env(
            "PATH",
            format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", fs.path().display()),
        )
        .env("EXPECTED", &host);
    let out = command.output().unwrap();
    assert!(out.status.success(), "{out:?}");

    // A helper that never answers is given the registry timeout, then named.
    helper(fs.path(), "lamina-hang", "sleep 60");
    write_config(&config, r#"{"credsStore":"lamina-hang"}"#);
    let out = create("hung", &["--registry-timeout-seconds", "1"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("docker-credential-lamina-hang") && stdout.contains("did not answer"),
        "{out:?}"
    );

    // One that answers but leaves a child holding its stdout is ended with that child.
    helper(
        fs.path(),
        "lamina-linger",
        r#"(sleep 37) & printf '{"Username":"alice","Secret":"s3cret"}'"#,
    );
    write_config(&config, r#"{"credsStore":"lamina-linger"}"#);
    let out = create("lingered", &["--registry-timeout-seconds", "1"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lingering = std::process::Command::new("pgrep")
        .args(["-f", "sleep 37"])
        .output()
        .unwrap();
    assert!(
        lingering.stdout.is_empty(),
        "the helper's child outlived it: {lingering:?}"
    );

    for id in ["from-auths", "from-helper"] {
        lamina.delete_and_assert_gone(id, id);
    }
    assert!(!lamina.store.join("images/none").exists());
    assert!(!lamina.store.join("images/hung").exists());
    assert!(!lamina.store.join("images/lingered").exists());
}
