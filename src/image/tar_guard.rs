//! A reader that follows a tar stream's blocks and refuses oversized extension records before their data is read.
//!
//! The tar crate reads a GNU long name (`L`), GNU long link (`K`) or PAX (`x`) record whole
//! into memory, whatever size its header declares. [`TarGuard`] sits between the byte stream
//! and `tar::Archive`: it walks the same structure the crate walks (512-byte headers, the
//! size field in octal or base-256, a PAX `size=` record overriding the next entry's size, GNU
//! sparse extension blocks, the first zero block ending the archive) and fails the read that
//! would deliver a header of an `L`, `K`, `x` or `g` record larger than
//! [`MAX_EXTENSION_RECORD`], so the crate never starts reading its data.

use std::io::{self, Read};

/// The largest GNU long name, GNU long link or PAX (local or global) record accepted: 1 MiB.
/// Paths are at most 4 KiB on Linux, and xattrs at most 64 KiB each; image builders never
/// come close.
pub const MAX_EXTENSION_RECORD: u64 = 1 << 20;

const BLOCK: usize = 512;
/// Offset of the `isextended` byte in a GNU header.
const GNU_ISEXTENDED: usize = 482;
/// Offset of the `isextended` byte in a GNU sparse extension block.
const EXT_ISEXTENDED: usize = 504;

/// An extension record whose declared size is above [`MAX_EXTENSION_RECORD`]; carried inside
/// the `io::Error` the guarded read fails with (see [`refusal`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "tar {kind} record at byte {offset} declares {size} bytes, more than the {MAX_EXTENSION_RECORD} allowed"
)]
pub struct ExtensionTooLarge {
    /// What the record is ("GNU long name", "PAX header", ...).
    pub kind: &'static str,
    /// Its declared data size.
    pub size: u64,
    /// Where its header starts in the tar stream.
    pub offset: u64,
}

/// The refusal inside `e`, if `e` is one.
pub fn refusal(e: &io::Error) -> Option<&ExtensionTooLarge> {
    e.get_ref()?.downcast_ref::<ExtensionTooLarge>()
}

/// Where in the block structure the next byte falls.
#[derive(Debug)]
enum Phase {
    /// Collecting a header block.
    Header,
    /// Collecting a GNU sparse extension block; `size` is the data that follows them.
    SparseExt { size: u64 },
    /// Inside an entry's data (then its padding to a block boundary).
    Data {
        remaining: u64,
        padding: u64,
        /// The data of a PAX local record, kept to find its `size`.
        pax: Option<Vec<u8>>,
    },
    /// After the end-of-archive block: the rest is not tar and passes as it is.
    Ended,
}

/// See the module documentation.
pub struct TarGuard<R> {
    inner: R,
    phase: Phase,
    block: Box<[u8; BLOCK]>,
    filled: usize,
    /// Bytes seen so far.
    offset: u64,
    /// The `size` of a PAX record that applies to the next entry that is not an extension.
    pax_size: Option<u64>,
    /// An error already returned: every later read returns it again.
    failed: Option<(io::ErrorKind, String)>,
}

