//! Version, Status and RuntimeConfig: what the runtime says about itself.

use k8s_cri::v1 as cri;

use super::{CRI_API_VERSION, RUNTIME_NAME, RUNTIME_VERSION};

/// The Version response for a caller speaking `api_version`.
pub fn version(api_version: &str) -> cri::VersionResponse {
    cri::VersionResponse {
        version: "0.1.0".into(),
        runtime_name: RUNTIME_NAME.into(),
        runtime_version: RUNTIME_VERSION.into(),
        runtime_api_version: api_version.into(),
    }
}

/// Version for v1 callers.
pub fn version_v1() -> cri::VersionResponse {
    version(CRI_API_VERSION)
}

/// Runtime and network conditions, honestly: containers and pod networking are not built yet.
pub fn status(verbose: bool) -> cri::StatusResponse {
    let conditions = vec![
        cri::RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        },
        cri::RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: "Berth has no pod network yet: CNI support is not built in this version"
                .into(),
        },
    ];
    let mut info = std::collections::HashMap::new();
    if verbose {
        info.insert(
            "berth".into(),
            serde_json::json!({ "version": RUNTIME_VERSION, "apiVersions": ["v1", "v1alpha2"] })
                .to_string(),
        );
    }
    cri::StatusResponse {
        status: Some(cri::RuntimeStatus { conditions }),
        info,
        runtime_handlers: vec![cri::RuntimeHandler {
            name: String::new(),
            features: Some(cri::RuntimeHandlerFeatures {
                recursive_read_only_mounts: false,
                user_namespaces: false,
            }),
        }],
        features: None,
    }
}

/// RuntimeConfig: Berth drives cgroups through cgroupfs.
pub fn runtime_config() -> cri::RuntimeConfigResponse {
    cri::RuntimeConfigResponse {
        linux: Some(cri::LinuxRuntimeConfiguration {
            cgroup_driver: cri::CgroupDriver::Cgroupfs as i32,
        }),
    }
}
