//! Berth: a container runtime for Kubernetes nodes.
