//! Generates Berth's own protobuf messages: the shim API (proto/shim.proto), messages only.

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto/shim.proto");
    prost_build::Config::new().compile_protos(&["proto/shim.proto"], &["proto"])
}
