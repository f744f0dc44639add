//! Reads CPU, memory, swap and process statistics of one cgroup from cgroupfs (v1 or v2).
//!
//! Missing files (a container whose cgroup is not there yet, or is gone) give `None`, never an
//! error: stats are best effort and the caller reports zeros.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::runtime::cgroups::Layout;

/// At or above this a v1 limit means "no limit" (the kernel reports its page counter maximum).
const V1_UNLIMITED: u64 = 1 << 62;

/// Samples closer together than this reuse the previous rate instead of measuring noise.
const MIN_SAMPLE_GAP_NS: i64 = 100_000_000;

/// Memory figures of a cgroup, in bytes (faults are counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// All memory charged to the cgroup (page cache included).
    pub usage_bytes: u64,
    /// Usage minus inactive file pages: what the kubelet evicts on.
    pub working_set_bytes: u64,
    /// Anonymous memory.
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// The memory limit, when there is one.
    pub limit_bytes: Option<u64>,
}

impl MemoryStats {
    /// Room left below the limit, when limited.
    pub fn available_bytes(&self) -> Option<u64> {
        self.limit_bytes
            .map(|l| l.saturating_sub(self.working_set_bytes))
    }
}

/// Swap use of a cgroup, in bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwapStats {
    pub usage_bytes: u64,
    /// The swap limit (v2: swap alone; v1: derived from memory+swap minus memory), when limited.
    pub limit_bytes: Option<u64>,
}

impl SwapStats {
    /// Swap left below the limit, when limited.
    pub fn available_bytes(&self) -> Option<u64> {
        self.limit_bytes.map(|l| l.saturating_sub(self.usage_bytes))
    }
}

/// What one cgroup reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// Cumulative CPU time, nanoseconds.
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<MemoryStats>,
    pub swap: Option<SwapStats>,
    /// Processes (threads on v1 pids) in the cgroup and below.
    pub pids: Option<u64>,
}

/// The directory of `controller` (e.g. `memory`, `cpuacct`) for `cgroup_path`: on v1 the
/// hierarchy whose mount point is named after the controller (`cpu,cpuacct` counts for both);
/// on v2 the one unified directory.
pub fn controller_dir(layout: &Layout, controller: &str, cgroup_path: &str) -> Option<PathBuf> {
    let rel = cgroup_path.trim_start_matches('/');
    match layout {
        Layout::V2(root) => Some(root.join(rel)),
        Layout::V1(_) => layout.v1_hierarchy(controller).map(|r| r.join(rel)),
    }
}

/// Reads every statistic Berth reports for `cgroup_path`.
pub fn read(layout: &Layout, cgroup_path: &str) -> CgroupStats {
    read_with(layout, cgroup_path, true)
}

/// CPU, memory and swap of `cgroup_path`, without the process count (which, where the pids
/// controller has no counter, as at the root, means walking every cgroup below).
pub fn read_cpu_memory(layout: &Layout, cgroup_path: &str) -> CgroupStats {
    read_with(layout, cgroup_path, false)
}

fn read_with(layout: &Layout, cgroup_path: &str, pids: bool) -> CgroupStats {
    let dir = |c: &str| controller_dir(layout, c, cgroup_path);
    match layout {
        Layout::V2(_) => dir("").map(|d| read_v2(&d, pids)).unwrap_or_default(),
        Layout::V1(_) => read_v1(dir("cpuacct"), dir("memory"), pids.then(|| dir("pids"))),
    }
}

/// One cgroup directory, opened once so that each of its files is opened relative to it
/// (one path component to resolve instead of the whole cgroupfs path), and read without the
/// size query `std::fs::read_to_string` makes (cgroupfs sizes say nothing anyway).
pub(crate) struct Dir(Option<rustix::fd::OwnedFd>);

