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
                "platform `{s}` is not of the form os/arch[/variant]"
            ))),
        }
    }

    pub fn matches(&self, spec: &PlatformSpec) -> bool {
        self.os == spec.os
            && self.architecture == spec.architecture
            && (self.variant.is_none() || self.variant == spec.variant)
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
