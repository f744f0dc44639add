//! Priming the kernel's cgroup-attach lock so a new container process joins its cgroups quickly.
//!
//! Moving a process into a cgroup (a write to `cgroup.procs`, on any hierarchy) takes one
//! system-wide lock for writing, and the first writer after a quiet spell waits for an RCU grace
//! period before it gets it (7–8 ms on a 2-core VM); writers that follow within about one more
//! grace period get it at once. The container's init joins its cgroups a few milliseconds into
//! CreateContainer, the pod init into the pod's cgroup a few into RunPodSandbox, an exec'd
//! process into the container's: each paid that wait on its own. A call that is about to move
//! a process (or, as RunPodSandbox, comes just before one that will) asks for the lock here,
//! in the background, by writing berthd's own pid into the cgroup it is already in (a move to
//! where it already is, which changes nothing), so the grace period runs while the call is
//! still preparing, and repeats the write every [`INTERVAL`] until [`HOLD`] after the last
//! call asked, so the lock stays quick to take in between. Nothing runs while no call asks.
//! Hosts that mount cgroups with `favordynmods` never wait, and there this costs cheap writes.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::cgroups::{CgroupMount, cgroup_mounts};

/// How long after the last [`prime`] the lock is kept quick to take.
const HOLD: Duration = Duration::from_millis(30);

/// Time between two writes while holding: well under one grace period.
const INTERVAL: Duration = Duration::from_millis(2);

/// Starts taking the cgroup-attach lock on the blocking pool and returns at once; a move into
/// a cgroup that follows within [`HOLD`] finds it quick to take. Needs a Tokio runtime.
pub fn prime() {
    static PRIMER: OnceLock<AttachPrimer> = OnceLock::new();
    PRIMER.get_or_init(AttachPrimer::detect).prime();
}

/// Takes the cgroup-attach lock ahead of moves; one blocking task at most.
#[derive(Debug)]
struct AttachPrimer {
    /// berthd's own `cgroup.procs` (None: not found, and priming does nothing).
    procs: Option<PathBuf>,
    hold: Mutex<Hold>,
}

/// Until when the lock is to be kept quick, and whether a task is doing it.
#[derive(Debug)]
struct Hold {
    until: Instant,
    running: bool,
}

impl AttachPrimer {
    /// Finds berthd's own cgroup from `/proc/self/cgroup` and `/proc/self/mountinfo`.
    fn detect() -> Self {
        let procs = match (
            std::fs::read_to_string("/proc/self/cgroup"),
            std::fs::read_to_string("/proc/self/mountinfo"),
        ) {
            (Ok(cgroup), Ok(mountinfo)) => own_procs_file(&cgroup, &mountinfo),
            _ => None,
        };
        match &procs {
            Some(p) => tracing::debug!(procs = %p.display(), "cgroup-attach priming through"),
            None => tracing::info!("berthd's own cgroup not found: cgroup-attach priming is off"),
        }
        Self {
            procs,
            hold: Mutex::new(Hold {
                until: Instant::now(),
                running: false,
            }),
        }
    }

    /// [`prime`]: extends the hold, and starts the task unless it runs.
    fn prime(&'static self) {
        let Some(procs) = &self.procs else { return };
        {
            let Ok(mut hold) = self.hold.lock() else {
                return;
            };
            hold.until = Instant::now() + HOLD;
            if hold.running {
                return;
            }
            hold.running = true;
        }
        tokio::task::spawn_blocking(move || {
            loop {
                if let Err(e) = Self::prime_now(procs) {
                    tracing::debug!(procs = %procs.display(), error = %e, "priming the cgroup-attach lock");
                }
                std::thread::sleep(INTERVAL);
                let Ok(mut hold) = self.hold.lock() else {
                    return;
                };
                if Instant::now() >= hold.until {
                    hold.running = false;
                    return;
                }
            }
        });
    }

    /// One write (an error only costs the head start, and is logged by the caller).
    fn prime_now(procs: &Path) -> std::io::Result<()> {
        std::fs::write(procs, std::process::id().to_string())
    }
}

