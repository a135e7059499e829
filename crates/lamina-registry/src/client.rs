//! HTTP against one repository of one registry: authentication on demand, retries with
//! backoff for what a retry can fix (connection failures, 5xx, 429), one-line errors that
//! name the registry and never the credentials. Nothing a registry sends is read without
//! bound: documents stop at [`MAX_DOCUMENT_BYTES`] (or their descriptor's size), blobs at
//! their descriptor's size; resolving, connecting (with its TLS handshake) and waiting for
//! headers each get the stall timeout, a read that makes no progress for it fails, and so
//! does a body slower than [`crate::MIN_RATE`] over it. Whatever the registry or ureq says
//! reaches errors and logs through [`redact`]: queries hidden, escaped, bounded.

use std::io::{self, Read};
use std::sync::Mutex;
use std::time::Duration;

use ureq::Agent;
use ureq::http::Response;

use lamina_image::MAX_DOCUMENT_BYTES;

use crate::auth::Credentials;
use crate::blob_stream::BlobStream;
use crate::pace::{MinRate, read_failure};
use crate::{RegistryError, RegistryRef, redact};

mod range;
mod token;

pub use range::MAX_RANGE_BYTES;

/// How long a registry may send nothing (no headers, no body bytes) before a request
/// fails, unless [`PullOptions::stall_timeout`] says otherwise. A slow registry is fine;
/// one that says nothing for a minute has stalled.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How many entries of a layer's `urls` are looked at. Each one tried may cost a connect
/// timeout and a stall timeout while the layer's store lock is held, and the manifest
/// (the registry) decides how many there are; real non-distributable layers list one or
/// two.
pub const MAX_LAYER_URLS: usize = 3;

/// How a pull talks to registries.
#[derive(Debug, Clone)]
pub struct PullOptions {
    pub credentials: Option<Credentials>,
    /// Hosts (`host` or `host:port`) spoken to over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Attempts after the first, for failures a retry can fix.
    pub retries: u32,
    /// The first retry's delay; each further one doubles it.
    pub backoff: Duration,
    /// `--registry-timeout-seconds`: how long resolving a host, connecting to it (TLS
    /// handshake included), waiting for response headers, or one read of a body may take;
    /// and the window over which a body must average [`crate::MIN_RATE`].
    pub stall_timeout: Duration,
    /// Docker's and containerd's `certs.d`: per registry (`HOST[:PORT]`), CAs to trust
    /// (`*.crt`) and a client certificate (`client.cert`, `client.key`); the system's CA
    /// store is trusted for every registry ([`crate::trust`]).
    pub certs_dir: Option<std::path::PathBuf>,
    /// A Docker `config.json` to take credentials from when `credentials` is `None`
    /// ([`crate::credentials_for`]).
    pub auth_file: Option<std::path::PathBuf>,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            credentials: None,
            insecure_registries: Vec::new(),
            retries: 4,
            backoff: Duration::from_millis(250),
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            certs_dir: None,
            auth_file: None,
        }
    }
}

/// One repository of one registry.
#[derive(Debug)]
pub struct Client {
    agent: Agent,
    /// For every other host (a layer's own URLs, which the image names; a token realm on
    /// another host): the system's trust alone, no client certificate. What `certs.d`
    /// holds for this registry is presented to this registry only.
    foreign: Agent,
    base: String,
    host: String,
    repository: String,
    options: PullOptions,
    /// The `Authorization` value that worked last (Basic, or a Bearer token).
    authorization: Mutex<Option<String>>,
}

enum Attempt {
    Done(Response<ureq::Body>),
    Retry(String),
}

