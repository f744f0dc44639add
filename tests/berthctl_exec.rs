//! `berthctl exec` against a real container through berthd's streaming server: stdout and
//! stderr apart, stdin with `-i`, a terminal with `-it` (berthctl itself on a pty made by
//! `script`), and the command's exit code as berthctl's.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};

use common::*;
use k8s_cri::v1 as cri;

fn berthctl(d: &Daemon) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_berthctl"));
    cmd.arg("-r").arg(d.socket());
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_passes_output_stdin_a_terminal_and_the_exit_code() {
    let d = Daemon::start();
    let c = d.client().await;
    pull(&c, &image("busybox")).await.expect("pull");
    let logs = d.dir.path().join("logs");
    let cfg = pod_config("exec", &logs, cri::NamespaceMode::Container);
    let pod = run_pod(&c, &cfg).await;
    let ct = run_container(
        &c,
        &pod,
        &cfg,
        sh_container(
            "main",
            &image("busybox"),
            "exec sleep 1000",
            cri::NamespaceMode::Container,
        ),
    )
    .await;

    // Output on its own streams, the exit code passed through.
    let out = berthctl(&d)
        .args(["exec", &ct, "sh", "-c", "echo out; echo err >&2; exit 3"])
        .output()
        .expect("berthctl exec");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    // stdin with -i, ended by EOF.
    let mut child = berthctl(&d)
        .args(["exec", "-i", &ct, "sh", "-c", "tr a-z A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("berthctl exec -i");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"hello from stdin\n")
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "HELLO FROM STDIN\n");

    // -it from a terminal: berthctl runs on a pty (script), the command sees a terminal.
    let inner = format!(
        "{} -r {} exec -it {ct} sh -c 'test -t 0 && echo on-a-terminal; exit 5'",
        env!("CARGO_BIN_EXE_berthctl"),
        d.socket().display()
    );
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("on-a-terminal"), "{text:?}");
    assert_eq!(out.status.code(), Some(5), "{out:?}");

    // A container that does not exist: a clear error, not a hang.
    let out = berthctl(&d)
        .args(["exec", "no-such-container", "true"])
        .output()
        .expect("berthctl exec");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-container"),
        "{out:?}"
    );
    remove_pod(&c, &pod).await;
}
