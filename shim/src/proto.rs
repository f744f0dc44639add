//! The shim API messages generated from proto/shim.proto, and their wire framing.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use nix::sys::socket::{MsgFlags, send};

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/berth.shim.v1.rs"));
}

pub use crate::frame::{MAX_FRAME, split_frame};

/// Writes one frame; never raises SIGPIPE (the shim keeps SIGPIPE's default action so that
/// container processes inherit it).
pub fn write_frame(s: &UnixStream, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut data = Vec::with_capacity(body.len() + 4);
    data.extend_from_slice(&len.to_be_bytes());
    data.extend_from_slice(body);
    write_frame_tail(s, &data)
}

/// Writes raw bytes (the rest of a frame) without raising SIGPIPE.
pub fn write_frame_tail(s: &UnixStream, data: &[u8]) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_only_when_complete() -> io::Result<()> {
        assert_eq!(split_frame(b"\0\0")?, None);
        assert_eq!(split_frame(b"\0\0\0\x03ab")?, None);
        assert_eq!(split_frame(b"\0\0\0\x03abcX")?, Some(&b"abc"[..]));
        assert_eq!(split_frame(b"\0\0\0\0")?, Some(&b""[..]));
        assert!(split_frame(b"\xff\xff\xff\xff").is_err());
        Ok(())
    }
}
