//! The syscall family (`ebpf/probes/src/syscalls.rs`, `exporter/src/kernel/syscalls.rs`):
//! per-CPU calls in flight, the table of statistics slots, errors by errno, process exits and
//! slow-call samples, with the syscall numbers the probes bound or special-case.

use crate::{fd_class::file, hist, FdCache, FdClass, FileIdentity, LatencyHistogram, NO_FIELD};

maps! {
    /// Task-local storage: the calls in flight of tasks switched out mid-call ([`crate::ThreadSpill`];
    /// the key is the task's pid file descriptor).
    SYSCALL_THREADS: TaskStorage(i32 => ThreadSpill),
    /// Per-CPU: the running task's call in flight and cached identity ([`crate::CpuState`]).
    SYSCALL_CPU: PerCpuArray(u32 => CpuState),
    /// The statistics slots, a few copies each ([`crate::SlotStats`]).
    SYSCALL_STATS: Array(u32 => SlotStats),
    /// (cgroup, process, syscall) -> its slot in `SYSCALL_STATS`.
    SYSCALL_SLOTS: HashMap(SyscallKey => u32),
    /// The slots no key owns (a stack: no key).
    FREE_SLOTS: Stack(() => u32),
    /// One `u64`, bumped by user space when it frees slots (see [`crate::slot_cache`]).
    SLOT_EPOCH: Array(u32 => u64),
    /// Errors by errno: a count per [`crate::ErrnoKey`] (atomic adds).
    SYSCALL_ERRORS: HashMap(ErrnoKey => u64),
    /// cgroup id -> slots of `SYSCALL_STATS` the probes have handed to its keys (atomic adds).
    CGROUP_TAKEN: HashMap(u64 => u64),
    /// cgroup id -> slots of its keys user space has freed (written by user space only).
    CGROUP_RETURNED: HashMap(u64 => u64),
    /// tgid -> what user space needs to reclaim an exited process's entries.
    PROCESS_EXITS: HashMap(u32 => ProcessExit),
    /// Slow-call threshold in nanoseconds per syscall number (0: never sampled).
    SLOW_THRESHOLDS: Array(u32 => u64),
    /// Per-CPU window of the slow-call rate limiter.
    SLOW_RATE: PerCpuArray(u32 => RateWindow),
    /// Ring buffer of slow-call records: a [`crate::SlowCallEvent`], then its file's name.
    SLOW_EVENTS: RingBuf(() => SlowCallEvent),
    /// Per-CPU: where a slow-call record is built ([`crate::SlowCallScratch`]).
    SLOW_SCRATCH: PerCpuArray(u32 => SlowCallScratch),
    /// The time calls spent off their CPU, by slot copy as in `SYSCALL_STATS` ([`crate::StateStats`]);
    /// added to only for calls that were switched out.
    SYSCALL_STATES: Array(u32 => StateStats),
    /// Ring buffer of [`crate::OffCpuEvent`] records (`sysscope trace` only, see
    /// [`globals::SYSCALL_STATE_TRACE`]).
    OFFCPU_EVENTS: RingBuf(() => OffCpuEvent),
}

programs! {
    SYS_ENTER = "sys_enter",
    SYS_EXIT = "sys_exit",
    PROCESS_EXIT = "sched_process_exit",
    /// On `sched:sched_process_exec`: invalidates the cached identities, whose compat flag
    /// an exec into the other ABI changes.
    PROCESS_EXEC = "sched_process_exec",
    /// On `cgroup:cgroup_attach_task`: invalidates the cached cgroup ids.
    CGROUP_ATTACH = "cgroup_attach_task",
    /// On `sched:sched_switch` (BTF tracepoint): moves a call in flight of a task switched out
    /// mid-call from its CPU's `SYSCALL_CPU` to its `SYSCALL_THREADS` value and, with
    /// [`globals::SYSCALL_TIME_BY_STATE`], stamps the switch-out and the switch-in of tasks in a call.
    SCHED_SWITCH = "sched_switch",
    /// On `sched:sched_wakeup` (BTF tracepoint): stamps the wakeup of a task blocked in a call
    /// (attached only with [`globals::SYSCALL_TIME_BY_STATE`]).
    SCHED_WAKEUP = "sched_wakeup",
}

