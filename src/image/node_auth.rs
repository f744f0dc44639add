//! Registry credentials held by the node, used when a pull request carries none: the
//! `[registry.auth."<host>"]` tables of the configuration, then a docker-style `config.json`
//! (`registry.auth_file`), read at each pull so that edits apply without a restart. Secrets are
//! never logged.

use serde::Deserialize;

use super::registry::Credentials;
use crate::config::{RegistryAuth, RegistryConfig};

/// Why the node's credentials could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeAuthError {
    #[error("registry credentials for {registry} in {source_name}: {reason}")]
    Invalid {
        registry: String,
        source_name: String,
        reason: String,
    },
}

/// docker's `config.json`, the part Berth reads.
#[derive(Debug, Default, Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, DockerAuth>,
}

#[derive(Default, Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    identitytoken: String,
}

impl std::fmt::Debug for DockerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DockerAuth { <redacted> }")
    }
}

/// `user:password` from its base64 form (docker's `auth`, CRI's `AuthConfig.auth`).
pub fn decode_basic(auth: &str) -> Option<(String, String)> {
    let decoded = crate::stream::websocket::base64_decode(auth.trim().as_bytes())?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

/// The credentials the node holds for `registry` (Anonymous when it holds none).
pub fn credentials_for(cfg: &RegistryConfig, registry: &str) -> Result<Credentials, NodeAuthError> {
    if let Some(auth) = cfg.auth.get(registry) {
        return to_credentials(auth, registry, "registry.auth");
    }
    let Some(path) = &cfg.auth_file else {
        return Ok(Credentials::Anonymous);
    };
    let invalid = |reason: String| NodeAuthError::Invalid {
        registry: registry.to_string(),
        source_name: path.display().to_string(),
        reason,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credentials::Anonymous),
        Err(e) => return Err(invalid(e.to_string())),
    };
    let file: DockerConfig = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let Some(entry) = file
        .auths
        .iter()
        .find(|(key, _)| docker_key_host(key) == registry)
        .map(|(_, v)| v)
    else {
        return Ok(Credentials::Anonymous);
    };
    let auth = RegistryAuth {
        username: entry.username.clone(),
        password: entry.password.clone(),
        auth: entry.auth.clone(),
        identity_token: entry.identitytoken.clone(),
    };
    to_credentials(&auth, registry, &path.display().to_string())
}

fn to_credentials(
    auth: &RegistryAuth,
    registry: &str,
    source_name: &str,
) -> Result<Credentials, NodeAuthError> {
    if !auth.username.is_empty() || !auth.password.is_empty() {
        return Ok(Credentials::Basic(
            auth.username.clone(),
            auth.password.clone(),
        ));
    }
    if !auth.auth.is_empty() {
        let (user, pass) = decode_basic(&auth.auth).ok_or_else(|| NodeAuthError::Invalid {
            registry: registry.to_string(),
            source_name: source_name.to_string(),
            reason: "`auth` is not base64 of user:password".into(),
        })?;
        return Ok(Credentials::Basic(user, pass));
    }
    if !auth.identity_token.is_empty() {
        return Ok(Credentials::Bearer(auth.identity_token.clone()));
    }
    Ok(Credentials::Anonymous)
}

/// The registry host a `config.json` key names: `https://index.docker.io/v1/` → `docker.io`,
/// `http://host:5000/x` → `host:5000`.
pub fn docker_key_host(key: &str) -> &str {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = rest.split('/').next().unwrap_or(rest);
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        h => h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_tables_then_docker_config_json() {
        let dir = std::env::temp_dir().join(format!("berth-nodeauth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let file = dir.join("config.json");
        // base64("alice:s3cret") and base64("bob:pw")
        std::fs::write(
            &file,
            r#"{"auths": {"https://index.docker.io/v1/": {"auth": "YWxpY2U6czNjcmV0"},
                          "reg.example:5000": {"auth": "Ym9iOnB3"},
                          "bad.example": {"auth": "%%%"}}}"#,
        )
        .expect("write");
        let mut cfg = RegistryConfig {
            auth_file: Some(file.clone()),
            ..Default::default()
        };
        cfg.auth.insert(
            "reg.example:5000".into(),
            RegistryAuth {
                username: "carol".into(),
                password: "x".into(),
                ..Default::default()
            },
        );
        let basic = |u: &str, p: &str| Credentials::Basic(u.into(), p.into());
        assert_eq!(
            credentials_for(&cfg, "docker.io").ok(),
            Some(basic("alice", "s3cret"))
        );
        assert_eq!(
            credentials_for(&cfg, "reg.example:5000").ok(),
            Some(basic("carol", "x"))
        );
        assert_eq!(
            credentials_for(&cfg, "quay.io").ok(),
            Some(Credentials::Anonymous)
        );
        let err = credentials_for(&cfg, "bad.example").expect_err("bad base64");
        assert!(err.to_string().contains("config.json"), "{err}");
        assert!(!format!("{cfg:?}").contains("s3cret") && !format!("{cfg:?}").contains("\"x\""));
        std::fs::remove_file(&file).expect("rm");
        assert_eq!(
            credentials_for(&cfg, "docker.io").ok(),
            Some(Credentials::Anonymous)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
