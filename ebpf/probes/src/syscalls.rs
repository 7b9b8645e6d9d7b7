//! Syscall probes: counts, errors by errno, latency histograms, slow-call samples.
//!
//! Tracepoints: `raw_syscalls:sys_enter`, `raw_syscalls:sys_exit` (raw_tp) and
//! `sched:sched_process_exit` (raw_tp).
//! Maps: `SYSCALL_THREADS` (tid -> entry time), `SYSCALL_STATS` (per-CPU, (cgroup, tgid, nr) ->
//! sum + log2 buckets), `SYSCALL_ERRORS` (per-CPU, (cgroup, tgid, nr, errno) -> count),
//! `PROCESS_EXITS` (tgid -> comm at exit, for reclaim), `SLOW_THRESHOLDS` (nr -> ns),
//! `SLOW_RATE` (per-CPU rate window), `SLOW_EVENTS` (ring buffer).
//!
//! The hot path is one hash lookup at entry and two at exit (thread, stats), no map update when
//! the entries exist, per-CPU values so no cache line is shared between CPUs, and one array
//! lookup for the slow-call threshold. Everything else (errors, samples) is off the common path.
//!
//! The command-line tools set `SYSCALL_TARGET_ONLY` to count only their target (the trace
//! filter's, see `trace.rs`); the exporter leaves it 0 and the check folds away at load.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::RawTracePointContext,
};
use sysscope_abi::{
    counters, hist, noreturn, ErrnoKey, ProcessExit, RateWindow, SlowCallEvent, SyscallKey,
    SyscallStats, ThreadState, MAX_SYSCALL_NR,
};

use crate::common::{count_drop, read_syscall_args, EEXIST};

// Capacities here are defaults; the exporter resizes the maps from its config before loading.
#[map(name = "SYSCALL_THREADS")]
static SYSCALL_THREADS: HashMap<u32, ThreadState> = HashMap::with_max_entries(32768, 0);

#[map(name = "SYSCALL_STATS")]
static SYSCALL_STATS: PerCpuHashMap<SyscallKey, SyscallStats> =
    PerCpuHashMap::with_max_entries(16384, 0);

#[map(name = "SYSCALL_ERRORS")]
static SYSCALL_ERRORS: PerCpuHashMap<ErrnoKey, u64> = PerCpuHashMap::with_max_entries(4096, 0);

#[map(name = "PROCESS_EXITS")]
static PROCESS_EXITS: HashMap<u32, ProcessExit> = HashMap::with_max_entries(8192, 0);

/// Slow-call threshold in ns per syscall number; 0 means "never sample".
#[map(name = "SLOW_THRESHOLDS")]
static SLOW_THRESHOLDS: Array<u64> = Array::with_max_entries(MAX_SYSCALL_NR, 0);

#[map(name = "SLOW_RATE")]
static SLOW_RATE: PerCpuArray<RateWindow> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "SLOW_EVENTS")]
static SLOW_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Slow-call events each CPU may emit per second; set by the loader (0: sampling off).
#[unsafe(no_mangle)]
static SLOW_EVENTS_PER_CPU_PER_SEC: u32 = 0;

/// Non-zero: count only the target selected by the trace filter; set by the loader.
#[unsafe(no_mangle)]
static SYSCALL_TARGET_ONLY: u32 = 0;

#[inline(always)]
fn counted(pid_tgid: u64) -> bool {
    let target_only = unsafe { core::ptr::read_volatile(&SYSCALL_TARGET_ONLY) };
    target_only == 0 || crate::trace::is_target(pid_tgid)
}

const NSEC_PER_SEC: u64 = 1_000_000_000;
const MAX_ERRNO: i64 = 4095;

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(struct pt_regs *regs, long id)
    let nr = ctx.arg::<u64>(1) as u32;
    let pid_tgid = bpf_get_current_pid_tgid();
    if !counted(pid_tgid) {
        return 0;
    }
    if nr == noreturn::EXIT || nr == noreturn::EXIT_GROUP {
        // No sys_exit will follow: count the call now, with no duration.
        let key = SyscallKey {
            cgroup_id: unsafe { bpf_get_current_cgroup_id() },
            tgid: (pid_tgid >> 32) as u32,
            nr,
        };
        record_duration(&key, 0);
        return 0;
    }
    let tid = pid_tgid as u32;
    let now = unsafe { bpf_ktime_get_ns() };
    match SYSCALL_THREADS.get_ptr_mut(&tid) {
        Some(state) => unsafe {
            (*state).start_ns = now;
            (*state).nr = nr;
        },
        None => {
            let state = ThreadState {
                start_ns: now,
                nr,
                _pad: 0,
            };
            if SYSCALL_THREADS
                .insert(&tid, &state, BPF_NOEXIST as u64)
                .is_err()
            {
                count_drop(counters::SYSCALL_THREADS_FULL);
            }
        }
    }
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(state) = SYSCALL_THREADS.get_ptr_mut(&tid) else {
        count_drop(counters::SYSCALL_EXIT_WITHOUT_ENTER);
        return 0;
    };
    let (start_ns, nr) = unsafe { ((*state).start_ns, (*state).nr) };
    if start_ns == 0 {
        count_drop(counters::SYSCALL_EXIT_WITHOUT_ENTER);
        return 0;
    }
    unsafe { (*state).start_ns = 0 };
    let duration = now.saturating_sub(start_ns);
    let key = SyscallKey {
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        tgid: (pid_tgid >> 32) as u32,
        nr,
    };
    record_duration(&key, duration);

    // TP_PROTO(struct pt_regs *regs, long ret)
    let ret = ctx.arg::<i64>(1);
    if ret < 0 && ret >= -MAX_ERRNO {
        record_error(&key, (-ret) as u16);
    }

    if let Some(threshold) = SLOW_THRESHOLDS.get(nr) {
        let threshold = *threshold;
        if threshold != 0 && duration >= threshold {
            sample_slow_call(&ctx, &key, tid, start_ns, now, ret);
        }
    }
    0
}

