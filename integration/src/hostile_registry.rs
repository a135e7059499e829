//! A registry that lies about a few things: it serves an image's manifest and blobs over
//! the OCI distribution API (`/v2/`, plain HTTP on 127.0.0.1), honestly except for the
//! paths it is told to fault, whose bodies it sends endlessly, stops sending, drips, or
//! redirects to a malformed `Location`. It can also ask for Bearer tokens from a realm it
//! serves itself (`/token`), which can be faulted like any path. Real registries
//! (docker-registry) can do none of this on demand; a broken or hostile one, or a proxy in
//! between, does all of it.
//!
//! It stops by itself: every connection ends after [`MAX_HOLD`] or [`MAX_ENDLESS_BYTES`],
//! and dropping the server ends them all at once.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lamina_sample::BuiltImage;

use crate::http::read_request;

/// The longest any connection stays open, whatever it is doing.
pub const MAX_HOLD: Duration = Duration::from_secs(60);

/// The most an endless body sends before the server gives up on it.
pub const MAX_ENDLESS_BYTES: u64 = 4 << 30;

/// What the faulty path's body does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Misbehaviour {
    /// The honest bytes, then zeros without end (chunked, so no length is promised).
    Endless,
    /// Promises the honest length, sends this many bytes, then nothing (the connection
    /// stays open).
    StallAfter(usize),
    /// Promises the honest length and sends it one byte per interval: never silent for
    /// long, never done.
    Drip(Duration),
    /// `307` to this `Location`, whatever it is.
    RedirectTo(&'static str),
}

/// The token the Bearer mode's realm hands out and its `/v2/` paths want.
pub const TOKEN: &str = "hostile-token";

/// The path of the Bearer mode's token realm, for [`HostileRegistry::start_with`].
pub const TOKEN_PATH: &str = "/token";

#[derive(Debug)]
pub struct HostileRegistry {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    repository: String,
    tag: String,
    image: BuiltImage,
    /// Paths below `/v2/<repo>/` (`blobs/sha256:…`, `manifests/<tag>`), or
    /// [`TOKEN_PATH`], and what each does.
    faults: Vec<(String, Misbehaviour)>,
    /// Whether `/v2/` wants a Bearer token from `/token`.
    bearer: bool,
    /// The realm's honest answer: [`TOKEN`], padded so a drip of it lasts.
    token_body: Vec<u8>,
    stop: AtomicBool,
    /// Requests for faulty paths so far.
    faulty_requests: AtomicUsize,
    /// Body bytes sent for faulty paths, over every request.
    faulty_bytes: AtomicU64,
    paths: Mutex<Vec<String>>,
}

impl HostileRegistry {
    /// Serves `image` as `repository:tag`; `faulty` (a path below `/v2/<repository>/`)
    /// misbehaves as `how`.
    pub fn start(
        repository: &str,
        tag: &str,
        image: &BuiltImage,
        faulty: &str,
        how: Misbehaviour,
    ) -> HostileRegistry {
        Self::start_with(repository, tag, image, &[(faulty, how)], false)
    }

