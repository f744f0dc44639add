//! Generates Berth's own protobuf code: the shim API (proto/shim.proto, messages only) and the
//! image archive service (proto/archive.proto, a tonic service and client) and the device plugin
//! API, the plugin registration API and the pod resources API (proto/deviceplugin.proto,
//! proto/pluginregistration.proto, proto/podresources.proto, services and clients both ways).

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto/shim.proto");
    println!("cargo:rerun-if-changed=proto/archive.proto");
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    println!("cargo:rerun-if-changed=proto/pluginregistration.proto");
    println!("cargo:rerun-if-changed=proto/podresources.proto");
    prost_build::Config::new().compile_protos(&["proto/shim.proto"], &["proto"])?;
    tonic_prost_build::configure()
        .bytes(".berth.images.v1")
        .compile_protos(&["proto/archive.proto"], &["proto"])?;
    tonic_prost_build::configure().compile_protos(
        &[
            "proto/deviceplugin.proto",
            "proto/pluginregistration.proto",
            "proto/podresources.proto",
        ],
        &["proto"],
    )
}
