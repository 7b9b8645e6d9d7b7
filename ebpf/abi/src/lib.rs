//! The contract between sysscope's eBPF probes and its exporter.
//!
//! Everything the kernel side writes and user space reads is declared here once:
//! map names, `#[repr(C)]` keys and values, the latency bucket layout, the indices of the
//! probes' own drop counters and the per-architecture syscall numbers the probes special-case.
//! The crate is `no_std` so the probes can use it; the `user` feature adds `aya::Pod` impls.
#![no_std]

/// Latency histograms: log2 buckets over nanoseconds.
///
/// Bucket 0 holds durations below `2^FIRST_BUCKET_SHIFT` ns (1.024 µs); bucket `k` in
/// `1..HIST_BUCKETS-1` holds `[2^(FIRST_BUCKET_SHIFT+k-1), 2^(FIRST_BUCKET_SHIFT+k))` ns, and the
/// last bucket everything from `2^(FIRST_BUCKET_SHIFT+HIST_BUCKETS-2)` ns (17.2 s) up.
pub mod hist {
    /// Number of buckets kept per histogram in the kernel.
    pub const HIST_BUCKETS: usize = 26;
    /// log2 of the upper bound (ns) of bucket 0.
    pub const FIRST_BUCKET_SHIFT: u32 = 10;

    /// Index of the bucket that counts a duration of `ns` nanoseconds.
    #[inline(always)]
    pub fn bucket_index(ns: u64) -> usize {
        // floor(log2(ns)) by a branch-light binary search: the verifier accepts it and it costs
        // a handful of instructions, unlike a loop.
        let mut v = ns;
        let mut log = 0u32;
        if v >= 1 << 32 {
            v >>= 32;
            log += 32;
        }
        if v >= 1 << 16 {
            v >>= 16;
            log += 16;
        }
        if v >= 1 << 8 {
            v >>= 8;
            log += 8;
        }
        if v >= 1 << 4 {
            v >>= 4;
            log += 4;
        }
        if v >= 1 << 2 {
            v >>= 2;
            log += 2;
        }
        if v >= 1 << 1 {
            log += 1;
        }
        let idx = log as i64 - FIRST_BUCKET_SHIFT as i64 + 1;
        if idx <= 0 {
            0
        } else if idx >= HIST_BUCKETS as i64 {
            HIST_BUCKETS - 1
        } else {
            idx as usize
        }
    }

    /// Upper bound in nanoseconds of bucket `k`, `None` for the last (unbounded) bucket.
    pub const fn upper_bound_ns(k: usize) -> Option<u64> {
        if k + 1 >= HIST_BUCKETS {
            None
        } else {
            Some(1u64 << (FIRST_BUCKET_SHIFT as usize + k))
        }
    }
}

/// Names of the maps, as user space looks them up in the loaded object.
pub mod maps {
    pub const SYSCALL_THREADS: &str = "SYSCALL_THREADS";
    pub const SYSCALL_SLOTS: &str = "SYSCALL_SLOTS";
    pub const SYSCALL_STATS: &str = "SYSCALL_STATS";
    pub const SYSCALL_ERRORS: &str = "SYSCALL_ERRORS";
    pub const PROCESS_EXITS: &str = "PROCESS_EXITS";
    pub const PROBE_COUNTERS: &str = "PROBE_COUNTERS";
    pub const SLOW_THRESHOLDS: &str = "SLOW_THRESHOLDS";
    pub const SLOW_EVENTS: &str = "SLOW_EVENTS";
    pub const SLOW_RATE: &str = "SLOW_RATE";
    pub const BLOCK_INFLIGHT: &str = "BLOCK_INFLIGHT";
    pub const BLOCK_STATS: &str = "BLOCK_STATS";
    pub const BLOCK_LATENCY: &str = "BLOCK_LATENCY";
    pub const TRACE_EVENTS: &str = "TRACE_EVENTS";
    pub const TRACE_THREADS: &str = "TRACE_THREADS";
    pub const TRACE_TARGETS: &str = "TRACE_TARGETS";
}

/// Names of the programs in the object file.
pub mod programs {
    pub const SYS_ENTER: &str = "sys_enter";
    pub const SYS_EXIT: &str = "sys_exit";
    pub const PROCESS_EXIT: &str = "sched_process_exit";
    /// On `cgroup:cgroup_attach_task`: invalidates the cached cgroup ids.
    pub const CGROUP_ATTACH: &str = "cgroup_attach_task";
    /// On `sched:sched_switch`: parks the outgoing thread's syscall in flight.
    pub const SYSCALLS_SCHED_SWITCH: &str = "syscalls_sched_switch";
    pub const EMPTY_SYS_ENTER: &str = "empty_sys_enter";
    pub const EMPTY_SYS_EXIT: &str = "empty_sys_exit";
    pub const TRACE_SYS_ENTER: &str = "trace_sys_enter";
    pub const TRACE_SYS_EXIT: &str = "trace_sys_exit";
}

