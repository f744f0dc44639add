//! The runtime core: pod sandboxes and containers, their state and events.

pub mod apparmor;
pub mod cgroup_attach;
pub mod cgroup_driver;
pub mod cgroups;
pub mod container;
pub mod container_create;
pub mod container_exit;
pub mod container_stream;
pub mod container_update;
pub mod decoded;
pub mod dir_modes;
pub mod events;
pub mod names;
pub mod pin;
pub mod pod_init;
pub mod process;
pub mod sandbox;
pub mod sandbox_files;
pub mod sandbox_gate;
pub mod shim_client;
pub mod spec;
pub mod spec_seccomp;
pub mod spec_user;
pub mod systemd_units;
pub mod unrecorded;
pub mod userns;
