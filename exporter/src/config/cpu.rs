//! `[cpu]`: the CPU collector. Serde types and defaults
//! only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// CPU time per CPU and mode from `/proc/stat`, frequencies, and CPU time per cgroup.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct CpuConfig {
    /// Exports the node's CPU metrics (`sysscope_cpu_*`).
    pub(crate) enabled: bool,
    /// Adds `sysscope_cgroup_cpu_seconds_total` from each cgroup's `cpu.stat`.
    pub(crate) cgroups: bool,
    /// cgroups whose `cpu.stat` is read per refresh at most (breadth first, so parents, which
    /// include their children's time, come first); the rest are counted, not read.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub(crate) max_cgroups: usize,
}

impl Default for CpuConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            cgroups: true,
            max_cgroups: 1000,
        }
    }
}
