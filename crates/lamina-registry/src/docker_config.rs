//! Credentials where operators keep them: a Docker `config.json` — `auths` (base64
//! `user:password`, or `username`/`password`), and credential helpers (`credHelpers` per
//! registry, else `credsStore`) run as `docker-credential-NAME get` with the registry on
//! stdin, as Docker runs them. Flags (`--username`/`--password`) win over the file.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
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
    // The host comes from an image reference: only a plain registry name is looked up,
    // so no helper is told (and no entry matched by) text that names another host.
    if !plain_host(host) {
        return Ok(None);
    }
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

/// A registry name as Docker's reference grammar has it: DNS labels (letters, digits,
/// `-`, `.`) or a bracketed IPv6 address, and an optional numeric port; at most 255 bytes.
fn plain_host(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, _)) if !name.ends_with(']') && name.contains(':') => (host, None),
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    let name_ok = match name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        Some(v6) => !v6.is_empty() && v6.chars().all(|c| c.is_ascii_hexdigit() || c == ':'),
        None => {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        }
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    host.len() <= 255 && name_ok && port_ok
}

/// Docker Hub's names: its credentials are filed, and its helpers asked, under the legacy
/// index URL.
const HUB: &[&str] = &["registry-1.docker.io", "docker.io", "index.docker.io"];
const HUB_SERVER: &str = "https://index.docker.io/v1/";

/// The keys a config may file `host` under: itself, and Docker Hub's legacy name.
fn names_of(host: &str) -> Vec<String> {
    let mut names = vec![host.to_string()];
    if HUB.contains(&host) {
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
    // Told what Docker tells it: the host, or Hub's index URL.
    let server = if HUB.contains(&host) {
        HUB_SERVER
    } else {
        host
    };
    let mut child = Command::new(&program)
        .arg("get")
        .env_remove("LAMINA_REGISTRY_PASSWORD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group, so a timeout ends whatever it started too.
        .process_group(0)
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    // Stdin written and stdout read beside the clock: a helper that reads nothing, or
    // leaves a child holding its stdout, cannot stall the pull past `timeout`.
    let stdin = child.stdin.take();
    let server = server.to_string();
    std::thread::spawn(move || {
        if let Some(mut stdin) = stdin {
            let _ = stdin.write_all(server.as_bytes());
        }
    });
    let (sender, answer) = std::sync::mpsc::channel();
    let stdout = child.stdout.take();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(stdout) = stdout {
            let _ = stdout.take(MAX_HELPER_OUTPUT).read_to_end(&mut out);
        }
        let _ = sender.send(out);
    });
    let started = Instant::now();
    let kill = |child: &mut std::process::Child| {
        // The group the helper leads: negative pid.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = child.kill();
        let _ = child.wait();
    };
    let status = loop {
        match child.try_wait().map_err(|e| fail(e.to_string()))? {
            Some(status) => break status,
            None if started.elapsed() >= timeout => {
                kill(&mut child);
                return Err(fail(format!("did not answer within {timeout:?}")));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let left = timeout.saturating_sub(started.elapsed());
    let out = match answer.recv_timeout(left.max(Duration::from_millis(100))) {
        Ok(out) => out,
        Err(_) => {
            kill(&mut child);
            return Err(fail(format!("did not answer within {timeout:?}")));
        }
    };
    if !status.success() {
        return Ok(None);
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
        // A host that is not a plain registry name asks nobody and matches nothing.
        for host in [
            "good.example@evil.example",
            "a#b",
            "x\ny",
            "ünï.example",
            "h:99999x",
        ] {
            assert!(credentials_for(&file, host, t).unwrap().is_none(), "{host}");
        }
        assert!(
            plain_host("[::1]:5000") && plain_host("127.0.0.1:5000") && plain_host("reg.example")
        );
        assert!(!plain_host(&"a".repeat(300)));
    }
}
