//! Device plugins, as the kubelet's device manager serves them: plugins register on
//! `kubelet.sock` and list their devices; the node reports each resource's devices as capacity
//! and its healthy ones as allocatable; admission gives each container of a pod the devices it
//! asks for (or refuses the pod); before a container starts, the plugin is asked to set them up
//! and its answer (env, mounts, device nodes, annotations, CDI devices) goes into the
//! container's CRI config. Allocations are kept on disk across restarts.

pub mod api;
pub mod assign;
pub mod checkpoint;
pub mod plugin;
pub mod registration;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use api::ContainerAllocateResponse;
use checkpoint::{Allocations, ContainerDevices, Granted, GrantedDevice, GrantedMount};
use plugin::Plugin;

/// The health a plugin gives a device that can be used.
pub const HEALTHY: &str = "Healthy";

/// What went wrong with a device plugin.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// Its socket did not answer.
    #[error("device plugin for {resource}: connecting to {socket}: {error}")]
    Connect {
        resource: String,
        socket: PathBuf,
        error: String,
    },
    /// A call failed.
    #[error("device plugin for {resource}: {call} failed: {message}")]
    Rpc {
        resource: String,
        call: &'static str,
        message: String,
    },
    /// No plugin serves the resource now.
    #[error("no device plugin for {0} is registered")]
    NotRegistered(String),
}

/// A pod refused because its devices are not there: the kubelet's reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    pub message: String,
}

/// The kubelet's reason for a pod its device manager cannot serve.
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";

/// A resource's plugin (while one is connected) and devices (healthy or not).
#[derive(Default)]
struct Resource {
    plugin: Option<Arc<Plugin>>,
    devices: BTreeMap<String, bool>,
}

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    pods: Allocations,
}

/// Each resource's healthy devices.
fn healthy_of(resources: &BTreeMap<String, Resource>) -> assign::DeviceIds {
    resources
        .iter()
        .map(|(name, r)| {
            let healthy = r.devices.iter().filter(|(_, h)| **h);
            (name.clone(), healthy.map(|(id, _)| id.clone()).collect())
        })
        .collect()
}

/// The devices of `resource` a container could hold: the healthy ones no other container
/// (of any pod) holds, and `own`, in ID order.
fn available_in(
    st: &State,
    uid: &str,
    container: &str,
    resource: &str,
    own: &[String],
) -> Option<Vec<String>> {
    let r = st.resources.get(resource)?;
    let taken: BTreeSet<&String> = st
        .pods
        .iter()
        .flat_map(|(pod, cs)| cs.iter().map(move |(c, d)| (pod, c, d)))
        .filter(|(pod, c, _)| !(pod.as_str() == uid && c.as_str() == container))
        .filter_map(|(_, _, d)| d.ids.get(resource))
        .flatten()
        .collect();
    let available = r
        .devices
        .iter()
        .filter(|(id, healthy)| (**healthy && !taken.contains(id)) || own.contains(id))
        .map(|(id, _)| id.clone())
        .collect();
    Some(available)
}

/// The devices each container of pod `uid` holds, by container name.
fn held_by(pods: &Allocations, uid: &str) -> BTreeMap<String, assign::DeviceIds> {
    pods.get(uid)
        .map(|cs| cs.iter().map(|(c, d)| (c.clone(), d.ids.clone())).collect())
        .unwrap_or_default()
}

/// The node's device plugins and the devices its pods hold.
pub struct DeviceManager {
    dir: PathBuf,
    checkpoint: PathBuf,
    state: Mutex<State>,
    changes: watch::Sender<u64>,
}

impl DeviceManager {
    /// A manager whose plugins register in `dir`, keeping its allocations in `checkpoint`.
    pub fn new(dir: &Path, checkpoint: &Path) -> Self {
        let pods = checkpoint::load(checkpoint);
        Self {
            dir: dir.to_path_buf(),
            checkpoint: checkpoint.to_path_buf(),
            state: Mutex::new(State {
                resources: BTreeMap::new(),
                pods,
            }),
            changes: watch::channel(0).0,
        }
    }