impl Client {
    pub fn new(reference: &RegistryRef, options: &PullOptions) -> Result<Client, RegistryError> {
        let insecure = options.insecure_registries.contains(&reference.host);
        let scheme = if insecure { "http" } else { "https" };
        let mut options = options.clone();
        if options.credentials.is_none()
            && let Some(file) = &options.auth_file
        {
            options.credentials =
                crate::credentials_for(file, &reference.host, options.stall_timeout)?;
        }
        let options = &options;
        let trust = crate::trust(&reference.host, options.certs_dir.as_deref())?;
        let agent = |tls| -> Agent {
            Agent::config_builder()
                .tls_config(tls)
                .http_status_as_error(false)
                .timeout_resolve(Some(options.stall_timeout))
                .timeout_connect(Some(options.stall_timeout))
                .timeout_recv_response(Some(options.stall_timeout))
                .timeout_per_read(Some(options.stall_timeout))
                .build()
                .into()
        };
        let foreign = agent(trust.elsewhere);
        let agent = agent(trust.registry);
        Ok(Client {
            agent,
            foreign,
            base: format!("{scheme}://{}", reference.host),
            host: reference.host.clone(),
            repository: reference.repository.clone(),
            options: options.clone(),
            authorization: Mutex::new(None),
        })
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// The credentials this client speaks with: those given, or the auth file's for its
    /// host.
    pub fn credentials(&self) -> Option<&crate::Credentials> {
        self.options.credentials.as_ref()
    }

    /// The agent for `url`: this registry's own (its `certs.d` CAs and client
    /// certificate) for a URL on it, else the one for other hosts.
    pub(crate) fn agent_for(&self, url: &str) -> &Agent {
        let on_registry = url
            .strip_prefix(&self.base)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if on_registry {
            &self.agent
        } else {
            &self.foreign
        }
    }

    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// GETs `/v2/<repo>/<path>` and reads the body whole (a document), returning it and
    /// its Content-Type. `declared` is the size its descriptor gives, when one named it;
    /// the body may not be longer, and no document may pass [`MAX_DOCUMENT_BYTES`]. A
    /// size over the limit (declared, or the response's Content-Length) is refused before
    /// a byte is read; a body that runs past it is cut off one byte later.
    pub fn document(
        &self,
        path: &str,
        accept: &str,
        declared: Option<u64>,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let limit = declared.unwrap_or(MAX_DOCUMENT_BYTES);
        if limit > MAX_DOCUMENT_BYTES {
            return Err(self.error(&format!(
                "{path}: its descriptor declares {limit} bytes, past the \
                 {MAX_DOCUMENT_BYTES}-byte limit for an image document"
            )));
        }
        let url = format!("{}/v2/{}/{path}", self.base, self.repository);
        let response = self.get(&url, accept, true, None)?;
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let too_long = |got: u64| {
            self.error(&match declared {
                Some(size) => format!(
                    "{path}: the registry sends {got} bytes, past the {size} its descriptor declares"
                ),
                None => format!(
                    "{path}: the registry sends {got} bytes, past the \
                     {MAX_DOCUMENT_BYTES}-byte limit for an image document"
                ),
            })
        };
        if let Some(length) = response.body().content_length()
            && length > limit
        {
            return Err(too_long(length));
        }
        let mut body = Vec::new();
        MinRate::new(
            response.into_body().into_reader(),
            self.options.stall_timeout,
        )
        .take(limit + 1)
        .read_to_end(&mut body)
        .map_err(|e| {
            self.error(&format!(
                "reading {path}: {}",
                read_failure(&e, self.options.stall_timeout)
            ))
        })?;
        if body.len() as u64 > limit {
            return Err(too_long(body.len() as u64));
        }
        Ok((body, content_type))
    }

    /// Opens a stream of blob `digest`, `size` bytes long by its descriptor: from `urls`
    /// first (a non-distributable layer's own locations, fetched without the registry's
    /// credentials), then the registry. Only the first [`MAX_LAYER_URLS`] entries are
    /// looked at, and only http and https ones tried, each once: the next one, and the
    /// registry, are the retry. The stream ends with an error if the body is longer or
    /// shorter than `size`, stalls or is too slow; a Content-Length other than `size`
    /// fails at once.
    pub fn open_blob(
        &self,
        digest: &str,
        size: u64,
        urls: &[String],
    ) -> io::Result<Box<dyn Read + Send>> {
        if urls.len() > MAX_LAYER_URLS {
            tracing::warn!(
                blob = digest,
                listed = urls.len(),
                tried = MAX_LAYER_URLS,
                "the layer lists more URLs than lamina tries; ignoring the rest"
            );
        }
        for url in urls.iter().take(MAX_LAYER_URLS) {
            let from = redact::url(url);
            if !is_http(url) {
                tracing::warn!(url = from, "skipping a layer URL that is not http or https");
                continue;
            }
            match self.get_once(url).and_then(|response| {
                self.blob_stream(response, digest, size, from.clone())
                    .map_err(|e| e.to_string())
            }) {
                Ok(stream) => return Ok(stream),
                Err(why) => {
                    tracing::warn!(
                        url = from,
                        why,
                        "non-distributable layer URL failed; trying the next source"
                    )
                }
            }
        }
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.repository);
        let response = self
            .get(&url, "*/*", true, None)
            .map_err(io::Error::other)?;
        self.blob_stream(response, digest, size, format!("registry {}", self.host))
    }

