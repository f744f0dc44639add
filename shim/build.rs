//! Generates the shim API messages from proto/shim.proto (messages only, no gRPC).

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=../proto/shim.proto");
    prost_build::Config::new().compile_protos(&["../proto/shim.proto"], &["../proto"])
}