    /// The device plugin directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Ticks whenever a resource's devices change (for the node status).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Each resource's device count and healthy device count (the node's capacity and
    /// allocatable for it).
    pub fn resources(&self) -> BTreeMap<String, (u64, u64)> {
        let Ok(st) = self.state.lock() else {
            return BTreeMap::new();
        };
        st.resources
            .iter()
            .map(|(name, r)| {
                let healthy = r.devices.values().filter(|h| **h).count() as u64;
                (name.clone(), (r.devices.len() as u64, healthy))
            })
            .collect()
    }

    /// Each resource's healthy devices.
    pub fn healthy_devices(&self) -> assign::DeviceIds {
        self.state
            .lock()
            .map(|st| healthy_of(&st.resources))
            .unwrap_or_default()
    }

    /// The devices each container of pod `uid` holds, by container name.
    pub fn pod_devices(&self, uid: &str) -> BTreeMap<String, assign::DeviceIds> {
        self.state
            .lock()
            .map(|st| held_by(&st.pods, uid))
            .unwrap_or_default()
    }

    /// Connects to the plugin serving `resource` on `socket` (with the `options` it gave, or
    /// those it answers when asked) and opens its device list; the list is then followed in a
    /// task of its own until its stream ends, when the devices turn unhealthy until the
    /// resource registers again. A newer registration of a resource replaces an older one.
    pub async fn attach(
        self: Arc<Self>,
        resource: &str,
        socket: &Path,
        options: Option<api::DevicePluginOptions>,
    ) -> Result<(), DeviceError> {
        let plugin = Arc::new(Plugin::connect(resource, socket, options).await?);
        let stream = plugin.list_and_watch().await?;
        if let Ok(mut st) = self.state.lock() {
            st.resources
                .entry(plugin.resource.clone())
                .or_default()
                .plugin = Some(plugin.clone());
        }
        tokio::spawn(self.follow(plugin, stream));
        Ok(())
    }

    /// Takes a registered plugin's device lists until its stream ends.
    async fn follow(
        self: Arc<Self>,
        plugin: Arc<Plugin>,
        mut stream: tonic::Streaming<api::ListAndWatchResponse>,
    ) {
        loop {
            let listed = match stream.message().await {
                Ok(Some(listed)) => listed,
                Ok(None) => {
                    tracing::warn!(resource = %plugin.resource, "device plugin ended its device list");
                    break;
                }
                Err(status) => {
                    tracing::warn!(resource = %plugin.resource, error = %status.message(), "device plugin's device list failed");
                    break;
                }
            };
            let devices: BTreeMap<String, bool> = listed
                .devices
                .iter()
                .map(|d| (d.id.clone(), d.health == HEALTHY))
                .collect();
            tracing::info!(resource = %plugin.resource, devices = devices.len(), healthy = devices.values().filter(|h| **h).count(), "device plugin listed its devices");
            let Ok(mut st) = self.state.lock() else {
                return;
            };
            let r = st.resources.entry(plugin.resource.clone()).or_default();
            if !r.plugin.as_ref().is_some_and(|p| Arc::ptr_eq(p, &plugin)) {
                // A newer registration of the resource took over.
                return;
            }
            r.devices = devices;
            drop(st);
            self.changed();
        }
        // Only this registration: a newer one of the resource may serve on the same socket.
        self.forget(&plugin.resource, |p| Arc::ptr_eq(p, &plugin));
    }

    /// Forgets the plugin serving `resource` on `socket`, if it is the one registered: its
    /// devices stay counted but none is allocatable until the resource registers again.
    pub fn detach(&self, resource: &str, socket: &Path) {
        self.forget(resource, |p| p.socket == socket);
    }

    /// Forgets `resource`'s registered plugin if `is_it` says it is the one meant.
    fn forget(&self, resource: &str, is_it: impl Fn(&Arc<Plugin>) -> bool) {
        if let Ok(mut st) = self.state.lock()
            && let Some(r) = st.resources.get_mut(resource)
            && r.plugin.as_ref().is_some_and(is_it)
        {
            r.plugin = None;
            r.devices.values_mut().for_each(|h| *h = false);
        }
        self.changed();
    }

