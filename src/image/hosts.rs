//! Registry endpoints: mirrors, plain HTTP and TLS settings, read from containerd-style `hosts.toml` files.
//!
//! For a registry host `H` the endpoints are, in order: the `[host."…"]` entries of
//! `<config_dir>/H/hosts.toml` (or `<config_dir>/_default/hosts.toml`), then mirrors from Berth's
//! own config, then the file's `server` (default: the registry itself over HTTPS, or HTTP when
//! `H` is listed as an insecure registry; a registry on loopback over HTTPS, then HTTP).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::RegistryConfig;

/// One place to fetch an image from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// `host[:port]` to connect to.
    pub host: String,
    /// Plain HTTP instead of HTTPS.
    pub plain_http: bool,
    /// Accept any TLS certificate.
    pub skip_verify: bool,
    /// Extra CA certificate files (PEM).
    pub ca_files: Vec<PathBuf>,
    /// May resolve tags to digests.
    pub resolve: bool,
    /// May serve blobs and manifests by digest.
    pub pull: bool,
    /// Whether this endpoint is the registry itself (not a mirror).
    pub is_origin: bool,
}

/// A `hosts.toml` file as containerd defines it (the subset Berth uses): the `server`'s own
/// settings at the top level, mirrors under `[host."…"]`.
#[derive(Debug, Default, Deserialize)]
struct HostsFile {
    server: Option<String>,
    #[serde(flatten)]
    settings: HostEntry,
    #[serde(default)]
    host: BTreeMap<String, HostEntry>,
}

/// Settings of one host (the server or a mirror).
#[derive(Debug, Default, Deserialize)]
struct HostEntry {
    #[serde(default)]
    capabilities: Option<Vec<String>>,
    #[serde(default)]
    skip_verify: Option<bool>,
    #[serde(default)]
    ca: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn paths(&self, base: &Path) -> Vec<PathBuf> {
        let list = match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        };
        list.into_iter().map(|p| base.join(p)).collect()
    }
}

/// Errors reading registry configuration.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The file exists but does not parse.
    #[error("registry config {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Parses `http://h:p`, `https://h`, or a bare `h:p` into (host, plain_http).
fn split_url(url: &str, default_plain: bool) -> (String, bool) {
    let (plain, rest) = if let Some(r) = url.strip_prefix("http://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (false, r)
    } else {
        (default_plain, url)
    };
    let host = rest.split('/').next().unwrap_or(rest).to_string();
    (host, plain)
}

fn caps(list: &Option<Vec<String>>) -> (bool, bool) {
    match list {
        None => (true, true),
        Some(l) => (
            l.iter().any(|c| c == "resolve"),
            l.iter().any(|c| c == "pull"),
        ),
    }
}

/// The endpoints to try for `registry`, in order.
pub fn endpoints_for(registry: &str, cfg: &RegistryConfig) -> Result<Vec<Endpoint>, HostsError> {
    let file = load_hosts_file(&cfg.config_dir, registry)?;
    Ok(endpoints_with(registry, cfg, file))
}

/// The endpoints to try for `registry` when `text` is the `hosts.toml` found in `host_dir`
/// (relative `ca` paths are resolved against it).
pub fn endpoints_from_text(
    registry: &str,
    cfg: &RegistryConfig,
    host_dir: &Path,
    text: &str,
) -> Result<Vec<Endpoint>, HostsError> {
    let file = parse_hosts_file(&host_dir.join("hosts.toml"), text)?;
    Ok(endpoints_with(
        registry,
        cfg,
        Some((host_dir.to_owned(), file)),
    ))
}

fn endpoints_with(
    registry: &str,
    cfg: &RegistryConfig,
    file: Option<(PathBuf, HostsFile)>,
) -> Vec<Endpoint> {
    let insecure = cfg.insecure_registries.iter().any(|r| r == registry);
    let mut out = Vec::new();
    let global_ca: Vec<PathBuf> = cfg.ca_file.iter().cloned().collect();
    if let Some((dir, file)) = &file {
        for (url, entry) in &file.host {
            let (host, plain_http) = split_url(url, false);
            let (resolve, pull) = caps(&entry.capabilities);
            let mut ca_files = global_ca.clone();
            ca_files.extend(entry.ca.as_ref().map(|c| c.paths(dir)).unwrap_or_default());
            out.push(Endpoint {
                is_origin: host == registry,
                plain_http: plain_http || cfg.insecure_registries.contains(&host),
                host,
                skip_verify: entry.skip_verify.unwrap_or(false),
                ca_files,
                resolve,
                pull,
            });
        }
    }
    for mirror in cfg.mirrors.get(registry).into_iter().flatten() {
        let (host, plain_http) = split_url(mirror, false);
        out.push(Endpoint {
            is_origin: host == registry,
            plain_http: plain_http || cfg.insecure_registries.contains(&host),
            host,
            skip_verify: false,
            ca_files: global_ca.clone(),
            resolve: true,
            pull: true,
        });
    }
    let (server_host, server_plain, resolve, pull, skip_verify, mut ca_files) = match &file {
        Some((dir, f)) if f.server.is_some() => {
            let (h, p) = split_url(f.server.as_deref().unwrap_or(registry), insecure);
            let (r, pl) = caps(&f.settings.capabilities);
            let ca = f
                .settings
                .ca
                .as_ref()
                .map(|c| c.paths(dir))
                .unwrap_or_default();
            (h, p, r, pl, f.settings.skip_verify.unwrap_or(false), ca)
        }
        _ => (
            registry.to_string(),
            insecure,
            true,
            true,
            false,
            Vec::new(),
        ),
    };
    ca_files.extend(global_ca);
    let server_host = match server_host.as_str() {
        "registry-1.docker.io" | "index.docker.io" => "docker.io".to_string(),
        _ => server_host,
    };
    let server_named = file.as_ref().is_some_and(|(_, f)| f.server.is_some());
    let server = Endpoint {
        is_origin: server_host == registry,
        plain_http: server_plain || cfg.insecure_registries.contains(&server_host),
        host: server_host,
        skip_verify,
        ca_files,
        resolve,
        pull,
    };
    // A registry on the node itself is tried over HTTPS, then over plain HTTP, as containerd
    // and Docker do: nothing crosses the network, and the quick start's local registry works.
    let plain_fallback =
        (!server.plain_http && !server_named && is_loopback(&server.host)).then(|| Endpoint {
            plain_http: true,
            ..server.clone()
        });
    out.push(server);
    out.extend(plain_fallback);
    out
}

