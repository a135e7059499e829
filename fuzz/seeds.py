"""Writes the seed inputs of fuzz/corpus/ (deterministic). Run: python3 fuzz/seeds.py
Seeds only show the fuzzer the shapes it should mutate; what a fuzz run found worth
keeping is added beside them (cargo fuzz cmin keeps the set small)."""
import io, json, os, tarfile, hashlib

HERE = os.path.dirname(os.path.abspath(__file__))

def tar(entries, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for kind, name, extra in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1700000000
            data = b""
            if kind == "file":
                data = extra or b"hello\n"
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE; info.mode = 0o755
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE; info.linkname = extra
            elif kind == "hardlink":
                info.type = tarfile.LNKTYPE; info.linkname = extra
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            elif kind == "xattr":
                info.size = 1; data = b"x"; info.pax_headers = extra
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()

def write(target, name, data):
    with open(os.path.join(HERE, "corpus", target, name), "wb") as f:
        f.write(data)

layers = {
    "plain": [("dir", "etc", None), ("file", "etc/hostname", b"box\n"), ("symlink", "bin", "usr/bin"), ("hardlink", "etc/h2", "etc/hostname")],
    "whiteouts": [("dir", "a", None), ("file", "a/.wh..wh..opq", b""), ("file", ".wh.gone", b""), ("fifo", "p", None)],
    "dotdot": [("file", "../escape", b"x")],
    "symlink-then-write": [("symlink", "out", "/tmp"), ("file", "out/planted", b"x")],
    "hardlink-out": [("hardlink", "h", "../../etc/passwd")],
    "dup-types": [("dir", "x", None), ("file", "x/y", b"1"), ("file", "x", b"2")],
    "xattrs": [("xattr", "f", {"SCHILY.xattr.user.a": "1", "SCHILY.xattr.trusted.overlay.redirect": "/x"})],
    "long-name": [("file", "d/" * 60 + "f", b"x")],
}
for name, entries in layers.items():
    write("unpack_layer", name, tar(entries))
write("unpack_layer", "gnu-format", tar([("file", "g", b"gnu")], fmt=tarfile.GNU_FORMAT))

def digest(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()

empty_tar = bytes(1024)
config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [digest(empty_tar)]}, "config": {"Env": ["A=1"]}}
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "@C", "size": "@c"},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "@L", "size": "@l"}]}
index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "@M", "size": "@m",
         "platform": {"architecture": "amd64", "os": "linux"}, "annotations": {"org.opencontainers.image.ref.name": "latest"}}]}
def doc(o):
    # sizes are numbers in JSON: unquote the size placeholders
    return json.dumps(o).replace('"@c"', "@c").replace('"@l"', "@l").replace('"@m"', "@m").encode()
write("oci_documents", "valid", doc(index) + b"\0" + doc(manifest) + b"\0" + doc(config))
nested = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [dict(index["manifests"][0], mediaType="application/vnd.oci.image.index.v1+json")]}
write("oci_documents", "index-of-index", doc(nested) + b"\0" + doc(manifest) + b"\0" + doc(config))
docker_manifest = dict(manifest, mediaType="application/vnd.docker.distribution.manifest.v2+json")
write("oci_documents", "docker-media-types", doc(index) + b"\0" + doc(docker_manifest) + b"\0" + doc(dict(config, rootfs={"type": "layers", "diff_ids": []})))

def archive(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name); info.size = len(data); info.mtime = 1700000000
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()

cfg = json.dumps(config).encode()
layer = tar(layers["plain"])
cfg_l = json.dumps(dict(config, rootfs={"type": "layers", "diff_ids": [digest(layer)]})).encode()
dm = lambda layers_: json.dumps([{"Config": "config.json", "RepoTags": ["box:latest"], "Layers": layers_}]).encode()
write("docker_archive", "valid", archive([("config.json", cfg_l), ("l/layer.tar", layer), ("manifest.json", dm(["l/layer.tar"]))]))
write("docker_archive", "escaping-layer-path", archive([("config.json", cfg), ("manifest.json", dm(["../../etc/passwd"]))]))
write("docker_archive", "missing-config", archive([("manifest.json", dm([]))]))

# Issue 20's hostile tar classes: records and entry types that exhaust memory, disk or time
# (huge declared records, sparse holes, many entries under the limit) or delete files
# (global headers, unknown types at an earlier path).
def raw_member(kind, name, size, data=b"", realsize=None):
    h = bytearray(512)
    h[0:len(name)] = name.encode()
    h[100:108] = b"0000644\0"
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % 1700000000
    h[156:157] = kind
    h[257:265] = b"ustar  \0"
    if realsize is not None:  # old GNU sparse: one chunk of `data` at the end
        h[386:398] = b"%011o\0" % (realsize - len(data))
        h[398:410] = b"%011o\0" % len(data)
        h[483:495] = b"%011o\0" % realsize
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h) + data + bytes(-len(data) % 512)

def pax_member(records):
    body = b""
    for key, value in records:
        rest = len(key) + len(value) + 3
        n = rest + 1
        while n != rest + len(str(n)):
            n = rest + len(str(n))
        body += b"%d %s=%s\n" % (n, key, value)
    return raw_member(b"x", "pax", len(body), body)

