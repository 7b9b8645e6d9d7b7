//! `[syscalls]`: the syscall collector (histogram resolution, the descriptor split, the split
//! of calls' time by state). Serde types and defaults only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Histogram resolution of `sysscope_syscall_duration_seconds` and
/// `sysscope_block_io_duration_seconds` (the kernel always keeps one bucket per power of two of
/// a second).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HistogramResolution {
    /// Bucket bounds at powers of 4 of a second from 2^-20 s (953.67 ns) to 16 s (13 bounds +
    /// Inf).
    #[default]
    Log4,
    /// Bucket bounds at powers of 2 of a second from 2^-20 s to 16 s (25 bounds + Inf).
    Log2,
}

/// Every syscall of every process: counts, errors by errno and a latency histogram, per
/// cgroup, process and syscall.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SyscallsConfig {
    /// Loads the syscall probes and exports `sysscope_syscall*`.
    pub(crate) enabled: bool,
    /// Bucket bounds of `sysscope_syscall_duration_seconds`.
    pub(crate) histogram_resolution: HistogramResolution,
    /// Splits the read and write families and the socket calls by what their descriptor is
    /// (`fd_kind`, and `fs` for files), classified in the kernel at entry.
    pub(crate) descriptor_kinds: bool,
    /// Splits each call's time into on CPU, waiting for a CPU and blocked
    /// (`sysscope_syscall_time_seconds_total{state}`), stamped by scheduler probes on every
    /// context switch and wakeup of a task in a call (docs/performance.md: what it costs).
    pub(crate) time_by_state: bool,
}

impl Default for SyscallsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            histogram_resolution: HistogramResolution::Log4,
            descriptor_kinds: true,
            time_by_state: true,
        }
    }
}
