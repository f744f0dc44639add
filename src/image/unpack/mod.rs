//! OCI layer unpacker: streams a plain, gzip or zstd layer tarball into its own overlayfs layer directory.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use rustix::fs::{
    self as rfs, AtFlags, Dir, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid, XattrFlags,
};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use crate::image::tar_guard::{self, TarGuard};

/// Capacity of the buffers around the compressed input and the decompressed tar stream.
const STREAM_BUFFER: usize = 256 * 1024;
/// Decompressed chunks (of [`STREAM_BUFFER`] bytes) queued between the decompressing thread and
/// the unpacking thread.
const PIPELINE_CHUNKS: usize = 8;
/// Chunk size used when streaming a regular file's content to disk.
const COPY_BUFFER: usize = 256 * 1024;
/// Entries (and hard-link targets) with more path components than this are refused.
///
/// This bounds the directory descriptors held open while walking (and while
/// removing a replaced directory tree) to a small, fixed number.
pub const MAX_PATH_DEPTH: usize = 256;
/// What each entry counts against a layer's size limit besides its content: a header block.
const ENTRY_CHARGE: u64 = 512;
/// Mode of parent directories that the layer does not list but that must exist.
const IMPLICIT_DIR_MODE: u32 = 0o755;

const WHITEOUT_PREFIX: &[u8] = b".wh.";
const WHITEOUT_META_PREFIX: &[u8] = b".wh..wh.";
const WHITEOUT_OPAQUE: &[u8] = b".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
const PAX_XATTR_PREFIX: &[u8] = b"SCHILY.xattr.";
const PAX_SPARSE_PREFIX: &[u8] = b"GNU.sparse.";

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip (one or more concatenated members).
    Gzip,
    /// zstd (one or more concatenated frames).
    Zstd,
}

const LAYER_MEDIA_TYPES: &[(&str, Compression)] = &[
    ("application/vnd.oci.image.layer.v1.tar", Compression::None),
    (
        "application/vnd.oci.image.layer.v1.tar+gzip",
        Compression::Gzip,
    ),
    (
        "application/vnd.oci.image.layer.v1.tar+zstd",
        Compression::Zstd,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        Compression::None,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        Compression::Gzip,
    ),
    (
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
        Compression::Zstd,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar",
        Compression::None,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        Compression::Gzip,
    ),
    (
        "application/vnd.docker.image.rootfs.diff.tar.zstd",
        Compression::Zstd,
    ),
    (
        "application/vnd.docker.image.rootfs.foreign.diff.tar",
        Compression::None,
    ),
    (
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
        Compression::Gzip,
    ),
];

impl Compression {
    /// The compression of a layer with this OCI or Docker media type, or `None` if it is not a
    /// tar layer type this unpacker knows. Parameters (`; foo=bar`) and letter case are ignored.
    pub fn from_media_type(media_type: &str) -> Option<Compression> {
        let essence = media_type
            .split_once(';')
            .map_or(media_type, |(essence, _)| essence)
            .trim();
        LAYER_MEDIA_TYPES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(essence))
            .map(|&(_, compression)| compression)
    }
}

/// What an unpack did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnpackStats {
    /// Tar entries applied (files, directories, links, devices, whiteouts, opaque markers);
    /// skipped metadata entries (PAX global headers, `.wh..wh.*` bookkeeping) are not counted.
    pub entries: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
}

/// Why an unpack failed. After any error the destination holds a partial layer and must be
/// discarded by the caller.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The entry would create or touch something outside the destination directory.
    #[error("layer entry {entry}: refused, it would escape the layer directory: {reason}")]
    Escape { entry: String, reason: String },
    /// The entry is malformed or cannot be represented (unsupported type, dangling hard link...).
    #[error("layer entry {entry}: invalid: {reason}")]
    Invalid { entry: String, reason: String },
    /// A filesystem operation on the destination failed.
    #[error("layer entry {entry}: {op}: {source}")]
    Io {
        entry: String,
        op: String,
        source: io::Error,
    },
    /// The layer stream is corrupt or truncated (bad gzip/zstd data, bad tar header, short entry).
    #[error("corrupt or truncated layer: {context}: {source}")]
    Corrupt { context: String, source: io::Error },
    /// Reading the layer blob itself failed.
    #[error("reading layer: {context}: {source}")]
    Read { context: String, source: io::Error },
    /// The destination directory cannot be opened.
    #[error("layer directory {}: {source}", path.display())]
    Destination { path: PathBuf, source: io::Error },
    /// A GNU long name/link or PAX record larger than the tar guard allows.
    #[error("refused before reading it: {0}")]
    ExtensionTooLarge(#[from] crate::image::tar_guard::ExtensionTooLarge),
    /// The layer unpacks to more than the limit it was given.
    #[error(
        "layer entry {entry}: the layer unpacks to more than the {limit} bytes allowed (images.max_unpacked_layer_bytes)"
    )]
    TooLarge { entry: String, limit: u64 },
}

