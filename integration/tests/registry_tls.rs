//! Private registries over HTTPS, as operators run them: a CA of their own, trusted
//! through the system's CA store or through `certs.d/HOST:PORT/ca.crt`, and a registry
//! that asks for a client certificate (`client.cert`, `client.key` beside it). Each is
//! Debian's docker-registry serving certificates this test makes with openssl.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use lamina_integration::registry::{Registry, Tls};
use lamina_integration::{Lamina, ScratchFs, require_root};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it.
fn pki(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=lamina test CA",
        ],
    );
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, subject) in [("server", "/CN=127.0.0.1"), ("client", "/CN=lamina")] {
        let (key, csr, cert, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subject,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
    // skopeo's and lamina's certs.d file names.
    std::fs::copy(dir.join("client.pem"), dir.join("client.cert")).unwrap();
    dir.to_path_buf()
}

/// `root/HOST/` holding `files` (name in `root`, from `pki`).
fn certs_d(root: &Path, host: &str, pki: &Path, files: &[(&str, &str)]) -> PathBuf {
    let dir = root.join(host);
    std::fs::create_dir_all(&dir).unwrap();
    for (from, to) in files {
        std::fs::copy(pki.join(from), dir.join(to)).unwrap();
    }
    root.to_path_buf()
}

fn push_sample(fs: &ScratchFs, registry: &Registry) -> String {
    let dir = fs.path().join("sample");
    lamina_integration::sample_image(&dir);
    registry.push(&dir.join("layout"), "latest", "private/app:v1");
    registry.reference("private/app:v1")
}

#[test]
fn a_registry_with_a_ca_of_its_own_is_trusted_through_certs_d_or_the_system_store() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let pki = pki(&fs.path().join("pki"));
    let tls = Tls {
        certificate: pki.join("server.pem"),
        key: pki.join("server.key"),
        client_ca: None,
        push_cert_dir: None,
    };
    let registry = Registry::start_tls(&fs.path().join("registry"), &tls);
    let image = push_sample(&fs, &registry);
    let lamina = Lamina::init(&fs.path().join("store"));
    let nothing = fs.path().join("no-certs");

    // Neither the system store nor an empty certs.d trusts the registry's CA.
    let dir = nothing.to_str().unwrap();
    let out = lamina.run(&["--registry-certs-dir", dir, "create", &image, "untrusted"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout.contains(&registry.host),
        "names the registry: {out:?}"
    );
    assert!(!lamina.store.join("images/untrusted").exists());

    // certs.d/HOST:PORT/ca.crt: trusted for that registry.
    let certs = certs_d(
        &fs.path().join("certs.d"),
        &registry.host,
        &pki,
        &[("ca.crt", "ca.crt")],
    );
    let dir = certs.to_str().unwrap();
    let out = lamina.run(&["--registry-certs-dir", dir, "create", &image, "via-certs-d"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(lamina.rootfs("via-certs-d").join("etc/hosts").exists());

    // The system's CA store (here SSL_CERT_FILE): trusted for every registry.
    let out = lamina
        .command(&[
            "--registry-certs-dir",
            nothing.to_str().unwrap(),
            "create",
            &image,
            "via-system",
        ])
        .env("SSL_CERT_FILE", pki.join("ca.crt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(lamina.rootfs("via-system").join("etc/hosts").exists());

    for id in ["via-certs-d", "via-system"] {
        lamina.delete_and_assert_gone(id, id);
    }
}

#[test]
fn a_registry_that_asks_for_a_client_certificate_gets_the_one_in_certs_d() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let pki = pki(&fs.path().join("pki"));
    let push = fs.path().join("push-certs");
    std::fs::create_dir_all(&push).unwrap();
    for name in ["client.cert", "client.key"] {
        std::fs::copy(pki.join(name), push.join(name)).unwrap();
    }
    let tls = Tls {
        certificate: pki.join("server.pem"),
        key: pki.join("server.key"),
        client_ca: Some(pki.join("ca.crt")),
        push_cert_dir: Some(push),
    };
    let registry = Registry::start_tls(&fs.path().join("registry"), &tls);
    let image = push_sample(&fs, &registry);
    let lamina = Lamina::init(&fs.path().join("store"));

    // The CA alone: the registry refuses the handshake.
    let ca_only = certs_d(
        &fs.path().join("ca-only"),
        &registry.host,
        &pki,
        &[("ca.crt", "ca.crt")],
    );
    let dir = ca_only.to_str().unwrap();
    let out = lamina.run(&["--registry-certs-dir", dir, "create", &image, "anonymous"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(!lamina.store.join("images/anonymous").exists());

    let full = certs_d(
        &fs.path().join("full"),
        &registry.host,
        &pki,
        &[
            ("ca.crt", "ca.crt"),
            ("client.cert", "client.cert"),
            ("client.key", "client.key"),
        ],
    );
    let dir = full.to_str().unwrap();
    let out = lamina.run(&["--registry-certs-dir", dir, "create", &image, "known"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(lamina.rootfs("known").join("etc/hosts").exists());
    lamina.delete_and_assert_gone("known", "known");
}
