//! Per-sandbox record of a network attachment (the exact config, arguments and ADD result), so
//! DEL is sent right after a berthd restart, a config change or a lost netns.
//!
//! Files live under the persistent root (`<root>/net/<sandbox id>.json`), not the tmpfs state
//! dir: host-local IPAM leases survive a reboot, so the record needed to release them must too.
//! Each write goes to a temp file, is fsynced and renamed into place.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What was (or is being) attached for one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub sandbox_id: String,
    /// The network config list as used (see `NetworkConfig::to_json`).
    pub config: Value,
    /// The file it was loaded from.
    pub source: PathBuf,
    pub ifname: String,
    /// The pinned netns path ADD was given.
    pub netns: PathBuf,
    /// `CNI_ARGS`.
    pub args: String,
    /// Every capability value offered (each plugin gets those it declares).
    pub runtime_config: Map<String, Value>,
    /// The final ADD result (None while ADD runs or if it failed).
    pub result: Option<Value>,
}

/// Why the cache could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("CNI cache {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("CNI cache {path}: {error}")]
    Corrupt {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("CNI cache: invalid sandbox id {0:?}")]
    BadId(String),
}

/// The cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

impl Cache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
        }
    }

    fn path(&self, id: &str) -> Result<PathBuf, CacheError> {
        if id.is_empty()
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(CacheError::BadId(id.to_string()));
        }
        Ok(self.dir.join(format!("{id}.json")))
    }

    /// Stores `entry` atomically (temp file + rename); `durable` also fsyncs it first (a
    /// berthd crash keeps the page cache: only a power loss needs the fsync).
    pub fn save(&self, entry: &Entry, durable: bool) -> Result<(), CacheError> {
        let path = self.path(&entry.sandbox_id)?;
        let io = |error| CacheError::Io {
            path: path.clone(),
            error,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(entry).map_err(|error| CacheError::Corrupt {
            path: path.clone(),
            error,
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        if durable {
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, &path).map_err(io)?;
        Ok(())
    }

    /// The entry of sandbox `id`, if any.
    pub fn load(&self, id: &str) -> Result<Option<Entry>, CacheError> {
        let path = self.path(id)?;
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|error| CacheError::Corrupt { path, error }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(CacheError::Io { path, error }),
        }
    }

    /// Forgets sandbox `id` (absent is fine).
    pub fn remove(&self, id: &str) -> Result<(), CacheError> {
        let path = self.path(id)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(CacheError::Io { path, error }),
        }
    }

    /// Sandbox ids with an entry.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_suffix(".json")
                            .map(str::to_string)
                    })
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_load_remove() {
        let dir = std::env::temp_dir().join(format!("berth-cni-cache-{}", std::process::id()));
        let cache = Cache::new(&dir);
        assert_eq!(cache.load("abc").ok().flatten(), None);
        let e = Entry {
            sandbox_id: "abc".into(),
            config: serde_json::json!({"name": "n"}),
            source: "/x.conflist".into(),
            ifname: "eth0".into(),
            netns: "/run/x".into(),
            args: "IgnoreUnknown=1".into(),
            runtime_config: Map::new(),
            result: Some(serde_json::json!({"ips": []})),
        };
        cache.save(&e, true).expect("save");
        assert_eq!(cache.load("abc").expect("load"), Some(e));
        assert_eq!(cache.ids(), ["abc"]);
        cache.remove("abc").expect("remove");
        cache.remove("abc").expect("remove twice");
        assert!(cache.load("../etc").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