/// Unpacks one layer blob into `dest`, an empty directory that becomes an overlayfs lower or
/// upper directory holding exactly this layer's diff.
///
/// Blocking: call it from a blocking-friendly thread (e.g. `spawn_blocking`). `reader` is read
/// and decompressed on the calling thread while a scoped helper thread writes the entries (at
/// most 8 chunks of 256 KiB in flight). The stream is consumed to its end, so gzip/zstd
/// checksums are verified; it is never buffered whole. `dest` must exist and should be empty
/// (not checked: entries are merged into what is there). Must run as root: it creates devices
/// and whiteouts and chowns to the archive's numeric ids.
///
/// Layer semantics:
/// - `dir/.wh.name` becomes an overlay whiteout (character device 0:0) at `dir/name`;
///   `dir/.wh..wh..opq` sets `trusted.overlay.opaque=y` on `dir`; any other `.wh..wh.*` entry is
///   skipped. Parent directories a layer does not list are created `0755 root:root`.
/// - A path listed twice is replaced (the later entry wins); a directory over a directory
///   merges and takes the later metadata.
/// - Ownership is numeric, modes keep setuid/setgid/sticky, `SCHILY.xattr.*` PAX records become
///   xattrs (namespaces the filesystem refuses are skipped with a warning; `trusted.overlay.*`
///   and `user.overlay.*` are always skipped, since only the whiteout markers may drive overlayfs),
///   and directory mtimes are applied after every entry has been written.
///
/// Security policy (an entry that breaks it fails the whole unpack with [`UnpackError::Escape`]):
/// - Paths are normalised by dropping a leading `/`, empty and `.` components. **Any `..`
///   component is refused**, even one that would stay inside (`a/../b`): no image builder emits
///   them, and refusing them avoids any disagreement between lexical and on-disk resolution.
///   Hard-link targets follow the same rule and must already exist in this layer.
/// - Every parent directory is opened component by component, relative to `dest`, with
///   `O_NOFOLLOW|O_DIRECTORY`; a symlink parent is refused (so `evil -> /tmp` followed by
///   `evil/x` fails), a non-directory parent is [`UnpackError::Invalid`].
/// - The final component is never followed: files are created `O_CREAT|O_EXCL|O_NOFOLLOW` after
///   removing whatever was there, and ownership, xattrs and times are set through the new
///   descriptor or with `AT_SYMLINK_NOFOLLOW`/`lsetxattr`. Symlink targets are stored verbatim
///   (absolute targets are normal in images) and are never resolved by the unpacker.
pub fn unpack_layer<R: Read>(
    reader: R,
    compression: Compression,
    dest: &Path,
) -> Result<UnpackStats, UnpackError> {
    unpack(reader, compression, dest, None, None, 0)
}

/// Like [`unpack_layer`], and also returns the layer's diff ID (`sha256:<hex>` of the
/// uncompressed tar stream) for comparison with the image config's `rootfs.diff_ids`. With
/// `tape`, writes there the layer's tape (see [`tape`]), from which [`TapeReader`] rebuilds the
/// exact stream out of `dest`.
pub fn unpack_layer_with_diff_id<R: Read>(
    reader: R,
    compression: Compression,
    dest: &Path,
    tape: Option<&Path>,
) -> Result<(UnpackStats, String), UnpackError> {
    unpack_layer_limited(reader, compression, dest, tape, 0)
}

/// Like [`unpack_layer_with_diff_id`], refusing the layer with [`UnpackError::TooLarge`] once
/// it would write more than `max_bytes` (0: no limit). What counts is every regular file's
/// content (holes of sparse files included: they are written out) and 512 bytes for each
/// entry, so neither one huge file nor millions of empty ones get past it. A file that would
/// cross the limit is refused before any of its content is written.
pub fn unpack_layer_limited<R: Read>(
    reader: R,
    compression: Compression,
    dest: &Path,
    tape: Option<&Path>,
    max_bytes: u64,
) -> Result<(UnpackStats, String), UnpackError> {
    let mut hasher = Sha256::new();
    let stats = unpack(
        reader,
        compression,
        dest,
        Some(&mut hasher),
        tape,
        max_bytes,
    )?;
    Ok((stats, format!("sha256:{}", hex::encode(hasher.finalize()))))
}

fn unpack<R: Read>(
    reader: R,
    compression: Compression,
    dest: &Path,
    hasher: Option<&mut Sha256>,
    tape: Option<&Path>,
    max_bytes: u64,
) -> Result<UnpackStats, UnpackError> {
    let source_failed = AtomicBool::new(false);
    let source = BufReader::with_capacity(
        STREAM_BUFFER,
        SourceReader {
            inner: reader,
            failed: &source_failed,
        },
    );
    match compression {
        Compression::None => pipeline(source, dest, hasher, tape, max_bytes, &source_failed),
        Compression::Gzip => pipeline(
            flate2::bufread::MultiGzDecoder::new(source),
            dest,
            hasher,
            tape,
            max_bytes,
            &source_failed,
        ),
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(source).map_err(|source| {
                UnpackError::Read {
                    context: "creating the zstd decoder".to_owned(),
                    source,
                }
            })?;
            pipeline(decoder, dest, hasher, tape, max_bytes, &source_failed)
        }
    }
}

/// Decompresses on the calling thread (which keeps `R`, so it need not be `Send`) while a
/// scoped worker thread parses the tar and writes the files: a layer then unpacks at the speed
/// of the slower of the two instead of their sum. Falls back to one thread if none can start.
fn pipeline<S: Read>(
    mut decoded: S,
    dest: &Path,
    hasher: Option<&mut Sha256>,
    tape: Option<&Path>,
    max_bytes: u64,
    source_failed: &AtomicBool,
) -> Result<UnpackStats, UnpackError> {
    let (chunks_tx, chunks_rx) = mpsc::sync_channel(PIPELINE_CHUNKS);
    let (spare_tx, spare_rx) = mpsc::channel();
    let span = tracing::Span::current();
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("layer-unpack".to_owned())
            .spawn_scoped(scope, move || {
                let _entered = span.enter();
                let chunks = ChunkReader {
                    chunks: chunks_rx,
                    spare: spare_tx,
                    chunk: Vec::new(),
                    pos: 0,
                    failed: false,
                };
                unpack_tar(chunks, dest, tape, max_bytes, source_failed)
            });
        match worker {
            Ok(worker) => {
                feed(&mut decoded, hasher, &chunks_tx, &spare_rx);
                drop(chunks_tx);
                worker
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }
            Err(e) => {
                warn!(error = %e, "cannot start a layer unpack thread; unpacking on this one");
                let stream = BufReader::with_capacity(
                    STREAM_BUFFER,
                    DigestReader {
                        inner: decoded,
                        hasher,
                    },
                );
                unpack_tar(stream, dest, tape, max_bytes, source_failed)
            }
        }
    })
}

