//! The node server's certificate from the cluster (`agent.rotate_server_certificates`): a
//! `kubernetes.io/kubelet-serving` CSR for the node's names and addresses, served as soon as it
//! is approved and signed, renewed at 80 % of its life. Until the first one is issued the node
//! serves its self-made certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::tls::{ServingCert, parse_pair};
use crate::agent::cluster::Cluster;
use crate::agent::cluster::csr::{self, SERVING_SIGNER};

/// The stored pairs' name (see [`csr::store`]).
pub const PREFIX: &str = "berth-serving-csr";

/// The issued pair stored in `dir`, if there is one that parses: (cert PEM, key PEM).
pub fn stored(dir: &Path) -> Option<(String, String)> {
    let (crt, key) = csr::current_files(dir, PREFIX);
    let cert = std::fs::read_to_string(crt).ok()?;
    let key = std::fs::read_to_string(key).ok()?;
    parse_pair(&cert, &key)?;
    Some((cert, key))
}

/// Keeps `serving` on a certificate the cluster signed for `names`.
pub async fn rotate(
    cluster: Arc<Cluster>,
    serving: Arc<ServingCert>,
    dir: PathBuf,
    names: Vec<String>,
) {
    let common_name = format!("system:node:{}", cluster.node_name);
    let mut failures = 0u32;
    loop {
        let due = stored(&dir)
            .and_then(|(cert, _)| csr::renew_at(&cert))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
        if !wait.is_zero() {
            tracing::info!(renew_in = ?wait, "serving certificate renewal scheduled");
            tokio::time::sleep(wait).await;
        }
        let request = csr::Request {
            signer: SERVING_SIGNER,
            common_name: &common_name,
            organizations: &["system:nodes"],
            names: &names,
            usages: &["digital signature", "key encipherment", "server auth"],
        };
        let issued = match csr::request(&cluster.client(), &request).await {
            Ok(i) => i,
            Err(e) => {
                failures += 1;
                let wait = Duration::from_secs((5u64 << failures.min(6)).min(300));
                tracing::error!(error = %e, retry_in = ?wait, "node serving certificate not obtained");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        failures = 0;
        let Some((certs, key)) = parse_pair(&issued.cert_pem, &issued.key_pem) else {
            tracing::error!("the issued serving certificate does not parse");
            tokio::time::sleep(Duration::from_secs(60)).await;
            continue;
        };
        if let Err(e) = csr::store(&dir, PREFIX, &issued) {
            tracing::error!(dir = %dir.display(), error = %e, "storing the serving certificate");
        }
        match serving.replace(certs, key) {
            Ok(()) => tracing::info!("node server: now serving the certificate the cluster signed"),
            Err(e) => {
                tracing::error!(error = %e, "node server: the issued certificate cannot be served")
            }
        }
    }
}
