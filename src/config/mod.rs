//! Berth's configuration: a TOML file where every field has a default, overridden by flags.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub mod reference;

/// Default location of the configuration file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/berth/config.toml";

/// The whole configuration of berthd.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Persistent state: metadata database, content store, snapshots.
    pub root: PathBuf,
    /// Volatile state (tmpfs): socket, shim sockets, pinned namespaces.
    pub state_dir: PathBuf,
    /// CRI gRPC socket path (unix).
    pub socket: PathBuf,
    /// Group (name or gid) whose members may use the CRI socket and the agent's control
    /// socket, both mode 0660; empty: root's group only.
    pub socket_group: String,
    /// Log level: error, warn, info, debug or trace (or a `target=level,...` list).
    pub log_level: String,
    /// Registry settings.
    pub registry: RegistryConfig,
    /// Images from archives.
    pub images: ImagesConfig,
    /// Pod networking (CNI).
    pub cni: CniConfig,
    /// The streaming server (exec, attach, port-forward).
    pub stream: StreamConfig,
    /// berthd's Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// The embedded node agent (static pods, probes, node status).
    pub agent: crate::agent::config::AgentConfig,
    /// How containers run.
    pub runtime: RuntimeSection,
}

/// How containers run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeSection {
    /// The cgroup driver: "systemd" (pod slices and container scopes made through systemd; CRI
    /// cgroup parents are slices such as `kubepods-burstable-pod<uid>.slice`, by name or path;
    /// pure cgroup v2 only), "cgroupfs" (cgroup directories made by Berth; parents are paths such as
    /// `/kubepods/burstable/pod<uid>`), or "auto" (the default: systemd where systemd is the
    /// init and the hierarchy is pure cgroup v2, else cgroupfs). The kubelet's `cgroupDriver`
    /// must be the same.
    pub cgroup_driver: crate::runtime::cgroup_driver::DriverChoice,
    /// Directories of CDI spec files (JSON or YAML), read when a container names CDI devices
    /// (`CDI_devices`, or `cdi.k8s.io/*` annotations); a device in a later directory overrides
    /// one of the same name in an earlier.
    pub cdi_spec_dirs: Vec<PathBuf>,
}

impl Default for RuntimeSection {
    fn default() -> Self {
        Self {
            cgroup_driver: Default::default(),
            cdi_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
        }
    }
}

/// Images: archives for nodes without a registry, limits and pins.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ImagesConfig {
    /// Directory whose image archives (OCI layout or docker save tars, plain, gzip or zstd)
    /// are imported at start and when added, each once; empty: `<root>/import`.
    pub import_dir: PathBuf,
    /// The most bytes one layer may unpack to, pulled or imported (file contents, sparse holes
    /// included, plus 512 bytes per entry); a layer past it is refused and removed. 0 (the
    /// default): no limit, as in containerd, since the right bound depends on the node's disk
    /// and on its images (some are tens of GiB); a node that pulls images it does not trust
    /// should set one, for a few kilobytes of zstd can unpack to terabytes.
    pub max_unpacked_layer_bytes: u64,
    /// Images reported pinned, which image garbage collection (the kubelet's, the agent's)
    /// never removes: references (`registry.k8s.io/pause:3.10`, normalised as pulls are),
    /// prefixes ending in `*` (`registry.local/infra/*`) or keywords (`*pause*`).
    pub pinned_images: Vec<String>,
    /// Seconds a pull may go without receiving a byte (a manifest, a config, a layer's next
    /// chunk) before it is cancelled with DeadlineExceeded naming what stalled; 0: never.
    pub pull_progress_timeout_secs: f64,
}

impl Default for ImagesConfig {
    fn default() -> Self {
        Self {
            import_dir: PathBuf::new(),
            max_unpacked_layer_bytes: 0,
            pinned_images: Vec::new(),
            pull_progress_timeout_secs: 300.0,
        }
    }
}

/// berthd's Prometheus endpoint (off unless an address is given).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `HOST:PORT` serving `/metrics` (e.g. `127.0.0.1:1338`); empty: no endpoint.
    pub address: String,
}

/// The streaming server's address, timeouts and optional TLS.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StreamConfig {
    /// `HOST:PORT` to listen on; port 0 picks a free port.
    pub address: String,
    /// Seconds a streaming connection may stay without traffic before it is closed.
    pub idle_timeout_secs: u64,
    /// Seconds an unused streaming URL stays valid.
    pub token_expiry_secs: u64,
    /// TLS certificate chain (PEM); TLS is on when both this and `tls_key` are set.
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    pub tls_key: Option<PathBuf>,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:0".to_string(),
            idle_timeout_secs: 4 * 3600,
            token_expiry_secs: 60,
            tls_cert: None,
            tls_key: None,
        }
    }
}

