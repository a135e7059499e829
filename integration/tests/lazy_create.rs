//! `lamina create --strategy lazy` from a real registry (Debian's docker-registry): a
//! container boots in runc from an image of which only the indexes were fetched, reads
//! files spread across both layers, and each fault of the data path fails a read with
//! EIO — never zeros, never a hang: the registry gone, a chunk with wrong bytes, the
//! serving daemon killed. A restarted daemon serves new containers; an index that does not
//! match its annotation makes an ordinary whole pull.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use lamina_image::Digest;
use lamina_image::lazy::estargz::{FOOTER_SIZE, TOC_DIGEST_ANNOTATION, read_toc, toc_offset};
use lamina_integration::lazy_image::{
    Format, big, daemons_of, data, kill_daemons, push_image, push_image_with, push_lying_estargz,
    push_tars, tars,
};
use lamina_integration::registry::Registry;
use lamina_integration::{Bundle, Lamina, ScratchFs, require_root};
use lamina_sample::LayerBuilder;

/// The daemons serving `store`, killed when dropped so a failing test leaves no server
/// behind; the scratch filesystem then unmounts its mounts.
struct Daemons(PathBuf);

impl Daemons {
    fn pids(&self) -> Vec<i32> {
        daemons_of(&self.0)
    }

    fn kill(&self) {
        kill_daemons(&self.0);
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A store on `fs` (`store`), and the daemons that come to serve it, killed when dropped.
fn lazy_store(fs: &ScratchFs) -> (PathBuf, Lamina, Daemons) {
    let store = fs.path().join("store");
    let lamina = Lamina::init(&store);
    let daemons = Daemons(store.clone());
    (store, lamina, daemons)
}

/// `lamina FLAGS... create --strategy lazy REFERENCE ID`, pulling from `host` over HTTP.
fn create_lazy(
    lamina: &Lamina,
    host: &str,
    flags: &[&str],
    reference: &str,
    id: &str,
) -> lamina_integration::Output {
    let mut args = vec!["--insecure-registry", host];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["create", "--strategy", "lazy", reference, id]);
    lamina.run(&args)
}

/// `sha256sum` of `bytes` as busybox prints it for `path`.
fn sum_line(bytes: &[u8], path: &str) -> String {
    format!("{}  {path}\n", Digest::of(bytes).hex())
}

/// Reads `path` in a thread, failing the test if it takes longer than `within`.
fn read_within(path: &Path, within: Duration) -> std::io::Result<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(owned));
    });
    rx.recv_timeout(within)
        .unwrap_or_else(|_| panic!("reading {} hung past {within:?}", path.display()))
}

fn lazy_create_boots_and_reads(format: Format, repo_tag: &str) {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), format, repo_tag);
    let (store, lamina, _daemons) = lazy_store(&fs);
    let reference = registry.reference(repo_tag);
    let create = |id: &str| {
        create_lazy(
            &lamina,
            &registry.host,
            &["--log-level", "info"],
            &reference,
            id,
        )
    };
    let out = create("first");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr
            .contains("started lamina daemon to serve lazy layers"),
        "the log says who serves: {out:?}"
    );
    assert_eq!(
        out.stderr.matches("published lazy layer").count(),
        2,
        "both layers lazy, neither pulled whole: {out:?}"
    );

    let rootfs = lamina.rootfs("first");
    // As a whole pull shows it: eStargz's TOC is an entry of the layer's tar.
    assert_eq!(
        rootfs.join("stargz.index.json").is_file(),
        format == Format::Estargz
    );
    let booted = Bundle::new(&rootfs, false).run(
        "lazy-first",
        "cat /data/small && sha256sum /data/big /data/f2 && test ! -e /etc/hosts && echo whiteout",
    );
    assert_eq!(
        booted.stdout,
        format!(
            "small\n{}{}whiteout\n",
            sum_line(&big(), "/data/big"),
            sum_line(&data(2, 128), "/data/f2")
        ),
        "{booted:?}"
    );

    // Garden's stats: a lazy layer counts the bytes its index lists.
    let stats = lamina.run(&["stats", "first"]);
    assert_eq!(stats.code, 0, "{stats:?}");
    let total = stats.json()["disk_usage"]["total_bytes_used"]
        .as_u64()
        .unwrap();
    assert!(total >= (big().len() + 4 * 128 * 1024) as u64, "{stats:?}");

    // A second create finds the server running and says nothing of starting one.
    let again = create("second");
    assert_eq!(again.code, 0, "{again:?}");
    assert!(!again.stderr.contains("started lamina daemon"), "{again:?}");
    let second = lamina.rootfs("second");
    assert_eq!(std::fs::read(second.join("data/f0")).unwrap(), data(0, 128));

    // Background completion: both layers become ordinary layers, checked against their
    // diffIDs and their indexes, and a create after it mounts no lazy layer.
    lamina_integration::wait_until("both layers completed", || lamina.entries("layers") == 2);
    let after = create("after");
    assert_eq!(after.code, 0, "{after:?}");
    let record =
        lamina_integration::records::record_json(&store.join("images/after/container.json"));
    let options = record["rootfs"]["mount_options"].to_string();
    assert!(
        options.contains("lowerdir=") && !options.contains(&*store.join("lazy").to_string_lossy()),
        "no lazy layer in its mount: {options}"
    );
    let booted =
        Bundle::new(&lamina.rootfs("after"), false).run("lazy-after", "sha256sum /data/f3");
    assert_eq!(
        booted.stdout,
        sum_line(&data(3, 128), "/data/f3"),
        "{booted:?}"
    );

    for id in ["first", "second", "after"] {
        lamina.delete_and_assert_gone(id, "lazy");
    }
    let check = lamina.run(&["check", "--verify"]);
    assert_eq!(check.code, 0, "{check:?}");
}

