//! CNI network configuration: the conf dir's first valid `.conflist`/`.conf`/`.json` by name.
//!
//! A `.conf` (or `.json`) file holds one plugin; it is wrapped as a list of one, as the CNI
//! spec's libraries do. Versions 0.1.0 to 1.0.0 are accepted; results of each are parsed by
//! [`super::result`].

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// CNI spec versions Berth speaks.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// A network configuration list, as loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfig {
    /// The network's name (`name`).
    pub name: String,
    /// `cniVersion` of the list.
    pub cni_version: String,
    /// `disableCheck` of the list.
    pub disable_check: bool,
    /// The plugins, in order, as JSON objects (each has a `type`).
    pub plugins: Vec<Map<String, Value>>,
    /// The file it came from.
    pub source: PathBuf,
}

/// Why a file is not a usable network configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    /// The file could not be read.
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not JSON, or JSON of the wrong shape.
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

impl NetworkConfig {
    /// Parses a `.conflist` (`list` = true) or a single-plugin `.conf`.
    pub fn parse(bytes: &[u8], list: bool, path: &Path) -> Result<Self, ConfError> {
        let invalid = |reason: String| ConfError::Invalid {
            path: path.to_owned(),
            reason,
        };
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
        let Value::Object(obj) = value else {
            return Err(invalid("not a JSON object".into()));
        };
        let str_field = |o: &Map<String, Value>, k: &str| -> String {
            o.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = str_field(&obj, "name");
        if name.is_empty() {
            return Err(invalid("no network \"name\"".into()));
        }
        let cni_version = str_field(&obj, "cniVersion");
        let cni_version = if cni_version.is_empty() {
            // The spec's libraries take a missing version as 0.1.0.
            "0.1.0".to_string()
        } else {
            cni_version
        };
        if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
            return Err(invalid(format!(
                "cniVersion {cni_version:?} is not supported (Berth speaks {})",
                SUPPORTED_VERSIONS.join(", ")
            )));
        }
        let disable_check = obj
            .get("disableCheck")
            .is_some_and(|v| v.as_bool() == Some(true) || v.as_str() == Some("true"));
        let plugins = if list {
            let Some(Value::Array(items)) = obj.get("plugins") else {
                return Err(invalid("a .conflist needs a \"plugins\" array".into()));
            };
            if items.is_empty() {
                return Err(invalid("the \"plugins\" array is empty".into()));
            }
            let mut plugins = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let Value::Object(p) = item else {
                    return Err(invalid(format!("plugin {i} is not a JSON object")));
                };
                plugins.push(p.clone());
            }
            plugins
        } else {
            vec![obj.clone()]
        };
        for (i, p) in plugins.iter().enumerate() {
            let ty = str_field(p, "type");
            if ty.is_empty() || ty.contains('/') || ty.starts_with('.') {
                return Err(invalid(format!("plugin {i} has no valid \"type\"")));
            }
        }
        Ok(Self {
            name,
            cni_version,
            disable_check,
            plugins,
            source: path.to_owned(),
        })
    }

    /// Reads and parses one file, by its extension.
    pub fn load_file(path: &Path) -> Result<Self, ConfError> {
        let bytes = std::fs::read(path).map_err(|error| ConfError::Read {
            path: path.to_owned(),
            error,
        })?;
        let list = path.extension().is_some_and(|e| e == "conflist");
        Self::parse(&bytes, list, path)
    }

    /// The `type` of plugin `i`.
    pub fn plugin_type(&self, i: usize) -> &str {
        self.plugins
            .get(i)
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// Capabilities plugin `i` asks for (`"capabilities": {"portMappings": true}`).
    pub fn plugin_wants(&self, i: usize, capability: &str) -> bool {
        self.plugins
            .get(i)
            .and_then(|p| p.get("capabilities"))
            .and_then(|c| c.get(capability))
            .and_then(Value::as_bool)
            == Some(true)
    }

    /// The whole list as JSON (what the cache keeps).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "cniVersion": self.cni_version,
            "name": self.name,
            "disableCheck": self.disable_check,
            "plugins": self.plugins,
        })
    }

    /// Rebuilds a list from [`Self::to_json`] (the cache's copy).
    pub fn from_json(value: &Value, source: &Path) -> Result<Self, ConfError> {
        let bytes = serde_json::to_vec(value).map_err(|e| ConfError::Invalid {
            path: source.to_owned(),
            reason: e.to_string(),
        })?;
        Self::parse(&bytes, true, source)
    }

    /// Whether CHECK exists in this version (0.4.0 and later) and is not disabled.
    pub fn supports_check(&self) -> bool {
        !self.disable_check && version_at_least(&self.cni_version, (0, 4, 0))
    }
}

