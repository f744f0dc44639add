//! The embedded node agent: static pods from manifest files, restarts, probes, status, node.

mod agent_support;
mod cni_support;
mod common;

use std::path::Path;
use std::time::Duration;

use agent_support::*;
use common::{TempDir, free_port, image, tail};
use k8s_cri::v1 as cri;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_add_change_remove() {
    let a = Agent::start();
    a.write(
        "web.yaml",
        &pod_yaml("web", "echo hello; sleep 3600", "", ""),
    );
    let pod = a.wait_pod("default", "web", "web running", |p| running(p, "main"));
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["status"]["qosClass"], "BestEffort");
    assert!(pod["status"]["startTime"].is_string());
    assert!(pod["status"]["podIP"].is_string(), "{pod}");
    assert_eq!(condition(&pod, "PodScheduled"), "True");
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let st = container(&pod, "main");
    assert_eq!(st["restartCount"], 0);
    assert!(
        st["containerID"]
            .as_str()
            .is_some_and(|s| s.contains("://")),
        "{st}"
    );
    assert!(
        st["imageID"].as_str().is_some_and(|s| !s.is_empty()),
        "{st}"
    );
    a.wait_pod("default", "web", "web ready", |p| {
        container(p, "main")["ready"] == true && condition(p, "Ready") == "True"
    });
    // The list endpoint is a v1 PodList.
    let (code, list) = a.get("/pods");
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(a.get("/pods/default/nope").0, 404);

    // CRI objects carry the kubelet's labels and annotations; the log is where the kubelet puts it.
    let c = a.daemon.client().await;
    let sbs = sandboxes(&c).await;
    assert_eq!(sbs.len(), 1);
    let sb = &sbs[0];
    assert_eq!(sb.labels["io.kubernetes.pod.name"], "web");
    assert_eq!(sb.labels["io.kubernetes.pod.namespace"], "default");
    assert_eq!(sb.labels["io.kubernetes.pod.uid"], uid);
    assert_eq!(sb.labels["app"], "web");
    let cs = containers(&c).await;
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].labels["io.kubernetes.container.name"], "main");
    assert_eq!(cs[0].labels["io.kubernetes.pod.uid"], uid);
    assert_eq!(
        cs[0].annotations["io.kubernetes.container.restartCount"],
        "0"
    );
    assert!(
        cs[0]
            .annotations
            .contains_key("io.kubernetes.container.hash")
    );
    let log = log_dir(&a, &pod).join("main/0.log");
    a.wait("the container log", Duration::from_secs(10), |_| {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("stdout F hello"))
    });

    // The pod's cgroup is under its QoS class, as the kubelet's cgroupfs driver puts it.
    let pod_cgroup = format!("{}/besteffort/pod{uid}", a.cgroup_root());
    let hierarchies = [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ];
    assert!(
        hierarchies
            .iter()
            .any(|h| Path::new(&format!("{h}{pod_cgroup}")).is_dir()),
        "no pod cgroup {pod_cgroup}"
    );
    // A change recreates the pod (same UID: it is the same manifest).
    let old_sandbox = sb.id.clone();
    a.write(
        "web.yaml",
        &pod_yaml("web", "echo changed; sleep 3600", "", ""),
    );
    a.wait("the changed pod", Duration::from_secs(60), |_| {
        futures_block(sandboxes(&c))
            .iter()
            .any(|s| s.id != old_sandbox && s.state == cri::PodSandboxState::SandboxReady as i32)
    });
    let pod = a.wait_pod("default", "web", "changed web running", |p| {
        running(p, "main")
    });
    assert_eq!(pod["metadata"]["uid"], uid.as_str());
    a.wait("the old sandbox removed", Duration::from_secs(30), |_| {
        futures_block(sandboxes(&c))
            .iter()
            .all(|s| s.id != old_sandbox)
    });
    a.finish().await;
}

