//! The node server's TLS: its serving certificate (from files, or made once for the node's names
//! and addresses and kept in the agent's PKI directory), client certificates checked against the
//! client CA, and the identity a verified client certificate names.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the node server's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read or is not PEM.
    #[error("node server TLS: {path}: {error}")]
    File { path: PathBuf, error: String },
    /// A self-signed serving certificate could not be made or stored.
    #[error("node server TLS: making a serving certificate in {dir}: {error}")]
    SelfSigned { dir: PathBuf, error: String },
    /// rustls refused the configuration.
    #[error("node server TLS: {0}")]
    Config(String),
}

/// Where the serving certificate comes from.
pub struct ServingSource {
    /// Certificate and key files given by the operator.
    pub files: Option<(PathBuf, PathBuf)>,
    /// Directory for a self-made certificate (`berth-serving.crt`, `berth-serving.key`).
    pub pki_dir: PathBuf,
    /// The node's name (and host name) and addresses, for a self-made certificate.
    pub names: Vec<String>,
}

/// Reads the PEM certificate chain at `path`.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::File {
            path: path.to_path_buf(),
            error: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::File {
            path: path.to_path_buf(),
            error: "no certificate in the file".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        path: path.to_path_buf(),
        error: e.to_string(),
    })
}

/// The serving certificate and key: the operator's files, or the self-made pair in `pki_dir`
/// (made on first use; made again when its names no longer match the node's).
pub fn serving_certificate(
    src: &ServingSource,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    if let Some((cert, key)) = &src.files {
        return Ok((read_certs(cert)?, read_key(key)?));
    }
    let crt = src.pki_dir.join("berth-serving.crt");
    let key = src.pki_dir.join("berth-serving.key");
    let names_file = src.pki_dir.join("berth-serving.names");
    let wanted = src.names.join(",");
    let current = std::fs::read_to_string(&names_file).unwrap_or_default();
    if current.trim() == wanted
        && let (Ok(c), Ok(k)) = (read_certs(&crt), read_key(&key))
    {
        return Ok((c, k));
    }
    let err = |error: String| TlsError::SelfSigned {
        dir: src.pki_dir.clone(),
        error,
    };
    let key_pair = rcgen::KeyPair::generate().map_err(|e| err(e.to_string()))?;
    let mut params =
        rcgen::CertificateParams::new(src.names.clone()).map_err(|e| err(e.to_string()))?;
    let host = src.names.first().cloned().unwrap_or_default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{host}@berth"));
    let now = std::time::SystemTime::now();
    params.not_before = now.into();
    params.not_after = (now + std::time::Duration::from_secs(365 * 24 * 3600)).into();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .self_signed(&key_pair)
        .map_err(|e| err(e.to_string()))?;
    std::fs::create_dir_all(&src.pki_dir).map_err(|e| err(e.to_string()))?;
    crate::util::write_atomic(&key, key_pair.serialize_pem().as_bytes(), 0o600)
        .map_err(|e| err(e.to_string()))?;
    crate::util::write_atomic(&crt, cert.pem().as_bytes(), 0o644)
        .map_err(|e| err(e.to_string()))?;
    crate::util::write_atomic(&names_file, wanted.as_bytes(), 0o644)
        .map_err(|e| err(e.to_string()))?;
    tracing::info!(cert = %crt.display(), names = %wanted, "node server: made a self-signed serving certificate");
    Ok((
        vec![cert.der().clone()],
        PrivateKeyDer::try_from(key_pair.serialize_der()).map_err(|e| err(e.to_string()))?,
    ))
}

/// Client certificates as the kubelet takes them: asked for but not required, and not judged
/// during the handshake (beyond the proof that the client holds the key), so a certificate from
/// another CA or an expired one gets an HTTP 401 from the authenticator rather than a TLS alert.
#[derive(Debug)]
struct RequestedClientCert {
    ca: Arc<dyn rustls::server::danger::ClientCertVerifier>,
}

impl rustls::server::danger::ClientCertVerifier for RequestedClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.ca.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.ca.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.ca.supported_verify_schemes()
    }
}

