//! Layer tapes: a layer's uncompressed tar stream without the file contents its snapshot holds,
//! from which the exact stream (and so its diff id) is rebuilt for export.
//!
//! A tape is a zstd stream of records: `R` (u32 length, bytes) for bytes of the tar stream
//! itself (headers, PAX records, padding, the end-of-archive blocks, contents not on disk) and
//! `F` (u64 size, u32 length, path) for a regular file's content, read back from the snapshot;
//! `E` (u64 total) closes it. Headers compress well, so a tape is a small fraction of a layer.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

const MAGIC: &[u8] = b"berth-layer-tape 1\n";
/// Raw bytes are flushed as a record once this many are pending.
const RAW_RECORD: usize = 64 * 1024;
/// Longest path a file record may carry.
const MAX_PATH: u32 = 64 * 1024;
/// zstd level for tapes: fast, still small for tar headers.
const ZSTD_LEVEL: i32 = 3;

/// Why a tape cannot be written or replayed.
#[derive(Debug, thiserror::Error)]
pub enum TapeError {
    /// The tape file is missing: the layer was unpacked without one.
    #[error("layer record {} is missing: {source}", path.display())]
    Missing { path: PathBuf, source: io::Error },
    /// The tape does not decode.
    #[error("layer record {}: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// A file the tape names is gone or has another size.
    #[error("layer file {path}: {reason}")]
    File { path: String, reason: String },
    /// Reading or writing failed.
    #[error("layer record {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// The recording side, shared between the reader the tar parser reads through and the
/// unpacker that says which bytes are file contents.
pub(super) struct Recorder {
    path: PathBuf,
    out: Option<zstd::stream::write::Encoder<'static, BufWriter<File>>>,
    /// Offset in the tar stream of the next byte read.
    pos: u64,
    /// Bytes in `[skip_from, skip_to)` are file contents on disk, not recorded.
    skip_from: u64,
    skip_to: u64,
    pending: Vec<u8>,
    failed: Option<io::Error>,
}

impl Recorder {
    /// Starts a tape at `path` (created or truncated).
    pub(super) fn create(path: &Path) -> io::Result<Self> {
        let file = File::create(path)?;
        let mut out = zstd::stream::write::Encoder::new(BufWriter::new(file), ZSTD_LEVEL)?;
        out.write_all(MAGIC)?;
        Ok(Self {
            path: path.to_owned(),
            out: Some(out),
            pos: 0,
            skip_from: 0,
            skip_to: 0,
            pending: Vec::new(),
            failed: None,
        })
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.write_all(bytes)
        {
            self.failed = Some(e);
        }
    }

    fn flush_raw(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let mut head = [0u8; 5];
        head[0] = b'R';
        head[1..].copy_from_slice(&(pending.len() as u32).to_le_bytes());
        self.write(&head);
        self.write(&pending);
        self.pending = pending;
        self.pending.clear();
    }

    /// Notes bytes the tar parser read at the current offset.
    fn observe(&mut self, bytes: &[u8]) {
        let start = self.pos;
        let end = start + bytes.len() as u64;
        // The part before and after the skipped range is the stream's own.
        let cut_a = self.skip_from.clamp(start, end);
        let cut_b = self.skip_to.clamp(start, end);
        self.pending
            .extend_from_slice(&bytes[..(cut_a - start) as usize]);
        self.pending
            .extend_from_slice(&bytes[(cut_b - start) as usize..]);
        self.pos = end;
        if self.pending.len() >= RAW_RECORD {
            self.flush_raw();
        }
    }

    /// The next `size` bytes, starting at `position` in the stream, are the content of the
    /// regular file at `path` (relative to the layer root). Content that does not start where
    /// the stream stands is kept on the tape instead.
    pub(super) fn file(&mut self, path: &[u8], position: u64, size: u64) {
        if size == 0 || position != self.pos || path.len() as u64 > u64::from(MAX_PATH) {
            return;
        }
        self.flush_raw();
        let mut head = Vec::with_capacity(13 + path.len());
        head.push(b'F');
        head.extend_from_slice(&size.to_le_bytes());
        head.extend_from_slice(&(path.len() as u32).to_le_bytes());
        head.extend_from_slice(path);
        self.write(&head);
        self.skip_from = position;
        self.skip_to = position + size;
    }

    /// Closes the tape after the stream's last byte.
    pub(super) fn finish(&mut self) -> io::Result<()> {
        self.flush_raw();
        let mut end = [0u8; 9];
        end[0] = b'E';
        end[1..].copy_from_slice(&self.pos.to_le_bytes());
        self.write(&end);
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        match self.out.take() {
            Some(out) => out.finish()?.flush(),
            None => Ok(()),
        }
    }

    /// Where the tape is written.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// The tar stream as the parser reads it, shown to the recorder on the way.
pub(super) struct RecordingReader<'r, S> {
    pub(super) inner: S,
    pub(super) recorder: Option<&'r RefCell<Recorder>>,
}

impl<S: Read> Read for RecordingReader<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(r) = self.recorder {
            r.borrow_mut().observe(&buf[..n]);
        }
        Ok(n)
    }
}

/// What is being replayed now.
enum Current {
    Raw { left: usize },
    File { file: File, path: String, left: u64 },
    Idle,
}

/// Rebuilds a layer's tar stream from its tape and the snapshot's files: a [`Read`] of exactly
/// [`TapeReader::size`] bytes, failing if a file is gone or changed size.
pub struct TapeReader {
    path: PathBuf,
    root: OwnedFd,
    tape: zstd::stream::read::Decoder<'static, BufReader<File>>,
    current: Current,
    raw: Vec<u8>,
    raw_pos: usize,
    produced: u64,
    done: bool,
}

