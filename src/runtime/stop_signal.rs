//! The signal StopContainer sends first: the container config's `stop_signal` (CRI v0.34+),
//! else the image's `StopSignal`, else SIGTERM; and the CRI's `Signal` enum, whose values
//! number the signals by name, not as the kernel does.

/// The CRI `Signal` values 1 to 34 by name, each with its Linux number (the real-time
/// signals, 35 to 65, follow SIGRTMIN..SIGRTMAX in order).
const NAMED: [(&str, i32); 34] = [
    ("SIGABRT", libc::SIGABRT),
    ("SIGALRM", libc::SIGALRM),
    ("SIGBUS", libc::SIGBUS),
    ("SIGCHLD", libc::SIGCHLD),
    ("SIGCLD", libc::SIGCHLD),
    ("SIGCONT", libc::SIGCONT),
    ("SIGFPE", libc::SIGFPE),
    ("SIGHUP", libc::SIGHUP),
    ("SIGILL", libc::SIGILL),
    ("SIGINT", libc::SIGINT),
    ("SIGIO", libc::SIGIO),
    ("SIGIOT", libc::SIGIOT),
    ("SIGKILL", libc::SIGKILL),
    ("SIGPIPE", libc::SIGPIPE),
    ("SIGPOLL", libc::SIGPOLL),
    ("SIGPROF", libc::SIGPROF),
    ("SIGPWR", libc::SIGPWR),
    ("SIGQUIT", libc::SIGQUIT),
    ("SIGSEGV", libc::SIGSEGV),
    ("SIGSTKFLT", libc::SIGSTKFLT),
    ("SIGSTOP", libc::SIGSTOP),
    ("SIGSYS", libc::SIGSYS),
    ("SIGTERM", libc::SIGTERM),
    ("SIGTRAP", libc::SIGTRAP),
    ("SIGTSTP", libc::SIGTSTP),
    ("SIGTTIN", libc::SIGTTIN),
    ("SIGTTOU", libc::SIGTTOU),
    ("SIGURG", libc::SIGURG),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGUSR2", libc::SIGUSR2),
    ("SIGVTALRM", libc::SIGVTALRM),
    ("SIGWINCH", libc::SIGWINCH),
    ("SIGXCPU", libc::SIGXCPU),
    ("SIGXFSZ", libc::SIGXFSZ),
];

/// SIGRTMIN and SIGRTMAX as the C library and image tools number them (the kernel's first two
/// real-time signals are the C library's own).
const RTMIN: i32 = 34;
const RTMAX: i32 = 64;
/// The CRI value of SIGRTMIN; SIGRTMAX is this plus 30.
const CRI_RTMIN: i32 = 35;

/// SIGTERM, the default.
pub const DEFAULT: i32 = libc::SIGTERM;

/// The Linux signal a CRI `Signal` value names: None for RUNTIME_DEFAULT (0), an error for a
/// value the enum does not have.
pub fn from_cri(value: i32) -> Result<Option<i32>, String> {
    match value {
        0 => Ok(None),
        1..=34 => Ok(Some(NAMED[(value - 1) as usize].1)),
        CRI_RTMIN..=65 => Ok(Some(RTMIN + value - CRI_RTMIN)),
        _ => Err(format!("stop_signal {value} is not a CRI Signal value")),
    }
}

/// The CRI `Signal` value of a Linux signal (its first name where it has two); 0 if none.
pub fn to_cri(signal: i32) -> i32 {
    if (RTMIN..=RTMAX).contains(&signal) {
        return CRI_RTMIN + signal - RTMIN;
    }
    NAMED
        .iter()
        .position(|(_, n)| *n == signal)
        .map_or(0, |i| i as i32 + 1)
}

/// An image's `StopSignal`: a name with or without `SIG` (`SIGQUIT`, `quit`), `RTMIN+n`,
/// `RTMAX-n`, or a number.
pub fn parse(text: &str) -> Option<i32> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i32>() {
        return (1..=RTMAX).contains(&n).then_some(n);
    }
    let upper = t.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    let offset = |rest: &str| rest.parse::<i32>().ok();
    let rt = if name == "RTMIN" {
        Some(RTMIN)
    } else if name == "RTMAX" {
        Some(RTMAX)
    } else if let Some(n) = name.strip_prefix("RTMIN+").and_then(offset) {
        Some(RTMIN + n)
    } else {
        name.strip_prefix("RTMAX-")
            .and_then(offset)
            .map(|n| RTMAX - n)
    };
    if let Some(n) = rt {
        return (RTMIN..=RTMAX).contains(&n).then_some(n);
    }
    NAMED
        .iter()
        .find(|(n, _)| n.strip_prefix("SIG") == Some(name))
        .map(|(_, n)| *n)
}

/// The stop signal of a container: the one asked for, else the image's, else SIGTERM (an
/// image's signal that does not parse is logged and passed over).
pub fn resolve(requested: Option<i32>, image: &str) -> i32 {
    if let Some(s) = requested {
        return s;
    }
    if image.trim().is_empty() {
        return DEFAULT;
    }
    parse(image).unwrap_or_else(|| {
        tracing::warn!(
            stop_signal = image,
            "the image's StopSignal is not a signal: SIGTERM"
        );
        DEFAULT
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_values_map_to_linux_signals_and_back() {
        assert_eq!(from_cri(0), Ok(None));
        assert_eq!(from_cri(1), Ok(Some(libc::SIGABRT)));
        assert_eq!(from_cri(18), Ok(Some(libc::SIGQUIT)));
        assert_eq!(from_cri(23), Ok(Some(libc::SIGTERM)));
        assert_eq!(from_cri(34), Ok(Some(libc::SIGXFSZ)));
        assert_eq!(from_cri(35), Ok(Some(34)));
        assert_eq!(from_cri(65), Ok(Some(64)));
        assert!(from_cri(66).is_err());
        assert!(from_cri(-1).is_err());
        for v in 1..=65 {
            let s = from_cri(v).expect("value").expect("signal");
            let back = to_cri(s);
            assert_eq!(from_cri(back), Ok(Some(s)), "value {v}");
        }
        assert_eq!(to_cri(libc::SIGCHLD), 4, "the first of two names");
        assert_eq!(to_cri(libc::SIGQUIT), 18);
    }

    #[test]
    fn image_stop_signals_parse_as_docker_writes_them() {
        assert_eq!(parse("SIGQUIT"), Some(libc::SIGQUIT));
        assert_eq!(parse("quit"), Some(libc::SIGQUIT));
        assert_eq!(parse("SIGWINCH"), Some(libc::SIGWINCH));
        assert_eq!(parse("9"), Some(9));
        assert_eq!(parse("SIGRTMIN+3"), Some(37));
        assert_eq!(parse("RTMAX-1"), Some(63));
        assert_eq!(parse("SIGNOPE"), None);
        assert_eq!(parse("0"), None);
        assert_eq!(resolve(None, ""), libc::SIGTERM);
        assert_eq!(resolve(None, "SIGINT"), libc::SIGINT);
        assert_eq!(resolve(Some(libc::SIGUSR1), "SIGINT"), libc::SIGUSR1);
        assert_eq!(resolve(None, "bogus"), libc::SIGTERM);
    }
}