/// Where CNI network configs and plugins are, and how long a plugin may run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CniConfig {
    /// Directory of network configs; the first valid `.conflist`/`.conf`/`.json` by name is used.
    pub conf_dir: PathBuf,
    /// Directories searched for plugin binaries, in order.
    pub bin_dirs: Vec<PathBuf>,
    /// Seconds one plugin call (ADD, DEL or CHECK) may take before it is killed.
    pub plugin_timeout_secs: f64,
}

impl Default for CniConfig {
    fn default() -> Self {
        Self {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dirs: vec![PathBuf::from("/opt/cni/bin"), PathBuf::from("/usr/lib/cni")],
            plugin_timeout_secs: 30.0,
        }
    }
}

/// How images are pulled from registries.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryConfig {
    /// Registries (host or host:port) spoken to over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Directory of containerd-style `<host>/hosts.toml` files (mirrors, TLS, plain HTTP).
    pub config_dir: PathBuf,
    /// Mirrors per registry host, tried in order before the registry itself
    /// (e.g. `"docker.io" = ["http://127.0.0.1:5000"]`).
    pub mirrors: std::collections::BTreeMap<String, Vec<String>>,
    /// Extra CA certificate (PEM) trusted for every registry.
    pub ca_file: Option<PathBuf>,
    /// Layers fetched and unpacked at once per pull.
    pub max_concurrent_downloads: usize,
    /// Seconds allowed to connect to a registry.
    pub connect_timeout_secs: u64,
    /// Credentials per registry host (`[registry.auth."host:port"]`), used when a pull request
    /// carries none.
    pub auth: std::collections::BTreeMap<String, RegistryAuth>,
    /// A docker-style `config.json` whose `auths` are used when a pull request carries no
    /// credentials and `registry.auth` has none for the host; read at each pull.
    pub auth_file: Option<PathBuf>,
}

/// Credentials for one registry: `username` and `password`, or `auth` (base64 of
/// `user:password`), or `identity_token`. Never logged.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RegistryAuth {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// base64 of `user:password`, as docker's config.json holds it.
    pub auth: String,
    /// A bearer token for the registry.
    pub identity_token: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/var/lib/berth"),
            state_dir: PathBuf::from("/run/berth"),
            socket: PathBuf::from("/run/berth/berth.sock"),
            socket_group: String::new(),
            log_level: "info".to_string(),
            registry: RegistryConfig::default(),
            images: ImagesConfig::default(),
            cni: CniConfig::default(),
            stream: StreamConfig::default(),
            metrics: MetricsConfig::default(),
            agent: Default::default(),
            runtime: RuntimeSection::default(),
        }
    }
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            insecure_registries: Vec::new(),
            config_dir: PathBuf::from("/etc/berth/certs.d"),
            mirrors: Default::default(),
            ca_file: None,
            max_concurrent_downloads: 4,
            auth: Default::default(),
            auth_file: None,
            connect_timeout_secs: 10,
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be read.
    #[error("reading config file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file is not valid TOML for Berth's schema (an unknown key included: a typo must
    /// not be silently ignored); `hint` names the known key closest to an unknown one.
    #[error("parsing config file {path}: {error}{hint}")]
    Parse {
        path: PathBuf,
        error: Box<toml::de::Error>,
        hint: String,
    },
    /// A value is out of range.
    #[error("invalid config: {0}")]
    Invalid(String),
}

