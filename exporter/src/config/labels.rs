//! `[labels]`: which labels the per-process series carry. Serde types and defaults
//! only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which labels the per-process series carry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LabelsConfig {
    /// Adds a `pid` label (one series per process: unbounded, so off by default).
    pub(crate) pid: bool,
    /// Adds `pod_uid` and `container_id` parsed from Kubernetes cgroup paths.
    pub(crate) kubernetes_ids: bool,
}

impl Default for LabelsConfig {
    fn default() -> Self {
        Self {
            pid: false,
            kubernetes_ids: true,
        }
    }
}
