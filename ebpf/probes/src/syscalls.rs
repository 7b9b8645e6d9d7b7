//! Syscall probes: counts, errors by errno, latency histograms, slow-call samples.
//!
//! Tracepoints: `raw_syscalls:sys_enter`, `raw_syscalls:sys_exit`, `sched:sched_process_exit`
//! and `cgroup:cgroup_attach_task` (raw_tp); `sched:sched_switch` and `sched:sched_wakeup`
//! (tp_btf) are in `sched.rs`.
//! Maps: `SYSCALL_CPU` (per CPU: the running task's call in flight, its cached tgid, cgroup id
//! and slots), `SYSCALL_THREADS` (task-local storage: a call in flight whose task was switched
//! out mid-call), the statistics table (`SYSCALL_SLOTS`: (cgroup, tgid, nr) -> slot;
//! `SYSCALL_STATS`: an array of a few copies per slot, each an owner key + sum + log2 buckets,
//! updated with atomic adds; `FREE_SLOTS`; `SLOT_EPOCH`; `CGROUP_TAKEN`/`CGROUP_RETURNED` for
//! the per-cgroup quota; user space's side is `exporter/src/kernel/syscalls.rs`),
//! `SYSCALL_ERRORS` ((cgroup, tgid, nr, errno) -> count, atomic adds), `PROCESS_EXITS` (tgid ->
//! comm at exit, for reclaim), `SLOW_THRESHOLDS` (nr -> ns), `SLOW_RATE` (per-CPU rate
//! window), `SLOW_SCRATCH` (per CPU: a slow-call record being built), `SLOW_EVENTS` (ring
//! buffer: the record, with the file of the call's descriptor read by `fd_class.rs`),
//! `SYSCALL_STATES` (the time switched-out calls spent waiting for a CPU, blocked or
//! unaccounted, by slot copy as `SYSCALL_STATS`).
//!
//! The hot path (docs/performance.md) per syscall: two clock reads (unavoidable for a
//! duration); the call in flight kept in the CPU's own `SYSCALL_CPU` value (an inlined array
//! lookup) rather than looked up by thread, because a task that enters a syscall nearly always
//! leaves it on the same CPU without being switched out; an inlined array lookup for the
//! (cgroup, process, syscall) statistics, whose slot the CPU's cache names (a hash lookup only
//! on a miss), two atomic adds, and an inlined array lookup for the slow-call threshold. A task
//! switched out mid-call (it blocked, or was preempted) has its call moved to its task-local
//! storage by `sched_switch`, where its `sys_exit` finds it on whichever CPU it returns; the
//! storage is freed by the kernel with the thread, so process churn never fills a thread map.
//! There the scheduler programs (`sched.rs`) also stamp the call's time off CPU by part, which
//! `sys_exit` adds to `SYSCALL_STATES`: a call that kept its CPU costs nothing more.
//! The tgid and the cgroup id of the task on the CPU are cached beside the call and read again
//! only when another task runs there or after a `cgroup_attach_task`, a task exit or an exec
//! (`sched_process_exec`) bumps `IDENTITY_GENERATION`; so is whether the task makes 32-bit
//! compat calls, whose numbers are counted at `COMPAT_BASE + n`. Per-CPU state is one small value per CPU; the statistics are shared,
//! so kernel memory does not grow with the CPU count. Errors and samples are off the common
//! path.
//!
//! What a tenant controls is bounded here: a syscall number out of the table counts as
//! `INVALID_NR`, and a cgroup whose keys hold `SYSCALL_CGROUP_QUOTA` slots (or that finds none
//! free) has its new (process, syscall) pairs counted under its shared key (`FOLDED_TGID`).
//! The keys of processes, all cgroups together, may hold `SYSCALL_OWN_SLOTS` slots (seven
//! eighths of the table): the rest is a reserve only shared keys take, so cgroups at their
//! quota cannot leave another without a slot to fold into. `SYSCALL_ERRORS` is bounded the same
//! way (`SYSCALL_ERROR_QUOTA` error keys per cgroup, `SYSCALL_OWN_ERRORS` in all). The counts
//! are in `CGROUP_TAKEN`/`CGROUP_RETURNED`, under the keys of `sysscope_abi::quota_key`.
//!
//! The read and write families and the socket calls also classify their descriptor at entry
//! (`fd_class.rs`): the class joins the key, so their counts and durations are split by what
//! was read or written, at the cost of a few kernel reads on those calls only.
//!
//! The command-line tools set `SYSCALL_TARGET_ONLY` to count only their target (the trace
//! filter's, see `trace.rs`); the exporter leaves it 0 and the check folds away at load.

use core::{
    cell::UnsafeCell,
    intrinsics::{atomic_xadd, AtomicOrdering},
};

use aya_ebpf::{
    bindings::task_struct,
    bindings::{
        BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, BPF_NOEXIST, BPF_RB_FORCE_WAKEUP,
    },
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{bpf_get_current_task, bpf_get_current_task_btf, bpf_task_storage_get},
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf, Stack},
    programs::RawTracePointContext,
};
use sysscope_abi::{
    bounded_compat_nr, bounded_nr, call_state, counters,
    fd_class::{self, file},
    hist, noreturn, quota_key, slot_cache, special, CpuState, ErrnoKey, FdClass, FileIdentity,
    ProcessExit, RateWindow, SlotStats, SlowCallEvent, SlowCallScratch, StateStats, SyscallKey,
    ThreadSpill, FOLDED_TGID, INVALID_NR, MAX_STAT_STRIPES, MAX_SYSCALL_NR, NO_FIELD,
};

