//! Volumes and env values from API objects: configMap and secret volumes (items, defaultMode,
//! optional), projected volumes (configMap, secret, downwardAPI and serviceAccountToken sources,
//! tokens from the TokenRequest API refreshed before 80 % of their life), and the configMap and
//! secret keys that env and envFrom name. The objects come from the node's watch of each
//! (`cluster/objects.rs`); tokens from the API server when they are due.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, KeyToPath, Pod, ServiceAccount, Volume, VolumeProjection,
};
use kube::api::{Api, PostParams};

use super::atomic::VolumeFile;
use super::downward::{self, NodeAllocatable};
use crate::agent::cluster::Cluster;

/// Mode of a volume file without one (the API's default for these volumes).
const DEFAULT_MODE: i32 = 0o644;

/// How long a container start waits for the services of its environment.
const SERVICES_READ: Duration = Duration::from_secs(10);

/// Life of a service-account token without an expirationSeconds (the API's default).
const DEFAULT_TOKEN_SECS: i64 = 3600;

use crate::agent::cluster::objects::Keys;
pub use crate::agent::cluster::objects::Kind;

struct Token {
    token: String,
    renew_at: Instant,
}

/// A pod's reads of the API server, with its service-account tokens kept until they are due.
pub struct ApiObjects {
    cluster: Arc<Cluster>,
    tokens: HashMap<(String, String), Token>,
}

impl ApiObjects {
    /// Reads for pods of `cluster`.
    pub fn new(cluster: Arc<Cluster>) -> Self {
        Self {
            cluster,
            tokens: HashMap::new(),
        }
    }

    /// An object's keys, from the node's watch of it.
    async fn keys(&self, ns: &str, kind: Kind, name: &str) -> Result<Keys, String> {
        self.cluster
            .objects
            .get(&self.cluster, kind, ns, name)
            .await
    }

