//! CRI v0.36's pressure fields of the stats calls (`CpuUsage.psi`, `MemoryUsage.psi`,
//! `IoUsage`): each stats item is written as k8s-cri's message followed by its fields, which
//! the client merges into it. On cgroup v1, or without PSI, an item is k8s-cri's alone.

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;

use super::RuntimeApi;
use super::api_v136::{
    ContainerStatsExt, CpuUsageExt, IoUsage, LinuxPodSandboxStatsExt, MemoryUsageExt,
    PodSandboxStatsExt, PsiData, PsiStats,
};
use crate::metrics::psi::{self, CgroupPsi, Psi};

fn data(d: &psi::PsiData) -> PsiData {
    PsiData {
        total: d.total_us,
        avg10: d.avg10,
        avg60: d.avg60,
        avg300: d.avg300,
    }
}

fn stats(p: &Psi) -> Option<PsiStats> {
    Some(PsiStats {
        full: Some(data(&p.full)),
        some: Some(data(&p.some)),
    })
}

/// The pressure fields of one cgroup, stamped `timestamp` (the stats' own).
fn fields(p: &CgroupPsi, timestamp: i64) -> (CpuUsageExt, MemoryUsageExt, IoUsage) {
    (
        CpuUsageExt { psi: stats(&p.cpu) },
        MemoryUsageExt {
            psi: stats(&p.memory),
        },
        IoUsage {
            timestamp,
            psi: stats(&p.io),
        },
    )
}

/// A container's stats item, with its pressure where its cgroup has it.
pub fn container_item(api: &RuntimeApi, item: &cri::ContainerStats) -> Bytes {
    let mut out = item.encode_to_vec();
    let id = item.attributes.as_ref().map_or("", |a| a.id.as_str());
    let pressure = api
        .containers()
        .find(id)
        .ok()
        .and_then(|rec| api.stats.container_cgroup(&rec))
        .and_then(|path| psi::read(api.stats.layout(), &path));
    if let Some(p) = pressure {
        let timestamp = item.cpu.as_ref().map_or(0, |c| c.timestamp);
        let (cpu, memory, io) = fields(&p, timestamp);
        ContainerStatsExt {
            cpu: Some(cpu),
            memory: Some(memory),
            io: Some(io),
        }
        .encode_raw(&mut out);
    }
    Bytes::from(out)
}

/// A pod's stats item, with its own pressure and each container's. Its containers' items go
/// after k8s-cri's message (each with its fields), so k8s-cri's carries none of them.
pub fn pod_item(api: &RuntimeApi, mut item: cri::PodSandboxStats) -> Bytes {
    let Some(linux) = item.linux.as_mut() else {
        return Bytes::from(item.encode_to_vec());
    };
    let containers: Vec<Bytes> = std::mem::take(&mut linux.containers)
        .iter()
        .map(|c| container_item(api, c))
        .collect();
    let timestamp = linux.cpu.as_ref().map_or(0, |c| c.timestamp);
    let id = item.attributes.as_ref().map_or("", |a| a.id.as_str());
    let pressure = api
        .sandboxes()
        .find(id)
        .ok()
        .filter(|rec| !rec.cgroup_parent.is_empty())
        .and_then(|rec| psi::read(api.stats.layout(), &rec.cgroup_parent));
    let mut ext = LinuxPodSandboxStatsExt {
        containers,
        ..Default::default()
    };
    if let Some(p) = pressure {
        let (cpu, memory, io) = fields(&p, timestamp);
        ext.cpu = Some(cpu);
        ext.memory = Some(memory);
        ext.io = Some(io);
    }
    let mut out = item.encode_to_vec();
    PodSandboxStatsExt { linux: Some(ext) }.encode_raw(&mut out);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_containers_move_after_it_and_read_back_whole() {
        let container = cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: "c1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: "p1".into(),
                ..Default::default()
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                process: Some(cri::ProcessUsage {
                    timestamp: 5,
                    process_count: Some(cri::UInt64Value { value: 3 }),
                }),
                containers: vec![container.clone(), container.clone()],
                ..Default::default()
            }),
            windows: None,
        };
        // As pod_item writes it, without pressure: the pod without containers, then its
        // containers' items in the extension.
        let mut without = pod.clone();
        let items: Vec<Bytes> =
            std::mem::take(&mut without.linux.as_mut().expect("linux").containers)
                .iter()
                .map(|c| Bytes::from(c.encode_to_vec()))
                .collect();
        let mut bytes = without.encode_to_vec();
        PodSandboxStatsExt {
            linux: Some(LinuxPodSandboxStatsExt {
                containers: items,
                ..Default::default()
            }),
        }
        .encode_raw(&mut bytes);
        assert_eq!(
            cri::PodSandboxStats::decode(bytes.as_slice()).expect("decode"),
            pod,
            "a v0.32 reader sees the same pod stats"
        );
    }
}