/// berthd's `cgroup.procs` in one hierarchy: the unified one when mounted (as on pure v2 and
/// hybrid hosts), otherwise the first v1 hierarchy that is mounted. `cgroup` is
/// `/proc/self/cgroup`, `mountinfo` is `/proc/self/mountinfo`.
pub fn own_procs_file(cgroup: &str, mountinfo: &str) -> Option<PathBuf> {
    let mounts: Vec<CgroupMount> = cgroup_mounts(mountinfo).collect();
    // A line's hierarchy: cgroup2 for "0::", else the v1 mount whose options name every
    // controller of the line (or its `name=`).
    let mount_of = |controllers: &str| {
        mounts.iter().find(|m| {
            if controllers.is_empty() {
                m.v2
            } else {
                !m.v2
                    && controllers
                        .split(',')
                        .all(|c| m.options.split(',').any(|o| o == c))
            }
        })
    };
    let mut lines: Vec<(&str, &str)> = cgroup
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            Some((parts.next()?, parts.next()?))
        })
        .collect();
    // The unified hierarchy first.
    lines.sort_by_key(|(controllers, _)| !controllers.is_empty());
    lines.into_iter().find_map(|(controllers, path)| {
        let mount = mount_of(controllers)?;
        let rel = path.strip_prefix(mount.root)?.trim_start_matches('/');
        Some(Path::new(mount.point).join(rel).join("cgroup.procs"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn hybrid_hosts_prime_through_the_unified_hierarchy() {
        let cgroup = "4:memory:/a/b\n1:cpu:/\n0::/system.slice/berth.service\n";
        assert_eq!(
            own_procs_file(cgroup, HYBRID),
            Some(PathBuf::from(
                "/sys/fs/cgroup/unified/system.slice/berth.service/cgroup.procs"
            ))
        );
    }

    #[test]
    fn v1_only_hosts_use_a_mounted_v1_hierarchy() {
        let mountinfo: String = HYBRID.lines().take(3).map(|l| format!("{l}\n")).collect();
        let cgroup = "9:pids:/x\n4:memory:/a/b\n1:name=systemd:/s\n0::/\n";
        // pids is not mounted and there is no cgroup2 mount: memory is the first that is.
        assert_eq!(
            own_procs_file(cgroup, &mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/memory/a/b/cgroup.procs"))
        );
    }

    #[test]
    fn a_mount_of_a_subtree_is_followed_and_one_outside_it_is_not() {
        let mountinfo =
            "50 49 0:38 /kube/pod1 /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            own_procs_file("0::/kube/pod1/berthd\n", mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/berthd/cgroup.procs"))
        );
        assert_eq!(own_procs_file("0::/elsewhere\n", mountinfo), None);
    }

    #[tokio::test]
    async fn priming_runs_while_asked_and_stops_after_the_hold() {
        let primer: &'static AttachPrimer = Box::leak(Box::new(AttachPrimer::detect()));
        assert!(primer.procs.is_some(), "the test's own cgroup is found");
        let running = || primer.hold.lock().map(|h| h.running).unwrap_or(true);
        let until = || primer.hold.lock().map(|h| h.until).expect("hold");
        primer.prime();
        assert!(running(), "a task holds the lock after a call asks");
        let first = until();
        // Asking again while it runs extends the hold.
        tokio::time::sleep(INTERVAL).await;
        primer.prime();
        assert!(until() > first, "the second call extended the hold");
        let deadline = Instant::now() + HOLD * 20;
        while running() && Instant::now() < deadline {
            tokio::time::sleep(INTERVAL).await;
        }
        assert!(!running(), "nothing runs once no call asks");
    }

    #[test]
    fn the_primer_writes_to_its_own_cgroup_and_stays_there() {
        let before = std::fs::read_to_string("/proc/self/cgroup").expect("own cgroups");
        let primer = AttachPrimer::detect();
        let procs = primer
            .procs
            .as_ref()
            .expect("the test's own cgroup is found");
        AttachPrimer::prime_now(procs).expect("a move to where it already is");
        let after = std::fs::read_to_string("/proc/self/cgroup").expect("own cgroups");
        assert_eq!(after, before);
    }
}
