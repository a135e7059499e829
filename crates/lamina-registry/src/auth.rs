//! Registry authentication: HTTP Basic (htpasswd registries) and the Bearer token flow of
//! the distribution spec (`WWW-Authenticate: Bearer realm=…,service=…,scope=…`).

use std::fmt;

use base64::Engine;

/// A username and password. Debug shows neither; nothing else prints them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

impl Credentials {
    pub fn basic_header(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// What a 401 asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

impl Challenge {
    /// Parses a `WWW-Authenticate` value; `None` for schemes lamina does not speak.
    pub fn parse(header: &str) -> Option<Challenge> {
        let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let mut realm = None;
        let mut service = None;
        let mut scope = None;
        for (key, value) in params_of(params) {
            match key.as_str() {
                "realm" => realm = Some(value),
                "service" => service = Some(value),
                "scope" => scope = Some(value),
                _ => {}
            }
        }
        Some(Challenge::Bearer {
            realm: realm?,
            service,
            scope,
        })
    }
}

/// The `host[:port]` of token realm `realm` if it is a plain-HTTP URL. Basic credentials
/// sent there from an HTTPS registry would cross the network in the clear, to a realm the
/// registry named (so a registry, or whoever rewrote its challenge, could harvest them).
pub(crate) fn plain_http_host(realm: &str) -> Option<&str> {
    let scheme = realm.get(..7)?;
    if !scheme.eq_ignore_ascii_case("http://") {
        return None;
    }
    let rest = &realm[7..];
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    Some(
        authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host),
    )
}

/// `key="value",key=value` pairs; commas inside quotes (scopes list actions) are kept.
fn params_of(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.find('"') {
                Some(end) => (&quoted[..end], &quoted[end + 1..]),
                None => (quoted, ""),
            }
        } else {
            match after.find(',') {
                Some(end) => (&after[..end], &after[end..]),
                None => (after, ""),
            }
        };
        out.push((key, value.to_string()));
        rest = remaining.trim_start_matches(',').trim();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_challenges_with_quoted_commas() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:team/app:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:team/app:pull,push".into()),
            })
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(Challenge::parse("Negotiate"), None);
    }

    #[test]
    fn finds_the_host_of_a_plain_http_realm() {
        assert_eq!(
            plain_http_host("http://auth.example:8080/token"),
            Some("auth.example:8080")
        );
        assert_eq!(
            plain_http_host("HTTP://u@auth.example?x=/y"),
            Some("auth.example")
        );
        assert_eq!(plain_http_host("https://auth.example/token"), None);
        assert_eq!(plain_http_host("http:"), None);
    }

    #[test]
    fn credentials_never_print() {
        let c = Credentials {
            username: "alice".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{c:?}").contains("s3cret"));
        assert_eq!(c.basic_header(), "Basic YWxpY2U6czNjcmV0");
    }
}