/// Names of the global variables the loader sets before the programs load.
pub mod globals {
    /// `u32`: slow-call events allowed per CPU per second (0 disables slow-call sampling).
    pub const SLOW_EVENTS_PER_CPU_PER_SEC: &str = "SLOW_EVENTS_PER_CPU_PER_SEC";
    /// `u64`: cgroup id whose syscalls the trace programs stream (0: use `TRACE_TARGETS` only).
    pub const TRACE_CGROUP_ID: &str = "TRACE_CGROUP_ID";
}

/// Indices into `PROBE_COUNTERS`, a per-CPU array of `u64`: what the probes could not record.
pub mod counters {
    /// An insert into `SYSCALL_STATS` failed because the map is full.
    pub const SYSCALL_STATS_FULL: u32 = 0;
    /// An insert into `SYSCALL_ERRORS` failed because the map is full.
    pub const SYSCALL_ERRORS_FULL: u32 = 1;
    /// A thread's entry time could not be stored: no `SYSCALL_THREADS` storage for the thread
    /// (the kernel could not allocate it).
    pub const SYSCALL_THREADS_FULL: u32 = 2;
    /// A syscall returned without a recorded entry (attached mid-call, or the thread map was full).
    pub const SYSCALL_EXIT_WITHOUT_ENTER: u32 = 3;
    /// A process exit could not be queued for reclaim: `PROCESS_EXITS` is full.
    pub const PROCESS_EXITS_FULL: u32 = 4;
    /// A slow call was not sampled: over the per-CPU rate limit.
    pub const SLOW_RATE_LIMITED: u32 = 5;
    /// A slow call was not sampled: the ring buffer was full (user space behind).
    pub const SLOW_RINGBUF_FULL: u32 = 6;
    /// Block I/O: an issued request could not be remembered (`BLOCK_INFLIGHT` full).
    pub const BLOCK_INFLIGHT_FULL: u32 = 7;
    /// Block I/O: an insert into `BLOCK_STATS` failed because the map is full.
    pub const BLOCK_STATS_FULL: u32 = 8;
    /// Block I/O: a completion without a recorded issue.
    pub const BLOCK_COMPLETE_WITHOUT_ISSUE: u32 = 9;
    /// Trace: an event was lost because the trace ring buffer was full.
    pub const TRACE_RINGBUF_FULL: u32 = 10;
    /// Number of counters.
    pub const COUNT: u32 = 16;
}

/// Upper bound on syscall numbers the probes index arrays with (x86_64 < 470, aarch64 < 470).
pub const MAX_SYSCALL_NR: u32 = 512;

/// Syscalls that never return to user space: counted at entry, with no duration.
pub mod noreturn {
    #[cfg(any(target_arch = "x86_64", bpf_target_arch = "x86_64"))]
    pub const EXIT: u32 = 60;
    #[cfg(any(target_arch = "x86_64", bpf_target_arch = "x86_64"))]
    pub const EXIT_GROUP: u32 = 231;
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    pub const EXIT: u32 = 93;
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    pub const EXIT_GROUP: u32 = 94;
    #[cfg(not(any(
        target_arch = "x86_64",
        bpf_target_arch = "x86_64",
        target_arch = "aarch64",
        bpf_target_arch = "aarch64"
    )))]
    pub const EXIT: u32 = u32::MAX;
    #[cfg(not(any(
        target_arch = "x86_64",
        bpf_target_arch = "x86_64",
        target_arch = "aarch64",
        bpf_target_arch = "aarch64"
    )))]
    pub const EXIT_GROUP: u32 = u32::MAX;
}

/// A syscall in flight of a thread that was switched out during the call, kept in
/// `SYSCALL_THREADS`, a task-local storage map (one value per thread, found from the task
/// itself and freed with it). Calls that complete without a context switch never get here:
/// their entry time stays in the CPU's slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadState {
    /// `bpf_ktime_get_ns()` at entry; 0 when no call is in flight.
    pub start_ns: u64,
    /// Syscall number at entry.
    pub nr: u32,
    pub _pad: u32,
}

/// Key of `SYSCALL_STATS`: one entry per (cgroup, process, syscall).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyscallKey {
    /// cgroup v2 id (`bpf_get_current_cgroup_id()`, the inode of the cgroup's directory).
    pub cgroup_id: u64,
    pub tgid: u32,
    pub nr: u32,
}

/// Value of `SYSCALL_STATS` (per CPU). The call count is the sum of the buckets.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyscallStats {
    /// Sum of durations in nanoseconds.
    pub sum_ns: u64,
    pub buckets: [u64; hist::HIST_BUCKETS],
}