globals! {
    /// `u32`: slow-call events allowed per CPU per second (0 disables slow-call sampling).
    SLOW_EVENTS_PER_CPU_PER_SEC: u32,
    /// `u32`: non-zero when the syscall programs count only the target the trace filter
    /// selects (`TRACE_CGROUP_ID`, `TRACE_FILTER_TGIDS`): set by the command-line tools, so a
    /// busy node cannot fill their maps; 0 (count everything) for the exporter.
    SYSCALL_TARGET_ONLY: u32,
    /// `u32`, a power of two: copies of each `SYSCALL_STATS` slot, chosen by CPU
    /// ([`crate::SlotStats`]). Set by the loader from the possible CPUs (at most
    /// [`crate::MAX_STAT_STRIPES`]); 1 in the object.
    SYSCALL_STAT_STRIPES: u32,
    /// `u32`: slots one cgroup's keys may hold before its new keys fold into the cgroup's
    /// shared key ([`crate::FOLDED_TGID`]); 0: no quota.
    SYSCALL_CGROUP_QUOTA: u32,
    /// `u32`: slots the keys of processes may hold in all, cgroups together (0: no bound).
    /// The loader sets it below the table's size: the rest is a reserve only cgroups' shared
    /// keys take, so cgroups at their quota cannot leave another cgroup without a slot to
    /// fold into.
    SYSCALL_OWN_SLOTS: u32,
    /// `u32`: error keys of one cgroup's processes `SYSCALL_ERRORS` may hold before the
    /// cgroup's new errors fold into its shared key; 0: no quota.
    SYSCALL_ERROR_QUOTA: u32,
    /// `u32`: error keys of processes `SYSCALL_ERRORS` may hold in all (0: no bound); the rest
    /// of the map is the reserve of the cgroups' shared error keys.
    SYSCALL_OWN_ERRORS: u32,
    /// `u32`: non-zero when the scheduler programs split each call's time into on CPU, waiting
    /// for a CPU and blocked ([`crate::call_state`]); 0 leaves `sched_switch` as cheap as
    /// the spill alone needs (`syscalls.time_by_state`).
    SYSCALL_TIME_BY_STATE: u32,
    /// `u32`: non-zero when the scheduler programs also stream each off-CPU part of a call to
    /// `OFFCPU_EVENTS` (set by `sysscope trace`, whose syscall programs count only its
    /// target, so only the target's calls are streamed).
    SYSCALL_STATE_TRACE: u32,
    /// [`crate::SchedProbeConfig`]: where the scheduler programs read a task's state, and
    /// what the running kernel's task storage allows them.
    SCHED_CONFIG: SchedProbeConfig,
}

/// Upper bound on syscall numbers the probes index arrays with: native numbers below
/// [`COMPAT_BASE`] (x86_64 < 470, aarch64 < 470), then the 32-bit compat table's (ia32 on
/// x86_64, AArch32 on arm64) at `COMPAT_BASE + n`.
pub const MAX_SYSCALL_NR: u32 = 1024;

/// Where the numbers of 32-bit compat calls begin: a compat task's call `n` is counted as
/// `COMPAT_BASE + n`, so it is never taken for the native call of the same number (i386
/// `getppid`, 64, is x86_64 `semget`). User space names it from the compat table and counts it
/// under the native series of the same name.
pub const COMPAT_BASE: u32 = 512;

/// The number every syscall number out of range is counted as (exported as
/// `syscall="invalid"`): native numbers at or above [`COMPAT_BASE`] - 1 and compat numbers at
/// or above `INVALID_NR - COMPAT_BASE`. Any process may call `syscall(n)` with any `n`; the
/// kernel answers ENOSYS, and counting each `n` apart would let one process fill the maps and
/// the exposition. No architecture sysscope supports uses it.
pub const INVALID_NR: u32 = MAX_SYSCALL_NR - 1;

/// The syscall number the probes count a raw tracepoint `id` of a native (64-bit) call as:
/// itself when it is below [`COMPAT_BASE`] - 1, else [`INVALID_NR`] (negative ids included).
#[inline(always)]
pub fn bounded_nr(id: u64) -> u32 {
    if id < (COMPAT_BASE - 1) as u64 {
        id as u32
    } else {
        INVALID_NR
    }
}

/// The syscall number the probes count a raw tracepoint `id` of a 32-bit compat call as:
/// `COMPAT_BASE + id` when that is below [`INVALID_NR`], else [`INVALID_NR`].
#[inline(always)]
pub fn bounded_compat_nr(id: u64) -> u32 {
    if id < (INVALID_NR - COMPAT_BASE) as u64 {
        COMPAT_BASE + id as u32
    } else {
        INVALID_NR
    }
}

/// Whether a counted number ([`bounded_nr`], [`bounded_compat_nr`]) is a compat call's.
#[inline(always)]
pub fn is_compat_nr(nr: u32) -> bool {
    (COMPAT_BASE..INVALID_NR).contains(&nr)
}

/// The tgid of a cgroup's shared statistics key: calls of that cgroup's processes that could
/// not have a key of their own (the cgroup held [`globals::SYSCALL_CGROUP_QUOTA`] slots, or
/// none was free) are counted there, exported as `comm="other"`. No process has tgid 0.
pub const FOLDED_TGID: u32 = 0;

/// The keys of `CGROUP_TAKEN` and `CGROUP_RETURNED`: besides a cgroup's own id (the slots its
/// processes' keys hold), what the bounds of [`globals::SYSCALL_OWN_SLOTS`],
/// [`globals::SYSCALL_ERROR_QUOTA`] and [`globals::SYSCALL_OWN_ERRORS`] count. Cgroup ids are
/// kernfs inode numbers, far below 2^63, so none of these is ever a cgroup's id.
pub mod quota_key {
    /// Slots held by the keys of processes, all cgroups together.
    pub const ALL_SLOTS: u64 = u64::MAX;
    /// `SYSCALL_ERRORS` entries of processes, all cgroups together.
    pub const ALL_ERRORS: u64 = u64::MAX - 1;
    /// The bit that makes a cgroup id the key of its processes' error entries.
    pub const ERRORS: u64 = 1 << 63;

