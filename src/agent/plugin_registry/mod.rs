//! The plugin registry, as the kubelet's plugin manager watches it: a plugin puts a socket in
//! the registry directory, the agent asks it what it is (GetInfo), hands it to the part of the
//! agent that serves its type (device plugins), and tells it whether it was taken
//! (NotifyRegistrationStatus). A socket that goes away deregisters its plugin; one whose
//! registration failed is tried again with a growing pause.

pub mod api;

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::agent::devices::DeviceManager;
use crate::agent::devices::registration::check_plugin;
use api::registration_client::RegistrationClient;
use api::{InfoRequest, PluginInfo, RegistrationStatus};

/// The plugin type device plugins give.
pub const DEVICE_PLUGIN: &str = "DevicePlugin";

/// How often the directory is read again when inotify says nothing.
const RESCAN: Duration = Duration::from_secs(5);

/// How long connecting and each call to a plugin's registration socket may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a device plugin may take to be connected and to open its device list.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);

/// The first and the longest pause before a failed registration is tried again.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// How deep below the registry directory sockets are looked for.
const MAX_DEPTH: usize = 4;

/// A socket file, told apart from another made at the same path.
type SocketId = (u64, u64);

/// What the agent made of one socket in the registry.
struct Known {
    id: SocketId,
    /// The device plugin it registered (resource, service socket), once registered.
    device: Option<(String, PathBuf)>,
    /// When to try again, and the pause after that, while its registration fails.
    retry: Option<(Instant, Duration)>,
}

/// Watches `dir` until berthd ends, registering the plugins whose sockets appear in it.
pub async fn run(dir: PathBuf, devices: Arc<DeviceManager>) {
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "plugin registry directory");
    }
    let wake = Arc::new(Notify::new());
    crate::agent::dir_watch::spawn(dir.clone(), wake.clone(), "plugins");
    tracing::info!(dir = %dir.display(), "watching the plugin registry");
    let mut known: BTreeMap<PathBuf, Known> = BTreeMap::new();
    loop {
        let found = sockets(&dir);
        known.retain(|path, k| {
            let same = found.get(path) == Some(&k.id);
            if !same && let Some((resource, socket)) = &k.device {
                tracing::info!(socket = %path.display(), resource = %resource, "plugin socket gone: device plugin deregistered");
                devices.detach(resource, socket);
            }
            same
        });
        let now = Instant::now();
        for (path, id) in found {
            let due = match known.get(&path) {
                None => RETRY_FIRST,
                Some(Known {
                    retry: Some((at, pause)),
                    ..
                }) if *at <= now => *pause,
                Some(_) => continue,
            };
            let known_now = match register(&path, &dir, &devices).await {
                Ok(device) => Known {
                    id,
                    device: Some(device),
                    retry: None,
                },
                Err(why) => {
                    tracing::warn!(socket = %path.display(), %why, retry_in = ?due, "plugin not registered");
                    Known {
                        id,
                        device: None,
                        retry: Some((Instant::now() + due, (due * 2).min(RETRY_MAX))),
                    }
                }
            };
            known.insert(path, known_now);
        }
        let next_retry = known
            .values()
            .filter_map(|k| k.retry.map(|(at, _)| at))
            .fold(Instant::now() + RESCAN, Instant::min);
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep_until(next_retry) => {}
        }
    }
}

/// Registers the plugin on `socket`: the device plugin it turned out to be (resource, service
/// socket), or why it was not taken (which it is told too).
async fn register(
    socket: &Path,
    dir: &Path,
    devices: &Arc<DeviceManager>,
) -> Result<(String, PathBuf), String> {
    let channel = tokio::time::timeout(CALL_TIMEOUT, crate::client::unix_channel(socket))
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| format!("connecting: {e}"))?;
    let mut client = RegistrationClient::new(channel);
    let info = tokio::time::timeout(CALL_TIMEOUT, client.get_info(InfoRequest {}))
        .await
        .map_err(|_| "GetInfo timed out".to_string())?
        .map_err(|s| format!("GetInfo: {}", s.message()))?
        .into_inner();
    let taken = take(socket, dir, devices, &info).await;
    let status = match &taken {
        Ok(_) => RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        },
        Err(why) => RegistrationStatus {
            plugin_registered: false,
            error: why.clone(),
        },
    };
    match tokio::time::timeout(CALL_TIMEOUT, client.notify_registration_status(status)).await {
        Ok(Ok(_)) => {}
        Ok(Err(s)) => {
            tracing::warn!(socket = %socket.display(), error = %s.message(), "NotifyRegistrationStatus failed")
        }
        Err(_) => {
            tracing::warn!(socket = %socket.display(), "NotifyRegistrationStatus timed out")
        }
    }
    let device = taken?;
    tracing::info!(socket = %socket.display(), kind = %info.r#type, name = %info.name, "registered a plugin found in the registry");
    Ok(device)
}