#[test]
fn an_estargz_image_boots_lazily_in_runc() {
    lazy_create_boots_and_reads(Format::Estargz, "lazy/estargz:v1");
}

#[test]
fn a_zstd_chunked_image_boots_lazily_in_runc() {
    lazy_create_boots_and_reads(Format::ZstdChunked, "lazy/zstd:v1");
}

#[test]
fn completion_fetches_only_what_reads_did_not_and_nothing_twice() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::Estargz, "lazy/once:v1");
    let manifest: serde_json::Value =
        serde_json::from_slice(&registry.manifest("lazy/once:v1")).unwrap();
    let blobs: u64 = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    // Every byte lamina fetches passes the proxy, counted.
    let proxy = lamina_integration::delay_proxy::DelayProxy::start(&registry.host, Duration::ZERO);
    let (_, lamina, _daemons) = lazy_store(&fs);
    let reference = format!("docker://{}/lazy/once:v1", proxy.host);
    let out = create_lazy(&lamina, &proxy.host, &[], &reference, "reader");
    assert_eq!(out.code, 0, "{out:?}");
    let booted =
        Bundle::new(&lamina.rootfs("reader"), false).run("lazy-once", "sha256sum /data/big");
    assert_eq!(booted.stdout, sum_line(&big(), "/data/big"), "{booted:?}");
    let read = proxy.fetched();

    lamina_integration::wait_until("both layers completed", || lamina.entries("layers") == 2);
    let total = proxy.fetched();
    // The documents, each request's headers and eStargz's footers come on top of the
    // blobs; fetching what reads fetched again would add the ~1 MiB busybox reads.
    assert!(
        total <= blobs + blobs / 20 + 32 * 1024,
        "fetched {total} bytes for {blobs} bytes of blobs ({read} before completion)"
    );
    assert!(
        read > 256 * 1024,
        "the reads fetched what they read: {read}"
    );
    lamina.delete_and_assert_gone("reader", "lazy");
    let check = lamina.run(&["check", "--verify"]);
    assert_eq!(check.code, 0, "{check:?}");
}

