//! A small blocking D-Bus client: SASL EXTERNAL with fd passing, method calls, signals, and the
//! marshalling of the few types the agent's logind watcher and systemd's unit properties need
//! (y b u t s o g h v, and the property list `a(sv)`, sent only).

use std::collections::VecDeque;
use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

/// Why a D-Bus exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum DbusError {
    /// The bus address is not a unix socket address we can use.
    #[error("D-Bus address {0:?} is not unix:path=... or unix:abstract=...")]
    Address(String),
    /// Talking to the bus failed.
    #[error("D-Bus connection to {address}: {error}")]
    Io {
        address: String,
        error: std::io::Error,
    },
    /// The bus refused the authentication or fd passing.
    #[error("D-Bus authentication with {address}: {line:?}")]
    Auth { address: String, line: String },
    /// A malformed message.
    #[error("D-Bus message malformed: {0}")]
    Malformed(String),
    /// A method call answered with an error.
    #[error("D-Bus {method}: {name}: {message}")]
    Remote {
        method: String,
        name: String,
        message: String,
    },
}

/// Message types.
const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;
const ERROR: u8 = 3;
/// SIGNAL message type.
pub const SIGNAL: u8 = 4;
/// Largest message accepted (header fields plus body): logind's are a few hundred bytes.
const MAX_MESSAGE: usize = 1 << 20;
/// Bytes asked of the socket per read.
const READ_CHUNK: usize = 16 * 1024;

/// A value of one of the supported types.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `y`
    Byte(u8),
    /// `b`
    Bool(bool),
    /// `i`
    I32(i32),
    /// `u`
    U32(u32),
    /// `t`
    U64(u64),
    /// `s`
    Str(String),
    /// `o`
    Path(String),
    /// `g`
    Sig(String),
    /// `h`: an index into the message's fds.
    Fd(u32),
    /// `v`
    Variant(Box<Value>),
    /// `a(sv)`: named values, as systemd's unit properties (marshalled, never read).
    Properties(Vec<(String, Value)>),
}

impl Value {
    fn signature(&self) -> String {
        match self {
            Value::Byte(_) => "y".into(),
            Value::Bool(_) => "b".into(),
            Value::I32(_) => "i".into(),
            Value::U32(_) => "u".into(),
            Value::U64(_) => "t".into(),
            Value::Str(_) => "s".into(),
            Value::Path(_) => "o".into(),
            Value::Sig(_) => "g".into(),
            Value::Fd(_) => "h".into(),
            Value::Variant(_) => "v".into(),
            Value::Properties(_) => "a(sv)".into(),
        }
    }
}

/// A received message.
#[derive(Debug)]
pub struct Message {
    /// METHOD_CALL, METHOD_RETURN, ERROR or SIGNAL.
    pub kind: u8,
    /// Serial of the call this answers.
    pub reply_serial: Option<u32>,
    /// Object path.
    pub path: Option<String>,
    /// Interface.
    pub interface: Option<String>,
    /// Member (method or signal name).
    pub member: Option<String>,
    /// Error name of an ERROR.
    pub error_name: Option<String>,
    /// Body values.
    pub body: Vec<Value>,
    /// File descriptors that came with it.
    pub fds: Vec<OwnedFd>,
}

