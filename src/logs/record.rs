//! One line of a CRI log file: `<RFC 3339 time> <stdout|stderr> <F|P> <text>`.

use k8s_openapi::jiff::Timestamp;

/// A parsed record, borrowing from its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The time as written.
    pub time: &'a str,
    /// `stdout` or `stderr`.
    pub stream: &'a str,
    /// Whether the text ended a line (`F`) or is part of a longer one (`P`).
    pub full: bool,
    /// The text, without the line's newline.
    pub body: &'a [u8],
}

impl Record<'_> {
    /// The record's time, if it parses.
    pub fn time(&self) -> Option<Timestamp> {
        self.time.parse().ok()
    }
}

/// Parses one line (with or without its newline); None when it is not a CRI record.
pub fn parse_record(line: &[u8]) -> Option<Record<'_>> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut fields = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(fields.next()?).ok()?;
    let stream = std::str::from_utf8(fields.next()?).ok()?;
    if stream != "stdout" && stream != "stderr" {
        return None;
    }
    let full = match fields.next()? {
        b"F" => true,
        b"P" => false,
        _ => return None,
    };
    let body = fields.next().unwrap_or_default();
    Some(Record {
        time,
        stream,
        full,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_partial_and_empty_records() {
        let r = parse_record(b"2026-12-03T10:00:00.5Z stderr F hello world\n").expect("record");
        assert_eq!(
            (r.time, r.stream, r.full, r.body),
            (
                "2026-12-03T10:00:00.5Z",
                "stderr",
                true,
                &b"hello world"[..]
            )
        );
        assert_eq!(
            r.time().map(|t| t.as_millisecond()),
            Some(1_796_292_000_500)
        );
        let p = parse_record(b"2026-12-03T10:00:00Z stdout P ").expect("partial");
        assert!(!p.full);
        assert!(p.body.is_empty());
        assert!(parse_record(b"2026-12-03T10:00:00Z stdout F").is_some());
    }

    #[test]
    fn refuses_what_is_not_a_record() {
        for bad in [
            &b""[..],
            b"hello",
            b"2026-12-03T10:00:00Z stdin F x",
            b"2026-12-03T10:00:00Z stdout X x",
        ] {
            assert!(parse_record(bad).is_none(), "{bad:?}");
        }
    }
}