#[test]
fn reads_fail_with_eio_when_the_registry_or_the_server_is_gone_and_a_new_server_serves() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let mut registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::Estargz, "lazy/faults:v1");
    let (_, lamina, daemons) = lazy_store(&fs);
    let reference = registry.reference("lazy/faults:v1");
    let host = registry.host.clone();
    let create = |id: &str| {
        create_lazy(
            &lamina,
            &host,
            &["--registry-timeout-seconds", "2"],
            &reference,
            id,
        )
    };
    assert_eq!(create("faults").code, 0);
    let rootfs = lamina.rootfs("faults");
    assert_eq!(std::fs::read(rootfs.join("data/f0")).unwrap(), data(0, 128));

    // The registry gone: what was read reads on, what was not fails with EIO.
    registry.stop();
    assert_eq!(std::fs::read(rootfs.join("data/f0")).unwrap(), data(0, 128));
    let gone = read_within(&rootfs.join("data/f1"), Duration::from_secs(60));
    assert_eq!(
        gone.as_ref().map_err(|e| e.raw_os_error()).err(),
        Some(Some(5)),
        "EIO, not zeros: {:?}",
        gone.as_ref()
            .map(|b| (b.len(), b.iter().all(|b| *b == 0), *b == data(1, 128)))
    );

    // The server killed: reads of what is missing fail (overlay passes FUSE's ENOTCONN
    // on), and do not hang.
    registry.restart();
    daemons.kill();
    let dead = read_within(&rootfs.join("data/f3"), Duration::from_secs(30));
    assert!(
        dead.is_err(),
        "a read with no server fails: {:?}",
        dead.as_ref().map(Vec::len)
    );

    // A new create starts a new server, which replaces the dead mounts and serves.
    let out = create("after");
    assert_eq!(out.code, 0, "{out:?}");
    let after = lamina.rootfs("after");
    let f3 = std::fs::read(after.join("data/f3"));
    assert!(
        f3.as_ref().is_ok_and(|b| *b == data(3, 128)),
        "{:?}; the server's log:\n{}",
        f3.map(|b| b.len()),
        std::fs::read_to_string(lamina.store.join("run/background.log")).unwrap_or_default()
    );
    let booted = Bundle::new(&after, false).run("lazy-after", "sha256sum /data/f1");
    assert_eq!(
        booted.stdout,
        sum_line(&data(1, 128), "/data/f1"),
        "{booted:?}"
    );

    lamina.delete_and_assert_gone("faults", "lazy faults");
    lamina.delete_and_assert_gone("after", "lazy faults");
}

#[test]
fn a_chunk_with_wrong_bytes_fails_its_read_with_eio() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::Estargz, "lazy/bad:v1");
    // One byte changed in the middle of the member holding /data/f1's first chunk, in
    // the registry's own copy of the blob.
    let manifest: serde_json::Value =
        serde_json::from_slice(&registry.manifest("lazy/bad:v1")).unwrap();
    let layer = &manifest["layers"][1];
    let blob_path = registry.blob_file(layer["digest"].as_str().unwrap());
    let mut blob = std::fs::read(&blob_path).unwrap();
    let size = blob.len() as u64;
    let offset = toc_offset(&blob[blob.len() - FOOTER_SIZE as usize..], size).unwrap();
    let toc_digest = Digest::parse(
        layer["annotations"][TOC_DIGEST_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let toc = read_toc(
        &blob[offset as usize..(size - FOOTER_SIZE) as usize],
        &toc_digest,
    )
    .unwrap();
    let files = toc.files(offset).unwrap();
    let f1 = files.iter().find(|f| f.name == "data/f1").unwrap();
    let (start, end) = f1.chunks[0].member;
    let middle = ((start + end) / 2) as usize;
    blob[middle] ^= 0xff;
    std::fs::write(&blob_path, &blob).unwrap();

    let (_, lamina, _daemons) = lazy_store(&fs);
    let reference = registry.reference("lazy/bad:v1");
    let out = create_lazy(&lamina, &registry.host, &[], &reference, "bad");
    assert_eq!(out.code, 0, "{out:?}");
    let rootfs = lamina.rootfs("bad");
    let read = read_within(&rootfs.join("data/f1"), Duration::from_secs(60));
    assert_eq!(
        read.as_ref().map_err(|e| e.raw_os_error()).err(),
        Some(Some(5)),
        "EIO, never the wrong bytes: {:?}",
        read.as_ref()
            .map(|b| (b.len(), b.iter().all(|b| *b == 0), *b == data(1, 128)))
    );
    assert_eq!(std::fs::read(rootfs.join("data/f2")).unwrap(), data(2, 128));
    // Completion fetches the whole blob, whose digest is not the manifest's: the layer
    // is marked bad, `check` names it, and a new create from it is refused.
    lamina_integration::wait_until("the layer marked bad", || {
        lamina.run(&["check"]).stdout.contains("bad_lazy_layer")
    });
    let refused = create_lazy(&lamina, &registry.host, &[], &reference, "refused");
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stdout.contains("is bad: "), "{refused:?}");
    assert!(
        refused.stdout.contains("blob digest mismatch"),
        "{refused:?}"
    );
    lamina.delete_and_assert_gone("bad", "lazy bad chunk");
}