/// Little-endian marshalling into a buffer whose offset 0 is the message start.
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn pad(&mut self, align: usize) {
        while !self.buf.len().is_multiple_of(align) {
            self.buf.push(0);
        }
    }

    fn u32(&mut self, v: u32) {
        self.pad(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    fn sig(&mut self, s: &str) {
        self.buf.push(s.len() as u8);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::Byte(b) => self.buf.push(*b),
            Value::Bool(b) => self.u32(u32::from(*b)),
            Value::I32(n) => self.u32(u32::from_ne_bytes(n.to_ne_bytes())),
            Value::U32(n) | Value::Fd(n) => self.u32(*n),
            Value::U64(n) => {
                self.pad(8);
                self.buf.extend_from_slice(&n.to_le_bytes());
            }
            Value::Str(s) | Value::Path(s) => self.string(s),
            Value::Sig(s) => self.sig(s),
            Value::Variant(inner) => {
                self.sig(&inner.signature());
                self.value(inner);
            }
            Value::Properties(props) => {
                // The array's byte length, then its elements from an 8-aligned start (the
                // padding before the first is not counted).
                self.u32(0);
                let len_at = self.buf.len() - 4;
                self.pad(8);
                let start = self.buf.len();
                for (name, v) in props {
                    self.pad(8);
                    self.string(name);
                    self.sig(&v.signature());
                    self.value(v);
                }
                let len = u32::try_from(self.buf.len() - start).unwrap_or(u32::MAX);
                self.buf[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
}

/// Unmarshalling from a message (offsets relative to its start).
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl Reader<'_> {
    fn align(&mut self, n: usize) {
        self.pos = self.pos.div_ceil(n) * n;
    }

    fn take(&mut self, n: usize) -> Result<&[u8], DbusError> {
        let end = self.pos + n;
        let s = self.buf.get(self.pos..end).ok_or_else(|| {
            DbusError::Malformed(format!("{n} bytes at {} past the end", self.pos))
        })?;
        self.pos = end;
        Ok(s)
    }

    /// `N` bytes at the next multiple of `N` (the alignment of fixed-size types).
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], DbusError> {
        self.align(N);
        self.take(N)?
            .try_into()
            .map_err(|_| DbusError::Malformed(format!("{N}-byte value")))
    }

    fn u32(&mut self) -> Result<u32, DbusError> {
        let b = self.fixed::<4>()?;
        Ok(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        })
    }

    fn u64(&mut self) -> Result<u64, DbusError> {
        let b = self.fixed::<8>()?;
        Ok(if self.big_endian {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        })
    }

    fn string(&mut self) -> Result<String, DbusError> {
        let len = self.u32()? as usize;
        let s = String::from_utf8_lossy(self.take(len)?).into_owned();
        self.take(1)?;
        Ok(s)
    }

    fn sig(&mut self) -> Result<String, DbusError> {
        let len = usize::from(self.take(1)?[0]);
        let s = String::from_utf8_lossy(self.take(len)?).into_owned();
        self.take(1)?;
        Ok(s)
    }

    /// One value of single-character type `t` (containers other than `v` are not needed).
    fn value(&mut self, t: char) -> Result<Value, DbusError> {
        Ok(match t {
            'y' => Value::Byte(self.take(1)?[0]),
            'b' => Value::Bool(self.u32()? != 0),
            'i' => Value::I32(i32::from_ne_bytes(self.u32()?.to_ne_bytes())),
            'u' => Value::U32(self.u32()?),
            'h' => Value::Fd(self.u32()?),
            't' => Value::U64(self.u64()?),
            's' => Value::Str(self.string()?),
            'o' => Value::Path(self.string()?),
            'g' => Value::Sig(self.sig()?),
            'v' => {
                let sig = self.sig()?;
                let mut chars = sig.chars();
                match (chars.next(), chars.next()) {
                    // No reply the agent reads nests variants; refusing them bounds the recursion.
                    (Some('v'), None) => {
                        return Err(DbusError::Malformed("variant inside a variant".into()));
                    }
                    (Some(c), None) => Value::Variant(Box::new(self.value(c)?)),
                    _ => {
                        return Err(DbusError::Malformed(format!(
                            "variant of unsupported type {sig:?}"
                        )));
                    }
                }
            }
            other => {
                return Err(DbusError::Malformed(format!("unsupported type {other:?}")));
            }
        })
    }
}

/// A connection to a bus.
pub struct Connection {
    stream: UnixStream,
    address: String,
    serial: u32,
    /// Bytes read and not yet taken as a line or message; reads go straight into it.
    inbuf: Vec<u8>,
    /// Bytes read from the socket so far: the stream offset just past `inbuf`'s end.
    received: u64,
    /// Fds received and not yet claimed, each with the stream offset just past the bytes of
    /// the read that carried it (the fds' message starts before that offset).
    infds: VecDeque<(u64, OwnedFd)>,
    /// Messages read while waiting for a reply (signals), handed out by [`Connection::next`].
    pending: VecDeque<Message>,
}

/// The system bus address: `DBUS_SYSTEM_BUS_ADDRESS` or the standard socket.
pub fn system_bus_address() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .unwrap_or_else(|_| "unix:path=/run/dbus/system_bus_socket".into())
}