/// Whether `host[:port]` names this machine: `localhost`, 127.0.0.0/8 or `[::1]`.
pub fn is_loopback(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or(rest)
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn load_hosts_file(dir: &Path, registry: &str) -> Result<Option<(PathBuf, HostsFile)>, HostsError> {
    for name in [registry, "_default"] {
        let host_dir = dir.join(name);
        let path = host_dir.join("hosts.toml");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(HostsError::Invalid {
                    path,
                    reason: e.to_string(),
                });
            }
        };
        let file = parse_hosts_file(&path, &text)?;
        return Ok(Some((host_dir, file)));
    }
    Ok(None)
}

fn parse_hosts_file(path: &Path, text: &str) -> Result<HostsFile, HostsError> {
    toml::from_str(text).map_err(|e| HostsError::Invalid {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg_with_dir(dir: &Path) -> RegistryConfig {
        RegistryConfig {
            config_dir: dir.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn containerd_hosts_file_gives_mirrors_then_server() {
        let dir = std::env::temp_dir().join(format!("berth-hosts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("docker.io")).expect("mkdir");
        std::fs::write(
            dir.join("docker.io/hosts.toml"),
            r#"server = "http://127.0.0.1:5000"
[host."http://127.0.0.1:6000"]
  capabilities = ["pull"]
[host."https://mirror.example:8443"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
  ca = "ca.pem"
"#,
        )
        .expect("write");
        let eps = endpoints_for("docker.io", &cfg_with_dir(&dir)).expect("endpoints");
        assert_eq!(eps.len(), 3);
        assert_eq!(eps[0].host, "127.0.0.1:6000");
        assert!(eps[0].plain_http && eps[0].pull && !eps[0].resolve);
        assert_eq!(eps[1].host, "mirror.example:8443");
        assert!(!eps[1].plain_http && eps[1].skip_verify);
        assert_eq!(eps[1].ca_files, vec![dir.join("docker.io/ca.pem")]);
        assert_eq!(eps[2].host, "127.0.0.1:5000");
        assert!(eps[2].plain_http && !eps[2].is_origin);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn no_file_means_the_registry_itself() {
        let mut cfg = cfg_with_dir(Path::new("/nonexistent-berth"));
        cfg.insecure_registries.push("127.0.0.1:5050".into());
        let eps = endpoints_for("127.0.0.1:5050", &cfg).expect("endpoints");
        assert_eq!(eps.len(), 1);
        assert!(eps[0].plain_http && eps[0].is_origin);
        let eps = endpoints_for("quay.io", &cfg).expect("endpoints");
        assert_eq!(eps.len(), 1);
        assert!(!eps[0].plain_http);
    }

    #[test]
    fn loopback_registries_are_tried_over_https_then_http() {
        let cfg = cfg_with_dir(Path::new("/nonexistent-berth"));
        for host in [
            "localhost:5000",
            "127.0.0.1:5050",
            "127.1.2.3",
            "[::1]:5000",
            "LOCALHOST",
        ] {
            let eps = endpoints_for(host, &cfg).expect("endpoints");
            let plain: Vec<bool> = eps.iter().map(|e| e.plain_http).collect();
            assert_eq!(plain, vec![false, true], "{host}");
            assert!(eps.iter().all(|e| e.is_origin && e.host == host), "{host}");
        }
        for host in [
            "localhost.example.com:5000",
            "10.0.0.1:5000",
            "[::2]:5000",
            "docker.io",
        ] {
            assert_eq!(
                endpoints_for(host, &cfg).expect("endpoints").len(),
                1,
                "{host}"
            );
        }
    }
}
