//! Generates containerd's snapshots service (server and client) from the vendored
//! `proto/` files with protoc (Debian's `protobuf-compiler`; the well-known types come
//! from `libprotobuf-dev`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/snapshots.proto"], &["proto"])?;
    Ok(())
}