use crate::common::{
    count_drop, read_compat_syscall_arg0, read_syscall_arg0, read_syscall_args, read_syscall_nr,
    zero, EEXIST,
};

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
    pub(crate) fn current(&self, create: bool) -> *mut V {
        // SAFETY: the helper has no preconditions; it returns a trusted BTF pointer.
        self.of(unsafe { bpf_get_current_task_btf() }, create)
    }

    /// The value of `task`, which must be a trusted BTF pointer (the current task, or a task
    /// a BTF tracepoint hands over), or null; created zeroed when `create` and missing; null
    /// when missing.
    #[inline(always)]
    pub(crate) fn of(&self, task: *mut task_struct, create: bool) -> *mut V {
        let flags = if create {
            BPF_LOCAL_STORAGE_GET_F_CREATE as u64
        } else {
            0
        };
        // SAFETY: the helper takes this map and a task pointer the verifier has checked to be
        // trusted (it refuses the program otherwise); a null task yields null.
        unsafe {
            bpf_task_storage_get(
                self as *const Self as *mut core::ffi::c_void,
                task,
                core::ptr::null_mut(),
                flags,
            )
            .cast()
        }
    }
}

/// Calls in flight of tasks switched out mid-call, one value per thread that ever was.
#[unsafe(link_section = ".maps")]
#[unsafe(export_name = "SYSCALL_THREADS")]
pub(crate) static SYSCALL_THREADS: TaskStorage<ThreadSpill> = TaskStorage::new();

/// The running task's call in flight and cached identity, per CPU (see `CpuState`).
#[map(name = "SYSCALL_CPU")]
pub(crate) static SYSCALL_CPU: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

// Capacities here are defaults; the exporter resizes the maps from its config before loading.

/// Statistics by slot: [`SYSCALL_STAT_STRIPES`] copies per slot, shared by all CPUs and
/// updated with atomic adds (see `SlotStats`), so the map does not grow with the CPU count.
#[map(name = "SYSCALL_STATS")]
static SYSCALL_STATS: Array<SlotStats> = Array::with_max_entries(16384, 0);

/// The time switched-out calls spent off CPU, by part, one value per copy of `SYSCALL_STATS`
/// (same index); the on-CPU part is the duration less these.
#[map(name = "SYSCALL_STATES")]
static SYSCALL_STATES: Array<StateStats> = Array::with_max_entries(16384, 0);

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

/// (cgroup, process, syscall, errno) -> calls that failed so, shared by all CPUs (atomic adds).
#[map(name = "SYSCALL_ERRORS")]
static SYSCALL_ERRORS: HashMap<ErrnoKey, u64> = HashMap::with_max_entries(4096, 0);

/// cgroup id -> slots handed to its keys, ever (atomic adds). With `CGROUP_RETURNED`
/// (written by user space alone as it frees slots) it gives the slots a cgroup holds, which
/// [`SYSCALL_CGROUP_QUOTA`] bounds: one workload cannot take every slot and leave the others'
/// calls uncounted. The same pair counts, under the other keys of `quota_key`, the slots of
/// all processes and the error keys of each cgroup and of all.
#[map(name = "CGROUP_TAKEN")]
static CGROUP_TAKEN: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

#[map(name = "CGROUP_RETURNED")]
static CGROUP_RETURNED: HashMap<u64, u64> = HashMap::with_max_entries(4096, 0);

#[map(name = "PROCESS_EXITS")]
static PROCESS_EXITS: HashMap<u32, ProcessExit> = HashMap::with_max_entries(8192, 0);

/// Slow-call threshold in ns per syscall number; 0 means "never sample".
#[map(name = "SLOW_THRESHOLDS")]
static SLOW_THRESHOLDS: Array<u64> = Array::with_max_entries(MAX_SYSCALL_NR, 0);

#[map(name = "SLOW_RATE")]
static SLOW_RATE: PerCpuArray<RateWindow> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "SLOW_EVENTS")]
static SLOW_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Where a slow-call record is built before it goes to `SLOW_EVENTS` (see `SlowCallScratch`).
#[map(name = "SLOW_SCRATCH")]
static SLOW_SCRATCH: PerCpuArray<SlowCallScratch> = PerCpuArray::with_max_entries(1, 0);

/// Slow-call events each CPU may emit per second; set by the loader (0: sampling off).
#[unsafe(no_mangle)]
#[used]
static SLOW_EVENTS_PER_CPU_PER_SEC: u32 = 0;

/// Copies per `SYSCALL_STATS` slot (a power of two, at most `MAX_STAT_STRIPES`); set by the
/// loader from the possible CPUs.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_STAT_STRIPES: u32 = 1;

/// Slots one cgroup's keys may hold (0: no quota); set by the loader.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_CGROUP_QUOTA: u32 = 0;

/// Slots the keys of processes may hold in all (0: no bound); the rest of the table is the
/// shared keys' reserve. Set by the loader.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_OWN_SLOTS: u32 = 0;

/// Error keys one cgroup's processes may hold (0: no quota); set by the loader.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_ERROR_QUOTA: u32 = 0;

