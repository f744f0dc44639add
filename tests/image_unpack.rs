//! The unpacked image is exactly right: the `layers` test image's rootfs, mounted from Berth's
//! snapshots, is checked path by path against hack/testdata/layers.expect.

mod common;

use common::*;
use k8s_cri::v1 as cri;

/// Mounts the image's rootfs (from verbose status) at `target`; unmounted by the TempDir guard.
async fn mount_rootfs(c: &berth::client::CriClient, reference: &str, target: &std::path::Path) {
    let verbose = c
        .images()
        .image_status(cri::ImageStatusRequest {
            image: spec(reference),
            verbose: true,
        })
        .await
        .expect("status")
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&verbose.info["info"]).expect("info JSON");
    let mounts = info["rootfsMounts"]
        .as_array()
        .expect("rootfsMounts")
        .clone();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    let m = &mounts[0];
    let opts: Vec<String> = m["options"]
        .as_array()
        .expect("options")
        .iter()
        .map(|o| o.as_str().unwrap_or_default().to_string())
        .collect();
    std::fs::create_dir_all(target).expect("mount point");
    let mut cmd = std::process::Command::new("mount");
    match m["type"].as_str() {
        Some("bind") => {
            cmd.arg("--bind").arg("-o").arg("ro");
        }
        Some(t) => {
            cmd.arg("-t").arg(t).arg("-o").arg(opts.join(","));
        }
        None => panic!("mount without type: {m:?}"),
    }
    if let Some(cwd) = m["cwd"].as_str() {
        cmd.current_dir(cwd);
    }
    let st = cmd
        .arg(m["source"].as_str().expect("source"))
        .arg(target)
        .status()
        .expect("mount");
    assert!(st.success(), "mounting {m:?}");
}

#[tokio::test]
async fn layers_image_unpacks_exactly() {
    let d = Daemon::start();
    let c = d.client().await;
    let reference = image("layers");
    pull(&c, &reference).await.expect("pull layers");
    let target = d.dir.path().join("rootfs");
    mount_rootfs(&c, &reference, &target).await;
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("hack/imagebuild.py"))
        .arg("check-expect")
        .arg(&target)
        .arg(repo_root().join("hack/testdata/layers.expect"))
        .output()
        .expect("run checker");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    unmount_below(d.dir.path());
    assert!(
        out.status.success(),
        "rootfs differs from layers.expect:\n{text}"
    );
    assert!(text.contains("0 failures"), "{text}");
}

#[tokio::test]
async fn multi_platform_image_has_the_host_platform_file() {
    let d = Daemon::start();
    let c = d.client().await;
    let reference = image("multiarch");
    pull(&c, &reference).await.expect("pull multiarch");
    let target = d.dir.path().join("rootfs");
    mount_rootfs(&c, &reference, &target).await;
    let platform = std::fs::read_to_string(target.join("platform")).unwrap_or_default();
    unmount_below(d.dir.path());
    let want = match std::env::consts::ARCH {
        "x86_64" => "linux/amd64",
        "aarch64" => "linux/arm64",
        other => other,
    };
    assert_eq!(platform.trim(), want);
}
