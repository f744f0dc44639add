//! AppArmor: whether the host enforces it, Berth's default profile (`berth-default`, loaded at
//! start with `apparmor_parser`), and the profile a container's CRI security context asks for.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{LazyLock, OnceLock};

use k8s_cri::v1 as cri;

use super::spec::SpecError;

/// The name of Berth's default profile.
pub const DEFAULT_PROFILE: &str = "berth-default";

/// Where the kernel says whether AppArmor is enabled.
const ENABLED_PARAMETER: &str = "/sys/module/apparmor/parameters/enabled";
/// The profiles the kernel holds, one `name (mode)` per line.
const LOADED_PROFILES: &str = "/sys/kernel/security/apparmor/profiles";

/// Berth's default profile: everything a container's capabilities and namespaces allow, except
/// writing the host's kernel interfaces under /proc and /sys, reading the kernel's memory and
/// the security filesystem, and mounting; signals and ptrace only among processes under this
/// profile (and signals from unconfined ones, the runtime's). The same rules as the default
/// profile containerd and Docker apply.
const DEFAULT_PROFILE_TEXT: &str = r#"
@{PROC}=/proc/

profile berth-default flags=(attach_disconnected,mediate_deleted) {
  # What namespaces and capabilities already bound is allowed.
  network,
  capability,
  file,
  umount,

  # Signals from the runtime; signals and tracing only within this profile.
  signal (receive) peer=unconfined,
  signal (send,receive) peer=berth-default,
  ptrace (trace,read,tracedby,readby) peer=berth-default,

  # No mounts: a container that holds CAP_SYS_ADMIN still cannot remount what it was given.
  deny mount,

  # The host's kernel interfaces under /proc: files at its top, the directories that are not
  # a process's, and sysctls outside the IPC namespace's kernel.shm*.
  deny @{PROC}/* w,
  deny @{PROC}/{acpi,asound,bus,driver,dynamic_debug,fs,irq,scsi,sysvipc,tty}/** w,
  deny @{PROC}/sys/[^k]** w,
  deny @{PROC}/sys/kernel/{?,??,[^s][^h][^m]**} w,
  deny @{PROC}/sysrq-trigger rwklx,
  deny @{PROC}/kcore rwklx,
  deny @{PROC}/kmem rwklx,
  deny @{PROC}/mem rwklx,

  # /sys is the host's, but for the cgroup filesystem.
  deny /sys/[^f]*/** wklx,
  deny /sys/f[^s]*/** wklx,
  deny /sys/fs/[^c]*/** wklx,
  deny /sys/fs/c[^g]*/** wklx,
  deny /sys/fs/cg[^r]*/** wklx,
  deny /sys/firmware/** rwklx,
  deny /sys/kernel/security/** rwklx,
}
"#;

/// What this host offers: whether AppArmor is enforced and whether Berth's default profile
/// is loaded.
#[derive(Debug, Clone)]
pub struct Host {
    /// AppArmor is enabled in the kernel.
    pub enabled: bool,
    /// Berth's default profile is loaded (RuntimeDefault applies it).
    pub default_loaded: bool,
    /// The kernel's list of loaded profiles.
    profiles: PathBuf,
}

impl Host {
    /// A host without AppArmor.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            default_loaded: false,
            profiles: PathBuf::from(LOADED_PROFILES),
        }
    }

    /// A host with AppArmor whose loaded profiles are listed in `profiles` (the kernel's file,
    /// or a test's).
    pub fn enabled(profiles: &Path, default_loaded: bool) -> Self {
        Self {
            enabled: true,
            default_loaded,
            profiles: profiles.to_owned(),
        }
    }

    /// Whether a profile of this name is loaded.
    pub fn is_loaded(&self, name: &str) -> Result<bool, SpecError> {
        let list = std::fs::read_to_string(&self.profiles).map_err(|source| SpecError::Io {
            path: self.profiles.clone(),
            source,
        })?;
        Ok(list
            .lines()
            .any(|l| l.rsplit_once(" (").map_or(l, |(profile, _)| profile).trim() == name))
    }

    /// The profile the container's process runs under (None: unconfined), from the CRI's
    /// `apparmor` field or, without it, its deprecated `apparmor_profile` string
    /// (`runtime/default`, `unconfined`, `localhost/<name>`). A Localhost `localhost_ref` is
    /// the profile's name, with or without the `localhost/` prefix (the kubelet sends it bare,
    /// critest prefixed). Unset means the runtime's default; privileged containers get no
    /// default, only a profile named for them. On a host without AppArmor, RuntimeDefault and
    /// Unconfined mean no profile, and a named profile is refused: it cannot be enforced.
    pub fn profile_for(
        &self,
        sc: &cri::LinuxContainerSecurityContext,
    ) -> Result<Option<String>, SpecError> {
        use cri::security_profile::ProfileType;
        let (field, asked) = match &sc.apparmor {
            Some(p) => match ProfileType::try_from(p.profile_type) {
                Ok(ProfileType::RuntimeDefault) => ("apparmor", Asked::RuntimeDefault),
                Ok(ProfileType::Unconfined) => ("apparmor", Asked::Unconfined),
                Ok(ProfileType::Localhost) => (
                    "apparmor.localhost_ref",
                    Asked::Named(
                        p.localhost_ref
                            .strip_prefix("localhost/")
                            .unwrap_or(&p.localhost_ref)
                            .to_string(),
                    ),
                ),
                Err(_) => {
                    return Err(SpecError::invalid(
                        "apparmor.profile_type",
                        format!("unknown profile type {}", p.profile_type),
                    ));
                }
            },
            None => {
                #[allow(deprecated)]
                let legacy = sc.apparmor_profile.as_str();
                let asked = match legacy {
                    "" | "runtime/default" => Asked::RuntimeDefault,
                    "unconfined" => Asked::Unconfined,
                    other => match other.strip_prefix("localhost/") {
                        Some(name) => Asked::Named(name.to_string()),
                        None => {
                            return Err(SpecError::invalid(
                                "apparmor_profile",
                                format!(
                                    "unknown AppArmor profile {other:?} (runtime/default, unconfined or localhost/<name>)"
                                ),
                            ));
                        }
                    },
                };
                ("apparmor_profile", asked)
            }
        };
        match asked {
            Asked::Unconfined => Ok(None),
            // A privileged container runs unconfined unless a profile is named for it.
            Asked::RuntimeDefault if sc.privileged => Ok(None),
            Asked::RuntimeDefault if self.default_loaded => Ok(Some(DEFAULT_PROFILE.into())),
            Asked::RuntimeDefault => Ok(None),
            Asked::Named(name) if name.trim().is_empty() => Err(SpecError::invalid(
                field,
                "a Localhost profile needs a name",
            )),
            Asked::Named(name) if !self.enabled => Err(SpecError::Unsupported(format!(
                "AppArmor profile {name:?} ({field}): AppArmor is not enabled on this host"
            ))),
            Asked::Named(name) if !self.is_loaded(&name)? => Err(SpecError::Unsupported(format!(
                "AppArmor profile {name:?} ({field}) is not loaded on this host"
            ))),
            Asked::Named(name) => Ok(Some(name)),
        }
    }
}

/// What a security context asks for.
enum Asked {
    RuntimeDefault,
    Unconfined,
    Named(String),
}

static HOST: OnceLock<Host> = OnceLock::new();
static DISABLED: LazyLock<Host> = LazyLock::new(Host::disabled);

/// This host's AppArmor, as [`setup`] found it (disabled before it ran).
pub fn host() -> &'static Host {
    HOST.get().unwrap_or(&DISABLED)
}

/// Finds whether AppArmor is enabled and, if it is, loads (or replaces) Berth's default
/// profile with `apparmor_parser`. A host where the profile cannot be loaded runs containers
/// asking for the runtime default without a profile, with a warning.
pub fn setup() {
    let enabled = std::fs::read_to_string(ENABLED_PARAMETER).is_ok_and(|s| s.starts_with('Y'));
    let host = if enabled {
        let loaded = match load_default() {
            Ok(()) => {
                tracing::info!(profile = DEFAULT_PROFILE, "AppArmor profile loaded");
                true
            }
            Err(e) => {
                tracing::warn!(profile = DEFAULT_PROFILE, error = %e, "AppArmor is enabled but the default profile could not be loaded: containers run without it");
                false
            }
        };
        Host::enabled(Path::new(LOADED_PROFILES), loaded)
    } else {
        tracing::debug!("AppArmor is not enabled on this host");
        Host::disabled()
    };
    let _ = HOST.set(host);
}

/// `apparmor_parser --replace --skip-cache` with the default profile on its stdin.
fn load_default() -> Result<(), String> {
    let mut child = Command::new("apparmor_parser")
        .args(["--replace", "--skip-cache"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running apparmor_parser: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(DEFAULT_PROFILE_TEXT.as_bytes())
            .map_err(|e| format!("writing to apparmor_parser: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for apparmor_parser: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "apparmor_parser: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::security_profile::ProfileType;

    fn profile(kind: ProfileType, name: &str) -> cri::LinuxContainerSecurityContext {
        cri::LinuxContainerSecurityContext {
            apparmor: Some(cri::SecurityProfile {
                profile_type: kind as i32,
                localhost_ref: name.into(),
            }),
            ..Default::default()
        }
    }

    #[allow(deprecated)]
    fn legacy(s: &str, privileged: bool) -> cri::LinuxContainerSecurityContext {
        cri::LinuxContainerSecurityContext {
            apparmor_profile: s.into(),
            privileged,
            ..Default::default()
        }
    }

    fn enforcing(dir: &Path) -> Host {
        let list = dir.join("profiles");
        std::fs::write(
            &list,
            "berth-default (enforce)\nlocal-deny-tmp (enforce)\n/usr/bin/man (complain)\n",
        )
        .expect("write profiles");
        Host::enabled(&list, true)
    }

    #[test]
    fn the_fields_map_to_profiles_where_apparmor_is_enabled() {
        let dir = crate::util::ScratchDir::new("apparmor-enforcing");
        let h = enforcing(&dir);
        let some = |s: &str| Ok::<_, String>(Some(s.to_string()));
        let got = |sc| h.profile_for(&sc).map_err(|e| e.to_string());
        assert_eq!(
            got(profile(ProfileType::RuntimeDefault, "")),
            some("berth-default")
        );
        assert_eq!(got(profile(ProfileType::Unconfined, "")), Ok(None));
        assert_eq!(
            got(profile(ProfileType::Localhost, "local-deny-tmp")),
            some("local-deny-tmp")
        );
        assert_eq!(
            got(profile(ProfileType::Localhost, "localhost/local-deny-tmp")),
            some("local-deny-tmp"),
            "a prefixed localhost_ref names the same profile"
        );
        assert_eq!(
            got(profile(ProfileType::Localhost, "/usr/bin/man")),
            some("/usr/bin/man")
        );
        assert_eq!(got(legacy("", false)), some("berth-default"));
        assert_eq!(got(legacy("", true)), Ok(None), "privileged: unconfined");
        assert_eq!(got(legacy("runtime/default", true)), Ok(None));
        assert_eq!(
            got(legacy("localhost/local-deny-tmp", true)),
            some("local-deny-tmp")
        );
        assert_eq!(got(legacy("unconfined", false)), Ok(None));
        assert_eq!(
            got(legacy("localhost/local-deny-tmp", false)),
            some("local-deny-tmp")
        );
        // The structured field wins over the deprecated string.
        let mut both = profile(ProfileType::Unconfined, "");
        #[allow(deprecated)]
        {
            both.apparmor_profile = "localhost/local-deny-tmp".into();
        }
        assert_eq!(got(both), Ok(None));
    }

    #[test]
    fn unknown_and_unloaded_profiles_are_refused_with_their_names() {
        let dir = crate::util::ScratchDir::new("apparmor-refusing");
        let h = enforcing(&dir);
        let e = h
            .profile_for(&profile(ProfileType::Localhost, "no-such-profile"))
            .expect_err("not loaded");
        assert!(matches!(e, SpecError::Unsupported(_)), "{e:?}");
        assert!(e.to_string().contains("\"no-such-profile\""), "{e}");
        let e = h
            .profile_for(&legacy("localhost/berth", false))
            .expect_err("a prefix of a loaded name is not that name");
        assert!(e.to_string().contains("not loaded"), "{e}");
        let e = h
            .profile_for(&legacy("docker-default", false))
            .expect_err("not a CRI form");
        assert!(e.is_invalid_argument(), "{e:?}");
        let e = h
            .profile_for(&profile(ProfileType::Localhost, " "))
            .expect_err("no name");
        assert!(e.is_invalid_argument(), "{e:?}");
    }

    #[test]
    fn without_apparmor_only_named_profiles_are_refused() {
        let h = Host::disabled();
        assert_eq!(
            h.profile_for(&profile(ProfileType::RuntimeDefault, ""))
                .ok(),
            Some(None)
        );
        assert_eq!(h.profile_for(&legacy("", false)).ok(), Some(None));
        assert_eq!(h.profile_for(&legacy("unconfined", false)).ok(), Some(None));
        let e = h
            .profile_for(&profile(ProfileType::Localhost, "local-deny-tmp"))
            .expect_err("cannot be enforced");
        assert!(matches!(e, SpecError::Unsupported(_)), "{e:?}");
        assert!(e.to_string().contains("not enabled"), "{e}");
    }

    #[test]
    fn a_host_with_apparmor_but_no_default_profile_runs_runtime_default_unconfined() {
        let dir = crate::util::ScratchDir::new("apparmor-no-default");
        let list = dir.join("profiles");
        std::fs::write(&list, "").expect("write");
        let h = Host::enabled(&list, false);
        assert_eq!(h.profile_for(&legacy("", false)).ok(), Some(None));
    }
}