end = bytes(1024)
write("unpack_layer", "sparse-old-gnu", raw_member(b"S", "holes", 1, b"x", realsize=640 << 20) + end)
write("unpack_layer", "sparse-pax", pax_member([(b"GNU.sparse.major", b"1"), (b"GNU.sparse.minor", b"0")])
      + raw_member(b"0", "GNUSparseFile.0/holes", 6, b"1\n0\n1\n") + end)
write("unpack_layer", "longname-record-3gib", raw_member(b"L", "././@LongLink", 3 << 30, b"n" * 512))
write("unpack_layer", "pax-record-256mib", raw_member(b"x", "pax", 256 << 20, b"p" * 512))
write("unpack_layer", "pax-path-past-path-max", pax_member([(b"path", b"n/" * 3000)]) + raw_member(b"0", "x", 1, b"x") + end)
write("unpack_layer", "global-header-over-file", raw_member(b"0", "passwd", 4, b"root")
      + raw_member(b"g", "passwd", 0) + raw_member(b"g", "new/dir/x", 0) + end)
write("unpack_layer", "unknown-type-over-file", raw_member(b"0", "passwd", 4, b"root") + raw_member(b"Q", "passwd", 0) + end)
write("unpack_layer", "many-entries-under-limit", b"".join(raw_member(b"0", "f%d" % i, 4096, b"z" * 4096) for i in range(8)) + end)

# Hostile documents and image-level streams (docs/security.md, "Hostile documents").
# Class 11: a document past lamina's 4 MiB bound. In oci_documents the index declares a
# manifest bigger than the bound (refused before it is read); in docker_archive the config
# really is that big (whitespace after valid JSON), so the seed is just over 4 MiB.
MAX_DOCUMENT_BYTES = 4 << 20
big_manifest = {"schemaVersion": 2, "manifests": [dict(index["manifests"][0], size=MAX_DOCUMENT_BYTES + 1)]}
write("oci_documents", "oversized-manifest", json.dumps(big_manifest).encode() + b"\0" + doc(manifest) + b"\0" + doc(config))
padded_cfg = cfg_l + b" " * (MAX_DOCUMENT_BYTES + 1 - len(cfg_l))
write("docker_archive", "oversized-config", archive([("config.json", padded_cfg), ("l/layer.tar", layer), ("manifest.json", dm(["l/layer.tar"]))]))

# Class 10: the only image is for another architecture (index entry and config agree).
s390x = {"architecture": "s390x", "os": "linux"}
foreign_index = {"schemaVersion": 2, "manifests": [dict(index["manifests"][0], platform=s390x)]}
write("oci_documents", "foreign-architecture", doc(foreign_index) + b"\0" + doc(manifest) + b"\0" + doc(dict(config, **s390x)))
write("docker_archive", "foreign-architecture", archive([("config.json", json.dumps(dict(json.loads(cfg_l), **s390x)).encode()), ("l/layer.tar", layer), ("manifest.json", dm(["l/layer.tar"]))]))

# Class 9: control characters that would rewrite a terminal line, in a layer media type, a
# ref name, a platform string and RepoTags.
forgery = "\r\x1b[2KOK created rootfs\n"
ctl_manifest = dict(manifest, layers=[dict(manifest["layers"][0], mediaType="application/x" + forgery)])
ctl_index = {"schemaVersion": 2, "manifests": [dict(index["manifests"][0], annotations={"org.opencontainers.image.ref.name": "evil" + forgery},
             platform={"architecture": "amd64" + forgery, "os": "linux"})]}
write("oci_documents", "control-characters", doc(ctl_index) + b"\0" + doc(ctl_manifest) + b"\0" + doc(config))
ctl_tags = json.dumps([{"Config": "config.json", "RepoTags": ["evil" + forgery], "Layers": ["l/layer.tar"]}]).encode()
write("docker_archive", "control-characters", archive([("config.json", cfg_l), ("l/layer.tar", layer), ("manifest.json", ctl_tags)]))

# Class 5: a layer that is a zstd decompression bomb: concatenated frames of RLE blocks of
# zeros (4 bytes per 128 KiB). Kept small here (64 MiB decoded); the fuzzer grows it. The
# oci_documents target's layer blob is fixed by its harness, so it has no seed of this class.
def zstd_zero_frame(blocks):
    frame = b"\x28\xb5\x2f\xfd\x00\x38"  # magic, no content size, 128 KiB window
    for i in range(blocks):
        last = 1 if i + 1 == blocks else 0
        frame += ((128 * 1024) << 3 | 1 << 1 | last).to_bytes(3, "little") + b"\0"
    return frame
bomb = zstd_zero_frame(64) * 8
write("docker_archive", "zstd-zero-frame-layer", archive([("config.json", json.dumps(dict(config, rootfs={"type": "layers", "diff_ids": [digest(bytes(64 << 20))]})).encode()), ("l/layer.tar", bomb), ("manifest.json", dm(["l/layer.tar"]))]))

