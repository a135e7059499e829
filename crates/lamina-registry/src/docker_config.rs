//! Credentials where operators keep them: a Docker `config.json` — `auths` (base64
//! `user:password`, or `username`/`password`), and credential helpers (`credHelpers` per
//! registry, else `credsStore`) run as `docker-credential-NAME get` with the registry on
//! stdin, as Docker runs them. Flags (`--username`/`--password`) win over the file.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::Value;

use crate::{Credentials, RegistryError};

/// No config.json an operator keeps is this large; a larger one is refused unread.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// What a helper may print.
const MAX_HELPER_OUTPUT: u64 = 64 << 10;

/// The credentials `file` holds for `host` (`host` or `host:port`), if any; a helper gets
/// `timeout` to answer. A missing file holds none.
pub fn credentials_for(
    file: &Path,
    host: &str,
    timeout: Duration,
) -> Result<Option<Credentials>, RegistryError> {
    let fail = |why: String| RegistryError::new(format!("{}: {why}", file.display()));
    let bytes = match std::fs::File::open(file) {
        Ok(f) => {
            let mut bytes = Vec::new();
            f.take(MAX_CONFIG_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| fail(e.to_string()))?;
            if bytes.len() as u64 > MAX_CONFIG_BYTES {
                return Err(fail(format!("past {MAX_CONFIG_BYTES} bytes")));
            }
            bytes
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    let config: Value =
        serde_json::from_slice(&bytes).map_err(|e| fail(format!("not JSON: {e}")))?;
    let names = names_of(host);
    let keyed = |section: &str| -> Option<(String, Value)> {
        config[section].as_object().and_then(|entries| {
            entries
                .iter()
                .find(|(key, _)| names.contains(&normalized(key)))
                .map(|(key, value)| (key.clone(), value.clone()))
        })
    };
    let helper = keyed("credHelpers")
        .and_then(|(_, name)| name.as_str().map(str::to_string))
        .or_else(|| config["credsStore"].as_str().map(str::to_string));
    if let Some(helper) = helper.filter(|h| !h.is_empty()) {
        return from_helper(&helper, host, timeout);
    }
    let Some((key, entry)) = keyed("auths") else {
        return Ok(None);
    };
    let pair = match entry["auth"].as_str().filter(|a| !a.is_empty()) {
        Some(encoded) => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|_| fail(format!("auths.{key}.auth is not base64")))?;
            let text = String::from_utf8(decoded)
                .map_err(|_| fail(format!("auths.{key}.auth is not text")))?;
            let (user, pass) = text
                .split_once(':')
                .ok_or_else(|| fail(format!("auths.{key}.auth is not user:password")))?;
            (user.to_string(), pass.to_string())
        }
        None => match (entry["username"].as_str(), entry["password"].as_str()) {
            (Some(user), Some(pass)) => (user.to_string(), pass.to_string()),
            _ => return Ok(None),
        },
    };
    Ok(Some(Credentials {
        username: pair.0,
        password: pair.1,
    }))
}

/// The keys a config may file `host` under: itself, and Docker Hub's legacy name.
fn names_of(host: &str) -> Vec<String> {
    let mut names = vec![host.to_string()];
    if ["registry-1.docker.io", "docker.io", "index.docker.io"].contains(&host) {
        names.extend(["index.docker.io".to_string(), "docker.io".into()]);
    }
    names
}

/// A config key as a host: `https://host/v1/` and `host` name the same registry.
fn normalized(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// `docker-credential-NAME get`, told `host` on stdin, within `timeout`. "Not found"
/// (a failing helper) is no credentials; a helper that does not answer in time is
/// killed and fails the pull, naming it.
fn from_helper(
    name: &str,
    host: &str,
    timeout: Duration,
) -> Result<Option<Credentials>, RegistryError> {
    let program = format!("docker-credential-{name}");
    let fail = |why: String| RegistryError::new(format!("credential helper {program}: {why}"));
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(fail("its name is not a plain word".into()));
    }
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(host.as_bytes());
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| fail(e.to_string()))? {
            Some(status) => break status,
            None if started.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!("did not answer within {timeout:?}")));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    if !status.success() {
        return Ok(None);
    }
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        stdout
            .take(MAX_HELPER_OUTPUT)
            .read_to_end(&mut out)
            .map_err(|e| fail(e.to_string()))?;
    }
    let answer: Value =
        serde_json::from_slice(&out).map_err(|_| fail("its answer is not JSON".into()))?;
    match (answer["Username"].as_str(), answer["Secret"].as_str()) {
        // An identity token is for a token exchange lamina does not make.
        (Some("<token>"), _) => Err(fail(
            "it answers an identity token, which lamina cannot use: store a password".into(),
        )),
        (Some(user), Some(secret)) => Ok(Some(Credentials {
            username: user.to_string(),
            password: secret.to_string(),
        })),
        _ => Err(fail("its answer has no Username and Secret".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auths_are_found_under_every_spelling_of_their_host() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("u:p:w");
        std::fs::write(
            &file,
            format!(
                r#"{{"auths":{{"https://reg.example:5000/v1/":{{"auth":"{auth}"}},"https://index.docker.io/v1/":{{"username":"hub","password":"pw"}}}}}}"#
            ),
        )
        .unwrap();
        let t = Duration::from_secs(1);
        let found = credentials_for(&file, "reg.example:5000", t)
            .unwrap()
            .unwrap();
        assert_eq!(
            (found.username.as_str(), found.password.as_str()),
            ("u", "p:w")
        );
        let hub = credentials_for(&file, "registry-1.docker.io", t)
            .unwrap()
            .unwrap();
        assert_eq!(hub.username, "hub");
        assert!(credentials_for(&file, "reg.example", t).unwrap().is_none());
        assert!(
            credentials_for(&dir.path().join("none.json"), "x", t)
                .unwrap()
                .is_none()
        );
        std::fs::write(&file, r#"{"credsStore":"../../bin/sh"}"#).unwrap();
        let err = credentials_for(&file, "x", t).unwrap_err();
        assert!(err.message.contains("not a plain word"), "{err}");
    }
}