impl SyscallStats {
    pub const ZERO: Self = Self {
        sum_ns: 0,
        buckets: [0; hist::HIST_BUCKETS],
    };

    pub fn count(&self) -> u64 {
        self.buckets
            .iter()
            .fold(0u64, |acc, b| acc.wrapping_add(*b))
    }
}

impl Default for SyscallStats {
    fn default() -> Self {
        Self::ZERO
    }
}

/// Key of `SYSCALL_ERRORS` (value: per-CPU `u64` count).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrnoKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    pub nr: u16,
    /// Positive errno (e.g. 2 for ENOENT).
    pub errno: u16,
}

/// Value of `PROCESS_EXITS` (key: tgid): what user space needs to label and reclaim the
/// entries of a process that has exited, since `/proc/<tgid>` is gone by then.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessExit {
    pub comm: [u8; 16],
    pub cgroup_id: u64,
    pub exit_ns: u64,
}

/// Per-CPU state of the slow-call rate limiter (`SLOW_RATE`, one slot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateWindow {
    pub window_start_ns: u64,
    pub events: u64,
}

/// A syscall slower than its threshold, as written to `SLOW_EVENTS` at `sys_exit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowCallEvent {
    /// `bpf_ktime_get_ns()` at entry and exit (CLOCK_MONOTONIC).
    pub start_ns: u64,
    pub end_ns: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub tid: u32,
    pub nr: u32,
    pub _pad: u32,
    /// Return value (negative errno on failure).
    pub ret: i64,
    /// The six syscall arguments as passed in registers.
    pub args: [u64; 6],
    pub comm: [u8; 16],
}

/// Block I/O operation classes, decoded from the request's `cmd_flags` / `rwbs`.
pub mod block_op {
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 1;
    pub const FLUSH: u8 = 2;
    pub const DISCARD: u8 = 3;
    pub const COUNT: usize = 4;
}

/// Key of `BLOCK_STATS`: bytes and requests per (cgroup, process, device, op).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    /// Kernel `dev_t` (major << 20 | minor).
    pub dev: u32,
    pub op: u8,
    pub _pad: [u8; 7],
}

/// Value of `BLOCK_STATS` (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    pub bytes: u64,
    pub requests: u64,
}

/// Key of `BLOCK_LATENCY`: latency histogram per (device, op).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockLatencyKey {
    pub dev: u32,
    pub op: u8,
    pub _pad: [u8; 3],
}

/// One syscall of a traced target (`TRACE_EVENTS`), streamed only by `sysscope trace`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    pub start_ns: u64,
    pub end_ns: u64,
    pub cgroup_id: u64,
    pub tgid: u32,
    pub tid: u32,
    pub nr: u32,
    pub _pad: u32,
    pub ret: i64,
    pub args: [u64; 6],
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: every type below is #[repr(C)], made only of integers and integer arrays, with
    // explicit padding fields, so any bit pattern is a valid value.
    unsafe impl aya::Pod for ThreadState {}
    unsafe impl aya::Pod for SyscallKey {}
    unsafe impl aya::Pod for SyscallStats {}
    unsafe impl aya::Pod for ErrnoKey {}
    unsafe impl aya::Pod for ProcessExit {}
    unsafe impl aya::Pod for RateWindow {}
    unsafe impl aya::Pod for SlowCallEvent {}
    unsafe impl aya::Pod for BlockKey {}
    unsafe impl aya::Pod for BlockStats {}
    unsafe impl aya::Pod for BlockLatencyKey {}
    unsafe impl aya::Pod for TraceEvent {}
}

#[cfg(test)]
mod tests {
    use super::hist::*;

    #[test]
    fn bucket_edges() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1023), 0);
        assert_eq!(bucket_index(1024), 1);
        assert_eq!(bucket_index(2047), 1);
        assert_eq!(bucket_index(2048), 2);
        // 20 ms = 20_000_000 ns: 2^24 = 16.8M <= 20M < 2^25
        assert_eq!(bucket_index(20_000_000), 15);
        assert_eq!(upper_bound_ns(15), Some(1 << 25));
        assert_eq!(bucket_index(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(upper_bound_ns(HIST_BUCKETS - 1), None);
    }

    #[test]
    fn every_duration_lies_below_its_bucket_bound() {
        let mut ns = 1u64;
        while ns < u64::MAX / 3 {
            for probe in [ns - 1, ns, ns + 1] {
                let k = bucket_index(probe);
                if let Some(ub) = upper_bound_ns(k) {
                    assert!(probe < ub, "{probe} ns in bucket {k} with bound {ub}");
                }
                if k > 0 {
                    let lb = upper_bound_ns(k - 1).unwrap();
                    assert!(probe >= lb, "{probe} ns in bucket {k} below {lb}");
                }
            }
            ns = ns * 3 / 2 + 1;
        }
    }
}