/// Error keys all processes may hold (0: no bound); the rest of `SYSCALL_ERRORS` is the
/// shared keys' reserve. Set by the loader.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_OWN_ERRORS: u32 = 0;

/// Non-zero: count only the target selected by the trace filter; set by the loader.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_TARGET_ONLY: u32 = 0;

/// Non-zero: split each call's time by where its task was (see `sched.rs`); set by the loader.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_TIME_BY_STATE: u32 = 0;

/// Whether calls' time is split by state (a global the verifier folds: with 0, the code behind
/// it is not even loaded).
#[inline(always)]
pub(crate) fn time_by_state() -> bool {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&SYSCALL_TIME_BY_STATE) != 0 }
}

#[inline(always)]
fn target_only() -> bool {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&SYSCALL_TARGET_ONLY) != 0 }
}

/// Cgroup migrations and task exits seen (in `.bss`): a CPU's cached identity of its task is
/// valid while the count it was read at is still current. A migration changes a task's cgroup;
/// an exit may free a `task_struct` whose address a new task (of another process) then gets.
/// Both are rare next to syscalls, so the count is almost always unchanged and re-reading
/// after one is cheap.
static IDENTITY_GENERATION: Counter = Counter(UnsafeCell::new(0));

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

/// The current task (`task_struct` address), the identity of whatever the CPU caches.
#[inline(always)]
pub(crate) fn current_task() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_current_task() }
}

/// Makes the CPU's cached identity that of `task` (the current task): read again when another
/// task's is cached, or after a migration or an exit counted since it was read.
#[inline(always)]
fn identify(cpu: &mut CpuState, task: u64, regs: *const u8) {
    // Read the count before the ids: a migration moves the task first and counts afterwards,
    // so an id read after a count that is already stale is re-read on the next call.
    let generation = IDENTITY_GENERATION.get();
    if cpu.task == task && cpu.generation == generation {
        return;
    }
    if cpu.task != task {
        // The cached slots stay: those of the other task's keys are refused by their copies'
        // owner check and replaced on first use.
        cpu.task = task;
        cpu.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    }
    // Which table the task's numbers come from, read here rather than per call: a 32-bit
    // process makes only compat calls, and an `execve` into the other ABI moves the
    // generation (`sched_process_exec`).
    cpu.compat = u32::from(is_compat(task, regs));
    // SAFETY: the helper has no preconditions.
    cpu.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // A migration or exit counted meanwhile may have changed what was read: then the ids are
    // used for this call only, and read again on the next.
    cpu.generation = if IDENTITY_GENERATION.get() == generation {
        generation
    } else {
        CpuState::NO_IDENTITY
    };
    // Where `sched_switch` may not create the task's storage (before Linux 6.4 the allocation
    // may wake kswapd under the runqueue lock), it is created here, in process context, before
    // any of the task's calls on this CPU begins: every task runs this path before its first
    // call (a new task is new to every CPU, and a reused `task_struct` follows an exit, which
    // moved the generation), and the storage lives as long as the task. If it cannot be
    // created, the identity is read again, and creation retried, on the next call.
    if !crate::sched::create_in_switch() && SYSCALL_THREADS.current(true).is_null() {
        cpu.generation = CpuState::NO_IDENTITY;
    }
}

/// `TS_COMPAT` in x86's `thread_info.status`.
const TS_COMPAT: u32 = 0x0002;
/// `PSR_MODE32_BIT` in arm64's `pstate`.
const PSR_MODE32_BIT: u64 = 0x10;
/// Offset of `pstate` in arm64's `struct pt_regs` (after `regs[31]`, `sp` and `pc`).
const ARM64_PSTATE_OFFSET: usize = 33 * 8;

/// Whether the current task `task`, whose syscall registers are at `regs`, is in a 32-bit
/// compat call (x86_64: `TS_COMPAT`, set at each ia32 entry, `int 0x80` from 64-bit code
/// included; arm64: an AArch32 task). Two helper calls: identity path only.
#[inline(always)]
fn is_compat(task: u64, regs: *const u8) -> bool {
    if cfg!(bpf_target_arch = "x86_64") {
        let offset = crate::sched::compat_status();
        if offset == NO_FIELD {
            return false;
        }
        // SAFETY: an offset within the current `task_struct`, read through the helper.
        let status = unsafe { bpf_probe_read_kernel((task + offset as u64) as *const u32) };
        status.is_ok_and(|s| s & TS_COMPAT != 0)
    } else if cfg!(bpf_target_arch = "aarch64") {
        // SAFETY: an offset within the `struct pt_regs` at `regs`, read through the helper.
        let p = unsafe { regs.add(ARM64_PSTATE_OFFSET) } as *const u64;
        // SAFETY: the helper checks the address and fails on one it cannot read.
        unsafe { bpf_probe_read_kernel(p) }.is_ok_and(|pstate| pstate & PSR_MODE32_BIT != 0)
    } else {
        false
    }
}

