//! What lamina prints. `create` prints the runtime-spec fragment GrootFS prints, which
//! Garden merges into the container's spec and runc boots. Kept minimal on purpose: no
//! defaults for hostname, args, capabilities or namespaces, which are Garden's to set.
//! A failure prints one [`error_line`].

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
    /// The overlay's data options as one comma-joined string, the first option, as
    /// GrootFS prints it (create_test.go, "Mount json output"): callers hand
    /// `options[0]` to mount(2) as its data. A flag (`ro`) follows as an option of its
    /// own, which runc reads as a mount flag.
    pub fn overlay(options: Vec<String>) -> Self {
        let (flags, data): (Vec<String>, Vec<String>) =
            options.into_iter().partition(|o| o == "ro");
        Mount {
            destination: "/",
            kind: "overlay",
            source: "overlay".into(),
            options: std::iter::once(data.join(",")).chain(flags).collect(),
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

/// Longest error line printed whole. Past it the line is cut, so an image that stuffs an
/// error with a huge name or tag list cannot flood a log.
pub const MAX_ERROR_LINE: usize = 4096;

/// The one line a failure prints and logs. Errors escape what an image supplied where
/// they are written; this is the last line of defence: any newline becomes a space, any
/// other control character is escaped (so no `\r` or terminal escape can rewrite what is
/// already on screen), and a line past [`MAX_ERROR_LINE`] bytes is cut with a marker.
pub fn error_line(message: &str) -> String {
    let mut line = String::with_capacity(message.len().min(MAX_ERROR_LINE) + 32);
    for c in message.chars() {
        match c {
            '\n' => line.push(' '),
            c if c.is_control() => line.extend(c.escape_default()),
            c => line.push(c),
        }
    }
    if line.len() > MAX_ERROR_LINE {
        let mut end = MAX_ERROR_LINE;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        let cut = line.len() - end;
        line.truncate(end);
        line.push_str(&format!("… ({cut} bytes cut)"));
    }
    line
}

/// `value` as one JSON line for stdout. serde_json escapes only characters below U+0020;
/// DEL and the C1 controls (U+0080–U+009F, among them the 8-bit CSI a terminal obeys) are
/// escaped here too, so an image's env or name cannot drive the terminal that shows the
/// output. The JSON means the same: `\u009b` decodes to the character it replaces.
pub fn json_line<T: serde::Serialize>(value: &T) -> serde_json::Result<String> {
    Ok(escape_c1(&serde_json::to_string(value)?))
}

/// Replaces DEL and C1 characters in JSON text by `\u00XX` escapes. They can only occur
/// inside strings there, where the escape is valid JSON.
pub fn escape_c1(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

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
    fn error_lines_are_one_escaped_line() {
        assert_eq!(
            error_line("bad\r\x1b[2K OK created\nrootfs\t\u{9b}"),
            "bad\\r\\u{1b}[2K OK created rootfs\\t\\u{9b}"
        );
    }

    #[test]
    fn json_lines_escape_del_and_c1_controls() {
        let line = json_line(&serde_json::json!({"env": ["X=\u{9b}2J\u{7f}é"]})).unwrap();
        assert_eq!(line, r#"{"env":["X=\u009b2J\u007fé"]}"#);
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["env"][0], "X=\u{9b}2J\u{7f}é");
    }

    #[test]
    fn error_lines_are_bounded() {
        let long = format!("é{}", "x".repeat(10_000));
        let line = error_line(&long);
        assert!(line.len() < MAX_ERROR_LINE + 32, "{}", line.len());
        assert!(line.ends_with("… (5906 bytes cut)"), "{}", &line[4000..]);
        assert_eq!(error_line("short"), "short");
    }

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
            Some(vec![Mount::overlay(vec![
                "lowerdir=/l".into(),
                "upperdir=/u".into(),
                "workdir=/w".into(),
            ])]),
        );
        assert_eq!(
            serde_json::to_string(&spec).unwrap(),
            r#"{"ociVersion":"1.0.2","process":{"env":[]},"root":{"path":"/r"},"mounts":[{"destination":"/","type":"overlay","source":"overlay","options":["lowerdir=/l,upperdir=/u,workdir=/w"]}]}"#
        );
        let read_only = Mount::overlay(vec!["lowerdir=/a:/b".into(), "ro".into()]);
        assert_eq!(read_only.options, ["lowerdir=/a:/b", "ro"]);
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
