//! The full reading of one container cgroup behind the CRI metrics (cAdvisor's set): CPU
//! times and throttling, memory in detail, OOM kills, tasks, block I/O, pressure and the
//! cgroup's own limits, from cgroup v1 or v2 files. A file that is missing reads as `None`.

use std::collections::HashMap;
use std::path::Path;

use super::cgroup_stats::{self, Dir, parse_keyed};
use crate::runtime::cgroups::Layout;

/// Nanoseconds in one `USER_HZ` tick, the unit of v1 `cpuacct.stat` (100 Hz on Linux).
const NS_PER_USER_HZ_TICK: u64 = 10_000_000;

/// CPU time (nanoseconds) and CFS throttling.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub usage_ns: u64,
    pub user_ns: u64,
    pub system_ns: u64,
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
}

/// Memory of a cgroup in bytes (faults and limit hits are counts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryDetail {
    pub usage: u64,
    /// Peak usage (v1 `max_usage_in_bytes`, v2 `memory.peak`; 0 where the kernel keeps none).
    pub max_usage: u64,
    pub working_set: u64,
    pub rss: u64,
    pub cache: u64,
    pub mapped_file: u64,
    pub swap: u64,
    pub kernel: u64,
    /// Times the limit was hit (v1 only; 0 on v2).
    pub failcnt: u64,
    pub pgfault: u64,
    pub pgmajfault: u64,
    pub oom_kills: u64,
}

/// One block device's I/O counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIo {
    pub major: u32,
    pub minor: u32,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// Pressure stall totals (microseconds): `some` is time some tasks waited, `full` time all did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pressure {
    pub some_us: u64,
    pub full_us: u64,
}

/// The cgroup's own limits, as cAdvisor reports them: 0 means none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub cpu_period_us: u64,
    pub cpu_quota_us: u64,
    /// CPU shares (v2's `cpu.weight` converted back).
    pub cpu_shares: u64,
    pub memory_bytes: u64,
    pub memory_swap_bytes: u64,
    pub memory_reservation_bytes: u64,
    /// `pids.max`.
    pub tasks: u64,
}

/// Everything the CRI metrics report of one cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMetrics {
    pub cpu: Option<CpuTimes>,
    pub memory: Option<MemoryDetail>,
    /// Tasks (threads) in the cgroup.
    pub tasks: Option<u64>,
    pub io: Vec<DeviceIo>,
    /// CPU, memory and I/O pressure (cgroup v2 with PSI only).
    pub pressure: Option<[Pressure; 3]>,
    pub limits: CgroupLimits,
}

/// Reads the metrics of `cgroup_path`; `None` when its cgroup is gone (or was never made).
pub fn read(layout: &Layout, cgroup_path: &str) -> Option<CgroupMetrics> {
    let dir = |c: &str| cgroup_stats::controller_dir(layout, c, cgroup_path);
    let out = match layout {
        Layout::V2(_) => read_v2(&Dir::open(dir("").as_deref())),
        Layout::V1(_) => read_v1(&V1Dirs {
            cpu: Dir::open(dir("cpu").as_deref()),
            cpuacct: Dir::open(dir("cpuacct").as_deref()),
            memory: Dir::open(dir("memory").as_deref()),
            pids: Dir::open(dir("pids").as_deref()),
            blkio: Dir::open(dir("blkio").as_deref()),
        }),
    };
    (out.cpu.is_some() || out.memory.is_some()).then_some(out)
}

struct V1Dirs {
    cpu: Dir,
    cpuacct: Dir,
    memory: Dir,
    pids: Dir,
    blkio: Dir,
}