# container_record: a container.json is input too (issue 20, class 8).
os.makedirs(os.path.join(HERE, "corpus", "container_record"), exist_ok=True)
record = {"id": "fuzzed", "image": "oci:///image:latest", "image_id": "sha256:" + "a" * 64,
          "layers": ["sha256:" + "b" * 64], "env": ["PATH=/bin"], "strategy": "shared-ro", "mounted": True,
          "mount_options": [], "created_unix": 0, "read_only": True,
          "bind_source": "/STORE/shared/" + "b" * 64 + "/rootfs", "lease": "/STORE/shared/" + "b" * 64 + "/users/1-2-3"}
def record_seed(name, **changes):
    r = dict(record); r.update(changes)
    write("container_record", name, json.dumps({k: v for k, v in r.items() if v is not None}).encode())
record_seed("valid", strategy="classic", read_only=False, bind_source=None, lease=None)
record_seed("shared-ro-outside-this-store")
record_seed("lease-dotdot", lease="/STORE/shared/../../victim/users/x", bind_source=None)
record_seed("bind-source-root", bind_source="/", lease=None)
record_seed("other-id", id="someone-else", bind_source=None, lease=None)
write("container_record", "empty", b"")
write("container_record", "torn", json.dumps(record).encode()[:97])
write("container_record", "garbage", b"\x00\x17{{not json")

# Class 7: a file capability (v3, rootid 0) on a layer file; class 4: a manifest whose
# layer descriptor declares far more bytes than the blob (a registry's endless body).
cap_v3 = bytes.fromhex("01000003" "00200000" "00000000" "00000000" "00000000" "00000000")
write("unpack_layer", "file-capability-v3", tar([("xattr", "bin/ping", {"SCHILY.xattr.security.capability": cap_v3.decode("latin-1")})]))
huge_layer = dict(manifest, layers=[dict(manifest["layers"][0], size=1 << 40)])
write("oci_documents", "layer-declares-a-tebibyte", doc(index) + b"\0" + doc(huge_layer) + b"\0" + doc(config))

# eStargz TOCs (the JSON a layer's index holds): one valid, one whose chunks leave a gap,
# one with a chunk past the TOC, one with a chunk's member offset near 2^64.
os.makedirs(os.path.join(HERE, "corpus", "estargz_index"), exist_ok=True)
def toc_entry(name, kind, **fields):
    e = {"name": name, "type": kind}; e.update(fields); return e
hello = digest(b"hello")
valid_toc = {"version": 1, "entries": [
    toc_entry("etc", "dir", mode=0o755),
    toc_entry("etc/hello", "reg", size=10, offset=512, digest=hello, chunkSize=5, chunkDigest=hello),
    toc_entry("etc/hello", "chunk", offset=600, chunkOffset=5, chunkSize=5, chunkDigest=hello),
    toc_entry("link", "symlink", linkName="etc/hello"),
    toc_entry(".wh.gone", "reg"),
]}
write("estargz_index", "valid", json.dumps(valid_toc).encode())
gap = json.loads(json.dumps(valid_toc)); gap["entries"][2]["chunkOffset"] = 6
write("estargz_index", "chunk-gap", json.dumps(gap).encode())
past = json.loads(json.dumps(valid_toc)); past["entries"][2]["offset"] = 1 << 31
write("estargz_index", "chunk-past-the-toc", json.dumps(past).encode())
huge = json.loads(json.dumps(valid_toc)); huge["entries"][1]["offset"] = (1 << 64) - 1
write("estargz_index", "offset-near-2-64", json.dumps(huge).encode())

# zstd:chunked manifests: one valid (a file in two chunks, the second all zeros), one
# with chunks out of order, one with a file's data past the manifest.
os.makedirs(os.path.join(HERE, "corpus", "zstd_chunked_manifest"), exist_ok=True)
valid_manifest = {"version": 1, "entries": [
    {"type": "dir", "name": "etc", "mode": 0o755},
    {"type": "reg", "name": "etc/hello", "size": 10, "digest": hello, "offset": 100, "endOffset": 300,
     "chunkSize": 5, "chunkOffset": 0, "chunkDigest": hello},
    {"type": "chunk", "name": "etc/hello", "offset": 200, "chunkSize": 5, "chunkOffset": 5,
     "chunkDigest": hello, "chunkType": "zeros"},
    {"type": "reg", "name": "one-chunk", "size": 3, "digest": hello, "offset": 300, "endOffset": 340},
    {"type": "symlink", "name": "link", "linkName": "etc/hello"},
]}
write("zstd_chunked_manifest", "valid", json.dumps(valid_manifest).encode())
swapped = json.loads(json.dumps(valid_manifest)); swapped["entries"][2]["offset"] = 50
write("zstd_chunked_manifest", "chunks-out-of-order", json.dumps(swapped).encode())
past_end = json.loads(json.dumps(valid_manifest)); past_end["entries"][3]["endOffset"] = (1 << 30) + 1
write("zstd_chunked_manifest", "data-past-the-manifest", json.dumps(past_end).encode())
