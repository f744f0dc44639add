//! TLS bootstrap and client certificate rotation, as the kubelet's: a node given only a
//! bootstrap token asks for its client certificate (`system:node:<name>`) with a
//! CertificateSigningRequest, which the controller manager approves and signs; the certificate
//! and a kubeconfig that uses it are written, and the certificate is renewed at 80 % of its life.
//!
//! The key and certificate live in `<cert dir>/berth-client-<time>/` and the symlink
//! `berth-client-current` names the pair in use, so a renewal switches both at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::config::{AuthInfo, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};

use super::Cluster;
use super::csr::{self, CLIENT_SIGNER};
use super::kubeconfig::{self, KubeconfigError};

/// The stored pairs' name (see [`csr::store`]).
pub const PREFIX: &str = "berth-client";

/// Why the node could not get its credentials.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    #[error("bootstrap kubeconfig {path}: no cluster in its current context")]
    NoCluster { path: PathBuf },
    #[error("writing the node's credentials in {dir}: {error}")]
    Write { dir: PathBuf, error: std::io::Error },
    #[error("writing kubeconfig {path}: {error}")]
    WriteKubeconfig { path: PathBuf, error: String },
}

/// The credentials files under `cert_dir` in use.
pub fn current_files(cert_dir: &Path) -> (PathBuf, PathBuf) {
    csr::current_files(cert_dir, PREFIX)
}

/// Stores a new key and certificate as the ones in use.
fn install(cert_dir: &Path, issued: &csr::Issued) -> Result<(), BootstrapError> {
    csr::store(cert_dir, PREFIX, issued).map_err(|error| BootstrapError::Write {
        dir: cert_dir.to_path_buf(),
        error,
    })
}