    /// The key counting the `SYSCALL_ERRORS` entries of `cgroup_id`'s processes.
    #[inline(always)]
    pub const fn errors_of(cgroup_id: u64) -> u64 {
        cgroup_id | ERRORS
    }
}

/// The part of a map of `entries` that the keys of processes may fill (the reserve, an eighth,
/// is left to the cgroups' shared keys): what the loader sets [`globals::SYSCALL_OWN_SLOTS`]
/// and [`globals::SYSCALL_OWN_ERRORS`] to.
pub const fn own_share(entries: u32) -> u32 {
    entries - entries / 8
}

/// Most copies of a `SYSCALL_STATS` slot (see [`SlotStats`]): memory stays fixed however many
/// CPUs a node has.
pub const MAX_STAT_STRIPES: u32 = 8;

/// Syscalls that never return to user space: counted at entry, with no duration.
pub mod noreturn {
    use super::COMPAT_BASE;

    /// Compat `exit` (i386 and AArch32 alike), counted as `COMPAT_BASE + 1`.
    pub const COMPAT_EXIT: u32 = COMPAT_BASE + 1;
    /// Compat `exit_group`: i386 252, AArch32 248.
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    pub const COMPAT_EXIT_GROUP: u32 = COMPAT_BASE + 248;
    #[cfg(not(any(target_arch = "aarch64", bpf_target_arch = "aarch64")))]
    pub const COMPAT_EXIT_GROUP: u32 = COMPAT_BASE + 252;

    /// Whether counted number `nr` ends its task or process (native or compat).
    #[inline(always)]
    pub fn is_noreturn(nr: u32) -> bool {
        nr == EXIT || nr == EXIT_GROUP || nr == COMPAT_EXIT || nr == COMPAT_EXIT_GROUP
    }

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

/// Syscall numbers the probes treat apart at exit, for the architecture they run on.
pub mod special {
    #[cfg(any(target_arch = "x86_64", bpf_target_arch = "x86_64"))]
    mod nr {
        pub const CLONE: u32 = 56;
        pub const FORK: u32 = 57;
        pub const VFORK: u32 = 58;
        pub const CLONE3: u32 = 435;
        pub const RT_SIGRETURN: u32 = 15;
        pub const RESTART_SYSCALL: u32 = 219;
        pub const EXECVE: u32 = 59;
        pub const EXECVEAT: u32 = 322;
        pub const COMPAT_EXECVEAT: u32 = crate::COMPAT_BASE + 358;
    }
    // The generic table has no fork or vfork: the clone numbers stand in for them.
    #[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
    mod nr {
        pub const CLONE: u32 = 220;
        pub const FORK: u32 = 220;
        pub const VFORK: u32 = 220;
        pub const CLONE3: u32 = 435;
        pub const RT_SIGRETURN: u32 = 139;
        pub const RESTART_SYSCALL: u32 = 128;
        pub const EXECVE: u32 = 221;
        pub const EXECVEAT: u32 = 281;
        pub const COMPAT_EXECVEAT: u32 = crate::COMPAT_BASE + 387;
    }
    #[cfg(not(any(
        target_arch = "x86_64",
        bpf_target_arch = "x86_64",
        target_arch = "aarch64",
        bpf_target_arch = "aarch64"
    )))]
    mod nr {
        pub const CLONE: u32 = u32::MAX;
        pub const FORK: u32 = u32::MAX;
        pub const VFORK: u32 = u32::MAX;
        pub const CLONE3: u32 = u32::MAX;
        pub const RT_SIGRETURN: u32 = u32::MAX;
        pub const RESTART_SYSCALL: u32 = u32::MAX;
        pub const EXECVE: u32 = u32::MAX;
        pub const EXECVEAT: u32 = u32::MAX;
        pub const COMPAT_EXECVEAT: u32 = u32::MAX;
    }
    pub use nr::*;

    /// The same calls in the 32-bit compat tables, counted at `COMPAT_BASE + n`: i386 and
    /// AArch32 (EABI) number them alike (fork 2, vfork 190, clone 120, clone3 435, sigreturn
    /// 119, rt_sigreturn 173, restart_syscall 0).
    pub mod compat {
        use crate::COMPAT_BASE;
        pub const FORK: u32 = COMPAT_BASE + 2;
        pub const VFORK: u32 = COMPAT_BASE + 190;
        pub const CLONE: u32 = COMPAT_BASE + 120;
        pub const CLONE3: u32 = COMPAT_BASE + 435;
        pub const SIGRETURN: u32 = COMPAT_BASE + 119;
        pub const RT_SIGRETURN: u32 = COMPAT_BASE + 173;
        pub const RESTART_SYSCALL: u32 = COMPAT_BASE;
        pub const EXECVE: u32 = COMPAT_BASE + 11;
        pub use super::nr::COMPAT_EXECVEAT as EXECVEAT;
    }

    /// Whether `nr` is an `execve` or `execveat`, native or compat. An exec into the other
    /// ABI ends with the number of that ABI's `execve` in the registers (the kernel sets it
    /// for the first return of the new program), and the task's identity then reads as that
    /// ABI: its exit still closes the entry of the exec it began with.
    #[inline(always)]
    pub fn is_exec(nr: u32) -> bool {
        nr == EXECVE || nr == EXECVEAT || nr == compat::EXECVE || nr == compat::EXECVEAT
    }

    /// Whether `nr` makes a task whose first return to user space (with 0) comes through
    /// `sys_exit` without an entry of its own: the child of a `fork`, `vfork`, `clone` or
    /// `clone3`. That return is no call, and no missed event.
    #[inline(always)]
    pub fn starts_task(nr: u32) -> bool {
        nr == CLONE
            || nr == FORK
            || nr == VFORK
            || nr == CLONE3
            || nr == compat::FORK
            || nr == compat::VFORK
            || nr == compat::CLONE
            || nr == compat::CLONE3
    }

    /// Whether the "return value" of `nr` is a register it restored rather than an outcome:
    /// `rt_sigreturn` hands back whatever the interrupted code had in its return register (an
    /// interrupted call's -EINTR, or any value a program left there), and `restart_syscall`
    /// the result of the call it resumes, which was counted, with its restart code, when it was
    /// interrupted. Neither records an error.
    #[inline(always)]
    pub fn returns_restored_register(nr: u32) -> bool {
        nr == RT_SIGRETURN
            || nr == RESTART_SYSCALL
            || nr == compat::SIGRETURN
            || nr == compat::RT_SIGRETURN
            || nr == compat::RESTART_SYSCALL
    }
}

