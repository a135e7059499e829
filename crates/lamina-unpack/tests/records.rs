//! Extension records and entry types that a hostile layer uses to exhaust memory, disk or
//! time, or to delete files: each is refused (or skipped) before it costs anything.
//! Runs as root (the unpacker chowns).

// Test helpers fail loudly: an unwrap here is an assertion.
#![allow(clippy::unwrap_used)]

use std::fs;

use lamina_sample::RawTar;
use lamina_unpack::{unpack, unpack_limited};

fn unpack_err(tar: &[u8], max: u64) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let err = unpack_limited(tar, dir.path(), max).unwrap_err();
    (err.to_string(), dir)
}

#[test]
fn a_huge_long_name_record_is_refused_before_it_is_read() {
    // 3 GiB declared, 512 bytes present: buffering it would need the memory first.
    let tar = RawTar::default()
        .file("etc/passwd", b"root")
        .member(b'L', "././@LongLink", 3 << 30, &[b'a'; 512])
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(
        err.contains("GNU long-name record declares 3221225472 bytes"),
        "{err}"
    );
    assert!(err.len() < 300, "one short line: {err}");
}

#[test]
fn a_huge_pax_record_is_refused_before_it_is_read() {
    let tar = RawTar::default()
        .member(b'x', "pax", 256 << 20, &[b'a'; 512])
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("PAX record declares 268435456 bytes"), "{err}");
}

#[test]
fn a_pax_name_past_path_max_is_refused_in_a_bounded_line() {
    let long = "d/".repeat(400_000);
    let tar = RawTar::default()
        .pax(&[("path", long.as_bytes())])
        .file("short", b"x")
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("past PATH_MAX"), "{err}");
    assert!(err.len() < 1024, "bounded: {} bytes", err.len());
}

#[test]
fn long_names_from_gnu_and_pax_records_name_the_entry() {
    // Past the 100-byte header name field, so only the records carry them.
    let gnu = format!("{}/file-with-a-long-name", "g".repeat(90));
    let pax = format!("{}/file-with-a-long-name", "p".repeat(90));
    let mut gnu_record = gnu.clone().into_bytes();
    gnu_record.push(0);
    let (gdir, pdir) = ("g".repeat(90), "p".repeat(90));
    let dir = tempfile::tempdir().unwrap();
    let tar = RawTar::default()
        .member(b'5', &gdir, 0, b"")
        .member(b'5', &pdir, 0, b"")
        .member(b'L', "././@LongLink", gnu_record.len() as u64, &gnu_record)
        .member(b'0', "ignored", 3, b"gnu")
        .pax(&[("path", pax.as_bytes())])
        .file("ignored-too", b"pax")
        .finish();
    unpack(&tar[..], dir.path()).unwrap();
    assert_eq!(fs::read(dir.path().join(&gnu)).unwrap(), b"gnu");
    assert_eq!(fs::read(dir.path().join(&pax)).unwrap(), b"pax");
    assert!(!dir.path().join("ignored").exists());
    assert!(!dir.path().join("ignored-too").exists());
}

#[test]
fn sparse_entries_are_refused_old_gnu_and_pax() {
    let old = RawTar::default().member(b'S', "holes", 0, b"").finish();
    let (err, _dir) = unpack_err(&old, u64::MAX);
    assert!(
        err.contains("entry `holes`: sparse files are not supported"),
        "{err}"
    );

    for key in ["GNU.sparse.major", "GNU.sparse.size", "GNU.sparse.map"] {
        let pax = RawTar::default()
            .pax(&[(key, b"1")])
            .file("GNUSparseFile.0/holes", b"x")
            .finish();
        let (err, dir) = unpack_err(&pax, u64::MAX);
        assert!(
            err.contains("sparse files are not supported"),
            "{key}: {err}"
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "{key}");
    }
}

#[test]
fn the_limit_counts_every_entry_of_the_layer() {
    let tar = RawTar::default()
        .file("a", &[1; 600])
        .file("b", &[2; 600])
        .finish();
    let (err, _dir) = unpack_err(&tar, 1000);
    assert!(
        err.contains("entry `b`: declares 600 bytes, bringing the layer to 1200 bytes"),
        "{err}"
    );
}

#[test]
fn a_global_header_is_skipped_without_touching_anything() {
    let tar = RawTar::default()
        .member(b'5', "etc", 0, b"")
        .file("etc/passwd", b"root:x:0:0")
        .member(b'g', "etc/passwd", 0, b"")
        .member(b'g', "newdir/etc/passwd", 0, b"")
        .finish();
    let dir = tempfile::tempdir().unwrap();
    unpack(&tar[..], dir.path()).unwrap();
    assert_eq!(
        fs::read(dir.path().join("etc/passwd")).unwrap(),
        b"root:x:0:0"
    );
    assert!(!dir.path().join("newdir").exists());
}

#[test]
fn an_unknown_type_is_refused_before_touching_anything() {
    let tar = RawTar::default()
        .member(b'5', "etc", 0, b"")
        .file("etc/passwd", b"root:x:0:0")
        .member(b'Q', "etc/passwd", 0, b"")
        .finish();
    let dir = tempfile::tempdir().unwrap();
    let err = unpack(&tar[..], dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("entry `etc/passwd`: unknown tar entry type `Q`"),
        "{err}"
    );
    assert_eq!(
        fs::read(dir.path().join("etc/passwd")).unwrap(),
        b"root:x:0:0"
    );

    let nested = RawTar::default().member(b'V', "new/dir/x", 0, b"").finish();
    let dir = tempfile::tempdir().unwrap();
    unpack(&nested[..], dir.path()).unwrap_err();
    assert!(!dir.path().join("new").exists(), "no parent was created");
}

#[test]
fn a_pax_size_that_disagrees_with_the_header_is_refused() {
    let tar = RawTar::default()
        .pax(&[("size", b"10")])
        .file("f", b"abc")
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("PAX size `10` differs"), "{err}");
}

#[test]
fn records_that_describe_no_entry_are_refused() {
    let tar = RawTar::default().pax(&[("path", b"x")]).finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("describe no entry"), "{err}");
}