/// Checks client certificate chains against the client CA.
#[derive(Clone)]
pub struct ClientCa(Arc<dyn rustls::server::danger::ClientCertVerifier>);

impl ClientCa {
    /// The CA bundle at `path`.
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in read_certs(path)? {
            roots.add(c).map_err(|e| TlsError::File {
                path: path.to_path_buf(),
                error: e.to_string(),
            })?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
        Ok(Self(verifier))
    }

    /// The user and groups of a presented chain, or why it is not accepted (another CA,
    /// expired, not for client authentication).
    pub fn identify(&self, chain: &[CertificateDer<'_>]) -> Result<(String, Vec<String>), String> {
        let (leaf, intermediates) = chain.split_first().ok_or("no certificate")?;
        self.0
            .verify_client_cert(leaf, intermediates, rustls::pki_types::UnixTime::now())
            .map_err(|e| e.to_string())?;
        certificate_identity(leaf).ok_or_else(|| "the certificate names no user".to_string())
    }
}

/// The serving certificate in use; replaced in place when a new one is issued, so connections
/// after that get it without a restart.
#[derive(Debug)]
pub struct ServingCert(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

fn certified(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    Ok(Arc::new(rustls::sign::CertifiedKey::new(certs, signing)))
}

impl ServingCert {
    pub fn new(
        certs: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Arc<Self>, TlsError> {
        Ok(Arc::new(Self(std::sync::RwLock::new(certified(
            certs, key,
        )?))))
    }

    /// Serves `certs` and `key` from now on.
    pub fn replace(
        &self,
        certs: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<(), TlsError> {
        let new = certified(certs, key)?;
        match self.0.write() {
            Ok(mut c) => *c = new,
            Err(e) => *e.into_inner() = new,
        }
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for ServingCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(match self.0.read() {
            Ok(c) => c.clone(),
            Err(e) => e.into_inner().clone(),
        })
    }
}

/// Reads a PEM certificate chain and key from memory.
pub fn parse_pair(
    cert_pem: &str,
    key_pem: &str,
) -> Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|c| !c.is_empty())?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).ok()?;
    Some((certs, key))
}

/// The TLS acceptor: the serving certificate, and client certificates requested when there is a
/// client CA to check them against (clients may authenticate with a bearer token instead).
pub fn acceptor(
    serving: Arc<ServingCert>,
    client_ca: Option<&ClientCa>,
) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            builder.with_client_cert_verifier(Arc::new(RequestedClientCert { ca: ca.0.clone() }))
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(serving);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Who a client certificate says its holder is: the subject's common name and organizations,
/// as Kubernetes reads them (user and groups).
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Option<(String, Vec<String>)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((user, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificates_subject_gives_user_and_groups() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(
            certificate_identity(cert.der()),
            Some(("system:node:n1".into(), vec!["system:nodes".into()]))
        );
        assert_eq!(
            certificate_identity(&CertificateDer::from(vec![1, 2, 3])),
            None
        );
    }

    #[test]
    fn a_self_made_certificate_is_kept_until_the_names_change() {
        let dir = std::env::temp_dir().join(format!("berth-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let src = |names: &[&str]| ServingSource {
            files: None,
            pki_dir: dir.clone(),
            names: names.iter().map(|s| s.to_string()).collect(),
        };
        let (a, _) = serving_certificate(&src(&["n1", "127.0.0.1"])).expect("first");
        let (b, _) = serving_certificate(&src(&["n1", "127.0.0.1"])).expect("again");
        assert_eq!(a, b, "the stored certificate is used again");
        let (c, _) = serving_certificate(&src(&["n1", "10.0.0.9"])).expect("new address");
        assert_ne!(a, c, "a new address needs a new certificate");
        let serving = ServingCert::new(c, read_key(&dir.join("berth-serving.key")).expect("key"))
            .expect("serving");
        let (d, k) = serving_certificate(&src(&["n2"])).expect("another");
        serving.replace(d, k).expect("replace");
        acceptor(serving, None).expect("acceptor");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