/// What each CPU keeps between `sys_enter` and `sys_exit` (`SYSCALL_CPU`, a one-entry per-CPU
/// array): the call in flight of the task running on it, and what is the same for every call
/// of that task, cached so the common path makes no helper call and no hash or task-storage
/// lookup for it.
///
/// A call in flight stays here only while its task keeps the CPU: `sched_switch` moves it to
/// the task's [`ThreadSpill`] when the task is switched out mid-call, so an entry here always
/// belongs to `task`. The identity (`tgid`, `cgroup_id`) is valid while `task` is the current
/// task and `generation` equals the probes' count of cgroup migrations and task exits (a task
/// exit may free the `task_struct` for another task to reuse).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    /// The task (its `task_struct` address) the identity and the call in flight belong to.
    pub task: u64,
    /// The identity count when `tgid` and `cgroup_id` were read ([`CpuState::NO_IDENTITY`]: never).
    pub generation: u64,
    /// cgroup v2 id of `task`.
    pub cgroup_id: u64,
    /// `bpf_ktime_get_ns()` at entry; 0 when no call is in flight on this CPU.
    pub start_ns: u64,
    /// The task (`task_struct` address) `sched_switch` switched in on this CPU in the middle
    /// of a call kept in its [`ThreadSpill`] (0: none): its next switch-out stamps that
    /// spill without looking up the storage of every task switched out.
    pub resumed: u64,
    /// tgid of `task`.
    pub tgid: u32,
    /// Syscall number at entry.
    pub nr: u32,
    /// The descriptor of the call in flight, classified at entry.
    pub fd: FdClass,
    /// Non-zero when `task` was making 32-bit compat calls when its identity was read (x86:
    /// `TS_COMPAT`, set by the kernel at each ia32 entry; arm64: an AArch32 `pstate`): its
    /// numbers are then counted at [`COMPAT_BASE`] + n. Read with the identity, not per call.
    pub compat: u32,
    /// The descriptors last classified on this CPU, [`CpuState::FD_CACHE_ENTRIES`] of them,
    /// the entry chosen by descriptor number and task: two threads that take turns on a CPU
    /// (a pipe's reader and writer) keep their own.
    pub fd_cache: [FdCache; CpuState::FD_CACHE_ENTRIES],
    /// The CPU's slot cache: [`slot_cache::ENTRIES`] entries made by [`slot_cache::entry`].
    pub slots: [u64; slot_cache::ENTRIES],
}

impl CpuState {
    /// `generation` of a CPU whose identity was never read.
    pub const NO_IDENTITY: u64 = u64::MAX;
    /// Set in `resumed` beside a task's address when its switch-in found no storage where a
    /// lookup may fail ([`SchedProbeConfig::lookup_may_fail`]): its switch-out looks it up,
    /// and a call in flight then has the stretch since its last stamp counted unknown.
    /// (`task_struct` addresses are aligned, so the bit is free.)
    pub const UNSURE: u64 = 1;
    /// Entries of `fd_cache` (a power of two).
    pub const FD_CACHE_ENTRIES: usize = 8;

