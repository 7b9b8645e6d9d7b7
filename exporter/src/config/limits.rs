//! `[limits]`: the cardinality budget and the kernel maps' capacities. Serde types and defaults
//! only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Cardinality budget and kernel map capacities.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LimitsConfig {
    /// Exported syscall series (every histogram bucket counts as one). Label sets beyond it
    /// fold into `comm="other"`, then `cgroup="other"`; see docs/metrics.md.
    #[schemars(range(min = 100, max = 10_000_000))]
    pub(crate) max_series: usize,
    /// Threads with a call in flight the command-line tools (`sysscope summary/trace/...`)
    /// track at once (`TRACE_THREADS`). The exporter's per-thread syscall state needs no
    /// limit: it lives in task-local storage, one value per thread, freed with the thread.
    #[schemars(range(min = 64, max = 4_194_304))]
    pub(crate) max_threads: u32,
    /// (cgroup, process, syscall) entries in the kernel's syscall map.
    #[schemars(range(min = 64, max = 1_048_576))]
    pub(crate) max_syscall_entries: u32,
    /// Slots of the syscall map the keys of one cgroup may hold (0: no quota). Past it, the
    /// cgroup's new (process, syscall) pairs are counted under the cgroup's shared key
    /// (`comm="other"`). The keys of processes, all cgroups together, hold at most seven
    /// eighths of the map: the last eighth is kept for the shared keys, so however many
    /// cgroups sit at their quota, no workload can leave another's calls uncounted.
    #[schemars(range(min = 0, max = 1_048_576))]
    pub(crate) max_syscall_entries_per_cgroup: u32,
    /// (cgroup, process, syscall, errno) entries in the kernel's error map.
    #[schemars(range(min = 16, max = 1_048_576))]
    pub(crate) max_error_entries: u32,
    /// Entries of the error map the processes of one cgroup may hold (0: no quota). Past it,
    /// the cgroup's new errors are counted under its shared key (`comm="other"`); as in the
    /// syscall map, the last eighth of the error map is kept for the shared keys.
    #[schemars(range(min = 0, max = 1_048_576))]
    pub(crate) max_error_entries_per_cgroup: u32,
    /// Exited processes queued for reclaim between two reads.
    #[schemars(range(min = 16, max = 1_048_576))]
    pub(crate) max_exited_processes: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_series: 30_000,
            max_threads: 32_768,
            max_syscall_entries: 16_384,
            max_syscall_entries_per_cgroup: 4_096,
            max_error_entries: 4_096,
            max_error_entries_per_cgroup: 1_024,
            max_exited_processes: 8_192,
        }
    }
}
