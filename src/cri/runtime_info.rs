//! CRI Version, Status, RuntimeConfig and UpdateRuntimeConfig: what the runtime says about
//! itself.

use k8s_cri::v1 as cri;
use tonic::{Request, Response, Status};

use super::runtime_service::RuntimeApi;
use super::{CRI_API_VERSION, RUNTIME_NAME, RUNTIME_VERSION};
use crate::net::{NetManager, NetworkStatus};

/// The Version response for a caller speaking `api_version`.
pub fn version_for(api_version: &str) -> cri::VersionResponse {
    cri::VersionResponse {
        version: "0.1.0".into(),
        runtime_name: RUNTIME_NAME.into(),
        runtime_version: RUNTIME_VERSION.into(),
        runtime_api_version: api_version.into(),
    }
}

/// Version for v1 callers.
pub fn version_v1() -> cri::VersionResponse {
    version_for(CRI_API_VERSION)
}

/// Runtime and network conditions: NetworkReady follows the CNI conf dir (`net` None: Berth
/// runs without pod networking).
pub fn runtime_status(verbose: bool, net: Option<&NetManager>) -> cri::StatusResponse {
    let network = net.map(NetManager::status).unwrap_or(NetworkStatus {
        ready: false,
        reason: "NetworkPluginNotReady".into(),
        message: "pod networking is off in this berthd".into(),
    });
    let conditions = vec![
        cri::RuntimeCondition {
            r#type: "RuntimeReady".into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        },
        cri::RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: network.ready,
            reason: network.reason,
            message: network.message,
        },
    ];
    let mut info = std::collections::HashMap::new();
    if verbose {
        info.insert(
            "berth".into(),
            serde_json::json!({
                "version": RUNTIME_VERSION,
                "apiVersions": ["v1", "v1alpha2"],
                "cgroupDriver": crate::runtime::cgroup_driver::current().name(),
            })
            .to_string(),
        );
        if let Some(net) = net {
            let opts = net.options();
            let current = net.current().ok();
            info.insert(
                "cni".into(),
                serde_json::json!({
                    "confDir": opts.conf_dir,
                    "binDirs": opts.bin_dirs,
                    "pluginTimeoutSecs": opts.plugin_timeout.as_secs_f64(),
                    "podCIDR": net.pod_cidr(),
                    "network": current.as_ref().map(|c| c.name.clone()),
                    "file": current.as_ref().map(|c| c.source.clone()),
                    "cniVersion": current.as_ref().map(|c| c.cni_version.clone()),
                    "plugins": current.as_ref().map(|c| {
                        (0..c.plugins.len()).map(|i| c.plugin_type(i).to_string()).collect::<Vec<_>>()
                    }),
                })
                .to_string(),
            );
        }
    }
    cri::StatusResponse {
        status: Some(cri::RuntimeStatus { conditions }),
        info,
        // Berth has one handler, the default (named ""): others are refused at RunPodSandbox.
        runtime_handlers: vec![cri::RuntimeHandler {
            name: String::new(),
            features: Some(cri::RuntimeHandlerFeatures {
                recursive_read_only_mounts: recursive_read_only_mounts(),
                user_namespaces: crate::runtime::userns::supported(),
            }),
        }],
        // Merge and Strict supplemental groups, and ContainerStatus.user.
        features: Some(cri::RuntimeFeatures {
            supplemental_groups_policy: true,
        }),
    }
}

/// Whether the kernel can make a mount read-only with everything below it (`mount_setattr(2)`
/// with `AT_RECURSIVE`, Linux 5.12), which recursive read-only mounts need; asked once.
pub fn recursive_read_only_mounts() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let attr = libc::mount_attr {
            attr_set: 0,
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: a bad descriptor (-1) with an empty path and a zeroed attribute block of the
        // size passed: the kernel only validates and answers EBADF, or ENOSYS where the call
        // does not exist; nothing is changed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                -1,
                c"".as_ptr(),
                libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
                &attr as *const libc::mount_attr,
                std::mem::size_of::<libc::mount_attr>(),
            )
        };
        let errno = std::io::Error::last_os_error().raw_os_error();
        rc == 0 || errno != Some(libc::ENOSYS)
    })
}

/// RuntimeConfig: the cgroup driver berthd runs with.
pub fn cgroup_config() -> cri::RuntimeConfigResponse {
    cri::RuntimeConfigResponse {
        linux: Some(cri::LinuxRuntimeConfiguration {
            cgroup_driver: crate::runtime::cgroup_driver::current().cri() as i32,
        }),
    }
}

pub(super) async fn version(
    _api: &RuntimeApi,
    _request: Request<cri::VersionRequest>,
) -> Result<Response<cri::VersionResponse>, Status> {
    Ok(Response::new(version_v1()))
}

pub(super) async fn status(
    api: &RuntimeApi,
    request: Request<cri::StatusRequest>,
) -> Result<Response<cri::StatusResponse>, Status> {
    let verbose = request.get_ref().verbose;
    let mut resp = runtime_status(verbose, api.sandboxes.network().map(|n| n.as_ref()));
    if verbose {
        let pulls: Vec<serde_json::Value> = api
            .images
            .pulls_in_progress()
            .into_iter()
            .map(|(image, layers)| serde_json::json!({ "image": image, "layers": layers }))
            .collect();
        // An object, not an array: crictl only pretty-prints values that start with `{`.
        resp.info.insert(
            "pulls".into(),
            serde_json::json!({ "inProgress": pulls }).to_string(),
        );
        resp.info.insert(
            "events".into(),
            serde_json::json!({ "subscribers": api.containers.events().subscribers() }).to_string(),
        );
    }
    Ok(Response::new(resp))
}

pub(super) async fn runtime_config(
    _api: &RuntimeApi,
    _request: Request<cri::RuntimeConfigRequest>,
) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
    Ok(Response::new(cgroup_config()))
}

pub(super) async fn update_runtime_config(
    api: &RuntimeApi,
    request: Request<cri::UpdateRuntimeConfigRequest>,
) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
    // The pod CIDR is kept and offered to plugins that ask for the ipRanges capability.
    let cidr = request
        .get_ref()
        .runtime_config
        .as_ref()
        .and_then(|c| c.network_config.as_ref())
        .map(|n| n.pod_cidr.clone())
        .unwrap_or_default();
    if let Some(net) = api.sandboxes.network()
        && !cidr.is_empty()
    {
        net.set_pod_cidr(&cidr);
    }
    Ok(Response::new(cri::UpdateRuntimeConfigResponse {}))
}
