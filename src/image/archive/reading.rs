//! Reading an archive in one pass: small JSON files are kept, every other blob is unpacked
//! into its own extraction snapshot as it streams by (hashed on the way), so a layer is never
//! written to disk twice; which blobs are layers is only known once the archive has ended.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};

use sha2::{Digest, Sha256};

use super::super::ImageError;
use super::super::manager::Inner;
use super::super::pull::{EXTRACT_PREFIX, unpack_stream};
use super::super::tar_guard::{self, TarGuard};
use super::super::unpack::Compression;

/// Files whose content is kept in memory are at most this large.
const MAX_DOCUMENT: u64 = 16 * 1024 * 1024;
/// All kept files together are at most this large.
const MAX_DOCUMENTS: u64 = 64 * 1024 * 1024;
/// Non-JSON files smaller than this are kept too (`VERSION`, `oci-layout` without JSON...).
const SMALL_FILE: u64 = 1024;
/// Links followed when resolving an entry.
const MAX_LINKS: usize = 16;

/// A blob unpacked as a layer.
#[derive(Debug)]
pub struct LayerBlob {
    /// sha256 of the blob as stored in the archive.
    pub digest: String,
    /// Its length in the archive.
    pub size: u64,
    /// How it was compressed.
    pub compression: Compression,
    /// The extraction snapshot and the diff id, or why it would not unpack.
    pub unpacked: Result<(String, String), ImageError>,
}

/// What one pass over an archive found.
#[derive(Debug, Default)]
pub struct ArchiveContents {
    /// Small files by path.
    pub documents: HashMap<String, Vec<u8>>,
    /// Other files by path, unpacked.
    pub layers: HashMap<String, LayerBlob>,
    /// Symbolic and hard links by path: the path they point to.
    pub links: HashMap<String, String>,
}

