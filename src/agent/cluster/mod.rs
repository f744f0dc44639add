//! The agent as a node of a Kubernetes cluster: the API server connection (kube-rs), who it
//! authenticates as, and the retry rhythm its requests share. The node's Node and Lease live
//! in `node/`, pods from the API server in `sources/api.rs`, their status in
//! `pods/status_manager.rs`.

pub mod bootstrap;
pub mod csr;
pub mod events;
pub mod kubeconfig;
pub mod objects;

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

pub use kubeconfig::KubeconfigError;

/// The connection to the API server and the node's place there.
pub struct Cluster {
    /// The client (its credentials from the kubeconfig; replaced when they are renewed).
    client: std::sync::RwLock<kube::Client>,
    /// Who the requests come from, for log lines.
    pub identity: String,
    /// This node's name.
    pub node_name: String,
    /// The Node's UID once registered (owner of the Lease and of mirror pods).
    node_uid: OnceLock<String>,
    /// The configMaps and secrets the node's pods use, each kept by a watch.
    pub objects: objects::ObjectCache,
}

impl Cluster {
    /// Reads the kubeconfig at `path` and makes the client (nothing is sent yet).
    pub async fn connect(path: &Path, node_name: &str) -> Result<Self, KubeconfigError> {
        let loaded = kubeconfig::load(path).await?;
        let identity = loaded.identity.clone();
        let client = client_of(path, loaded)?;
        Ok(Self {
            client: std::sync::RwLock::new(client),
            identity,
            node_name: node_name.to_string(),
            node_uid: OnceLock::new(),
            objects: objects::ObjectCache::default(),
        })
    }

    /// The client requests go through now.
    pub fn client(&self) -> kube::Client {
        self.client
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Makes later requests use `client` (renewed credentials).
    pub fn replace_client(&self, client: kube::Client) {
        match self.client.write() {
            Ok(mut c) => *c = client,
            Err(e) => *e.into_inner() = client,
        }
    }

    /// A client from the kubeconfig at `path`.
    pub async fn client_from(path: &Path) -> Result<kube::Client, KubeconfigError> {
        client_of(path, kubeconfig::load(path).await?)
    }

    /// The Node's UID, once the node is registered.
    pub fn node_uid(&self) -> Option<&str> {
        self.node_uid.get().map(String::as_str)
    }

    /// Records the Node's UID (the first registration's stays).
    pub fn set_node_uid(&self, uid: String) {
        let _ = self.node_uid.set(uid);
    }

    /// Logs a failed request: refused credentials name the identity, as an operator needs to
    /// fix them; other failures are warnings with the API server's answer.
    pub fn log_failure(&self, request: &str, error: &kube::Error) {
        match status_code(error) {
            Some(401) => tracing::error!(
                request,
                identity = %self.identity,
                error = %error,
                "the API server refused the node's credentials (401 Unauthorized)"
            ),
            Some(403) => tracing::error!(
                request,
                identity = %self.identity,
                error = %error,
                "the API server forbids this request to the node (403 Forbidden)"
            ),
            _ => tracing::warn!(request, error = %error, "API request failed"),
        }
    }
}

fn client_of(path: &Path, loaded: kubeconfig::Loaded) -> Result<kube::Client, KubeconfigError> {
    kube::Client::try_from(loaded.config).map_err(|e| KubeconfigError::Invalid {
        path: path.to_path_buf(),
        error: e.to_string(),
    })
}

/// The HTTP status of an error the API server answered with.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// How long to wait before trying again after `failures` failures in a row: from 200 ms
/// doubling to 7 s, as the kubelet's lease controller.
pub fn retry_delay(failures: u32) -> Duration {
    let ms = 200u64.saturating_mul(1u64 << failures.saturating_sub(1).min(10));
    Duration::from_millis(ms.min(7000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_from_200_ms_to_7_s() {
        let ms: Vec<u128> = (1..=7).map(|n| retry_delay(n).as_millis()).collect();
        assert_eq!(ms, [200, 400, 800, 1600, 3200, 6400, 7000]);
        assert_eq!(retry_delay(100).as_millis(), 7000);
        assert_eq!(retry_delay(0).as_millis(), 200);
    }
}