/// The stats key of the CPU's task for syscall `nr` on a descriptor of class `fd`.
#[inline(always)]
fn key_of(cpu: &CpuState, nr: u32, fd: FdClass) -> SyscallKey {
    SyscallKey {
        cgroup_id: cpu.cgroup_id,
        tgid: cpu.tgid,
        nr,
        fd,
    }
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> i32 {
    if target_only() && !crate::trace::is_target(bpf_get_current_pid_tgid()) {
        return 0;
    }
    let Some(cpu) = SYSCALL_CPU.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's value of a per-CPU array, valid while the program runs; programs do
    // not nest on a CPU, and `sched_switch` (which also writes it) runs only between programs.
    let cpu = unsafe { &mut *cpu };
    // TP_PROTO(struct pt_regs *regs, long id)
    let regs = ctx.arg::<*const u8>(0);
    identify(cpu, current_task(), regs);
    let id = ctx.arg::<u64>(1);
    let nr = if cpu.compat == 0 {
        bounded_nr(id)
    } else {
        bounded_compat_nr(id)
    };
    if nr == INVALID_NR {
        count_drop(counters::SYSCALL_INVALID_NR);
    }
    if noreturn::is_noreturn(nr) {
        // No sys_exit will follow: count the call now, with no duration.
        cpu.start_ns = 0;
        let key = key_of(cpu, nr, FdClass::NONE);
        record_duration(cpu, &key, 0, &StateStats::ZERO);
        return 0;
    }
    cpu.nr = nr;
    cpu.fd = if fd_class::classified(nr) && crate::fd_class::enabled() {
        // The descriptor is the first argument, in the `pt_regs` of the tracepoint (a compat
        // call's in its own register).
        let fd = if cpu.compat == 0 {
            read_syscall_arg0(regs)
        } else {
            read_compat_syscall_arg0(regs)
        };
        match cpu.fd_cache.get_mut(CpuState::fd_cache_entry(cpu.task, fd)) {
            Some(cache) => crate::fd_class::unpack(crate::fd_class::classify(fd, cache)),
            None => FdClass::NONE,
        }
    } else {
        FdClass::NONE
    };
    // SAFETY: the helper has no preconditions.
    cpu.start_ns = unsafe { bpf_ktime_get_ns() };
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> i32 {
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(cpu) = SYSCALL_CPU.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: as in sys_enter.
    let cpu = unsafe { &mut *cpu };
    let task = current_task();
    let (start_ns, nr, fd, now, parts) = if cpu.task == task && cpu.start_ns != 0 {
        // The common case: the task kept the CPU since its entry, all of it on CPU.
        let start = cpu.start_ns;
        cpu.start_ns = 0;
        (start, cpu.nr, cpu.fd, now, StateStats::ZERO)
    } else {
        // Switched out mid-call: `sched_switch` kept the entry in the thread's storage; or no
        // entry was seen. Only here is the number read from the registers.
        // TP_PROTO(struct pt_regs *regs, long ret)
        // The identity first: it says which table the number is from.
        identify(cpu, task, ctx.arg::<*const u8>(0));
        let id = read_syscall_nr(ctx.arg::<*const u8>(0));
        let exit_nr = if cpu.compat == 0 {
            bounded_nr(id)
        } else {
            bounded_compat_nr(id)
        };
        match take_spill(now, exit_nr) {
            Some(spill) => {
                if cpu.resumed == task {
                    // The call ends here: the task's next switch-out has nothing to stamp.
                    cpu.resumed = 0;
                }
                spill
            }
            None => match exit_without_entry(exit_nr, ctx.arg::<i64>(1)) {
                // Counted with no duration: its entry was never seen.
                Some(nr) => (now, nr, FdClass::NONE, now, StateStats::ZERO),
                None => return 0,
            },
        }
    };
    // Also after a migration during the call (a task that wrote its own pid to cgroup.procs).
    identify(cpu, task, ctx.arg::<*const u8>(0));
    let duration = now.saturating_sub(start_ns);
    let key = key_of(cpu, nr, fd);
    record_duration(cpu, &key, duration, &parts);

    // TP_PROTO(struct pt_regs *regs, long ret)
    let ret = ctx.arg::<i64>(1);
    if ret < 0 && ret >= -MAX_ERRNO && !special::returns_restored_register(nr) {
        record_error(&key, (-ret) as u16);
    }

    if let Some(threshold) = SLOW_THRESHOLDS.get(key.nr) {
        let threshold = *threshold;
        if threshold != 0 && duration >= threshold {
            let span = SlowSpan {
                start_ns,
                end_ns: now,
                parts,
            };
            sample_slow_call(ctx.arg::<*const u8>(0), &key, &span, ret);
        }
    }
    0
}

/// Queues a process for reclaim when its leader exits, with the comm user space can no longer
/// read from /proc. (Each thread's `SYSCALL_THREADS` value is freed by the kernel with it.)
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(_ctx: RawTracePointContext) -> i32 {
    // Any task's exit: its `task_struct` may be reused, so no CPU may trust an identity it
    // cached by address.
    IDENTITY_GENERATION.increment();
    // The tracepoint fires in the exiting task's context.
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    if tid == tgid && (!target_only() || crate::trace::is_target(pid_tgid)) {
        let exit = ProcessExit {
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
            // SAFETY: the helper has no preconditions.
            cgroup_id: unsafe { bpf_get_current_cgroup_id() },
            // SAFETY: the helper has no preconditions.
            exit_ns: unsafe { bpf_ktime_get_ns() },
        };
        if PROCESS_EXITS.insert(&tgid, &exit, 0).is_err() {
            count_drop(counters::PROCESS_EXITS_FULL);
        }
    }
    0
}

/// A task replaced its program (`execve`): it may now make calls of the other ABI (a 64-bit
/// shell starting a 32-bit program), which the CPUs read with the identity. Exec is rare.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(_ctx: RawTracePointContext) -> i32 {
    IDENTITY_GENERATION.increment();
    0
}

/// A task moved to another cgroup (`cgroup.procs`, `cgroup.threads`, ...): every cached
/// cgroup id may be stale. Fires after the move, once per moved process or thread.
#[raw_tracepoint(tracepoint = "cgroup_attach_task")]
pub fn cgroup_attach_task(_ctx: RawTracePointContext) -> i32 {
    IDENTITY_GENERATION.increment();
    0
}

/// What an exit with no entry (neither on its CPU nor kept by `sched_switch`) counts as: the
/// syscall `exit_nr` (the number in the registers), or `None` when nothing is counted.
///
/// `syscall_trace_enter()` runs seccomp before the `sys_enter` tracepoint, so a call a seccomp
/// filter denies (the default profile of every container runtime) reaches only `sys_exit`: it
/// is counted here, with its errno and no duration. A new task's first return from the call
/// that made it (`fork`, `clone`, ... returning 0 in the child) is no call at all. A call in
/// flight when the probes attached, or whose entry could not be kept (`SYSCALL_THREADS_FULL`),
/// is counted the same way as a denied one. Only an exit whose registers name no call is a
/// missed event.
#[inline(always)]
fn exit_without_entry(exit_nr: u32, ret: i64) -> Option<u32> {
    // With a target, every other thread's calls end here: neither counted nor a miss.
    if target_only() && !crate::trace::is_target(bpf_get_current_pid_tgid()) {
        return None;
    }
    if ret == 0 && special::starts_task(exit_nr) {
        return None;
    }
    if exit_nr == INVALID_NR {
        count_drop(counters::SYSCALL_EXIT_WITHOUT_ENTER);
        return None;
    }
    Some(exit_nr)
}

/// The entry `sched_switch` kept for the current thread, taken, as (start, nr, class, end,
/// parts off CPU); `None` when there is none. `now` is the exit's clock read; the end is never
/// before the last stamp, so the parts never exceed the duration. `exit_nr` is the number in
/// the exit's registers: an entry of another call is stale (its own exit could not take it,
/// as when the storage was busy on that CPU on kernels up to 6.1) and is dropped as a miss
/// rather than lend this exit its start.
/// [`INVALID_NR`] there (a call that cleared its number, as `rt_sigreturn` does when it restores
/// the registers) takes the entry whatever its number, and an exec's exit takes the entry of
/// an exec of the other ABI (a 64-bit process exec'ing a 32-bit program ends its `execve` as
/// the i386 one: [`special::is_exec`]).
#[inline(always)]
fn take_spill(now: u64, exit_nr: u32) -> Option<(u64, u32, FdClass, u64, StateStats)> {
    let spill = SYSCALL_THREADS.current(false);
    if spill.is_null() {
        return None;
    }
    // SAFETY: a non-null task-storage value of the current task, ours until the program ends.
    let spill = unsafe { &mut *spill };
    if spill.start_ns == 0 {
        return None;
    }
    let start = spill.start_ns;
    spill.start_ns = 0;
    if spill.nr != exit_nr
        && exit_nr != INVALID_NR
        && !(special::is_exec(spill.nr) && special::is_exec(exit_nr))
    {
        count_drop(counters::SYSCALL_EXIT_WITHOUT_ENTER);
        return None;
    }
    if !time_by_state() {
        return Some((start, spill.nr, spill.fd, now, StateStats::ZERO));
    }
    let end = if now > spill.mark_ns {
        now
    } else {
        spill.mark_ns
    };
    let mut parts = StateStats {
        wait_ns: spill.wait_ns,
        blocked_ns: spill.blocked_ns,
        unknown_ns: spill.unknown_ns,
        switched: 1,
    };
    if spill.state != call_state::ON_CPU {
        // Running now, yet never seen switched in: the stretch since the last stamp is not
        // known to be any one part.
        parts.unknown_ns += end - spill.mark_ns;
    }
    Some((start, spill.nr, spill.fd, end, parts))
}

/// Adds one call to the key's statistics, in the copy of its slot this CPU writes. The common
/// case costs an inlined array lookup: the CPU's cache names the slot, and the copy's owner
/// confirms it. A call that left its CPU (`parts.switched`) also adds its parts off CPU, first.
#[inline(always)]
fn record_duration(cpu: &mut CpuState, key: &SyscallKey, duration: u64, parts: &StateStats) {
    let bucket = hist::bucket_index(duration);
    let epoch = SLOT_EPOCH.get(0).copied().unwrap_or(0);
    let tag = slot_cache::tag(epoch, key.tgid, key.nr, &key.fd);
    let set = slot_cache::set_of(key.nr);
    let (Some(&first), Some(&second)) = (cpu.slots.get(set), cpu.slots.get(set + 1)) else {
        return;
    };
    let stripe = stripe_of_this_cpu();
    if let Some(slot) = slot_cache::hit(first, tag).or_else(|| slot_cache::hit(second, tag)) {
        if let Some(copy) = stat_copy(slot, stripe) {
            // SAFETY: a value of an array map, valid while the program runs; written only with
            // atomic adds (counts) or by the probe that takes the slot before publishing it.
            let copy = unsafe { &mut *copy };
            if counts_for(&copy.key, key) {
                if parts.switched != 0 {
                    add_parts(slot, stripe, parts);
                }
                add_call(copy, bucket, duration);
                return;
            }
        }
    }
    let slot = slot_of(key);
    if slot == NO_SLOT {
        count_drop(counters::SYSCALL_STATS_FULL);
        return;
    }
    let Some(copy) = stat_copy(slot, stripe) else {
        return;
    };
    // SAFETY: as above.
    let copy = unsafe { &mut *copy };
    if !counts_for(&copy.key, key) {
        // User space freed the slot between the lookup and now (its process exited while
        // this thread still ran): the call cannot be placed.
        count_drop(counters::SYSCALL_STATS_FULL);
        return;
    }
    if parts.switched != 0 {
        add_parts(slot, stripe, parts);
    }
    add_call(copy, bucket, duration);
    // The new entry goes first and the set's previous first entry second, unless the first
    // already names this slot (a hit whose copy did not name the key).
    let fresh = slot_cache::entry(tag, slot);
    if fresh != first {
        if let Some(way) = cpu.slots.get_mut(set + 1) {
            *way = first;
        }
        if let Some(way) = cpu.slots.get_mut(set) {
            *way = fresh;
        }
    }
}

/// Whether a copy owned by `owner` counts the calls of `key`: its own, or its cgroup's shared
/// key when the key was folded.
#[inline(always)]
fn counts_for(owner: &SyscallKey, key: &SyscallKey) -> bool {
    owner.cgroup_id == key.cgroup_id
        && owner.nr == key.nr
        && owner.fd == key.fd
        && (owner.tgid == key.tgid || owner.tgid == FOLDED_TGID)
}

/// The copies of a slot this CPU adds to (CPUs share a copy only when they are a multiple of
/// the stripe count apart).
#[inline(always)]
fn stripe_of_this_cpu() -> u32 {
    // SAFETY: a loader-set global, read once per call.
    let stripes = unsafe { core::ptr::read_volatile(&SYSCALL_STAT_STRIPES) };
    // SAFETY: the helper has no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    cpu & stripes.wrapping_sub(1)
}

#[inline(always)]
fn stat_copy(slot: u32, stripe: u32) -> Option<*mut SlotStats> {
    // SAFETY: as in `stripe_of_this_cpu`.
    let stripes = unsafe { core::ptr::read_volatile(&SYSCALL_STAT_STRIPES) };
    SYSCALL_STATS.get_ptr_mut(slot.wrapping_mul(stripes).wrapping_add(stripe))
}

#[inline(always)]
fn add_call(copy: &mut SlotStats, bucket: usize, duration: u64) {
    // SAFETY: aligned u64 fields of a map value, updated atomically: other CPUs add to the same
    // copy (the stripe count is below the CPU count on big nodes), and a program preempted
    // mid-run must not lose another task's add.
    unsafe {
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&mut copy.stats.sum_ns, duration)
    };
    if let Some(b) = copy.stats.buckets.get_mut(bucket) {
        // SAFETY: as above.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(b, 1) };
    }
    if copy.key.tgid == FOLDED_TGID {
        count_drop(counters::SYSCALL_FOLDED);
    }
}

