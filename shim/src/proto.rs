//! The shim API messages generated from proto/shim.proto, and their wire framing.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use nix::sys::socket::{MsgFlags, send};

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/berth.shim.v1.rs"));
}

/// The largest frame accepted.
pub const MAX_FRAME: usize = 16 << 20;

/// Reads one length-prefixed (u32 big-endian) frame.
pub fn read_frame(s: &mut UnixStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

/// Writes one frame; never raises SIGPIPE (the shim keeps SIGPIPE's default action so that
/// container processes inherit it).
pub fn write_frame(s: &UnixStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut data = Vec::with_capacity(body.len() + 4);
    data.extend_from_slice(&len.to_be_bytes());
    data.extend_from_slice(body);
    let mut off = 0;
    while off < data.len() {
        match send(s.as_raw_fd(), &data[off..], MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => off += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
