//! Generates Berth's own protobuf code: the shim API (proto/shim.proto, messages only) and the
//! image archive service (proto/archive.proto, a tonic service and client).

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto/shim.proto");
    println!("cargo:rerun-if-changed=proto/archive.proto");
    prost_build::Config::new().compile_protos(&["proto/shim.proto"], &["proto"])?;
    tonic_prost_build::configure()
        .bytes(".berth.images.v1")
        .compile_protos(&["proto/archive.proto"], &["proto"])
}
