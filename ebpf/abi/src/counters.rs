//! The probes' own drop counters: what they could not record, per CPU, in `PROBE_COUNTERS`
//! (declared in `ebpf/probes/src/common.rs`, read by `exporter/src/kernel/counters.rs`).

maps! {
    /// Per-CPU `u64`, indexed by the constants below.
    PROBE_COUNTERS: PerCpuArray(u32 => u64),
}

// Indices into `PROBE_COUNTERS`.

/// A new (cgroup, process, syscall) found no free slot in `SYSCALL_STATS` (or no room in
/// `SYSCALL_SLOTS`): the map is full.
pub const SYSCALL_STATS_FULL: u32 = 0;
/// An insert into `SYSCALL_ERRORS` failed because the map is full.
pub const SYSCALL_ERRORS_FULL: u32 = 1;
/// A call in flight of a task switched out mid-call could not be kept: the kernel could not
/// give the thread its `SYSCALL_THREADS` task storage (out of memory, or the storage busy on
/// this CPU). The call is then counted at its exit with no duration, as one without entry.
pub const SYSCALL_THREADS_FULL: u32 = 2;
/// A syscall returned without a recorded entry and its registers named no call (-1), or an
/// entry kept for a task belonged to another call than the one that returned (its own exit was
/// missed). Calls whose entry was not seen but whose number is known (denied by seccomp before
/// the entry tracepoint, in flight at attach) are counted with no duration instead, and a new
/// task's first return from `fork`/`clone` is not counted at all.
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
/// Block I/O: an insert into `BLOCK_LATENCY` failed because the map is full.
pub const BLOCK_LATENCY_FULL: u32 = 11;
/// Trace: a block request of the target was not streamed: `TRACE_BLOCK_EVENTS` was full.
pub const TRACE_BLOCK_RINGBUF_FULL: u32 = 12;
/// A syscall was counted under its cgroup's shared key ([`crate::FOLDED_TGID`], exported
/// as `comm="other"`): the cgroup held its quota of slots, or no slot was free. Counted,
/// never lost.
pub const SYSCALL_FOLDED: u32 = 13;
/// A syscall number outside the table (`syscall(20000)`, `syscall(-1)`) was counted as
/// [`crate::INVALID_NR`].
pub const SYSCALL_INVALID_NR: u32 = 14;
/// Trace: an off-CPU stretch of a traced call was not streamed: `OFFCPU_EVENTS` was
/// full.
pub const TRACE_STATE_RINGBUF_FULL: u32 = 15;
/// Number of counters.
pub const COUNT: u32 = 16;
