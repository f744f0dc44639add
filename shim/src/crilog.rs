//! Container output to the CRI log format: `<RFC3339Nano> stdout|stderr F|P <text>\n`.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::timefmt;

/// The longest record body; a longer line is split into `P` records.
pub const MAX_RECORD: usize = 16 * 1024;

/// Which stream a record came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn tag(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Splits one stream's bytes into records; keeps the unfinished line between reads.
#[derive(Debug)]
pub struct LineSplitter {
    stream: Stream,
    pending: Vec<u8>,
    /// TTY output ends lines with "\r\n": drop the '\r' of full lines.
    strip_cr: bool,
}

impl LineSplitter {
    pub fn new(stream: Stream) -> Self {
        Self {
            stream,
            pending: Vec::new(),
            strip_cr: false,
        }
    }

    /// A splitter for a terminal's output (lines end with "\r\n").
    pub fn for_tty() -> Self {
        Self {
            strip_cr: true,
            ..Self::new(Stream::Stdout)
        }
    }

    fn emit_line(&mut self, out: &mut impl RecordSink) -> io::Result<()> {
        let mut body = self.pending.as_slice();
        if self.strip_cr && body.last() == Some(&b'\r') {
            body = &body[..body.len() - 1];
        }
        out.record(self.stream, true, body)?;
        self.pending.clear();
        Ok(())
    }

    /// Feeds bytes read from the stream; emits every complete record.
    pub fn feed(&mut self, mut data: &[u8], out: &mut impl RecordSink) -> io::Result<()> {
        while !data.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(nl) if self.pending.len() + nl <= MAX_RECORD => {
                    self.pending.extend_from_slice(&data[..nl]);
                    self.emit_line(out)?;
                    data = &data[nl + 1..];
                }
                _ => {
                    // No newline within reach: fill up to MAX_RECORD, emit P when full.
                    let room = MAX_RECORD - self.pending.len();
                    let take = room.min(data.len());
                    self.pending.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.pending.len() == MAX_RECORD && !data.is_empty() {
                        if data[0] == b'\n' {
                            // The line ends exactly at the limit: one full record.
                            self.emit_line(out)?;
                            data = &data[1..];
                        } else {
                            out.record(self.stream, false, &self.pending)?;
                            self.pending.clear();
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// End of stream, or of the container: a final unterminated line becomes a `P` record, as
    /// containerd writes it (`F` says the line ended with a newline; a reader such as the
    /// kubelet adds one for it, so `printf DONE` must not come back as "DONE\n").
    pub fn finish(&mut self, out: &mut impl RecordSink) -> io::Result<()> {
        if !self.pending.is_empty() {
            out.record(self.stream, false, &self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }
}

/// Where records go.
pub trait RecordSink {
    fn record(&mut self, stream: Stream, full: bool, body: &[u8]) -> io::Result<()>;
}

/// Formats one record line.
pub fn format_record(timestamp: &str, stream: Stream, full: bool, body: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(timestamp.len() + body.len() + 12);
    line.extend_from_slice(timestamp.as_bytes());
    line.push(b' ');
    line.extend_from_slice(stream.tag().as_bytes());
    line.extend_from_slice(if full { b" F " } else { b" P " });
    line.extend_from_slice(body);
    line.push(b'\n');
    line
}

/// The CRI log file; reopened on request (after rotation). A log that cannot be written (a
/// full disk, an I/O error) costs the lines written meanwhile and one warning, never the
/// container.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: File,
    failing: bool,
}

impl LogFile {
    pub fn open(path: &Path) -> io::Result<Self> {
        Ok(Self {
            path: path.to_path_buf(),
            file: open_append(path)?,
            failing: false,
        })
    }

    pub fn reopen(&mut self) -> io::Result<()> {
        self.file = open_append(&self.path)?;
        Ok(())
    }
}

impl RecordSink for LogFile {
    fn record(&mut self, stream: Stream, full: bool, body: &[u8]) -> io::Result<()> {
        // One write per record so that readers never see half a line.
        match self
            .file
            .write_all(&format_record(&timefmt::now(), stream, full, body))
        {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(log = %self.path.display(), "the container log is written again");
            }
            Ok(()) => {}
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::warn!(log = %self.path.display(), error = %e, "writing the container log failed: its output is dropped until the log can be written again");
            }
            Err(_) => {}
        }
        Ok(())
    }
}

/// Opens (or creates) the log for appending. The last component is never followed: a log
/// path that names a symlink (a pod's log directory is writable by whoever can plant one) is
/// refused, so the container's output cannot be appended to the file it points at.
fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    e.kind(),
                    format!(
                        "open log {}: it is a symbolic link, which the log is never written through",
                        path.display()
                    ),
                )
            } else {
                io::Error::new(e.kind(), format!("open log {}: {e}", path.display()))
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Vec<(Stream, bool, Vec<u8>)>);

