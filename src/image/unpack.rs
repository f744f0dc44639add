//! OCI layer unpacker: streams a plain, gzip or zstd layer tarball into its own overlayfs layer directory.

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
    unpack(reader, compression, dest, None)
}

/// Like [`unpack_layer`], and also returns the layer's diff ID (`sha256:<hex>` of the
/// uncompressed tar stream) for comparison with the image config's `rootfs.diff_ids`.
pub fn unpack_layer_with_diff_id<R: Read>(
    reader: R,
    compression: Compression,
    dest: &Path,
) -> Result<(UnpackStats, String), UnpackError> {
    let mut hasher = Sha256::new();
    let stats = unpack(reader, compression, dest, Some(&mut hasher))?;
    Ok((stats, format!("sha256:{}", hex::encode(hasher.finalize()))))
}

fn unpack<R: Read>(
    reader: R,
    compression: Compression,
    dest: &Path,
    hasher: Option<&mut Sha256>,
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
        Compression::None => pipeline(source, dest, hasher, &source_failed),
        Compression::Gzip => pipeline(
            flate2::bufread::MultiGzDecoder::new(source),
            dest,
            hasher,
            &source_failed,
        ),
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(source).map_err(|source| {
                UnpackError::Read {
                    context: "creating the zstd decoder".to_owned(),
                    source,
                }
            })?;
            pipeline(decoder, dest, hasher, &source_failed)
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
                unpack_tar(chunks, dest, source_failed)
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
                unpack_tar(stream, dest, source_failed)
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
    source_failed: &AtomicBool,
) -> Result<UnpackStats, UnpackError> {
    let mut unpacker = Unpacker::new(dest)?;
    let mut archive = tar::Archive::new(stream);
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

struct Unpacker {
    dest: PathBuf,
    dirs: DirStack,
    dir_times: DirTimes,
    /// Xattr names already reported as skipped in this layer.
    skipped_xattrs: BTreeSet<Vec<u8>>,
    buf: Vec<u8>,
    stats: UnpackStats,
}

impl Unpacker {
    fn new(dest: &Path) -> Result<Self, UnpackError> {
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
            dirs: DirStack {
                root,
                stack: Vec::new(),
            },
            dir_times: DirTimes::new(),
            skipped_xattrs: BTreeSet::new(),
            buf: vec![0; COPY_BUFFER],
            stats: UnpackStats::default(),
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
        let expected = entry.size();
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::sync::atomic::{AtomicU64, Ordering};
    use tar::{Builder, EntryType, Header};

    const MTIME: u64 = 1_600_000_000;

    fn unique(tag: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!(
            "berth-unpack-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// `/tmp/berth-unpack-<tag>-<pid>-<n>/layer` is the destination; the directory around it
    /// catches (and lets tests detect) anything that would escape one level up.
    struct TestDir {
        root: PathBuf,
    }

    impl TestDir {
        fn new(tag: &str) -> Self {
            let root = Path::new("/tmp").join(unique(tag));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(root.join("layer")).unwrap();
            Self { root }
        }

        fn layer(&self) -> PathBuf {
            self.root.join("layer")
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.layer().join(rel)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn header(kind: EntryType, mode: u32, size: u64) -> Header {
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(size);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(MTIME);
        header
    }

    fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
        let body = key.len() + value.len() + 3;
        let mut len = body + 1;
        while len != body + len.to_string().len() {
            len = body + len.to_string().len();
        }
        let mut record = format!("{len} {key}=").into_bytes();
        record.extend_from_slice(value);
        record.push(b'\n');
        record
    }

    struct Layer(Builder<Vec<u8>>);

    impl Layer {
        fn new() -> Self {
            Layer(Builder::new(Vec::new()))
        }

        fn file(self, path: &str, data: &[u8]) -> Self {
            self.file_with(path, data, 0o644, 0, 0)
        }

        fn file_with(mut self, path: &str, data: &[u8], mode: u32, uid: u64, gid: u64) -> Self {
            let mut header = header(EntryType::Regular, mode, data.len() as u64);
            header.set_uid(uid);
            header.set_gid(gid);
            self.0.append_data(&mut header, path, data).unwrap();
            self
        }

        fn dir(mut self, path: &str, mode: u32) -> Self {
            let mut header = header(EntryType::Directory, mode, 0);
            self.0.append_data(&mut header, path, io::empty()).unwrap();
            self
        }

        fn link(mut self, kind: EntryType, path: &str, target: &str, uid: u64) -> Self {
            let mut header = header(kind, 0o777, 0);
            header.set_uid(uid);
            if target.len() <= 100 {
                header.set_link_name_literal(target).unwrap();
                self.0.append_data(&mut header, path, io::empty()).unwrap();
            } else {
                self.0.append_link(&mut header, path, target).unwrap();
            }
            self
        }

        fn symlink(self, path: &str, target: &str) -> Self {
            self.link(EntryType::Symlink, path, target, 0)
        }

        fn hardlink(self, path: &str, target: &str) -> Self {
            self.link(EntryType::Link, path, target, 0)
        }

        fn device(
            mut self,
            kind: EntryType,
            path: &str,
            mode: u32,
            major: u32,
            minor: u32,
        ) -> Self {
            let mut header = header(kind, mode, 0);
            header.set_device_major(major).unwrap();
            header.set_device_minor(minor).unwrap();
            self.0.append_data(&mut header, path, io::empty()).unwrap();
            self
        }

        fn pax(mut self, records: &[(&str, &[u8])]) -> Self {
            let data: Vec<u8> = records
                .iter()
                .flat_map(|(key, value)| pax_record(key, value))
                .collect();
            let mut header = header(EntryType::XHeader, 0o644, data.len() as u64);
            self.0
                .append_data(&mut header, "PaxHeaders/entry", data.as_slice())
                .unwrap();
            self
        }

        /// A header written byte for byte, bypassing the builder's path checks.
        fn raw(mut self, name: &[u8], kind: EntryType, data: &[u8], link: &[u8]) -> Self {
            let mut header = header(kind, 0o644, data.len() as u64);
            let old = header.as_old_mut();
            old.name = [0; 100];
            old.name[..name.len()].copy_from_slice(name);
            old.linkname = [0; 100];
            old.linkname[..link.len()].copy_from_slice(link);
            header.set_cksum();
            self.0.append(&header, data).unwrap();
            self
        }

        fn finish(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn zstd_compress(data: &[u8]) -> Vec<u8> {
        zstd::encode_all(data, 3).unwrap()
    }

    fn unpack_tar_bytes(tar: &[u8], dest: &Path) -> Result<UnpackStats, UnpackError> {
        unpack_layer(tar, Compression::None, dest)
    }

    fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let n = rfs::lgetxattr(path, name, &mut buf[..]).ok()?;
        buf.truncate(n);
        Some(buf)
    }

    fn assert_escape(result: Result<UnpackStats, UnpackError>, entry: &str, reason: &str) {
        match result {
            Err(UnpackError::Escape {
                entry: got_entry,
                reason: got_reason,
            }) => {
                assert_eq!(got_entry, entry);
                assert!(
                    got_reason.contains(reason),
                    "{got_reason:?} lacks {reason:?}"
                );
            }
            other => panic!("expected an Escape error, got {other:?}"),
        }
    }

    #[test]
    fn regular_file_content_mode_owner_mtime() {
        let dir = TestDir::new("file");
        let tar = Layer::new()
            .file_with("etc/app.conf", b"hello world", 0o640, 1000, 1001)
            .finish();
        let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(
            stats,
            UnpackStats {
                entries: 1,
                bytes: 11
            }
        );
        let path = dir.path("etc/app.conf");
        assert_eq!(fs::read(&path).unwrap(), b"hello world");
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.mode() & 0o7777, 0o640);
        assert_eq!((meta.uid(), meta.gid()), (1000, 1001));
        assert_eq!(meta.mtime(), MTIME as i64);
        // The parent was not listed: created 0755 root:root.
        let parent = fs::symlink_metadata(dir.path("etc")).unwrap();
        assert_eq!(parent.mode() & 0o7777, 0o755);
        assert_eq!((parent.uid(), parent.gid()), (0, 0));
    }

    #[test]
    fn directory_mode_0700_and_mtime_set_after_children() {
        let dir = TestDir::new("dir");
        let tar = Layer::new()
            .dir("secret/", 0o700)
            .file("secret/key", b"k")
            .dir("secret/sub/", 0o750)
            .file("secret/sub/deeper", b"d")
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        for (rel, mode) in [("secret", 0o700), ("secret/sub", 0o750)] {
            let meta = fs::symlink_metadata(dir.path(rel)).unwrap();
            assert!(meta.is_dir());
            assert_eq!(meta.mode() & 0o7777, mode, "{rel}");
            assert_eq!(meta.mtime(), MTIME as i64, "{rel}");
        }
    }

    #[test]
    fn setuid_setgid_sticky_preserved() {
        let dir = TestDir::new("suid");
        let tar = Layer::new()
            .file_with("bin/su", b"x", 0o4755, 0, 0)
            .file_with("bin/tool", b"y", 0o6750, 1000, 1000)
            .dir("tmp/", 0o1777)
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        let mode = |rel: &str| fs::symlink_metadata(dir.path(rel)).unwrap().mode() & 0o7777;
        assert_eq!(mode("bin/su"), 0o4755);
        // Owned by a non-root user: chown would have cleared the bits had chmod come first.
        assert_eq!(mode("bin/tool"), 0o6750);
        assert_eq!(mode("tmp"), 0o1777);
    }

    #[test]
    fn symlinks_relative_and_absolute_created_verbatim() {
        let dir = TestDir::new("symlink");
        let tar = Layer::new()
            .file("bin/busybox", b"bb")
            .symlink("bin/sh", "busybox")
            .symlink("bin/ls", "/bin/busybox")
            .symlink("up", "../../..")
            .link(EntryType::Symlink, "owned", "/nowhere", 1000)
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        for (rel, target) in [
            ("bin/sh", "busybox"),
            ("bin/ls", "/bin/busybox"),
            ("up", "../../.."),
            ("owned", "/nowhere"),
        ] {
            let meta = fs::symlink_metadata(dir.path(rel)).unwrap();
            assert!(meta.file_type().is_symlink(), "{rel}");
            assert_eq!(fs::read_link(dir.path(rel)).unwrap(), Path::new(target));
            assert_eq!(meta.mtime(), MTIME as i64, "{rel}");
        }
        assert_eq!(fs::symlink_metadata(dir.path("owned")).unwrap().uid(), 1000);
    }

    #[test]
    fn hard_links_share_the_inode() {
        let dir = TestDir::new("hardlink");
        let tar = Layer::new()
            .file("usr/bin/python3.11", b"interpreter")
            .hardlink("usr/bin/python3", "usr/bin/python3.11")
            .hardlink("other/py", "/usr/bin/python3.11")
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        let a = fs::symlink_metadata(dir.path("usr/bin/python3.11")).unwrap();
        let b = fs::symlink_metadata(dir.path("usr/bin/python3")).unwrap();
        let c = fs::symlink_metadata(dir.path("other/py")).unwrap();
        assert_eq!(a.ino(), b.ino());
        assert_eq!(a.ino(), c.ino());
        assert_eq!(a.nlink(), 3);
    }

    #[test]
    fn hard_link_to_a_missing_target_is_invalid() {
        let dir = TestDir::new("hardlink-missing");
        let tar = Layer::new().hardlink("b", "not/here").finish();
        match unpack_tar_bytes(&tar, &dir.layer()) {
            Err(UnpackError::Invalid { entry, reason }) => {
                assert_eq!(entry, "b");
                assert!(reason.contains("does not exist"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn char_device_and_fifo() {
        let dir = TestDir::new("nodes");
        let tar = Layer::new()
            .device(EntryType::Char, "dev/null", 0o666, 1, 3)
            .device(EntryType::Block, "dev/loop0", 0o660, 7, 0)
            .device(EntryType::Fifo, "run/fifo", 0o600, 0, 0)
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        let null = fs::symlink_metadata(dir.path("dev/null")).unwrap();
        assert!(null.file_type().is_char_device());
        assert_eq!((rfs::major(null.rdev()), rfs::minor(null.rdev())), (1, 3));
        assert_eq!(null.mode() & 0o7777, 0o666);
        let lp = fs::symlink_metadata(dir.path("dev/loop0")).unwrap();
        assert!(lp.file_type().is_block_device());
        assert_eq!((rfs::major(lp.rdev()), rfs::minor(lp.rdev())), (7, 0));
        let fifo = fs::symlink_metadata(dir.path("run/fifo")).unwrap();
        assert!(fifo.file_type().is_fifo());
        assert_eq!(fifo.mode() & 0o7777, 0o600);
        assert_eq!(fifo.mtime(), MTIME as i64);
    }

    #[test]
    fn xattrs_from_pax_records() {
        let dir = TestDir::new("xattr");
        let tar = Layer::new()
            .pax(&[
                ("SCHILY.xattr.user.berth", b"hello"),
                ("SCHILY.xattr.trusted.overlay.redirect", b"/elsewhere"),
            ])
            .file("f", b"data")
            .pax(&[("SCHILY.xattr.user.dir", b"d")])
            .dir("d/", 0o755)
            .pax(&[("SCHILY.xattr.user.link", b"l")])
            .symlink("l", "f")
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(
            xattr(&dir.path("f"), "user.berth").as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(
            xattr(&dir.path("d"), "user.dir").as_deref(),
            Some(&b"d"[..])
        );
        // overlayfs-private xattrs are never taken from a layer.
        assert_eq!(xattr(&dir.path("f"), "trusted.overlay.redirect"), None);
        // user.* is not allowed on symlinks: skipped with a warning, the link is still made.
        assert!(
            fs::symlink_metadata(dir.path("l"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn pax_subsecond_mtime() {
        let dir = TestDir::new("pax-mtime");
        let tar = Layer::new()
            .pax(&[("mtime", b"1600000000.25")])
            .file("f", b"x")
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        let meta = fs::symlink_metadata(dir.path("f")).unwrap();
        assert_eq!(
            (meta.mtime(), meta.mtime_nsec()),
            (1_600_000_000, 250_000_000)
        );
    }

    #[test]
    fn parse_pax_times() {
        let t = |s: &str| parse_pax_time(s.as_bytes()).map(|t| (t.tv_sec, t.tv_nsec));
        assert_eq!(t("10"), Some((10, 0)));
        assert_eq!(t("1.5"), Some((1, 500_000_000)));
        assert_eq!(t("-1.5"), Some((-2, 500_000_000)));
        assert_eq!(t("-3"), Some((-3, 0)));
        assert_eq!(t("0.1234567891"), Some((0, 123_456_789)));
        assert_eq!(t(""), None);
        assert_eq!(t("1e9"), None);
    }

    #[test]
    fn whiteouts_become_char_0_0() {
        let dir = TestDir::new("whiteout");
        let tar = Layer::new()
            .file("etc/.wh.passwd", b"")
            .file(".wh.gone", b"")
            .finish();
        let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(stats.entries, 2);
        for rel in ["etc/passwd", "gone"] {
            let meta = fs::symlink_metadata(dir.path(rel)).unwrap();
            assert!(meta.file_type().is_char_device(), "{rel}");
            assert_eq!(meta.rdev(), 0, "{rel}");
        }
        assert!(fs::symlink_metadata(dir.path("etc/.wh.passwd")).is_err());
        assert!(fs::symlink_metadata(dir.path(".wh.gone")).is_err());
    }

    #[test]
    fn opaque_marker_before_and_after_its_directory() {
        let dir = TestDir::new("opaque");
        let tar = Layer::new()
            .file("before/.wh..wh..opq", b"")
            .dir("before/", 0o750)
            .dir("after/", 0o755)
            .file("after/.wh..wh..opq", b"")
            .file("implicit/deep/.wh..wh..opq", b"")
            .file(".wh..wh.plnk/12.34", b"aufs")
            .file(".wh..wh.aufs", b"")
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        for rel in ["before", "after", "implicit/deep"] {
            assert_eq!(
                xattr(&dir.path(rel), OPAQUE_XATTR).as_deref(),
                Some(&b"y"[..]),
                "{rel}"
            );
            assert!(fs::symlink_metadata(dir.path(rel).join(".wh..wh..opq")).is_err());
        }
        assert_eq!(
            fs::symlink_metadata(dir.path("before")).unwrap().mode() & 0o7777,
            0o750
        );
        assert!(fs::symlink_metadata(dir.path(".wh..wh.plnk")).is_err());
        assert!(fs::symlink_metadata(dir.path(".wh..wh.aufs")).is_err());
    }

    #[test]
    fn same_path_twice_later_wins() {
        let dir = TestDir::new("twice");
        let tar = Layer::new()
            .file("x", b"one")
            .file("x", b"two")
            .file("y", b"file")
            .dir("y/", 0o700)
            .dir("z/", 0o755)
            .file("z/child", b"c")
            .file("z", b"now a file")
            .symlink("s", "/tmp")
            .file("s", b"regular")
            .dir("m/", 0o700)
            .file("m/kept", b"k")
            .dir("m/", 0o751)
            .file("w", b"w")
            .file(".wh.w", b"")
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(fs::read(dir.path("x")).unwrap(), b"two");
        assert!(fs::symlink_metadata(dir.path("y")).unwrap().is_dir());
        assert_eq!(fs::read(dir.path("z")).unwrap(), b"now a file");
        let s = fs::symlink_metadata(dir.path("s")).unwrap();
        assert!(s.file_type().is_file());
        assert_eq!(fs::read(dir.path("s")).unwrap(), b"regular");
        assert_eq!(fs::read(dir.path("m/kept")).unwrap(), b"k");
        assert_eq!(
            fs::symlink_metadata(dir.path("m")).unwrap().mode() & 0o7777,
            0o751
        );
        assert!(
            fs::symlink_metadata(dir.path("w"))
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }

    #[test]
    fn plain_gzip_and_zstd() {
        let tar = Layer::new()
            .dir("app/", 0o755)
            .file("app/data", &vec![7u8; 300_000])
            .finish();
        for (compression, blob) in [
            (Compression::None, tar.clone()),
            (Compression::Gzip, gzip(&tar)),
            (Compression::Zstd, zstd_compress(&tar)),
        ] {
            let dir = TestDir::new("formats");
            let stats = unpack_layer(blob.as_slice(), compression, &dir.layer()).unwrap();
            assert_eq!(
                stats,
                UnpackStats {
                    entries: 2,
                    bytes: 300_000
                }
            );
            assert_eq!(fs::read(dir.path("app/data")).unwrap(), vec![7u8; 300_000]);
        }
    }

    #[test]
    fn concatenated_gzip_members() {
        let tar = Layer::new().file("a", b"a").finish();
        let (head, tail) = tar.split_at(700);
        let mut blob = gzip(head);
        blob.extend(gzip(tail));
        let dir = TestDir::new("multigz");
        unpack_layer(blob.as_slice(), Compression::Gzip, &dir.layer()).unwrap();
        assert_eq!(fs::read(dir.path("a")).unwrap(), b"a");
    }

    #[test]
    fn media_types() {
        let cases = [
            (
                "application/vnd.oci.image.layer.v1.tar",
                Some(Compression::None),
            ),
            (
                "application/vnd.oci.image.layer.v1.tar+gzip",
                Some(Compression::Gzip),
            ),
            (
                "application/vnd.oci.image.layer.v1.tar+zstd",
                Some(Compression::Zstd),
            ),
            (
                "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
                Some(Compression::Gzip),
            ),
            (
                "application/vnd.docker.image.rootfs.diff.tar.gzip",
                Some(Compression::Gzip),
            ),
            (
                "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
                Some(Compression::Gzip),
            ),
            (
                "Application/VND.oci.image.layer.v1.tar+gzip; x=y",
                Some(Compression::Gzip),
            ),
            ("application/vnd.oci.image.config.v1+json", None),
            ("application/vnd.oci.image.layer.v1.tar+encrypted", None),
        ];
        for (media_type, expected) in cases {
            assert_eq!(
                Compression::from_media_type(media_type),
                expected,
                "{media_type}"
            );
        }
    }

    #[test]
    fn long_names_and_long_link_targets() {
        let dir = TestDir::new("long");
        let long_dir = format!("{}/{}", "d".repeat(80), "e".repeat(80));
        let long_file = format!("{long_dir}/{}", "f".repeat(120));
        let long_target = format!("/{}", "t".repeat(150));
        let pax_path = format!("{}/pax-{}", "p".repeat(90), "q".repeat(60));
        let tar = Layer::new()
            .file(&long_file, b"gnu long name")
            .symlink("long-link", &long_target)
            .hardlink("long-hard", &long_file)
            .pax(&[("path", pax_path.as_bytes())])
            .file("short-placeholder", b"pax path")
            .pax(&[("linkpath", long_target.as_bytes())])
            .symlink("pax-link", "short")
            .finish();
        unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(fs::read(dir.path(&long_file)).unwrap(), b"gnu long name");
        assert_eq!(
            fs::read_link(dir.path("long-link")).unwrap(),
            Path::new(&long_target)
        );
        assert_eq!(
            fs::symlink_metadata(dir.path("long-hard")).unwrap().ino(),
            fs::symlink_metadata(dir.path(&long_file)).unwrap().ino()
        );
        assert_eq!(fs::read(dir.path(&pax_path)).unwrap(), b"pax path");
        assert!(fs::symlink_metadata(dir.path("short-placeholder")).is_err());
        assert_eq!(
            fs::read_link(dir.path("pax-link")).unwrap(),
            Path::new(&long_target)
        );
    }

    #[test]
    fn root_entry_sets_layer_root_metadata() {
        let dir = TestDir::new("root");
        let tar = Layer::new().dir("./", 0o751).file("./a", b"a").finish();
        let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(stats.entries, 2);
        let meta = fs::symlink_metadata(dir.layer()).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o751);
        assert_eq!(meta.mtime(), MTIME as i64);
        assert_eq!(fs::read(dir.path("a")).unwrap(), b"a");
    }

    #[test]
    fn pax_global_headers_are_skipped() {
        let dir = TestDir::new("global");
        let mut layer = Layer::new();
        let data = pax_record("comment", b"built by test");
        let mut header = header(EntryType::XGlobalHeader, 0o644, data.len() as u64);
        layer
            .0
            .append_data(&mut header, "pax_global_header", data.as_slice())
            .unwrap();
        let tar = layer.file("a", b"a").finish();
        let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(stats.entries, 1);
        assert!(fs::symlink_metadata(dir.path("pax_global_header")).is_err());
    }

    #[test]
    fn dotdot_paths_are_refused() {
        for name in [
            &b"../escape"[..],
            b"a/../../escape",
            b"/../escape",
            b"./../escape",
            b"a/../b",
        ] {
            let dir = TestDir::new("dotdot");
            let tar = Layer::new()
                .raw(name, EntryType::Regular, b"pwned", b"")
                .finish();
            let entry = String::from_utf8_lossy(name);
            assert_escape(unpack_tar_bytes(&tar, &dir.layer()), &entry, "`..`");
            assert!(!dir.root.join("escape").exists());
            assert!(!dir.path("b").exists());
            assert!(!Path::new("/escape").exists());
        }
    }

    #[test]
    fn hard_link_out_of_the_layer_is_refused() {
        let dir = TestDir::new("hardlink-escape");
        let tar = Layer::new()
            .raw(b"passwd", EntryType::Link, b"", b"../../etc/passwd")
            .finish();
        assert_escape(unpack_tar_bytes(&tar, &dir.layer()), "passwd", "`..`");
        assert!(fs::symlink_metadata(dir.path("passwd")).is_err());

        let dir = TestDir::new("hardlink-escape-symlink");
        let tar = Layer::new()
            .symlink("etc", "/etc")
            .hardlink("passwd", "etc/passwd")
            .finish();
        assert_escape(
            unpack_tar_bytes(&tar, &dir.layer()),
            "passwd",
            "parent component etc is a symlink",
        );
        assert!(fs::symlink_metadata(dir.path("passwd")).is_err());
    }

    #[test]
    fn entry_below_an_absolute_symlink_is_refused() {
        let dir = TestDir::new("symlink-escape");
        let victim = unique("escape-victim");
        let tar = Layer::new()
            .symlink("evil", "/tmp")
            .file(&format!("evil/{victim}"), b"pwned")
            .finish();
        assert_escape(
            unpack_tar_bytes(&tar, &dir.layer()),
            &format!("evil/{victim}"),
            "parent component evil is a symlink",
        );
        assert!(!Path::new("/tmp").join(&victim).exists());
    }

    #[test]
    fn entry_below_a_relative_symlink_is_refused() {
        let dir = TestDir::new("symlink-escape-rel");
        let tar = Layer::new()
            .symlink("evil", "..")
            .file("evil/x", b"pwned")
            .finish();
        assert_escape(
            unpack_tar_bytes(&tar, &dir.layer()),
            "evil/x",
            "parent component evil is a symlink",
        );
        assert!(!dir.root.join("x").exists());
    }

    #[test]
    fn directory_replaced_by_symlink_then_child_is_refused() {
        let dir = TestDir::new("symlink-swap");
        let victim = unique("escape-victim");
        let tar = Layer::new()
            .dir("d/", 0o755)
            .file("d/ok", b"fine")
            .symlink("d", "/tmp")
            .file(&format!("d/{victim}"), b"pwned")
            .finish();
        assert_escape(
            unpack_tar_bytes(&tar, &dir.layer()),
            &format!("d/{victim}"),
            "parent component d is a symlink",
        );
        assert!(!Path::new("/tmp").join(&victim).exists());
    }

    #[test]
    fn whiteout_and_opaque_below_a_symlink_are_refused() {
        let outside = TestDir::new("outside");
        fs::write(outside.path("keep"), b"keep").unwrap();
        let target = outside.layer();
        let target = target.to_str().unwrap();

        let dir = TestDir::new("whiteout-escape");
        let tar = Layer::new()
            .symlink("evil", target)
            .file("evil/.wh.keep", b"")
            .finish();
        assert_escape(
            unpack_tar_bytes(&tar, &dir.layer()),
            "evil/.wh.keep",
            "parent component evil is a symlink",
        );
        assert_eq!(fs::read(outside.path("keep")).unwrap(), b"keep");

        let dir = TestDir::new("opaque-escape");
        let tar = Layer::new()
            .symlink("evil", target)
            .file("evil/.wh..wh..opq", b"")
            .finish();
        assert_escape(
            unpack_tar_bytes(&tar, &dir.layer()),
            "evil/.wh..wh..opq",
            "parent component evil is a symlink",
        );
        assert_eq!(xattr(&outside.layer(), OPAQUE_XATTR), None);

        let dir = TestDir::new("whiteout-dotdot");
        let tar = Layer::new()
            .raw(b"a/.wh...", EntryType::Regular, b"", b"")
            .finish();
        assert_escape(
            unpack_tar_bytes(&tar, &dir.layer()),
            "a/.wh...",
            "whiteout of `..`",
        );
    }

    #[test]
    fn non_directory_parent_is_invalid() {
        let dir = TestDir::new("file-parent");
        let tar = Layer::new().file("f", b"x").file("f/y", b"y").finish();
        match unpack_tar_bytes(&tar, &dir.layer()) {
            Err(UnpackError::Invalid { entry, .. }) => assert_eq!(entry, "f/y"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn truncated_or_damaged_gzip_fails_cleanly() {
        let tar = Layer::new()
            .file(
                "a",
                &(0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
            )
            .file("b", b"tail")
            .finish();
        let blob = gzip(&tar);
        let mut cuts = vec![
            0,
            5,
            10,
            100,
            blob.len() / 2,
            blob.len() - 8,
            blob.len() - 1,
        ];
        cuts.dedup();
        for cut in cuts {
            let dir = TestDir::new("truncated");
            match unpack_layer(&blob[..cut], Compression::Gzip, &dir.layer()) {
                Err(UnpackError::Corrupt { .. }) => {}
                other => panic!("cut at {cut}: expected Corrupt, got {other:?}"),
            }
        }
        let mut damaged = blob.clone();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0x55;
        let dir = TestDir::new("damaged");
        assert!(matches!(
            unpack_layer(damaged.as_slice(), Compression::Gzip, &dir.layer()),
            Err(UnpackError::Corrupt { .. })
        ));
        let dir = TestDir::new("garbage");
        assert!(matches!(
            unpack_layer(
                &b"this is not gzip at all"[..],
                Compression::Gzip,
                &dir.layer()
            ),
            Err(UnpackError::Corrupt { .. })
        ));
        let dir = TestDir::new("zstd-truncated");
        let blob = zstd_compress(&tar);
        assert!(matches!(
            unpack_layer(&blob[..blob.len() / 2], Compression::Zstd, &dir.layer()),
            Err(UnpackError::Corrupt { .. })
        ));
    }

    #[test]
    fn truncated_plain_tar_fails_cleanly() {
        let tar = Layer::new().file("big", &vec![1u8; 10_000]).finish();
        let dir = TestDir::new("truncated-tar");
        match unpack_tar_bytes(&tar[..2_000], &dir.layer()) {
            Err(UnpackError::Corrupt { context, .. }) => assert!(context.contains("big")),
            other => panic!("{other:?}"),
        }
        let dir = TestDir::new("truncated-header");
        assert!(matches!(
            unpack_tar_bytes(&tar[..300], &dir.layer()),
            Err(UnpackError::Corrupt { .. })
        ));
    }

    #[test]
    fn source_read_errors_are_read_errors() {
        struct Failing<'a>(&'a [u8]);
        impl Read for Failing<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "network down",
                    ));
                }
                let n = self.0.read(buf)?;
                Ok(n)
            }
        }
        let tar = Layer::new().file("a", &vec![3u8; 100_000]).finish();
        let blob = gzip(&tar);
        let dir = TestDir::new("read-error");
        match unpack_layer(
            Failing(&blob[..blob.len() / 2]),
            Compression::Gzip,
            &dir.layer(),
        ) {
            Err(UnpackError::Read { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::ConnectionReset)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn diff_id_is_the_sha256_of_the_uncompressed_tar() {
        let tar = Layer::new().file("a", b"content").dir("d/", 0o755).finish();
        let expected = format!("sha256:{}", hex::encode(Sha256::digest(&tar)));
        let dir = TestDir::new("diffid");
        let (stats, diff_id) =
            unpack_layer_with_diff_id(gzip(&tar).as_slice(), Compression::Gzip, &dir.layer())
                .unwrap();
        assert_eq!(stats.entries, 2);
        assert_eq!(diff_id, expected);
    }

    #[test]
    fn missing_destination_is_reported() {
        let dir = TestDir::new("nodest");
        let tar = Layer::new().file("a", b"a").finish();
        assert!(matches!(
            unpack_tar_bytes(&tar, &dir.root.join("absent")),
            Err(UnpackError::Destination { .. })
        ));
    }

    #[test]
    fn error_messages_carry_entry_and_operation() {
        let dir = TestDir::new("message");
        let tar = Layer::new()
            .raw(b"dev/bad", EntryType::new(b'V'), b"", b"")
            .finish();
        let err = unpack_tar_bytes(&tar, &dir.layer()).unwrap_err();
        assert!(err.to_string().contains("dev/bad"), "{err}");
        let err = UnpackError::Io {
            entry: "usr/bin/x".into(),
            op: "chown".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        assert_eq!(
            err.to_string(),
            "layer entry usr/bin/x: chown: permission denied"
        );
    }

    #[test]
    fn gnu_sparse_file_is_expanded() {
        let dir = TestDir::new("sparse");
        let source = dir.root.join("sparse-source");
        let file = File::create(&source).unwrap();
        file.set_len(4 << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&file, b"middle", 2 << 20).unwrap();
        std::os::unix::fs::FileExt::write_at(&file, b"end", (4 << 20) - 3).unwrap();
        drop(file);
        let mut builder = Builder::new(Vec::new());
        builder.sparse(true);
        builder.append_path_with_name(&source, "holes").unwrap();
        let tar = builder.into_inner().unwrap();
        let kind = tar::Archive::new(tar.as_slice())
            .entries()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .header()
            .entry_type();
        assert!(kind.is_gnu_sparse(), "{kind:?}");
        let stats = unpack_tar_bytes(&tar, &dir.layer()).unwrap();
        assert_eq!(stats.bytes, 4 << 20);
        assert_eq!(
            fs::read(dir.path("holes")).unwrap(),
            fs::read(&source).unwrap()
        );
    }

    #[test]
    fn far_future_and_epoch_mtimes() {
        let dir = TestDir::new("mtimes");
        let mut layer = Layer::new();
        for (name, mtime) in [("epoch", 0u64), ("future", 1 << 33), ("huge", 1 << 62)] {
            let mut header = header(EntryType::Regular, 0o644, 1);
            header.set_mtime(mtime);
            layer.0.append_data(&mut header, name, &b"x"[..]).unwrap();
        }
        unpack_tar_bytes(&layer.finish(), &dir.layer()).unwrap();
        assert_eq!(fs::symlink_metadata(dir.path("epoch")).unwrap().mtime(), 0);
        assert_eq!(
            fs::symlink_metadata(dir.path("future")).unwrap().mtime(),
            1 << 33
        );
        assert!(fs::symlink_metadata(dir.path("huge")).is_ok());
    }

    #[test]
    fn worker_failure_stops_the_decompressor() {
        // The first entry is refused; the rest of a large stream must not be needed.
        let mut layer = Layer::new().raw(b"../escape", EntryType::Regular, b"x", b"");
        let mut seed = 1u64;
        let noise: Vec<u8> = (0..(16 << 20))
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect();
        layer = layer.file("big", &noise);
        let blob = gzip(&layer.finish());
        let dir = TestDir::new("early-failure");
        let started = std::time::Instant::now();
        assert_escape(
            unpack_layer(blob.as_slice(), Compression::Gzip, &dir.layer()),
            "../escape",
            "`..`",
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    fn single_thread_fallback_path() {
        let tar = Layer::new()
            .dir("d/", 0o750)
            .file("d/f", b"fallback")
            .symlink("l", "/d/f")
            .finish();
        let dir = TestDir::new("fallback");
        let mut hasher = Sha256::new();
        let stream = DigestReader {
            inner: tar.as_slice(),
            hasher: Some(&mut hasher),
        };
        let stats = unpack_tar(stream, &dir.layer(), &AtomicBool::new(false)).unwrap();
        assert_eq!(
            stats,
            UnpackStats {
                entries: 3,
                bytes: 8
            }
        );
        assert_eq!(fs::read(dir.path("d/f")).unwrap(), b"fallback");
        assert_eq!(
            hasher.finalize().as_slice(),
            Sha256::digest(&tar).as_slice()
        );
    }

    #[test]
    fn overlayfs_honours_whiteouts_and_opaque_dirs() {
        let dir = TestDir::new("overlay");
        let lower = dir.root.join("lower");
        let upper = dir.layer();
        let merged = dir.root.join("merged");
        for d in [&lower, &merged] {
            fs::create_dir_all(d).unwrap();
        }
        let base = Layer::new()
            .dir("etc/", 0o755)
            .file("etc/passwd", b"root")
            .file("etc/shadow", b"secret")
            .dir("cache/", 0o755)
            .file("cache/old", b"old")
            .finish();
        unpack_layer(gzip(&base).as_slice(), Compression::Gzip, &lower).unwrap();
        let diff = Layer::new()
            .dir("etc/", 0o755)
            .file("etc/.wh.shadow", b"")
            .dir("cache/", 0o755)
            .file("cache/.wh..wh..opq", b"")
            .file("cache/new", b"new")
            .finish();
        unpack_layer(zstd_compress(&diff).as_slice(), Compression::Zstd, &upper).unwrap();
        // Two lower layers, no upper: a read-only overlay, as a container image is stacked.
        let options = format!("lowerdir={}:{}", upper.display(), lower.display());
        let status = std::process::Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &options])
            .arg(&merged)
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("skipping: cannot mount overlayfs here ({status:?})");
            return;
        }
        let read = |rel: &str| fs::read(merged.join(rel)).ok();
        let outcome = (
            read("etc/passwd"),
            read("etc/shadow"),
            read("cache/old"),
            read("cache/new"),
        );
        let _ = std::process::Command::new("umount").arg(&merged).status();
        assert_eq!(
            outcome,
            (Some(b"root".to_vec()), None, None, Some(b"new".to_vec()))
        );
    }

    /// Throughput of decompress + unpack on a generated ~200 MiB layer of mixed files.
    ///
    /// `cargo test --release -- --ignored --nocapture bench_unpack_throughput`; set
    /// `BERTH_UNPACK_BENCH_DIR` to keep the generated layer files (for a `tar xzf` baseline),
    /// `BERTH_UNPACK_BENCH_OUT` to unpack on another filesystem (e.g. /dev/shm) and
    /// `BERTH_UNPACK_BENCH_MIB` to change the size. Outputs are only removed at the end: on a
    /// filesystem mounted with `discard`, deleting between runs slows the next run down.
    #[test]
    #[ignore = "benchmark; run explicitly in a release build"]
    fn bench_unpack_throughput() {
        use std::time::Instant;

        let scratch = TestDir::new("bench");
        let dir = std::env::var_os("BERTH_UNPACK_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| scratch.root.clone());
        let out_root = std::env::var_os("BERTH_UNPACK_BENCH_OUT")
            .map(|p| PathBuf::from(p).join(unique("bench-out")))
            .unwrap_or_else(|| scratch.root.join("out"));
        let mib: u64 = std::env::var("BERTH_UNPACK_BENCH_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200);
        fs::create_dir_all(&dir).unwrap();
        let tar_path = dir.join("layer.tar");
        let gz_path = dir.join("layer.tar.gz");
        let zst_path = dir.join("layer.tar.zst");
        if !tar_path.exists() || !gz_path.exists() || !zst_path.exists() {
            let started = Instant::now();
            generate_layer(&tar_path, mib << 20);
            let tar = fs::read(&tar_path).unwrap();
            fs::write(&gz_path, gzip(&tar)).unwrap();
            fs::write(&zst_path, zstd_compress(&tar)).unwrap();
            eprintln!("generated layer in {:.1?}", started.elapsed());
        }
        let size = |p: &Path| fs::metadata(p).unwrap().len();
        let tar_len = size(&tar_path);
        eprintln!(
            "layer: tar {:.1} MiB, gzip {:.1} MiB, zstd {:.1} MiB",
            tar_len as f64 / 1048576.0,
            size(&gz_path) as f64 / 1048576.0,
            size(&zst_path) as f64 / 1048576.0
        );
        let mib_s = |bytes: u64, secs: f64| bytes as f64 / 1048576.0 / secs;

        for (label, path, compression) in [
            ("gzip", &gz_path, Compression::Gzip),
            ("zstd", &zst_path, Compression::Zstd),
            ("plain", &tar_path, Compression::None),
        ] {
            // Decompression alone, for reference.
            let started = Instant::now();
            let file = File::open(path).unwrap();
            let source = BufReader::with_capacity(STREAM_BUFFER, file);
            let n = match compression {
                Compression::None => io::copy(&mut { source }, &mut io::sink()).unwrap(),
                Compression::Gzip => io::copy(
                    &mut flate2::bufread::MultiGzDecoder::new(source),
                    &mut io::sink(),
                )
                .unwrap(),
                Compression::Zstd => io::copy(
                    &mut zstd::stream::read::Decoder::with_buffer(source).unwrap(),
                    &mut io::sink(),
                )
                .unwrap(),
            };
            let secs = started.elapsed().as_secs_f64();
            eprintln!(
                "{label:>5} decompress only: {:7.1} MiB/s of tar",
                mib_s(n, secs)
            );
            let mut best = f64::MAX;
            for run in 0..3 {
                let out = out_root.join(format!("{label}-{run}"));
                fs::create_dir_all(&out).unwrap();
                let started = Instant::now();
                let stats = unpack_layer(File::open(path).unwrap(), compression, &out).unwrap();
                let secs = started.elapsed().as_secs_f64();
                best = best.min(secs);
                eprintln!(
                    "{label:>5} unpack run {run}: {secs:.2} s, {:7.1} MiB/s of tar, {:7.1} MiB/s compressed, {} entries",
                    mib_s(tar_len, secs),
                    mib_s(size(path), secs),
                    stats.entries
                );
            }
            eprintln!(
                "{label:>5} unpack best: {:7.1} MiB/s of tar",
                mib_s(tar_len, best)
            );
        }
        let _ = fs::remove_dir_all(&out_root);
    }

    /// Writes a tar of about `target` bytes shaped like a distro/runtime layer: mostly small
    /// files (average about 25 KiB, a few up to 8 MiB) in a few hundred directories, with
    /// text-like, binary-like and incompressible content.
    fn generate_layer(path: &Path, target: u64) {
        struct Rng(u64);
        impl Rng {
            fn next(&mut self) -> u64 {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                self.0
            }
            fn below(&mut self, n: u64) -> u64 {
                self.next() % n
            }
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let words: Vec<Vec<u8>> = (0..2048)
            .map(|_| {
                let len = 2 + rng.below(9);
                (0..len).map(|_| b'a' + rng.below(26) as u8).collect()
            })
            .collect();
        let out = io::BufWriter::with_capacity(1 << 20, File::create(path).unwrap());
        let mut builder = Builder::new(out);
        let mut written = 0u64;
        let mut index = 0u64;
        let mut current_dir = String::new();
        while written < target {
            let dir = format!("usr/lib/pkg{:03}/sub{}", index / 200, (index / 25) % 8);
            if dir != current_dir {
                let mut header = header(EntryType::Directory, 0o755, 0);
                builder
                    .append_data(&mut header, format!("{dir}/"), io::empty())
                    .unwrap();
                current_dir = dir.clone();
            }
            let bucket = rng.below(1000);
            let size = match bucket {
                0..880 => rng.below(8 << 10),
                880..985 => (8 << 10) + rng.below(120 << 10),
                985..999 => (128 << 10) + rng.below(896 << 10),
                _ => (1 << 20) + rng.below(7 << 20),
            } as usize;
            let kind = rng.below(100);
            let mut data = Vec::with_capacity(size);
            while data.len() < size {
                match kind {
                    0..45 => {
                        let word = &words[rng.below(words.len() as u64) as usize];
                        data.extend_from_slice(word);
                        data.push(if rng.below(12) == 0 { b'\n' } else { b' ' });
                    }
                    45..85 => {
                        let r = rng.next();
                        for i in 0..8 {
                            let b = (r >> (i * 8)) as u8;
                            data.push(match b % 4 {
                                0 => 0,
                                1 => b & 0x1f,
                                _ => b,
                            });
                        }
                    }
                    _ => data.extend_from_slice(&rng.next().to_le_bytes()),
                }
            }
            data.truncate(size);
            let mut header = header(EntryType::Regular, 0o644, size as u64);
            builder
                .append_data(
                    &mut header,
                    format!("{dir}/file{index}.bin"),
                    data.as_slice(),
                )
                .unwrap();
            written += size as u64 + 512;
            index += 1;
        }
        builder.into_inner().unwrap().flush().unwrap();
    }
}