/// Adds a switched-out call's parts off CPU to the copy of `SYSCALL_STATES` beside the
/// copy of `SYSCALL_STATS` it is counted in. Called before the duration is added there: user
/// space reads `SYSCALL_STATS` first, so what it reads of the durations always has its parts
/// (the on-CPU remainder it derives never runs ahead). Off the common path, and a BPF
/// subprogram of its own, as [`slot_of`].
#[inline(never)]
fn add_parts(slot: u32, stripe: u32, parts: &StateStats) {
    // SAFETY: as in `stripe_of_this_cpu`.
    let stripes = unsafe { core::ptr::read_volatile(&SYSCALL_STAT_STRIPES) };
    let Some(copy) = SYSCALL_STATES.get_ptr_mut(slot.wrapping_mul(stripes).wrapping_add(stripe))
    else {
        return;
    };
    // SAFETY: aligned u64 fields of an array value shared by the CPUs of this stripe, updated
    // atomically (as `add_call`).
    unsafe {
        let copy = &mut *copy;
        if parts.wait_ns != 0 {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&mut copy.wait_ns, parts.wait_ns);
        }
        if parts.blocked_ns != 0 {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                &mut copy.blocked_ns,
                parts.blocked_ns,
            );
        }
        if parts.unknown_ns != 0 {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                &mut copy.unknown_ns,
                parts.unknown_ns,
            );
        }
        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&mut copy.switched, 1);
    }
}

