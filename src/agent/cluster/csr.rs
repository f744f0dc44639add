//! Certificates from the cluster's signers: a key made on the node, a CertificateSigningRequest
//! for it, and the wait until it is approved and signed (or denied).

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rustls::pki_types::pem::PemObject;

/// The kubelet's client certificate signer.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The kubelet's serving certificate signer.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// How often the request is looked at while it waits.
const POLL: Duration = Duration::from_millis(500);
/// How long one request may wait for approval before it is given up (and made again).
const WAIT: Duration = Duration::from_secs(900);

/// Why no certificate came.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// The key or the request could not be made.
    #[error("making the certificate request: {0}")]
    Make(String),
    /// The API server refused or failed a request.
    #[error("certificate request {name}: {error}")]
    Api { name: String, error: kube::Error },
    /// An approver denied it.
    #[error("certificate request {name} was denied: {reason}: {message}")]
    Denied {
        name: String,
        reason: String,
        message: String,
    },
    /// The signer failed it.
    #[error("certificate request {name} failed: {reason}: {message}")]
    Failed {
        name: String,
        reason: String,
        message: String,
    },
    /// Nobody approved it in time.
    #[error("certificate request {name} was not approved within {0:?}", WAIT)]
    NotApproved { name: String },
    /// What the signer issued is not a PEM certificate.
    #[error("certificate request {name}: the issued certificate is not PEM")]
    BadCertificate { name: String },
}

/// A signed certificate and its key, as PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What to ask for.
pub struct Request<'a> {
    pub signer: &'a str,
    pub common_name: &'a str,
    pub organizations: &'a [&'a str],
    /// DNS names and IP addresses (serving certificates).
    pub names: &'a [String],
    pub usages: &'a [&'a str],
}

/// Makes a key, sends the request with `client` and waits for the certificate.
pub async fn request(client: &kube::Client, req: &Request<'_>) -> Result<Issued, CsrError> {
    let key = rcgen::KeyPair::generate().map_err(|e| CsrError::Make(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(req.names.to_vec())
        .map_err(|e| CsrError::Make(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    for o in req.organizations {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *o);
    }
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, req.common_name);
    let csr = params
        .serialize_request(&key)
        .map_err(|e| CsrError::Make(e.to_string()))?;
    let pem = csr.pem().map_err(|e| CsrError::Make(e.to_string()))?;
    let object = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.into_bytes()),
            signer_name: req.signer.to_string(),
            usages: Some(req.usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let api: kube::Api<CertificateSigningRequest> = kube::Api::all(client.clone());
    let made = api
        .create(&Default::default(), &object)
        .await
        .map_err(|error| CsrError::Api {
            name: format!("for {}", req.common_name),
            error,
        })?;
    let name = made.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, signer = req.signer, subject = req.common_name, "certificate requested; waiting for approval");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = api.get(&name).await.map_err(|error| CsrError::Api {
            name: name.clone(),
            error,
        })?;
        let status = now.status.unwrap_or_default();
        for c in status.conditions.iter().flatten() {
            if c.status != "True" {
                continue;
            }
            let (reason, message) = (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            );
            match c.type_.as_str() {
                "Denied" => {
                    return Err(CsrError::Denied {
                        name,
                        reason,
                        message,
                    });
                }
                "Failed" => {
                    return Err(CsrError::Failed {
                        name,
                        reason,
                        message,
                    });
                }
                _ => {}
            }
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            let cert_pem = String::from_utf8(cert.0)
                .map_err(|_| CsrError::BadCertificate { name: name.clone() })?;
            if !cert_pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(CsrError::BadCertificate { name });
            }
            tracing::info!(csr = %name, "certificate issued");
            return Ok(Issued {
                cert_pem,
                key_pem: key.serialize_pem(),
            });
        }
        if tokio::time::Instant::now() > deadline {
            return Err(CsrError::NotApproved { name });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The key and certificate files in use of the pairs stored as `prefix`: each pair lives in
/// `<dir>/<prefix>-<time>/` and the symlink `<dir>/<prefix>-current` names the one in use, so
/// a renewal switches key and certificate at once.
pub fn current_files(dir: &Path, prefix: &str) -> (PathBuf, PathBuf) {
    let current = dir.join(format!("{prefix}-current"));
    (current.join("tls.crt"), current.join("tls.key"))
}

/// Stores `issued` as the pair in use of `prefix` (see [`current_files`]) and removes the
/// pairs it replaces.
pub fn store(dir: &Path, prefix: &str, issued: &Issued) -> std::io::Result<()> {
    let name = format!("{prefix}-{}", crate::util::unix_nanos_now());
    let pair = dir.join(&name);
    std::fs::create_dir_all(&pair)?;
    crate::util::write_atomic(&pair.join("tls.key"), issued.key_pem.as_bytes(), 0o600)?;
    crate::util::write_atomic(&pair.join("tls.crt"), issued.cert_pem.as_bytes(), 0o644)?;
    let current = format!("{prefix}-current");
    let link = dir.join(format!(".{current}.tmp"));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&name, &link)?;
    std::fs::rename(&link, dir.join(&current))?;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&format!("{prefix}-")) && n != name && n != current {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(())
}

/// Whether a certificate's validity has ended (true if it does not parse).
pub fn expired(cert_pem: &str) -> bool {
    let Ok(der) = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()) else {
        return true;
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        return true;
    };
    let now = crate::util::unix_now();
    cert.validity().not_after.timestamp() <= now
}

/// When a certificate should be renewed: at 80 % of its life (None if it does not parse).
pub fn renew_at(cert_pem: &str) -> Option<std::time::SystemTime> {
    let der = rustls::pki_types::CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let from = cert.validity().not_before.timestamp();
    let to = cert.validity().not_after.timestamp();
    let at = from + (to - from) * 4 / 5;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(at).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_at_four_fifths_of_the_life() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        let start = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        params.not_before = start.into();
        params.not_after = (start + Duration::from_secs(1000)).into();
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(
            renew_at(&cert.pem()),
            Some(start + Duration::from_secs(800))
        );
        assert_eq!(renew_at("not a certificate"), None);
    }

    #[test]
    fn a_stored_pair_replaces_the_one_before() {
        let dir = std::env::temp_dir().join(format!("berth-csr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pair = |n: &str| Issued {
            cert_pem: format!("cert {n}"),
            key_pem: format!("key {n}"),
        };
        store(&dir, "p", &pair("1")).expect("first");
        store(&dir, "p", &pair("2")).expect("second");
        let (crt, key) = current_files(&dir, "p");
        assert_eq!(std::fs::read_to_string(crt).expect("crt"), "cert 2");
        assert_eq!(std::fs::read_to_string(key).expect("key"), "key 2");
        let left: Vec<_> = std::fs::read_dir(&dir).expect("dir").flatten().collect();
        assert_eq!(left.len(), 2, "the current pair and its link: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