fn read_v1(d: &V1Dirs) -> CgroupMetrics {
    let cpu_stat_text = d.cpu.text("cpu.stat").unwrap_or_default();
    let throttling = parse_keyed(&cpu_stat_text);
    let cpu = d.cpuacct.u64("cpuacct.usage").map(|usage_ns| {
        let ticks_text = d.cpuacct.text("cpuacct.stat").unwrap_or_default();
        let ticks = parse_keyed(&ticks_text);
        let ns = |k: &str| {
            ticks
                .get(k)
                .map_or(0, |t| t.saturating_mul(NS_PER_USER_HZ_TICK))
        };
        CpuTimes {
            usage_ns,
            user_ns: ns("user"),
            system_ns: ns("system"),
            periods: get(&throttling, "nr_periods"),
            throttled_periods: get(&throttling, "nr_throttled"),
            throttled_ns: get(&throttling, "throttled_time"),
        }
    });
    let memory = d.memory.u64("memory.usage_in_bytes").map(|usage| {
        let text = d.memory.text("memory.stat").unwrap_or_default();
        let stat = parse_keyed(&text);
        // The hierarchical counters include child cgroups; a flat cgroup has only the plain ones.
        let total = |k: &str| {
            stat.get(format!("total_{k}").as_str())
                .or_else(|| stat.get(k))
                .copied()
                .unwrap_or(0)
        };
        let oom_text = d.memory.text("memory.oom_control").unwrap_or_default();
        MemoryDetail {
            usage,
            max_usage: d.memory.u64("memory.max_usage_in_bytes").unwrap_or(0),
            working_set: usage.saturating_sub(total("inactive_file")),
            rss: total("rss"),
            cache: total("cache"),
            mapped_file: total("mapped_file"),
            swap: total("swap"),
            kernel: d.memory.u64("memory.kmem.usage_in_bytes").unwrap_or(0),
            failcnt: d.memory.u64("memory.failcnt").unwrap_or(0),
            pgfault: total("pgfault"),
            pgmajfault: total("pgmajfault"),
            oom_kills: get(&parse_keyed(&oom_text), "oom_kill"),
        }
    });
    let limits = CgroupLimits {
        cpu_period_us: d.cpu.u64("cpu.cfs_period_us").unwrap_or(0),
        cpu_quota_us: limit_v1(d.cpu.text("cpu.cfs_quota_us")),
        cpu_shares: d.cpu.u64("cpu.shares").unwrap_or(0),
        memory_bytes: limit_v1(d.memory.text("memory.limit_in_bytes")),
        memory_swap_bytes: limit_v1(d.memory.text("memory.memsw.limit_in_bytes")),
        memory_reservation_bytes: limit_v1(d.memory.text("memory.soft_limit_in_bytes")),
        tasks: limit_v1(d.pids.text("pids.max")),
    };
    let io = blkio_v1(
        &d.blkio
            .text("blkio.throttle.io_service_bytes_recursive")
            .unwrap_or_default(),
        &d.blkio
            .text("blkio.throttle.io_serviced_recursive")
            .unwrap_or_default(),
    );
    CgroupMetrics {
        cpu,
        memory,
        tasks: d.pids.u64("pids.current"),
        io,
        pressure: None,
        limits,
    }
}

fn read_v2(d: &Dir) -> CgroupMetrics {
    let cpu = d.text("cpu.stat").map(|t| {
        let s = parse_keyed(&t);
        let ns = |k: &str| get(&s, k).saturating_mul(1000);
        CpuTimes {
            usage_ns: ns("usage_usec"),
            user_ns: ns("user_usec"),
            system_ns: ns("system_usec"),
            periods: get(&s, "nr_periods"),
            throttled_periods: get(&s, "nr_throttled"),
            throttled_ns: ns("throttled_usec"),
        }
    });
    let memory = d.u64("memory.current").map(|usage| {
        let text = d.text("memory.stat").unwrap_or_default();
        let s = parse_keyed(&text);
        let events = d.text("memory.events").unwrap_or_default();
        MemoryDetail {
            usage,
            max_usage: d.u64("memory.peak").unwrap_or(0),
            working_set: usage.saturating_sub(get(&s, "inactive_file")),
            rss: get(&s, "anon"),
            cache: get(&s, "file"),
            mapped_file: get(&s, "file_mapped"),
            swap: d.u64("memory.swap.current").unwrap_or(0),
            kernel: get(&s, "kernel"),
            failcnt: 0,
            pgfault: get(&s, "pgfault"),
            pgmajfault: get(&s, "pgmajfault"),
            oom_kills: get(&parse_keyed(&events), "oom_kill"),
        }
    });
    let (quota, period) = d
        .text("cpu.max")
        .map(|t| parse_cpu_max(&t))
        .unwrap_or((0, 0));
    let limits = CgroupLimits {
        cpu_period_us: period,
        cpu_quota_us: quota,
        cpu_shares: d.u64("cpu.weight").map_or(0, shares_from_weight),
        memory_bytes: limit_v2(d.text("memory.max")),
        memory_swap_bytes: limit_v2(d.text("memory.swap.max")),
        memory_reservation_bytes: limit_v2(d.text("memory.min")),
        tasks: limit_v2(d.text("pids.max")),
    };
    let pressure = ["cpu.pressure", "memory.pressure", "io.pressure"]
        .map(|f| d.text(f).map(|t| parse_pressure(&t)));
    let pressure = match pressure {
        [Some(c), Some(m), Some(i)] => Some([c, m, i]),
        _ => None,
    };
    CgroupMetrics {
        cpu,
        memory,
        tasks: d.u64("pids.current"),
        io: io_v2(&d.text("io.stat").unwrap_or_default()),
        pressure,
        limits,
    }
}