/// What [`slot_of`] returns when no slot can count the call.
const NO_SLOT: u32 = u32::MAX;

/// The slot that counts `key`'s calls: its own (taken from the free slots when it has none
/// yet), or its cgroup's shared key's when the cgroup holds its quota, the keys of processes
/// hold their share of the table, or no slot is free; [`NO_SLOT`] when neither can have one.
/// The shared keys alone may take the last eighth of the table (`SYSCALL_OWN_SLOTS`), so
/// however many cgroups sit at their quota, a cgroup's calls still find a slot to fold into.
/// Off the common path, and a function of its own (a BPF subprogram) so that older verifiers,
/// which explore every path of an inlined body once per path leading to it, stay within their
/// complexity limit.
#[inline(never)]
fn slot_of(key: &SyscallKey) -> u32 {
    // SAFETY: a read of a hash map value, copied out at once.
    if let Some(slot) = unsafe { SYSCALL_SLOTS.get(key) } {
        return *slot;
    }
    let folded = SyscallKey {
        tgid: FOLDED_TGID,
        ..*key
    };
    // SAFETY: loader-set globals.
    let (quota, own) = unsafe {
        (
            core::ptr::read_volatile(&SYSCALL_CGROUP_QUOTA),
            core::ptr::read_volatile(&SYSCALL_OWN_SLOTS),
        )
    };
    if !holds(key.cgroup_id, quota) && !holds(quota_key::ALL_SLOTS, own) {
        if let Some((slot, fresh)) = take_slot(key) {
            if fresh {
                count_taken(key.cgroup_id);
                count_taken(quota_key::ALL_SLOTS);
            }
            return slot;
        }
    }
    match take_slot(&folded) {
        Some((slot, _)) => slot,
        None => NO_SLOT,
    }
}

