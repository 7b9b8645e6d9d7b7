//! On-demand trace probes: every syscall of one target, one ring-buffer record per call.
//!
//! Used only by `sysscope trace` and `sysscope diagnose`; the exporter loads these programs
//! with the others but never attaches them, so they cost nothing unless asked for.
//!
//! Tracepoints: `raw_syscalls:sys_enter`, `raw_syscalls:sys_exit` (raw_tp).
//! Maps: `TRACE_CGROUPS` (cgroup array, slot 0: the target cgroup, descendants included),
//! `TRACE_TARGETS` (tgid set), `TRACE_THREADS` (LRU, tid -> call in flight),
//! `TRACE_PATH_ARGS` (syscall nr -> 1 + index of its path argument, 0: none),
//! `TRACE_EVENTS` (ring buffer of `TraceEvent`). Drops: `PROBE_COUNTERS[TRACE_RINGBUF_FULL]`.
//! Globals: `TRACE_CGROUP_ID` (0: no cgroup filter), `TRACE_FILTER_TGIDS` (0: no tgid filter).
//!
//! The target is chosen in the kernel, so only its calls cost a record: for every other
//! thread on the node the price is a cgroup check at entry and a hash lookup at exit.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_ns, bpf_probe_read_user_str_bytes,
    },
    macros::{map, raw_tracepoint},
    maps::{Array, CgroupArray, HashMap, LruHashMap, RingBuf},
    programs::RawTracePointContext,
};
use sysscope_abi::{
    counters, fd_class, noreturn, trace_flags, FdClass, TraceEvent, TraceThread, MAX_SYSCALL_NR,
};

use crate::common::{count_drop, read_syscall_args};

/// Slot 0: the target cgroup (set from user space with the directory's fd).
#[map(name = "TRACE_CGROUPS")]
static TRACE_CGROUPS: CgroupArray = CgroupArray::with_max_entries(1, 0);

/// tgids traced when `TRACE_FILTER_TGIDS` is set (value unused).
#[map(name = "TRACE_TARGETS")]
static TRACE_TARGETS: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// Calls in flight. LRU so that threads killed mid-call never fill it; small by default
/// (preallocated), resized by the loader for the command-line tools.
#[map(name = "TRACE_THREADS")]
static TRACE_THREADS: LruHashMap<u32, TraceThread> = LruHashMap::with_max_entries(256, 0);

/// 1 + index of the argument holding a user-space path, per syscall number (0: none).
#[map(name = "TRACE_PATH_ARGS")]
static TRACE_PATH_ARGS: Array<u8> = Array::with_max_entries(MAX_SYSCALL_NR, 0);

/// One page by default so the exporter, which never traces, pays nothing for it; the
/// command-line tools size it (`--buffer-size`).
#[map(name = "TRACE_EVENTS")]
static TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// cgroup id of the target (0: no cgroup filter); set by the loader.
#[unsafe(no_mangle)]
#[used]
static TRACE_CGROUP_ID: u64 = 0;

/// Non-zero: also trace the tgids in `TRACE_TARGETS`; set by the loader.
#[unsafe(no_mangle)]
#[used]
static TRACE_FILTER_TGIDS: u32 = 0;

/// Whether the current task belongs to the target (also used by the syscall probes when the
/// command-line tools ask them to count the target only).
#[inline(always)]
pub fn is_target(pid_tgid: u64) -> bool {
    let cgroup = target_cgroup();
    if cgroup != 0 {
        // SAFETY: the helper has no preconditions.
        if unsafe { bpf_get_current_cgroup_id() } == cgroup {
            return true;
        }
        // Descendant cgroups (e.g. the containers of a pod).
        if let Ok(true) = TRACE_CGROUPS.current_task_under_cgroup(0) {
            return true;
        }
    }
    is_target_tgid(pid_tgid)
}

/// Whether the current process is one of the traced tgids (`--pid`).
#[inline(always)]
pub fn is_target_tgid(pid_tgid: u64) -> bool {
    // SAFETY: a global the loader sets before the load, read as a whole.
    if unsafe { core::ptr::read_volatile(&TRACE_FILTER_TGIDS) } != 0 {
        let tgid = (pid_tgid >> 32) as u32;
        if TRACE_TARGETS.get_ptr(&tgid).is_some() {
            return true;
        }
    }
    false
}