    /// Gives the containers of pod `uid` the devices they ask for, keeping those they hold;
    /// a pod asking for more than is free is refused with the kubelet's message. Resources
    /// no plugin has served are not this manager's to check.
    pub fn admit(&self, uid: &str, pod: &Pod) -> Result<(), Unavailable> {
        let Ok(mut st) = self.state.lock() else {
            return Ok(());
        };
        // A resource is a device plugin's once a plugin served it or a pod holds its devices
        // (after a restart, before its plugin registers again).
        let held_resources = st
            .pods
            .values()
            .flat_map(|cs| cs.values())
            .flat_map(|c| c.ids.keys());
        let known: BTreeSet<String> = st.resources.keys().chain(held_resources).cloned().collect();
        let demands = assign::demands(pod, |r| known.contains(r));
        if demands.is_empty() {
            return Ok(());
        }
        let mut free: BTreeMap<String, BTreeSet<String>> = healthy_of(&st.resources)
            .into_iter()
            .map(|(name, ids)| (name, ids.into_iter().collect()))
            .collect();
        for (other, containers) in &st.pods {
            if other == uid {
                continue;
            }
            for (resource, ids) in containers.values().flat_map(|c| &c.ids) {
                if let Some(set) = free.get_mut(resource) {
                    ids.iter().for_each(|id| {
                        set.remove(id);
                    });
                }
            }
        }
        let held = held_by(&st.pods, uid);
        let chosen = assign::assign(&demands, &held, &free).map_err(|s| Unavailable {
            message: format!(
                "Allocate failed due to requested number of devices unavailable for {}. Requested: {}, Available: {}, which is unexpected",
                s.resource, s.requested, s.available
            ),
        })?;
        let previous = st.pods.remove(uid).unwrap_or_default();
        let mut containers = BTreeMap::new();
        for (name, ids) in chosen {
            // A container keeps the plugins' answer while its devices are the same.
            let granted = previous
                .get(&name)
                .filter(|p| p.ids == ids)
                .and_then(|p| p.granted.clone());
            containers.insert(name, ContainerDevices { ids, granted });
        }
        let changed = containers != previous;
        st.pods.insert(uid.to_string(), containers);
        if changed {
            self.save(&st.pods);
        }
        Ok(())
    }

    /// Frees the devices of every pod but those in `uids`.
    pub fn retain_pods(&self, uids: &HashSet<&str>) {
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let before = st.pods.len();
        st.pods.retain(|uid, _| uids.contains(uid.as_str()));
        if st.pods.len() != before {
            self.save(&st.pods);
        }
    }

    /// What container `container` of pod `uid` gets from the device plugins (None when it
    /// holds no devices): asked of the plugins the first time, then as kept; plugins that
    /// want to know are told the container is starting.
    pub async fn grant(&self, uid: &str, container: &str) -> Result<Option<Granted>, DeviceError> {
        let (held, plugins) = {
            let Ok(st) = self.state.lock() else {
                return Ok(None);
            };
            let Some(held) = st.pods.get(uid).and_then(|p| p.get(container)).cloned() else {
                return Ok(None);
            };
            let plugins: BTreeMap<String, Option<Arc<Plugin>>> = held
                .ids
                .keys()
                .map(|r| {
                    let plugin = st.resources.get(r).and_then(|r| r.plugin.clone());
                    (r.clone(), plugin)
                })
                .collect();
            (held, plugins)
        };
        let plugin_of = |resource: &str| {
            plugins
                .get(resource)
                .cloned()
                .flatten()
                .ok_or_else(|| DeviceError::NotRegistered(resource.to_string()))
        };
        // Before its first Allocate, a container may take the devices its plugins prefer.
        let held = if held.granted.is_none() {
            self.prefer(uid, container, held, &plugins).await
        } else {
            held
        };
        let granted = match held.granted {
            Some(g) => g,
            None => {
                let mut granted = Granted::default();
                for (resource, ids) in &held.ids {
                    let answer = plugin_of(resource)?.allocate(ids).await?;
                    merge(&mut granted, answer);
                }
                if let Ok(mut st) = self.state.lock()
                    && let Some(c) = st.pods.get_mut(uid).and_then(|p| p.get_mut(container))
                    && c.ids == held.ids
                {
                    c.granted = Some(granted.clone());
                    self.save(&st.pods);
                }
                granted
            }
        };
        for (resource, ids) in &held.ids {
            match plugin_of(resource) {
                Ok(p) if p.options.pre_start_required => p.pre_start(ids).await?,
                Ok(_) => {}
                // Set up before; a plugin that went away is told when it is back.
                Err(e) => {
                    tracing::warn!(pod = uid, container, error = %e, "container starts without its plugin's PreStartContainer")
                }
            }
        }
        Ok(Some(granted))
    }

