//! A Bearer token service for the test registry, speaking the distribution token
//! protocol: a client sent to `GET /token?service=…&scope=repository:NAME:ACTIONS` with
//! Basic credentials gets a JWT (RS256, its certificate in `x5c`) granting those actions
//! on that repository. Wrong or missing credentials get 401. The key and the self-signed
//! certificate the registry trusts are made with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

use crate::http::{HttpServer, Request, Response};

/// The `service` the registry names in its challenge (the token's audience).
pub const SERVICE: &str = "lamina-test-registry";
/// The token's issuer, which the registry is configured to trust.
pub const ISSUER: &str = "lamina-test-token-service";

#[derive(Debug)]
pub struct TokenService {
    pub server: HttpServer,
    /// PEM certificate the registry verifies tokens with.
    pub certificate: PathBuf,
}

/// Makes a key and certificate under `dir` and serves tokens to holders of `creds`.
pub fn start(dir: &Path, creds: (&str, &str)) -> TokenService {
    let key = dir.join("token-key.pem");
    let certificate = dir.join("token-cert.pem");
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=lamina-test-token-service", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&certificate)
        .output()
        .expect("openssl (apt package openssl)");
    assert!(out.status.success(), "openssl req: {out:?}");
    let der = Command::new("openssl")
        .args(["x509", "-outform", "DER", "-in"])
        .arg(&certificate)
        .output()
        .expect("openssl x509");
    assert!(der.status.success(), "openssl x509: {der:?}");
    let x5c = STANDARD.encode(&der.stdout);
    let expected = format!(
        "Basic {}",
        STANDARD.encode(format!("{}:{}", creds.0, creds.1))
    );
    let server = HttpServer::start(move |request: &Request| {
        if request.path != "/token" {
            return Response::status(404);
        }
        if request.header("authorization") != Some(expected.as_str()) {
            return Response::status(401);
        }
        let token = sign(&key, &x5c, &claims(request));
        let body = serde_json::json!({ "token": token, "expires_in": 3600 }).to_string();
        Response::ok("application/json", body.into_bytes())
    });
    TokenService {
        server,
        certificate,
    }
}

/// The claims for what `request` asked: each `scope` granted as asked.
fn claims(request: &Request) -> serde_json::Value {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let access: Vec<serde_json::Value> = request
        .params("scope")
        .iter()
        .filter_map(|scope| {
            let mut parts = scope.rsplitn(2, ':');
            let actions = parts.next()?;
            let (kind, name) = parts.next()?.split_once(':')?;
            Some(serde_json::json!({
                "type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>(),
            }))
        })
        .collect();
    serde_json::json!({
        "iss": ISSUER, "sub": "lamina-test", "aud": SERVICE,
        "exp": now + 3600, "nbf": now - 60, "iat": now, "jti": format!("{now}"),
        "access": access,
    })
}

/// A compact JWS: RS256 over `header.claims`, signed by `key` with `openssl dgst`.
fn sign(key: &Path, x5c: &str, claims: &serde_json::Value) -> String {
    let header = serde_json::json!({ "typ": "JWT", "alg": "RS256", "x5c": [x5c] });
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl dgst");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("writing to openssl");
    let out = child.wait_with_output().expect("openssl dgst");
    assert!(out.status.success(), "openssl dgst: {out:?}");
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(out.stdout))
}
