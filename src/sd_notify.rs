//! systemd's readiness protocol: `READY=1` to `$NOTIFY_SOCKET` once berthd serves CRI (its unit
//! is `Type=notify`), `STOPPING=1` when it shuts down. Without the variable nothing is sent.

use std::os::linux::net::SocketAddrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (e.g. `READY=1`) to the service manager, if berthd runs under one.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = notify_to(&path, state) {
        tracing::warn!(error = %e, state, "telling the service manager");
    }
}

/// Sends `state` to the notification socket at `path` (a leading '@' names a socket in the
/// abstract namespace).
fn notify_to(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path);
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(path)?,
    };
    UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_reaches_a_listening_socket() {
        let path = std::env::temp_dir().join(format!("berth-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).expect("bind");
        notify_to(path.as_os_str(), "READY=1").expect("send");
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"READY=1");
        let _ = std::fs::remove_file(&path);
        let name = format!("@berth-notify-test-{}", std::process::id());
        let abstract_listener = UnixDatagram::bind_addr(
            &SocketAddr::from_abstract_name(&name.as_bytes()[1..]).expect("addr"),
        )
        .expect("bind abstract");
        notify_to(std::ffi::OsStr::new(&name), "STOPPING=1").expect("send");
        let n = abstract_listener.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