impl<R> TarGuard<R> {
    /// Guards `inner`, which starts at a tar header.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            phase: Phase::Header,
            block: Box::new([0; BLOCK]),
            filled: 0,
            offset: 0,
            pax_size: None,
            failed: None,
        }
    }

    /// The guarded reader.
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Follows `bytes`, the next bytes of the stream.
    fn follow(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match &mut self.phase {
                Phase::Ended => return Ok(()),
                Phase::Header | Phase::SparseExt { .. } => {
                    let n = (BLOCK - self.filled).min(bytes.len());
                    self.block[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
                    self.filled += n;
                    self.offset += n as u64;
                    bytes = &bytes[n..];
                    if self.filled == BLOCK {
                        self.filled = 0;
                        self.phase = self.block_done()?;
                    }
                }
                Phase::Data {
                    remaining,
                    padding,
                    pax,
                } => {
                    let n = if *remaining > 0 {
                        let n = usize::try_from(*remaining)
                            .unwrap_or(usize::MAX)
                            .min(bytes.len());
                        if let Some(pax) = pax {
                            pax.extend_from_slice(&bytes[..n]);
                        }
                        *remaining -= n as u64;
                        n
                    } else {
                        let n = usize::try_from(*padding)
                            .unwrap_or(usize::MAX)
                            .min(bytes.len());
                        *padding -= n as u64;
                        n
                    };
                    self.offset += n as u64;
                    bytes = &bytes[n..];
                    if *remaining == 0 {
                        if let Some(pax) = pax.take() {
                            self.pax_size = pax_size(&pax);
                        }
                        if *padding == 0 {
                            self.phase = Phase::Header;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The phase after a complete header or sparse extension block.
    fn block_done(&mut self) -> io::Result<Phase> {
        let start = self.offset - BLOCK as u64;
        if let Phase::SparseExt { size } = self.phase {
            return Ok(if self.block[EXT_ISEXTENDED] == 1 {
                Phase::SparseExt { size }
            } else {
                data(size, false)
            });
        }
        if self.block.iter().all(|b| *b == 0) {
            return Ok(Phase::Ended);
        }
        let header = tar::Header::from_byte_slice(&self.block[..]);
        let kind = header.entry_type();
        let declared = header.entry_size().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("tar header at byte {start}: {e}"),
            )
        })?;
        let extension = if kind.is_gnu_longname() {
            Some("GNU long name")
        } else if kind.is_gnu_longlink() {
            Some("GNU long link")
        } else if kind.is_pax_local_extensions() {
            Some("PAX header")
        } else if kind.is_pax_global_extensions() {
            Some("PAX global header")
        } else {
            None
        };
        if let Some(kind) = extension
            && declared > MAX_EXTENSION_RECORD
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                ExtensionTooLarge {
                    kind,
                    size: declared,
                    offset: start,
                },
            ));
        }
        // The crate treats `L`, `K` and `x` as records of the next entry only under a ustar or
        // GNU magic; anything else ends the chain, and takes (and drops) a pending PAX size.
        let recognized = header.as_gnu().is_some() || header.as_ustar().is_some();
        let chained = recognized
            && (kind.is_gnu_longname() || kind.is_gnu_longlink() || kind.is_pax_local_extensions());
        let size = match extension {
            Some(_) => declared,
            None => self.pax_size.unwrap_or(declared),
        };
        if !chained {
            self.pax_size = None;
        }
        let sparse_ext =
            kind.is_gnu_sparse() && header.as_gnu().is_some() && self.block[GNU_ISEXTENDED] == 1;
        Ok(if sparse_ext {
            Phase::SparseExt { size }
        } else {
            data(size, chained && kind.is_pax_local_extensions())
        })
    }
}

/// The data phase of `size` bytes, keeping them when they are a PAX record.
fn data(size: u64, keep: bool) -> Phase {
    let padding = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
    let pax = keep.then(|| Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(BLOCK)));
    if size == 0 && padding == 0 && pax.is_none() {
        return Phase::Header;
    }
    Phase::Data {
        remaining: size,
        padding,
        pax,
    }
}

/// The `size` of a PAX record as the tar crate reads it: the first `size` key, if its value is
/// a number; nothing once a malformed line comes first.
fn pax_size(record: &[u8]) -> Option<u64> {
    for extension in tar::PaxExtensions::new(record) {
        let extension = extension.ok()?;
        if extension.key() != Ok("size") {
            continue;
        }
        return extension.value().ok()?.parse().ok();
    }
    None
}