/// Reads `decoded` in chunks into the channel until its end, an error (sent along, so the
/// worker fails with it) or the worker hanging up (it failed and has its own error).
fn feed<S: Read>(
    decoded: &mut S,
    mut hasher: Option<&mut Sha256>,
    chunks: &mpsc::SyncSender<io::Result<Vec<u8>>>,
    spare: &mpsc::Receiver<Vec<u8>>,
) {
    loop {
        let mut chunk = spare.try_recv().unwrap_or_default();
        chunk.resize(STREAM_BUFFER, 0);
        let mut filled = 0;
        let mut failure = None;
        while filled < chunk.len() {
            match decoded.read(&mut chunk[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        chunk.truncate(filled);
        if let Some(hasher) = hasher.as_deref_mut() {
            hasher.update(&chunk);
        }
        let at_end = filled < STREAM_BUFFER;
        if !chunk.is_empty() && chunks.send(Ok(chunk)).is_err() {
            return;
        }
        if let Some(e) = failure {
            let _ = chunks.send(Err(e));
            return;
        }
        if at_end {
            return;
        }
    }
}

/// The worker's view of the decompressed stream: chunks from [`feed`], handed back for reuse.
struct ChunkReader {
    chunks: mpsc::Receiver<io::Result<Vec<u8>>>,
    spare: mpsc::Sender<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
    failed: bool,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            if self.failed {
                return Err(io::Error::other("the layer stream failed earlier"));
            }
            match self.chunks.recv() {
                Ok(Ok(next)) => {
                    let used = std::mem::replace(&mut self.chunk, next);
                    self.pos = 0;
                    if used.capacity() > 0 {
                        // The feeder may be gone already; then the buffer is just freed.
                        let _ = self.spare.send(used);
                    }
                }
                Ok(Err(e)) => {
                    self.failed = true;
                    return Err(e);
                }
                // The feeder hung up: the stream ended cleanly (errors are sent first).
                Err(mpsc::RecvError) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn unpack_tar<S: Read>(
    stream: S,
    dest: &Path,
    tape: Option<&Path>,
    max_bytes: u64,
    source_failed: &AtomicBool,
) -> Result<UnpackStats, UnpackError> {
    let recorder = match tape {
        Some(path) => Some(RefCell::new(tape::Recorder::create(path).map_err(|e| {
            UnpackError::Destination {
                path: path.to_owned(),
                source: e,
            }
        })?)),
        None => None,
    };
    let mut unpacker = Unpacker::new(dest, recorder.as_ref())?;
    unpacker.max_bytes = max_bytes;
    let mut archive = tar::Archive::new(tape::RecordingReader {
        inner: TarGuard::new(stream),
        recorder: recorder.as_ref(),
    });
    let entries = archive
        .entries()
        .map_err(|e| stream_error(source_failed, "opening the archive".to_owned(), e))?;
    for (index, entry) in entries.enumerate() {
        let entry = entry.map_err(|e| {
            stream_error(
                source_failed,
                format!("reading the header of entry #{}", index + 1),
                e,
            )
        })?;
        if unpacker.apply(entry, source_failed)? {
            unpacker.stats.entries += 1;
        }
    }
    // Drain the end-of-archive blocks and padding so the decompressor reaches its end and
    // verifies its checksum (and the diff ID covers the whole stream).
    let mut rest = archive.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(|e| {
        stream_error(
            source_failed,
            "reading past the end of the archive".to_owned(),
            e,
        )
    })?;
    unpacker.finish()?;
    if let Some(recorder) = &recorder {
        let mut recorder = recorder.borrow_mut();
        recorder.finish().map_err(|e| UnpackError::Destination {
            path: recorder.path().to_owned(),
            source: e,
        })?;
    }
    debug!(
        dest = %dest.display(),
        entries = unpacker.stats.entries,
        bytes = unpacker.stats.bytes,
        "layer unpacked"
    );
    Ok(unpacker.stats)
}

/// The compressed input; remembers whether an error came from it rather than from decoding.
struct SourceReader<'a, R> {
    inner: R,
    failed: &'a AtomicBool,
}

impl<R: Read> Read for SourceReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if e.kind() != io::ErrorKind::Interrupted {
                // Relaxed: the error itself reaches the worker through a channel, which
                // orders this store before the worker's load.
                self.failed.store(true, Ordering::Relaxed);
            }
        })
    }
}

/// The decompressed tar stream, optionally hashed on the way through (single-thread fallback).
struct DigestReader<'h, R> {
    inner: R,
    hasher: Option<&'h mut Sha256>,
}