    /// The `fd_cache` entry of descriptor `fd` of the task at `task`.
    #[inline(always)]
    pub fn fd_cache_entry(task: u64, fd: u64) -> usize {
        ((fd ^ (task >> 10)) as usize) & (Self::FD_CACHE_ENTRIES - 1)
    }
}

/// A call in flight whose task was switched out mid-call (it blocked, or was preempted), kept
/// in the thread's `SYSCALL_THREADS` value (task-local storage, freed with the thread) until
/// its `sys_exit`, which may run on another CPU.
///
/// With [`globals::SYSCALL_TIME_BY_STATE`], every transition of the task while in the call
/// is stamped with the same clock as its entry and exit: the switch-out (`state` becomes
/// [`call_state::RUNNABLE`] or [`call_state::BLOCKED`] by the task's state then), the wakeup
/// of a blocked task (`RUNNABLE`), the switch-in ([`call_state::ON_CPU`]). Each transition adds
/// the time since `mark_ns` to the part the state it ends names, so the parts and the on-CPU
/// remainder partition [entry, exit] exactly.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadSpill {
    /// `bpf_ktime_get_ns()` at entry; 0 when nothing is kept.
    pub start_ns: u64,
    /// Syscall number at entry.
    pub nr: u32,
    /// Where the task is now ([`call_state`]).
    pub state: u32,
    /// The descriptor of the call, classified at entry.
    pub fd: FdClass,
    /// When `state` began.
    pub mark_ns: u64,
    /// The call's time off CPU so far, by part (see [`StateStats`]).
    pub wait_ns: u64,
    pub blocked_ns: u64,
    pub unknown_ns: u64,
    /// The task's tgid and tid, kept only for [`globals::SYSCALL_STATE_TRACE`].
    pub tgid: u32,
    pub tid: u32,
}

/// Where a task in a syscall is ([`ThreadSpill::state`]).
pub mod call_state {
    /// Running on a CPU (switched back in).
    pub const ON_CPU: u32 = 0;
    /// Runnable and not running: preempted, or woken and not yet switched in.
    pub const RUNNABLE: u32 = 1;
    /// Asleep (I/O, a lock, a sleep), no wakeup seen yet.
    pub const BLOCKED: u32 = 2;
    /// Off CPU, and which of the above is not known: its switch-out could not read the task's
    /// state, or a switch-in was missed. The stretch until the next stamp is unknown.
    pub const UNSURE: u32 = 3;
}

/// What the scheduler programs need to know of the running kernel (global `SCHED_CONFIG`,
/// set by the loader from the kernel's BTF and release).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedProbeConfig {
    /// Offset of the task's state in `struct task_struct`: `__state` (5.14+) or `state`
    /// (before); [`NO_FIELD`]: not found, and a task switched out without being preempted is
    /// [`call_state::UNSURE`].
    pub task_state: u32,
    /// Its size in bytes: 4 (`unsigned int __state`) or 8 (`long state`).
    pub task_state_bytes: u32,
    /// Non-zero where task storage may be created in `sched_switch` (Linux 6.4+, whose
    /// allocator never wakes another task). Before, the kernel allocates it with `GFP_ATOMIC`,
    /// which may wake kswapd under the runqueue lock the scheduler holds (a possible hard
    /// lockup): there `sys_enter` creates a task's storage in process context, when its
    /// identity is read on a CPU, and the scheduler programs only look it up.
    pub create_in_switch: u32,
    /// Non-zero where a task-storage lookup may fail though the value exists (before Linux
    /// 6.2, when another task-storage helper is running on the same CPU): a switch-in whose
    /// lookup finds nothing is then remembered as unsure ([`CpuState::UNSURE`]), so the
    /// stretch it should have closed is counted unknown rather than guessed.
    pub lookup_may_fail: u32,
    /// x86_64: offset of `task_struct.thread_info.status` (`thread_info` is the first member
    /// with `THREAD_INFO_IN_TASK`), whose `TS_COMPAT` bit the kernel sets at every ia32
    /// syscall entry and clears on the return to user space; [`NO_FIELD`]: not found, and
    /// every call is counted as native. Unused on arm64, where the mode is in `pstate`.
    pub compat_status: u32,
}

impl SchedProbeConfig {
    /// What the object holds before the loader sets it: no state offset, storage created
    /// outside the scheduler, lookups that may fail (the safe choice on every kernel).
    pub const UNSET: Self = Self {
        task_state: NO_FIELD,
        task_state_bytes: 0,
        create_in_switch: 0,
        lookup_may_fail: 1,
        compat_status: NO_FIELD,
    };
}

/// The time calls spent off CPU, per copy of a statistics slot (`SYSCALL_STATES`, indexed
/// as `SYSCALL_STATS`, and written only after the copy's owner check there). The probes add a
/// call's parts here before its duration to `SYSCALL_STATS`, and user space reads
/// `SYSCALL_STATS` first: a read never holds a call's duration without its parts. The on-CPU
/// part is not kept: it is the duration less these, so a call that never left its CPU (the
/// common case) adds nothing here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateStats {
    /// Runnable but not running: preempted, or woken and waiting to be switched in (CFS
    /// bandwidth throttling included where the kernel throttles tasks inside the kernel).
    pub wait_ns: u64,
    /// Asleep, from the switch-out to the wakeup.
    pub blocked_ns: u64,
    /// Off CPU with no wakeup seen (a transition the probes missed): counted apart, never
    /// guessed.
    pub unknown_ns: u64,
    /// Calls that left their CPU at least once.
    pub switched: u64,
}

