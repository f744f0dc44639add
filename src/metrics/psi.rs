//! Pressure stall information of a cgroup v2 directory with its averages, as CRI v0.36's
//! `PsiStats` report it (`cpu.pressure`, `memory.pressure`, `io.pressure`).

use crate::runtime::cgroups::Layout;

/// One line of a pressure file: the total stall time and its averages over 10, 60 and 300 s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PsiData {
    /// Microseconds stalled.
    pub total_us: u64,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

/// A pressure file: some tasks stalled, all tasks stalled.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Psi {
    pub some: PsiData,
    pub full: PsiData,
}

/// The three pressure files of one cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupPsi {
    pub cpu: Psi,
    pub memory: Psi,
    pub io: Psi,
}

/// Parses a pressure file (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0` and a `full` line);
/// a field that does not parse reads as 0.
pub fn parse(text: &str) -> Psi {
    let mut out = Psi::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let slot = match words.next() {
            Some("some") => &mut out.some,
            Some("full") => &mut out.full,
            _ => continue,
        };
        for w in words {
            let Some((key, value)) = w.split_once('=') else {
                continue;
            };
            match key {
                "total" => slot.total_us = value.parse().unwrap_or(0),
                "avg10" => slot.avg10 = value.parse().unwrap_or(0.0),
                "avg60" => slot.avg60 = value.parse().unwrap_or(0.0),
                "avg300" => slot.avg300 = value.parse().unwrap_or(0.0),
                _ => {}
            }
        }
    }
    out
}

/// The pressure of `cgroup_path`: None on cgroup v1, without PSI, or when the cgroup is gone.
pub fn read(layout: &Layout, cgroup_path: &str) -> Option<CgroupPsi> {
    let Layout::V2(_) = layout else {
        return None;
    };
    let dir = super::cgroup_stats::controller_dir(layout, "", cgroup_path)?;
    let file = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|t| parse(&t))
    };
    Some(CgroupPsi {
        cpu: file("cpu.pressure")?,
        memory: file("memory.pressure")?,
        io: file("io.pressure")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_files_parse_with_their_averages() {
        let p = parse(
            "some avg10=1.50 avg60=0.25 avg300=0.05 total=123456\n\
             full avg10=0.10 avg60=0.00 avg300=0.00 total=789\n",
        );
        assert_eq!(p.some.total_us, 123456);
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.avg60, 0.25);
        assert_eq!(p.some.avg300, 0.05);
        assert_eq!(p.full.total_us, 789);
        assert_eq!(p.full.avg10, 0.1);
        // cpu.pressure of older kernels has no full line.
        let cpu = parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n");
        assert_eq!(cpu.some.total_us, 5);
        assert_eq!(cpu.full, PsiData::default());
        assert_eq!(parse("garbage\nsome total=x\n").some.total_us, 0);
    }
}