/// Whether what `count` counts (see [`quota_key`]) holds `bound` entries, or its count cannot
/// be kept; false when `bound` is 0 (no bound). A BPF subprogram: [`slot_of`] and
/// [`record_error`] ask it twice each.
#[inline(never)]
fn holds(count: u64, bound: u32) -> bool {
    if bound == 0 {
        return false;
    }
    let Some(taken) = CGROUP_TAKEN.get_ptr(&count) else {
        // First entry it counts; if its count cannot be created (the map is full), the entry
        // folds rather than take room nobody counts.
        return match CGROUP_TAKEN.insert(&count, &zero(), BPF_NOEXIST as u64) {
            Ok(()) => false,
            Err(err) => err != EEXIST,
        };
    };
    // SAFETY: a value of a hash map, read whole (an aligned u64).
    let taken = unsafe { core::ptr::read_volatile(taken) };
    // SAFETY: as above.
    let returned = unsafe { CGROUP_RETURNED.get(&count) }.copied().unwrap_or(0);
    taken.saturating_sub(returned) >= bound as u64
}

/// Counts one more entry under `count` (see [`quota_key`]).
#[inline(always)]
fn count_taken(count: u64) {
    if let Some(taken) = CGROUP_TAKEN.get_ptr_mut(&count) {
        // SAFETY: an aligned u64 of a hash map value; CPUs add to it at once.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(taken, 1) };
    }
}

/// `key`'s slot, taken from the free slots when it has none yet, and whether this call took
/// it. The probe that takes a slot names the key in every copy before it publishes the slot
/// in `SYSCALL_SLOTS`, so no CPU ever finds a published slot whose copies name another key.
#[inline(always)]
fn take_slot(key: &SyscallKey) -> Option<(u32, bool)> {
    // SAFETY: as in `slot_of`.
    if let Some(slot) = unsafe { SYSCALL_SLOTS.get(key) } {
        return Some((*slot, false));
    }
    let slot = FREE_SLOTS.pop().ok().flatten()?;
    // SAFETY: a loader-set global.
    let stripes = unsafe { core::ptr::read_volatile(&SYSCALL_STAT_STRIPES) };
    let mut stripe = 0;
    while stripe < MAX_STAT_STRIPES && stripe < stripes {
        if let Some(copy) = stat_copy(slot, stripe) {
            // SAFETY: a free slot's copy: no published key names it, so nothing adds to it.
            // Its statistics are zero already (user space zeroes a slot before freeing it, and
            // a never-used one was created zeroed); only the owner changes. (Two 8-byte
            // stores: zeroing the whole copy here would cost a memset loop that older
            // verifiers walk byte by byte, once per stripe.)
            unsafe { (*copy).key = *key };
        }
        stripe += 1;
    }
    match SYSCALL_SLOTS.insert(key, &slot, BPF_NOEXIST as u64) {
        Ok(()) => Some((slot, true)),
        Err(err) => {
            // Another CPU gave the key a slot first (EEXIST), or the map is full: hand ours back.
            let _ = FREE_SLOTS.push(slot, 0);
            if err == EEXIST {
                // SAFETY: as in `slot_of`.
                unsafe { SYSCALL_SLOTS.get(key) }.map(|slot| (*slot, false))
            } else {
                None
            }
        }
    }
}

/// Counts one failed call. A process's own error key is created only while its cgroup's
/// processes hold fewer than `SYSCALL_ERROR_QUOTA` error keys and all processes together fewer
/// than `SYSCALL_OWN_ERRORS`; past either, or with the map full, the error counts under the
/// cgroup's shared key, as its calls do. The shared keys alone may take the rest of the map.
/// Off the common path, and a BPF subprogram for the same reason as [`slot_of`].
#[inline(never)]
fn record_error(key: &SyscallKey, errno: u16) {
    let ekey = ErrnoKey {
        cgroup_id: key.cgroup_id,
        tgid: key.tgid,
        // A bounded number: below MAX_SYSCALL_NR, so it fits.
        nr: key.nr as u16,
        errno,
        fd: key.fd,
    };
    if add_error(&ekey) {
        return;
    }
    // SAFETY: loader-set globals.
    let (quota, own) = unsafe {
        (
            core::ptr::read_volatile(&SYSCALL_ERROR_QUOTA),
            core::ptr::read_volatile(&SYSCALL_OWN_ERRORS),
        )
    };
    let count = quota_key::errors_of(key.cgroup_id);
    if !holds(count, quota) && !holds(quota_key::ALL_ERRORS, own) {
        match insert_error(&ekey) {
            Inserted::Created => {
                count_taken(count);
                count_taken(quota_key::ALL_ERRORS);
                return;
            }
            Inserted::Added => return,
            Inserted::Full => {}
        }
    }
    let folded = ErrnoKey {
        tgid: FOLDED_TGID,
        ..ekey
    };
    if !add_error(&folded) && matches!(insert_error(&folded), Inserted::Full) {
        count_drop(counters::SYSCALL_ERRORS_FULL);
    }
}