impl<R: Read> Read for DigestReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(hasher) = self.hasher.as_deref_mut() {
            hasher.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// A failure while reading the (decompressed) stream: the blob's own reader failing is
/// [`UnpackError::Read`], anything else (decoder, tar parser, early end) is corruption.
fn stream_error(source_failed: &AtomicBool, context: String, source: io::Error) -> UnpackError {
    if let Some(refused) = tar_guard::refusal(&source) {
        return UnpackError::ExtensionTooLarge(tar_guard::ExtensionTooLarge {
            kind: refused.kind,
            size: refused.size,
            offset: refused.offset,
        });
    }
    if source_failed.load(Ordering::Relaxed) {
        UnpackError::Read { context, source }
    } else {
        UnpackError::Corrupt { context, source }
    }
}

fn lossy(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

fn io_error(raw: &[u8], op: impl Into<String>, source: impl Into<io::Error>) -> UnpackError {
    UnpackError::Io {
        entry: lossy(raw),
        op: op.into(),
        source: source.into(),
    }
}

fn escape(raw: &[u8], reason: impl Into<String>) -> UnpackError {
    UnpackError::Escape {
        entry: lossy(raw),
        reason: reason.into(),
    }
}

fn invalid(raw: &[u8], reason: impl Into<String>) -> UnpackError {
    UnpackError::Invalid {
        entry: lossy(raw),
        reason: reason.into(),
    }
}

fn corrupt_field(raw: &[u8], field: &str, source: io::Error) -> UnpackError {
    UnpackError::Corrupt {
        context: format!("entry {}: {field}", lossy(raw)),
        source,
    }
}

enum PathProblem {
    Escape(&'static str),
    Invalid(String),
}

/// Splits an archive path into its normal components (see the policy on [`unpack_layer`]).
fn split_path(raw: &[u8]) -> Result<Vec<&OsStr>, PathProblem> {
    let mut components = Vec::new();
    for component in raw.split(|&b| b == b'/') {
        match component {
            b"" | b"." => {}
            b".." => return Err(PathProblem::Escape("the path has a `..` component")),
            _ if component.contains(&0) => {
                return Err(PathProblem::Invalid("the path contains a NUL byte".into()));
            }
            _ => components.push(OsStr::from_bytes(component)),
        }
    }
    if components.len() > MAX_PATH_DEPTH {
        return Err(PathProblem::Invalid(format!(
            "the path has more than {MAX_PATH_DEPTH} components"
        )));
    }
    Ok(components)
}

fn path_key(components: &[&OsStr]) -> Vec<u8> {
    let mut key = Vec::new();
    for (i, component) in components.iter().enumerate() {
        if i > 0 {
            key.push(b'/');
        }
        key.extend_from_slice(component.as_bytes());
    }
    key
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn display(component: &OsStr) -> String {
    lossy(component.as_bytes())
}

/// Metadata of one entry, from its header and PAX records.
struct Meta {
    uid: Uid,
    gid: Gid,
    mode: Mode,
    times: Timestamps,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn numeric_id(value: io::Result<u64>, field: &str, raw: &[u8]) -> Result<u32, UnpackError> {
    let value = value.map_err(|e| corrupt_field(raw, field, e))?;
    match u32::try_from(value) {
        Ok(id) if id != u32::MAX => Ok(id),
        _ => Err(invalid(raw, format!("{field} {value} is out of range"))),
    }
}

fn read_meta<R: Read>(entry: &mut tar::Entry<'_, R>, raw: &[u8]) -> Result<Meta, UnpackError> {
    let header = entry.header();
    let mode = header.mode().map_err(|e| corrupt_field(raw, "mode", e))? & 0o7777;
    let uid = numeric_id(header.uid(), "uid", raw)?;
    let gid = numeric_id(header.gid(), "gid", raw)?;
    let mtime = header.mtime().map_err(|e| corrupt_field(raw, "mtime", e))?;
    let mut mtime = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    let mut atime = None;
    let mut xattrs = Vec::new();
    if let Some(extensions) = entry
        .pax_extensions()
        .map_err(|e| corrupt_field(raw, "PAX records", e))?
    {
        for extension in extensions {
            let extension = extension.map_err(|e| corrupt_field(raw, "PAX records", e))?;
            let key = extension.key_bytes();
            if let Some(name) = key.strip_prefix(PAX_XATTR_PREFIX) {
                xattrs.push((name.to_vec(), extension.value_bytes().to_vec()));
            } else if key == b"mtime" {
                if let Some(time) = parse_pax_time(extension.value_bytes()) {
                    mtime = time;
                }
            } else if key == b"atime" {
                atime = parse_pax_time(extension.value_bytes());
            } else if key.starts_with(PAX_SPARSE_PREFIX) {
                return Err(invalid(raw, "PAX-format sparse files are not supported"));
            }
        }
    }
    Ok(Meta {
        uid: Uid::from_raw(uid),
        gid: Gid::from_raw(gid),
        mode: Mode::from_raw_mode(mode),
        times: Timestamps {
            last_access: atime.unwrap_or(mtime),
            last_modification: mtime,
        },
        xattrs,
    })
}

/// Parses a PAX time (`1700000000`, `1700000000.25`, `-1.5`) into a normalised timespec.
fn parse_pax_time(value: &[u8]) -> Option<Timespec> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    let secs: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos: i64 = 0;
    let mut scale: i64 = 100_000_000;
    for digit in fraction.bytes().take(9) {
        nanos += i64::from(digit - b'0') * scale;
        scale /= 10;
    }
    Some(match (negative, nanos) {
        (false, _) => Timespec {
            tv_sec: secs,
            tv_nsec: nanos,
        },
        (true, 0) => Timespec {
            tv_sec: -secs,
            tv_nsec: 0,
        },
        (true, _) => Timespec {
            tv_sec: -secs - 1,
            tv_nsec: 1_000_000_000 - nanos,
        },
    })
}

#[derive(Clone, Copy)]
enum XattrTarget<'a> {
    Fd(BorrowedFd<'a>),
    Path(&'a Path),
}

fn set_xattrs(
    target: XattrTarget<'_>,
    xattrs: &[(Vec<u8>, Vec<u8>)],
    raw: &[u8],
    skipped: &mut BTreeSet<Vec<u8>>,
) -> Result<(), UnpackError> {
    for (name, value) in xattrs {
        if name.starts_with(b"trusted.overlay.") || name.starts_with(b"user.overlay.") {
            note_skipped(
                skipped,
                raw,
                name,
                "overlayfs xattrs are never taken from a layer",
            );
            continue;
        }
        let os_name = OsStr::from_bytes(name);
        let result = match target {
            XattrTarget::Fd(fd) => rfs::fsetxattr(fd, os_name, value, XattrFlags::empty()),
            XattrTarget::Path(path) => rfs::lsetxattr(path, os_name, value, XattrFlags::empty()),
        };
        match result {
            Ok(()) => {}
            Err(Errno::NOTSUP) => {
                note_skipped(
                    skipped,
                    raw,
                    name,
                    "the filesystem does not support this xattr",
                );
            }
            Err(Errno::PERM)
                if matches!(target, XattrTarget::Path(_)) && name.starts_with(b"user.") =>
            {
                note_skipped(
                    skipped,
                    raw,
                    name,
                    "user xattrs are not allowed on this file type",
                );
            }
            Err(e) => return Err(io_error(raw, format!("set xattr {}", lossy(name)), e)),
        }
    }
    Ok(())
}

/// Logs a skipped xattr: a warning the first time a name is skipped in a layer, then debug.
fn note_skipped(skipped: &mut BTreeSet<Vec<u8>>, raw: &[u8], name: &[u8], why: &str) {
    if skipped.insert(name.to_vec()) {
        warn!(
            entry = %lossy(raw),
            xattr = %lossy(name),
            "{why}; skipped (further occurrences in this layer are logged at debug level)"
        );
    } else {
        debug!(entry = %lossy(raw), xattr = %lossy(name), "{why}; skipped");
    }
}

/// Ownership, mode and xattrs through a descriptor (chown first: it clears setuid/setgid and
/// file capabilities).
fn apply_fd_meta(
    fd: BorrowedFd<'_>,
    meta: &Meta,
    raw: &[u8],
    skipped: &mut BTreeSet<Vec<u8>>,
) -> Result<(), UnpackError> {
    rfs::fchown(fd, Some(meta.uid), Some(meta.gid)).map_err(|e| io_error(raw, "chown", e))?;
    rfs::fchmod(fd, meta.mode).map_err(|e| io_error(raw, "chmod", e))?;
    set_xattrs(XattrTarget::Fd(fd), &meta.xattrs, raw, skipped)
}

/// Opens `name` below `parent` as a directory without following a symlink. With `create`, a
/// missing directory is created (`0755 root:root`); without, a missing one gives `Ok(None)`.
fn open_component(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    create: bool,
    raw: &[u8],
) -> Result<Option<OwnedFd>, UnpackError> {
    match rfs::openat(parent, name, dir_flags(), Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) if create => {
            let created = match rfs::mkdirat(parent, name, Mode::from_raw_mode(IMPLICIT_DIR_MODE)) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => {
                    return Err(io_error(
                        raw,
                        format!("create parent directory {}", display(name)),
                        e,
                    ));
                }
            };
            let fd = rfs::openat(parent, name, dir_flags(), Mode::empty()).map_err(|e| {
                io_error(raw, format!("open parent directory {}", display(name)), e)
            })?;
            if created {
                rfs::fchown(&fd, Some(Uid::ROOT), Some(Gid::ROOT)).map_err(|e| {
                    io_error(raw, format!("chown parent directory {}", display(name)), e)
                })?;
                // Explicitly, so the process umask does not matter.
                rfs::fchmod(&fd, Mode::from_raw_mode(IMPLICIT_DIR_MODE)).map_err(|e| {
                    io_error(raw, format!("chmod parent directory {}", display(name)), e)
                })?;
            }
            Ok(Some(fd))
        }
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::LOOP | Errno::NOTDIR) => {
            let stat = rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
                io_error(raw, format!("stat parent component {}", display(name)), e)
            })?;
            if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
                Err(escape(
                    raw,
                    format!("parent component {} is a symlink", display(name)),
                ))
            } else {
                Err(invalid(
                    raw,
                    format!("parent component {} is not a directory", display(name)),
                ))
            }
        }
        Err(e) => Err(io_error(
            raw,
            format!("open parent directory {}", display(name)),
            e,
        )),
    }
}

