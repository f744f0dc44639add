//! Keeps the idle shim small: drops the page-table entries of file pages it no longer uses.
//!
//! Creating a container runs a lot of libcontainer code once; its text and read-only data
//! pages stay mapped and count in VmRSS although the idle event loop never touches them
//! again. For a file mapping that is not writable and holds no copied-on-write page (smaps
//! `Anonymous: 0`), every resident page is an unmodified page-cache page: `MADV_DONTNEED`
//! discards nothing, and the next use faults the same bytes back in from the page cache
//! (which all shims share). Relocated (RELRO) and writable mappings are left alone.

use std::fs;

/// A mapping that may be trimmed.
fn candidate(header: &str) -> Option<(usize, usize)> {
    let mut fields = header.split_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    let path = fields.nth(3)?;
    // Private, not writable, backed by a file.
    if !path.starts_with('/') || perms.as_bytes().get(1) != Some(&b'-') || !perms.ends_with('p') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        usize::from_str_radix(start, 16).ok()?,
        usize::from_str_radix(end, 16).ok()?,
    ))
}

/// The mappings of `smaps` that are safe to trim: read-only private file mappings without
/// any anonymous (copied-on-write) page.
fn trimmable(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    let mut is_header = true;
    for line in smaps.lines() {
        // A mapping header starts with a hex range; field lines start with "Name:".
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            current = candidate(line);
            is_header = true;
            continue;
        }
        if is_header && let Some(v) = line.strip_prefix("Anonymous:") {
            is_header = false;
            if v.trim().trim_end_matches("kB").trim() == "0"
                && let Some(range) = current.take()
            {
                out.push(range);
            }
        }
    }
    out
}

/// Releases clean file pages and free heap; call after libcontainer work is done.
pub fn trim() {
    let Ok(smaps) = fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    for (start, end) in trimmable(&smaps) {
        // SAFETY: [start, end) is a private, non-writable file mapping of this process with no
        // copied-on-write page (from /proc/self/smaps). MADV_DONTNEED therefore discards no
        // data: later accesses re-read identical contents from the mapped file. Nothing maps
        // or unmaps memory concurrently (the shim is single-threaded).
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
    // SAFETY: malloc_trim only returns free heap memory to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clean_read_only_file_mappings() {
        let smaps = "\
1000-2000 r--p 00000000 08:01 12 /usr/bin/x
Rss:                 8 kB
Anonymous:           0 kB
2000-3000 r-xp 00001000 08:01 12 /usr/bin/x
Anonymous:           0 kB
3000-4000 r--p 00002000 08:01 12 /usr/bin/x
Anonymous:           4 kB
4000-5000 rw-p 00003000 08:01 12 /usr/bin/x
Anonymous:           0 kB
5000-6000 rw-p 00000000 00:00 0 
Anonymous:           4 kB
6000-7000 r-xp 00000000 00:00 0 [vdso]
Anonymous:           0 kB
7000-8000 r--s 00000000 08:01 13 /dev/shm/y
Anonymous:           0 kB
";
        assert_eq!(trimmable(smaps), vec![(0x1000, 0x2000), (0x2000, 0x3000)]);
    }

    #[test]
    fn trimming_this_process_is_harmless() {
        trim();
        assert_eq!(format!("{}", 40 + 2), "42");
    }
}
