//! Commands that speak to the node agent: `pods --agent` and `node` read its control socket
//! (or its read-only TCP endpoint when given one); `node shutdown` goes to its control socket.

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::Value;

use crate::print_json;

/// Where the agent is reached: its TCP endpoint (reads) or its control socket (node actions).
#[derive(Clone, Copy)]
pub enum Target<'a> {
    Endpoint(&'a str),
    ControlSocket(&'a str),
}

impl std::fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Endpoint(a) => write!(f, "{a}"),
            Target::ControlSocket(p) => write!(f, "unix:{p}"),
        }
    }
}

/// Something HTTP can be spoken over.
trait Connection: Read + Write {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
}

impl Connection for std::net::TcpStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, t)
    }
}

impl Connection for std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, t)
    }
}

/// One HTTP/1.1 request to the agent at `target`; the status code and JSON body.
fn call(
    target: Target<'_>,
    method: &str,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<(u16, Value)> {
    let mut s: Box<dyn Connection> = match target {
        Target::Endpoint(address) => Box::new(std::net::TcpStream::connect(address).with_context(
            || format!("connecting to the node agent at {address} (is berthd running with its agent on?)"),
        )?),
        Target::ControlSocket(path) => Box::new(
            std::os::unix::net::UnixStream::connect(path).with_context(|| {
                format!("connecting to the node agent's control socket {path} (is berthd running with its agent on, and may this user use its socket?)")
            })?,
        ),
    };
    s.set_read_timeout(Some(timeout))?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .with_context(|| format!("sending {method} {path} to {target}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .with_context(|| format!("reading the answer to {method} {path} from {target}"))?;
    let text = String::from_utf8_lossy(&buf);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{target} did not answer HTTP"))?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let value = serde_json::from_str(body).unwrap_or(Value::Null);
    Ok((code, value))
}

/// A successful answer's body, or the endpoint's error message.
fn get_ok(
    target: Target<'_>,
    method: &str,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<Value> {
    let (code, v) = call(target, method, path, timeout)?;
    if !(200..300).contains(&code) {
        bail!(
            "{method} {path}: HTTP {code}: {}",
            v["message"].as_str().unwrap_or("(no message)")
        );
    }
    Ok(v)
}

/// `berthctl pods --agent`: the agent's pods as kubectl shows them.
pub fn pods(target: Target<'_>, json: bool, quiet: bool) -> anyhow::Result<()> {
    let list = get_ok(target, "GET", "/pods", Duration::from_secs(10))?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    if json {
        return print_json(&list);
    }
    if quiet {
        for p in &items {
            println!("{}", p["metadata"]["uid"].as_str().unwrap_or_default());
        }
        return Ok(());
    }
    println!(
        "{:<20}  {:<30}  {:<7}  {:<18}  {:<8}  {:<15}  {:<10}",
        "NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "IP", "QOS"
    );
    for p in &items {
        let statuses = p["status"]["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let ready = statuses.iter().filter(|c| c["ready"] == true).count();
        let restarts: i64 = statuses
            .iter()
            .map(|c| c["restartCount"].as_i64().unwrap_or(0))
            .sum();
        println!(
            "{:<20}  {:<30}  {:<7}  {:<18}  {:<8}  {:<15}  {:<10}",
            p["metadata"]["namespace"].as_str().unwrap_or("default"),
            p["metadata"]["name"].as_str().unwrap_or_default(),
            format!("{ready}/{}", statuses.len()),
            pod_status(p),
            restarts,
            p["status"]["podIP"].as_str().unwrap_or("<none>"),
            p["status"]["qosClass"].as_str().unwrap_or_default(),
        );
    }
    Ok(())
}

/// kubectl's STATUS column: the pod's reason, else the first waiting or terminated reason of a
/// container, else the phase.
fn pod_status(p: &Value) -> String {
    if let Some(r) = p["status"]["reason"].as_str() {
        return r.to_string();
    }
    let statuses = p["status"]["initContainerStatuses"]
        .as_array()
        .into_iter()
        .chain(p["status"]["containerStatuses"].as_array())
        .flatten();
    for c in statuses {
        for state in ["waiting", "terminated"] {
            if let Some(r) = c["state"][state]["reason"].as_str()
                && r != "Completed"
            {
                return r.to_string();
            }
        }
    }
    p["status"]["phase"]
        .as_str()
        .unwrap_or("Unknown")
        .to_string()
}

/// `berthctl node`: the node's conditions, resources and identity.
pub fn node(target: Target<'_>, json: bool) -> anyhow::Result<()> {
    let node = get_ok(target, "GET", "/node", Duration::from_secs(10))?;
    if json {
        return print_json(&node);
    }
    let st = &node["status"];
    let info = &st["nodeInfo"];
    println!(
        "Name:               {}",
        node["metadata"]["name"].as_str().unwrap_or_default()
    );
    println!(
        "OS image:           {}",
        info["osImage"].as_str().unwrap_or_default()
    );
    println!(
        "Kernel:             {}",
        info["kernelVersion"].as_str().unwrap_or_default()
    );
    println!(
        "Container runtime:  {}",
        info["containerRuntimeVersion"].as_str().unwrap_or_default()
    );
    println!(
        "Agent version:      {}",
        info["kubeletVersion"].as_str().unwrap_or_default()
    );
    for a in st["addresses"].as_array().into_iter().flatten() {
        println!(
            "{:<20}{}",
            format!("{}:", a["type"].as_str().unwrap_or_default()),
            a["address"].as_str().unwrap_or_default()
        );
    }
    println!("\nConditions:");
    println!(
        "  {:<16}  {:<6}  {:<30}  MESSAGE",
        "TYPE", "STATUS", "REASON"
    );
    for c in st["conditions"].as_array().into_iter().flatten() {
        println!(
            "  {:<16}  {:<6}  {:<30}  {}",
            c["type"].as_str().unwrap_or_default(),
            c["status"].as_str().unwrap_or_default(),
            c["reason"].as_str().unwrap_or_default(),
            c["message"].as_str().unwrap_or_default()
        );
    }
    println!("\nResources:");
    println!("  {:<20}  {:<22}  ALLOCATABLE", "RESOURCE", "CAPACITY");
    if let Some(cap) = st["capacity"].as_object() {
        for (k, v) in cap {
            println!(
                "  {:<20}  {:<22}  {}",
                k,
                v.as_str().unwrap_or_default(),
                st["allocatable"][k].as_str().unwrap_or("-")
            );
        }
    }
    let images = st["images"].as_array().map(Vec::len).unwrap_or(0);
    println!("\nImages listed:      {images}");
    Ok(())
}

/// `berthctl node shutdown`: asks the agent to end every pod as for a node shutdown and prints
/// what it did.
pub fn shutdown(control_socket: &str, json: bool) -> anyhow::Result<()> {
    // Every group may take its whole grace period: wait as long as the agent needs.
    let report = get_ok(
        Target::ControlSocket(control_socket),
        "POST",
        "/node/shutdown",
        Duration::from_secs(24 * 3600),
    )?;
    if json {
        return print_json(&report);
    }
    for g in report["groups"].as_array().into_iter().flatten() {
        let pods: Vec<&str> = g["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        println!(
            "priority >= {:<11}  grace {:>4}s  ended after {:>6} ms  pods: {}",
            g["minPriority"],
            g["graceSecs"],
            g["endedAfterMs"],
            if pods.is_empty() {
                "-".to_string()
            } else {
                pods.join(", ")
            }
        );
        if let Some(left) = g["notEnded"].as_array().filter(|l| !l.is_empty()) {
            println!("  not ended in time: {left:?}");
        }
    }
    println!("node shutdown done in {} ms", report["elapsedMs"]);
    Ok(())
}
