//! `[slow_calls]`: slow-syscall sampling (spans). Serde types and defaults
//! only; validation is in the parent module.

use std::{collections::BTreeMap, time::Duration};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::util::duration as humantime_serde_compat;

/// Slow-syscall sampling: calls slower than a threshold become spans (OTLP) and entries of
/// `/api/v1/slow-calls`, and exemplars of the duration histogram. Thresholds are durations
/// like "10ms".
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct SlowCallsConfig {
    /// Loads the slow-call probes and the span pipeline.
    pub(crate) enabled: bool,
    /// Calls at least this slow are sampled, unless overridden per syscall.
    #[serde(with = "humantime_serde_compat")]
    #[schemars(
        with = "String",
        extend("x-type" = "duration", "x-constraint" = "greater than 0s")
    )]
    pub(crate) threshold: Duration,
    /// Per-syscall thresholds by name; "0s" or "off" never samples that syscall.
    #[schemars(extend("x-constraint" = "keys are syscall names; values are durations or \"off\""))]
    pub(crate) thresholds: BTreeMap<String, String>,
    /// Syscalls never sampled, because waiting is their job.
    #[schemars(extend("x-constraint" = "syscall names"))]
    pub(crate) exclude: Vec<String>,
    /// Events per second for the whole node (split evenly across CPUs in the kernel).
    #[schemars(range(min = 0, max = 1_000_000))]
    pub(crate) max_events_per_second: u32,
    /// Recent slow calls kept for `/api/v1/slow-calls` when no OTLP endpoint is configured.
    #[schemars(range(min = 0, max = 100_000))]
    pub(crate) recent_capacity: usize,
    /// Puts the name of the file behind a descriptor into spans (`file.path`), read by the
    /// kernel at the call's exit (needs no capability beyond CAP_BPF and CAP_PERFMON). Paths
    /// can carry user data, so they can be turned off.
    pub(crate) resolve_file_paths: bool,
    /// Lets `/proc/<pid>/fd` name, for every process, a file the kernel could not (a path
    /// over 512 bytes or 40 levels, a namespace file, a kernel without the struct offsets),
    /// checked by device and inode: keeps CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE after
    /// start-up when held at start (never required; they also give other users' processes
    /// their `process.executable.name`). false drops both even when held: `/proc` then answers
    /// only for processes of sysscope's own user.
    pub(crate) proc_fallback: bool,
    /// Kernel ring buffer size in bytes (power of two, multiple of the page size).
    #[schemars(range(min = 4096), extend("x-constraint" = "a power of two"))]
    pub(crate) ring_buffer_bytes: u32,
    /// Spans queued for export at most; beyond it, spans are dropped and counted.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub(crate) export_queue: usize,
}

impl Default for SlowCallsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: Duration::from_millis(10),
            thresholds: BTreeMap::new(),
            exclude: [
                "epoll_wait",
                "epoll_pwait",
                "epoll_pwait2",
                "futex",
                "futex_waitv",
                "nanosleep",
                "clock_nanosleep",
                "poll",
                "ppoll",
                "select",
                "pselect6",
                "wait4",
                "waitid",
                "pause",
                "rt_sigsuspend",
                "rt_sigtimedwait",
                "io_getevents",
                "io_pgetevents",
                "io_uring_enter",
                "accept",
                "accept4",
                "msgrcv",
                "semop",
                "semtimedop",
                "mq_timedreceive",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            max_events_per_second: 1000,
            recent_capacity: 256,
            resolve_file_paths: true,
            proc_fallback: true,
            ring_buffer_bytes: 256 * 1024,
            export_queue: 2048,
        }
    }
}