impl StateStats {
    pub const ZERO: Self = Self {
        wait_ns: 0,
        blocked_ns: 0,
        unknown_ns: 0,
        switched: 0,
    };

    /// The time off CPU, all parts.
    pub fn off_cpu_ns(&self) -> u64 {
        self.wait_ns
            .wrapping_add(self.blocked_ns)
            .wrapping_add(self.unknown_ns)
    }
}

/// One stretch of a traced call off its CPU (`OFFCPU_EVENTS`), written when it ends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuEvent {
    /// `bpf_ktime_get_ns()` when the stretch began and ended.
    pub start_ns: u64,
    pub end_ns: u64,
    pub tgid: u32,
    pub tid: u32,
    /// [`call_state::RUNNABLE`] or [`call_state::BLOCKED`]; `u32::MAX` for time with no
    /// wakeup seen.
    pub state: u32,
    /// The call's syscall number.
    pub nr: u32,
}

impl OffCpuEvent {
    /// `state` of a stretch off CPU with no wakeup seen.
    pub const UNKNOWN: u32 = u32::MAX;
}

/// A CPU's cache of (syscall number -> `SYSCALL_STATS` slot), two-way set-associative.
///
/// The set of a syscall is its number modulo [`SETS`](slot_cache::SETS); a set holds the two syscalls of that set
/// used last, so pairs that a direct-mapped cache would thrash (`read` and `ioctl`, `write` and
/// `openat`, `read` and `getdents64`, ...) both stay cached. An entry is tagged with the syscall number and the low
/// bits of `SLOT_EPOCH`: when user space frees slots it bumps the epoch, and every entry made
/// before turns into a miss without the probe clearing anything. A wrong hit (a tag that comes
/// round again after 65,536 bumps, another task's call on the same CPU, a task that changed
/// cgroup) is harmless: the probe uses a
/// slot only if the slot's copy names the caller's key.
pub mod slot_cache {
    /// Sets (a power of two).
    pub const SETS: usize = 16;
    /// Entries per set.
    pub const WAYS: usize = 2;
    pub const ENTRIES: usize = SETS * WAYS;

    /// Index of the first entry of the set of syscall `nr`.
    #[inline(always)]
    pub fn set_of(nr: u32) -> usize {
        (nr as usize & (SETS - 1)) * WAYS
    }

    /// The tag of syscall `nr` of process `tgid` on a descriptor of class `fd` cached under
    /// `epoch`. Bit 15 is always set, so a zeroed entry is empty. The syscall number takes the
    /// low 9 bits, the descriptor's kind and filesystem a few more, and a hash of the process
    /// is mixed in, so two processes taking turns on a CPU with the same syscall hold one way
    /// each: keys that share a tag only miss.
    #[inline(always)]
    pub fn tag(epoch: u64, tgid: u32, nr: u32, fd: &super::FdClass) -> u32 {
        // Six bits of a multiplicative hash of the class: the kinds and the usual filesystems
        // (ext4, xfs, btrfs, tmpfs, NFS, FUSE, overlay, Ceph, Lustre, GPFS) all differ.
        let class = ((fd.kind as u32).wrapping_mul(0x27D4_EB2F)
            ^ fd.fs_magic.wrapping_mul(0x1656_67B1))
            >> 26;
        let process = tgid.wrapping_mul(0x9E37_79B1) >> 17;
        ((epoch as u32) << 16) | 0x8000 | ((nr ^ (class << 9) ^ process) & 0x7fff)
    }

    /// An entry: the tag in the high half, the slot in the low half.
    #[inline(always)]
    pub fn entry(tag: u32, slot: u32) -> u64 {
        ((tag as u64) << 32) | slot as u64
    }

    /// The slot of `entry` if it carries `tag`.
    #[inline(always)]
    pub fn hit(entry: u64, tag: u32) -> Option<u32> {
        ((entry >> 32) as u32 == tag).then_some(entry as u32)
    }
}

/// One (cgroup, process, syscall): key of `SYSCALL_SLOTS` (whose value is the entry's slot in
/// `SYSCALL_STATS`) and of `SYSCALL_ERRORS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyscallKey {
    /// cgroup v2 id (`bpf_get_current_cgroup_id()`, the inode of the cgroup's directory).
    pub cgroup_id: u64,
    pub tgid: u32,
    pub nr: u32,
    /// What the call read or wrote ([`FdClass::NONE`] for calls not classified).
    pub fd: FdClass,
}

/// Statistics of one (cgroup, process, syscall): durations of its calls.
pub type SyscallStats = LatencyHistogram;