    /// The values env and envFrom of `containers` name, by kind and object (None: the object
    /// does not exist), and the service variables. A static pod (`static_pod`) starts without
    /// the service variables when the API server cannot give them: it runs without one.
    pub async fn env_objects(
        &self,
        pod: &Pod,
        containers: &[&Container],
        static_pod: bool,
    ) -> Result<EnvObjects, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut wanted = Vec::new();
        for c in containers {
            for e in c.env_from.iter().flatten() {
                if let Some(r) = &e.config_map_ref {
                    wanted.push((Kind::ConfigMap, r.name.clone()));
                }
                if let Some(r) = &e.secret_ref {
                    wanted.push((Kind::Secret, r.name.clone()));
                }
            }
            for e in c.env.iter().flatten() {
                let Some(from) = &e.value_from else { continue };
                if let Some(r) = &from.config_map_key_ref {
                    wanted.push((Kind::ConfigMap, r.name.clone()));
                }
                if let Some(r) = &from.secret_key_ref {
                    wanted.push((Kind::Secret, r.name.clone()));
                }
            }
        }
        wanted.sort();
        wanted.dedup();
        let mut out = EnvObjects::default();
        for (kind, name) in wanted {
            let keys = self.keys(ns, kind, &name).await?;
            out.objects.insert((kind, name), keys);
        }
        let services = tokio::time::timeout(SERVICES_READ, self.service_env(pod, ns)).await;
        out.services = match services.unwrap_or_else(|_| {
            Err(format!(
                "reading the services for the pod's environment: no answer in {SERVICES_READ:?}"
            ))
        }) {
            Ok(env) => env,
            Err(e) if static_pod => {
                tracing::warn!(pod = ?pod.metadata.name, error = %e, "static pod started without the service variables");
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        Ok(out)
    }

    /// The service variables of a pod in `ns`: the namespace's services when the pod's
    /// `enableServiceLinks` is on (its default), and the API server's own service.
    async fn service_env(&self, pod: &Pod, ns: &str) -> Result<Vec<(String, String)>, String> {
        use crate::agent::runtime::service_env::{MASTER_SERVICE, service_env, services_for};
        use k8s_openapi::api::core::v1::Service;
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let client = self.cluster.client();
        let failed =
            |e: kube::Error| format!("reading the services for the pod's environment: {e}");
        let mut services = Vec::new();
        if links {
            let api: Api<Service> = Api::namespaced(client.clone(), ns);
            services = api
                .list(&Default::default())
                .await
                .map_err(failed)?
                .items
                .into_iter()
                .map(|mut s| {
                    s.metadata.namespace.get_or_insert_with(|| ns.to_string());
                    s
                })
                .collect();
        }
        let (master_ns, master) = MASTER_SERVICE;
        if !(links && ns == master_ns) {
            let api: Api<Service> = Api::namespaced(client, master_ns);
            if let Some(s) = api.get_opt(master).await.map_err(failed)? {
                services.push(s);
            }
        }
        Ok(service_env(&services_for(&services, ns, links)))
    }

    /// The files of `v` when it is a volume of API objects (configMap, secret, or projected
    /// with at least one such source), with whether it belongs on a tmpfs (secrets and tokens
    /// never touch the disk); None for other kinds.
    pub async fn volume_files(
        &mut self,
        pod: &Pod,
        v: &Volume,
        node: &NodeAllocatable,
    ) -> Result<Option<(Vec<VolumeFile>, bool)>, String> {
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let fail = |e: String| format!("MountVolume.SetUp failed for volume {:?} : {e}", v.name);
        if let Some(src) = ObjectSource::of_volume(v) {
            let files = self.source_files(&ns, &src).await.map_err(fail)?;
            // Secrets never reach the disk.
            return Ok(Some((files, src.kind == Kind::Secret)));
        }
        let Some(p) = &v.projected else {
            return Ok(None);
        };
        let sources = p.sources.as_deref().unwrap_or_default();
        if super::projected_downward_items(p).is_ok() {
            // Only downwardAPI sources: written without the API server.
            return Ok(None);
        }
        let mut files = Vec::new();
        for src in sources {
            files.extend(
                self.projection(pod, &ns, src, p.default_mode, node)
                    .await
                    .map_err(fail)?,
            );
        }
        Ok(Some((files, true)))
    }

    async fn projection(
        &mut self,
        pod: &Pod,
        ns: &str,
        src: &VolumeProjection,
        default_mode: Option<i32>,
        node: &NodeAllocatable,
    ) -> Result<Vec<VolumeFile>, String> {
        if let Some(object) = ObjectSource::of_projection(src, default_mode) {
            return self.source_files(ns, &object).await;
        }
        if let Some(d) = &src.downward_api {
            let items: Vec<_> = d.items.iter().flatten().cloned().collect();
            return Ok(downward::files(pod, &items, default_mode, node)?
                .into_iter()
                .map(|f| VolumeFile {
                    path: f.path,
                    data: f.content.into_bytes(),
                    mode: f.mode,
                })
                .collect());
        }
        if let Some(t) = &src.service_account_token {
            let token = self
                .token(pod, ns, t.audience.as_deref(), t.expiration_seconds)
                .await?;
            return Ok(vec![VolumeFile {
                path: t.path.clone(),
                data: token.into_bytes(),
                mode: mode_of(default_mode, None),
            }]);
        }
        Err("a projected source this node does not know (only configMap, secret, downwardAPI and serviceAccountToken)".into())
    }

    /// The files of one configMap or secret: every key, or the listed items.
    async fn source_files(
        &self,
        ns: &str,
        src: &ObjectSource<'_>,
    ) -> Result<Vec<VolumeFile>, String> {
        let kind = src.kind.name();
        let Some(keys) = self.keys(ns, src.kind, src.name).await? else {
            if src.optional {
                return Ok(Vec::new());
            }
            return Err(format!("{kind} {:?} not found", src.name));
        };
        let mode = |item: Option<i32>| mode_of(src.default_mode, item);
        let Some(items) = src.items else {
            return Ok(keys
                .into_iter()
                .map(|(path, data)| VolumeFile {
                    path,
                    data,
                    mode: mode(None),
                })
                .collect());
        };
        let mut files = Vec::new();
        for it in items {
            match keys.get(&it.key) {
                Some(v) => files.push(VolumeFile {
                    path: it.path.clone(),
                    data: v.clone(),
                    mode: mode(it.mode),
                }),
                None if src.optional => {}
                None => {
                    return Err(format!(
                        "{kind} references non-existent config key: {}",
                        it.key
                    ));
                }
            }
        }
        Ok(files)
    }

    /// A token of the pod's service account for `audience`, bound to the pod: the one held
    /// until 80 % of its life has passed, then a new one.
    async fn token(
        &mut self,
        pod: &Pod,
        ns: &str,
        audience: Option<&str>,
        expiration: Option<i64>,
    ) -> Result<String, String> {
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let key = (sa.clone(), audience.unwrap_or_default().to_string());
        if let Some(t) = self.tokens.get(&key)
            && Instant::now() < t.renew_at
        {
            return Ok(t.token.clone());
        }
        let secs = expiration.unwrap_or(DEFAULT_TOKEN_SECS).max(600);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: audience
                    .filter(|a| !a.is_empty())
                    .map(|a| vec![a.to_string()]),
                expiration_seconds: Some(secs),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.cluster.client(), ns);
        let answer: TokenRequest = api
            .create_subresource("token", &sa, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("requesting a token of service account {sa:?}: {e}"))?;
        let token = answer.status.and_then(|s| s.token).ok_or_else(|| {
            format!("the token request of service account {sa:?} returned no token")
        })?;
        let life = Duration::from_secs(secs as u64);
        self.tokens.insert(
            key,
            Token {
                token: token.clone(),
                renew_at: Instant::now() + life.mul_f64(0.8),
            },
        );
        Ok(token)
    }
}