/// Asks for a client certificate with `client` until one is issued (a denial or failure is
/// logged and asked again after a back-off from 5 s to 5 min).
async fn obtain(client: &kube::Client, node: &str) -> csr::Issued {
    let common_name = format!("system:node:{node}");
    let mut failures = 0u32;
    loop {
        let request = csr::Request {
            signer: CLIENT_SIGNER,
            common_name: &common_name,
            organizations: &["system:nodes"],
            names: &[],
            usages: &["digital signature", "key encipherment", "client auth"],
        };
        match csr::request(client, &request).await {
            Ok(issued) => return issued,
            Err(e) => {
                failures += 1;
                let wait = Duration::from_secs((5u64 << failures.min(6)).min(300));
                tracing::error!(error = %e, retry_in = ?wait, "node client certificate not obtained");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// With no kubeconfig at `kubeconfig` yet: obtains the node's client certificate with the
/// bootstrap kubeconfig and writes the kubeconfig that uses it (nothing is written before the
/// certificate is there).
pub async fn bootstrap(
    bootstrap: &Path,
    kubeconfig: &Path,
    cert_dir: &Path,
    node: &str,
) -> Result<(), BootstrapError> {
    let loaded = kubeconfig::load(bootstrap).await?;
    let client = kube::Client::try_from(loaded.config).map_err(|e| KubeconfigError::Invalid {
        path: bootstrap.to_path_buf(),
        error: e.to_string(),
    })?;
    let cluster = bootstrap_cluster(bootstrap)?;
    tracing::info!(bootstrap = %bootstrap.display(), identity = %loaded.identity, "TLS bootstrap: asking for the node's client certificate");
    let issued = obtain(&client, node).await;
    install(cert_dir, &issued)?;
    let (crt, key) = current_files(cert_dir);
    let kc = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(cluster),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(crt.display().to_string()),
                client_key: Some(key.display().to_string()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("default-context".into()),
        ..Default::default()
    };
    let text = serde_yaml_ng::to_string(&kc).map_err(|e| BootstrapError::WriteKubeconfig {
        path: kubeconfig.to_path_buf(),
        error: e.to_string(),
    })?;
    crate::util::write_atomic(kubeconfig, text.as_bytes(), 0o600).map_err(|e| {
        BootstrapError::WriteKubeconfig {
            path: kubeconfig.to_path_buf(),
            error: e.to_string(),
        }
    })?;
    tracing::info!(kubeconfig = %kubeconfig.display(), "TLS bootstrap done: kubeconfig written");
    Ok(())
}

/// The API server of the bootstrap kubeconfig's current context, with a relative CA path made
/// absolute (the new kubeconfig lives elsewhere).
fn bootstrap_cluster(path: &Path) -> Result<kube::config::Cluster, BootstrapError> {
    let kc = Kubeconfig::read_from(path).map_err(|e| KubeconfigError::Read {
        path: path.to_path_buf(),
        error: e.to_string(),
    })?;
    let context = kc
        .current_context
        .clone()
        .or_else(|| kc.contexts.first().map(|c| c.name.clone()))
        .unwrap_or_default();
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .unwrap_or_default();
    let mut cluster = kc
        .clusters
        .into_iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster)
        .ok_or_else(|| BootstrapError::NoCluster {
            path: path.to_path_buf(),
        })?;
    if let Some(ca) = &cluster.certificate_authority
        && Path::new(ca).is_relative()
    {
        let base = path.parent().unwrap_or(Path::new("."));
        cluster.certificate_authority = Some(base.join(ca).display().to_string());
    }
    Ok(cluster)
}

/// Renews the node's client certificate at 80 % of its life, for as long as the kubeconfig at
/// `kubeconfig` uses the credentials in `cert_dir` (those the bootstrap wrote). A certificate
/// that has already expired (the node was off too long) is renewed with the bootstrap
/// kubeconfig, when there is one, as the kubelet does.
pub async fn rotate(
    cluster: Arc<Cluster>,
    kubeconfig: PathBuf,
    cert_dir: PathBuf,
    bootstrap: Option<PathBuf>,
) {
    let (crt, _) = current_files(&cert_dir);
    loop {
        let pem = match tokio::fs::read_to_string(&crt).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(cert = %crt.display(), error = %e, "client certificate rotation: cannot read the certificate; rotation stopped");
                return;
            }
        };
        let Some(at) = csr::renew_at(&pem) else {
            tracing::warn!(cert = %crt.display(), "client certificate rotation: the certificate does not parse; rotation stopped");
            return;
        };
        let wait = at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        tracing::info!(renew_in = ?wait, "client certificate rotation scheduled");
        tokio::time::sleep(wait).await;
        let client = match (&bootstrap, csr::expired(&pem)) {
            (Some(b), true) => match Cluster::client_from(b).await {
                Ok(c) => {
                    tracing::warn!(bootstrap = %b.display(), "the node's client certificate has expired: renewing it with the bootstrap kubeconfig");
                    c
                }
                Err(e) => {
                    tracing::error!(error = %e, "the node's client certificate has expired and the bootstrap kubeconfig is unusable");
                    cluster.client()
                }
            },
            _ => cluster.client(),
        };
        let issued = obtain(&client, &cluster.node_name).await;
        if let Err(e) = install(&cert_dir, &issued) {
            tracing::error!(error = %e, "client certificate rotation: the new certificate could not be stored");
            tokio::time::sleep(Duration::from_secs(60)).await;
            continue;
        }
        match Cluster::client_from(&kubeconfig).await {
            Ok(client) => {
                cluster.replace_client(client);
                tracing::info!("client certificate renewed; new requests use it");
            }
            Err(e) => {
                tracing::error!(error = %e, "client certificate rotation: kubeconfig no longer loads")
            }
        }
    }
}

/// Whether the kubeconfig at `path` uses the bootstrap-written credentials in `cert_dir`.
pub fn uses_rotated_credentials(path: &Path, cert_dir: &Path) -> bool {
    let (crt, _) = current_files(cert_dir);
    Kubeconfig::read_from(path).is_ok_and(|kc| {
        kc.auth_infos.iter().any(|a| {
            a.auth_info
                .as_ref()
                .and_then(|i| i.client_certificate.as_deref())
                .is_some_and(|c| Path::new(c) == crt)
        })
    })
}
