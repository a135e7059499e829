//! Whom a registry connection trusts, and what it shows of itself: the system's CA store
//! (Debian's `ca-certificates` bundle, or `SSL_CERT_FILE`), else the bundled web PKI
//! roots; plus, per registry, Docker's and containerd's `certs.d` convention:
//! `<certs_dir>/<HOST[:PORT]>/*.crt` more CAs to trust for that registry alone, and
//! `client.cert` with `client.key` a client certificate to present.

use std::path::{Path, PathBuf};

use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};

use crate::RegistryError;

/// Where the system keeps its CA bundle, first found wins (`SSL_CERT_FILE` before them).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// No certificate file an operator keeps is this large; a larger one is refused unread.
const MAX_PEM_BYTES: u64 = 4 << 20;

/// The TLS configurations a pull from `host` (`host` or `host:port`) uses, the system's
/// CA store read once for both.
#[derive(Debug)]
pub struct Trust {
    /// For the registry itself: the system's trust plus `certs_dir`'s files for `host`,
    /// if it has a directory there.
    pub registry: TlsConfig,
    /// For every other host: the system's trust alone, no client certificate.
    pub elsewhere: TlsConfig,
}

/// The [`Trust`] of a pull from `host`. A file in `certs_dir` that is there but cannot be
/// read or parsed is an error naming it: a registry silently trusted less than configured
/// fails later and harder to read.
pub fn trust(host: &str, certs_dir: Option<&Path>) -> Result<Trust, RegistryError> {
    let system = system_roots()?;
    let elsewhere = config(system.clone(), None);
    let mut roots = system;
    let mut client = None;
    // The host comes from an image reference: one name, never a path out of certs.d (a
    // client key is presented only to the registry whose directory holds it).
    let one_name = !host.is_empty() && host != "." && host != ".." && !host.contains(['/', '\0']);
    if let Some(dir) = certs_dir
        .filter(|_| one_name)
        .map(|d| d.join(host))
        .filter(|d| d.is_dir())
    {
        let mut cas = Vec::new();
        let entries = std::fs::read_dir(&dir).map_err(|e| fail(&dir, &e.to_string()))?;
        let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        names.sort();
        for path in names
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "crt"))
        {
            cas.extend(certificates(path)?);
        }
        if !cas.is_empty() {
            roots.get_or_insert_with(Vec::new).extend(cas);
        }
        let (cert, key) = (dir.join("client.cert"), dir.join("client.key"));
        match (cert.exists(), key.exists()) {
            (true, true) => {
                let chain = certificates(&cert)?;
                let key = PrivateKey::from_pem(&read(&key)?)
                    .map_err(|e| fail(&key, &format!("not a private key in PEM: {e}")))?;
                client = Some(ClientCert::new_with_certs(&chain, key));
            }
            (false, false) => {}
            _ => {
                return Err(fail(
                    &dir,
                    "holds one of client.cert and client.key without the other",
                ));
            }
        }
    }
    Ok(Trust {
        registry: config(roots, client),
        elsewhere,
    })
}

/// Trusting `roots` (`None`: the bundled web PKI roots), presenting `client`.
fn config(roots: Option<Vec<Certificate<'static>>>, client: Option<ClientCert>) -> TlsConfig {
    let roots = match roots {
        Some(certs) => RootCerts::new_with_certs(&certs),
        None => RootCerts::WebPki,
    };
    TlsConfig::builder()
        .root_certs(roots)
        .client_cert(client)
        .build()
}

/// The system's CA certificates, if it has a bundle; `None`: use the bundled roots. An
/// `SSL_CERT_FILE` that is set must be readable: an operator who set it to narrow trust
/// never gets the whole system store instead.
fn system_roots() -> Result<Option<Vec<Certificate<'static>>>, RegistryError> {
    if let Some(path) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) {
        return certificates(Path::new(&path)).map(Some);
    }
    SYSTEM_BUNDLES
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .map(certificates)
        .transpose()
}

/// Every certificate in the PEM file `path`; none is an error.
fn certificates(path: &Path) -> Result<Vec<Certificate<'static>>, RegistryError> {
    let pem = read(path)?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(cert)) => certs.push(cert),
            Ok(_) => {}
            Err(e) => return Err(fail(path, &format!("not PEM: {e}"))),
        }
    }
    if certs.is_empty() {
        return Err(fail(path, "holds no certificate"));
    }
    Ok(certs)
}

fn read(path: &Path) -> Result<Vec<u8>, RegistryError> {
    let size = std::fs::metadata(path)
        .map_err(|e| fail(path, &e.to_string()))?
        .len();
    if size > MAX_PEM_BYTES {
        return Err(fail(
            path,
            &format!("is {size} bytes, past {MAX_PEM_BYTES}"),
        ));
    }
    std::fs::read(path).map_err(|e| fail(path, &e.to_string()))
}

fn fail(path: &Path, why: &str) -> RegistryError {
    RegistryError::new(format!("registry TLS: {}: {why}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_client_pair_or_a_file_that_is_not_pem_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("registry.example:5000");
        std::fs::create_dir(&host).unwrap();
        std::fs::write(host.join("client.cert"), b"x").unwrap();
        let err = trust("registry.example:5000", Some(dir.path())).unwrap_err();
        assert!(err.message.contains("without the other"), "{err}");
        std::fs::remove_file(host.join("client.cert")).unwrap();
        std::fs::write(host.join("ca.crt"), b"not a certificate").unwrap();
        let err = trust("registry.example:5000", Some(dir.path())).unwrap_err();
        assert!(err.message.contains("ca.crt"), "{err}");
        // Another registry's directory is not read, nor one a host would name by a path.
        trust("other.example", Some(dir.path())).unwrap();
        std::fs::write(dir.path().join("client.cert"), b"x").unwrap();
        trust("..", Some(&host)).unwrap();
        trust("registry.example:5000/..", Some(dir.path())).unwrap();
        trust(".", Some(dir.path())).unwrap();
    }
}
