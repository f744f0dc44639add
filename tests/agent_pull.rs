//! The agent's image pull policies against the real test registry: a tag moved in the registry
//! reaches a restarted container under Always and not under IfNotPresent; Never waits for the
//! image to be on the node (ErrImageNeverPull) and runs once it is.

mod agent_support;
mod common;

use std::path::PathBuf;
use std::process::Command;

use agent_support::*;
use common::{image, registry_storage};
use serde_json::Value;

/// A repository of its own on the test registry, removed from the registry's storage on drop.
struct Repo {
    name: String,
}

impl Repo {
    fn new() -> Self {
        let mut buf = [0u8; 4];
        getrandom::fill(&mut buf).expect("random");
        Self {
            name: format!("pull-policy-{}", hex::encode(buf)),
        }
    }

    /// `registry/repo:tag`.
    fn reference(&self, tag: &str) -> String {
        image(&format!("{}:{tag}", self.name))
    }

    /// Points `tag` at the test image `source` (`busybox:latest`, ...), as a push would.
    fn tag(&self, tag: &str, source: &str) {
        let status = Command::new("skopeo")
            .args(["--insecure-policy", "copy", "-q"])
            .args(["--src-tls-verify=false", "--dest-tls-verify=false"])
            .arg(format!("docker://{}", image(source)))
            .arg(format!("docker://{}", self.reference(tag)))
            .status()
            .expect("skopeo (Debian's skopeo package)");
        assert!(status.success(), "skopeo copy {source} -> {tag}");
    }

    fn storage(&self) -> PathBuf {
        registry_storage().join(format!(
            "data/docker/registry/v2/repositories/{}",
            self.name
        ))
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.storage());
    }
}

/// A pod whose only container exits soon after it starts, so it is restarted (back-off 1 s,
/// at most 4 s in the agent harness) and its image is resolved again each time.
fn crashing_pod(name: &str, image: &str, policy: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {image}\n    imagePullPolicy: {policy}\n    command: [\"sh\", \"-c\", \"sleep 0.3; exit 1\"]\n"
    )
}

fn image_id(p: &Value) -> String {
    container(p, "main")["imageID"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The id (config digest) of `reference` as the runtime has it.
async fn local_image_id(c: &berth::client::CriClient, reference: &str) -> Option<String> {
    common::status(c, reference).await.map(|i| i.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_repulls_a_moved_tag_and_if_not_present_keeps_the_node_s_image() {
    let repo = Repo::new();
    // Two tags of the same image, one per pod, so one pod's pull cannot move the other's tag.
    repo.tag("always", "busybox:latest");
    repo.tag("ifnp", "busybox:latest");
    let a = Agent::start();
    a.write(
        "always.yaml",
        &crashing_pod("always", &repo.reference("always"), "Always"),
    );
    a.write(
        "ifnp.yaml",
        &crashing_pod("ifnp", &repo.reference("ifnp"), "IfNotPresent"),
    );
    let always = a.wait_pod("default", "always", "always ran once", |p| {
        restarts(p, "main") >= 1 && !image_id(p).is_empty()
    });
    let ifnp = a.wait_pod("default", "ifnp", "ifnp ran once", |p| {
        restarts(p, "main") >= 1 && !image_id(p).is_empty()
    });
    let old_id = image_id(&always);
    assert_eq!(image_id(&ifnp), old_id, "the same image under both tags");

    let c = a.daemon.client().await;
    let before = local_image_id(&c, &repo.reference("always"))
        .await
        .expect("the always tag pulled");
    assert_eq!(
        local_image_id(&c, &repo.reference("ifnp")).await,
        Some(before.clone())
    );

    // Both tags move to another image in the registry.
    repo.tag("always", "layers:latest");
    repo.tag("ifnp", "layers:latest");
    let (always_at, ifnp_at) = (restarts(&always, "main"), restarts(&ifnp, "main"));
    let always = a.wait_pod("default", "always", "always on the moved tag", |p| {
        restarts(p, "main") > always_at && !image_id(p).is_empty() && image_id(p) != old_id
    });
    let ifnp = a.wait_pod("default", "ifnp", "ifnp restarted twice more", |p| {
        restarts(p, "main") >= ifnp_at + 2
    });
    assert_eq!(
        image_id(&ifnp),
        old_id,
        "IfNotPresent kept the node's image: {ifnp}"
    );
    assert_eq!(
        local_image_id(&c, &repo.reference("ifnp")).await,
        Some(before.clone()),
        "the ifnp tag on the node still names the old image"
    );
    let after = local_image_id(&c, &repo.reference("always")).await;
    assert!(
        after.as_ref().is_some_and(|id| *id != before),
        "the always tag was pulled again: {after:?}, {always}"
    );
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_waits_for_the_image_to_be_on_the_node() {
    let repo = Repo::new();
    repo.tag("v1", "busybox:latest");
    let reference = repo.reference("v1");
    let a = Agent::start();
    a.write(
        "never.yaml",
        &pod_yaml_with_image("never", &reference, "Never"),
    );
    let p = a.wait_pod("default", "never", "ErrImageNeverPull", |p| {
        waiting_reason(p, "main") == "ErrImageNeverPull"
    });
    let message = waiting_message(&p, "main");
    assert_eq!(
        message,
        format!("Container image \"{reference}\" is not present with pull policy of Never")
    );
    let c = a.daemon.client().await;
    assert_eq!(
        local_image_id(&c, &reference).await,
        None,
        "the agent did not pull it"
    );

    // Once the image is on the node (pulled by someone else), the pod runs.
    let pulled = common::pull(&c, &reference)
        .await
        .expect("pull through CRI");
    assert_eq!(local_image_id(&c, &reference).await, Some(pulled));
    a.wait_pod("default", "never", "never running", |p| running(p, "main"));
    a.finish().await;
}

/// A pod with one long-running container of `image` under `policy`.
fn pod_yaml_with_image(name: &str, image: &str, policy: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {image}\n    imagePullPolicy: {policy}\n    command: [\"sleep\", \"3600\"]\n"
    )
}
