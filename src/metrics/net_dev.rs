//! Interface counters of a network namespace, from `/proc/<pid>/net/dev` of a process in it.

use std::path::Path;

/// One interface's receive and transmit counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// The interfaces of the network namespace `pid` is in, `lo` left out; `None` when the process
/// is gone.
pub fn read(pid: u32) -> Option<Vec<InterfaceCounters>> {
    let text =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("net/dev")).ok()?;
    Some(parse(&text))
}

/// Parses `/proc/net/dev` (two header lines, then `name: rx… tx…`), skipping `lo`.
pub fn parse(text: &str) -> Vec<InterfaceCounters> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            if f.len() < 12 {
                return None;
            }
            Some(InterfaceCounters {
                name: name.to_string(),
                rx_bytes: f[0],
                rx_packets: f[1],
                rx_errors: f[2],
                rx_dropped: f[3],
                tx_bytes: f[8],
                tx_packets: f[9],
                tx_errors: f[10],
                tx_dropped: f[11],
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
  eth0:    5000      40    2    1    0     0          0         0     7000      50    3    4    0     0       0          0
";

    #[test]
    fn parses_every_counter_without_lo() {
        assert_eq!(
            parse(NET_DEV),
            vec![InterfaceCounters {
                name: "eth0".into(),
                rx_bytes: 5000,
                rx_packets: 40,
                rx_errors: 2,
                rx_dropped: 1,
                tx_bytes: 7000,
                tx_packets: 50,
                tx_errors: 3,
                tx_dropped: 4,
            }]
        );
    }

    #[test]
    fn short_or_garbled_lines_are_skipped() {
        assert!(parse("h1\nh2\neth0: 1 2 3\nnonsense\n").is_empty());
    }
}