fn get(map: &HashMap<&str, u64>, key: &str) -> u64 {
    map.get(key).copied().unwrap_or(0)
}

/// A v1 limit (`-1` or the page counter's maximum mean none) as cAdvisor reports it: 0 for none.
fn limit_v1(text: Option<String>) -> u64 {
    text.and_then(|t| cgroup_stats::parse_limit_v1(&t))
        .unwrap_or(0)
}

/// A v2 limit (`max` means none): 0 for none.
fn limit_v2(text: Option<String>) -> u64 {
    text.and_then(|t| cgroup_stats::parse_limit_v2(&t))
        .unwrap_or(0)
}

/// `cpu.max`: `$QUOTA $PERIOD` with `max` for no quota; returns (quota, period), 0 for none.
pub fn parse_cpu_max(text: &str) -> (u64, u64) {
    let mut parts = text.split_whitespace();
    let quota = parts.next().and_then(|q| q.parse().ok()).unwrap_or(0);
    let period = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (quota, period)
}

/// CPU shares from a v2 `cpu.weight`: the inverse of the kubelet's shares-to-weight mapping
/// (`weight = 1 + (shares - 2) * 9999 / 262142`), as cAdvisor reports it.
pub fn shares_from_weight(weight: u64) -> u64 {
    if weight == 0 {
        return 0;
    }
    2 + (weight - 1) * 262_142 / 9_999
}

/// A PSI file: `some avg10=… total=N` and `full … total=N` lines.
pub fn parse_pressure(text: &str) -> Pressure {
    let mut out = Pressure::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let kind = words.next();
        let total = words
            .find_map(|w| w.strip_prefix("total="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        match kind {
            Some("some") => out.some_us = total,
            Some("full") => out.full_us = total,
            _ => {}
        }
    }
    out
}

/// v1 `blkio.throttle.io_service_bytes_recursive` and `…io_serviced_recursive`:
/// `MAJ:MIN Op N` lines (and a `Total N` line, skipped).
pub fn blkio_v1(bytes: &str, ops: &str) -> Vec<DeviceIo> {
    let mut devices: Vec<DeviceIo> = Vec::new();
    let mut add = |text: &str, counts_bytes: bool| {
        for line in text.lines() {
            let mut w = line.split_whitespace();
            let (Some(dev), Some(op), Some(n)) = (w.next(), w.next(), w.next()) else {
                continue;
            };
            let Some((major, minor)) = parse_dev(dev) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else {
                continue;
            };
            let i = match devices
                .iter()
                .position(|d| d.major == major && d.minor == minor)
            {
                Some(i) => i,
                None => {
                    devices.push(DeviceIo {
                        major,
                        minor,
                        ..Default::default()
                    });
                    devices.len() - 1
                }
            };
            let d = &mut devices[i];
            match (op, counts_bytes) {
                ("Read", true) => d.read_bytes = n,
                ("Write", true) => d.write_bytes = n,
                ("Read", false) => d.reads = n,
                ("Write", false) => d.writes = n,
                _ => {}
            }
        }
    };
    add(bytes, true);
    add(ops, false);
    devices
}

/// v2 `io.stat`: `MAJ:MIN rbytes=… wbytes=… rios=… wios=… …` lines.
pub fn io_v2(text: &str) -> Vec<DeviceIo> {
    text.lines()
        .filter_map(|line| {
            let mut w = line.split_whitespace();
            let (major, minor) = parse_dev(w.next()?)?;
            let mut d = DeviceIo {
                major,
                minor,
                ..Default::default()
            };
            for kv in w {
                let Some((k, v)) = kv.split_once('=') else {
                    continue;
                };
                let v = v.parse().unwrap_or(0);
                match k {
                    "rbytes" => d.read_bytes = v,
                    "wbytes" => d.write_bytes = v,
                    "rios" => d.reads = v,
                    "wios" => d.writes = v,
                    _ => {}
                }
            }
            Some(d)
        })
        .collect()
}

fn parse_dev(dev: &str) -> Option<(u32, u32)> {
    let (major, minor) = dev.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Processes of the cgroup (for the per-process counts), from the first hierarchy that has
/// the cgroup.
pub fn pids(layout: &Layout, cgroup_path: &str) -> Vec<u32> {
    ["pids", "memory", "cpu"]
        .iter()
        .filter_map(|c| cgroup_stats::controller_dir(layout, c, cgroup_path))
        .find(|d| d.is_dir())
        .map(|d| cgroup_stats::procs(&d))
        .unwrap_or_default()
}

/// Open file descriptors and sockets of `pids` (processes that are gone count nothing), and
/// the soft open-files limit of the first of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessCounts {
    pub fds: u64,
    pub sockets: u64,
    pub max_open_files: Option<u64>,
}

/// Counts the descriptors of `pids` under `/proc`.
pub fn process_counts(pids: &[u32]) -> ProcessCounts {
    let mut out = ProcessCounts::default();
    for pid in pids {
        let dir = Path::new("/proc").join(pid.to_string());
        let Ok(entries) = std::fs::read_dir(dir.join("fd")) else {
            continue;
        };
        for entry in entries.flatten() {
            out.fds += 1;
            if std::fs::read_link(entry.path())
                .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"socket:"))
            {
                out.sockets += 1;
            }
        }
        if out.max_open_files.is_none() {
            out.max_open_files = std::fs::read_to_string(dir.join("limits"))
                .ok()
                .and_then(|t| soft_open_files(&t));
        }
    }
    out
}

