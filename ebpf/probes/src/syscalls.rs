//! Syscall probes: counts, errors by errno, latency histograms, slow-call samples.
//!
//! Tracepoints: `raw_syscalls:sys_enter`, `raw_syscalls:sys_exit`, `sched:sched_process_exit`
//! and `cgroup:cgroup_attach_task` (raw_tp).
//! Maps: `SYSCALL_THREADS` (task-local storage: entry time, cached tgid, cgroup id and slots),
//! the statistics table (`SYSCALL_SLOTS`: (cgroup, tgid, nr) -> slot; `SYSCALL_STATS`: per-CPU
//! array of owner key + sum + log2 buckets by slot; `FREE_SLOTS`; `SLOT_EPOCH`; user space's
//! side is `exporter/src/syscall_stats.rs`), `SYSCALL_ERRORS` (per-CPU, (cgroup, tgid, nr,
//! errno) -> count), `PROCESS_EXITS` (tgid -> comm at exit, for reclaim), `SLOW_THRESHOLDS`
//! (nr -> ns), `SLOW_RATE` (per-CPU rate window), `SLOW_EVENTS` (ring buffer).
//!
//! The hot path (docs/performance.md) per syscall: two clock reads (unavoidable for a
//! duration), two task-storage lookups for the thread's state (cheaper than a hash lookup by
//! tid, and freed by the kernel with the thread, so process churn never fills a thread map),
//! an inlined per-CPU array lookup for the (cgroup, process, syscall) statistics, whose slot
//! the thread's cache names (a hash lookup only on a miss), and an inlined array lookup for
//! the slow-call threshold. The tgid and the cgroup id
//! are cached in the thread's state: the cgroup id stays valid until a `cgroup_attach_task`
//! bumps `CGROUP_GENERATION`, so no helper call is made for them on the common path. Every
//! value written per syscall belongs to the thread or to the CPU: no cache line is written by
//! two CPUs, and a program preempted mid-run shares no state with the next task on its CPU.
//! Errors and samples are off the common path.
//!
//! The command-line tools set `SYSCALL_TARGET_ONLY` to count only their target (the trace
//! filter's, see `trace.rs`); the exporter leaves it 0 and the check folds away at load.

use core::{
    cell::UnsafeCell,
    intrinsics::{atomic_xadd, AtomicOrdering},
};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, BPF_NOEXIST},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_ns,
        generated::{bpf_get_current_task_btf, bpf_task_storage_get},
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf, Stack},
    programs::RawTracePointContext,
};
use sysscope_abi::{
    counters, hist, noreturn, slot_cache, ErrnoKey, ProcessExit, RateWindow, SlotStats,
    SlowCallEvent, SyscallKey, SyscallStats, ThreadState, MAX_SYSCALL_NR,
};

use crate::common::{count_drop, read_syscall_args, EEXIST};