/// The chain of open directories from the layer root down to the parent of the current entry.
///
/// Invariant: before anything is created or removed under a parent, the stack is truncated to
/// exactly that parent's chain, so only children of the stack's top are ever removed and no
/// descriptor in the stack can refer to a directory that was replaced.
struct DirStack {
    root: OwnedFd,
    stack: Vec<(OsString, OwnedFd)>,
}

impl DirStack {
    fn top(&self) -> BorrowedFd<'_> {
        self.stack
            .last()
            .map_or(self.root.as_fd(), |(_, fd)| fd.as_fd())
    }

    /// Walks to `parent`; `Ok(false)` when a component is missing and `create` is off.
    fn walk(&mut self, parent: &[&OsStr], create: bool, raw: &[u8]) -> Result<bool, UnpackError> {
        let common = self
            .stack
            .iter()
            .zip(parent)
            .take_while(|((name, _), wanted)| name.as_os_str() == **wanted)
            .count();
        self.stack.truncate(common);
        for name in &parent[common..] {
            match open_component(self.top(), name, create, raw)? {
                Some(fd) => self.stack.push((name.to_os_string(), fd)),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The directory `parent`, creating missing components.
    fn resolve(&mut self, parent: &[&OsStr], raw: &[u8]) -> Result<BorrowedFd<'_>, UnpackError> {
        if self.walk(parent, true, raw)? {
            Ok(self.top())
        } else {
            Err(invalid(raw, "parent directory vanished while unpacking"))
        }
    }

    /// The directory `parent` if it exists.
    fn resolve_existing(
        &mut self,
        parent: &[&OsStr],
        raw: &[u8],
    ) -> Result<Option<BorrowedFd<'_>>, UnpackError> {
        Ok(self.walk(parent, false, raw)?.then(|| self.top()))
    }

    /// Records `fd` as the child `name` of the current top (the entry just created there).
    fn push(&mut self, name: &OsStr, fd: OwnedFd) {
        self.stack.push((name.to_os_string(), fd));
    }

    /// Opens an existing directory independently of the stack (for hard-link targets).
    fn open_existing(
        &self,
        components: &[&OsStr],
        raw: &[u8],
    ) -> Result<Option<OwnedFd>, UnpackError> {
        let mut current = rfs::openat(&self.root, ".", dir_flags(), Mode::empty())
            .map_err(|e| io_error(raw, "open layer root", e))?;
        for name in components {
            match open_component(current.as_fd(), name, false, raw)? {
                Some(fd) => current = fd,
                None => return Ok(None),
            }
        }
        Ok(Some(current))
    }
}

/// Directory times to apply at the end, keyed by normalised path (`""` is the layer root).
type DirTimes = BTreeMap<Vec<u8>, Timestamps>;

/// Forgets the recorded times of `components` and everything below it (it was removed).
fn forget_tree(dir_times: &mut DirTimes, components: &[&OsStr]) {
    let key = path_key(components);
    dir_times.remove(&key);
    let mut start = key.clone();
    start.push(b'/');
    let mut end = key;
    end.push(b'/' + 1);
    let below: Vec<Vec<u8>> = dir_times
        .range(start..end)
        .map(|(k, _)| k.clone())
        .collect();
    for key in below {
        dir_times.remove(&key);
    }
}

/// Removes whatever is at `name` (a whole tree for a directory); nothing there is fine.
fn clear_path(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    components: &[&OsStr],
    dir_times: &mut DirTimes,
) -> Result<(), Errno> {
    let stat = match rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        remove_tree(parent, name)?;
        forget_tree(dir_times, components);
        Ok(())
    } else {
        rfs::unlinkat(parent, name, AtFlags::empty())
    }
}

