//! Answering a registry's `401`: Basic sends the credentials as they are; Bearer trades
//! them (or nothing) for a token at the realm the challenge names. The realm is the
//! registry's choice, so it is checked before any credentials go there, and its answer is
//! read under the same bounds as any document.

use std::io::Read;

use lamina_image::MAX_DOCUMENT_BYTES;

use super::Client;
use crate::auth::{Challenge, plain_http_host};
use crate::pace::{MinRate, read_failure};
use crate::{RegistryError, redact};

impl Client {
    /// Answers a challenge: Basic takes the credentials as they are; Bearer trades them
    /// (or nothing, for anonymous pulls) for a token at the realm.
    pub(super) fn authenticate(&self, header: &str) -> Result<(), RegistryError> {
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
                self.check_realm(&realm)?;
                let scope = scope.unwrap_or_else(|| format!("repository:{}:pull", self.repository));
                let mut url = format!("{realm}?scope={}", encode(&scope));
                if let Some(service) = service {
                    url.push_str(&format!("&service={}", encode(&service)));
                }
                format!("Bearer {}", self.token(&url)?)
            }
            None => {
                return Err(self.error(&format!(
                    "the registry asks for authentication lamina does not speak: `{}`",
                    redact::text(header)
                )));
            }
        };
        if let Ok(mut slot) = self.authorization.lock() {
            *slot = Some(value);
        }
        Ok(())
    }

    fn token(&self, url: &str) -> Result<String, RegistryError> {
        let mut request = self.agent_for(url).get(url);
        if let Some(creds) = &self.options.credentials {
            request = request.header("Authorization", &creds.basic_header());
        }
        let response = request.call().map_err(|e| {
            self.error(&format!(
                "token request to {}: {}",
                redact::url(url),
                self.transport_failure(&e)
            ))
        })?;
        let status = response.status().as_u16();
        if status == 401 || status == 403 {
            return Err(self.error(if self.options.credentials.is_some() {
                "the token service refused the credentials"
            } else {
                "the token service wants credentials (--username/--password)"
            }));
        }
        if !(200..300).contains(&status) {
            return Err(self.error(&format!(
                "token request to {}: HTTP {status}",
                redact::url(url)
            )));
        }
        let mut body = Vec::new();
        MinRate::new(
            response.into_body().into_reader(),
            self.options.stall_timeout,
        )
        .take(MAX_DOCUMENT_BYTES + 1)
        .read_to_end(&mut body)
        .map_err(|e| {
            self.error(&format!(
                "reading the token from {}: {}",
                redact::url(url),
                read_failure(&e, self.options.stall_timeout)
            ))
        })?;
        if body.len() as u64 > MAX_DOCUMENT_BYTES {
            return Err(self.error(&format!(
                "token response from {}: past the {MAX_DOCUMENT_BYTES}-byte limit",
                redact::url(url)
            )));
        }
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let parsed: Token = serde_json::from_slice(&body).map_err(|e| {
            self.error(&format!(
                "token response is not valid: {}",
                redact::text(&e.to_string())
            ))
        })?;
        parsed
            .token
            .or(parsed.access_token)
            .ok_or_else(|| self.error("token response holds no token"))
    }

    /// Refuses to send Basic credentials to a plain-HTTP token realm when the registry is
    /// spoken to over HTTPS: the realm is the registry's to name, and the password would
    /// cross the network in the clear. `--insecure-registry` for the realm's host says
    /// plain HTTP is meant there. Anonymous token requests carry no secret and go ahead.
    fn check_realm(&self, realm: &str) -> Result<(), RegistryError> {
        let Some(realm_host) = plain_http_host(realm) else {
            return Ok(());
        };
        let insecure = |h: &String| h.eq_ignore_ascii_case(realm_host);
        if self.options.credentials.is_none()
            || !self.base.starts_with("https:")
            || self.options.insecure_registries.iter().any(insecure)
        {
            return Ok(());
        }
        Err(self.error(&format!(
            "refusing to send credentials to token realm {} over plain HTTP from an HTTPS \
             registry (pass --insecure-registry {} if that is meant)",
            redact::url(realm),
            lamina_image::shown(realm_host)
        )))
    }
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

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    use super::*;
    use crate::RegistryRef;
    use crate::auth::Credentials;
    use crate::client::PullOptions;
    use std::io;
    use std::time::Duration;

    fn client(insecure: &[&str]) -> Client {
        let reference = RegistryRef::parse("docker://registry.example/team/app:v1")
            .unwrap()
            .unwrap();
        let options = PullOptions {
            credentials: Some(Credentials {
                username: "alice".into(),
                password: "s3cret".into(),
            }),
            insecure_registries: insecure.iter().map(|h| h.to_string()).collect(),
            stall_timeout: Duration::from_secs(5),
            ..PullOptions::default()
        };
        Client::new(&reference, &options).unwrap()
    }

    /// A token realm on 127.0.0.1 that answers at most one request, within a few seconds,
    /// with token `t0k`; the thread returns the request's head, if one came.
    fn realm() -> (String, std::thread::JoinHandle<Option<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let serving = std::thread::spawn(move || {
            for _ in 0..100 {
                let Ok((stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                stream.set_nonblocking(false).unwrap();
                let mut head = String::new();
                let mut reader = BufReader::new(&stream);
                while reader.read_line(&mut head).unwrap_or(0) > 2 {}
                let body = r#"{"token":"t0k"}"#;
                let _ = (&stream).write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
                return Some(head);
            }
            None
        });
        (addr, serving)
    }

    /// An HTTPS registry's challenge naming an `http://` realm: credentials go there only
    /// when the realm's host is given as insecure.
    #[test]
    fn credentials_go_to_a_plain_http_realm_only_when_it_is_named_insecure() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let challenge = format!(r#"Bearer realm="http://{addr}/token?x=SECRET",service="s""#);
        let err = client(&[]).authenticate(&challenge).unwrap_err().message;
        assert!(
            err.contains(&format!(
                "refusing to send credentials to token realm http://{addr}/token?… over plain HTTP"
            )),
            "{err}"
        );
        assert!(!err.contains("SECRET"), "{err}");
        let asked = listener.accept();
        assert!(
            asked
                .as_ref()
                .is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock),
            "the realm was connected to: {asked:?}"
        );

        // Named insecure: asked, with the credentials.
        let (addr, serving) = realm();
        let client = client(&[&addr]);
        let challenge = format!(r#"Bearer realm="http://{addr}/token",service="s""#);
        client.authenticate(&challenge).unwrap();
        assert_eq!(
            client.current_authorization().as_deref(),
            Some("Bearer t0k")
        );
        let head = serving.join().unwrap().expect("the realm was asked");
        assert!(head.contains("Basic YWxpY2U6czNjcmV0"), "{head}");
    }
}
