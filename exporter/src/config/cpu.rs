//! `[cpu]`: the CPU collector. Serde types and defaults
//! only; validation is in the parent module.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct CpuConfig {
    pub(crate) enabled: bool,
    /// Adds `sysscope_cgroup_cpu_seconds_total` from each cgroup's `cpu.stat`.
    pub(crate) cgroups: bool,
    /// cgroups whose `cpu.stat` is read per refresh at most (breadth first, so parents, which
    /// include their children's time, come first); the rest are counted, not read.
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
