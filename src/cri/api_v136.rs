//! CRI messages and fields that cri-api added after v0.32 (Kubernetes 1.33–1.36) and the k8s-cri crate
//! does not define, written from the published API: their field numbers are the wire
//! interface. The streaming list calls need none: each `Stream*Request` has the wire shape of
//! its `List*Request` (the filter at 1) and each `Stream*Response` that of its
//! `List*Response` (the repeated items at 1), so those are served with the crate's types.

use k8s_cri::v1 as cri;

/// `runtime.v1.UpdatePodSandboxResourcesRequest`: the pod-level resources the kubelet has
/// just applied to the pod's cgroup (in-place resize).
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdatePodSandboxResourcesRequest {
    /// The sandbox.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// The pod's overhead (RuntimeClass).
    #[prost(message, optional, tag = "2")]
    pub overhead: Option<cri::LinuxContainerResources>,
    /// The pod's resources, overhead included.
    #[prost(message, optional, tag = "3")]
    pub resources: Option<cri::LinuxContainerResources>,
}

/// `runtime.v1.UpdatePodSandboxResourcesResponse`: empty.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdatePodSandboxResourcesResponse {}

/// The v0.36 fields of a CreateContainerRequest, read beside k8s-cri's message from the same
/// bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequestExt {
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfigExt>,
}

/// The v0.36 fields of a ContainerConfig.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfigExt {
    /// `Signal stop_signal = 18`: the signal StopContainer sends first (0: the runtime's
    /// default, the image's StopSignal or SIGTERM).
    #[prost(int32, tag = "18")]
    pub stop_signal: i32,
    /// `repeated Mount mounts = 7`, in the order of k8s-cri's.
    #[prost(message, repeated, tag = "7")]
    pub mounts: Vec<MountExt>,
}

/// The v0.36 fields of a Mount.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MountExt {
    /// `string image_sub_path = 10`: the directory of an image volume to mount, not its root.
    #[prost(string, tag = "10")]
    pub image_sub_path: String,
}

/// The v0.36 fields of a ContainerStatusResponse, written after k8s-cri's message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponseExt {
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatusExt>,
}

/// The v0.36 fields of a ContainerStatus.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusExt {
    /// `Signal stop_signal = 19`: the signal StopContainer sends first.
    #[prost(int32, tag = "19")]
    pub stop_signal: i32,
    /// `repeated Mount mounts = 14`, each already encoded: k8s-cri's Mount followed by its
    /// [`MountStatusExt`] (a repeated field's items cannot be merged item by item, so the
    /// mounts are written here and not in k8s-cri's message).
    #[prost(bytes = "vec", repeated, tag = "14")]
    pub mounts: Vec<Vec<u8>>,
}

/// The v0.36 fields of a Mount in a ContainerStatus.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MountStatusExt {
    /// `ImageSpec image = 9` (an image volume's).
    #[prost(message, optional, tag = "9")]
    pub image: Option<ImageSpecExt>,
    /// `string image_sub_path = 10`: the directory of the image volume mounted.
    #[prost(string, tag = "10")]
    pub image_sub_path: String,
}

/// The v0.36 fields of an ImageSpec.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpecExt {
    /// `string image_ref = 20`: the digest of the image an image volume mounts, in the form
    /// of the ContainerStatus's own `image_ref`.
    #[prost(string, tag = "20")]
    pub image_ref: String,
}

/// The v0.36 fields of a StatusResponse, written after k8s-cri's message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponseExt {
    #[prost(message, optional, tag = "4")]
    pub features: Option<RuntimeFeaturesExt>,
}

/// The v0.36 fields of RuntimeFeatures.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeFeaturesExt {
    /// `bool user_namespaces_host_network = 2`: pods with their own user namespace may use the
    /// host's network.
    #[prost(bool, tag = "2")]
    pub user_namespaces_host_network: bool,
}

/// `runtime.v1.PsiData`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PsiData {
    #[prost(uint64, tag = "1")]
    pub total: u64,
    #[prost(double, tag = "2")]
    pub avg10: f64,
    #[prost(double, tag = "3")]
    pub avg60: f64,
    #[prost(double, tag = "4")]
    pub avg300: f64,
}

/// `runtime.v1.PsiStats`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PsiStats {
    #[prost(message, optional, tag = "1")]
    pub full: Option<PsiData>,
    #[prost(message, optional, tag = "2")]
    pub some: Option<PsiData>,
}

/// The v0.36 field of CpuUsage.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CpuUsageExt {
    #[prost(message, optional, tag = "4")]
    pub psi: Option<PsiStats>,
}

/// The v0.36 field of MemoryUsage.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MemoryUsageExt {
    #[prost(message, optional, tag = "8")]
    pub psi: Option<PsiStats>,
}

/// `runtime.v1.IoUsage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IoUsage {
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(message, optional, tag = "2")]
    pub psi: Option<PsiStats>,
}

/// The v0.36 fields of ContainerStats, written after each item.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatsExt {
    #[prost(message, optional, tag = "2")]
    pub cpu: Option<CpuUsageExt>,
    #[prost(message, optional, tag = "3")]
    pub memory: Option<MemoryUsageExt>,
    #[prost(message, optional, tag = "6")]
    pub io: Option<IoUsage>,
}

/// The v0.36 fields of PodSandboxStats, written after each item: the pod's own pressure, and
/// its containers' stats items (each with its own fields), which k8s-cri's message then
/// leaves out.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatsExt {
    #[prost(message, optional, tag = "2")]
    pub linux: Option<LinuxPodSandboxStatsExt>,
}

/// The v0.36 fields of LinuxPodSandboxStats.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxStatsExt {
    #[prost(message, optional, tag = "1")]
    pub cpu: Option<CpuUsageExt>,
    #[prost(message, optional, tag = "2")]
    pub memory: Option<MemoryUsageExt>,
    /// `repeated ContainerStats containers = 5`, each item already encoded.
    #[prost(bytes = "bytes", repeated, tag = "5")]
    pub containers: Vec<bytes::Bytes>,
    #[prost(message, optional, tag = "6")]
    pub io: Option<IoUsage>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn the_update_request_keeps_its_published_field_numbers() {
        let req = UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: "p".into(),
            overhead: Some(cri::LinuxContainerResources {
                cpu_shares: 2,
                ..Default::default()
            }),
            resources: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 3,
                ..Default::default()
            }),
        };
        // id (1, bytes): 0x0a; overhead (2, message): 0x12; resources (3, message): 0x1a.
        let bytes = req.encode_to_vec();
        assert_eq!(&bytes[..3], &[0x0a, 1, b'p']);
        assert_eq!(bytes[3], 0x12);
        assert!(bytes.contains(&0x1a));
        assert_eq!(
            UpdatePodSandboxResourcesRequest::decode(bytes.as_slice()).expect("decode"),
            req
        );
    }
}