/// Runs a future to completion from sync code inside the test's runtime.
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_container_crash_loops_with_growing_back_off() {
    let a = Agent::start();
    a.write(
        "crash.yaml",
        &pod_yaml("crash", "echo boom; exit 1", "", ""),
    );
    let mut messages = std::collections::BTreeSet::new();
    let pod = a.wait_pod(
        "default",
        "crash",
        "three restarts in CrashLoopBackOff",
        |p| {
            if waiting_reason(p, "main") == "CrashLoopBackOff" {
                let m = waiting_message(p, "main");
                messages.insert(m.split(" restarting").next().unwrap_or("").to_string());
            }
            restarts(p, "main") >= 4 && waiting_reason(p, "main") == "CrashLoopBackOff"
        },
    );
    for want in ["back-off 1s", "back-off 2s", "back-off 4s"] {
        assert!(messages.contains(want), "{want} not seen: {messages:?}");
    }
    let st = container(&pod, "main");
    assert_eq!(st["lastState"]["terminated"]["exitCode"], 1, "{st}");
    assert_eq!(st["lastState"]["terminated"]["reason"], "Error", "{st}");
    assert_eq!(st["ready"], false);
    assert_eq!(
        pod["status"]["phase"], "Running",
        "restartPolicy Always keeps the pod Running"
    );
    let msg = waiting_message(&pod, "main");
    assert!(
        msg.contains("back-off 4s"),
        "the back-off doubled to its 4 s cap: {msg}"
    );
    // The waits grow: the gap between one exit and the next start doubles (1 s, 2 s, 4 s).
    let c = a.daemon.client().await;
    let mut by_attempt: Vec<(u32, i64, i64)> = Vec::new();
    for ct in containers(&c).await {
        let s = common::container_status(&c, &ct.id).await.expect("status");
        by_attempt.push((
            s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            s.started_at,
            s.finished_at,
        ));
    }
    by_attempt.sort();
    // Only the newest dead instance and the current one are kept.
    assert!(by_attempt.len() <= 2, "{by_attempt:?}");
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policies_never_and_on_failure() {
    let a = Agent::start();
    let never = pod_yaml("never", "exit 3", "  restartPolicy: Never\n", "");
    let done = pod_yaml("done", "exit 0", "  restartPolicy: OnFailure\n", "");
    let retry = pod_yaml("retry", "exit 2", "  restartPolicy: OnFailure\n", "");
    // Several pods in one file.
    a.write("policies.yaml", &format!("{never}---\n{done}---\n{retry}"));
    let p = a.wait_pod("default", "never", "never Failed", |p| {
        p["status"]["phase"] == "Failed"
    });
    assert_eq!(container(&p, "main")["state"]["terminated"]["exitCode"], 3);
    let p = a.wait_pod("default", "done", "done Succeeded", |p| {
        p["status"]["phase"] == "Succeeded"
    });
    assert_eq!(
        container(&p, "main")["state"]["terminated"]["reason"],
        "Completed"
    );
    a.wait_pod("default", "retry", "retry restarted", |p| {
        restarts(p, "main") >= 2
    });
    // The finished pods stay finished.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        restarts(&a.pod("default", "never").expect("never"), "main"),
        0
    );
    assert_eq!(
        restarts(&a.pod("default", "done").expect("done"), "main"),
        0
    );
    assert_eq!(
        a.pod("default", "retry").expect("retry")["status"]["phase"],
        "Running"
    );
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_first() {
    let a = Agent::start();
    let img = image("busybox");
    let spec = format!(
        "  initContainers:\n  - name: init1\n    image: {img}\n    command: [\"sh\", \"-c\", \"sleep 2\"]\n  - name: init2\n    image: {img}\n    command: [\"true\"]\n"
    );
    a.write("init.yaml", &pod_yaml("init", "sleep 3600", &spec, ""));
    let p = a.wait_pod("default", "init", "init1 running", |p| {
        p["status"]["initContainerStatuses"][0]["state"]["running"].is_object()
    });
    assert_eq!(p["status"]["phase"], "Pending");
    assert_eq!(condition(&p, "Initialized"), "False");
    assert_eq!(waiting_reason(&p, "main"), "PodInitializing");
    let p = a.wait_pod("default", "init", "main running", |p| running(p, "main"));
    assert_eq!(condition(&p, "Initialized"), "True");
    let inits = p["status"]["initContainerStatuses"]
        .as_array()
        .expect("inits");
    assert_eq!(inits.len(), 2);
    for i in inits {
        assert_eq!(i["state"]["terminated"]["exitCode"], 0, "{i}");
    }
    // Order, from the runtime's own timestamps.
    let c = a.daemon.client().await;
    let mut times = std::collections::HashMap::new();
    for ct in containers(&c).await {
        let s = common::container_status(&c, &ct.id).await.expect("status");
        let name = s
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        times.insert(name, (s.started_at, s.finished_at));
    }
    assert!(times["init1"].1 <= times["init2"].0, "{times:?}");
    assert!(times["init2"].1 <= times["main"].0, "{times:?}");
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_liveness_failure_restarts_the_container() {
    let a = Agent::start();
    let probe = "    livenessProbe:\n      exec:\n        command: [\"cat\", \"/tmp/healthy\"]\n      periodSeconds: 1\n      failureThreshold: 2\n";
    a.write(
        "live.yaml",
        &pod_yaml(
            "live",
            "touch /tmp/healthy; sleep 3; rm /tmp/healthy; sleep 3600",
            "",
            probe,
        ),
    );
    let p = a.wait_pod("default", "live", "a liveness restart", |p| {
        restarts(p, "main") >= 1
    });
    let last = &container(&p, "main")["lastState"]["terminated"];
    assert!(last.is_object(), "{p}");
    assert_ne!(last["exitCode"], 0, "{last}");
    // The new instance is healthy again for its first seconds.
    a.wait_pod("default", "live", "running again", |p| running(p, "main"));
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_probes_flip_ready() {
    let a = Agent::start();
    let port = free_port();
    // exec readiness on a file; a second container serves HTTP and TCP probes.
    let probe = "    readinessProbe:\n      exec:\n        command: [\"cat\", \"/tmp/ready\"]\n      periodSeconds: 1\n";
    let img = image("busybox");
    let web = format!(
        "  - name: web\n    image: {img}\n    command: [\"sh\", \"-c\", \"mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /www\"]\n    readinessProbe:\n      httpGet:\n        path: /index.html\n        port: {port}\n      periodSeconds: 1\n    livenessProbe:\n      tcpSocket:\n        port: {port}\n      periodSeconds: 1\n      initialDelaySeconds: 1\n"
    );
    a.write(
        "ready.yaml",
        &format!("{}{web}", pod_yaml("ready", "sleep 3600", "", probe)),
    );
    let p = a.wait_pod("default", "ready", "both running", |p| {
        running(p, "main") && !container(p, "web")["state"]["running"].is_null()
    });
    assert_eq!(container(&p, "main")["ready"], false);
    a.wait_pod("default", "ready", "web ready through httpGet", |p| {
        container(p, "web")["ready"] == true
    });
    assert_eq!(
        condition(&a.pod("default", "ready").expect("pod"), "Ready"),
        "False"
    );
    let c = a.daemon.client().await;
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let id = running_container(&c, uid, "main").await;
    common::exec_ok(&c, &id, &["touch", "/tmp/ready"]).await;
    a.wait_pod("default", "ready", "main ready", |p| {
        container(p, "main")["ready"] == true && condition(p, "Ready") == "True"
    });
    common::exec_ok(&c, &id, &["rm", "/tmp/ready"]).await;
    let p = a.wait_pod("default", "ready", "main not ready again", |p| {
        container(p, "main")["ready"] == false && condition(p, "Ready") == "False"
    });
    // Readiness never restarts; the TCP liveness probe passes.
    assert_eq!(restarts(&p, "main"), 0);
    assert_eq!(restarts(&p, "web"), 0);
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berthd_restart_adopts_running_pods() {
    let mut a = Agent::start();
    a.write("keep.yaml", &pod_yaml("keep", "sleep 3600", "", ""));
    a.wait_pod("default", "keep", "keep running", |p| running(p, "main"));
    let c = a.daemon.client().await;
    let before_sb: Vec<String> = sandboxes(&c).await.into_iter().map(|s| s.id).collect();
    let before_c: Vec<String> = containers(&c).await.into_iter().map(|s| s.id).collect();
    a.daemon.kill9();
    a.respawn();
    let p = a.wait_pod("default", "keep", "keep running after restart", |p| {
        running(p, "main")
    });
    assert_eq!(restarts(&p, "main"), 0);
    // A few more syncs, and still the same objects.
    std::thread::sleep(Duration::from_secs(2));
    let c = a.daemon.client().await;
    let after_sb: Vec<String> = sandboxes(&c).await.into_iter().map(|s| s.id).collect();
    let after_c: Vec<String> = containers(&c).await.into_iter().map(|s| s.id).collect();
    assert_eq!(before_sb, after_sb);
    assert_eq!(before_c, after_c);
    assert!(a.daemon.log().contains("adopting running pod"));
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_is_sane_and_reported_on_change_or_period() {
    let a = Agent::start();
    let mut node = Value::Null;
    a.wait("/node", Duration::from_secs(20), |a| {
        let (code, v) = a.get("/node");
        node = v;
        code == 200
    });
    let st = &node["status"];
    let cpus = std::thread::available_parallelism().expect("cpus").get();
    assert_eq!(st["capacity"]["cpu"], cpus.to_string().as_str());
    assert_eq!(st["capacity"]["pods"], "110");
    let mem = st["capacity"]["memory"].as_str().expect("memory");
    assert!(mem.ends_with("Ki") && mem.len() > 3, "{mem}");
    assert!(st["allocatable"]["memory"].is_string());
    let info = &st["nodeInfo"];
    let machine_id = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    assert_eq!(info["machineID"], machine_id.trim());
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    assert_eq!(info["bootID"], boot_id.trim());
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("release");
    assert_eq!(info["kernelVersion"], release.trim());
    assert_eq!(info["operatingSystem"], "linux");
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("berth://")),
        "{info}"
    );
    let types: Vec<&str> = st["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert_eq!(
        types,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    for c in st["conditions"].as_array().expect("conditions") {
        assert!(c["lastHeartbeatTime"].is_string() && c["lastTransitionTime"].is_string());
        assert!(c["reason"].is_string(), "{c}");
    }
    assert_eq!(st["daemonEndpoints"]["kubeletEndpoint"]["Port"], a.port());
    assert!(
        st["addresses"]
            .as_array()
            .is_some_and(|v| v.iter().any(|x| x["type"] == "Hostname"))
    );
    // Pulling an image changes the status (its image list): reported at once.
    let (_, r0) = a.get("/node/reports");
    let c = a.daemon.client().await;
    common::pull(&c, &image("busybox")).await.expect("pull");
    a.wait(
        "an image in the node status",
        Duration::from_secs(20),
        |a| {
            a.get("/node").1["status"]["images"]
                .as_array()
                .is_some_and(|v| !v.is_empty())
        },
    );
    let (_, r1) = a.get("/node/reports");
    assert!(r1["reports"].as_u64() > r0["reports"].as_u64(), "{r0} {r1}");
    // Unchanged: recomputed every 0.5 s, reported only every 3 s.
    std::thread::sleep(Duration::from_secs(7));
    let (_, r2) = a.get("/node/reports");
    let reports = r2["reports"].as_u64().unwrap_or(0) - r1["reports"].as_u64().unwrap_or(0);
    let computed = r2["computed"].as_u64().unwrap_or(0) - r1["computed"].as_u64().unwrap_or(0);
    assert!((1..=4).contains(&reports), "{r1} {r2}");
    assert!(computed >= reports + 5, "{r1} {r2}");
    // The lease is renewed every quarter of its 2 s.
    let beats = r2["heartbeats"].as_u64().unwrap_or(0) - r1["heartbeats"].as_u64().unwrap_or(0);
    assert!(beats >= 8, "{r1} {r2}");
    let lease: Value = serde_json::from_slice(
        &std::fs::read(r2["leaseFile"].as_str().expect("lease file")).expect("lease"),
    )
    .expect("lease json");
    assert_eq!(lease["spec"]["holderIdentity"], node["metadata"]["name"]);
    // /configz shows the configuration in force (the test's shortened back-off).
    let (code, z) = a.get("/configz");
    assert_eq!(code, 200);
    assert_eq!(z["agent"]["backoff_base_secs"], 1.0);
    assert_eq!(z["agent"]["node_status_max_images"], 50);
    let file = Path::new(r2["statusFile"].as_str().expect("file"));
    let reported: Value =
        serde_json::from_slice(&std::fs::read(file).expect("status file")).expect("json");
    assert_eq!(reported["metadata"]["name"], node["metadata"]["name"]);
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_manifests_are_reported_and_pull_errors_shown() {
    let a = Agent::start();
    a.write(
        "bad.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n",
    );
    // A field the Pod type does not have is a warning, not an error.
    a.write(
        "good.yaml",
        &pod_yaml("good", "sleep 3600", "", "    futureField: 1\n"),
    );
    a.wait_pod("default", "good", "good running", |p| running(p, "main"));
    // A second file with the same pod (sorting before the first) is refused.
    a.write("dup.yaml", &pod_yaml("good", "sleep 3600", "", ""));
    a.write(
        "noimage.yaml",
        &pod_yaml("noimage", "true", "", "").replace(
            &format!("image: {}", image("busybox")),
            &format!("image: {}", image("does-not-exist:v1")),
        ),
    );
    let mut m = Value::Null;
    a.wait("the manifest errors", Duration::from_secs(10), |a| {
        m = a.get("/manifests").1;
        m["errors"].as_object().is_some_and(|e| e.len() == 2)
    });
    let errors = m["errors"].as_object().expect("errors").clone();
    let bad = a.manifest("bad.yaml").display().to_string();
    let dup = a.manifest("dup.yaml").display().to_string();
    let error_of = |f: &str| {
        errors
            .get(f)
            .and_then(|e| e.as_str())
            .unwrap_or("")
            .to_string()
    };
    assert!(error_of(&bad).contains("parse"), "{m}");
    assert!(error_of(&dup).contains("already defined"), "{m}");
    let good = a.manifest("good.yaml").display().to_string();
    assert!(
        m["warnings"][&good]
            .as_str()
            .is_some_and(|w| w.contains("spec.containers[0].futureField")),
        "{m}"
    );
    assert!(a.daemon.log().contains("unknown fields ignored"));
    let p = a.pod("default", "good").expect("good");
    assert_eq!(restarts(&p, "main"), 0);
    assert!(running(&p, "main"));
    let p = a.wait_pod("default", "noimage", "ImagePullBackOff", |p| {
        waiting_reason(p, "main") == "ImagePullBackOff"
    });
    assert_eq!(p["status"]["phase"], "Pending");
    a.wait_pod("default", "noimage", "ErrImagePull again", |p| {
        waiting_reason(p, "main") == "ErrImagePull"
    });
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_hooks_run_and_logs_go_with_the_pod() {
    let a = Agent::start();
    let hooks = "    lifecycle:\n      postStart:\n        exec:\n          command: [\"sh\", \"-c\", \"echo poststart-ran > /proc/1/fd/1\"]\n      preStop:\n        exec:\n          command: [\"sh\", \"-c\", \"echo prestop-ran > /proc/1/fd/1; sleep 3\"]\n";
    a.write(
        "hooks.yaml",
        &pod_yaml("hooks", "echo started; sleep 3600", "", hooks).replace(
            "terminationGracePeriodSeconds: 1",
            "terminationGracePeriodSeconds: 10",
        ),
    );
    let pod = a.wait_pod("default", "hooks", "hooks running", |p| running(p, "main"));
    let log = log_dir(&a, &pod).join("main/0.log");
    a.wait(
        "the postStart hook's output",
        Duration::from_secs(20),
        |_| std::fs::read_to_string(&log).is_ok_and(|t| t.contains("poststart-ran")),
    );
    std::fs::remove_file(a.manifest("hooks.yaml")).expect("remove manifest");
    a.wait("the preStop hook's output", Duration::from_secs(20), |_| {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("prestop-ran"))
    });
    a.wait("the pod gone", Duration::from_secs(30), |a| {
        a.pod("default", "hooks").is_none()
    });
    assert!(
        !log_dir(&a, &pod).exists(),
        "the pod's log directory is removed with it"
    );
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_network_pods_are_probed_at_their_pod_ip() {
    let net = cni_support::TestNet::new("agent");
    net.bridge_up();
    net.write("10-test.conflist", &net.standard());
    let a = Agent::start_with(&net.daemon_args());
    let probes = "    ports:\n    - containerPort: 8080\n      name: http\n    readinessProbe:\n      httpGet:\n        path: /index.html\n        port: http\n      periodSeconds: 1\n    livenessProbe:\n      tcpSocket:\n        port: 8080\n      periodSeconds: 1\n";
    a.write(
        "netpod.yaml",
        &pod_yaml(
            "netpod",
            "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www",
            "",
            probes,
        )
        .replace("  hostNetwork: true\n", ""),
    );
    let p = a.wait_pod("default", "netpod", "netpod ready", |p| {
        container(p, "main")["ready"] == true && condition(p, "Ready") == "True"
    });
    let ip = p["status"]["podIP"].as_str().expect("pod IP").to_string();
    assert!(
        ip.starts_with(&format!("{}.", net.prefix)),
        "{ip} not in {}",
        net.subnet()
    );
    assert_ne!(p["status"]["podIP"], p["status"]["hostIP"]);
    assert_eq!(restarts(&p, "main"), 0);
    // With a pod network the node is Ready.
    a.wait("node Ready", Duration::from_secs(20), |a| {
        a.get("/node").1["status"]["conditions"]
            .as_array()
            .is_some_and(|v| {
                v.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    });
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_empty_dir_handoff_memory_medium_and_host_path() {
    let a = Agent::start();
    let host = TempDir::new("hostpath");
    let host_dir = host.path().join("made-by-agent");
    let img = image("busybox");
    let spec = format!(
        "  volumes:\n  - name: data\n    emptyDir: {{}}\n  - name: cache\n    emptyDir:\n      medium: Memory\n      sizeLimit: 8Mi\n  - name: host\n    hostPath:\n      path: {}\n      type: DirectoryOrCreate\n  initContainers:\n  - name: writer\n    image: {img}\n    command: [\"sh\", \"-c\", \"echo handed-over > /data/msg\"]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n",
        host_dir.display()
    );
    let mounts = "    volumeMounts:\n    - name: data\n      mountPath: /data\n      readOnly: true\n    - name: cache\n      mountPath: /cache\n    - name: host\n      mountPath: /host\n";
    a.write(
        "vols.yaml",
        &pod_yaml(
            "vols",
            "cat /data/msg > /host/seen; sleep 3600",
            &spec,
            mounts,
        ),
    );
    let p = a.wait_pod("default", "vols", "vols running", |p| running(p, "main"));
    a.wait(
        "the handed-over file on the host",
        Duration::from_secs(20),
        |_| std::fs::read_to_string(host_dir.join("seen")).is_ok_and(|t| t.trim() == "handed-over"),
    );
    let c = a.daemon.client().await;
    let uid = p["metadata"]["uid"].as_str().expect("uid");
    let id = running_container(&c, uid, "main").await;
    let mounts = common::exec_ok(&c, &id, &["cat", "/proc/mounts"]).await;
    let cache = mounts
        .lines()
        .find(|l| l.split(' ').nth(1) == Some("/cache"))
        .unwrap_or_default();
    assert!(
        cache.starts_with("tmpfs ") && cache.contains("size=8192k"),
        "{mounts}"
    );
    let r = common::exec(&c, &id, &["sh", "-c", "echo x > /data/y"], 10)
        .await
        .expect("exec");
    assert_ne!(r.exit_code, 0, "a readOnly mount refuses writes");
    // A pod using a volume the agent cannot provide is refused with the reason.
    a.write(
        "cm.yaml",
        &pod_yaml(
            "cm",
            "true",
            "  volumes:\n  - name: c\n    configMap:\n      name: x\n",
            "",
        ),
    );
    a.wait("the configMap pod refused", Duration::from_secs(10), |a| {
        a.get("/manifests").1["errors"]
            .as_object()
            .is_some_and(|e| {
                e.values()
                    .any(|v| v.as_str().is_some_and(|s| s.contains("emptyDir")))
            })
    });
    let pod_dirs = a.daemon.root().join("agent/pods");
    a.finish().await;
    // The pod's own directory (and its tmpfs) went with it; the hostPath stays.
    assert!(
        std::fs::read_dir(&pod_dirs).map(|d| d.count()).unwrap_or(0) == 0,
        "pod directories left in {}",
        pod_dirs.display()
    );
    assert!(host_dir.join("seen").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_stopped_behind_the_agents_back_is_recreated() {
    let a = Agent::start();
    a.write("phoenix.yaml", &pod_yaml("phoenix", "sleep 3600", "", ""));
    a.wait_pod("default", "phoenix", "phoenix running", |p| {
        running(p, "main")
    });
    let c = a.daemon.client().await;
    let old = sandboxes(&c).await.remove(0).id;
    c.runtime()
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: old.clone(),
        })
        .await
        .expect("StopPodSandbox");
    a.wait("a new sandbox", Duration::from_secs(30), |_| {
        let sbs = futures_block(sandboxes(&c));
        sbs.len() == 1
            && sbs[0].id != old
            && sbs[0].state == cri::PodSandboxState::SandboxReady as i32
    });
    let p = a.wait_pod("default", "phoenix", "phoenix running again", |p| {
        running(p, "main")
    });
    assert_eq!(
        sandboxes(&c).await[0].metadata.as_ref().map(|m| m.attempt),
        Some(1),
        "the new sandbox is the pod's next attempt"
    );
    assert!(container(&p, "main")["containerID"].is_string());
    a.finish().await;
}

/// Waits until the node status was computed twice more (so once wholly after this call) and
/// `/node` answers.
fn wait_fresh_node_status(a: &Agent) {
    let computed = |a: &Agent| a.get("/node/reports").1["computed"].as_u64();
    let before = computed(a).expect("computed in /node/reports");
    a.wait(
        "a node status computed after the pulls",
        Duration::from_secs(20),
        |a| computed(a) >= Some(before + 2) && a.get("/node").0 == 200,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_status_max_images_all_none_and_largest_first() {
    let refs = [image("busybox"), image("layers"), image("large")];
    let images_of = |a: &Agent| -> Option<Vec<Value>> {
        let (code, n) = a.get("/node");
        (code == 200).then(|| {
            n["status"]["images"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
    };
    // -1: every image, largest first.
    let a = Agent::start_with_config(&[], "node_status_max_images = -1\n");
    let c = a.daemon.client().await;
    for r in &refs {
        common::pull(&c, r).await.expect("pull");
    }
    let mut listed = Vec::new();
    a.wait("all three images listed", Duration::from_secs(20), |a| {
        listed = images_of(a).unwrap_or_default();
        listed.len() == 3
    });
    let sizes: Vec<i64> = listed
        .iter()
        .map(|i| i["sizeBytes"].as_i64().unwrap_or(0))
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    assert!(
        listed[0]["names"].as_array().is_some_and(|n| n
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.contains("large")))),
        "{listed:?}"
    );
    let all = listed;
    a.finish().await;
    drop(a);
    // 2: the two largest of the three (the default, 50, would list all three).
    let a = Agent::start_with_config(&[], "node_status_max_images = 2\n");
    let c = a.daemon.client().await;
    for r in &refs {
        common::pull(&c, r).await.expect("pull");
    }
    wait_fresh_node_status(&a);
    let two = images_of(&a).expect("/node");
    let key = |i: &Value| (i["names"].clone(), i["sizeBytes"].clone());
    assert_eq!(
        two.iter().map(key).collect::<Vec<_>>(),
        all[..2].iter().map(key).collect::<Vec<_>>(),
        "the two largest of {all:?}"
    );
    a.finish().await;
    drop(a);
    // 0: none; and a drop-in file from --config-dir overrides the config file, a flag both.
    let drop_ins = TempDir::new("agentconfd");
    std::fs::write(
        drop_ins.path().join("10-images.toml"),
        "[agent]\nnode_status_max_images = 1\n",
    )
    .expect("drop-in");
    std::fs::write(
        drop_ins.path().join("20-images.toml"),
        "[agent]\nnode_status_max_images = 0\n",
    )
    .expect("drop-in");
    let a = Agent::start_with_config(
        &[
            "--config-dir".to_string(),
            drop_ins.path().display().to_string(),
        ],
        "node_status_max_images = -1\n",
    );
    let c = a.daemon.client().await;
    common::pull(&c, &refs[0]).await.expect("pull");
    let (code, z) = a.get("/configz");
    assert_eq!(code, 200);
    assert_eq!(z["agent"]["node_status_max_images"], 0);
    // A node status computed wholly after the pull lists nothing.
    wait_fresh_node_status(&a);
    assert_eq!(images_of(&a), Some(Vec::new()));
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_removed_while_berthd_was_down_removes_the_pod() {
    let mut a = Agent::start();
    a.write("gone.yaml", &pod_yaml("gone", "sleep 3600", "", ""));
    a.write("stays.yaml", &pod_yaml("stays", "sleep 3600", "", ""));
    a.wait_pod("default", "gone", "gone running", |p| running(p, "main"));
    a.wait_pod("default", "stays", "stays running", |p| running(p, "main"));
    a.daemon.stop();
    std::fs::remove_file(a.manifest("gone.yaml")).expect("remove manifest");
    a.respawn();
    let c = a.daemon.client().await;
    let mut names = Vec::new();
    for _ in 0..200 {
        names = sandboxes(&c)
            .await
            .into_iter()
            .filter_map(|s| s.metadata.map(|m| m.name))
            .collect::<Vec<_>>();
        if names == ["stays"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(names, ["stays"]);
    let p = a.wait_pod("default", "stays", "stays running", |p| running(p, "main"));
    assert_eq!(restarts(&p, "main"), 0);
    assert!(a.pod("default", "gone").is_none());
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_value_without_a_source_is_a_create_container_config_error() {
    let a = Agent::start();
    a.write(
        "secret.yaml",
        &pod_yaml(
            "secret",
            "sleep 3600",
            "",
            "    env:\n    - name: TOKEN\n      valueFrom:\n        secretKeyRef: {name: api, key: token}\n",
        ),
    );
    let p = a.wait_pod("default", "secret", "CreateContainerConfigError", |p| {
        waiting_reason(p, "main") == "CreateContainerConfigError"
    });
    let message = waiting_message(&p, "main");
    assert!(
        message.contains("TOKEN") && message.contains("API server"),
        "{message}"
    );
    let c = a.daemon.client().await;
    assert!(containers(&c).await.is_empty(), "no container was created");
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_refusals_show_as_create_container_errors_with_the_runtimes_message() {
    // A 5 s back-off base (drop-in over the harness's 1 s): a failed creation is retried only
    // then, not every 300 ms sync.
    let dropins = common::TempDir::new("createretry");
    std::fs::write(
        dropins.path().join("50-backoff.toml"),
        "[agent]\nbackoff_base_secs = 5.0\n",
    )
    .expect("drop-in");
    let a = Agent::start_with(&[
        "--config-dir".to_string(),
        dropins.path().display().to_string(),
    ]);
    a.write(
        "badcap.yaml",
        &pod_yaml(
            "badcap",
            "sleep 3600",
            "",
            "    securityContext:\n      capabilities:\n        add: [NOT_A_CAPABILITY]\n",
        ),
    );
    a.write(
        "noexec.yaml",
        &pod_yaml("noexec", "sleep 3600", "", "").replace(
            "command: [\"sh\", \"-c\", \"sleep 3600\"]",
            "command: [\"/no/such/binary\"]",
        ),
    );
    let p = a.wait_pod("default", "badcap", "CreateContainerError", |p| {
        waiting_reason(p, "main") == "CreateContainerError"
    });
    let message = waiting_message(&p, "main");
    assert!(message.contains("NOT_A_CAPABILITY"), "{message}");
    let attempts = |a: &Agent| {
        a.daemon
            .log()
            .lines()
            .filter(|l| l.contains("CreateContainer failed") && l.contains("badcap_default"))
            .count()
    };
    // Well within the 5 s: still the first attempt only.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(attempts(&a), 1, "{}", tail(&a.daemon.log(), 20));
    // libcontainer looks the executable up when it creates the container, so a missing one
    // fails CreateContainer (containerd + runc fail at StartContainer instead); the message is
    // the shim's own line, not libcontainer's log.
    let p = a.wait_pod("default", "noexec", "the missing binary reported", |p| {
        waiting_reason(p, "main") == "CreateContainerError"
    });
    let message = waiting_message(&p, "main");
    assert!(
        message.contains("executable '/no/such/binary' not found"),
        "{message}"
    );
    assert!(
        !message.contains('\n') && !message.contains(" WARN "),
        "one line, no log: {message}"
    );
    a.finish().await;
}

/// `berthctl logs` of a crash-looping container: its lines, --tail, --timestamps, --previous
/// (the instance before, with another run id), and --follow ending when the container does.
#[tokio::test]
async fn berthctl_logs_shows_a_containers_log_its_previous_instance_and_follows_to_its_end() {
    let a = Agent::start();
    a.write(
        "talk.yaml",
        &pod_yaml(
            "talk",
            "echo run $(cat /proc/sys/kernel/random/uuid); for i in 0 1 2; do echo line $i; done; sleep 2; exit 1",
            "",
            "",
        ),
    );
    let pod = a.wait_pod("default", "talk", "restarted once and running", |p| {
        restarts(p, "main") >= 1 && running(p, "main")
    });
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let id = running_container(&a.daemon.client().await, &uid, "main").await;
    let logs = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_berthctl"))
            .arg("--endpoint")
            .arg(format!("unix://{}", a.daemon.socket().display()))
            .arg("logs")
            .args(args)
            .arg(&id)
            .output()
            .expect("berthctl logs");
        assert!(
            out.status.success(),
            "berthctl logs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Running is reported once the process starts: its four lines follow a moment later.
    let mut all = logs(&[]);
    for _ in 0..50 {
        if all.lines().count() >= 4 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        all = logs(&[]);
    }
    let lines: Vec<&str> = all.lines().collect();
    assert_eq!(lines.len(), 4, "{all}");
    assert!(lines[0].starts_with("run "));
    assert_eq!(&lines[1..], ["line 0", "line 1", "line 2"]);
    assert_eq!(logs(&["--tail", "1"]), "line 2\n");
    let stamped = logs(&["--timestamps", "--tail", "1"]);
    assert!(
        stamped.starts_with("20") && stamped.ends_with("Z line 2\n"),
        "{stamped}"
    );
    let previous = logs(&["--previous"]);
    assert!(previous.starts_with("run ") && previous.ends_with("line 2\n"));
    assert_ne!(
        previous.lines().next(),
        lines.first().copied(),
        "the previous instance had its own run id"
    );
    // Following a running container ends once it exits (2 s after its last line).
    let started = std::time::Instant::now();
    let followed = logs(&["--follow"]);
    assert!(followed.ends_with("line 2\n"), "{followed}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "follow did not end with the container"
    );
    a.finish().await;
}
