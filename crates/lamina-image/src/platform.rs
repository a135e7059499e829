//! Choosing one image from a multi-platform index.

use crate::ImageError;
use crate::spec::PlatformSpec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// linux + this machine's architecture, in OCI (GOARCH) spelling.
    pub fn host() -> Self {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            "loongarch64" => "loong64",
            other => other,
        };
        Platform {
            os: "linux".into(),
            architecture: architecture.into(),
            variant: None,
        }
    }

    /// `os/arch[/variant]`, as `--platform linux/arm64/v8`.
    pub fn parse(s: &str) -> Result<Self, ImageError> {
        let parts: Vec<&str> = s.split('/').collect();
        match parts.as_slice() {
            [os, arch] if !os.is_empty() && !arch.is_empty() => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, variant] if !os.is_empty() && !arch.is_empty() && !variant.is_empty() => {
                Ok(Platform {
                    os: os.to_string(),
                    architecture: arch.to_string(),
                    variant: Some(variant.to_string()),
                })
            }
            _ => Err(ImageError::new(format!(
                "platform `{}` is not of the form os/arch[/variant]",
                crate::shown(s)
            ))),
        }
    }

    /// Whether an image declaring `spec` runs here. A field the image leaves empty
    /// matches anything (old images omit them); variants compare after containerd's
    /// defaults (arm64 means arm64/v8, arm means arm/v7, amd64 means amd64/v1), so
    /// `--platform linux/arm64/v8` takes an image that just says `linux/arm64`.
    pub fn matches(&self, spec: &PlatformSpec) -> bool {
        let field = |ours: &str, theirs: &str| theirs.is_empty() || ours == theirs;
        field(&self.os, &spec.os)
            && field(&self.architecture, &spec.architecture)
            && (self.variant.is_none()
                || default_variant(&self.architecture, self.variant.as_deref())
                    == default_variant(&self.architecture, spec.variant.as_deref()))
    }
}

/// Refuses an image that `source` (its index entry, its config) declares for another
/// platform than `wanted`. An index offering several platforms is chosen from by
/// platform, but a layout's only image, or the one a ref name picks, is taken as it is:
/// without this check an arm64 image would become an amd64 host's rootfs without a word,
/// and fail only when the container runs. `--platform` names the platform to accept.
pub fn refuse_foreign(
    declared: &PlatformSpec,
    wanted: &Platform,
    source: &str,
) -> Result<(), ImageError> {
    if wanted.matches(declared) {
        return Ok(());
    }
    let whose = if *wanted == Platform::host() {
        "this host's platform"
    } else {
        "the requested platform"
    };
    Err(ImageError::new(format!(
        "image is for {declared} ({source} says so), not {whose} {}; pass --platform {declared} to use it anyway",
        crate::shown(&wanted.to_string())
    )))
}

/// A variant with the architecture's default filled in, as containerd normalises it.
fn default_variant<'a>(architecture: &str, variant: Option<&'a str>) -> Option<&'a str> {
    match (architecture, variant) {
        ("arm64", None) => Some("v8"),
        ("arm", None) => Some("v7"),
        ("amd64", None) => Some("v1"),
        (_, v) => v,
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(arch: &str) -> PlatformSpec {
        PlatformSpec {
            architecture: arch.into(),
            os: "linux".into(),
            variant: None,
        }
    }

    #[test]
    fn foreign_images_are_refused_naming_both_platforms() {
        let host = Platform::host();
        let other = if host.architecture == "s390x" {
            "riscv64"
        } else {
            "s390x"
        };
        let err = refuse_foreign(&spec(other), &host, "its config").unwrap_err();
        assert!(
            err.message.contains(&format!("image is for linux/{other}"))
                && err
                    .message
                    .contains(&format!("this host's platform {host}"))
                && err.message.contains(&format!("--platform linux/{other}")),
            "{err}"
        );
        let asked = Platform::parse(&format!("linux/{other}")).unwrap();
        assert!(refuse_foreign(&spec(other), &asked, "its config").is_ok());
        assert!(refuse_foreign(&spec(&host.architecture), &host, "its config").is_ok());
    }

    #[test]
    fn empty_fields_match_and_variants_take_their_defaults() {
        let arm64 = Platform::parse("linux/arm64/v8").unwrap();
        assert!(arm64.matches(&spec("arm64")));
        let mut only_arch = spec("s390x");
        only_arch.os = String::new();
        assert!(!Platform::host().matches(&only_arch) || Platform::host().architecture == "s390x");
        let mut no_arch = spec("");
        no_arch.os = "windows".into();
        assert!(!Platform::host().matches(&no_arch));
    }

    #[test]
    fn declared_platforms_are_escaped() {
        let err = refuse_foreign(&spec("x\x1b[2K\r"), &Platform::host(), "its config").unwrap_err();
        assert!(!err.message.contains(['\x1b', '\r']), "{err}");
    }
}
