//! Command-line arguments of `berth-shim`.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::error::ShimError;

pub const USAGE: &str = "usage: berth-shim --id ID --bundle DIR --socket PATH --log-path FILE \
                         --exit-file FILE --state-root DIR [--tty] [--stdin]";

/// Validated arguments; every path is absolute (libcontainer changes the working directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub id: String,
    pub bundle: PathBuf,
    pub socket: PathBuf,
    pub log_path: PathBuf,
    pub exit_file: PathBuf,
    pub state_root: PathBuf,
    pub tty: bool,
    pub stdin: bool,
    /// The container's cgroup is a systemd scope (`linux.cgroupsPath` is `slice:prefix:name`).
    pub systemd_cgroup: bool,
}

impl Args {
    pub fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<Self, ShimError> {
        let mut id = None;
        let mut paths: [Option<PathBuf>; 5] = Default::default();
        let names = [
            "--bundle",
            "--socket",
            "--log-path",
            "--exit-file",
            "--state-root",
        ];
        let (mut tty, mut stdin, mut systemd_cgroup) = (false, false, false);
        let mut it = argv.into_iter();
        while let Some(arg) = it.next() {
            let arg = arg
                .into_string()
                .map_err(|a| ShimError::Usage(format!("argument {a:?} is not UTF-8")))?;
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(OsString::from(v))),
                _ => (arg, None),
            };
            match flag.as_str() {
                "--tty" => tty = true,
                "--stdin" => stdin = true,
                "--systemd-cgroup" => systemd_cgroup = true,
                "--id" => {
                    let v = value(&flag, inline, &mut it)?;
                    id = Some(
                        v.into_string()
                            .map_err(|_| ShimError::Usage("--id is not UTF-8".to_string()))?,
                    );
                }
                f => {
                    let Some(i) = names.iter().position(|n| *n == f) else {
                        return Err(ShimError::Usage(format!("unknown argument {f}")));
                    };
                    let p = PathBuf::from(value(&flag, inline, &mut it)?);
                    if !p.is_absolute() {
                        return Err(ShimError::Usage(format!(
                            "{f} must be an absolute path, got {}",
                            p.display()
                        )));
                    }
                    paths[i] = Some(p);
                }
            }
        }
        let id = id.ok_or_else(|| ShimError::Usage("--id is required".to_string()))?;
        if id.is_empty()
            || id.len() > 128
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            || id.starts_with('.')
        {
            return Err(ShimError::Usage(format!(
                "invalid --id {id:?}: use 1-128 of [A-Za-z0-9_.-], not starting with '.'"
            )));
        }
        let mut taken = paths.into_iter().zip(names);
        let mut next = || {
            let (p, n) = taken.next().unwrap_or((None, "?"));
            p.ok_or_else(|| ShimError::Usage(format!("{n} is required")))
        };
        Ok(Self {
            id,
            bundle: next()?,
            socket: next()?,
            log_path: next()?,
            exit_file: next()?,
            state_root: next()?,
            tty,
            stdin,
            systemd_cgroup,
        })
    }
}

fn value(
    flag: &str,
    inline: Option<OsString>,
    it: &mut impl Iterator<Item = OsString>,
) -> Result<OsString, ShimError> {
    inline
        .or_else(|| it.next())
        .ok_or_else(|| ShimError::Usage(format!("{flag} needs a value")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, ShimError> {
        Args::parse(s.split_whitespace().map(OsString::from))
    }

    #[test]
    fn full_command_line() -> Result<(), ShimError> {
        let a = parse(
            "--id c1 --bundle /b --socket=/s.sock --log-path /l --exit-file /e --state-root /r --stdin",
        )?;
        assert_eq!(a.id, "c1");
        assert_eq!(a.socket, PathBuf::from("/s.sock"));
        assert_eq!(a.state_root, PathBuf::from("/r"));
        assert!(a.stdin && !a.tty);
        Ok(())
    }

    #[test]
    fn rejects_bad_input() {
        let base = "--bundle /b --socket /s --log-path /l --exit-file /e --state-root /r";
        assert!(parse(base).is_err(), "missing id");
        assert!(parse(&format!("--id ../x {base}")).is_err());
        assert!(parse(&format!("--id x {base} --bogus")).is_err());
        let rel = "--id x --bundle b --socket /s --log-path /l --exit-file /e --state-root /r";
        assert!(parse(rel).is_err(), "relative bundle");
        assert!(parse("--id x --bundle").is_err());
    }
}
