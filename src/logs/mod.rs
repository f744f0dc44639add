//! Container logs as `kubectl logs` shows them: the CRI log files read with tail, since, limit
//! and timestamps, and followed across rotation while the container runs. The node server and
//! `berthctl logs` both read through here.

pub mod record;

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

pub use record::{Record, parse_record};

/// What part of a log to show and how.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    /// Keep reading as the container writes, until it has ended and everything is shown.
    pub follow: bool,
    /// Only the last this many lines (records) of the file.
    pub tail_lines: Option<u64>,
    /// Only records written at this time or later.
    pub since: Option<Timestamp>,
    /// Put each record's time (RFC 3339, nanoseconds) before it.
    pub timestamps: bool,
    /// Stop after this many bytes of output.
    pub limit_bytes: Option<u64>,
}

/// How often a follower looks for new bytes at the end of the file.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// How often a follower checks whether the file was rotated and the container still runs.
const FOLLOW_CHECK: Duration = Duration::from_secs(1);

/// Byte offset in `file` where its last `lines` lines begin (0 when it has fewer).
pub fn tail_offset(file: &mut File, lines: u64) -> io::Result<u64> {
    let len = file.metadata()?.len();
    if lines == 0 {
        return Ok(len);
    }
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    // The file's last newline ends its last line; it does not start one.
    let mut newlines = 0u64;
    let mut first = true;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        for (i, b) in chunk.iter().enumerate().rev() {
            if *b != b'\n' {
                first = false;
                continue;
            }
            if first && start + i as u64 == len - 1 {
                first = false;
                continue;
            }
            newlines += 1;
            if newlines == lines {
                return Ok(start + i as u64 + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

/// Identity of a file, to see that a path now names another one (rotation).
fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// Writes records to the output as the options ask, counting bytes against the limit.
struct Printer<'a, W: Write> {
    out: &'a mut W,
    opts: &'a LogOptions,
    written: u64,
}

impl<W: Write> Printer<'_, W> {
    /// Prints one record line; false once the byte limit is reached.
    fn line(&mut self, line: &[u8]) -> io::Result<bool> {
        let Some(rec) = parse_record(line) else {
            // Not a CRI record (a file written by something else): skipped, as the kubelet does.
            return Ok(true);
        };
        if let Some(since) = self.opts.since
            && rec.time().is_some_and(|t| t < since)
        {
            return Ok(true);
        }
        if self.opts.timestamps {
            let time = match rec.time() {
                Some(t) => t.to_string(),
                None => rec.time.to_string(),
            };
            if !self.write(time.as_bytes())? || !self.write(b" ")? {
                return Ok(false);
            }
        }
        if !self.write(rec.body)? {
            return Ok(false);
        }
        if rec.full {
            return self.write(b"\n");
        }
        Ok(true)
    }

    fn write(&mut self, text: &[u8]) -> io::Result<bool> {
        let room = match self.opts.limit_bytes {
            Some(limit) => limit.saturating_sub(self.written),
            None => u64::MAX,
        };
        let n = (text.len() as u64).min(room) as usize;
        self.out.write_all(&text[..n])?;
        self.written += n as u64;
        Ok(self.opts.limit_bytes.is_none_or(|l| self.written < l))
    }
}

/// Opens a container's log for reading without following a link in its last component: the
/// log directory is the pod's, and a link planted there must not make berthd (root) read
/// another file of the host.
fn open_log(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Copies the log at `path` to `out` as `opts` asks and returns the bytes written. With
/// `follow`, keeps reading as the file grows and moves to the new file when the log is rotated,
/// until `running` says the container has ended and everything written is shown (or `out`
/// fails: the reader went away).
pub fn copy<W: Write>(
    path: &Path,
    opts: &LogOptions,
    out: &mut W,
    running: &mut dyn FnMut() -> bool,
) -> io::Result<u64> {
    let mut file = open_log(path)?;
    let start = match opts.tail_lines {
        Some(n) => tail_offset(&mut file, n)?,
        None => 0,
    };
    file.seek(SeekFrom::Start(start))?;
    let mut current = identity(&file.metadata()?);
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let mut printer = Printer {
        out,
        opts,
        written: 0,
    };
    let mut line = Vec::with_capacity(512);
    let mut last_check = Instant::now();
    loop {
        let n = reader.read_until(b'\n', &mut line)?;
        if n > 0 && line.last() == Some(&b'\n') {
            if !printer.line(&line)? {
                break;
            }
            line.clear();
            continue;
        }
        // At the end of what is written so far (a partial line stays in `line`).
        if !opts.follow {
            if !line.is_empty() && !printer.line(&line)? {
                break;
            }
            break;
        }
        printer.out.flush()?;
        if last_check.elapsed() >= FOLLOW_CHECK {
            last_check = Instant::now();
            if line.is_empty()
                && let Ok(meta) = std::fs::metadata(path)
                && identity(&meta) != current
            {
                // Rotated: the old file is read to its end; go on with the new one from its start.
                let file = open_log(path)?;
                current = identity(&file.metadata()?);
                reader = BufReader::with_capacity(64 * 1024, file);
                continue;
            }
            if !running() {
                // One more read: what the container wrote just before it ended.
                let n = reader.read_to_end(&mut line)?;
                if n > 0 || !line.is_empty() {
                    for l in line.split_inclusive(|b| *b == b'\n') {
                        if !printer.line(l)? {
                            break;
                        }
                    }
                }
                break;
            }
        }
        std::thread::sleep(FOLLOW_POLL);
    }
    printer.out.flush()?;
    Ok(printer.written)
}

/// Lines of a container's log read for its termination message (FallbackToLogsOnError), as
/// the kubelet.
pub const TERMINATION_TAIL_LINES: u64 = 80;
/// At most this many bytes (the last ones) of those lines make the message, as the kubelet.
pub const TERMINATION_TAIL_BYTES: usize = 2048;

/// The end of a container's log as its termination message: the text of the last
/// [`TERMINATION_TAIL_LINES`] records, of which the last [`TERMINATION_TAIL_BYTES`] bytes.
pub fn termination_tail(path: &Path) -> io::Result<String> {
    let opts = LogOptions {
        tail_lines: Some(TERMINATION_TAIL_LINES),
        ..Default::default()
    };
    let mut text = Vec::new();
    copy(path, &opts, &mut text, &mut || false)?;
    let from = text.len().saturating_sub(TERMINATION_TAIL_BYTES);
    Ok(String::from_utf8_lossy(&text[from..]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_log(lines: &[&str]) -> (tempfile_dir::Dir, std::path::PathBuf) {
        let dir = tempfile_dir::Dir::new();
        let path = dir.0.join("0.log");
        let mut text = String::new();
        for l in lines {
            text.push_str(l);
            text.push('\n');
        }
        std::fs::write(&path, text).expect("write log");
        (dir, path)
    }

    /// A scratch directory removed on drop (tests only).
    mod tempfile_dir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let mut raw = [0u8; 8];
                getrandom::fill(&mut raw).expect("random");
                let p = std::env::temp_dir().join(format!("berth-logs-{}", hex::encode(raw)));
                std::fs::create_dir_all(&p).expect("mkdir");
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    const LINES: [&str; 5] = [
        "2026-12-03T10:00:00.000000001Z stdout F one",
        "2026-12-03T10:00:01.500000000Z stderr F two",
        "2026-12-03T10:00:02.000000000Z stdout P thr",
        "2026-12-03T10:00:02.000000100Z stdout F ee",
        "2026-12-03T10:00:03.000000000Z stdout F four",
    ];

    fn read(opts: LogOptions) -> String {
        let (_d, path) = write_log(&LINES);
        let mut out = Vec::new();
        copy(&path, &opts, &mut out, &mut || false).expect("copy");
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn termination_tail_is_the_last_lines_last_bytes() {
        let (_d, path) = write_log(&LINES);
        assert_eq!(
            termination_tail(&path).expect("tail"),
            "one\ntwo\nthree\nfour\n"
        );
        let many: Vec<String> = (0..100)
            .map(|i| {
                format!(
                    "2026-12-03T10:00:00Z stdout F line {i:03} {}",
                    "x".repeat(40)
                )
            })
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let (_d, path) = write_log(&many);
        let tail = termination_tail(&path).expect("tail");
        assert_eq!(tail.len(), TERMINATION_TAIL_BYTES);
        assert!(
            tail.ends_with(&format!("line 099 {}\n", "x".repeat(40))),
            "{tail}"
        );
        // 80 lines of 50 bytes hold more than 2 KiB: 40 whole lines and the end of one more.
        assert!(
            tail.starts_with("ne 059 xxx") && tail.contains("line 060 "),
            "{tail}"
        );
        assert!(!tail.contains("line 059 "), "{tail}");
        // Short lines: the last 80 of them.
        let short: Vec<String> = (0..100)
            .map(|i| format!("2026-12-03T10:00:00Z stderr F {i}"))
            .collect();
        let short: Vec<&str> = short.iter().map(String::as_str).collect();
        let (_d, path) = write_log(&short);
        let tail = termination_tail(&path).expect("tail");
        assert!(
            tail.starts_with("20\n21\n") && tail.ends_with("99\n"),
            "{tail}"
        );
    }

    #[test]
    fn records_become_lines_and_partials_join() {
        assert_eq!(read(LogOptions::default()), "one\ntwo\nthree\nfour\n");
    }

    #[test]
    fn tail_counts_records_from_the_end() {
        let tail = |n| {
            read(LogOptions {
                tail_lines: Some(n),
                ..Default::default()
            })
        };
        assert_eq!(tail(1), "four\n");
        assert_eq!(tail(2), "ee\nfour\n");
        assert_eq!(tail(0), "");
        assert_eq!(tail(99), "one\ntwo\nthree\nfour\n");
    }

    #[test]
    fn since_and_timestamps_and_limit() {
        let since = "2026-12-03T10:00:01.5Z".parse().expect("time");
        assert_eq!(
            read(LogOptions {
                since: Some(since),
                ..Default::default()
            }),
            "two\nthree\nfour\n"
        );
        assert_eq!(
            read(LogOptions {
                timestamps: true,
                tail_lines: Some(1),
                ..Default::default()
            }),
            "2026-12-03T10:00:03Z four\n"
        );
        assert_eq!(
            read(LogOptions {
                limit_bytes: Some(6),
                ..Default::default()
            }),
            "one\ntw"
        );
    }

    #[test]
    fn a_last_line_without_newline_and_junk_lines() {
        let dir = tempfile_dir::Dir::new();
        let path = dir.0.join("0.log");
        std::fs::write(
            &path,
            "not a record\n2026-12-03T10:00:00Z stdout F a\n2026-12-03T10:00:00Z stdout P b",
        )
        .expect("write");
        let mut out = Vec::new();
        copy(&path, &LogOptions::default(), &mut out, &mut || false).expect("copy");
        assert_eq!(out, b"a\nb");
    }

    #[test]
    fn follow_reads_growth_and_the_rotated_file_until_the_container_ends() {
        let (dir, path) = write_log(&LINES[..2]);
        let rotated = dir.0.join("0.log.1");
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .expect("open");
                f.write_all(b"2026-12-03T10:00:05Z stdout F later\n")
                    .expect("append");
                std::fs::rename(&path, &rotated).expect("rotate");
                std::fs::write(&path, "2026-12-03T10:00:06Z stdout F new file\n")
                    .expect("new file");
            })
        };
        let started = Instant::now();
        let mut out = Vec::new();
        let opts = LogOptions {
            follow: true,
            ..Default::default()
        };
        // "Running" for 3 s: long enough for the writer and two rotation checks.
        copy(&path, &opts, &mut out, &mut || {
            started.elapsed() < Duration::from_secs(3)
        })
        .expect("copy");
        writer.join().expect("writer");
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            "one\ntwo\nlater\nnew file\n"
        );
    }
}