    /// Swaps a container's devices for those its plugins prefer (plugins that offer a
    /// preference), from the devices no other container holds and its own; a preference that
    /// fails, does not fit or was overtaken keeps the devices admission chose.
    async fn prefer(
        &self,
        uid: &str,
        container: &str,
        mut held: ContainerDevices,
        plugins: &BTreeMap<String, Option<Arc<Plugin>>>,
    ) -> ContainerDevices {
        for (resource, plugin) in plugins {
            let Some(plugin) = plugin
                .as_ref()
                .filter(|p| p.options.get_preferred_allocation_available)
            else {
                continue;
            };
            let Some(ids) = held.ids.get(resource).cloned() else {
                continue;
            };
            let Some(available) = self.available_to(uid, container, resource, &ids) else {
                continue;
            };
            let preferred = match plugin.preferred(&available, ids.len()).await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(pod = uid, container, error = %e, "devices kept as admitted");
                    continue;
                }
            };
            if !assign::preference_fits(&preferred, &available, ids.len()) {
                tracing::warn!(pod = uid, container, resource = %resource, ?preferred, ?available, "the plugin's preferred devices do not fit: devices kept as admitted");
                continue;
            }
            if preferred == ids {
                continue;
            }
            let Ok(mut st) = self.state.lock() else {
                continue;
            };
            // Taken only while every preferred device is still free, and the container still
            // holds what it held.
            let still_free = available_in(&st, uid, container, resource, &ids)
                .is_some_and(|now| preferred.iter().all(|id| now.contains(id)));
            let Some(c) = st.pods.get_mut(uid).and_then(|p| p.get_mut(container)) else {
                continue;
            };
            if !still_free || c.ids.get(resource) != Some(&ids) || c.granted.is_some() {
                continue;
            }
            c.ids.insert(resource.clone(), preferred.clone());
            held.ids.insert(resource.clone(), preferred);
            self.save(&st.pods);
        }
        held
    }

    /// The devices of `resource` container `container` of pod `uid` could hold: the healthy
    /// ones no other container holds, and `own`.
    fn available_to(
        &self,
        uid: &str,
        container: &str,
        resource: &str,
        own: &[String],
    ) -> Option<Vec<String>> {
        let st = self.state.lock().ok()?;
        available_in(&st, uid, container, resource, own)
    }

    fn save(&self, pods: &Allocations) {
        if let Err(e) = checkpoint::save(&self.checkpoint, pods) {
            tracing::warn!(file = %self.checkpoint.display(), error = %e, "device allocations not saved");
        }
    }
}

/// Adds one plugin's answer for a container to what the container gets.
fn merge(granted: &mut Granted, answer: ContainerAllocateResponse) {
    granted.envs.extend(answer.envs);
    granted.annotations.extend(answer.annotations);
    granted
        .mounts
        .extend(answer.mounts.into_iter().map(|m| GrantedMount {
            container_path: m.container_path,
            host_path: m.host_path,
            read_only: m.read_only,
        }));
    granted
        .devices
        .extend(answer.devices.into_iter().map(|d| GrantedDevice {
            container_path: d.container_path,
            host_path: d.host_path,
            permissions: d.permissions,
        }));
    granted
        .cdi_devices
        .extend(answer.cdi_devices.into_iter().map(|d| d.name));
}

