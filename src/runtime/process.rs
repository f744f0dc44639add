//! Host processes Berth watches (shims, container and pod inits): named by pid and start time,
//! and waited for through pidfds.

use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

/// A host process: pid and start time (clock ticks since boot), which together name it even
/// after its pid is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostProcess {
    pub pid: i32,
    pub start_time: u64,
}

impl HostProcess {
    /// The process `pid` with its current start time, if it exists.
    pub fn of(pid: i32) -> Option<Self> {
        start_time(pid).map(|start_time| Self { pid, start_time })
    }

    /// A process known to have ended already (no process has this start time).
    pub fn ended(pid: i32) -> Self {
        Self {
            pid,
            start_time: u64::MAX,
        }
    }

    /// Whether this exact process still exists (a zombie included).
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start_time)
    }

    /// Whether it runs: exists and is not a zombie waiting to be reaped.
    pub fn is_running(&self) -> bool {
        self.alive() && proc_state(self.pid).is_some_and(|s| s != 'Z' && s != 'X')
    }

    /// A pidfd on this exact process, or None when it is gone (its pid unused, or used by a
    /// newer process). The start time is checked after the pidfd is open: a pid is only reused
    /// by a younger process, so a match then proves the pidfd names this one.
    pub fn pidfd(&self) -> Option<Pidfd> {
        let pid = rustix::process::Pid::from_raw(self.pid)?;
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK).ok()?;
        if !self.alive() {
            return None;
        }
        Some(Pidfd(fd))
    }

    /// SIGKILLs it and waits until it no longer runs (at most 1 s); gone already is fine.
    /// For a PID namespace's init, the kernel ends the namespace's other processes with it.
    pub fn kill(&self) {
        if !self.alive() {
            return;
        }
        let Some(pid) = rustix::process::Pid::from_raw(self.pid) else {
            return;
        };
        if let Err(e) = rustix::process::kill_process(pid, rustix::process::Signal::KILL) {
            tracing::warn!(pid = self.pid, error = %e, "killing process");
            return;
        }
        for _ in 0..200 {
            if !self.is_running() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        tracing::warn!(pid = self.pid, "process did not die within 1 s of SIGKILL");
    }
}

/// A pidfd: readable once its process has exited.
#[derive(Debug)]
pub struct Pidfd(OwnedFd);

impl Pidfd {
    /// Waits until the process has exited (it may still be a zombie: its parent reaps it).
    pub async fn exited(self) -> std::io::Result<()> {
        // SAFETY: the AsyncFd takes the OwnedFd, which keeps the descriptor open and the same
        // for as long as the AsyncFd lives.
        let fd = unsafe { AsyncFd::register_with_interest(self.0, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        let _ready = fd.readable().await?;
        Ok(())
    }
}

/// Fields 3 onwards of `/proc/<pid>/stat` (after the command name).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Field 22 of `/proc/<pid>/stat`: start time in clock ticks since boot.
fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// Field 3 of `/proc/<pid>/stat`: R, S, D, Z, ...
fn proc_state(pid: i32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pidfd_turns_readable_when_its_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("spawn sleep");
        let pid = i32::try_from(child.id()).expect("pid");
        let process = HostProcess::of(pid).expect("the child exists");
        let fd = process.pidfd().expect("pidfd of a live child");
        let waited = tokio::time::timeout(std::time::Duration::from_secs(5), fd.exited()).await;
        assert!(matches!(waited, Ok(Ok(()))), "{waited:?}");
        // A zombie still exists under its pid and start time; once reaped it is gone.
        assert!(process.alive());
        assert!(!process.is_running());
        child.wait().expect("reap");
        assert!(!process.alive());
        assert!(process.pidfd().is_none());
    }

    #[test]
    fn another_start_time_is_another_process() {
        let me = HostProcess::of(std::process::id() as i32).expect("self");
        let other = HostProcess {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(me.pidfd().is_some());
        assert!(other.pidfd().is_none());
    }
}
