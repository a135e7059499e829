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
    let long = format!("{}f", "d/".repeat(400_000));
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

/// The raw PAX header body `records`, then `file` named `name` holding `data`.
fn pax_body_then_file(body: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    RawTar::default()
        .member(b'x', "pax", body.len() as u64, body)
        .file(name, data)
        .finish()
}

#[test]
fn header_only_types_with_data_are_refused() {
    // Go and GNU tar read the next header right after a directory's; a reader that
    // skipped its `size` would unpack a file they never see.
    let mut hidden = RawTar::default();
    hidden.file("evil_hidden", b"x");
    let hidden = hidden.finish();
    let tar = RawTar::default()
        .member(b'5', "d", 512, &hidden[..512])
        .finish();
    let (err, dir) = unpack_err(&tar, u64::MAX);
    assert!(
        err.contains("entry `d`: a Directory entry declares 512 bytes"),
        "{err}"
    );
    assert!(!dir.path().join("evil_hidden").exists());
    for kind in [b'1', b'2', b'3', b'4', b'6'] {
        let tar = RawTar::default().member(kind, "n", 1, b"x").finish();
        let (err, _dir) = unpack_err(&tar, u64::MAX);
        assert!(
            err.contains("declares 1 bytes of data"),
            "{}: {err}",
            kind as char
        );
    }
}

#[test]
fn a_file_named_like_a_directory_is_refused() {
    for kind in [b'\0', b'0'] {
        let tar = RawTar::default().member(kind, "foo/", 4, b"data").finish();
        let (err, _dir) = unpack_err(&tar, u64::MAX);
        assert!(err.contains("name ends in `/`"), "{err}");
    }
}

#[test]
fn records_that_readers_resolve_differently_are_refused() {
    // A PAX record, then a global header, then the file: Go drops the record.
    let tar = RawTar::default()
        .pax(&[("path", b"pax_name")])
        .member(b'g', "global", 0, b"")
        .file("header_name", b"x")
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("global header separates"), "{err}");

    // A GNU long name and a PAX path: Go takes one, GNU tar the other.
    let tar = RawTar::default()
        .member(b'L', "././@LongLink", 9, b"gnu_name\0")
        .pax(&[("path", b"pax_name")])
        .file("header_name", b"x")
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(
        err.contains("both a GNU long name record and a PAX one"),
        "{err}"
    );

    // A long name of NULs: Go falls back to the header's name, a trimming reader to none.
    let tar = RawTar::default()
        .member(b'L', "././@LongLink", 4, b"\0\0\0\0")
        .file("header_name", b"x")
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(
        err.contains("entry `header_name`: its name record is empty"),
        "{err}"
    );
}

#[test]
fn malformed_pax_headers_are_refused_not_half_read() {
    // Records after a blank line: a lenient parser stops there and never sees them.
    let tar = pax_body_then_file(b"10 uid=77\n\n22 GNU.sparse.major=1\n", "f", b"x");
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("malformed PAX extended header"), "{err}");

    let tar = pax_body_then_file(b"12 size=3.9\n", "f", b"abc");
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("PAX size `3.9` differs"), "{err}");

    let tar = pax_body_then_file(b"10 uid=-1\n", "f", b"abc");
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(err.contains("PAX uid `-1` is not an id"), "{err}");
}

#[test]
fn a_non_directory_at_the_layer_root_is_refused() {
    let tar = RawTar::default().file(".", b"").finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(
        err.contains("names the layer root but is not a directory"),
        "{err}"
    );
}

#[test]
fn a_huge_global_header_is_refused_by_its_declared_size() {
    let tar = RawTar::default()
        .member(b'g', "global", 64 << 20, &[b'g'; 512])
        .finish();
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(
        err.contains("global header declares 67108864 bytes"),
        "{err}"
    );
}

#[test]
fn tar_errors_quoting_header_fields_are_escaped() {
    let mut tar = RawTar::default().file("ok", b"x").finish();
    tar.truncate(1024);
    let mut bad = [0u8; 512];
    bad[..10].copy_from_slice(b"evil\x1b[2J\n\r");
    bad[124..136].copy_from_slice(b"zzzzzzzzzzz\0");
    bad[156] = b'0';
    bad[148..156].copy_from_slice(b"        ");
    let sum: u32 = bad.iter().map(|&b| u32::from(b)).sum();
    bad[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    tar.extend_from_slice(&bad);
    tar.extend(std::iter::repeat_n(0, 1024));
    let (err, _dir) = unpack_err(&tar, u64::MAX);
    assert!(
        !err.contains('\x1b') && !err.contains('\n') && !err.contains('\r'),
        "{err:?}"
    );
}