/// Removes the directory `name` below `parent` and everything in it, never following symlinks.
/// Recursion depth is bounded by [`MAX_PATH_DEPTH`] since every directory was created by an entry.
fn remove_tree(parent: BorrowedFd<'_>, name: &OsStr) -> Result<(), Errno> {
    let fd = rfs::openat(parent, name, dir_flags(), Mode::empty())?;
    let mut children = Vec::new();
    for child in Dir::read_from(&fd)? {
        let child = child?;
        let child_name = child.file_name().to_bytes();
        if child_name != b"." && child_name != b".." {
            children.push((
                OsString::from_vec(child_name.to_vec()),
                child.file_type() == FileType::Directory,
            ));
        }
    }
    for (child, is_dir) in children {
        if is_dir {
            remove_tree(fd.as_fd(), &child)?;
        } else {
            match rfs::unlinkat(&fd, &child, AtFlags::empty()) {
                Ok(()) => {}
                // d_type was unknown and it is a directory after all.
                Err(Errno::ISDIR) => remove_tree(fd.as_fd(), &child)?,
                Err(e) => return Err(e),
            }
        }
    }
    rfs::unlinkat(parent, name, AtFlags::REMOVEDIR)
}

/// Runs `create`; if something already exists at the path, removes it and tries once more.
fn create_replacing<T>(
    parent: BorrowedFd<'_>,
    name: &OsStr,
    components: &[&OsStr],
    dir_times: &mut DirTimes,
    raw: &[u8],
    op: &str,
    mut create: impl FnMut() -> Result<T, Errno>,
) -> Result<T, UnpackError> {
    match create() {
        Err(Errno::EXIST) => {
            clear_path(parent, name, components, dir_times)
                .map_err(|e| io_error(raw, "remove the existing entry", e))?;
            create().map_err(|e| io_error(raw, op, e))
        }
        result => result.map_err(|e| io_error(raw, op, e)),
    }
}

enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

/// Streams `src` into `dst` in chunks of `buf.len()`; returns the bytes copied.
fn copy_content(src: &mut impl Read, dst: &mut File, buf: &mut [u8]) -> Result<u64, CopyError> {
    let mut total = 0u64;
    loop {
        let mut filled = 0;
        while filled < buf.len() {
            match src.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(CopyError::Read(e)),
            }
        }
        if filled > 0 {
            dst.write_all(&buf[..filled]).map_err(CopyError::Write)?;
            total += filled as u64;
        }
        if filled < buf.len() {
            return Ok(total);
        }
    }
}

/// Where an entry goes: the normalised path split into its parent and final component.
struct Target<'a> {
    raw: &'a [u8],
    components: &'a [&'a OsStr],
    parent: &'a [&'a OsStr],
    name: &'a OsStr,
}

struct Unpacker<'t> {
    dest: PathBuf,
    /// Told which stream bytes are file contents, when a tape is recorded.
    tape: Option<&'t RefCell<tape::Recorder>>,
    dirs: DirStack,
    dir_times: DirTimes,
    /// Xattr names already reported as skipped in this layer.
    skipped_xattrs: BTreeSet<Vec<u8>>,
    buf: Vec<u8>,
    stats: UnpackStats,
    /// The most the layer may write (0: no limit), and what it has used of it.
    max_bytes: u64,
    charged: u64,
}

impl<'t> Unpacker<'t> {
    fn new(dest: &Path, tape: Option<&'t RefCell<tape::Recorder>>) -> Result<Self, UnpackError> {
        let root = rfs::open(
            dest,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| UnpackError::Destination {
            path: dest.to_owned(),
            source: e.into(),
        })?;
        Ok(Self {
            dest: dest.to_owned(),
            tape,
            dirs: DirStack {
                root,
                stack: Vec::new(),
            },
            dir_times: DirTimes::new(),
            skipped_xattrs: BTreeSet::new(),
            buf: vec![0; COPY_BUFFER],
            stats: UnpackStats::default(),
            max_bytes: 0,
            charged: 0,
        })
    }

    /// Applies one entry; `Ok(false)` if it was skipped.
    fn apply<R: Read>(
        &mut self,
        mut entry: tar::Entry<'_, R>,
        source_failed: &AtomicBool,
    ) -> Result<bool, UnpackError> {
        let kind = entry.header().entry_type();
        let raw = entry.path_bytes().into_owned();
        if kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
        {
            debug!(entry = %lossy(&raw), ?kind, "skipping archive metadata entry");
            return Ok(false);
        }
        self.charge(&raw, ENTRY_CHARGE)?;
        let components = split_path(&raw).map_err(|problem| match problem {
            PathProblem::Escape(reason) => escape(&raw, reason),
            PathProblem::Invalid(reason) => invalid(&raw, reason),
        })?;
        let meta = read_meta(&mut entry, &raw)?;
        let Some((&name, parent)) = components.split_last() else {
            return self.root_entry(kind, &raw, &meta).map(|()| true);
        };
        let target = Target {
            raw: &raw,
            components: &components,
            parent,
            name,
        };

        let base = name.as_bytes();
        if parent
            .iter()
            .any(|c| c.as_bytes().starts_with(WHITEOUT_META_PREFIX))
            || (base.starts_with(WHITEOUT_META_PREFIX) && base != WHITEOUT_OPAQUE)
        {
            debug!(entry = %lossy(&raw), "skipping whiteout bookkeeping entry");
            return Ok(false);
        }
        if base == WHITEOUT_OPAQUE {
            self.opaque(&target)?;
            return Ok(true);
        }
        if let Some(hidden) = base.strip_prefix(WHITEOUT_PREFIX) {
            self.whiteout(&target, hidden, &meta)?;
            return Ok(true);
        }

        if kind.is_dir() || (kind.is_file() && raw.ends_with(b"/")) {
            self.directory(&target, &meta)?;
        } else if kind.is_file() || kind.is_contiguous() || kind.is_gnu_sparse() {
            self.regular(&target, &mut entry, &meta, source_failed)?;
        } else if kind.is_symlink() {
            let link = entry.link_name_bytes().map(|l| l.into_owned());
            match link {
                Some(link) if !link.is_empty() => self.symlink(&target, &link, &meta)?,
                _ => return Err(invalid(&raw, "symlink without a target")),
            }
        } else if kind.is_hard_link() {
            let link = entry.link_name_bytes().map(|l| l.into_owned());
            match link {
                Some(link) => self.hard_link(&target, &link)?,
                None => return Err(invalid(&raw, "hard link without a target")),
            }
        } else if kind.is_character_special() || kind.is_block_special() || kind.is_fifo() {
            let (file_type, dev) = if kind.is_fifo() {
                (FileType::Fifo, 0)
            } else {
                let header = entry.header();
                let major = header
                    .device_major()
                    .map_err(|e| corrupt_field(&raw, "device major", e))?;
                let minor = header
                    .device_minor()
                    .map_err(|e| corrupt_field(&raw, "device minor", e))?;
                let (Some(major), Some(minor)) = (major, minor) else {
                    return Err(invalid(&raw, "device entry without device numbers"));
                };
                let file_type = if kind.is_character_special() {
                    FileType::CharacterDevice
                } else {
                    FileType::BlockDevice
                };
                (file_type, rfs::makedev(major, minor))
            };
            self.node(&target, file_type, dev, &meta)?;
        } else {
            let flag = entry.header().as_old().linkflag[0];
            return Err(invalid(
                &raw,
                format!("unsupported entry type {:?}", char::from(flag)),
            ));
        }
        Ok(true)
    }