/// The soft limit of the `Max open files` line of `/proc/<pid>/limits` (None when unlimited).
pub fn soft_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_and_weight() {
        assert_eq!(parse_cpu_max("20000 100000\n"), (20000, 100000));
        assert_eq!(parse_cpu_max("max 100000\n"), (0, 100000));
        // The kubelet writes weight 39 for 1024 shares; the inverse loses the rounding.
        assert_eq!(shares_from_weight(39), 998);
        assert_eq!(shares_from_weight(1), 2);
        assert_eq!(shares_from_weight(10000), 262_144);
    }

    #[test]
    fn pressure_totals() {
        let p = parse_pressure(
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=56\n",
        );
        assert_eq!(
            p,
            Pressure {
                some_us: 1234,
                full_us: 56
            }
        );
    }

    #[test]
    fn blkio_v1_merges_bytes_and_ops_per_device() {
        let bytes = "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 0\n8:16 Read 10\nTotal 12298\n";
        let ops = "8:0 Read 1\n8:0 Write 2\n";
        let d = blkio_v1(bytes, ops);
        assert_eq!(d.len(), 2);
        assert_eq!(
            d[0],
            DeviceIo {
                major: 8,
                minor: 0,
                read_bytes: 4096,
                write_bytes: 8192,
                reads: 1,
                writes: 2
            }
        );
        assert_eq!((d[1].major, d[1].minor, d[1].read_bytes), (8, 16, 10));
    }

    #[test]
    fn io_stat_v2() {
        let d = io_v2("254:0 rbytes=100 wbytes=200 rios=3 wios=4 dbytes=0 dios=0\n");
        assert_eq!(
            d,
            vec![DeviceIo {
                major: 254,
                minor: 0,
                read_bytes: 100,
                write_bytes: 200,
                reads: 3,
                writes: 4
            }]
        );
    }

    #[test]
    fn open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max open files            1024                 524288               files     \n";
        assert_eq!(soft_open_files(limits), Some(1024));
        assert_eq!(
            soft_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }

    #[test]
    fn this_process_has_descriptors() {
        let counts = process_counts(&[std::process::id()]);
        assert!(counts.fds >= 3, "{counts:?}");
        assert!(counts.max_open_files.is_some());
        assert_eq!(process_counts(&[u32::MAX]), ProcessCounts::default());
    }
}