/// One copy of a slot of `SYSCALL_STATS`, an array (shared by all CPUs) of
/// [`globals::SYSCALL_STAT_STRIPES`] copies per slot: the copy of slot `s` that CPU `c` adds to
/// is at index `s * stripes + (c % stripes)`, with atomic adds. So the map's size does not grow
/// with the CPU count (at most [`MAX_STAT_STRIPES`] copies), and CPUs that count the same key at
/// once mostly write different cache lines (a copy is 256 bytes, four lines).
///
/// A slot is handed out (from `FREE_SLOTS`) to one key at a time, recorded in `SYSCALL_SLOTS`.
/// The probe that takes a slot writes the key into every copy before it publishes the slot, and
/// adds to a copy only if the copy names its key; readers count a copy only for the key it
/// names. So a slot freed by user space and handed to another key never mixes the two keys'
/// counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotStats {
    /// Owner of this copy (all zero: none yet).
    pub key: SyscallKey,
    pub stats: SyscallStats,
    /// Pads a copy to four cache lines, so neighbouring copies share none.
    pub _pad: [u64; 2],
}

/// Key of `SYSCALL_ERRORS` (value: `u64` count, shared by all CPUs, atomic adds). `nr` is a
/// [`bounded_nr`], so it always fits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrnoKey {
    pub cgroup_id: u64,
    pub tgid: u32,
    pub nr: u16,
    /// Positive errno (e.g. 2 for ENOENT).
    pub errno: u16,
    pub fd: FdClass,
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

/// When a finished call ran and whose it was: the head of every record of one call, a slow
/// call's ([`SlowCallEvent`]) and a traced one's ([`crate::TraceEvent`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStamp {
    /// `bpf_ktime_get_ns()` at entry and exit (CLOCK_MONOTONIC).
    pub start_ns: u64,
    pub end_ns: u64,
    /// The caller's cgroup v2 id, tgid and tid.
    pub cgroup_id: u64,
    pub tgid: u32,
    pub tid: u32,
}

/// A syscall slower than its threshold, as written to `SLOW_EVENTS` at `sys_exit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlowCallEvent {
    pub call: CallStamp,
    pub nr: u32,
    pub _pad: u32,
    /// The descriptor's class at entry ([`FdClass::NONE`] for calls not classified).
    pub fd: FdClass,
    /// Return value (negative errno on failure).
    pub ret: i64,
    /// The six syscall arguments as passed in registers.
    pub args: [u64; 6],
    pub comm: [u8; 16],
    /// The file of the descriptor the call names, read at its exit (its name, when the
    /// kernel read one, follows the event in the record).
    pub file: FileIdentity,
    /// The call's time off CPU by part (as [`StateStats`]; all 0 without
    /// [`globals::SYSCALL_TIME_BY_STATE`] or when the call never left its CPU). The record
    /// is built in a per-CPU scratch value reused from call to call, so the probe writes
    /// these on every record.
    pub wait_ns: u64,
    pub blocked_ns: u64,
    pub unknown_ns: u64,
}

/// A slow-call record as the probe builds it, in its CPU's `SLOW_SCRATCH` value, before it
/// copies the event and the first bytes of `name` (as many as the name has) to `SLOW_EVENTS`:
/// a record is a [`SlowCallEvent`] followed by its file's name, so a call without one costs
/// the ring buffer no more than the event. The path is walked from the file up, so it is
/// written backwards in `work`, then copied to `name`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SlowCallScratch {
    pub event: SlowCallEvent,
    pub name: [u8; file::NAME_BYTES],
    pub work: [u8; file::NAME_BYTES + file::COMPONENT_BYTES],
    /// Where the walk has got to in `work` (kept in memory: see the probe's `walk_path`).
    pub walk_pos: u32,
    pub _pad: u32,
}

pod!(
    ThreadSpill,
    CpuState,
    SchedProbeConfig,
    SyscallKey,
    SlotStats,
    ErrnoKey,
    ProcessExit,
    RateWindow,
    CallStamp,
    SlowCallEvent,
    StateStats,
    OffCpuEvent
);

// The layouts both sides compile: a change here is a change of the kernel/user contract.
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<SyscallKey>() == 24);
    assert!(size_of::<SyscallStats>() == 8 + 8 * hist::HIST_BUCKETS);
    assert!(size_of::<SlotStats>() == 256);
    assert!(size_of::<ErrnoKey>() == 24);
    assert!(size_of::<ProcessExit>() == 32);
    assert!(size_of::<RateWindow>() == 16);
    assert!(size_of::<CallStamp>() == 32);
    assert!(size_of::<SlowCallEvent>() == 168);
    // Where the fields after the stamp begin, as user space and the probes both read them.
    assert!(core::mem::offset_of!(SlowCallEvent, nr) == 32);
    assert!(core::mem::offset_of!(SlowCallEvent, fd) == 40);
    assert!(core::mem::offset_of!(SlowCallEvent, file) == 120);
    assert!(
        size_of::<SlowCallScratch>()
            == size_of::<SlowCallEvent>() + 2 * file::NAME_BYTES + file::COMPONENT_BYTES + 8
    );
    assert!(size_of::<ThreadSpill>() == 64);
    assert!(size_of::<SchedProbeConfig>() == 20);
    assert!(size_of::<StateStats>() == 32);
    assert!(size_of::<OffCpuEvent>() == 32);
    assert!(
        size_of::<CpuState>()
            == 64 + size_of::<FdCache>() * CpuState::FD_CACHE_ENTRIES + 8 * slot_cache::ENTRIES
    );
    assert!(MAX_STAT_STRIPES.is_power_of_two());
    assert!(INVALID_NR < MAX_SYSCALL_NR);
    assert!(COMPAT_BASE < INVALID_NR && COMPAT_BASE.is_power_of_two());
};

