//! Pods with `hostUsers: false` through the agent: each gets its own 65536 host ids, kept in its
//! pod directory across a restart of berthd and freed with the pod; an emptyDir written by the
//! pod's root holds host root's files.

mod agent_support;
mod cni_support;
mod common;

use std::os::unix::fs::MetadataExt;

use agent_support::*;
use common::{exec_ok, image};

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostUsers: false\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - name: scratch\n    emptyDir: {{}}\n  containers:\n  - name: main\n    image: {img}\n    command: [\"sh\", \"-c\", \"id -u > /scratch/uid && exec sleep 1000\"]\n    volumeMounts:\n    - name: scratch\n      mountPath: /scratch\n",
        img = image("busybox")
    )
}

/// `cat /proc/self/uid_map` of the running main container of pod `uid`, as numbers.
async fn uid_map(c: &berth::client::CriClient, uid: &str) -> Vec<u64> {
    let id = running_container(c, uid, "main").await;
    exec_ok(c, &id, &["cat", "/proc/self/uid_map"])
        .await
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_without_host_users_get_their_own_ids() {
    let net = cni_support::TestNet::new("aguns");
    net.bridge_up();
    net.write("10-test.conflist", &net.standard());
    let mut a = Agent::start_with(&net.daemon_args());
    a.write("one.yaml", &manifest("one"));
    a.write("two.yaml", &manifest("two"));
    let mut uids = Vec::new();
    for name in ["one", "two"] {
        let p = a.wait_pod("default", name, "running", |p| running(p, "main"));
        uids.push(p["metadata"]["uid"].as_str().expect("uid").to_string());
    }
    let c = a.daemon.client().await;
    let mut ranges = Vec::new();
    for uid in &uids {
        let map = uid_map(&c, uid).await;
        assert_eq!(map.len(), 3, "{map:?}");
        assert_eq!((map[0], map[2]), (0, 65536), "{map:?}");
        assert!(map[1] >= 65536 && map[1] % 65536 == 0, "{map:?}");
        ranges.push(map[1]);
        // Recorded in the pod's directory, as the kubelet does.
        let file = a.daemon.root().join("agent/pods").join(uid).join("userns");
        let stored: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).expect("userns file")).expect("json");
        assert_eq!(stored["uidMappings"][0]["hostId"].as_u64(), Some(map[1]));
        assert_eq!(stored["gidMappings"][0]["hostId"].as_u64(), Some(map[1]));
        // The emptyDir, written by the pod's root, holds a file of host root.
        let written = a
            .daemon
            .root()
            .join("agent/pods")
            .join(uid)
            .join("volumes/empty-dir/scratch/uid");
        let mut found = None;
        for _ in 0..100 {
            if let Ok(m) = std::fs::metadata(&written) {
                found = Some(m);
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let m = found.unwrap_or_else(|| panic!("{} written", written.display()));
        assert_eq!(m.uid(), 0);
        assert_eq!(std::fs::read_to_string(&written).expect("read"), "0\n");
    }
    assert_ne!(ranges[0], ranges[1], "no two pods share host ids");

    // berthd restarted under the pods: they keep their ranges.
    a.daemon.stop();
    a.respawn();
    let c = a.daemon.client().await;
    for (uid, host) in uids.iter().zip(&ranges) {
        a.wait("the pod adopted", std::time::Duration::from_secs(30), |a| {
            a.get("/pods").1["items"].as_array().is_some_and(|v| {
                v.iter()
                    .any(|p| p["metadata"]["uid"] == uid.as_str() && running(p, "main"))
            })
        });
        assert_eq!(uid_map(&c, uid).await[1], *host);
    }

    a.finish().await;
    for uid in &uids {
        assert!(
            !a.daemon.root().join("agent/pods").join(uid).exists(),
            "the pod's directory, and its range with it, is gone"
        );
    }
}