impl<R: Read> Read for TarGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some((kind, message)) = &self.failed {
            return Err(io::Error::new(*kind, message.clone()));
        }
        let n = self.inner.read(buf)?;
        if let Err(e) = self.follow(&buf[..n]) {
            self.failed = Some((e.kind(), e.to_string()));
            return Err(e);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h
    }

    /// Reads `archive` through the guard with the tar crate, as the unpacker does; returns the
    /// paths and contents of its entries.
    fn entries(archive: &[u8]) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut tar = tar::Archive::new(TarGuard::new(archive));
        let mut out = Vec::new();
        for entry in tar.entries()? {
            let mut entry = entry?;
            let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data)?;
            out.push((path, data));
        }
        let mut rest = tar.into_inner();
        io::copy(&mut rest, &mut io::sink())?;
        Ok(out)
    }

    fn file(builder: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut h, path, data)
            .expect("append file");
    }

    /// Appends a PAX local record of one `key=value`.
    fn pax(builder: &mut tar::Builder<Vec<u8>>, key: &str, value: &[u8]) {
        let mut line = format!(" {key}=").into_bytes();
        line.extend_from_slice(value);
        line.push(b'\n');
        let mut len = line.len() + 1;
        while len.to_string().len() + line.len() != len {
            len = len.to_string().len() + line.len();
        }
        let mut record = len.to_string().into_bytes();
        record.extend_from_slice(&line);
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_path("PaxHeaders/f").expect("path");
        h.set_size(record.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        builder.append(&h, &record[..]).expect("pax");
    }

    #[test]
    fn long_names_and_links_within_the_bound_pass() {
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("{}/file", "d".repeat(3000));
        file(&mut b, &long, b"content");
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "link", "t".repeat(2000))
            .expect("link");
        file(&mut b, "short", b"x");
        let bytes = b.into_inner().expect("finish");
        let got = entries(&bytes).expect("guarded read");
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].0, long);
        assert_eq!(got[0].1, b"content");
        assert_eq!(got[2], ("short".to_string(), b"x".to_vec()));
    }

    #[test]
    fn a_two_mib_long_name_is_refused_before_its_data() {
        let mut b = tar::Builder::new(Vec::new());
        let long = "n".repeat(2 << 20);
        file(&mut b, &long, b"content");
        let bytes = b.into_inner().expect("finish");
        let e = entries(&bytes).expect_err("refused");
        let refused = refusal(&e).expect("a refusal");
        assert_eq!(refused.kind, "GNU long name");
        assert_eq!(refused.offset, 0);
        assert!(refused.size > MAX_EXTENSION_RECORD);

        // The refusal comes with the header: the guard read no further than one buffer.
        let mut guard = TarGuard::new(&bytes[..]);
        let mut buf = [0u8; BLOCK];
        let e = guard.read(&mut buf).expect_err("header refused");
        assert!(refusal(&e).is_some(), "{e}");
        assert!(guard.read(&mut buf).is_err(), "stays failed");
    }

    #[test]
    fn a_declared_size_is_enough_for_a_refusal() {
        // A header declaring 1.5 GiB, with no data behind it at all.
        let mut bytes = header(tar::EntryType::GNULongName, 3 << 29)
            .as_bytes()
            .to_vec();
        bytes.extend_from_slice(&[0; BLOCK]);
        let e = entries(&bytes).expect_err("refused");
        assert_eq!(refusal(&e).map(|r| r.size), Some(3 << 29), "{e}");
        for kind in [
            tar::EntryType::GNULongLink,
            tar::EntryType::XHeader,
            tar::EntryType::XGlobalHeader,
        ] {
            let bytes = header(kind, MAX_EXTENSION_RECORD + 1).as_bytes().to_vec();
            let e = entries(&bytes).expect_err("refused");
            assert!(refusal(&e).is_some(), "{kind:?}: {e}");
        }
    }

    #[test]
    fn a_large_pax_record_is_refused() {
        let mut b = tar::Builder::new(Vec::new());
        let value = "v".repeat(2 << 20);
        pax(&mut b, "SCHILY.xattr.user.big", value.as_bytes());
        file(&mut b, "f", b"data");
        let bytes = b.into_inner().expect("finish");
        let e = entries(&bytes).expect_err("refused");
        assert_eq!(refusal(&e).map(|r| r.kind), Some("PAX header"), "{e}");
    }

    #[test]
    fn a_pax_size_overrides_the_next_entry_as_the_crate_reads_it() {
        // The header says 0 bytes, the PAX record says 1500: the crate takes 1500 bytes of data,
        // so the guard must look for the next header after them, where a 2 MiB long name waits.
        let mut b = tar::Builder::new(Vec::new());
        pax(&mut b, "size", b"1500");
        let mut bytes = b.into_inner().expect("finish");
        bytes.truncate(bytes.len() - 2 * BLOCK); // drop the end-of-archive blocks
        let mut h = header(tar::EntryType::Regular, 0);
        h.set_path("hidden").expect("path");
        h.set_cksum();
        bytes.extend_from_slice(h.as_bytes());
        let mut data = vec![b'a'; 1500];
        data.resize(1536, 0);
        // Inside the data, a block that would be a harmless header were the size 0.
        let mut decoy = header(tar::EntryType::Regular, 0);
        decoy.set_path("decoy").expect("path");
        decoy.set_cksum();
        data[..BLOCK].copy_from_slice(decoy.as_bytes());
        bytes.extend_from_slice(&data);
        bytes.extend_from_slice(header(tar::EntryType::GNULongName, 2 << 20).as_bytes());
        bytes.extend_from_slice(&[0; 2 * BLOCK]);
        let e = entries(&bytes).expect_err("the long name after the data is refused");
        let refused = refusal(&e).expect("a refusal");
        assert_eq!(refused.offset, bytes.len() as u64 - 3 * BLOCK as u64);

        // The same record with a small long name after it reads through.
        let n = bytes.len();
        let mut long = header(tar::EntryType::GNULongName, 6);
        long.set_path("././@LongLink").expect("path");
        long.set_cksum();
        bytes[n - 3 * BLOCK..n - 2 * BLOCK].copy_from_slice(long.as_bytes());
        let mut name = b"named\0".to_vec();
        name.resize(BLOCK, 0);
        let mut last = header(tar::EntryType::Regular, 0);
        last.set_path("x").expect("path");
        last.set_cksum();
        bytes.truncate(n - 2 * BLOCK);
        bytes.extend_from_slice(&name);
        bytes.extend_from_slice(last.as_bytes());
        bytes.extend_from_slice(&[0; 2 * BLOCK]);
        let got = entries(&bytes).expect("guarded read");
        let names: Vec<&str> = got.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["hidden", "named"]);
        assert_eq!(got[0].1.len(), 1500);
    }

    #[test]
    fn a_pax_global_header_does_not_resize_the_next_entry() {
        let mut bytes = Vec::new();
        let record = b"13 size=2048\n";
        let mut g = header(tar::EntryType::XGlobalHeader, record.len() as u64);
        g.set_path("pax_global_header").expect("path");
        g.set_cksum();
        bytes.extend_from_slice(g.as_bytes());
        let mut data = record.to_vec();
        data.resize(BLOCK, 0);
        bytes.extend_from_slice(&data);
        let mut f = header(tar::EntryType::Regular, 0);
        f.set_path("f").expect("path");
        f.set_cksum();
        bytes.extend_from_slice(f.as_bytes());
        bytes.extend_from_slice(header(tar::EntryType::GNULongLink, 2 << 20).as_bytes());
        let e = entries(&bytes).expect_err("refused right after the empty file");
        assert_eq!(
            refusal(&e).map(|r| r.offset),
            Some(2 * BLOCK as u64 + BLOCK as u64)
        );
    }

    #[test]
    fn sparse_extension_blocks_are_followed() {
        // A GNU sparse file whose map continues in one extension block, then its data, then a
        // refused long name: found only if the extension block and data are both skipped.
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_path("sparse").expect("path");
        h.set_mode(0o644);
        h.set_size(BLOCK as u64); // data stored in the archive
        let gnu = h.as_gnu_mut().expect("gnu");
        gnu.set_real_size(4096);
        gnu.set_is_extended(true);
        h.set_cksum();
        let mut bytes = h.as_bytes().to_vec();
        let mut ext = [0u8; BLOCK];
        ext[..12].copy_from_slice(b"00000007000\0"); // offset 3584
        ext[12..24].copy_from_slice(b"00000001000\0"); // 512 bytes
        bytes.extend_from_slice(&ext);
        bytes.extend_from_slice(&[b's'; BLOCK]);
        let mut done = bytes.clone();
        done.extend_from_slice(&[0; 2 * BLOCK]);
        let got = entries(&done).expect("sparse file reads through the guard");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1.len(), 4096);
        assert!(got[0].1[3584..].iter().all(|b| *b == b's'));

        bytes.extend_from_slice(header(tar::EntryType::GNULongName, 2 << 20).as_bytes());
        let e = entries(&bytes).expect_err("refused");
        assert_eq!(refusal(&e).map(|r| r.offset), Some(3 * BLOCK as u64));
    }

    #[test]
    fn bytes_after_the_end_block_pass() {
        let mut bytes = vec![0u8; BLOCK];
        bytes.extend_from_slice(header(tar::EntryType::GNULongName, 2 << 20).as_bytes());
        let mut guard = TarGuard::new(&bytes[..]);
        let mut out = Vec::new();
        guard.read_to_end(&mut out).expect("not tar any more");
        assert_eq!(out, bytes);
    }
}