/// A file of the archive, as found by [`ArchiveContents::find`].
pub enum Found<'a> {
    Document(&'a [u8]),
    Layer(&'a LayerBlob),
}

impl ArchiveContents {
    /// The file at `path`, through links.
    pub fn find(&self, path: &str) -> Option<(String, Found<'_>)> {
        let mut path = path.to_string();
        for _ in 0..MAX_LINKS {
            if let Some(doc) = self.documents.get(&path) {
                return Some((path, Found::Document(doc)));
            }
            if let Some(layer) = self.layers.get(&path) {
                return Some((path, Found::Layer(layer)));
            }
            path = self.links.get(&path)?.clone();
        }
        None
    }

    /// Extraction snapshots made while reading, for the caller to commit or discard.
    pub fn snapshot_keys(&self) -> impl Iterator<Item = &str> {
        self.layers
            .values()
            .filter_map(|l| l.unpacked.as_ref().ok().map(|(key, _)| key.as_str()))
    }
}

/// Normalises an entry's path: no leading `/` or `./`, no `.` components; `None` when a `..`
/// component would leave the archive's root.
fn normalise(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut parts: Vec<&str> = Vec::new();
    for part in text.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// Resolves a symbolic link's target relative to the link's directory.
fn link_target(entry: &str, target: &[u8], symbolic: bool) -> Option<String> {
    let target = String::from_utf8_lossy(target);
    if !symbolic || target.starts_with('/') {
        return normalise(target.as_bytes());
    }
    let mut parts: Vec<&str> = entry.split('/').collect();
    parts.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The blob's bytes, hashed and counted as they are read.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// How a stream is compressed, from its first bytes.
pub fn sniff(head: &[u8]) -> Compression {
    if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

fn looks_like_json(head: &[u8]) -> bool {
    head.iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{' || *b == b'[')
}

impl Inner {
    /// Reads the archive `name` from `reader` (a plain, gzip or zstd tar). On error every
    /// snapshot it made is gone.
    pub(super) fn read_archive(
        &self,
        name: &str,
        reader: impl Read,
    ) -> Result<ArchiveContents, ImageError> {
        let mut contents = ArchiveContents::default();
        match self.read_entries(name, reader, &mut contents) {
            Ok(()) => Ok(contents),
            Err(e) => {
                self.discard_contents(&contents);
                Err(e)
            }
        }
    }

    /// Removes every snapshot reading made.
    pub(super) fn discard_contents(&self, contents: &ArchiveContents) {
        for key in contents.snapshot_keys() {
            self.discard_snapshot(key);
        }
    }

    fn read_entries(
        &self,
        name: &str,
        reader: impl Read,
        contents: &mut ArchiveContents,
    ) -> Result<(), ImageError> {
        let corrupt = |what: String, e: io::Error| {
            ImageError::Corrupt(format!("archive {name}: {what}: {e}"))
        };
        let mut buffered = BufReader::with_capacity(256 * 1024, reader);
        let head = buffered
            .fill_buf()
            .map_err(|e| corrupt("reading".into(), e))?;
        if head.is_empty() {
            return Err(ImageError::InvalidArgument(format!(
                "archive {name} is empty"
            )));
        }
        let stream: Box<dyn Read> = match sniff(head) {
            Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
            Compression::Zstd => Box::new(
                zstd::stream::read::Decoder::with_buffer(buffered)
                    .map_err(|e| corrupt("starting to decompress".into(), e))?,
            ),
            Compression::None => Box::new(buffered),
        };
        let mut archive = tar::Archive::new(TarGuard::new(stream));
        let entries = archive
            .entries()
            .map_err(|e| corrupt("reading".into(), e))?;
        let mut kept: u64 = 0;
        for (index, entry) in entries.enumerate() {
            let mut entry = entry.map_err(|e| {
                if tar_guard::refusal(&e).is_some() {
                    return ImageError::Hostile {
                        image: format!("archive {name}"),
                        reason: e.to_string(),
                    };
                }
                corrupt(
                    format!(
                        "reading the header of entry #{} (truncated or not a tar?)",
                        index + 1
                    ),
                    e,
                )
            })?;
            let raw = entry.path_bytes().into_owned();
            let shown = String::from_utf8_lossy(&raw).into_owned();
            let Some(path) = normalise(&raw) else {
                return Err(ImageError::Hostile {
                    image: format!("archive {name}"),
                    reason: format!("entry {shown} escapes the archive's root"),
                });
            };
            let kind = entry.header().entry_type();
            if kind.is_symlink() || kind.is_hard_link() {
                let target = entry
                    .link_name_bytes()
                    .map(|l| l.into_owned())
                    .unwrap_or_default();
                let Some(target) = link_target(&path, &target, kind.is_symlink()) else {
                    return Err(ImageError::Hostile {
                        image: format!("archive {name}"),
                        reason: format!(
                            "entry {shown} links to {} outside the archive's root",
                            String::from_utf8_lossy(&target)
                        ),
                    });
                };
                contents.links.insert(path, target);
                continue;
            }
            if !(kind.is_file() || kind.is_contiguous()) {
                continue;
            }
            let size = entry.size();
            let mut head = Vec::with_capacity(512);
            (&mut entry)
                .take(512)
                .read_to_end(&mut head)
                .map_err(|e| corrupt(format!("entry {shown}"), e))?;
            let compression = sniff(&head);
            let document = size <= MAX_DOCUMENT
                && (looks_like_json(&head)
                    || (size < SMALL_FILE && compression == Compression::None));
            if document {
                kept += size;
                if kept > MAX_DOCUMENTS {
                    return Err(ImageError::InvalidArgument(format!(
                        "archive {name}: more than {MAX_DOCUMENTS} bytes of metadata files (at entry {shown}); is it an image archive?"
                    )));
                }
                let mut bytes = head;
                entry
                    .read_to_end(&mut bytes)
                    .map_err(|e| corrupt(format!("entry {shown}"), e))?;
                if bytes.len() as u64 != size {
                    return Err(ImageError::Corrupt(format!(
                        "archive {name}: entry {shown} is truncated"
                    )));
                }
                contents.documents.insert(path, bytes);
                continue;
            }
            let layer = self.unpack_blob(name, &shown, head, &mut entry, compression)?;
            if layer.size != size {
                if let Ok((key, _)) = &layer.unpacked {
                    self.discard_snapshot(key);
                }
                return Err(ImageError::Corrupt(format!(
                    "archive {name}: entry {shown} is truncated: {} of {size} bytes",
                    layer.size
                )));
            }
            if let Some(old) = contents.layers.insert(path, layer)
                && let Ok((key, _)) = &old.unpacked
            {
                self.discard_snapshot(key);
            }
        }
        Ok(())
    }

    /// Unpacks one blob into a new extraction snapshot. A blob that does not unpack is kept
    /// with its error (it matters only if an image names it as a layer); disk trouble fails
    /// the whole import.
    fn unpack_blob(
        &self,
        name: &str,
        entry_name: &str,
        head: Vec<u8>,
        entry: &mut impl Read,
        compression: Compression,
    ) -> Result<LayerBlob, ImageError> {
        let key = format!("{EXTRACT_PREFIX}{}-import", crate::util::random_hex(8));
        let (dest, tape) = self.prepare_extraction(&key)?;
        let mut hashing = Hashing {
            inner: io::Cursor::new(head).chain(entry),
            hasher: Sha256::new(),
            count: 0,
        };
        let shown = format!("archive {name}, entry {entry_name}");
        let unpacked = unpack_stream(
            &mut hashing,
            compression,
            &dest,
            &tape,
            &format!("archive {name}"),
            &format!("entry {entry_name}"),
            self.max_unpacked_layer_bytes,
        );
        // What the unpacker left unread (trailing bytes after the tar) still counts.
        if let Err(e) = io::copy(&mut hashing, &mut io::sink()) {
            self.discard_snapshot(&key);
            return Err(ImageError::Corrupt(format!("{shown}: {e}")));
        }
        if let Err(ImageError::Internal(m)) = &unpacked {
            let m = m.clone();
            self.discard_snapshot(&key);
            return Err(ImageError::Internal(m));
        }
        if unpacked.is_err() {
            self.discard_snapshot(&key);
        }
        let digest = format!("sha256:{}", hex::encode(hashing.hasher.finalize()));
        Ok(LayerBlob {
            digest,
            size: hashing.count,
            compression,
            unpacked: unpacked.map(|diff_id| (key, diff_id)),
        })
    }
}