    /// Serves `image` as `repository:tag` with every one of `faults`; with `bearer`, every
    /// `/v2/` path wants a token from the realm at [`TOKEN_PATH`].
    pub fn start_with(
        repository: &str,
        tag: &str,
        image: &BuiltImage,
        faults: &[(&str, Misbehaviour)],
        bearer: bool,
    ) -> HostileRegistry {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the hostile registry");
        let addr = listener.local_addr().expect("its address").to_string();
        let mut token_body = format!(r#"{{"token":"{TOKEN}"}}"#).into_bytes();
        token_body.resize(token_body.len() + 4096, b' ');
        let state = Arc::new(State {
            repository: repository.to_string(),
            tag: tag.to_string(),
            image: image.clone(),
            faults: faults
                .iter()
                .map(|(path, how)| (path.to_string(), *how))
                .collect(),
            bearer,
            token_body,
            stop: AtomicBool::new(false),
            faulty_requests: AtomicUsize::new(0),
            faulty_bytes: AtomicU64::new(0),
            paths: Mutex::new(Vec::new()),
        });
        let serving = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if serving.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let state = serving.clone();
                let addr = addr_of(&stream);
                std::thread::spawn(move || serve(stream, &state, &addr));
            }
        });
        HostileRegistry { addr, state }
    }

    /// `docker://127.0.0.1:PORT/<repository>:<tag>`.
    pub fn reference(&self) -> String {
        format!(
            "docker://{}/{}:{}",
            self.addr, self.state.repository, self.state.tag
        )
    }

    /// How many times the faulty path was asked for.
    pub fn faulty_requests(&self) -> usize {
        self.state.faulty_requests.load(Ordering::SeqCst)
    }

    /// Body bytes the faulty path got out before its client stopped reading.
    pub fn faulty_bytes(&self) -> u64 {
        self.state.faulty_bytes.load(Ordering::SeqCst)
    }

    /// Every path asked for, in order.
    pub fn paths(&self) -> Vec<String> {
        self.state.paths.lock().expect("paths").clone()
    }
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// This server's own `127.0.0.1:PORT`, as the client reached it.
fn addr_of(stream: &TcpStream) -> String {
    stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default()
}

fn serve(mut stream: TcpStream, state: &State, addr: &str) {
    let Some(request) = read_request(&stream) else {
        return;
    };
    state
        .paths
        .lock()
        .expect("paths")
        .push(request.path.clone());
    let prefix = format!("/v2/{}/", state.repository);
    let wanted = format!("Bearer {TOKEN}");
    if state.bearer
        && request.path.starts_with("/v2/")
        && request.header("authorization") != Some(wanted.as_str())
    {
        let challenge = format!(
            "WWW-Authenticate: Bearer realm=\"http://{addr}{TOKEN_PATH}\",service=\"hostile\"\r\n"
        );
        let _ = stream.write_all(&head_with(401, "text/plain", Some(0), &challenge));
        return;
    }
    let (path, found) = if request.path == TOKEN_PATH && state.bearer {
        let token: &[u8] = &state.token_body;
        (TOKEN_PATH, Some(("application/json", token)))
    } else if let Some(path) = request.path.strip_prefix(&prefix) {
        (path, lookup(state, path))
    } else {
        let body: &[u8] = if request.path == "/v2/" { b"{}" } else { b"" };
        let status = if request.path == "/v2/" { 200 } else { 404 };
        let _ = stream.write_all(&head(status, "application/json", Some(body.len())));
        let _ = stream.write_all(body);
        return;
    };
    let Some((content_type, bytes)) = found else {
        let _ = stream.write_all(&head(404, "text/plain", Some(0)));
        return;
    };
    let Some(how) = state
        .faults
        .iter()
        .find(|(faulty, _)| faulty == path)
        .map(|(_, how)| *how)
    else {
        let _ = stream.write_all(&head(200, content_type, Some(bytes.len())));
        let _ = stream.write_all(bytes);
        return;
    };
    state.faulty_requests.fetch_add(1, Ordering::SeqCst);
    let deadline = Instant::now() + MAX_HOLD;
    let going = || Instant::now() < deadline && !state.stop.load(Ordering::SeqCst);
    match how {
        Misbehaviour::Endless => endless(&mut stream, state, content_type, bytes, deadline),
        Misbehaviour::StallAfter(n) => {
            let _ = stream.write_all(&head(200, content_type, Some(bytes.len())));
            if stream.write_all(&bytes[..n.min(bytes.len())]).is_ok() {
                state
                    .faulty_bytes
                    .fetch_add(n.min(bytes.len()) as u64, Ordering::SeqCst);
            }
            let _ = stream.flush();
            while going() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Misbehaviour::Drip(every) => {
            let _ = stream.write_all(&head(200, content_type, Some(bytes.len())));
            for byte in bytes {
                let next = Instant::now() + every;
                while going() && Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(50));
                }
                if !going() || stream.write_all(&[*byte]).is_err() {
                    return; // the client hung up: what the test wants
                }
                state.faulty_bytes.fetch_add(1, Ordering::SeqCst);
            }
        }
        Misbehaviour::RedirectTo(location) => {
            let location = format!("Location: {location}\r\n");
            let _ = stream.write_all(&head_with(307, "text/plain", Some(0), &location));
        }
    }
}