/// Whether dotted version `v` is at least `min`.
pub fn version_at_least(v: &str, min: (u32, u32, u32)) -> bool {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let got = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    got >= min
}

/// Outcome of looking at a conf dir.
#[derive(Debug)]
pub enum Lookup {
    /// The first valid configuration; `skipped` lists invalid files before it.
    Found {
        config: NetworkConfig,
        skipped: Vec<String>,
    },
    /// None usable: why, for NetworkReady's message.
    Missing(String),
}

/// Candidate files in `dir`, sorted by name.
pub fn candidates(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "conflist" | "conf" | "json"))
                && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Finds the first valid configuration in `dir`, by file name.
pub fn find(dir: &Path) -> Lookup {
    let files = match candidates(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Lookup::Missing(format!(
                "no network config: CNI conf dir {} does not exist",
                dir.display()
            ));
        }
        Err(e) => {
            return Lookup::Missing(format!("reading CNI conf dir {}: {e}", dir.display()));
        }
    };
    let mut skipped = Vec::new();
    for f in files {
        match NetworkConfig::load_file(&f) {
            Ok(config) => return Lookup::Found { config, skipped },
            Err(e) => skipped.push(e.to_string()),
        }
    }
    if skipped.is_empty() {
        Lookup::Missing(format!(
            "no network config found in {} (no .conflist, .conf or .json file)",
            dir.display()
        ))
    } else {
        Lookup::Missing(format!(
            "no valid network config in {}: {}",
            dir.display(),
            skipped.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_is_wrapped_as_a_list_of_one() {
        let c = NetworkConfig::parse(
            br#"{"cniVersion":"0.3.1","name":"n","type":"bridge","bridge":"b0"}"#,
            false,
            Path::new("x.conf"),
        )
        .expect("parses");
        assert_eq!(c.plugins.len(), 1);
        assert_eq!(c.plugin_type(0), "bridge");
        assert_eq!(c.cni_version, "0.3.1");
        assert!(!c.supports_check());
    }

    #[test]
    fn conflist_needs_plugins_and_types() {
        let p = Path::new("x.conflist");
        assert!(NetworkConfig::parse(br#"{"cniVersion":"1.0.0","name":"n"}"#, true, p).is_err());
        assert!(
            NetworkConfig::parse(
                br#"{"cniVersion":"1.0.0","name":"n","plugins":[{}]}"#,
                true,
                p
            )
            .is_err()
        );
        assert!(
            NetworkConfig::parse(
                br#"{"cniVersion":"9.9.9","name":"n","plugins":[{"type":"a"}]}"#,
                true,
                p
            )
            .is_err()
        );
        let c = NetworkConfig::parse(
            br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"a"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
            true,
            p,
        )
        .expect("parses");
        assert!(c.plugin_wants(1, "portMappings"));
        assert!(!c.plugin_wants(0, "portMappings"));
        assert!(c.supports_check());
        let back = NetworkConfig::from_json(&c.to_json(), p).expect("round trip");
        assert_eq!(back, c);
    }

    #[test]
    fn versions_compare() {
        assert!(version_at_least("1.0.0", (0, 4, 0)));
        assert!(version_at_least("0.4.0", (0, 4, 0)));
        assert!(!version_at_least("0.3.1", (0, 4, 0)));
    }
}
