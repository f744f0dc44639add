//! CNI test fixtures: a conf dir, a bridge and a /24 unique to the test, broken plugins, and a
//! guard that deletes the bridge, its veths and the test's netns even when the test fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::common::TempDir;

/// Debian's plugins.
pub const DEBIAN_CNI: &str = "/usr/lib/cni";

/// A test network: its own dir (conf, bin, IPAM data), bridge and subnet.
pub struct TestNet {
    pub dir: TempDir,
    /// Bridge name (`bt` + 8 hex digits).
    pub bridge: String,
    /// The first three octets of the subnet, e.g. `10.163.25`.
    pub prefix: String,
    /// Network name (unique too: host-local keys its data by it).
    pub name: String,
    /// Named netns the test made (deleted on drop).
    pub netns: std::cell::RefCell<Vec<String>>,
}

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("run ip")
}

impl TestNet {
    pub fn new(tag: &str) -> Self {
        let dir = TempDir::new(&format!("cni-{tag}"));
        let mut r = [0u8; 4];
        getrandom::fill(&mut r).expect("random");
        let bridge = format!("bt{}", hex::encode(r));
        // 10.128.0.0/10 holds 16384 /24s: a clash between parallel tests is unlikely.
        let prefix = format!("10.{}.{}", 128 + (r[0] % 64), r[1]);
        std::fs::create_dir_all(dir.path().join("net.d")).expect("conf dir");
        std::fs::create_dir_all(dir.path().join("bin")).expect("bin dir");
        Self {
            dir,
            name: format!("net-{}", hex::encode(r)),
            bridge,
            prefix,
            netns: Default::default(),
        }
    }

    pub fn conf_dir(&self) -> PathBuf {
        self.dir.path().join("net.d")
    }
    pub fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("ipam")
    }
    pub fn subnet(&self) -> String {
        format!("{}.0/24", self.prefix)
    }
    pub fn gateway(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// berthd flags for this network: conf dir, test bin dir then Debian's, short timeout.
    pub fn daemon_args(&self) -> Vec<String> {
        vec![
            "--cni-conf-dir".into(),
            self.conf_dir().display().to_string(),
            "--cni-bin-dir".into(),
            self.bin_dir().display().to_string(),
            "--cni-bin-dir".into(),
            DEBIAN_CNI.into(),
            "--cni-plugin-timeout".into(),
            "3".into(),
        ]
    }

    /// The bridge plugin with host-local in the test's /24 and data dir. No gateway mode (it
    /// would turn on the host's IP forwarding): [`Self::bridge_up`] gives the bridge .1.
    pub fn bridge_plugin(&self) -> Value {
        json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": false,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": self.subnet(), "gateway": self.gateway() }]],
                "dataDir": self.data_dir(),
            }
        })
    }

    /// A conflist of `plugins` at `version`.
    pub fn conflist(&self, version: &str, plugins: Vec<Value>) -> Value {
        json!({ "cniVersion": version, "name": self.name, "plugins": plugins })
    }

    /// bridge + portmap at 1.0.0.
    pub fn standard(&self) -> Value {
        self.standard_at("1.0.0")
    }

    /// bridge + portmap at `version`.
    pub fn standard_at(&self, version: &str) -> Value {
        self.conflist(
            version,
            vec![
                self.bridge_plugin(),
                json!({ "type": "portmap", "capabilities": { "portMappings": true }, "snat": false }),
            ],
        )
    }

    /// Writes `value` as `file` in the conf dir.
    pub fn write(&self, file: &str, value: &Value) {
        let path = self.conf_dir().join(file);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(value).expect("json")).expect("write conf");
        std::fs::rename(&tmp, &path).expect("rename conf");
    }

    /// Creates the bridge up front with the gateway address (the host's side of the subnet).
    pub fn bridge_up(&self) {
        let br = self.bridge.as_str();
        let gw = format!("{}/24", self.gateway());
        for args in [
            vec!["link", "add", br, "type", "bridge"],
            vec!["addr", "add", gw.as_str(), "dev", br],
            vec!["link", "set", br, "up"],
        ] {
            let out = ip(&args);
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// A plugin named `name` in the test bin dir running `script` (sh). Every call appends
    /// `$CNI_COMMAND` to `<dir>/<name>.calls`.
    pub fn fake_plugin(&self, name: &str, script: &str) {
        let calls = self.dir.path().join(format!("{name}.calls"));
        let body = format!(
            "#!/bin/sh\necho \"$CNI_COMMAND\" >> {}\ncat > /dev/null\n{script}\n",
            calls.display()
        );
        let path = self.bin_dir().join(name);
        std::fs::write(&path, body).expect("write plugin");
        let mut perm = std::fs::metadata(&path).expect("stat").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
        std::fs::set_permissions(&path, perm).expect("chmod");
    }

    /// CNI_COMMANDs the fake plugin `name` received.
    pub fn calls(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.calls")))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// IPs host-local holds for this network.
    pub fn allocations(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.data_dir().join(&self.name))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Host interfaces enslaved to the bridge (the pods' veths).
    pub fn veths(&self) -> Vec<String> {
        let out = ip(&["-o", "link", "show", "master", &self.bridge]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect()
    }

    /// A named netns for library-level tests (`ip netns add`), deleted on drop.
    pub fn add_netns(&self, suffix: &str) -> PathBuf {
        let name = format!("{}-{suffix}", self.bridge);
        let out = ip(&["netns", "add", &name]);
        assert!(
            out.status.success(),
            "ip netns add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = Command::new("ip")
            .args(["-n", &name, "link", "set", "lo", "up"])
            .status();
        self.netns.borrow_mut().push(name.clone());
        Path::new("/run/netns").join(name)
    }
}

/// Removes portmap's NAT rules and chains for network `name` (left when a test failed before
/// DEL): rules whose comment names the network, and the per-pod chains they jump to.
fn remove_nat_rules(name: &str) {
    let Ok(out) = Command::new("iptables-save").args(["-t", "nat"]).output() else {
        return;
    };
    let needle = format!("name: \\\"{name}\\\"");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut chains = Vec::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("-A ") && l.contains(&needle))
    {
        if let Some(chain) = line.split(" -j ").nth(1).map(str::trim)
            && chain.starts_with("CNI-DN-")
        {
            chains.push(chain.to_string());
        }
        // Re-issue the rule as a delete (the shell undoes iptables-save's quoting).
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("iptables -t nat -D {}", &line[3..]))
            .status();
    }
    for chain in chains {
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-F", &chain])
            .status();
        let _ = Command::new("iptables")
            .args(["-t", "nat", "-X", &chain])
            .status();
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        remove_nat_rules(&self.name);
        for v in self.veths() {
            let _ = ip(&["link", "del", &v]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
        for n in self.netns.borrow().iter() {
            let _ = ip(&["netns", "del", n]);
        }
    }
}
