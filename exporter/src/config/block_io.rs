//! `[block_io]`: the block I/O collector. Serde types and defaults
//! only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Block I/O per cgroup, process, device and operation: bytes, requests and latency, from the
/// block layer's issue and completion tracepoints.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct BlockIoConfig {
    /// Loads the block I/O probes and exports `sysscope_block_io_*`.
    pub(crate) enabled: bool,
    /// Adds `cgroup` to the block latency histogram (one histogram per cgroup, device and op).
    pub(crate) latency_by_cgroup: bool,
    /// Requests in flight the kernel can track at once.
    #[schemars(range(min = 64, max = 1_048_576))]
    pub(crate) max_inflight: u32,
    /// (cgroup, process, device, op) entries in the kernel map.
    #[schemars(range(min = 16, max = 1_048_576))]
    pub(crate) max_entries: u32,
    /// The issue and the completion tracepoint, in that order (raw tracepoints with the
    /// prototypes of `block_rq_issue` and `block_rq_complete`). For testing fault handling;
    /// the defaults are right.
    #[schemars(length(min = 2, max = 2))]
    pub(crate) tracepoints: Vec<String>,
}

impl Default for BlockIoConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            latency_by_cgroup: false,
            max_inflight: 16_384,
            max_entries: 8_192,
            tracepoints: vec!["block_rq_issue".into(), "block_rq_complete".into()],
        }
    }
}