#[test]
fn a_layer_whose_tar_is_not_its_diff_id_is_marked_bad_and_refused() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image_with(
        &registry,
        fs.path(),
        Format::ZstdChunked,
        "lazy/diffid:v1",
        |layer| layer.diff_id = Digest::of(b"another tar"),
    );
    let (_, lamina, _daemons) = lazy_store(&fs);
    let reference = registry.reference("lazy/diffid:v1");
    let out = create_lazy(&lamina, &registry.host, &[], &reference, "early");
    assert_eq!(out.code, 0, "served lazily before completion: {out:?}");
    lamina_integration::wait_until("the layers marked bad", || {
        lamina
            .run(&["check"])
            .stdout
            .matches("bad_lazy_layer")
            .count()
            == 2
    });
    let check = lamina.run(&["check"]);
    assert!(check.stdout.contains("diffID mismatch"), "{check:?}");
    let refused = create_lazy(&lamina, &registry.host, &[], &reference, "refused");
    assert_eq!(refused.code, 1, "{refused:?}");
    assert!(refused.stdout.contains("is bad: "), "{refused:?}");
    assert_eq!(lamina.entries("layers"), 0, "nothing imported");
    lamina.delete_and_assert_gone("early", "lazy diffID");
}

#[test]
fn an_index_that_does_not_match_its_annotation_is_pulled_whole() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image_with(
        &registry,
        fs.path(),
        Format::Estargz,
        "lazy/lying:v1",
        |layer| {
            layer.annotations.insert(
                TOC_DIGEST_ANNOTATION.into(),
                Digest::of(b"another index").to_string(),
            );
        },
    );
    let (_, lamina, _daemons) = lazy_store(&fs);
    let reference = registry.reference("lazy/lying:v1");
    let out = create_lazy(
        &lamina,
        &registry.host,
        &["--log-level", "warn"],
        &reference,
        "whole",
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr
            .contains("its index cannot be used: pulling the layer whole"),
        "{out:?}"
    );
    assert_eq!(lamina.entries("layers"), 2, "both layers pulled whole");
    let rootfs = lamina.rootfs("whole");
    let booted = Bundle::new(&rootfs, false).run("lazy-whole", "sha256sum /data/big");
    assert_eq!(booted.stdout, sum_line(&big(), "/data/big"), "{booted:?}");
    lamina.delete_and_assert_gone("whole", "lazy lying index");
}

#[test]
fn an_index_that_lies_about_its_tar_marks_the_lazy_layer_bad_at_completion() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_lying_estargz(&registry, fs.path(), "lazy/lying-toc:v1");
    let (_, lamina, _daemons) = lazy_store(&fs);
    let reference = registry.reference("lazy/lying-toc:v1");
    let out = create_lazy(&lamina, &registry.host, &[], &reference, "lied-to");
    assert_eq!(out.code, 0, "{out:?}");
    // Until completion, the lazy view shows what the index says.
    let mode = std::fs::metadata(lamina.rootfs("lied-to").join("data/f1"))
        .unwrap()
        .permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
        0o4755
    );
    lamina_integration::wait_until("the lying layer marked bad", || {
        lamina.run(&["check"]).stdout.contains("bad_lazy_layer")
    });
    let check = lamina.run(&["check"]);
    assert!(
        check
            .stdout
            .contains("its index does not describe its tar: `data/f1`: its mode differs"),
        "{check:?}"
    );
    // The tar itself is the image's (its diffID checked): a new create mounts it, and
    // reads what the tar holds.
    let out = create_lazy(&lamina, &registry.host, &[], &reference, "whole");
    assert_eq!(out.code, 0, "{out:?}");
    let whole = std::fs::metadata(lamina.rootfs("whole").join("data/f1")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&whole.permissions()) & 0o7777,
        0o644
    );
    lamina.delete_and_assert_gone("lied-to", "lying TOC");
    lamina.delete_and_assert_gone("whole", "lying TOC");
}