impl Dir {
    pub(crate) fn open(path: Option<&Path>) -> Self {
        use rustix::fs::{Mode, OFlags};
        Self(path.and_then(|p| {
            rustix::fs::open(
                p,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()
        }))
    }

    pub(crate) fn text(&self, name: &str) -> Option<String> {
        use rustix::fs::{Mode, OFlags};
        use std::io::Read;
        let dir = self.0.as_ref()?;
        let fd =
            rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
        let mut file = std::fs::File::from(fd);
        let mut out = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match file.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        String::from_utf8(out).ok()
    }

    pub(crate) fn u64(&self, name: &str) -> Option<u64> {
        self.text(name)?.trim().parse().ok()
    }
}

/// `pids`: `None` leaves the process count out; `Some(None)`: no pids hierarchy.
fn read_v1(
    cpuacct: Option<PathBuf>,
    memory: Option<PathBuf>,
    pids: Option<Option<PathBuf>>,
) -> CgroupStats {
    let mut out = CgroupStats {
        cpu_usage_ns: Dir::open(cpuacct.as_deref()).u64("cpuacct.usage"),
        ..Default::default()
    };
    let m = Dir::open(memory.as_deref());
    if let Some(usage) = m.u64("memory.usage_in_bytes") {
        let text = m.text("memory.stat").unwrap_or_default();
        let stat = parse_keyed(&text);
        let limit = m
            .text("memory.limit_in_bytes")
            .and_then(|t| parse_limit_v1(&t));
        out.memory = Some(memory_v1(usage, &stat, limit));
        if let Some(memsw) = m.u64("memory.memsw.usage_in_bytes") {
            let memsw_limit = m
                .text("memory.memsw.limit_in_bytes")
                .and_then(|t| parse_limit_v1(&t));
            out.swap = Some(swap_v1(usage, memsw, limit, memsw_limit));
        }
    }
    if let Some(pids) = pids {
        out.pids = Dir::open(pids.as_deref())
            .u64("pids.current")
            .or_else(|| memory.as_deref().and_then(count_procs));
    }
    out
}

fn read_v2(path: &Path, pids: bool) -> CgroupStats {
    let dir = Dir::open(Some(path));
    if dir.0.is_none() {
        return CgroupStats::default();
    }
    let mut out = CgroupStats {
        cpu_usage_ns: dir.text("cpu.stat").and_then(|t| cpu_v2(&parse_keyed(&t))),
        ..Default::default()
    };
    if let Some(current) = dir.u64("memory.current") {
        let text = dir.text("memory.stat").unwrap_or_default();
        let stat = parse_keyed(&text);
        let limit = dir.text("memory.max").and_then(|t| parse_limit_v2(&t));
        out.memory = Some(memory_v2(current, &stat, limit));
    }
    if let Some(swap) = dir.u64("memory.swap.current") {
        out.swap = Some(SwapStats {
            usage_bytes: swap,
            limit_bytes: dir.text("memory.swap.max").and_then(|t| parse_limit_v2(&t)),
        });
    }
    if pids {
        out.pids = dir.u64("pids.current").or_else(|| count_procs(path));
    }
    out
}

/// Processes in `dir` and every cgroup below it (for when the pids controller is off).
pub fn count_procs(dir: &Path) -> Option<u64> {
    if !dir.is_dir() {
        return None;
    }
    let mut n = 0u64;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
            n += t.lines().filter(|l| !l.trim().is_empty()).count() as u64;
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    Some(n)
}

/// The pids in `dir/cgroup.procs` and every cgroup below it.
pub fn procs(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        if let Ok(t) = std::fs::read_to_string(d.join("cgroup.procs")) {
            out.extend(t.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            stack.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out
}

/// `key value` lines (memory.stat, cpu.stat); lines that do not parse are skipped.
pub fn parse_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// A v1 limit file: `None` when unlimited or unreadable.
pub fn parse_limit_v1(text: &str) -> Option<u64> {
    let v: i64 = text.trim().parse().ok()?;
    u64::try_from(v).ok().filter(|v| *v < V1_UNLIMITED)
}

/// A v2 limit file (`max` or a number): `None` when unlimited or unreadable.
pub fn parse_limit_v2(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// v1 memory from `memory.usage_in_bytes`, `memory.stat` and the limit; the hierarchical
/// `total_*` counters are preferred (they include child cgroups, which a pod cgroup has).
pub fn memory_v1(usage: u64, stat: &HashMap<&str, u64>, limit: Option<u64>) -> MemoryStats {
    let get = |k: &str| {
        stat.get(format!("total_{k}").as_str())
            .or_else(|| stat.get(k))
            .copied()
            .unwrap_or(0)
    };
    MemoryStats {
        usage_bytes: usage,
        working_set_bytes: usage.saturating_sub(get("inactive_file")),
        rss_bytes: get("rss"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        limit_bytes: limit,
    }
}

/// v1 swap: memory+swap usage minus memory usage; the swap room is the memsw limit minus the
/// memory limit.
pub fn swap_v1(
    usage: u64,
    memsw_usage: u64,
    limit: Option<u64>,
    memsw_limit: Option<u64>,
) -> SwapStats {
    SwapStats {
        usage_bytes: memsw_usage.saturating_sub(usage),
        limit_bytes: memsw_limit.map(|ms| ms.saturating_sub(limit.unwrap_or(0))),
    }
}

/// v2 memory from `memory.current`, `memory.stat` and `memory.max`.
pub fn memory_v2(current: u64, stat: &HashMap<&str, u64>, limit: Option<u64>) -> MemoryStats {
    let get = |k: &str| stat.get(k).copied().unwrap_or(0);
    MemoryStats {
        usage_bytes: current,
        working_set_bytes: current.saturating_sub(get("inactive_file")),
        rss_bytes: get("anon"),
        page_faults: get("pgfault"),
        major_page_faults: get("pgmajfault"),
        limit_bytes: limit,
    }
}

/// v2 CPU time in nanoseconds from `cpu.stat`'s `usage_usec`.
pub fn cpu_v2(stat: &HashMap<&str, u64>) -> Option<u64> {
    stat.get("usage_usec").map(|u| u.saturating_mul(1000))
}

/// CPU use as a rate (nano-cores) between two `(unix ns, cumulative cpu ns)` samples.
pub fn nano_cores(prev: (i64, u64), cur: (i64, u64)) -> Option<u64> {
    let dt = u128::try_from(cur.0.checked_sub(prev.0)?)
        .ok()
        .filter(|d| *d > 0)?;
    let du = u128::from(cur.1.checked_sub(prev.1)?);
    u64::try_from(du * 1_000_000_000 / dt).ok()
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: i64,
    usage: u64,
    rate: Option<u64>,
}

/// Remembers the last CPU sample per container or pod so that each stats call can report
/// `usage_nano_cores` (the CRI gives only cumulative counters).
#[derive(Debug, Default)]
pub struct CpuSampler {
    last: Mutex<HashMap<String, Sample>>,
}

impl CpuSampler {
    /// Records `usage` (cumulative ns) at `now` for `key` and returns the rate since the previous
    /// sample; the first sample is measured from `since` (the start time; `0` = unknown).
    pub fn rate(&self, key: &str, now: i64, usage: u64, since: i64) -> Option<u64> {
        let mut last = match self.last.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let prev = last.get(key).copied();
        let rate = match prev {
            Some(p) if now - p.at < MIN_SAMPLE_GAP_NS => return p.rate,
            Some(p) if usage < p.usage => None, // the cgroup was recreated
            Some(p) => nano_cores((p.at, p.usage), (now, usage)),
            None if since > 0 => nano_cores((since, 0), (now, usage)),
            None => None,
        };
        last.insert(
            key.to_string(),
            Sample {
                at: now,
                usage,
                rate,
            },
        );
        rate
    }

    /// Forgets the samples of keys `keep` refuses (removed containers and pods).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut last = match self.last.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        last.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_STAT: &str = "\
cache 10117120
rss 6713344
inactive_file 12288
pgfault 95
pgmajfault 1
hierarchical_memory_limit 9223372036854771712
total_cache 20000000
total_rss 7000000
total_inactive_file 4000000
total_pgfault 200
total_pgmajfault 3
";

    const V2_STAT: &str = "\
anon 5242880
file 1048576
inactive_file 524288
active_file 524288
pgfault 1234
pgmajfault 5
";

    #[test]
    fn v1_memory_prefers_hierarchical_counters() {
        let stat = parse_keyed(V1_STAT);
        let m = memory_v1(30_000_000, &stat, parse_limit_v1("9223372036854771712\n"));
        assert_eq!(
            m,
            MemoryStats {
                usage_bytes: 30_000_000,
                working_set_bytes: 26_000_000,
                rss_bytes: 7_000_000,
                page_faults: 200,
                major_page_faults: 3,
                limit_bytes: None,
            }
        );
        assert_eq!(m.available_bytes(), None);
        let m = memory_v1(30_000_000, &stat, parse_limit_v1("50000000"));
        assert_eq!(m.available_bytes(), Some(24_000_000));
    }

    #[test]
    fn v1_memory_without_totals_and_working_set_never_underflows() {
        let stat = parse_keyed("rss 10\ninactive_file 500\npgfault 7\n");
        let m = memory_v1(100, &stat, None);
        assert_eq!(
            (m.working_set_bytes, m.rss_bytes, m.page_faults),
            (0, 10, 7)
        );
    }

    #[test]
    fn v1_swap_is_memsw_minus_memory() {
        let s = swap_v1(100, 150, Some(1000), Some(3000));
        assert_eq!(s.usage_bytes, 50);
        assert_eq!(s.limit_bytes, Some(2000));
        assert_eq!(s.available_bytes(), Some(1950));
        assert_eq!(swap_v1(100, 100, None, None).available_bytes(), None);
    }

    #[test]
    fn v2_memory_cpu_and_limits() {
        let stat = parse_keyed(V2_STAT);
        let m = memory_v2(8_000_000, &stat, parse_limit_v2("max\n"));
        assert_eq!(m.working_set_bytes, 8_000_000 - 524_288);
        assert_eq!(m.rss_bytes, 5_242_880);
        assert_eq!((m.page_faults, m.major_page_faults), (1234, 5));
        assert_eq!(m.limit_bytes, None);
        assert_eq!(parse_limit_v2("16777216\n"), Some(16_777_216));
        let cpu = parse_keyed("usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n");
        assert_eq!(cpu_v2(&cpu), Some(1_500_000));
        assert_eq!(cpu_v2(&HashMap::new()), None);
    }

    #[test]
    fn limits_parse() {
        assert_eq!(parse_limit_v1("-1"), None);
        assert_eq!(parse_limit_v1("garbage"), None);
        assert_eq!(parse_limit_v1("4096\n"), Some(4096));
    }

    #[test]
    fn nano_cores_is_a_rate() {
        // One full core for one second.
        assert_eq!(
            nano_cores((0, 0), (1_000_000_000, 1_000_000_000)),
            Some(1_000_000_000)
        );
        assert_eq!(
            nano_cores((0, 0), (2_000_000_000, 500_000_000)),
            Some(250_000_000)
        );
        assert_eq!(nano_cores((5, 0), (5, 10)), None);
        assert_eq!(nano_cores((0, 10), (5, 5)), None);
    }

    #[test]
    fn sampler_keeps_the_last_sample_per_key() {
        let s = CpuSampler::default();
        assert_eq!(s.rate("a", 1_000_000_000, 500_000_000, 0), None);
        assert_eq!(
            s.rate("a", 2_000_000_000, 1_000_000_000, 0),
            Some(500_000_000)
        );
        // Too close to the previous sample: the previous rate again.
        assert_eq!(
            s.rate("a", 2_000_000_001, 1_900_000_000, 0),
            Some(500_000_000)
        );
        // First sample of a started container: averaged since its start.
        assert_eq!(
            s.rate("b", 2_000_000_000, 1_000_000_000, 1_000_000_000),
            Some(1_000_000_000)
        );
        s.retain(|k| k == "b");
        assert_eq!(s.rate("a", 3_000_000_000, 1, 0), None);
    }

    #[test]
    fn controller_dirs_follow_mount_names() {
        let l = Layout::V1(vec![
            "/sys/fs/cgroup/cpu,cpuacct".into(),
            "/sys/fs/cgroup/memory".into(),
        ]);
        assert_eq!(
            controller_dir(&l, "cpuacct", "/kubepods/c1"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/kubepods/c1"))
        );
        assert_eq!(controller_dir(&l, "pids", "/kubepods/c1"), None);
        let l = Layout::V2("/sys/fs/cgroup".into());
        assert_eq!(
            controller_dir(&l, "memory", "c1"),
            Some(PathBuf::from("/sys/fs/cgroup/c1"))
        );
    }

    #[test]
    fn procs_are_counted_recursively() {
        let root = std::env::temp_dir().join(format!("berth-procs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("child")).expect("mkdir");
        std::fs::write(root.join("cgroup.procs"), "").expect("write");
        std::fs::write(root.join("child/cgroup.procs"), "12\n34\n").expect("write");
        assert_eq!(count_procs(&root), Some(2));
        let mut p = procs(&root);
        p.sort();
        assert_eq!(p, vec![12, 34]);
        assert_eq!(count_procs(&root.join("missing")), None);
        let _ = std::fs::remove_dir_all(root);
    }
}
