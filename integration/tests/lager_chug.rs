//! Garden reads an image plugin's stderr with lager's `chug` and relogs each line it
//! parses. lamina's lines are parsed here by that same code (lager v3's `chug`, built
//! with Go from `integration/chug/`): a create that succeeds, one whose image fails to
//! import, and a usage error, each read as Garden reads it.

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use lamina_integration::{Lamina, ScratchFs, require_root, sample_image};

/// What chug read from one line.
#[derive(Debug, serde::Deserialize)]
struct Read {
    is_lager: bool,
    raw: String,
    log_level: u8,
    source: String,
    message: String,
    session: String,
    error: String,
    unix: i64,
    data: serde_json::Value,
}

fn go() -> PathBuf {
    ["/usr/local/go/bin/go", "/usr/lib/go/bin/go"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("go"))
}

/// `chug-json`, built once per run from `integration/chug` (its modules from the Go
/// module proxy, pinned by its go.sum).
fn chug_json() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chug-json");
        let status = Command::new(go())
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("chug"))
            .env("CGO_ENABLED", "0")
            .status()
            .expect("running go build (scripts/test installs Go)");
        assert!(status.success(), "building chug-json");
        out
    })
}

/// Each line of `stderr` as chug reads it.
fn chug(stderr: &str) -> Vec<Read> {
    let mut child = Command::new(chug_json())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stderr.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn garden_reads_every_line_of_a_create_and_of_its_failures() {
    require_root();
    let fs = ScratchFs::tmpfs();
    let files = sample_image(&fs.path().join("image"));
    let lamina = Lamina::init(&fs.path().join("store"));
    let image = &files.references()[0];

    // A create that succeeds: every line is lager's, the rootfs line at info.
    let out = lamina.run(&["--log-level", "info", "create", image, "ok"]);
    assert_eq!(out.code, 0, "{out:?}");
    let read = chug(&out.stderr);
    assert!(!read.is_empty(), "{out:?}");
    for line in &read {
        assert!(line.is_lager, "chug could not read {}", line.raw);
        assert_eq!(
            (line.source.as_str(), line.session.as_str()),
            ("lamina", "1")
        );
        assert!(line.message.starts_with("lamina.create."), "{line:?}");
        assert!(
            line.unix > 1_600_000_000,
            "a timestamp chug reads: {line:?}"
        );
    }
    let created = read
        .iter()
        .find(|l| l.message == "lamina.create.created rootfs")
        .unwrap_or_else(|| panic!("no created-rootfs line: {read:?}"));
    assert_eq!(created.log_level, 1, "info");
    assert_eq!(created.data["id"], "ok");
    assert!(created.data["strategy"].is_string(), "{created:?}");

    // An image that fails to import: the failure is an error line whose error chug
    // reads, and the one-line answer is on stdout.
    let broken = fs.path().join("broken.tar");
    std::fs::write(&broken, b"not a tar at all").unwrap();
    let out = lamina.run(&["create", broken.to_str().unwrap(), "bad"]);
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    let read = chug(&out.stderr);
    let failed = read
        .iter()
        .find(|l| l.message == "lamina.create.command failed")
        .unwrap_or_else(|| panic!("no failure line: {read:?}"));
    assert!(failed.is_lager && failed.log_level == 2, "{failed:?}");
    assert!(failed.error.contains("layer tar"), "{failed:?}");
    assert!(read.iter().all(|l| l.is_lager), "{read:?}");
    assert!(!lamina.store.join("images/bad").exists());

    // A usage error answers on stdout alone, as GrootFS does: nothing for Garden to relog.
    let out = lamina.run(&["create", image]);
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 1, "{out:?}");
    assert!(chug(&out.stderr).is_empty(), "{out:?}");

    // tracing's own JSON, which Garden cannot read, is there for who asks for it.
    let out = lamina.run(&[
        "--log-format",
        "json",
        "--log-level",
        "info",
        "create",
        image,
        "j",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let read = chug(&out.stderr);
    assert!(
        !read.is_empty() && read.iter().all(|l| !l.is_lager),
        "{read:?}"
    );

    lamina.delete_and_assert_gone("j", "j");
    lamina.delete_and_assert_gone("ok", "ok");
}