impl Config {
    /// Loads `path`; a missing file gives the defaults only when `required` is false.
    pub fn load(path: &Path, required: bool) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                return Ok(Self::default());
            }
            Err(error) => {
                return Err(ConfigError::Read {
                    path: path.to_owned(),
                    error,
                });
            }
        };
        Self::parse(&text).map_err(|error| parse_error(path, error))
    }

    /// Loads `path` (as [`Config::load`]) and then every `*.toml` drop-in file of `drop_in_dir`
    /// in file-name order, each overriding what came before it key by key (tables merge; any
    /// other value, lists included, is replaced). The merged result is checked against the
    /// schema once, so a drop-in may set a single field.
    pub fn load_with_drop_ins(
        path: &Path,
        required: bool,
        drop_in_dir: Option<&Path>,
    ) -> Result<Self, ConfigError> {
        let Some(dir) = drop_in_dir else {
            return Self::load(path, required);
        };
        let mut merged = match std::fs::read_to_string(path) {
            Ok(text) => checked_table(path, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => toml::Table::new(),
            Err(error) => {
                return Err(ConfigError::Read {
                    path: path.to_owned(),
                    error,
                });
            }
        };
        let read_dir = std::fs::read_dir(dir).map_err(|error| ConfigError::Read {
            path: dir.to_owned(),
            error,
        })?;
        let mut files: Vec<PathBuf> = read_dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .collect();
        files.sort();
        for file in &files {
            let text = std::fs::read_to_string(file).map_err(|error| ConfigError::Read {
                path: file.clone(),
                error,
            })?;
            merge_tables(&mut merged, checked_table(file, &text)?);
        }
        let last = files.last().cloned().unwrap_or_else(|| path.to_owned());
        toml::Value::Table(merged)
            .try_into()
            .map_err(|error| parse_error(&last, error))
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.agent.validate().map_err(ConfigError::Invalid)?;
        if self.stream.address.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::Invalid(format!(
                "stream.address {:?} is not HOST:PORT (an IP address and a port)",
                self.stream.address
            )));
        }
        if self.stream.tls_cert.is_some() != self.stream.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "stream.tls_cert and stream.tls_key go together".into(),
            ));
        }
        crate::socket_access::resolve_group(&self.socket_group)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if self.registry.max_concurrent_downloads == 0 {
            return Err(ConfigError::Invalid(
                "registry.max_concurrent_downloads must be at least 1".into(),
            ));
        }
        if !(self.cni.plugin_timeout_secs > 0.0 && self.cni.plugin_timeout_secs <= 3600.0) {
            return Err(ConfigError::Invalid(
                "cni.plugin_timeout_secs must be above 0 and at most 3600".into(),
            ));
        }
        for (name, dir) in [("root", &self.root), ("state_dir", &self.state_dir)] {
            if !dir.is_absolute() {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be an absolute path, got {}",
                    dir.display()
                )));
            }
        }
        Ok(())
    }

    /// The full default file, commented, as `berthd config default` prints it.
    pub fn default_toml() -> String {
        let body = toml::to_string_pretty(&Self::default()).unwrap_or_default();
        format!(
            "# Berth configuration ({DEFAULT_CONFIG_PATH}). Every field is optional; these are the defaults.\n\
             # Command-line flags override values from this file.\n\
             # Unset by default: registry.ca_file = \"/path/to/ca.pem\" (an extra CA for every registry);\n\
             # agent.kubeconfig = \"/etc/berth/kubeconfig\" (join that API server as a node);\n\
             # agent.node_name = \"NAME\" and agent.node_ip = \"IP\" (default: the host name, the default route's address).\n\n{body}"
        )
    }

    /// The image import directory (`images.import_dir`, or `<root>/import`).
    pub fn import_dir(&self) -> PathBuf {
        if self.images.import_dir.as_os_str().is_empty() {
            self.root.join("import")
        } else {
            self.images.import_dir.clone()
        }
    }

    /// What the import directory's watcher remembers.
    pub fn import_state(&self) -> PathBuf {
        self.root.join("import-state.json")
    }

    /// Directory of the metadata database and content store.
    pub fn content_dir(&self) -> PathBuf {
        self.root.join("content")
    }

    /// Directory the snapshotter owns.
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshotter")
    }

    /// Directory of the per-sandbox CNI attachment records (persistent, like IPAM leases).
    pub fn cni_cache_dir(&self) -> PathBuf {
        self.root.join("net")
    }

    /// Path of the metadata database.
    pub fn db_path(&self) -> PathBuf {
        self.root.join("berth.redb")
    }
}

/// `text` (the file at `path`) as a table, checked against the schema on its own first (every
/// field has a default, so a drop-in setting one key is a whole config) so that an unknown key
/// or a wrong type is reported in the file that holds it.
fn checked_table(path: &Path, text: &str) -> Result<toml::Table, ConfigError> {
    let table = text
        .parse::<toml::Table>()
        .map_err(|error| parse_error(path, error))?;
    toml::Value::Table(table.clone())
        .try_into::<Config>()
        .map_err(|error| parse_error(path, error))?;
    Ok(table)
}

fn parse_error(path: &Path, error: toml::de::Error) -> ConfigError {
    ConfigError::Parse {
        path: path.to_owned(),
        hint: unknown_key_hint(error.message()),
        error: Box::new(error),
    }
}

/// For serde's "unknown field `x`, expected one of `a`, `b`" the closest known key, when one is
/// close enough to be a typo: " (did you mean `a`?)".
fn unknown_key_hint(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return String::new();
    };
    let Some((unknown, expected)) = rest.split_once('`') else {
        return String::new();
    };
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|known| (strsim::damerau_levenshtein(unknown, known), known))
        .filter(|(d, known)| *d <= (known.len() / 3).max(1))
        .min()
        .map(|(_, known)| format!(" (did you mean `{known}`?)"))
        .unwrap_or_default()
}