/// The honest bytes, then zeros, as HTTP chunks, until the client hangs up or a bound.
fn endless(
    stream: &mut TcpStream,
    state: &State,
    content_type: &str,
    honest: &[u8],
    deadline: Instant,
) {
    if stream.write_all(&head(200, content_type, None)).is_err() {
        return;
    }
    let zeros = vec![0u8; 64 * 1024];
    let mut chunk: &[u8] = honest;
    loop {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(chunk);
        framed.extend_from_slice(b"\r\n");
        if stream.write_all(&framed).is_err() {
            return; // the client stopped reading: what the test wants
        }
        let sent = state
            .faulty_bytes
            .fetch_add(chunk.len() as u64, Ordering::SeqCst);
        if sent > MAX_ENDLESS_BYTES
            || Instant::now() > deadline
            || state.stop.load(Ordering::SeqCst)
        {
            return;
        }
        chunk = &zeros;
    }
}

/// The document or blob at `path` below the repository, with its media type.
fn lookup<'a>(state: &'a State, path: &str) -> Option<(&'static str, &'a [u8])> {
    let image = &state.image;
    if let Some(reference) = path.strip_prefix("manifests/") {
        let manifest = image.blobs.get(&image.manifest.digest)?;
        let matches =
            reference == state.tag || reference == image.manifest.digest.to_string().as_str();
        return matches.then_some(("application/vnd.oci.image.manifest.v1+json", &manifest[..]));
    }
    let digest = path.strip_prefix("blobs/")?;
    image
        .blobs
        .iter()
        .find(|(d, _)| d.to_string() == digest)
        .map(|(_, bytes)| ("application/octet-stream", &bytes[..]))
}

/// A response head: with a Content-Length, or chunked when `length` is `None`.
fn head(status: u16, content_type: &str, length: Option<usize>) -> Vec<u8> {
    head_with(status, content_type, length, "")
}

/// [`head`] with `extra` header lines (each ending `\r\n`).
fn head_with(status: u16, content_type: &str, length: Option<usize>, extra: &str) -> Vec<u8> {
    let framing = match length {
        Some(n) => format!("Content-Length: {n}"),
        None => "Transfer-Encoding: chunked".to_string(),
    };
    format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n{framing}\r\n{extra}Connection: close\r\n\r\n"
    )
    .into_bytes()
}

/// A port on 127.0.0.1 that never completes a connection, as a firewalled registry port
/// behaves: a listener that never accepts, its queue filled, so the kernel drops further
/// SYNs and a client's connect waits out its own timeout. Dropping it closes everything.
#[derive(Debug)]
pub struct Blackhole {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    _listener: TcpListener,
    _queued: Vec<TcpStream>,
}

impl Blackhole {
    pub fn start() -> Blackhole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the blackhole");
        let addr = listener.local_addr().expect("its address");
        let mut queued = Vec::new();
        // std listens with a backlog of 128; the kernel takes one more than that.
        for _ in 0..4096 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(250)) {
                Ok(stream) => queued.push(stream),
                Err(_) => {
                    return Blackhole {
                        addr: addr.to_string(),
                        _listener: listener,
                        _queued: queued,
                    };
                }
            }
        }
        panic!("the blackhole's queue never filled");
    }
}