/// A configMap or secret as a volume or a projected source names it.
struct ObjectSource<'a> {
    kind: Kind,
    name: &'a str,
    items: Option<&'a [KeyToPath]>,
    optional: bool,
    default_mode: Option<i32>,
}

impl<'a> ObjectSource<'a> {
    /// A configMap or secret volume.
    fn of_volume(v: &'a Volume) -> Option<Self> {
        if let Some(cm) = &v.config_map {
            return Some(Self {
                kind: Kind::ConfigMap,
                name: &cm.name,
                items: cm.items.as_deref(),
                optional: cm.optional.unwrap_or(false),
                default_mode: cm.default_mode,
            });
        }
        v.secret.as_ref().map(|s| Self {
            kind: Kind::Secret,
            name: s.secret_name.as_deref().unwrap_or_default(),
            items: s.items.as_deref(),
            optional: s.optional.unwrap_or(false),
            default_mode: s.default_mode,
        })
    }

    /// A configMap or secret source of a projected volume (whose mode is the volume's).
    fn of_projection(src: &'a VolumeProjection, default_mode: Option<i32>) -> Option<Self> {
        if let Some(cm) = &src.config_map {
            return Some(Self {
                kind: Kind::ConfigMap,
                name: &cm.name,
                items: cm.items.as_deref(),
                optional: cm.optional.unwrap_or(false),
                default_mode,
            });
        }
        src.secret.as_ref().map(|s| Self {
            kind: Kind::Secret,
            name: &s.name,
            items: s.items.as_deref(),
            optional: s.optional.unwrap_or(false),
            default_mode,
        })
    }
}

fn mode_of(default_mode: Option<i32>, item: Option<i32>) -> u32 {
    (item.or(default_mode).unwrap_or(DEFAULT_MODE) & 0o7777) as u32
}

/// The configMaps and secrets the env of a pod's containers names.
#[derive(Debug, Default, Clone)]
pub struct EnvObjects {
    objects: BTreeMap<(Kind, String), Keys>,
    services: Vec<(String, String)>,
}

impl EnvObjects {
    /// The service variables the container starts with (before envFrom and env).
    pub fn services(&self) -> &[(String, String)] {
        &self.services
    }

    /// Key `key` of object `name`: Err with the kubelet's message when the object or key is
    /// missing and not optional, Ok(None) when it is optional and missing.
    pub fn value(
        &self,
        kind: Kind,
        name: &str,
        key: &str,
        optional: bool,
    ) -> Result<Option<String>, String> {
        match self.objects.get(&(kind, name.to_string())) {
            Some(Some(keys)) => match keys.get(key) {
                Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
                None if optional => Ok(None),
                None => Err(format!(
                    "couldn't find key {key} in {} {name}",
                    match kind {
                        Kind::ConfigMap => "ConfigMap",
                        Kind::Secret => "Secret",
                    }
                )),
            },
            _ if optional => Ok(None),
            _ => Err(format!("{} {name:?} not found", kind.name())),
        }
    }

    /// Every key of object `name` (envFrom): empty when it is optional and missing.
    pub fn all(
        &self,
        kind: Kind,
        name: &str,
        optional: bool,
    ) -> Result<BTreeMap<String, String>, String> {
        match self.objects.get(&(kind, name.to_string())) {
            Some(Some(keys)) => Ok(keys
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect()),
            _ if optional => Ok(BTreeMap::new()),
            _ => Err(format!("{} {name:?} not found", kind.name())),
        }
    }
}