#[test]
fn pull_lazy_fetches_the_indexes_and_starts_the_server_for_the_creates_after_it() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::ZstdChunked, "lazy/pulled:v1");
    let (_, lamina, _daemons) = lazy_store(&fs);
    let reference = registry.reference("lazy/pulled:v1");
    let pulled = lamina.run(&[
        "--insecure-registry",
        &registry.host,
        "--log-level",
        "info",
        "pull",
        "--lazy",
        &reference,
    ]);
    assert_eq!(pulled.json()["layers"], 2, "{pulled:?}");
    assert_eq!(pulled.stderr.matches("published lazy layer").count(), 2);
    assert!(
        pulled.stderr.contains("started lamina daemon"),
        "{pulled:?}"
    );
    let out = create_lazy(
        &lamina,
        &registry.host,
        &["--log-level", "info"],
        &reference,
        "c",
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!out.stderr.contains("published lazy layer"), "{out:?}");
    assert!(!out.stderr.contains("started lamina daemon"), "{out:?}");
    let booted = Bundle::new(&lamina.rootfs("c"), false).run("lazy-pulled", "sha256sum /data/f3");
    assert_eq!(
        booted.stdout,
        sum_line(&data(3, 128), "/data/f3"),
        "{booted:?}"
    );
    lamina.delete_and_assert_gone("c", "pull --lazy");

    // With a server running for the store, `auto` (the default) serves another indexed
    // image lazily too.
    let other = LayerBuilder::new()
        .file("auto.txt", 0o644, b"served lazily by auto\n")
        .and_then(|l| l.finish())
        .unwrap();
    let busybox = tars()[0].clone();
    push_tars(
        &registry,
        fs.path(),
        Format::Estargz,
        "lazy/auto:v1",
        &[busybox, other],
        |_| {},
    );
    let out = lamina.run(&[
        "--insecure-registry",
        &registry.host,
        "--log-level",
        "info",
        "create",
        &registry.reference("lazy/auto:v1"),
        "by-auto",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("a server of lazy layers runs: lazy"),
        "{out:?}"
    );
    assert!(out.stderr.contains("published lazy layer"), "{out:?}");
    let booted = Bundle::new(&lamina.rootfs("by-auto"), false).run("lazy-auto", "cat /auto.txt");
    assert_eq!(booted.stdout, "served lazily by auto\n", "{booted:?}");
    lamina.delete_and_assert_gone("by-auto", "auto");
}

#[test]
fn an_image_that_claims_another_images_diff_ids_does_not_serve_its_layers_to_it() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::Estargz, "victim/app:v1");
    // The same layers but for `/data/small`, its config claiming the victim's diffIDs.
    let [base, _] = tars();
    let evil_top = lamina_sample::LayerBuilder::new()
        .dir("data", 0o755)
        .and_then(|b| b.file("data/small", 0o600, b"pwned by another image\n"))
        .and_then(lamina_sample::LayerBuilder::finish)
        .unwrap();
    let victim_diff_ids: Vec<Digest> = tars()
        .iter()
        .map(|tar| {
            lamina_sample::estargz::estargz(tar, 64 * 1024)
                .unwrap()
                .diff_id
        })
        .collect();
    let claimed = std::sync::Mutex::new(victim_diff_ids.into_iter());
    push_tars(
        &registry,
        fs.path(),
        Format::Estargz,
        "evil/app:v1",
        &[base, evil_top],
        |layer| layer.diff_id = claimed.lock().unwrap().next().unwrap(),
    );
    let (_, lamina, _daemons) = lazy_store(&fs);
    let evil = registry.reference("evil/app:v1");
    let out = create_lazy(&lamina, &registry.host, &[], &evil, "evil");
    assert_eq!(out.code, 0, "{out:?}");
    let victim = registry.reference("victim/app:v1");
    let out = create_lazy(
        &lamina,
        &registry.host,
        &["--log-level", "warn"],
        &victim,
        "victim",
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("came from another source"), "{out:?}");
    assert_eq!(
        std::fs::read(lamina.rootfs("victim").join("data/small")).unwrap(),
        b"small\n"
    );
    lamina.delete_and_assert_gone("evil", "claimed diffIDs");
    lamina.delete_and_assert_gone("victim", "claimed diffIDs");
}

#[test]
fn a_deleted_store_is_no_longer_served_and_a_new_store_gets_a_server_of_its_own() {
    require_root();
    let fs = ScratchFs::ext4(512);
    let registry = Registry::start(&fs.path().join("registry"), None);
    push_image(&registry, fs.path(), Format::Estargz, "lazy/again:v1");
    let (store, lamina, daemons) = lazy_store(&fs);
    let reference = registry.reference("lazy/again:v1");
    assert_eq!(
        create_lazy(&lamina, &registry.host, &[], &reference, "one").code,
        0
    );
    let first = daemons.pids();
    assert_eq!(lamina.run(&["delete-store"]).code, 0);
    let lamina = Lamina::init(&store);
    let out = create_lazy(
        &lamina,
        &registry.host,
        &["--log-level", "info"],
        &reference,
        "two",
    );
    assert_eq!(out.code, 0, "{out:?}");
    // However the old daemon and the new one race for the new store, the new store's
    // container reads its bytes, then and after the page cache is dropped.
    let rootfs = lamina.rootfs("two");
    assert_eq!(std::fs::read(rootfs.join("data/big")).unwrap(), big());
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert_eq!(std::fs::read(rootfs.join("data/f2")).unwrap(), data(2, 128));
    assert_eq!(std::fs::read(rootfs.join("data/big")).unwrap(), big());
    assert!(!first.is_empty());
    lamina.delete_and_assert_gone("two", "store made again");
}