/// Puts what the plugins gave a container into its CRI config.
pub fn apply(granted: &Granted, config: &mut cri::ContainerConfig) {
    for (key, value) in &granted.envs {
        config.envs.retain(|kv| kv.key != *key);
        config.envs.push(cri::KeyValue {
            key: key.clone(),
            value: value.clone(),
        });
    }
    config
        .mounts
        .extend(granted.mounts.iter().map(|m| cri::Mount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            readonly: m.read_only,
            ..Default::default()
        }));
    config
        .devices
        .extend(granted.devices.iter().map(|d| cri::Device {
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            permissions: d.permissions.clone(),
        }));
    config.annotations.extend(granted.annotations.clone());
    config.cdi_devices.extend(
        granted
            .cdi_devices
            .iter()
            .map(|name| cri::CdiDevice { name: name.clone() }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_ended_registration_forgets_only_itself_not_a_newer_one_on_the_same_socket() {
        let dir = std::env::temp_dir().join(format!("berth-devforget-{}", std::process::id()));
        let m = DeviceManager::new(&dir, &dir.join("devices.json"));
        let socket = dir.join("gpu.sock");
        let register = |p: &Arc<Plugin>| {
            let mut st = m.state.lock().expect("lock");
            let r = st.resources.entry("example.com/gpu".into()).or_default();
            r.plugin = Some(p.clone());
            r.devices = [("g0".to_string(), true)].into();
        };
        let older = Arc::new(Plugin::unconnected("example.com/gpu", &socket));
        let newer = Arc::new(Plugin::unconnected("example.com/gpu", &socket));
        register(&older);
        register(&newer);
        // The older registration's device list ends after the newer one took over.
        m.forget("example.com/gpu", |p| Arc::ptr_eq(p, &older));
        assert_eq!(
            m.resources()["example.com/gpu"],
            (1, 1),
            "the newer plugin kept"
        );
        // Its socket removed from the registry: whichever plugin serves on it is forgotten.
        m.detach("example.com/gpu", &socket);
        assert_eq!(m.resources()["example.com/gpu"], (1, 0));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn answers_of_several_plugins_add_up_and_go_into_the_config() {
        let mut granted = Granted::default();
        merge(
            &mut granted,
            ContainerAllocateResponse {
                envs: [("GPU".to_string(), "g0".to_string())].into(),
                mounts: vec![api::Mount {
                    container_path: "/dev-data".into(),
                    host_path: "/srv/gpu".into(),
                    read_only: true,
                }],
                devices: vec![api::DeviceSpec {
                    container_path: "/dev/gpu0".into(),
                    host_path: "/dev/null".into(),
                    permissions: "rw".into(),
                }],
                annotations: [("a".to_string(), "1".to_string())].into(),
                cdi_devices: vec![api::CdiDevice {
                    name: "example.com/gpu=g0".into(),
                }],
            },
        );
        merge(
            &mut granted,
            ContainerAllocateResponse {
                envs: [("NIC".to_string(), "n1".to_string())].into(),
                ..Default::default()
            },
        );
        let mut config = cri::ContainerConfig {
            envs: vec![cri::KeyValue {
                key: "GPU".into(),
                value: "from the pod".into(),
            }],
            ..Default::default()
        };
        apply(&granted, &mut config);
        let env: BTreeMap<_, _> = config
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(env, [("GPU", "g0"), ("NIC", "n1")].into());
        assert_eq!(config.mounts.len(), 1);
        assert!(config.mounts[0].readonly);
        assert_eq!(config.devices[0].host_path, "/dev/null");
        assert_eq!(config.annotations["a"], "1");
        assert_eq!(config.cdi_devices[0].name, "example.com/gpu=g0");
    }
}