#[cfg(test)]
mod tests {
    use super::slot_cache::*;

    #[test]
    fn out_of_range_syscall_numbers_fold_into_one() {
        use super::{bounded_compat_nr, bounded_nr, is_compat_nr, COMPAT_BASE, INVALID_NR};
        assert_eq!(bounded_nr(0), 0);
        assert_eq!(bounded_nr(39), 39);
        assert_eq!(bounded_nr(COMPAT_BASE as u64 - 2), COMPAT_BASE - 2);
        // Compat numbers have their own range: no native number is ever one.
        assert_eq!(bounded_compat_nr(0), COMPAT_BASE);
        assert_eq!(bounded_compat_nr(252), COMPAT_BASE + 252);
        assert!(is_compat_nr(COMPAT_BASE) && !is_compat_nr(INVALID_NR));
        assert!(!is_compat_nr(bounded_nr(COMPAT_BASE as u64 + 3)));
        for id in [(INVALID_NR - COMPAT_BASE) as u64, 0x4000_0000, u64::MAX] {
            assert_eq!(bounded_compat_nr(id), INVALID_NR, "{id}");
        }
        for id in [
            INVALID_NR as u64,
            COMPAT_BASE as u64 - 1,
            512,
            20_000,
            65_536,
            65_595,
            0x4000_0000,
            u64::MAX,
        ] {
            assert_eq!(bounded_nr(id), INVALID_NR, "{id}");
        }
    }

    #[test]
    fn entries_hit_only_their_syscall_class_and_epoch() {
        use crate::{fd_class, FdClass};
        const TGID: u32 = 4321;
        let none = FdClass::NONE;
        let e = entry(tag(7, TGID, 0, &none), 1234);
        assert_eq!(hit(e, tag(7, TGID, 0, &none)), Some(1234));
        // Another syscall, or any later epoch, misses.
        assert_eq!(hit(e, tag(7, TGID, 8, &none)), None);
        assert_eq!(hit(e, tag(8, TGID, 0, &none)), None);
        // The same syscall on another kind of descriptor or another filesystem misses.
        let ext4 = FdClass::of(fd_class::FILE, 0xEF53);
        let tmpfs = FdClass::of(fd_class::FILE, 0x0102_1994);
        let pipe = FdClass::of(fd_class::PIPE, 0);
        let f = entry(tag(7, TGID, 0, &ext4), 99);
        assert_eq!(hit(f, tag(7, TGID, 0, &ext4)), Some(99));
        for other in [none, tmpfs, pipe] {
            assert_eq!(hit(f, tag(7, TGID, 0, &other)), None, "{other:?}");
        }
        // A zeroed entry never hits, whatever the epoch, process, number and class (bit 15 of
        // every tag is set).
        for epoch in [0, 1, u64::from(u16::MAX)] {
            for nr in [0, 1, 0x7fff, 0x8000, u32::MAX] {
                for class in [none, ext4, pipe] {
                    for tgid in [0, 1, TGID, u32::MAX] {
                        assert_eq!(
                            hit(0, tag(epoch, tgid, nr, &class)),
                            None,
                            "epoch {epoch}, tgid {tgid}, nr {nr}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn processes_taking_turns_on_a_cpu_mostly_differ() {
        // Consecutive and scattered pids: the same syscall of two processes should almost
        // never share a tag (a shared tag only costs a miss, but the two would then evict
        // each other from a set).
        let none = super::FdClass::NONE;
        let pids = || (1000..1100u32).chain((1..100u32).map(|i| i * 7919));
        let mut same = 0;
        for a in pids() {
            for b in pids() {
                if a != b && tag(3, a, 0, &none) == tag(3, b, 0, &none) {
                    same += 1;
                }
            }
        }
        let n = pids().count();
        let pairs = n * (n - 1);
        assert!(same * 100 < pairs, "{same} of {pairs} pairs share a tag");
    }

    #[test]
    fn sets_keep_the_usual_pairs_apart_or_together() {
        // read (0) and lseek (8), the pattern of HDF5 readers, fall in different sets; read and
        // ioctl (16) share one, and a set holds two.
        assert_ne!(set_of(0), set_of(8));
        assert_eq!(set_of(0), set_of(16));
        assert!(set_of(u32::MAX) + WAYS <= ENTRIES);
    }
}