/// Adds one to an existing error count; false when the key has none.
#[inline(always)]
fn add_error(key: &ErrnoKey) -> bool {
    match SYSCALL_ERRORS.get_ptr_mut(key) {
        Some(count) => {
            // SAFETY: an aligned u64 of a hash map value; CPUs add to it at once.
            unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(count, 1) };
            true
        }
        None => false,
    }
}

/// What [`insert_error`] did.
enum Inserted {
    /// Created the key's count, at one.
    Created,
    /// Another CPU created it first; added one to it.
    Added,
    /// The map is full: nothing counted.
    Full,
}

/// Creates an error count of one (or adds to the one another CPU created first).
#[inline(always)]
fn insert_error(key: &ErrnoKey) -> Inserted {
    match SYSCALL_ERRORS.insert(key, &1u64, BPF_NOEXIST as u64) {
        Ok(()) => Inserted::Created,
        Err(EEXIST) if add_error(key) => Inserted::Added,
        Err(_) => Inserted::Full,
    }
}

/// A slow call's entry and exit and its time off CPU, as `sys_exit` hands them to
/// [`sample_slow_call`] (by reference: a BPF subprogram takes at most five arguments).
struct SlowSpan {
    start_ns: u64,
    end_ns: u64,
    parts: StateStats,
}

/// Writes one slow call to the ring buffer, within the per-CPU events-per-second budget; `regs`
/// is the tracepoint's `pt_regs`. A BPF subprogram: its work runs for slow calls only, and
/// inlined it would take registers from `sys_exit`'s common path.
#[inline(never)]
fn sample_slow_call(regs: *const u8, key: &SyscallKey, span: &SlowSpan, ret: i64) {
    let (start_ns, end_ns) = (span.start_ns, span.end_ns);
    // SAFETY: a global the loader sets before the load, read as a whole.
    let limit = unsafe { core::ptr::read_volatile(&SLOW_EVENTS_PER_CPU_PER_SEC) } as u64;
    if limit == 0 {
        return;
    }
    let Some(window) = SLOW_RATE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's value of a per-CPU array, valid while the program runs (programs do not nest on a CPU).
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
    let Some(record) = SLOW_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's value of a per-CPU array, valid while the program runs (programs do
    // not nest on a CPU). Every field of the event is written below: the value is reused.
    let record = unsafe { &mut *record };
    let event = &mut record.event;
    event.call.start_ns = start_ns;
    event.call.end_ns = end_ns;
    event.call.cgroup_id = key.cgroup_id;
    event.call.tgid = key.tgid;
    event.call.tid = bpf_get_current_pid_tgid() as u32;
    event.nr = key.nr;
    event._pad = 0;
    event.fd = key.fd;
    event.ret = ret;
    read_syscall_args(regs, &mut event.args);
    event.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    event.wait_ns = span.parts.wait_ns;
    event.blocked_ns = span.parts.blocked_ns;
    event.unknown_ns = span.parts.unknown_ns;
    let name_len = name_file(key.nr, ret, record);
    // The event and as many bytes of the name as it has. (A name is never longer than
    // NAME_BYTES: the mask and the check only prove it to the verifier.)
    let len = size_of::<SlowCallEvent>() + (name_len as usize & (file::NAME_BYTES * 2 - 1));
    if len > size_of::<SlowCallEvent>() + file::NAME_BYTES {
        return;
    }
    // SAFETY: `len` bytes of this CPU's scratch value, which holds the event and NAME_BYTES
    // of name after it.
    let bytes = unsafe {
        core::slice::from_raw_parts((record as *const SlowCallScratch).cast::<u8>(), len)
    };
    // Wake the reader for every record. By default the kernel wakes it only when it has read
    // everything before this record, so one missed wake-up leaves records waiting for an
    // unrelated one: spans arrived seconds late. Records are rate-limited, so the wake-ups are
    // too.
    if SLOW_EVENTS
        .output::<[u8]>(bytes, BPF_RB_FORCE_WAKEUP as u64)
        .is_err()
    {
        count_drop(counters::SLOW_RINGBUF_FULL);
    }
}

/// Reads the file of the descriptor slow call `nr` names into `record` (identity, and the
/// name that follows the event), while the descriptor is still open; returns the name's
/// length. The process may exit or close the descriptor right after the call, so user space
/// could not read it from `/proc` reliably, nor tell a reused descriptor number apart.
#[inline(always)]
fn name_file(nr: u32, ret: i64, record: &mut SlowCallScratch) -> u32 {
    match crate::fd_class::slow_call_fd(nr, &record.event.args, ret) {
        Some(fd) => crate::fd_class::describe_file(fd, record),
        None => {
            record.event.file = FileIdentity::NONE;
            0
        }
    }
}
