//! HTTP against one repository of one registry: authentication on demand, retries with
//! backoff for what a retry can fix (connection failures, 5xx, 429), one-line errors that
//! name the registry and never the credentials. Nothing a registry sends is read without
//! bound: documents stop at [`MAX_DOCUMENT_BYTES`] (or their descriptor's size), blobs at
//! their descriptor's size, and a read that makes no progress for the stall timeout fails.

use std::io::{self, Read};
use std::sync::Mutex;
use std::time::Duration;

use ureq::Agent;
use ureq::http::Response;

use lamina_image::MAX_DOCUMENT_BYTES;

use crate::auth::{Challenge, Credentials};
use crate::blob_stream::{BlobStream, is_timeout};
use crate::{RegistryError, RegistryRef};

/// How long a registry may send nothing (no headers, no body bytes) before a request
/// fails, unless [`PullOptions::stall_timeout`] says otherwise. A slow registry is fine;
/// one that says nothing for a minute has stalled.
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(60);

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
    /// How long one read (response headers, or the next bytes of a body) may make no
    /// progress before it fails: `--registry-timeout-seconds`.
    pub stall_timeout: Duration,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            credentials: None,
            insecure_registries: Vec::new(),
            retries: 4,
            backoff: Duration::from_millis(250),
            stall_timeout: DEFAULT_STALL_TIMEOUT,
        }
    }
}