/// Hands a plugin to the part of the agent serving its type.
async fn take(
    socket: &Path,
    dir: &Path,
    devices: &Arc<DeviceManager>,
    info: &PluginInfo,
) -> Result<(String, PathBuf), String> {
    if info.r#type != DEVICE_PLUGIN || devices.dir().as_os_str().is_empty() {
        return Err(format!(
            "no handler registered for plugin type {:?} (plugin {:?} at socket {})",
            info.r#type,
            info.name,
            socket.display()
        ));
    }
    check_plugin(&info.name, &info.supported_versions)?;
    let endpoint = service_socket(socket, dir, &info.endpoint);
    tokio::time::timeout(
        ATTACH_TIMEOUT,
        devices.clone().attach(&info.name, &endpoint, None),
    )
    .await
    .map_err(|_| format!("device plugin {:?}: attaching timed out", info.name))?
    .map_err(|e| e.to_string())?;
    Ok((info.name.clone(), endpoint))
}

/// The socket a plugin serves its own API on: the registration socket when it names none, a
/// path relative to the registry directory when it is not absolute.
fn service_socket(socket: &Path, dir: &Path, endpoint: &str) -> PathBuf {
    if endpoint.is_empty() {
        socket.to_path_buf()
    } else {
        dir.join(endpoint)
    }
}

/// The sockets under `dir` (not following links, skipping names that start with a dot, as the
/// kubelet does), each with what tells it apart from a later socket at the same path.
fn sockets(dir: &Path) -> BTreeMap<PathBuf, SocketId> {
    let mut found = BTreeMap::new();
    let mut pending = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().as_encoded_bytes().starts_with(b".") {
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let path = entry.path();
            if meta.file_type().is_socket() {
                found.insert(path, (meta.dev(), meta.ino()));
            } else if meta.is_dir() && depth < MAX_DEPTH {
                pending.push((path, depth + 1));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory of this test's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("berth-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("mkdir");
            Self(dir)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn sockets_are_found_below_the_directory_but_not_hidden_ones_or_plain_files() {
        let dir = Scratch::new("plugreg-scan");
        let bind = |p: &Path| std::os::unix::net::UnixListener::bind(p).expect("bind");
        let _a = bind(&dir.path().join("a.sock"));
        std::fs::create_dir(dir.path().join("csi")).expect("mkdir");
        let _b = bind(&dir.path().join("csi/b.sock"));
        let _hidden = bind(&dir.path().join(".c.sock"));
        std::fs::write(dir.path().join("d.sock"), b"").expect("write");
        let found: Vec<PathBuf> = sockets(dir.path()).into_keys().collect();
        assert_eq!(
            found,
            vec![dir.path().join("a.sock"), dir.path().join("csi/b.sock")]
        );
    }

    #[test]
    fn a_socket_made_again_at_the_same_path_is_another_socket() {
        let dir = Scratch::new("plugreg-inode");
        let path = dir.path().join("p.sock");
        let first = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let before = sockets(dir.path());
        // A second file is made before the first is removed, so its inode differs.
        let other = dir.path().join("q.sock");
        let second = std::os::unix::net::UnixListener::bind(&other).expect("bind");
        drop(first);
        std::fs::rename(&other, &path).expect("rename");
        let after = sockets(dir.path());
        assert_ne!(before.get(&path), after.get(&path));
        drop(second);
    }

    #[test]
    fn a_plugin_serves_on_its_registration_socket_unless_it_names_another() {
        let dir = Path::new("/var/lib/kubelet/plugins_registry");
        let socket = dir.join("dp.sock");
        assert_eq!(service_socket(&socket, dir, ""), socket);
        assert_eq!(
            service_socket(&socket, dir, "/run/gpu/dp.sock"),
            PathBuf::from("/run/gpu/dp.sock")
        );
        assert_eq!(
            service_socket(&socket, dir, "dp2.sock"),
            dir.join("dp2.sock")
        );
    }
}