impl TapeReader {
    /// Opens the tape at `tape` for the files under `root`.
    pub fn open(tape: &Path, root: &Path) -> Result<Self, TapeError> {
        let decoder = open_tape(tape)?;
        let root = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| TapeError::Io {
            path: root.to_owned(),
            source: e.into(),
        })?;
        Ok(Self {
            path: tape.to_owned(),
            root,
            tape: decoder,
            current: Current::Idle,
            raw: Vec::new(),
            raw_pos: 0,
            produced: 0,
            done: false,
        })
    }

    /// The length of the stream the tape rebuilds, read without touching the files.
    pub fn size(tape: &Path) -> Result<u64, TapeError> {
        let mut r = open_tape(tape)?;
        let corrupt = |reason: &str| TapeError::Corrupt {
            path: tape.to_owned(),
            reason: reason.to_owned(),
        };
        let mut total = 0u64;
        loop {
            match read_record(&mut r).map_err(|e| corrupt(&e))? {
                Record::Raw(len) => {
                    io::copy(&mut (&mut r).take(u64::from(len)), &mut io::sink())
                        .map_err(|_| corrupt("ends early"))?;
                    total += u64::from(len);
                }
                Record::File(size, _) => total += size,
                Record::End(end) if end == total => return Ok(total),
                Record::End(_) => return Err(corrupt("its records do not add up to its length")),
            }
        }
    }

    fn corrupt(&self, reason: impl Into<String>) -> io::Error {
        io::Error::other(TapeError::Corrupt {
            path: self.path.clone(),
            reason: reason.into(),
        })
    }

    /// Reads the next record; false at the end.
    fn next_record(&mut self) -> io::Result<bool> {
        match read_record(&mut self.tape).map_err(|e| self.corrupt(e))? {
            Record::Raw(len) => {
                self.raw.resize(len as usize, 0);
                self.tape
                    .read_exact(&mut self.raw)
                    .map_err(|_| self.corrupt("ends early"))?;
                self.raw_pos = 0;
                self.current = Current::Raw { left: len as usize };
            }
            Record::File(size, path) => {
                let shown = String::from_utf8_lossy(&path).into_owned();
                let file_error = |reason: String| {
                    io::Error::other(TapeError::File {
                        path: shown.clone(),
                        reason,
                    })
                };
                // Beneath the layer root and through no symlink: the path is the layer's own.
                let fd = rustix::fs::openat2(
                    &self.root,
                    OsStr::from_bytes(&path),
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
                )
                .map_err(|e| file_error(format!("opening it: {e}")))?;
                let file = File::from(fd);
                let on_disk = file
                    .metadata()
                    .map_err(|e| file_error(format!("stat: {e}")))?
                    .len();
                if on_disk != size {
                    return Err(file_error(format!(
                        "it has {on_disk} bytes, the layer had {size}"
                    )));
                }
                self.current = Current::File {
                    file,
                    path: shown,
                    left: size,
                };
            }
            Record::End(total) => {
                if total != self.produced {
                    return Err(self.corrupt("its records do not add up to its length"));
                }
                self.done = true;
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A tape record's header (a raw record's bytes follow it).
enum Record {
    Raw(u32),
    File(u64, Vec<u8>),
    End(u64),
}

/// Opens a tape and checks its magic.
fn open_tape(
    tape: &Path,
) -> Result<zstd::stream::read::Decoder<'static, BufReader<File>>, TapeError> {
    let file = File::open(tape).map_err(|source| TapeError::Missing {
        path: tape.to_owned(),
        source,
    })?;
    let mut decoder = zstd::stream::read::Decoder::new(file).map_err(|source| TapeError::Io {
        path: tape.to_owned(),
        source,
    })?;
    let mut magic = vec![0u8; MAGIC.len()];
    if decoder.read_exact(&mut magic).is_err() || magic != MAGIC {
        return Err(TapeError::Corrupt {
            path: tape.to_owned(),
            reason: "not a Berth layer record".into(),
        });
    }
    Ok(decoder)
}

fn read_record(r: &mut impl Read) -> Result<Record, String> {
    let early = |_| "ends early".to_string();
    let mut tag = [0u8; 1];
    r.read_exact(&mut tag).map_err(early)?;
    match tag[0] {
        b'R' => Ok(Record::Raw(read_u32(r).map_err(early)?)),
        b'F' => {
            let size = read_u64(r).map_err(early)?;
            let len = read_u32(r).map_err(early)?;
            if len > MAX_PATH {
                return Err("a path longer than any layer holds".into());
            }
            let mut path = vec![0u8; len as usize];
            r.read_exact(&mut path).map_err(early)?;
            Ok(Record::File(size, path))
        }
        b'E' => Ok(Record::End(read_u64(r).map_err(early)?)),
        _ => Err("unknown record".into()),
    }
}

impl Read for TapeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match &mut self.current {
                Current::Raw { left } if *left > 0 => {
                    let n = buf.len().min(*left);
                    buf[..n].copy_from_slice(&self.raw[self.raw_pos..self.raw_pos + n]);
                    self.raw_pos += n;
                    *left -= n;
                    self.produced += n as u64;
                    return Ok(n);
                }
                Current::File { file, path, left } if *left > 0 => {
                    let want = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    let n = file.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(io::Error::other(TapeError::File {
                            path: path.clone(),
                            reason: "it ended early".into(),
                        }));
                    }
                    *left -= n as u64;
                    self.produced += n as u64;
                    return Ok(n);
                }
                _ => {
                    if self.done || !self.next_record()? {
                        return Ok(0);
                    }
                }
            }
        }
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}