    /// The body of `response`, held to `size` bytes.
    fn blob_stream(
        &self,
        response: Response<ureq::Body>,
        digest: &str,
        size: u64,
        from: String,
    ) -> io::Result<Box<dyn Read + Send>> {
        if let Some(length) = response.body().content_length()
            && length != size
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "blob {digest} from {from}: the response declares {length} bytes \
                     (Content-Length), its descriptor {size}"
                ),
            ));
        }
        let inner = MinRate::new(
            response.into_body().into_reader(),
            self.options.stall_timeout,
        );
        Ok(Box::new(BlobStream::new(
            inner,
            digest,
            from,
            size,
            self.options.stall_timeout,
        )))
    }

    /// One unauthenticated GET of a URL outside the registry; an error says why it failed.
    fn get_once(&self, url: &str) -> Result<Response<ureq::Body>, String> {
        let mut unused = false;
        match self.attempt(url, "*/*", false, None, &mut unused) {
            Ok(Attempt::Done(response)) => Ok(response),
            Ok(Attempt::Retry(why)) => Err(why),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A GET that answers 2xx, after authenticating (when `authed` and challenged) and
    /// retrying what a retry can fix.
    fn get(
        &self,
        url: &str,
        accept: &str,
        authed: bool,
        range: Option<(u64, u64)>,
    ) -> Result<Response<ureq::Body>, RegistryError> {
        let mut challenged = false;
        let mut delay = self.options.backoff;
        let mut attempt = 0;
        loop {
            match self.attempt(url, accept, authed, range, &mut challenged)? {
                Attempt::Done(response) => return Ok(response),
                Attempt::Retry(why) if attempt < self.options.retries => {
                    tracing::warn!(
                        url = redact::url(url),
                        attempt = attempt + 1,
                        why,
                        delay_ms = delay.as_millis() as u64,
                        "retrying registry request"
                    );
                    std::thread::sleep(delay);
                    delay *= 2;
                    attempt += 1;
                }
                Attempt::Retry(why) => {
                    return Err(
                        self.error(&format!("{why} (gave up after {} attempts)", attempt + 1))
                    );
                }
            }
        }
    }

    fn attempt(
        &self,
        url: &str,
        accept: &str,
        authed: bool,
        range: Option<(u64, u64)>,
        challenged: &mut bool,
    ) -> Result<Attempt, RegistryError> {
        let mut request = self.agent_for(url).get(url).header("Accept", accept);
        if let Some((first, last)) = range {
            request = request.header("Range", &format!("bytes={first}-{last}"));
        }
        if authed && let Some(value) = self.current_authorization() {
            request = request.header("Authorization", &value);
        }
        let response = match request.call() {
            Ok(response) => response,
            Err(e) if url.starts_with("https:") && is_tls_failure(&e) => {
                // A retry cannot fix a handshake; most often the registry speaks plain HTTP.
                return Err(self.error(&format!(
                    "GET {}: TLS failed: {} (a plain-HTTP registry? pass --insecure-registry {})",
                    redact::url(url),
                    redact::text(&e.to_string()),
                    self.host
                )));
            }
            Err(e) => {
                return Ok(Attempt::Retry(format!(
                    "GET {}: {}",
                    redact::url(url),
                    self.transport_failure(&e)
                )));
            }
        };
        let status = response.status().as_u16();
        match status {
            200..=299 => Ok(Attempt::Done(response)),
            401 if authed && !*challenged => {
                *challenged = true;
                let header = response
                    .headers()
                    .get("www-authenticate")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                self.authenticate(&header)?;
                // Authenticated: go again at once, without counting a retry.
                self.attempt(url, accept, authed, range, challenged)
            }
            401 | 403 => Err(self.error(&if self.options.credentials.is_some() {
                format!(
                    "access to {} denied: the credentials were refused",
                    redact::url(url)
                )
            } else {
                format!(
                    "access to {} denied: the registry wants credentials (--username/--password)",
                    redact::url(url)
                )
            })),
            404 => Err(self.error(&format!("{} not found", redact::url(url)))),
            429 | 500..=599 => Ok(Attempt::Retry(format!(
                "GET {}: HTTP {status}",
                redact::url(url)
            ))),
            _ => Err(self.error(&format!("GET {}: HTTP {status}", redact::url(url)))),
        }
    }

    fn current_authorization(&self) -> Option<String> {
        self.authorization.lock().ok().and_then(|a| a.clone())
    }

    /// A request that got no response, in words: our timeouts by name, anything else as
    /// ureq says it, queries hidden.
    fn transport_failure(&self, e: &ureq::Error) -> String {
        let secs = self.options.stall_timeout.as_secs_f64();
        match e {
            ureq::Error::Timeout(ureq::Timeout::Connect) => {
                format!("no connection within {secs} s (--registry-timeout-seconds)")
            }
            ureq::Error::Timeout(ureq::Timeout::Resolve) => {
                format!("the host did not resolve within {secs} s (--registry-timeout-seconds)")
            }
            _ => redact::text(&e.to_string()),
        }
    }

    fn error(&self, what: &str) -> RegistryError {
        RegistryError::new(format!(
            "registry {} ({}): {what}",
            self.host, self.repository
        ))
    }
}

/// Whether a transport error is the TLS handshake failing (wrong protocol, certificate).
fn is_tls_failure(e: &ureq::Error) -> bool {
    if matches!(e, ureq::Error::Tls(_)) {
        return true;
    }
    let text = e.to_string().to_ascii_lowercase();
    ["tls", "certificate", "corrupt message", "handshake"]
        .iter()
        .any(|w| text.contains(w))
}

/// Whether `url` is one ureq should be asked for: http or https, nothing else.
fn is_http(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `certs.d` holds for a registry (its client certificate) goes to that registry
    /// only: a layer's own URL on another host, or one dressed up with the registry's name
    /// as userinfo, gets the other agent.
    #[test]
    fn only_urls_on_the_registry_get_its_agent() {
        let reference = RegistryRef::parse("docker://127.0.0.1:5000/app:v1")
            .unwrap()
            .unwrap();
        let client = Client::new(&reference, &PullOptions::default()).unwrap();
        let own = |url: &str| std::ptr::eq(client.agent_for(url), &client.agent);
        assert!(own("https://127.0.0.1:5000/v2/app/blobs/sha256:00"));
        assert!(own("https://127.0.0.1:5000"));
        assert!(!own("https://127.0.0.1:50001/v2/"));
        assert!(!own("https://127.0.0.1:5000@evil.example/blob"));
        assert!(!own("https://cdn.example/blob"));
        assert!(!own("http://127.0.0.1:5000/v2/"));
    }
}
