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

/// The credentials of one pull request and the registry host they were given for: they go to
/// that host only, never to a mirror or another server the registry's `hosts.toml` names
/// (containerd, too, sends a CRI `AuthConfig` only to the host its `server_address` names).
/// Every other endpoint gets the node's own credentials for its host, if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PullAuth {
    /// Credentials from the request (Anonymous when it had none).
    pub given: Credentials,
    /// `host[:port]` they belong to.
    pub host: String,
}

impl PullAuth {
    /// `given` for `server_address` (a CRI `AuthConfig.server_address`: a host or a URL, as in
    /// a docker `config.json` key) or, when that is empty, for `registry`.
    pub fn new(given: Credentials, server_address: &str, registry: &str) -> Self {
        let host = if server_address.trim().is_empty() {
            registry
        } else {
            super::node_auth::docker_key_host(server_address.trim())
        };
        Self {
            given,
            host: host.to_string(),
        }
    }

    /// What to send to `host`: the request's credentials if they were given for it, else the
    /// node's for `host`.
    pub fn for_host(
        &self,
        host: &str,
        node: &crate::config::RegistryConfig,
    ) -> Result<Credentials, super::node_auth::NodeAuthError> {
        if host == self.host && self.given != Credentials::Anonymous {
            return Ok(self.given.clone());
        }
        super::node_auth::credentials_for(node, host)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_credentials_go_only_to_their_host() {
        let mut node = crate::config::RegistryConfig::default();
        node.auth.insert(
            "mirror.example:5000".into(),
            crate::config::RegistryAuth {
                username: "node".into(),
                password: "node-pw".into(),
                ..Default::default()
            },
        );
        let given = Credentials::Basic("user".into(), "pw".into());
        let auth = PullAuth::new(given.clone(), "", "registry.example");
        assert_eq!(
            auth.for_host("registry.example", &node).expect("origin"),
            given
        );
        assert_eq!(
            auth.for_host("other.example", &node).expect("other"),
            Credentials::Anonymous
        );
        assert_eq!(
            auth.for_host("mirror.example:5000", &node).expect("mirror"),
            Credentials::Basic("node".into(), "node-pw".into())
        );
        // server_address names the host, as a URL or bare.
        for address in ["https://mirror.example:5000/v1/", "mirror.example:5000"] {
            let auth = PullAuth::new(given.clone(), address, "registry.example");
            assert_eq!(
                auth.for_host("mirror.example:5000", &node).expect("named"),
                given
            );
            assert_eq!(
                auth.for_host("registry.example", &node).expect("origin"),
                Credentials::Anonymous
            );
        }
        let docker = PullAuth::new(given.clone(), "https://index.docker.io/v1/", "docker.io");
        assert_eq!(docker.for_host("docker.io", &node).expect("hub"), given);
        // Without request credentials the node's hold for the registry itself too.
        let anonymous = PullAuth::new(Credentials::Anonymous, "", "mirror.example:5000");
        assert_eq!(
            anonymous
                .for_host("mirror.example:5000", &node)
                .expect("node"),
            Credentials::Basic("node".into(), "node-pw".into())
        );
    }
}