/// Overrides `base` with `over`: tables merge recursively, other values are replaced.
fn merge_tables(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_tables(b, o),
            (_, v) => {
                base.insert(key, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_file_round_trips() {
        let text = Config::default_toml();
        let parsed = Config::parse(&text).expect("default config parses");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn partial_file_keeps_other_defaults() {
        let cfg = Config::parse("root = \"/tmp/x\"\n[registry]\nmax_concurrent_downloads = 2\n")
            .expect("parses");
        assert_eq!(cfg.root, PathBuf::from("/tmp/x"));
        assert_eq!(cfg.registry.max_concurrent_downloads, 2);
        assert_eq!(cfg.socket, Config::default().socket);
    }

    #[test]
    fn cni_section_keeps_other_defaults() {
        let cfg = Config::parse("[cni]\nconf_dir = \"/x/net.d\"\n").expect("parses");
        assert_eq!(cfg.cni.conf_dir, PathBuf::from("/x/net.d"));
        assert_eq!(cfg.cni.bin_dirs, CniConfig::default().bin_dirs);
        let mut cfg = Config::default();
        cfg.cni.plugin_timeout_secs = 0.0;
        assert!(cfg.validate().is_err());
    }

    #[test]
    fn drop_ins_override_in_name_order() {
        let dir = std::env::temp_dir().join(format!("berth-config-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let main = dir.join("config.toml");
        std::fs::write(
            &main,
            "log_level = \"debug\"\n[agent]\nnode_status_max_images = 5\nimage_gc_high_threshold_percent = 90\n[agent.eviction_hard]\n\"nodefs.available\" = \"5%\"\n",
        )
        .expect("write");
        let d = dir.join("config.d");
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("20-b.toml"), "[agent]\nnode_status_max_images = 7\n")
            .expect("write");
        std::fs::write(
            d.join("10-a.toml"),
            "[agent]\nnode_status_max_images = 6\n[agent.eviction_hard]\n\"memory.available\" = \"1Gi\"\n",
        )
        .expect("write");
        std::fs::write(d.join("ignored.conf"), "not toml at all").expect("write");
        let cfg = Config::load_with_drop_ins(&main, true, Some(&d)).expect("loads");
        assert_eq!(cfg.log_level, "debug");
        assert_eq!(cfg.agent.node_status_max_images, 7);
        assert_eq!(cfg.agent.image_gc_high_threshold_percent, 90);
        // Tables merge across files; a threshold map that is set replaces the defaults (as
        // the kubelet's evictionHard does).
        assert_eq!(cfg.agent.eviction_hard["memory.available"], "1Gi");
        assert_eq!(cfg.agent.eviction_hard["nodefs.available"], "5%");
        assert!(!cfg.agent.eviction_hard.contains_key("imagefs.available"));
        std::fs::write(d.join("30-bad.toml"), "[agent]\nno_such_field = 1\n").expect("write");
        let err = Config::load_with_drop_ins(&main, true, Some(&d)).expect_err("unknown field");
        assert!(err.to_string().contains("no_such_field"), "{err}");
        assert!(!err.to_string().contains("did you mean"), "{err}");
        // A typo in a drop-in that is not the last: that file is named, with the key meant.
        std::fs::remove_file(d.join("30-bad.toml")).expect("rm");
        std::fs::write(
            d.join("15-typo.toml"),
            "[agent]\nnode_status_max_imagse = 1\n",
        )
        .expect("write");
        let err = Config::load_with_drop_ins(&main, true, Some(&d)).expect_err("typo");
        let text = err.to_string();
        assert!(text.contains("15-typo.toml"), "{text}");
        assert!(
            text.contains("did you mean `node_status_max_images`?"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_field_is_an_error() {
        let err = Config::parse("rooot = \"/x\"").expect_err("unknown");
        assert_eq!(unknown_key_hint(err.message()), " (did you mean `root`?)");
        let err = Config::parse("[cni]\nplugin_timeout = 3").expect_err("unknown");
        assert_eq!(
            unknown_key_hint(err.message()),
            " (did you mean `plugin_timeout_secs`?)"
        );
    }

    #[test]
    fn zero_concurrency_is_invalid() {
        let mut cfg = Config::default();
        cfg.registry.max_concurrent_downloads = 0;
        assert!(cfg.validate().is_err());
    }
}