/// A task-local storage map definition (`BPF_MAP_TYPE_TASK_STORAGE`) in the BTF map format,
/// which aya-ebpf does not provide. The loader reads the layout from BTF: the pointers encode
/// the type, key, value, max_entries (0: one value per task) and flags (must be no-prealloc).
#[repr(C)]
pub struct TaskStorage<V> {
    r#type: *const [i32; 29], // BPF_MAP_TYPE_TASK_STORAGE
    key: *const i32,
    value: *const V,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders the loader reads from BTF; they are never dereferenced.
unsafe impl<V> Sync for TaskStorage<V> {}

impl<V> TaskStorage<V> {
    const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current thread's value, created zeroed when `create` and missing; null when missing
    /// (or when the kernel cannot allocate it).
    #[inline(always)]
    fn current(&self, create: bool) -> *mut V {
        let flags = if create {
            BPF_LOCAL_STORAGE_GET_F_CREATE as u64
        } else {
            0
        };
        // SAFETY: the helper takes this map and the current task (a trusted BTF pointer).
        unsafe {
            bpf_task_storage_get(
                self as *const Self as *mut core::ffi::c_void,
                bpf_get_current_task_btf(),
                core::ptr::null_mut(),
                flags,
            )
            .cast()
        }
    }
}

#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "SYSCALL_THREADS")]
static SYSCALL_THREADS: TaskStorage<ThreadState> = TaskStorage::new();

// Capacities here are defaults; the exporter resizes the maps from its config before loading.

/// Statistics per slot and CPU. A slot belongs to one (cgroup, process, syscall) at a time
/// (`SYSCALL_SLOTS`); each CPU's copy names its owner (see `SlotStats`).
#[map(name = "SYSCALL_STATS")]
static SYSCALL_STATS: PerCpuArray<SlotStats> = PerCpuArray::with_max_entries(16384, 0);

/// (cgroup, process, syscall) -> its slot in `SYSCALL_STATS`. Looked up only when a thread's
/// slot cache misses; user space deletes entries when it reclaims them.
#[map(name = "SYSCALL_SLOTS")]
static SYSCALL_SLOTS: HashMap<SyscallKey, u32> = HashMap::with_max_entries(16384, 0);

/// Slots not owned by any key. Filled by the loader with every slot (lowest on top) and by user
/// space with the slots it frees, which are handed out again first: the slots ever used are the
/// lowest ones, as many as were ever held at once.
#[map(name = "FREE_SLOTS")]
static FREE_SLOTS: Stack<u32> = Stack::with_max_entries(16384, 0);

/// Bumped by user space after it deletes entries of `SYSCALL_SLOTS`: the entries of every
/// thread's slot cache made before miss from then on, so no thread keeps writing to a slot
/// that was freed (see `sysscope_abi::slot_cache`).
#[map(name = "SLOT_EPOCH")]
static SLOT_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

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
fn target_only() -> bool {
    unsafe { core::ptr::read_volatile(&SYSCALL_TARGET_ONLY) != 0 }
}

/// Cgroup migrations seen (in `.bss`): a thread's cached cgroup id is valid while the count it
/// was read at is still current. Migrations are rare, so the count is almost always unchanged
/// and re-reading after one is cheap.
static CGROUP_GENERATION: Counter = Counter(UnsafeCell::new(0));

/// A global `u64` updated with atomic adds (several CPUs may count at once).
#[repr(transparent)]
struct Counter(UnsafeCell<u64>);

// SAFETY: every access is an atomic load or an atomic add.
unsafe impl Sync for Counter {}

impl Counter {
    #[inline(always)]
    fn get(&self) -> u64 {
        // SAFETY: an aligned global; aligned 64-bit loads are atomic on BPF. (Load-acquire needs
        // BPF ISA v4; the helper call that follows the load is what orders it in practice.)
        unsafe { core::ptr::read_volatile(self.0.get()) }
    }