/// Frees the thread's entry-time slot when a thread exits, and queues the process for reclaim
/// when its leader exits, with the comm user space can no longer read from /proc.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    // The tracepoint fires in the exiting task's context.
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    let _ = SYSCALL_THREADS.remove(&tid);
    if tid == tgid && counted(pid_tgid) {
        let exit = ProcessExit {
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
            cgroup_id: unsafe { bpf_get_current_cgroup_id() },
            exit_ns: unsafe { bpf_ktime_get_ns() },
        };
        if PROCESS_EXITS.insert(&tgid, &exit, 0).is_err() {
            count_drop(counters::PROCESS_EXITS_FULL);
        }
    }
    0
}

#[inline(always)]
fn record_duration(key: &SyscallKey, duration: u64) {
    let bucket = hist::bucket_index(duration);
    if let Some(stats) = SYSCALL_STATS.get_ptr_mut(key) {
        let stats = unsafe { &mut *stats };
        stats.sum_ns += duration;
        if let Some(b) = stats.buckets.get_mut(bucket) {
            *b += 1;
        }
        return;
    }
    let mut fresh = SyscallStats::ZERO;
    fresh.sum_ns = duration;
    if let Some(b) = fresh.buckets.get_mut(bucket) {
        *b = 1;
    }
    match SYSCALL_STATS.insert(key, &fresh, BPF_NOEXIST as u64) {
        Ok(()) => {}
        // Another CPU created the entry between our lookup and insert; ours is still empty.
        Err(EEXIST) => {
            if let Some(stats) = SYSCALL_STATS.get_ptr_mut(key) {
                let stats = unsafe { &mut *stats };
                stats.sum_ns += duration;
                if let Some(b) = stats.buckets.get_mut(bucket) {
                    *b += 1;
                }
            }
        }
        Err(_) => count_drop(counters::SYSCALL_STATS_FULL),
    }
}

#[inline(always)]
fn record_error(key: &SyscallKey, errno: u16) {
    let ekey = ErrnoKey {
        cgroup_id: key.cgroup_id,
        tgid: key.tgid,
        nr: key.nr as u16,
        errno,
    };
    if let Some(count) = SYSCALL_ERRORS.get_ptr_mut(&ekey) {
        unsafe { *count += 1 };
        return;
    }
    match SYSCALL_ERRORS.insert(&ekey, &1u64, BPF_NOEXIST as u64) {
        Ok(()) => {}
        Err(EEXIST) => {
            if let Some(count) = SYSCALL_ERRORS.get_ptr_mut(&ekey) {
                unsafe { *count += 1 };
            }
        }
        Err(_) => count_drop(counters::SYSCALL_ERRORS_FULL),
    }
}

/// Writes one slow call to the ring buffer, within the per-CPU events-per-second budget.
/// (Inlined: BPF functions take at most five arguments.)
#[inline(always)]
fn sample_slow_call(
    ctx: &RawTracePointContext,
    key: &SyscallKey,
    tid: u32,
    start_ns: u64,
    end_ns: u64,
    ret: i64,
) {
    let limit = unsafe { core::ptr::read_volatile(&SLOW_EVENTS_PER_CPU_PER_SEC) } as u64;
    if limit == 0 {
        return;
    }
    let Some(window) = SLOW_RATE.get_ptr_mut(0) else {
        return;
    };
    let window = unsafe { &mut *window };
    if end_ns.wrapping_sub(window.window_start_ns) >= NSEC_PER_SEC {
        // Windows start on whole seconds of CLOCK_MONOTONIC, the same on every CPU, so the
        // node-wide bound holds for each second: at most (per-CPU budget x CPUs) events.
        window.window_start_ns = end_ns - end_ns % NSEC_PER_SEC;
        window.events = 0;
    }
    if window.events >= limit {
        count_drop(counters::SLOW_RATE_LIMITED);
        return;
    }
    window.events += 1;
    let Some(mut entry) = SLOW_EVENTS.reserve::<SlowCallEvent>(0) else {
        count_drop(counters::SLOW_RINGBUF_FULL);
        return;
    };
    let event = unsafe { &mut *entry.as_mut_ptr() };
    event.start_ns = start_ns;
    event.end_ns = end_ns;
    event.cgroup_id = key.cgroup_id;
    event.tgid = key.tgid;
    event.tid = tid;
    event.nr = key.nr;
    event._pad = 0;
    event.ret = ret;
    let regs = ctx.arg::<*const u8>(0);
    read_syscall_args(regs, &mut event.args);
    event.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    entry.submit(0);
}
