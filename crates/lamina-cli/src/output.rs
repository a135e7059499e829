//! What `create` prints: the runtime-spec fragment GrootFS prints, which Garden merges
//! into the container's spec and runc boots. Kept minimal on purpose: no defaults for
//! hostname, args, capabilities or namespaces, which are Garden's to set.

use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSpec {
    pub oci_version: &'static str,
    pub process: Process,
    pub root: Root,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mounts: Option<Vec<Mount>>,
}

#[derive(Debug, Serialize)]
pub struct Process {
    pub env: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Root {
    pub path: String,
    /// Only printed when true, so a read-write rootfs prints exactly what GrootFS does.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub readonly: bool,
}

/// The rootfs mount a `--without-mount` caller makes itself.
#[derive(Debug, Serialize)]
pub struct Mount {
    pub destination: &'static str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub source: String,
    pub options: Vec<String>,
}

impl Mount {
    pub fn overlay(options: Vec<String>) -> Self {
        Mount {
            destination: "/",
            kind: "overlay",
            source: "overlay".into(),
            options,
        }
    }

    pub fn read_only_bind(source: String) -> Self {
        Mount {
            destination: "/",
            kind: "bind",
            source,
            options: vec!["bind".into(), "ro".into()],
        }
    }
}

pub const OCI_VERSION: &str = "1.0.2";

impl RuntimeSpec {
    pub fn new(
        env: Vec<String>,
        rootfs: String,
        readonly: bool,
        mounts: Option<Vec<Mount>>,
    ) -> Self {
        RuntimeSpec {
            oci_version: OCI_VERSION,
            process: Process { env },
            root: Root {
                path: rootfs,
                readonly,
            },
            mounts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_grootfs_shape() {
        let spec = RuntimeSpec::new(
            vec!["PATH=/bin".into()],
            "/s/images/a/rootfs".into(),
            false,
            None,
        );
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"ociVersion":"1.0.2","process":{"env":["PATH=/bin"]},"root":{"path":"/s/images/a/rootfs"}}"#
        );
        let spec = RuntimeSpec::new(
            vec![],
            "/r".into(),
            false,
            Some(vec![Mount::overlay(vec!["lowerdir=/l".into()])]),
        );
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"ociVersion":"1.0.2","process":{"env":[]},"root":{"path":"/r"},"mounts":[{"destination":"/","type":"overlay","source":"overlay","options":["lowerdir=/l"]}]}"#
        );
        let spec = RuntimeSpec::new(
            vec![],
            "/r".into(),
            true,
            Some(vec![Mount::read_only_bind("/s/shared/x/rootfs".into())]),
        );
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"ociVersion":"1.0.2","process":{"env":[]},"root":{"path":"/r","readonly":true},"mounts":[{"destination":"/","type":"bind","source":"/s/shared/x/rootfs","options":["bind","ro"]}]}"#
        );
    }
}
