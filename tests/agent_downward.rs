//! The agent's downward API: downwardAPI and projected volume files, env fieldRef and
//! resourceFieldRef values, and item paths that try to leave the volume.

mod agent_support;
mod common;

use std::path::Path;

use agent_support::*;
use common::image;

/// The pod: labels, annotations needing escapes, resources on `main` and none on `side`.
fn downward_pod() -> String {
    let img = image("busybox");
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: dw
  labels:
    tier: "back end"
    app: dw
  annotations:
    plain: ok
    note: "say \"hi\"\n\tbye"
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  volumes:
  - name: podinfo
    downwardAPI:
      defaultMode: 292
      items:
      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
      - {{path: namespace, fieldRef: {{fieldPath: metadata.namespace}}}}
      - {{path: uid, fieldRef: {{fieldPath: metadata.uid}}}}
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: annotations, fieldRef: {{fieldPath: metadata.annotations}}}}
      - {{path: cpu_limit, resourceFieldRef: {{containerName: main, resource: limits.cpu, divisor: 1m}}}}
      - {{path: cpu_request, resourceFieldRef: {{containerName: main, resource: requests.cpu}}}}
      - {{path: mem/limit, mode: 384, resourceFieldRef: {{containerName: main, resource: limits.memory, divisor: 1Mi}}}}
      - {{path: side_memory, resourceFieldRef: {{containerName: side, resource: limits.memory}}}}
      - {{path: side_cpu, resourceFieldRef: {{containerName: side, resource: limits.cpu}}}}
  - name: proj
    projected:
      sources:
      - downwardAPI:
          items:
          - {{path: app, fieldRef: {{fieldPath: "metadata.labels['app']"}}}}
  containers:
  - name: main
    image: {img}
    command: ["sh", "-c", "sleep 3600"]
    resources:
      limits: {{cpu: 250m, memory: 64Mi}}
      requests: {{cpu: 100m, memory: 32Mi}}
    env:
    - {{name: MY_NAME, valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}}}
    - {{name: MY_UID, valueFrom: {{fieldRef: {{fieldPath: metadata.uid}}}}}}
    - {{name: MY_TIER, valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['tier']"}}}}}}
    - {{name: CPU_LIMIT, valueFrom: {{resourceFieldRef: {{resource: limits.cpu, divisor: 1m}}}}}}
    - {{name: MEM_REQUEST, valueFrom: {{resourceFieldRef: {{resource: requests.memory, divisor: 1Mi}}}}}}
    - {{name: SIDE_MEMORY, valueFrom: {{resourceFieldRef: {{containerName: side, resource: limits.memory}}}}}}
    volumeMounts:
    - {{name: podinfo, mountPath: /podinfo}}
    - {{name: proj, mountPath: /proj}}
  - name: side
    image: {img}
    command: ["sh", "-c", "sleep 3600"]
"#
    )
}

/// This machine's memory in bytes, as the node reports it.
fn node_memory_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("MemTotal");
    kib * 1024
}

/// Every path under `dir` (recursively).
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downward_api_volumes_and_env() {
    let a = Agent::start();
    a.write("dw.yaml", &downward_pod());
    let pod = a.wait_pod("default", "dw", "dw running", |p| running(p, "main"));
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let c = a.daemon.client().await;
    let id = running_container(&c, &uid, "main").await;
    let cat = |file: &'static str| {
        let (c, id) = (c.clone(), id.clone());
        async move { common::exec_ok(&c, &id, &["cat", file]).await }
    };
    assert_eq!(cat("/podinfo/name").await, "dw");
    assert_eq!(cat("/podinfo/namespace").await, "default");
    assert_eq!(cat("/podinfo/uid").await, uid);
    assert_eq!(
        cat("/podinfo/labels").await,
        "app=\"dw\"\ntier=\"back end\""
    );
    assert_eq!(
        cat("/podinfo/annotations").await,
        "note=\"say \\\"hi\\\"\\n\\tbye\"\nplain=\"ok\""
    );
    assert_eq!(cat("/podinfo/cpu_limit").await, "250");
    assert_eq!(
        cat("/podinfo/cpu_request").await,
        "1",
        "100m rounds up to 1"
    );
    assert_eq!(cat("/podinfo/mem/limit").await, "64");
    let memory = node_memory_bytes();
    assert_eq!(cat("/podinfo/side_memory").await, memory.to_string());
    let cpus = std::thread::available_parallelism().expect("cpus").get();
    assert_eq!(cat("/podinfo/side_cpu").await, cpus.to_string());
    assert_eq!(cat("/proj/app").await, "dw");
    let on_host = a.daemon.root().join(format!(
        "agent/pods/{uid}/volumes/downward-api/podinfo/name"
    ));
    assert!(on_host.is_file(), "{} is written", on_host.display());
    let modes = common::exec_ok(
        &c,
        &id,
        &["stat", "-c", "%a", "/podinfo/name", "/podinfo/mem/limit"],
    )
    .await;
    assert_eq!(modes.split_whitespace().collect::<Vec<_>>(), ["444", "600"]);
    let r = common::exec(&c, &id, &["sh", "-c", "echo x > /podinfo/name"], 10)
        .await
        .expect("exec");
    assert_ne!(r.exit_code, 0, "downward API volumes are read-only");

    let env = |var: &'static str| {
        let (c, id) = (c.clone(), id.clone());
        let script = format!("printf %s \"${var}\"");
        async move { common::exec_ok(&c, &id, &["sh", "-c", &script]).await }
    };
    assert_eq!(env("MY_NAME").await, "dw");
    assert_eq!(env("MY_UID").await, uid);
    assert_eq!(env("MY_TIER").await, "back end");
    assert_eq!(env("CPU_LIMIT").await, "250");
    assert_eq!(env("MEM_REQUEST").await, "32");
    assert_eq!(env("SIDE_MEMORY").await, memory.to_string());
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_paths_leaving_the_volume_are_refused_and_nothing_is_written() {
    let a = Agent::start();
    let spec = "  volumes:\n  - name: bad\n    downwardAPI:\n      items:\n      - path: name\n        fieldRef: {fieldPath: metadata.name}\n      - path: ../escape\n        fieldRef: {fieldPath: metadata.name}\n";
    let mounts = "    volumeMounts:\n    - {name: bad, mountPath: /bad}\n";
    a.write("evil.yaml", &pod_yaml("evil", "sleep 3600", spec, mounts));
    let p = a.wait_pod("default", "evil", "the volume refused", |p| {
        waiting_message(p, "main").contains("../escape")
    });
    assert_eq!(
        waiting_message(&p, "main"),
        "MountVolume.SetUp failed for volume \"bad\" : downwardAPI item \"../escape\": path \"../escape\" must not contain '..'",
        "{p}"
    );
    assert_eq!(waiting_reason(&p, "main"), "ContainerCreating", "{p}");
    assert!(!running(&p, "main"));
    let written: Vec<_> = walk(&a.daemon.root().join("agent/pods"))
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "escape" || n == "name"))
        .collect();
    assert!(written.is_empty(), "files written: {written:?}");
    a.finish().await;
}