    #[inline(always)]
    fn increment(&self) {
        // SAFETY: an aligned global, updated atomically.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(self.0.get(), 1) };
    }
}

const NSEC_PER_SEC: u64 = 1_000_000_000;
const MAX_ERRNO: i64 = 4095;

/// The (cgroup, process) part of the thread's stats key, from its cached state.
#[inline(always)]
fn key_of(state: &mut ThreadState, nr: u32) -> SyscallKey {
    // Read the count before the id: a migration moves the task first and counts afterwards,
    // so an id read after a count that is already stale is re-read on the next call.
    let generation = CGROUP_GENERATION.get();
    if state.cgroup_generation != generation {
        // The cached slots stay: those of the old cgroup's keys are refused by their copies'
        // owner check and replaced on first use.
        state.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
        // A migration counted meanwhile may have moved this thread after the read: then the
        // id is used for this call only, and read again on the next.
        state.cgroup_generation = if CGROUP_GENERATION.get() == generation {
            generation
        } else {
            ThreadState::NO_CGROUP
        };
    }
    SyscallKey {
        cgroup_id: state.cgroup_id,
        tgid: state.tgid,
        nr,
    }
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(struct pt_regs *regs, long id)
    let nr = ctx.arg::<u64>(1) as u32;
    if target_only() && !crate::trace::is_target(bpf_get_current_pid_tgid()) {
        return 0;
    }
    let state = SYSCALL_THREADS.current(true);
    if state.is_null() {
        count_drop(counters::SYSCALL_THREADS_FULL);
        return 0;
    }
    // SAFETY: a non-null task-storage value of the current task, ours until the program ends.
    let state = unsafe { &mut *state };
    if state.tgid == 0 {
        // First call of this thread (tgid 0 is the idle task, which makes no syscalls).
        state.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        state.cgroup_generation = ThreadState::NO_CGROUP;
    }
    if nr == noreturn::EXIT || nr == noreturn::EXIT_GROUP {
        // No sys_exit will follow: count the call now, with no duration.
        let key = key_of(state, nr);
        record_duration(state, &key, 0);
        return 0;
    }
    state.nr = nr;
    state.start_ns = unsafe { bpf_ktime_get_ns() };
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let state = SYSCALL_THREADS.current(false);
    if state.is_null() {
        // With a target, every other thread's calls end here: not a miss.
        if !target_only() {
            count_drop(counters::SYSCALL_EXIT_WITHOUT_ENTER);
        }
        return 0;
    }
    // SAFETY: as in sys_enter.
    let state = unsafe { &mut *state };
    let start_ns = state.start_ns;
    if start_ns == 0 {
        count_drop(counters::SYSCALL_EXIT_WITHOUT_ENTER);
        return 0;
    }
    state.start_ns = 0;
    let duration = now.saturating_sub(start_ns);
    let key = key_of(state, state.nr);
    record_duration(state, &key, duration);

    // TP_PROTO(struct pt_regs *regs, long ret)
    let ret = ctx.arg::<i64>(1);
    if ret < 0 && ret >= -MAX_ERRNO {
        record_error(&key, (-ret) as u16);
    }

    if let Some(threshold) = SLOW_THRESHOLDS.get(key.nr) {
        let threshold = *threshold;
        if threshold != 0 && duration >= threshold {
            let tid = bpf_get_current_pid_tgid() as u32;
            sample_slow_call(&ctx, &key, tid, start_ns, now, ret);
        }
    }
    0
}

/// Queues a process for reclaim when its leader exits, with the comm user space can no longer
/// read from /proc. (Each thread's `SYSCALL_THREADS` value is freed by the kernel with it.)
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    // The tracepoint fires in the exiting task's context.
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    if tid == tgid && (!target_only() || crate::trace::is_target(pid_tgid)) {
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

/// A task moved to another cgroup (`cgroup.procs`, `cgroup.threads`, ...): every cached
/// cgroup id may be stale. Fires after the move, once per moved process or thread.
#[raw_tracepoint(tracepoint = "cgroup_attach_task")]
pub fn cgroup_attach_task(_ctx: RawTracePointContext) -> i32 {
    CGROUP_GENERATION.increment();
    0
}

/// Adds one call to the key's statistics on this CPU. The common case costs an inlined array
/// lookup: the thread's cache names the slot, and the copy's owner confirms it.
#[inline(always)]
fn record_duration(state: &mut ThreadState, key: &SyscallKey, duration: u64) {
    let bucket = hist::bucket_index(duration);
    let epoch = SLOT_EPOCH.get(0).copied().unwrap_or(0);
    let tag = slot_cache::tag(epoch, key.nr);
    let set = slot_cache::set_of(key.nr);
    let (Some(&first), Some(&second)) = (state.slots.get(set), state.slots.get(set + 1)) else {
        return;
    };
    if let Some(slot) = slot_cache::hit(first, tag).or_else(|| slot_cache::hit(second, tag)) {
        if let Some(copy) = SYSCALL_STATS.get_ptr_mut(slot) {
            // SAFETY: this CPU's copy of the slot; programs do not nest on a CPU.
            let copy = unsafe { &mut *copy };
            if copy.key == *key {
                add_call(&mut copy.stats, bucket, duration);
                return;
            }
        }
    }
    let Some(slot) = slot_of(key) else {
        count_drop(counters::SYSCALL_STATS_FULL);
        return;
    };
    let Some(copy) = SYSCALL_STATS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: as above.
    let copy = unsafe { &mut *copy };
    if copy.key != *key {
        // First call of this key on this CPU since the slot was handed to it: whatever the
        // copy holds belongs to a previous owner that user space has already read out.
        copy.stats = SyscallStats::ZERO;
        copy.key = *key;
    }
    add_call(&mut copy.stats, bucket, duration);
    // The new entry goes first and the set's previous first entry second, unless the first
    // already names this slot (a hit whose copy on this CPU was not the key's yet).
    let fresh = slot_cache::entry(tag, slot);
    if fresh != first {
        if let Some(way) = state.slots.get_mut(set + 1) {
            *way = first;
        }
        if let Some(way) = state.slots.get_mut(set) {
            *way = fresh;
        }
    }
}

#[inline(always)]
fn add_call(stats: &mut SyscallStats, bucket: usize, duration: u64) {
    stats.sum_ns += duration;
    if let Some(b) = stats.buckets.get_mut(bucket) {
        *b += 1;
    }
}

/// The key's slot, taken from the free slots when the key has none yet; `None` when no slot
/// is free (or `SYSCALL_SLOTS` is full).
#[inline(always)]
fn slot_of(key: &SyscallKey) -> Option<u32> {
    if let Some(slot) = unsafe { SYSCALL_SLOTS.get(key) } {
        return Some(*slot);
    }
    let slot = FREE_SLOTS.pop().ok().flatten()?;
    match SYSCALL_SLOTS.insert(key, &slot, BPF_NOEXIST as u64) {
        Ok(()) => Some(slot),
        Err(err) => {
            // Another CPU gave the key a slot first (EEXIST), or the map is full: hand ours back.
            let _ = FREE_SLOTS.push(slot, 0);
            if err == EEXIST {
                unsafe { SYSCALL_SLOTS.get(key) }.copied()
            } else {
                None
            }
        }
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