    /// Counts `bytes` against the layer's limit, refusing the entry that would cross it.
    fn charge(&mut self, raw: &[u8], bytes: u64) -> Result<(), UnpackError> {
        self.charged = self.charged.saturating_add(bytes);
        if self.max_bytes > 0 && self.charged > self.max_bytes {
            return Err(UnpackError::TooLarge {
                entry: lossy(raw),
                limit: self.max_bytes,
            });
        }
        Ok(())
    }

    fn root_entry(
        &mut self,
        kind: tar::EntryType,
        raw: &[u8],
        meta: &Meta,
    ) -> Result<(), UnpackError> {
        if !(kind.is_dir() || (kind.is_file() && raw.ends_with(b"/"))) {
            return Err(invalid(raw, "a non-directory entry names the layer root"));
        }
        self.dirs.stack.clear();
        apply_fd_meta(self.dirs.root.as_fd(), meta, raw, &mut self.skipped_xattrs)?;
        self.dir_times.insert(Vec::new(), meta.times.clone());
        Ok(())
    }

    fn directory(&mut self, t: &Target<'_>, meta: &Meta) -> Result<(), UnpackError> {
        let fd = {
            let parent = self.dirs.resolve(t.parent, t.raw)?;
            match rfs::mkdirat(parent, t.name, Mode::from_raw_mode(0o700)) {
                Ok(()) => {}
                Err(Errno::EXIST) => {
                    let stat = rfs::statat(parent, t.name, AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| io_error(t.raw, "stat the existing entry", e))?;
                    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
                        clear_path(parent, t.name, t.components, &mut self.dir_times)
                            .map_err(|e| io_error(t.raw, "remove the existing entry", e))?;
                        rfs::mkdirat(parent, t.name, Mode::from_raw_mode(0o700))
                            .map_err(|e| io_error(t.raw, "create directory", e))?;
                    }
                }
                Err(e) => return Err(io_error(t.raw, "create directory", e)),
            }
            rfs::openat(parent, t.name, dir_flags(), Mode::empty())
                .map_err(|e| io_error(t.raw, "open directory", e))?
        };
        apply_fd_meta(fd.as_fd(), meta, t.raw, &mut self.skipped_xattrs)?;
        // The stack is exactly the parent chain now; children usually follow.
        self.dirs.push(t.name, fd);
        self.dir_times
            .insert(path_key(t.components), meta.times.clone());
        Ok(())
    }

    fn regular<R: Read>(
        &mut self,
        t: &Target<'_>,
        entry: &mut tar::Entry<'_, R>,
        meta: &Meta,
        source_failed: &AtomicBool,
    ) -> Result<(), UnpackError> {
        // Sparse files count at their full size: the holes are written out.
        let expected = entry.size();
        self.charge(t.raw, expected)?;
        let parent = self.dirs.resolve(t.parent, t.raw)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = create_replacing(
            parent,
            t.name,
            t.components,
            &mut self.dir_times,
            t.raw,
            "create file",
            || rfs::openat(parent, t.name, flags, Mode::from_raw_mode(0o600)),
        )?;
        let mut file = File::from(fd);
        if let Some(tape) = self.tape
            && !entry.header().entry_type().is_gnu_sparse()
        {
            tape.borrow_mut()
                .file(&path_key(t.components), entry.raw_file_position(), expected);
        }
        let written = copy_content(entry, &mut file, &mut self.buf).map_err(|e| match e {
            CopyError::Read(e) => stream_error(
                source_failed,
                format!("entry {}: reading its content", lossy(t.raw)),
                e,
            ),
            CopyError::Write(e) => io_error(t.raw, "write file", e),
        })?;
        if written != expected {
            return Err(UnpackError::Corrupt {
                context: format!("entry {}: reading its content", lossy(t.raw)),
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("expected {expected} bytes, the stream ended after {written}"),
                ),
            });
        }
        apply_fd_meta(file.as_fd(), meta, t.raw, &mut self.skipped_xattrs)?;
        rfs::futimens(&file, &meta.times).map_err(|e| io_error(t.raw, "set times", e))?;
        self.stats.bytes += written;
        Ok(())
    }

    fn symlink(&mut self, t: &Target<'_>, link: &[u8], meta: &Meta) -> Result<(), UnpackError> {
        let parent = self.dirs.resolve(t.parent, t.raw)?;
        let link = OsStr::from_bytes(link);
        create_replacing(
            parent,
            t.name,
            t.components,
            &mut self.dir_times,
            t.raw,
            "create symlink",
            || rfs::symlinkat(link, parent, t.name),
        )?;
        rfs::chownat(
            parent,
            t.name,
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_error(t.raw, "chown", e))?;
        if !meta.xattrs.is_empty() {
            let path = full_path(&self.dest, t.components);
            set_xattrs(
                XattrTarget::Path(&path),
                &meta.xattrs,
                t.raw,
                &mut self.skipped_xattrs,
            )?;
        }
        rfs::utimensat(parent, t.name, &meta.times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_error(t.raw, "set times", e))
    }

    fn node(
        &mut self,
        t: &Target<'_>,
        file_type: FileType,
        dev: rfs::Dev,
        meta: &Meta,
    ) -> Result<(), UnpackError> {
        let parent = self.dirs.resolve(t.parent, t.raw)?;
        create_replacing(
            parent,
            t.name,
            t.components,
            &mut self.dir_times,
            t.raw,
            "create device node",
            || rfs::mknodat(parent, t.name, file_type, Mode::from_raw_mode(0o600), dev),
        )?;
        rfs::chownat(
            parent,
            t.name,
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_error(t.raw, "chown", e))?;
        // fchmodat cannot refuse symlinks, but this name is the node mknodat just created.
        rfs::chmodat(parent, t.name, meta.mode, AtFlags::empty())
            .map_err(|e| io_error(t.raw, "chmod", e))?;
        if !meta.xattrs.is_empty() {
            let path = full_path(&self.dest, t.components);
            set_xattrs(
                XattrTarget::Path(&path),
                &meta.xattrs,
                t.raw,
                &mut self.skipped_xattrs,
            )?;
        }
        rfs::utimensat(parent, t.name, &meta.times, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| io_error(t.raw, "set times", e))
    }

    fn hard_link(&mut self, t: &Target<'_>, link: &[u8]) -> Result<(), UnpackError> {
        let link_components = split_path(link).map_err(|problem| match problem {
            PathProblem::Escape(reason) => {
                escape(t.raw, format!("hard link target {}: {reason}", lossy(link)))
            }
            PathProblem::Invalid(reason) => {
                invalid(t.raw, format!("hard link target {}: {reason}", lossy(link)))
            }
        })?;
        let Some((&link_name, link_parent)) = link_components.split_last() else {
            return Err(invalid(t.raw, "hard link to the layer root"));
        };
        if link_components.as_slice() == t.components {
            debug!(entry = %lossy(t.raw), "skipping hard link to itself");
            return Ok(());
        }
        let missing = || {
            invalid(
                t.raw,
                format!(
                    "hard link target {} does not exist in this layer",
                    lossy(link)
                ),
            )
        };
        let link_dir = self
            .dirs
            .open_existing(link_parent, t.raw)
            .map_err(|e| match e {
                UnpackError::Escape { entry, reason } => UnpackError::Escape {
                    entry,
                    reason: format!("hard link target {}: {reason}", lossy(link)),
                },
                other => other,
            })?
            .ok_or_else(missing)?;
        match rfs::statat(&link_dir, link_name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
                return Err(invalid(t.raw, "hard link to a directory"));
            }
            Ok(_) => {}
            Err(Errno::NOENT) => return Err(missing()),
            Err(e) => return Err(io_error(t.raw, "stat hard link target", e)),
        }
        let parent = self.dirs.resolve(t.parent, t.raw)?;
        create_replacing(
            parent,
            t.name,
            t.components,
            &mut self.dir_times,
            t.raw,
            "create hard link",
            || rfs::linkat(&link_dir, link_name, parent, t.name, AtFlags::empty()),
        )
    }

    fn whiteout(&mut self, t: &Target<'_>, hidden: &[u8], meta: &Meta) -> Result<(), UnpackError> {
        match hidden {
            b"" => return Err(invalid(t.raw, "whiteout without a name")),
            b"." => return Err(invalid(t.raw, "whiteout of `.`")),
            b".." => return Err(escape(t.raw, "whiteout of `..`")),
            _ => {}
        }
        let hidden = OsStr::from_bytes(hidden);
        let mut components = t.parent.to_vec();
        components.push(hidden);
        let parent = self.dirs.resolve(t.parent, t.raw)?;
        create_replacing(
            parent,
            hidden,
            &components,
            &mut self.dir_times,
            t.raw,
            "create whiteout",
            || {
                rfs::mknodat(
                    parent,
                    hidden,
                    FileType::CharacterDevice,
                    Mode::empty(),
                    rfs::makedev(0, 0),
                )
            },
        )?;
        rfs::chownat(
            parent,
            hidden,
            Some(meta.uid),
            Some(meta.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io_error(t.raw, "chown whiteout", e))
    }

    fn opaque(&mut self, t: &Target<'_>) -> Result<(), UnpackError> {
        let dir = self.dirs.resolve(t.parent, t.raw)?;
        rfs::fsetxattr(dir, OPAQUE_XATTR, b"y", XattrFlags::empty())
            .map_err(|e| io_error(t.raw, format!("set {OPAQUE_XATTR}"), e))
    }

    /// Applies the recorded directory times, now that nothing more is written below them.
    fn finish(&mut self) -> Result<(), UnpackError> {
        let dir_times = std::mem::take(&mut self.dir_times);
        for (key, times) in &dir_times {
            let components: Vec<&OsStr> = if key.is_empty() {
                Vec::new()
            } else {
                key.split(|&b| b == b'/').map(OsStr::from_bytes).collect()
            };
            let Some((&name, parent)) = components.split_last() else {
                rfs::futimens(&self.dirs.root, times)
                    .map_err(|e| io_error(b".", "set directory times", e))?;
                continue;
            };
            let Some(parent) = self.dirs.resolve_existing(parent, key)? else {
                continue;
            };
            match rfs::utimensat(parent, name, times, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(io_error(key, "set directory times", e)),
            }
        }
        Ok(())
    }
}

fn full_path(dest: &Path, components: &[&OsStr]) -> PathBuf {
    let mut path = dest.to_owned();
    path.extend(components);
    path
}

pub mod tape;
pub use tape::{TapeError, TapeReader};

#[cfg(test)]
mod tests;
