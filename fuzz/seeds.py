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