/// One repository of one registry.
#[derive(Debug)]
pub struct Client {
    agent: Agent,
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
    pub fn new(reference: &RegistryRef, options: &PullOptions) -> Client {
        let insecure = options.insecure_registries.contains(&reference.host);
        let scheme = if insecure { "http" } else { "https" };
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(options.stall_timeout))
            .timeout_per_read(Some(options.stall_timeout))
            .build()
            .into();
        Client {
            agent,
            base: format!("{scheme}://{}", reference.host),
            host: reference.host.clone(),
            repository: reference.repository.clone(),
            options: options.clone(),
            authorization: Mutex::new(None),
        }
    }

    pub fn host(&self) -> &str {
        &self.host
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
        let response = self.get(&url, accept, true)?;
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
        response
            .into_body()
            .into_reader()
            .take(limit + 1)
            .read_to_end(&mut body)
            .map_err(|e| {
                self.error(&if is_timeout(&e) {
                    format!(
                        "reading {path}: no data for {} s: the registry stalled \
                         (--registry-timeout-seconds)",
                        self.options.stall_timeout.as_secs_f64()
                    )
                } else {
                    format!("reading {path}: {e}")
                })
            })?;
        if body.len() as u64 > limit {
            return Err(too_long(body.len() as u64));
        }
        Ok((body, content_type))
    }

    /// Opens a stream of blob `digest`, `size` bytes long by its descriptor: from `urls`
    /// first (a non-distributable layer's own locations, fetched without the registry's
    /// credentials), then the registry. Each URL is tried once: the next one, and the
    /// registry, are the retry. The stream ends with an error if the body is longer or
    /// shorter than `size`, or stalls; a Content-Length other than `size` fails at once.
    pub fn open_blob(
        &self,
        digest: &str,
        size: u64,
        urls: &[String],
    ) -> io::Result<Box<dyn Read + Send>> {
        for url in urls {
            let from = shown(url).to_string();
            match self.get_once(url).and_then(|response| {
                self.blob_stream(response, digest, size, from)
                    .map_err(|e| e.to_string())
            }) {
                Ok(stream) => return Ok(stream),
                Err(why) => {
                    tracing::warn!(
                        url = shown(url),
                        why,
                        "non-distributable layer URL failed; trying the next source"
                    )
                }
            }
        }
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, self.repository);
        let response = self.get(&url, "*/*", true).map_err(io::Error::other)?;
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
        let inner = response.into_body().into_reader();
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
        match self.attempt(url, "*/*", false, &mut unused) {
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
    ) -> Result<Response<ureq::Body>, RegistryError> {
        let mut challenged = false;
        let mut delay = self.options.backoff;
        let mut attempt = 0;
        loop {
            match self.attempt(url, accept, authed, &mut challenged)? {
                Attempt::Done(response) => return Ok(response),
                Attempt::Retry(why) if attempt < self.options.retries => {
                    tracing::warn!(
                        url,
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
        challenged: &mut bool,
    ) -> Result<Attempt, RegistryError> {
        let mut request = self.agent.get(url).header("Accept", accept);
        if authed && let Some(value) = self.current_authorization() {
            request = request.header("Authorization", &value);
        }
        let response = match request.call() {
            Ok(response) => response,
            Err(e) if url.starts_with("https:") && is_tls_failure(&e) => {
                // A retry cannot fix a handshake; most often the registry speaks plain HTTP.
                return Err(self.error(&format!(
                    "GET {}: TLS failed: {e} (a plain-HTTP registry? pass --insecure-registry {})",
                    shown(url),
                    self.host
                )));
            }
            Err(e) => return Ok(Attempt::Retry(format!("GET {}: {e}", shown(url)))),
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
                self.attempt(url, accept, authed, challenged)
            }
            401 | 403 => Err(self.error(&if self.options.credentials.is_some() {
                format!(
                    "access to {} denied: the credentials were refused",
                    shown(url)
                )
            } else {
                format!(
                    "access to {} denied: the registry wants credentials (--username/--password)",
                    shown(url)
                )
            })),
            404 => Err(self.error(&format!("{} not found", shown(url)))),
            429 | 500..=599 => Ok(Attempt::Retry(format!("GET {}: HTTP {status}", shown(url)))),
            _ => Err(self.error(&format!("GET {}: HTTP {status}", shown(url)))),
        }
    }

    fn current_authorization(&self) -> Option<String> {
        self.authorization.lock().ok().and_then(|a| a.clone())
    }

    /// Answers a challenge: Basic takes the credentials as they are; Bearer trades them
    /// (or nothing, for anonymous pulls) for a token at the realm.
    fn authenticate(&self, header: &str) -> Result<(), RegistryError> {
        let value = match Challenge::parse(header) {
            Some(Challenge::Basic) => {
                let creds = self.options.credentials.as_ref().ok_or_else(|| {
                    self.error("the registry wants credentials (--username/--password)")
                })?;
                creds.basic_header()
            }
            Some(Challenge::Bearer {
                realm,
                service,
                scope,
            }) => {
                let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                let mut url = format!("{realm}?scope={}", encode(&scope));
                if let Some(service) = service {
                    url.push_str(&format!("&service={}", encode(&service)));
                }
                format!("Bearer {}", self.token(&url)?)
            }
            None => {
                return Err(self.error(&format!(
                    "the registry asks for authentication lamina does not speak: `{header}`"
                )));
            }
        };
        if let Ok(mut slot) = self.authorization.lock() {
            *slot = Some(value);
        }
        Ok(())
    }

    fn token(&self, url: &str) -> Result<String, RegistryError> {
        let mut request = self.agent.get(url);
        if let Some(creds) = &self.options.credentials {
            request = request.header("Authorization", &creds.basic_header());
        }
        let response = request
            .call()
            .map_err(|e| self.error(&format!("token request to {}: {e}", shown(url))))?;
        let status = response.status().as_u16();
        if status == 401 || status == 403 {
            return Err(self.error(if self.options.credentials.is_some() {
                "the token service refused the credentials"
            } else {
                "the token service wants credentials (--username/--password)"
            }));
        }
        if !(200..300).contains(&status) {
            return Err(self.error(&format!("token request to {}: HTTP {status}", shown(url))));
        }
        let body = response
            .into_body()
            .with_config()
            .limit(MAX_DOCUMENT_BYTES)
            .read_to_vec()
            .map_err(|e| self.error(&format!("reading token: {e}")))?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let parsed: Token = serde_json::from_slice(&body)
            .map_err(|e| self.error(&format!("token response is not valid: {e}")))?;
        parsed
            .token
            .or(parsed.access_token)
            .ok_or_else(|| self.error("token response holds no token"))
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

/// A URL for messages: without any query (tokens and signed storage URLs live there).
fn shown(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
