//! The standard `process_*` metrics of Prometheus clients (CPU time, memory, descriptors,
//! threads, start time) for this process, read from `/proc/self` at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Reads `/proc/self` when encoded.
#[derive(Debug)]
pub struct ProcessCollector;

/// What `/proc/self/stat` and friends say.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: i64,
    pub virtual_bytes: i64,
    pub threads: i64,
    pub start_time_seconds: f64,
    pub open_fds: i64,
    pub max_fds: i64,
}

/// Fields of `/proc/<pid>/stat` after the command name: utime is the 14th field of the whole
/// line, so the 12th after `)` (state being the 1st).
fn parse_stat(
    stat: &str,
    ticks_per_s: f64,
    page_size: i64,
    boot_time: f64,
) -> Option<ProcessStats> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    Some(ProcessStats {
        cpu_seconds: (num(11)? + num(12)?) / ticks_per_s,
        threads: num(17)? as i64,
        start_time_seconds: boot_time + num(19)? / ticks_per_s,
        virtual_bytes: num(20)? as i64,
        resident_bytes: num(21)? as i64 * page_size,
        ..Default::default()
    })
}

/// This process's figures now.
pub fn read() -> Option<ProcessStats> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let boot_time = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok())?;
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let page = rustix::param::page_size() as i64;
    let mut s = parse_stat(&stat, ticks.max(1) as f64, page, boot_time)?;
    s.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as i64);
    s.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|l| super::cgroup_metrics::soft_open_files(&l))
        .map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX));
    Some(s)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        for (name, help, unit, value) in [
            (
                "process_resident_memory",
                "Resident memory size",
                Some(Unit::Bytes),
                s.resident_bytes,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size",
                Some(Unit::Bytes),
                s.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Open file descriptors",
                None,
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                s.max_fds,
            ),
            ("process_threads", "Threads of the process", None, s.threads),
        ] {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, unit.as_ref(), g.metric_type())?)?;
        }
        let start = ConstGauge::new(s.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Some(&Unit::Seconds),
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_parse_past_a_command_with_spaces() {
        let stat = "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 5000 104857600 2560 18446744073709551615";
        let s = parse_stat(stat, 100.0, 4096, 1_700_000_000.0).expect("parsed");
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.threads, 7);
        assert_eq!(s.start_time_seconds, 1_700_000_050.0);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.resident_bytes, 2560 * 4096);
    }

    #[test]
    fn this_process_reads() {
        let s = read().expect("/proc/self");
        assert!(
            s.resident_bytes > 0 && s.threads >= 1 && s.open_fds >= 3,
            "{s:?}"
        );
        assert!(s.max_fds >= s.open_fds);
    }
}
