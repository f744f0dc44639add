//! The agent's container log rotation: a container writing numbered lines fast, its log rotated
//! many times while it writes (renamed, reopened through CRI, older files gzip-compressed), and
//! every number found exactly once across the files.

mod agent_support;
mod common;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::Path;
use std::time::Duration;

use agent_support::*;

const LINES: u64 = 60_000;

/// Every file of the container's log directory, decompressed, as (name, text). A file the
/// rotation removes between the listing and its opening is left out.
fn log_files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("log dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            out.push((name, String::new()));
            continue;
        }
        let mut text = String::new();
        let file = match std::fs::File::open(e.path()) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("open {name}: {e}"),
        };
        if name.ends_with(".gz") {
            flate2::read::GzDecoder::new(file)
                .read_to_string(&mut text)
                .expect("gunzip");
        } else {
            std::io::BufReader::new(file)
                .read_to_string(&mut text)
                .expect("read");
        }
        out.push((name, text));
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_writer_is_rotated_and_compressed_and_no_line_is_lost() {
    let a = Agent::start_with_config(
        &[],
        "container_log_max_size = \"64Ki\"\ncontainer_log_max_files = 100\ncontainer_log_monitor_interval_secs = 1.0\n",
    );
    // 60 000 numbered lines over some 6 s (a pause every 5 000), then quiet.
    let script = format!(
        "i=0; while [ $i -lt {LINES} ]; do echo $i; i=$((i+1)); [ $((i % 5000)) = 0 ] && sleep 0.5; done; echo done; exec sleep 1000"
    );
    a.write("writer.yaml", &pod_yaml("writer", &script, "", ""));
    let pod = a.wait_pod("default", "writer", "running", |p| running(p, "main"));
    let dir = log_dir(&a, &pod).join("main");
    // Done writing, and the rotation that follows has had its pass.
    a.wait("the last line", Duration::from_secs(120), |_| {
        log_files(&dir)
            .iter()
            .any(|(_, text)| text.ends_with(" stdout F done\n"))
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let files = log_files(&dir);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let rotated = names.iter().filter(|n| n.starts_with("0.log.")).count();
    let compressed = names.iter().filter(|n| n.ends_with(".gz")).count();
    assert!(rotated >= 3, "rotated at least three times: {names:?}");
    assert!(compressed >= 1, "older files compressed: {names:?}");
    assert!(
        names.iter().all(|n| !n.ends_with(".tmp")),
        "no half-written file: {names:?}"
    );
    // Every number exactly once, whichever file holds it.
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    for (name, text) in &files {
        for line in text.lines() {
            let body = line
                .splitn(4, ' ')
                .nth(3)
                .unwrap_or_else(|| panic!("CRI log line in {name}: {line:?}"));
            if body == "done" {
                continue;
            }
            let n: u64 = body
                .parse()
                .unwrap_or_else(|_| panic!("a number in {name}: {line:?}"));
            *seen.entry(n).or_default() += 1;
        }
    }
    let missing: Vec<u64> = (0..LINES).filter(|n| !seen.contains_key(n)).collect();
    let twice: Vec<(&u64, &u32)> = seen.iter().filter(|(_, c)| **c != 1).collect();
    assert!(
        missing.is_empty(),
        "{} lines lost, first {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(twice.is_empty(), "lines written more than once: {twice:?}");
    assert_eq!(seen.len() as u64, LINES);
    a.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_max_files_are_kept_and_a_removed_log_is_made_again() {
    let a = Agent::start_with_config(
        &[],
        "container_log_max_size = \"16Ki\"\ncontainer_log_max_files = 4\ncontainer_log_monitor_interval_secs = 1.0\n",
    );
    let script =
        "while :; do i=0; while [ $i -lt 500 ]; do echo line-$i; i=$((i+1)); done; sleep 0.2; done";
    a.write("chatty.yaml", &pod_yaml("chatty", script, "", ""));
    let pod = a.wait_pod("default", "chatty", "running", |p| running(p, "main"));
    let dir = log_dir(&a, &pod).join("main");
    a.wait("a compressed file", Duration::from_secs(60), |_| {
        log_files(&dir).iter().any(|(n, _)| n.ends_with(".gz"))
    });
    // Over several more passes, never more than 4 files (the live one included).
    for _ in 0..5 {
        let names: Vec<String> = log_files(&dir).into_iter().map(|(n, _)| n).collect();
        let counted: Vec<&String> = names.iter().filter(|n| !n.ends_with(".tmp")).collect();
        assert!(counted.len() <= 4, "at most 4 files: {names:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The live log removed under the running container: it comes back, and the container runs on.
    // A rotation renames the live log before the container's next write reopens it: between
    // the two there is none to remove, so try again.
    a.wait(
        "the live log removed",
        Duration::from_secs(10),
        |_| match std::fs::remove_file(dir.join("0.log")) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => panic!("remove the live log: {e}"),
        },
    );
    a.wait("the log made again", Duration::from_secs(30), |_| {
        std::fs::metadata(dir.join("0.log")).is_ok_and(|m| m.len() > 0)
    });
    let pod = a.pod("default", "chatty").expect("the pod is still there");
    assert!(running(&pod, "main"), "{pod}");
    assert_eq!(restarts(&pod, "main"), 0);
    a.finish().await;
}