    impl RecordSink for Collect {
        fn record(&mut self, s: Stream, full: bool, body: &[u8]) -> io::Result<()> {
            self.0.push((s, full, body.to_vec()));
            Ok(())
        }
    }

    fn summary(c: &Collect) -> Vec<(bool, usize)> {
        c.0.iter().map(|(_, f, b)| (*f, b.len())).collect()
    }

    #[test]
    fn lines_across_reads() -> io::Result<()> {
        let mut s = LineSplitter::new(Stream::Stdout);
        let mut c = Collect::default();
        s.feed(b"hel", &mut c)?;
        s.feed(b"lo\nwor", &mut c)?;
        s.feed(b"ld\n\nx", &mut c)?;
        s.finish(&mut c)?;
        let bodies: Vec<_> = c.0.iter().map(|(_, f, b)| (*f, b.clone())).collect();
        assert_eq!(
            bodies,
            vec![
                (true, b"hello".to_vec()),
                (true, b"world".to_vec()),
                (true, Vec::new()),
                (false, b"x".to_vec())
            ]
        );
        Ok(())
    }

    #[test]
    fn long_line_split() -> io::Result<()> {
        let mut s = LineSplitter::new(Stream::Stderr);
        let mut c = Collect::default();
        let mut line = vec![b'a'; 40 * 1024];
        line.push(b'\n');
        for chunk in line.chunks(3000) {
            s.feed(chunk, &mut c)?;
        }
        s.finish(&mut c)?;
        assert_eq!(
            summary(&c),
            vec![
                (false, MAX_RECORD),
                (false, MAX_RECORD),
                (true, 40 * 1024 - 2 * MAX_RECORD)
            ]
        );
        Ok(())
    }

    #[test]
    fn exact_limit_is_one_full_record() -> io::Result<()> {
        let mut s = LineSplitter::new(Stream::Stdout);
        let mut c = Collect::default();
        let mut line = vec![b'b'; MAX_RECORD];
        line.extend_from_slice(b"\nok\n");
        s.feed(&line, &mut c)?;
        assert_eq!(summary(&c), vec![(true, MAX_RECORD), (true, 2)]);
        Ok(())
    }

    #[test]
    fn tty_lines_lose_their_carriage_return() -> io::Result<()> {
        let mut s = LineSplitter::for_tty();
        let mut c = Collect::default();
        s.feed(b"a\r\nb\rc\r\n", &mut c)?;
        let bodies: Vec<_> = c.0.iter().map(|(_, _, b)| b.clone()).collect();
        assert_eq!(bodies, vec![b"a".to_vec(), b"b\rc".to_vec()]);
        Ok(())
    }

    #[test]
    fn record_format() {
        let r = format_record("T", Stream::Stderr, false, b"x y");
        assert_eq!(r, b"T stderr P x y\n");
    }

    #[test]
    fn a_log_path_that_is_a_symlink_is_refused() {
        let dir = std::env::temp_dir().join(format!("berth-shim-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let marker = dir.join("marker");
        std::fs::write(&marker, "untouched").expect("marker");
        let link = dir.join("c.log");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&marker, &link).expect("symlink");
        let e = LogFile::open(&link).expect_err("a symlinked log must be refused");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&marker).expect("read"), "untouched");
        std::fs::remove_file(&link).expect("unlink");
        let mut log = LogFile::open(&link).expect("a plain log opens");
        log.record(Stream::Stdout, true, b"hi").expect("record");
        assert!(log.reopen().is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
