//! `docker://HOST[:PORT]/REPO[:TAG|@DIGEST]`, and `docker:///REPO[:TAG]` for Docker Hub
//! (GrootFS's form; `library/` is added to one-component names there).

use std::fmt;

use lamina_image::Digest;

use crate::RegistryError;

pub const DOCKER_HUB: &str = "registry-1.docker.io";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRef {
    /// `host` or `host:port`.
    pub host: String,
    pub repository: String,
    pub target: Target,
}

/// What in the repository: a tag, or a manifest digest (which pins it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tag(String),
    Digest(Digest),
}

impl RegistryRef {
    /// Parses a `docker://` reference; `None` if `s` is not one.
    pub fn parse(s: &str) -> Option<Result<Self, RegistryError>> {
        let rest = s.strip_prefix("docker://")?;
        Some(parse_rest(s, rest))
    }

    /// The manifest reference as the API takes it (`/v2/<repo>/manifests/<this>`).
    pub fn manifest_ref(&self) -> String {
        match &self.target {
            Target::Tag(tag) => tag.clone(),
            Target::Digest(d) => d.to_string(),
        }
    }
}

fn parse_rest(whole: &str, rest: &str) -> Result<RegistryRef, RegistryError> {
    let bad = |why: &str| RegistryError::new(format!("image `{whole}`: {why}"));
    let (host, path) = match rest.strip_prefix('/') {
        Some(path) => (DOCKER_HUB.to_string(), path),
        None => {
            let (host, path) = rest
                .split_once('/')
                .ok_or_else(|| bad("expected docker://HOST[:PORT]/REPO[:TAG|@DIGEST]"))?;
            if host.is_empty() {
                return Err(bad("the registry host is empty"));
            }
            (host.to_string(), path)
        }
    };
    let (name, target) = if let Some((name, digest)) = path.split_once('@') {
        let digest = Digest::parse(digest).map_err(|e| bad(&e.message))?;
        (name, Target::Digest(digest))
    } else {
        // A `:` after the last `/` starts the tag.
        let last = path.rfind('/').map_or(0, |i| i + 1);
        match path[last..].find(':') {
            Some(i) => (
                &path[..last + i],
                Target::Tag(path[last + i + 1..].to_string()),
            ),
            None => (path, Target::Tag("latest".into())),
        }
    };
    if let Target::Tag(tag) = &target
        && !valid_tag(tag)
    {
        return Err(bad(&format!("`{tag}` is not a valid tag")));
    }
    if !valid_repository(name) {
        return Err(bad(&format!(
            "`{name}` is not a valid repository name (lowercase letters, digits, separators)"
        )));
    }
    let repository = if host == DOCKER_HUB && !name.contains('/') {
        format!("library/{name}")
    } else {
        name.to_string()
    };
    Ok(RegistryRef {
        host,
        repository,
        target,
    })
}

/// The distribution spec's tag grammar: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`.
fn valid_tag(tag: &str) -> bool {
    let mut chars = tag.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && tag.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Path components of lowercase alphanumerics joined by `.`, `_`, `__` or `-`.
fn valid_repository(name: &str) -> bool {
    !name.is_empty()
        && name.split('/').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
                })
                && part.starts_with(|c: char| c.is_ascii_alphanumeric())
                && part.ends_with(|c: char| c.is_ascii_alphanumeric())
        })
}

impl fmt::Display for RegistryRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "docker://{}/{}", self.host, self.repository)?;
        match &self.target {
            Target::Tag(tag) => write!(f, ":{tag}"),
            Target::Digest(d) => write!(f, "@{d}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> RegistryRef {
        RegistryRef::parse(s).expect("docker ref").expect("valid")
    }

    #[test]
    fn host_port_repo_tag_and_digest() {
        let r = parse("docker://127.0.0.1:5000/team/app:v1.2");
        assert_eq!(r.host, "127.0.0.1:5000");
        assert_eq!(r.repository, "team/app");
        assert_eq!(r.target, Target::Tag("v1.2".into()));
        let hex = "a".repeat(64);
        let r = parse(&format!("docker://reg.example/app@sha256:{hex}"));
        assert_eq!(r.manifest_ref(), format!("sha256:{hex}"));
        assert_eq!(parse("docker://reg.example/app").manifest_ref(), "latest");
    }

    #[test]
    fn docker_hub_form_adds_library() {
        let r = parse("docker:///busybox:1.36");
        assert_eq!(
            (r.host.as_str(), r.repository.as_str()),
            (DOCKER_HUB, "library/busybox")
        );
    }

    #[test]
    fn refuses_what_is_not_a_reference() {
        for bad in [
            "docker://hostonly",
            "docker://h/UPPER",
            "docker://h/app:bad tag",
            "docker://h/app@sha256:short",
            "docker://h/../x",
        ] {
            assert!(
                RegistryRef::parse(bad).expect("docker ref").is_err(),
                "{bad}"
            );
        }
        assert!(RegistryRef::parse("oci:///x").is_none());
    }
}