/// The target cgroup's id (0: no cgroup filter).
#[inline(always)]
pub fn target_cgroup() -> u64 {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&TRACE_CGROUP_ID) }
}

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn trace_sys_enter(ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_target(pid_tgid) {
        return 0;
    }
    // TP_PROTO(struct pt_regs *regs, long id)
    let nr = ctx.arg::<u64>(1) as u32;
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let regs = ctx.arg::<*const u8>(0);
    let tid = pid_tgid as u32;
    if nr == noreturn::EXIT || nr == noreturn::EXIT_GROUP {
        // No sys_exit follows: record the call now, with no duration.
        let mut args = [0u64; 6];
        read_syscall_args(regs, &mut args);
        emit(
            pid_tgid,
            now,
            now,
            (nr, FdClass::NONE),
            0,
            &args,
            trace_flags::NO_RETURN,
        );
        return 0;
    }
    match TRACE_THREADS.get_ptr_mut(&tid) {
        Some(state) => {
            // SAFETY: a map value of the current thread, valid while the program runs.
            let state = unsafe { &mut *state };
            state.start_ns = now;
            state.nr = nr;
            read_syscall_args(regs, &mut state.args);
            state.fd = classify(nr, regs, state);
        }
        None => {
            let mut state = TraceThread {
                start_ns: now,
                nr,
                _pad: 0,
                args: [0; 6],
                fd: FdClass::NONE,
                fd_cache: Default::default(),
            };
            read_syscall_args(regs, &mut state.args);
            state.fd = classify(nr, regs, &mut state);
            // LRU: an insert only fails on allocation failure; the call is then not traced.
            let _ = TRACE_THREADS.insert(&tid, &state, 0);
        }
    }
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn trace_sys_exit(ctx: RawTracePointContext) -> i32 {
    // SAFETY: the helper has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(state) = TRACE_THREADS.get_ptr_mut(&tid) else {
        return 0;
    };
    // SAFETY: a map value of the current thread, valid while the program runs.
    let state = unsafe { &mut *state };
    let start_ns = state.start_ns;
    if start_ns == 0 {
        return 0;
    }
    state.start_ns = 0;
    // TP_PROTO(struct pt_regs *regs, long ret)
    let ret = ctx.arg::<i64>(1);
    let args = state.args;
    emit(pid_tgid, start_ns, now, (state.nr, state.fd), ret, &args, 0);
    0
}

/// Writes one record to the ring buffer, or counts it lost when the buffer is full.
/// The class of the traced call's descriptor, for the calls that have one classified.
#[inline(always)]
fn classify(nr: u32, regs: *const u8, state: &mut TraceThread) -> FdClass {
    if fd_class::classified(nr) {
        // TP_PROTO(struct pt_regs *regs, long id): the descriptor is the first argument.
        let fd = crate::common::read_syscall_arg0(regs);
        crate::fd_class::unpack(crate::fd_class::classify(fd, &mut state.fd_cache))
    } else {
        FdClass::NONE
    }
}

#[inline(always)]
fn emit(
    pid_tgid: u64,
    start_ns: u64,
    end_ns: u64,
    (nr, fd): (u32, FdClass),
    ret: i64,
    args: &[u64; 6],
    flags: u32,
) {
    let Some(mut entry) = TRACE_EVENTS.reserve::<TraceEvent>(0) else {
        count_drop(counters::TRACE_RINGBUF_FULL);
        return;
    };
    // SAFETY: a ring-buffer record reserved for this program, of this type, until it is submitted.
    let event = unsafe { &mut *entry.as_mut_ptr() };
    event.call.start_ns = start_ns;
    event.call.end_ns = end_ns;
    // SAFETY: the helper has no preconditions.
    event.call.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    event.call.tgid = (pid_tgid >> 32) as u32;
    event.call.tid = pid_tgid as u32;
    event.nr = nr;
    event.ret = ret;
    event.args = *args;
    event.fd = fd;
    event.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    event.path[0] = 0;
    let mut flags = flags;
    if let Some(&slot) = TRACE_PATH_ARGS.get(nr) {
        if let Some(&ptr) = args.get((slot as usize).wrapping_sub(1)) {
            let ptr = ptr as *const u8;
            // The caller's memory still holds the path at exit (execve aside: its old
            // address space is gone, and the read simply fails).
            // SAFETY: the helper checks the user address and fails on one it cannot read.
            if unsafe { bpf_probe_read_user_str_bytes(ptr, &mut event.path) }.is_ok() {
                flags |= trace_flags::PATH;
            }
        }
    }
    event.flags = flags;
    entry.submit(0);
}
