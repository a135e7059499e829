//! A real registry for tests: Debian's `docker-registry` (distribution 2.8) on 127.0.0.1
//! with its storage in a temp dir, optionally behind htpasswd or behind a Bearer token
//! service, and `skopeo` to push. Dropping it kills the server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct Registry {
    pub dir: PathBuf,
    pub host: String,
    config: PathBuf,
    child: Option<Child>,
    creds: Option<(String, String)>,
    /// The Bearer token service, for a registry started with [`Registry::with_tokens`].
    pub token_service: Option<crate::http::HttpServer>,
    /// skopeo's `--dest-cert-dir` for a registry that wants a client certificate.
    push_cert_dir: Option<PathBuf>,
}

/// A registry served over HTTPS with these files (PEM), optionally asking every client for
/// a certificate its `client_ca` signed.
#[derive(Debug, Clone)]
pub struct Tls {
    pub certificate: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    /// What `push` presents (skopeo's cert dir: `client.cert`, `client.key`).
    pub push_cert_dir: Option<PathBuf>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

/// Non-distributable layers may name URLs on this machine (the registry refuses a
/// manifest whose layer URLs no rule allows).
const VALIDATION: &str =
    "validation:\n  manifests:\n    urls:\n      allow:\n        - '^http://127\\.0\\.0\\.1'\n";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Registry {
    /// Starts a registry storing under `dir`; with `creds`, behind htpasswd (bcrypt).
    pub fn start(dir: &Path, creds: Option<(&str, &str)>) -> Registry {
        Registry::start_with(dir, creds, None, None)
    }

    /// Starts a registry storing under `dir`, served over HTTPS as `tls` says.
    pub fn start_tls(dir: &Path, tls: &Tls) -> Registry {
        Registry::start_with(dir, None, None, Some(tls))
    }

    /// Starts a registry storing under `dir` that takes only Bearer tokens, issued by a
    /// token service (see [`crate::token_service`]) to whoever presents `creds`.
    pub fn with_tokens(dir: &Path, creds: (&str, &str)) -> Registry {
        std::fs::create_dir_all(dir).expect("registry dir");
        let service = crate::token_service::start(dir, creds);
        let auth = format!(
            "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
            service.server.url("/token"),
            crate::token_service::SERVICE,
            crate::token_service::ISSUER,
            service.certificate.display()
        );
        let mut registry = Registry::start_with(dir, Some(creds), Some(auth), None);
        registry.token_service = Some(service.server);
        registry
    }

    fn start_with(
        dir: &Path,
        creds: Option<(&str, &str)>,
        auth: Option<String>,
        tls: Option<&Tls>,
    ) -> Registry {
        std::fs::create_dir_all(dir).expect("registry dir");
        let host = format!("127.0.0.1:{}", free_port());
        let mut auth = auth.unwrap_or_default();
        if let Some((user, pass)) = creds.filter(|_| auth.is_empty()) {
            let out = Command::new("htpasswd")
                .args(["-Bbn", user, pass])
                .output()
                .expect("htpasswd (apache2-utils)");
            assert!(out.status.success(), "htpasswd: {out:?}");
            let file = dir.join("htpasswd");
            std::fs::write(&file, out.stdout).expect("htpasswd file");
            auth = format!(
                "auth:\n  htpasswd:\n    realm: lamina-test\n    path: {}\n",
                file.display()
            );
        }
        let config = dir.join("config.yml");
        let tls_yaml = tls.map_or(String::new(), |tls| {
            let mut yaml = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                tls.certificate.display(),
                tls.key.display()
            );
            if let Some(ca) = &tls.client_ca {
                yaml.push_str(&format!("    clientcas:\n      - {}\n", ca.display()));
            }
            yaml
        });
        let yaml = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n{tls_yaml}{auth}{VALIDATION}",
            dir.join("data").display()
        );
        std::fs::write(&config, yaml).expect("registry config");
        let mut registry = Registry {
            dir: dir.to_path_buf(),
            host,
            config,
            child: None,
            creds: creds.map(|(u, p)| (u.to_string(), p.to_string())),
            token_service: None,
            push_cert_dir: tls.and_then(|t| t.push_cert_dir.clone()),
        };
        registry.restart();
        registry
    }

    /// (Re)starts the server on the same address and storage; waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let log = std::fs::File::create(self.dir.join("registry.log")).expect("log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("docker-registry (apt package docker-registry)");
        self.child = Some(child);
        crate::wait_until("the registry to listen", || {
            std::net::TcpStream::connect(&self.host).is_ok()
        });
    }

    /// Kills the server at once (SIGKILL), as a crash or network loss would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// lamina's registry client for `repo_and_target`, speaking plain HTTP to this registry.
    pub fn client(&self, repo_and_target: &str) -> lamina_registry::Client {
        let reference = lamina_registry::RegistryRef::parse(&self.reference(repo_and_target))
            .expect("a docker:// reference")
            .expect("a valid reference");
        let options = lamina_registry::PullOptions {
            insecure_registries: vec![self.host.clone()],
            ..Default::default()
        };
        lamina_registry::Client::new(&reference, &options).expect("a registry client")
    }

    /// `docker://HOST/REPO:TAG` (or `@DIGEST`).
    pub fn reference(&self, repo_and_target: &str) -> String {
        format!("docker://{}/{repo_and_target}", self.host)
    }

    /// Pushes the OCI layout image `layout:ref` (all platforms) as `repo:tag`.
    pub fn push(&self, layout: &Path, reference: &str, repo_tag: &str) {
        let mut args = vec![
            "copy".to_string(),
            "--all".into(),
            "--dest-tls-verify=false".into(),
            "--retry-times=2".into(),
        ];
        if let Some((u, p)) = &self.creds {
            args.push(format!("--dest-creds={u}:{p}"));
        }
        if let Some(dir) = &self.push_cert_dir {
            args.push(format!("--dest-cert-dir={}", dir.display()));
        }
        args.push(format!("oci:{}:{reference}", layout.display()));
        args.push(format!("docker://{}/{repo_tag}", self.host));
        let out = Command::new("skopeo").args(&args).output().expect("skopeo");
        assert!(out.status.success(), "skopeo copy: {out:?}");
    }

    /// The manifest digest the registry serves for `repo:tag`.
    pub fn digest(&self, repo_tag: &str) -> String {
        lamina_image::Digest::of(&self.manifest(repo_tag)).to_string()
    }

    /// The manifest bytes the registry serves for `repo:tag`.
    pub fn manifest(&self, repo_tag: &str) -> Vec<u8> {
        let mut args = vec![
            "inspect".to_string(),
            "--raw".into(),
            "--tls-verify=false".into(),
        ];
        if let Some((u, p)) = &self.creds {
            args.push(format!("--creds={u}:{p}"));
        }
        args.push(format!("docker://{}/{repo_tag}", self.host));
        let out = Command::new("skopeo").args(&args).output().expect("skopeo");
        assert!(out.status.success(), "skopeo inspect: {out:?}");
        out.stdout
    }

    /// PUTs `manifest` (of `media_type`) as `repo:tag` through the registry API, the way
    /// a pusher would; the registry validates it. Anonymous registries only.
    pub fn put_manifest(&self, repo_tag: &str, media_type: &str, manifest: &[u8]) {
        let (repo, tag) = repo_tag.rsplit_once(':').expect("REPO:TAG");
        let url = format!("http://{}/v2/{repo}/manifests/{tag}", self.host);
        let response = ureq::put(&url)
            .header("Content-Type", media_type)
            .config()
            .http_status_as_error(false)
            .build()
            .send(manifest)
            .expect("PUT manifest");
        let status = response.status().as_u16();
        let body = response.into_body().read_to_string().unwrap_or_default();
        assert_eq!(status, 201, "PUT {url}: {body}");
    }

    /// The file the registry stores blob `digest` in (to tamper with it).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
