//! Registry clients: one oci-client `Client` per endpoint setting, reused across pulls.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::hosts::Endpoint;
use super::reference::ImageRef;

/// Credentials from a CRI request, already decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Credentials {
    /// No credentials.
    #[default]
    Anonymous,
    /// Username and password (also from a base64 `auth` string).
    Basic(String, String),
    /// A bearer token for the registry (registry_token or identity_token).
    Bearer(String),
}

impl Credentials {
    /// The oci-client form.
    pub fn to_auth(&self) -> RegistryAuth {
        match self {
            Self::Anonymous => RegistryAuth::Anonymous,
            Self::Basic(u, p) => RegistryAuth::Basic(u.clone(), p.clone()),
            Self::Bearer(t) => RegistryAuth::Bearer(t.clone()),
        }
    }
}

/// Caches clients so connections and tokens are reused.
pub struct Clients {
    connect_timeout: Duration,
    cache: Mutex<HashMap<(Endpoint, Credentials), Client>>,
}

impl Clients {
    /// An empty cache.
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            connect_timeout,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The client for `ep` and `creds`, and the reference to use with it for `image`.
    ///
    /// Clients remember the auth they negotiated with a registry, so each set of credentials
    /// gets its own: a failed anonymous pull must not poison a later one with a password.
    pub fn client_for(
        &self,
        ep: &Endpoint,
        creds: &Credentials,
        image: &ImageRef,
    ) -> Result<(Client, Reference), String> {
        let mut reference = image.fetch_reference();
        if !ep.is_origin {
            reference.set_mirror_registry(ep.host.clone());
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let key = (ep.clone(), creds.clone());
        if let Some(c) = cache.get(&key) {
            return Ok((c.clone(), reference));
        }
        let mut extra_root_certificates = Vec::new();
        for path in &ep.ca_files {
            let data = std::fs::read(path)
                .map_err(|e| format!("reading CA file {}: {e}", path.display()))?;
            extra_root_certificates.push(Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            });
        }
        let protocol = if ep.plain_http {
            ClientProtocol::HttpsExcept(vec![ep.host.clone()])
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            accept_invalid_certificates: ep.skip_verify,
            extra_root_certificates,
            connect_timeout: Some(self.connect_timeout),
            read_timeout: Some(Duration::from_secs(120)),
            user_agent: concat!("berth/", env!("CARGO_PKG_VERSION")),
            platform_resolver: None,
            ..Default::default()
        };
        let client = Client::new(config);
        cache.insert(key, client.clone());
        Ok((client, reference))
    }
}
