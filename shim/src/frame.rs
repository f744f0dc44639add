//! The shim API's wire framing: a 4-byte big-endian length, then that many bytes of protobuf.

use std::io;

/// The largest frame accepted.
pub const MAX_FRAME: usize = 16 << 20;

/// The body of the first complete length-prefixed (u32 big-endian) frame in `buf`:
/// `Ok(None)` while more bytes are needed, an error for an oversized frame.
pub fn split_frame(buf: &[u8]) -> io::Result<Option<&[u8]>> {
    let Some(head) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds {MAX_FRAME}"),
        ));
    }
    Ok(buf.get(4..4 + len))
}
