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
}

#[derive(Debug, Serialize)]
pub struct Mount {
    pub destination: &'static str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub source: &'static str,
    pub options: Vec<String>,
}

pub const OCI_VERSION: &str = "1.0.2";

impl RuntimeSpec {
    pub fn new(env: Vec<String>, rootfs: String, overlay_options: Option<Vec<String>>) -> Self {
        RuntimeSpec {
            oci_version: OCI_VERSION,
            process: Process { env },
            root: Root { path: rootfs },
            mounts: overlay_options.map(|options| {
                vec![Mount {
                    destination: "/",
                    kind: "overlay",
                    source: "overlay",
                    options,
                }]
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_grootfs_shape() {
        let spec = RuntimeSpec::new(vec!["PATH=/bin".into()], "/s/images/a/rootfs".into(), None);
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"ociVersion":"1.0.2","process":{"env":["PATH=/bin"]},"root":{"path":"/s/images/a/rootfs"}}"#
        );
        let spec = RuntimeSpec::new(vec![], "/r".into(), Some(vec!["lowerdir=/l".into()]));
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"ociVersion":"1.0.2","process":{"env":[]},"root":{"path":"/r"},"mounts":[{"destination":"/","type":"overlay","source":"overlay","options":["lowerdir=/l"]}]}"#
        );
    }
}