impl Connection {
    /// Connects to `address`, authenticates as this process's user and says Hello.
    pub fn open(address: &str) -> Result<Self, DbusError> {
        let io = |error| DbusError::Io {
            address: address.to_string(),
            error,
        };
        let stream = connect(address)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io)?;
        let mut c = Self {
            stream,
            address: address.to_string(),
            serial: 0,
            inbuf: Vec::new(),
            received: 0,
            infds: VecDeque::new(),
            pending: VecDeque::new(),
        };
        c.authenticate()?;
        c.call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "Hello",
            &[],
        )?;
        Ok(c)
    }

    fn io(&self, error: std::io::Error) -> DbusError {
        DbusError::Io {
            address: self.address.clone(),
            error,
        }
    }

    fn authenticate(&mut self) -> Result<(), DbusError> {
        let uid = rustix::process::getuid().as_raw().to_string();
        let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        self.send_line(&format!("\0AUTH EXTERNAL {hex}\r\n"))?;
        let ok = self.read_line()?;
        if !ok.starts_with("OK ") {
            return Err(DbusError::Auth {
                address: self.address.clone(),
                line: ok,
            });
        }
        self.send_line("NEGOTIATE_UNIX_FD\r\n")?;
        let agree = self.read_line()?;
        if !agree.starts_with("AGREE_UNIX_FD") {
            return Err(DbusError::Auth {
                address: self.address.clone(),
                line: agree,
            });
        }
        self.send_line("BEGIN\r\n")
    }

    fn send_line(&mut self, line: &str) -> Result<(), DbusError> {
        self.stream
            .write_all(line.as_bytes())
            .map_err(|e| self.io(e))
    }

    /// One `\r\n`-terminated line of the authentication exchange.
    fn read_line(&mut self) -> Result<String, DbusError> {
        loop {
            if let Some(end) = self.inbuf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.inbuf[..end]).into_owned();
                self.inbuf.drain(..end + 2);
                return Ok(line);
            }
            self.fill()?;
        }
    }

    /// Reads more bytes (and any fds) from the socket into `inbuf`.
    fn fill(&mut self) -> Result<(), DbusError> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let start = self.inbuf.len();
        self.inbuf.resize(start + READ_CHUNK, 0);
        let read = {
            let mut iov = [IoSliceMut::new(&mut self.inbuf[start..])];
            rustix::net::recvmsg(&self.stream, &mut iov, &mut cmsg, RecvFlags::CMSG_CLOEXEC)
        };
        let got = match read {
            Ok(r) => r.bytes,
            Err(e) => {
                self.inbuf.truncate(start);
                return Err(self.io(e.into()));
            }
        };
        self.inbuf.truncate(start + got);
        self.received += got as u64;
        for msg in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = msg {
                self.infds.extend(rights.map(|fd| (self.received, fd)));
            }
        }
        if got == 0 {
            return Err(self.io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(())
    }

    /// Sends a method call; returns its serial.
    fn send_call(
        &mut self,
        destination: &str,
        path: &str,
        interface: &str,
        member: &str,
        args: &[Value],
    ) -> Result<u32, DbusError> {
        self.serial += 1;
        let serial = self.serial;
        let fields = [
            (1, Value::Path(path.into())),
            (2, Value::Str(interface.into())),
            (3, Value::Str(member.into())),
            (6, Value::Str(destination.into())),
        ];
        let m = marshal(METHOD_CALL, serial, &fields, args);
        self.stream.write_all(&m).map_err(|e| self.io(e))?;
        Ok(serial)
    }

    /// Calls a method and waits for its answer (signals read meanwhile are kept for `next`).
    pub fn call(
        &mut self,
        destination: &str,
        path: &str,
        interface: &str,
        member: &str,
        args: &[Value],
    ) -> Result<Message, DbusError> {
        let serial = self.send_call(destination, path, interface, member, args)?;
        self.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| self.io(e))?;
        loop {
            let m = self.read_message()?;
            if m.reply_serial != Some(serial) {
                if m.kind == SIGNAL {
                    self.pending.push_back(m);
                }
                continue;
            }
            if m.kind == ERROR {
                let message = match m.body.first() {
                    Some(Value::Str(s)) => s.clone(),
                    _ => String::new(),
                };
                return Err(DbusError::Remote {
                    method: format!("{interface}.{member}"),
                    name: m.error_name.unwrap_or_default(),
                    message,
                });
            }
            if m.kind == METHOD_RETURN {
                return Ok(m);
            }
        }
    }

    /// The next signal, waiting at most `timeout` (None: as long as it takes).
    pub fn next_signal(&mut self, timeout: Option<Duration>) -> Result<Option<Message>, DbusError> {
        if let Some(m) = self.pending.pop_front() {
            return Ok(Some(m));
        }
        self.stream
            .set_read_timeout(timeout)
            .map_err(|e| self.io(e))?;
        loop {
            match self.read_message() {
                Ok(m) if m.kind == SIGNAL => return Ok(Some(m)),
                Ok(_) => continue,
                Err(DbusError::Io { error, .. })
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads one whole message.
    fn read_message(&mut self) -> Result<Message, DbusError> {
        loop {
            if let Some(total) = self.complete_length()? {
                // Stream offset just past the message.
                let end = self.received - (self.inbuf.len() - total) as u64;
                let bytes: Vec<u8> = self.inbuf.drain(..total).collect();
                return self.parse(&bytes, end);
            }
            self.fill()?;
        }
    }

    /// The length of the first message when all of it is buffered.
    fn complete_length(&self) -> Result<Option<usize>, DbusError> {
        message_length(&self.inbuf)
    }

    /// Parses the message `bytes` that ended at stream offset `end`. It claims the fds that came
    /// with it; fds that came before its end and that it does not claim are closed, so that
    /// they are never handed to a later message.
    fn parse(&mut self, bytes: &[u8], end: u64) -> Result<Message, DbusError> {
        let mut came = Vec::new();
        while self.infds.front().is_some_and(|(at, _)| *at <= end) {
            if let Some((_, fd)) = self.infds.pop_front() {
                came.push(fd);
            }
        }
        let (mut m, unix_fds) = decode(bytes)?;
        came.truncate(unix_fds as usize);
        m.fds = came;
        Ok(m)
    }
}

/// Decodes the first message in `bytes` (what a connection has read, without fds): `Ok(None)`
/// while it is incomplete, else the message and the number of bytes it took.
pub fn parse_message(bytes: &[u8]) -> Result<Option<(Message, usize)>, DbusError> {
    match message_length(bytes)? {
        Some(total) => Ok(Some((decode(&bytes[..total])?.0, total))),
        None => Ok(None),
    }
}

/// The length of the first message in `buf` when all of it is there.
fn message_length(buf: &[u8]) -> Result<Option<usize>, DbusError> {
    if buf.len() < 16 {
        return Ok(None);
    }
    let mut r = Reader {
        buf,
        pos: 4,
        big_endian: buf[0] == b'B',
    };
    let body_len = r.u32()? as usize;
    r.u32()?;
    let fields_len = r.u32()? as usize;
    if fields_len.saturating_add(body_len) > MAX_MESSAGE {
        return Err(DbusError::Malformed(format!(
            "message of {fields_len} + {body_len} bytes (header fields + body) exceeds {MAX_MESSAGE}"
        )));
    }
    let total = (16 + fields_len).div_ceil(8) * 8 + body_len;
    Ok((buf.len() >= total).then_some(total))
}

/// Decodes one whole message (without its fds); also returns the number of fds it declares.
fn decode(bytes: &[u8]) -> Result<(Message, u32), DbusError> {
    let mut r = Reader {
        buf: bytes,
        pos: 1,
        big_endian: bytes.first() == Some(&b'B'),
    };
    let kind = r.take(1)?[0];
    r.take(2)?;
    let _body_len = r.u32()?;
    let _serial = r.u32()?;
    let fields_len = r.u32()? as usize;
    let fields_end = r.pos + fields_len;
    let mut m = Message {
        kind,
        reply_serial: None,
        path: None,
        interface: None,
        member: None,
        error_name: None,
        body: Vec::new(),
        fds: Vec::new(),
    };
    let mut signature = String::new();
    let mut unix_fds = 0;
    while r.pos < fields_end {
        r.align(8);
        let code = r.take(1)?[0];
        let Value::Variant(v) = r.value('v')? else {
            return Err(DbusError::Malformed("header field".into()));
        };
        match (code, *v) {
            (1, Value::Path(p)) => m.path = Some(p),
            (2, Value::Str(s)) => m.interface = Some(s),
            (3, Value::Str(s)) => m.member = Some(s),
            (4, Value::Str(s)) => m.error_name = Some(s),
            (5, Value::U32(n)) => m.reply_serial = Some(n),
            (8, Value::Sig(s)) => signature = s,
            (9, Value::U32(n)) => unix_fds = n,
            _ => {}
        }
    }
    r.align(8);
    for t in signature.chars() {
        match r.value(t) {
            Ok(v) => m.body.push(v),
            // A body with types we do not read (say, an array) is not an error: callers
            // only look at the leading values they know.
            Err(_) => break,
        }
    }
    Ok((m, unix_fds))
}

/// A whole little-endian message of type `kind` with the header `fields` (code, value) and the
/// body `args` (the signature field is added when there are any).
fn marshal(kind: u8, serial: u32, fields: &[(u8, Value)], args: &[Value]) -> Vec<u8> {
    let mut body = Writer { buf: Vec::new() };
    for a in args {
        body.value(a);
    }
    let signature: String = args.iter().map(Value::signature).collect();
    let signature = (!signature.is_empty()).then_some((8, Value::Sig(signature)));
    let mut m = Writer { buf: Vec::new() };
    m.buf.extend_from_slice(&[b'l', kind, 0, 1]);
    m.u32(body.buf.len() as u32);
    m.u32(serial);
    let mut arr = Writer { buf: Vec::new() };
    // Array elements are structs (8-aligned) relative to the message start: the array's
    // content begins at offset 16, which is 8-aligned, so aligning within `arr` is exact.
    for (code, v) in fields.iter().chain(&signature) {
        arr.pad(8);
        arr.buf.push(*code);
        arr.value(&Value::Variant(Box::new(v.clone())));
    }
    m.u32(arr.buf.len() as u32);
    m.buf.extend_from_slice(&arr.buf);
    m.pad(8);
    m.buf.extend_from_slice(&body.buf);
    m.buf
}

/// Connects to a `unix:path=` or `unix:abstract=` address (the first usable of a `;` list).
fn connect(address: &str) -> Result<UnixStream, DbusError> {
    for candidate in address.split(';') {
        let Some(params) = candidate.strip_prefix("unix:") else {
            continue;
        };
        for kv in params.split(',') {
            if let Some(path) = kv.strip_prefix("path=") {
                return UnixStream::connect(path).map_err(|error| DbusError::Io {
                    address: address.to_string(),
                    error,
                });
            }
            if let Some(name) = kv.strip_prefix("abstract=") {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                    .map_err(|error| DbusError::Io {
                        address: address.to_string(),
                        error,
                    })?;
                return UnixStream::connect_addr(&addr).map_err(|error| DbusError::Io {
                    address: address.to_string(),
                    error,
                });
            }
        }
    }
    Err(DbusError::Address(address.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let values = [
            Value::Byte(7),
            Value::Bool(true),
            Value::I32(-15),
            Value::U64(1 << 40),
            Value::Str("shutdown".into()),
            Value::Path("/org/freedesktop/login1".into()),
            Value::Sig("ssss".into()),
            Value::Fd(0),
            Value::Variant(Box::new(Value::U32(5))),
        ];
        let mut w = Writer { buf: Vec::new() };
        for v in &values {
            w.value(v);
        }
        let sig: String = values.iter().map(Value::signature).collect();
        assert_eq!(sig, "ybitsoghv");
        let mut r = Reader {
            buf: &w.buf,
            pos: 0,
            big_endian: false,
        };
        for (t, v) in sig.chars().zip(&values) {
            assert_eq!(&r.value(t).expect("value"), v);
        }
        assert_eq!(r.pos, w.buf.len());
    }

    /// `a(sv)` as the specification lays it out: the length of the elements, which start
    /// 8-aligned, each a struct (8-aligned) of a string and a variant.
    #[test]
    fn properties_are_marshalled_as_an_array_of_structs() {
        let mut w = Writer { buf: Vec::new() };
        w.value(&Value::Byte(1));
        w.value(&Value::Properties(vec![
            ("MemorySwapMax".into(), Value::U64(5)),
            ("A".into(), Value::Bool(true)),
        ]));
        let mut want = vec![1, 0, 0, 0, 48, 0, 0, 0];
        want.extend_from_slice(&13u32.to_le_bytes());
        want.extend_from_slice(b"MemorySwapMax\0");
        want.extend_from_slice(&[1, b't', 0, 0, 0, 0]);
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(b"A\0");
        want.extend_from_slice(&[1, b'b', 0, 0, 0, 0]);
        want.extend_from_slice(&1u32.to_le_bytes());
        assert_eq!(w.buf, want);
        assert_eq!(Value::Properties(Vec::new()).signature(), "a(sv)");
    }

    #[test]
    fn a_variant_inside_a_variant_is_refused() {
        let mut w = Writer { buf: Vec::new() };
        w.value(&Value::Variant(Box::new(Value::Variant(Box::new(
            Value::U32(5),
        )))));
        let mut r = Reader {
            buf: &w.buf,
            pos: 0,
            big_endian: false,
        };
        match r.value('v') {
            Err(DbusError::Malformed(m)) => assert!(m.contains("variant inside"), "{m}"),
            other => panic!("nested variant read as {other:?}"),
        }
    }

    /// A connection over one end of a socket pair, without authentication (the tests write
    /// messages into the other end).
    fn pair() -> (Connection, UnixStream) {
        let (ours, theirs) = UnixStream::pair().expect("socket pair");
        let c = Connection {
            stream: ours,
            address: "test".into(),
            serial: 0,
            inbuf: Vec::new(),
            received: 0,
            infds: VecDeque::new(),
            pending: VecDeque::new(),
        };
        (c, theirs)
    }

    /// The fixed header of a message with `fields_len` bytes of header fields and `body_len`
    /// of body.
    fn header(fields_len: u32, body_len: u32) -> Vec<u8> {
        let mut h = vec![b'l', SIGNAL, 0, 1];
        h.extend_from_slice(&body_len.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&fields_len.to_le_bytes());
        h
    }

    #[test]
    fn messages_over_one_mebibyte_are_refused() {
        let (mut c, _peer) = pair();
        // Exactly 1 MiB of header fields and body: waited for (incomplete), not refused.
        c.inbuf = header(16, (1 << 20) - 16);
        assert!(matches!(c.complete_length(), Ok(None)));
        // One byte more, however it is split, or a huge field array: refused.
        for (fields, body) in [(16, (1 << 20) - 15), (1 << 20, 1), (u32::MAX, u32::MAX)] {
            c.inbuf = header(fields, body);
            assert!(
                matches!(c.complete_length(), Err(DbusError::Malformed(_))),
                "{fields} + {body} accepted"
            );
        }
    }

    /// Sends `bytes` with `fds` attached in one sendmsg.
    fn send_with_fds(to: &UnixStream, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        assert!(cmsg.push(SendAncillaryMessage::ScmRights(fds)));
        let sent = rustix::net::sendmsg(
            to,
            &[std::io::IoSlice::new(bytes)],
            &mut cmsg,
            SendFlags::empty(),
        )
        .expect("sendmsg");
        assert_eq!(sent, bytes.len());
    }

    #[test]
    fn fds_no_message_claims_are_not_handed_to_later_ones() {
        use std::os::fd::AsFd;
        let (mut c, mut peer) = pair();
        let member = |m: &str| (3, Value::Str(m.into()));
        let file = std::fs::File::open("/dev/null").expect("/dev/null");
        // A signal that declares no fds but comes with one ...
        let stray = marshal(SIGNAL, 1, &[member("Stray")], &[Value::U32(1)]);
        send_with_fds(&peer, &stray, &[file.as_fd()]);
        // ... then one that declares an fd but sent none, then one that declares and sends two.
        let claims = |n| [member("Claims"), (9, Value::U32(n))];
        peer.write_all(&marshal(SIGNAL, 2, &claims(1), &[Value::Fd(0)]))
            .expect("write");
        let own = marshal(SIGNAL, 3, &claims(2), &[Value::Fd(0), Value::Fd(1)]);
        send_with_fds(&peer, &own, &[file.as_fd(), file.as_fd()]);
        let m = c.read_message().expect("stray");
        assert_eq!((m.member.as_deref(), m.fds.len()), (Some("Stray"), 0));
        let m = c.read_message().expect("without its fd");
        assert_eq!((m.member.as_deref(), m.fds.len()), (Some("Claims"), 0));
        let m = c.read_message().expect("with its fds");
        assert_eq!((m.member.as_deref(), m.fds.len()), (Some("Claims"), 2));
        assert!(c.infds.is_empty());
    }

    #[test]
    fn addresses() {
        assert!(matches!(
            connect("tcp:host=localhost,port=1"),
            Err(DbusError::Address(_))
        ));
        assert!(matches!(
            connect("unix:path=/nonexistent/bus"),
            Err(DbusError::Io { .. })
        ));
    }
}
