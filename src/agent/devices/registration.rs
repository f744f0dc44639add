//! The Registration service device plugins call on `kubelet.sock` in the device plugin
//! directory: each names its API version, its socket (a file in that directory) and its
//! resource, and the agent then connects to it.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::DeviceManager;
use super::api::registration_server::{Registration, RegistrationServer};
use super::api::{Empty, RegisterRequest};
use crate::agent::runtime::resources::is_extended_resource;

/// The registration socket's name in the device plugin directory.
pub const SOCKET_NAME: &str = "kubelet.sock";

/// The file a kubelet makes in the directory to say it discovers device plugins through its
/// plugin registry instead of their Register calls.
pub const WATCHER_MARK: &str = "DEPRECATION";

/// The API versions the agent speaks.
pub const VERSIONS: [&str; 1] = ["v1beta1"];

struct Registrar {
    manager: Arc<DeviceManager>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        check(&request).map_err(|why| {
            tracing::warn!(resource = %request.resource_name, endpoint = %request.endpoint, %why, "device plugin registration refused");
            Status::invalid_argument(why)
        })?;
        tracing::info!(resource = %request.resource_name, endpoint = %request.endpoint, "device plugin registered");
        // The plugin waits for this answer before it serves: connect after it.
        let manager = self.manager.clone();
        tokio::spawn(async move {
            let socket = manager.dir().join(&request.endpoint);
            if let Err(e) = manager
                .attach(
                    &request.resource_name,
                    &socket,
                    Some(request.options.unwrap_or_default()),
                )
                .await
            {
                tracing::warn!(error = %e, "device plugin not attached");
            }
        });
        Ok(Response::new(Empty {}))
    }
}

/// Why a registration is refused, if it is.
fn check(r: &RegisterRequest) -> Result<(), String> {
    check_plugin(&r.resource_name, std::slice::from_ref(&r.version))?;
    let plain = !r.endpoint.is_empty()
        && !r.endpoint.contains('/')
        && r.endpoint != "."
        && r.endpoint != ".."
        && r.endpoint != SOCKET_NAME;
    if !plain {
        return Err(format!(
            "device plugin {:?}: endpoint {:?} must name a socket file in the device plugin directory",
            r.resource_name, r.endpoint
        ));
    }
    Ok(())
}

/// Why a device plugin for `resource` speaking `versions` is refused, if it is (whichever way
/// it registers).
pub fn check_plugin(resource: &str, versions: &[String]) -> Result<(), String> {
    if !versions.iter().any(|v| VERSIONS.contains(&v.as_str())) {
        return Err(format!(
            "device plugin {resource:?}: API versions {versions:?} are not supported (supported: {})",
            VERSIONS.join(", ")
        ));
    }
    if !is_extended_resource(resource)
        || resource.split('/').count() != 2
        || resource.split('/').any(str::is_empty)
    {
        return Err(format!(
            "device plugin resource {resource:?} is not an extended resource name (domain/name outside kubernetes.io)"
        ));
    }
    Ok(())
}

/// Serves the Registration service on `kubelet.sock` in the manager's directory until berthd
/// ends; a socket left by an earlier run is replaced, one something still serves (a kubelet,
/// another berthd's agent) is left to it. With `registry_watched`, the directory gets the
/// kubelet's `DEPRECATION` file, as a kubelet that watches its plugin registry leaves it;
/// without, a file left by a kubelet is removed, since plugins that see it do not register.
pub async fn serve(manager: Arc<DeviceManager>, registry_watched: bool) {
    let dir = manager.dir().to_path_buf();
    let socket = dir.join(SOCKET_NAME);
    let listener = match crate::agent::grpc_socket::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(socket = %socket.display(), error = %e, "device plugin registration not served (set agent.device_plugin_dir)");
            return;
        }
    };
    mark_registry(&dir, registry_watched);
    tracing::info!(socket = %socket.display(), "serving device plugin registration");
    let routes = tonic::service::Routes::new(RegistrationServer::new(Registrar { manager }));
    crate::agent::grpc_socket::serve(listener, routes, "device plugin registration").await;
}

/// Makes or removes the `DEPRECATION` file that tells plugins to wait to be found in the
/// plugin registry instead of calling Register.
fn mark_registry(dir: &std::path::Path, registry_watched: bool) {
    let mark = dir.join(WATCHER_MARK);
    let done = if registry_watched {
        std::fs::write(&mark, b"")
    } else {
        match std::fs::remove_file(&mark) {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "removed a kubelet's {WATCHER_MARK} file: plugins register on {SOCKET_NAME}");
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    };
    if let Err(e) = done {
        tracing::warn!(file = %mark.display(), error = %e, "device plugin {WATCHER_MARK} file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: &str, endpoint: &str, resource: &str) -> RegisterRequest {
        RegisterRequest {
            version: version.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        }
    }

    #[test]
    fn registrations_name_a_version_a_socket_of_the_directory_and_an_extended_resource() {
        assert!(check(&request("v1beta1", "dp.sock", "example.com/gpu")).is_ok());
        let refused = [
            request("v1alpha", "dp.sock", "example.com/gpu"),
            request("v1beta1", "../../run/x.sock", "example.com/gpu"),
            request("v1beta1", "/run/x.sock", "example.com/gpu"),
            request("v1beta1", "", "example.com/gpu"),
            request("v1beta1", "kubelet.sock", "example.com/gpu"),
            request("v1beta1", "dp.sock", "gpu"),
            request("v1beta1", "dp.sock", "kubernetes.io/gpu"),
            request("v1beta1", "dp.sock", "example.com/"),
            request("v1beta1", "dp.sock", "example.com/a/b"),
        ];
        for r in refused {
            let why = check(&r).expect_err("refused");
            assert!(why.contains(&format!("{:?}", r.resource_name)), "{why}");
        }
    }
}
