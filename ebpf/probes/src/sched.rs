//! Scheduler probes of the syscall family: where a task in a syscall spends the call.
//!
//! Tracepoints: `sched:sched_switch` and `sched:sched_wakeup` (tp_btf: the kernel hands over
//! trusted `task_struct` pointers, so the next task's and the wakee's task storage can be
//! looked up, and the previous task's state read). Maps: `SYSCALL_CPU` and `SYSCALL_THREADS`
//! (declared in `syscalls.rs`), `OFFCPU_EVENTS` (ring buffer, `sysscope trace` only). Globals:
//! `SCHED_CONFIG` (where a task's state is, and what task storage allows on this kernel),
//! `SYSCALL_STATE_TRACE`.
//!
//! `sched_switch` always moves a call in flight of a task switched out mid-call from its CPU's
//! value to the thread's storage (`ThreadSpill`), where `sys_exit` finds it. It creates that
//! storage only from Linux 6.4 (`SchedProbeConfig::create_in_switch`): before, the kernel
//! allocates it with `GFP_ATOMIC` under the runqueue lock this tracepoint holds, which may
//! wake kswapd and deadlock on that lock, so there `sys_enter` creates it in process context
//! when it reads the task's identity, before the task's first call on the CPU, and the
//! scheduler only looks it up.
//!
//! With `SYSCALL_TIME_BY_STATE`, every transition of a task in a call is stamped with the
//! clock its entry and exit are stamped with, into that storage: the switch-out (the task is
//! runnable when it was preempted or its state, read from the task, is still `TASK_RUNNING`,
//! blocked otherwise), the wakeup of a blocked task (`sched_wakeup`: the task is on a runqueue
//! again), the switch-in of the next task. Each stamp closes the stretch the previous one
//! opened, so on CPU, waiting for a CPU and blocked partition [entry, exit] exactly. The state
//! is the task's own (`__state`, or `state` before 5.14, at a BTF offset from the loader), not
//! the tracepoint's `prev_state` argument: that exists only from 5.18, and is stale when a
//! signal pending at `schedule()` set the task running again (it waits for a CPU). A stretch
//! whose end the probes saw but whose kind they cannot know is counted as unknown, never
//! guessed: a switch-in of a task still marked blocked (its wakeup was missed) or on CPU (its
//! switch-out was), a switch-out whose state could not be read, and, where a task-storage
//! lookup may fail though the value exists (before 6.2), a switch-in whose lookup found
//! nothing: it is remembered (`CpuState::UNSURE`), and the task's switch-out books the stretch
//! since its last stamp as unknown.
//!
//! Why `sched_wakeup` and not `sched_waking`: `sched_waking` may fire on the waker's CPU before
//! the wakee's own `sched_switch` has run (the wakee is dequeued but not yet switched out), so
//! it would be missed; `sched_wakeup` fires once the task is on a runqueue, always after its
//! switch-out (the kernel waits for `on_cpu` to clear, or holds the runqueue lock).
//!
//! Cost per context switch (docs/performance.md): an inlined array lookup when neither task is
//! in a call and the split is off; with the split, a task-storage lookup of the next task, and
//! a clock read and a few stores when either task is in a call (before 6.2, also a lookup at the
//! switch-out of a task whose switch-in found no storage: kernel threads and the idle task).
//! Per wakeup: a task-storage lookup, and a clock read when the wakee is blocked in a call.

use aya_ebpf::{
    bindings::task_struct,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map},
    maps::RingBuf,
    programs::BtfTracePointContext,
};
use sysscope_abi::{
    call_state, counters, CpuState, OffCpuEvent, SchedProbeConfig, ThreadSpill, NO_FIELD,
};

use crate::{
    common::count_drop,
    syscalls::{current_task, time_by_state, SYSCALL_CPU, SYSCALL_THREADS},
};

/// Stretches of traced calls off CPU (only with `SYSCALL_STATE_TRACE`; one page otherwise).
#[map(name = "OFFCPU_EVENTS")]
static OFFCPU_EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Non-zero: stream every off-CPU stretch of a call to `OFFCPU_EVENTS`; set by the
/// loader for `sysscope trace`, whose syscall programs count only its target.
#[unsafe(no_mangle)]
#[used]
static SYSCALL_STATE_TRACE: u32 = 0;

/// Where a task's state is read, and what task storage allows here; set by the loader from the
/// kernel's BTF and release (see `SchedProbeConfig`).
#[unsafe(no_mangle)]
#[used]
static SCHED_CONFIG: SchedProbeConfig = SchedProbeConfig::UNSET;

/// Whether `sched_switch` may create a task's storage (Linux 6.4+); elsewhere `sys_enter`
/// creates it (`syscalls.rs`, `identify`).
#[inline(always)]
pub(crate) fn create_in_switch() -> bool {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&SCHED_CONFIG.create_in_switch) != 0 }
}

/// x86_64: the offset of `thread_info.status` in `task_struct` (`NO_FIELD`: unknown), read
/// when a CPU's identity is (`syscalls.rs`, `is_compat`).
#[inline(always)]
pub(crate) fn compat_status() -> u32 {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&SCHED_CONFIG.compat_status) }
}

/// Whether a task-storage lookup may fail though the value exists (before Linux 6.2).
#[inline(always)]
fn lookup_may_fail() -> bool {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&SCHED_CONFIG.lookup_may_fail) != 0 }
}

#[inline(always)]
fn state_trace() -> bool {
    // SAFETY: a global the loader sets before the load, read as a whole.
    unsafe { core::ptr::read_volatile(&SYSCALL_STATE_TRACE) != 0 }
}

#[inline(always)]
fn clock() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// What a task switched out is waiting for: a CPU when it was preempted or is still
/// `TASK_RUNNING` (it stays on its runqueue), else a wakeup; unsure when its state cannot be
/// read.
///
/// The state is read from the task, not from the tracepoint: its `prev_state` argument exists
/// only from Linux 5.18, and through 6.12 it is stale when a signal pending at `schedule()`
/// set the task running again (then it stays on its runqueue: waiting for a CPU). A wakeup
/// racing with the switch-out has at most written `TASK_WAKING`, still not running: blocked,
/// and its `sched_wakeup` follows.
#[inline(always)]
fn switched_out_state(ctx: &BtfTracePointContext) -> u32 {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let preempt = ctx.arg::<u64>(0) & 0xff;
    if preempt != 0 {
        return call_state::RUNNABLE;
    }
    // SAFETY: a global the loader sets before the load, read as a whole.
    let config = unsafe { core::ptr::read_volatile(&SCHED_CONFIG) };
    if config.task_state == NO_FIELD {
        return call_state::UNSURE;
    }
    let prev = ctx.arg::<*const u8>(1);
    // SAFETY: `prev` is the trusted `task_struct` pointer the BTF tracepoint hands over, and
    // the loader found a member of this size at this offset in the kernel's BTF: a plain load,
    // which the verifier checks against the kernel's types (and makes fault-safe).
    let state = unsafe {
        let at = prev.add(config.task_state as usize);
        if config.task_state_bytes == 8 {
            core::ptr::read(at as *const u64)
        } else {
            core::ptr::read(at as *const u32) as u64
        }
    };
    if state == 0 {
        call_state::RUNNABLE
    } else {
        call_state::BLOCKED
    }
}

/// Streams one stretch off CPU of a traced call, ending at `end`.
#[inline(always)]
fn trace_stretch(spill: &ThreadSpill, end: u64, state: u32) {
    let event = OffCpuEvent {
        start_ns: spill.mark_ns,
        end_ns: end,
        tgid: spill.tgid,
        tid: spill.tid,
        state,
        nr: spill.nr,
    };
    if OFFCPU_EVENTS.output::<OffCpuEvent>(&event, 0).is_err() {
        count_drop(counters::TRACE_STATE_RINGBUF_FULL);
    }
}

/// A task is switched out and another switched in. The task switched out (the current one)
/// keeps its call in flight in its storage; with the split, both tasks' calls are stamped.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let Some(cpu) = SYSCALL_CPU.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's value of a per-CPU array, valid while the program runs; programs do
    // not nest on a CPU.
    let cpu = unsafe { &mut *cpu };
    let by_state = time_by_state();
    // One clock read serves both tasks.
    let mut now = 0u64;
    if cpu.start_ns != 0 {
        // The tracepoint fires in the context of the task switched out. An entry of another
        // task (possible only if this program missed a switch) is dropped: its exit is counted
        // as without entry rather than given a wrong duration.
        if cpu.task == current_task() {
            // Created here only where the kernel's allocator is safe under the runqueue lock;
            // elsewhere `sys_enter` created it before the call began.
            let spill = SYSCALL_THREADS.current(create_in_switch());
            if spill.is_null() {
                count_drop(counters::SYSCALL_THREADS_FULL);
            } else {
                // SAFETY: a non-null task-storage value of the current task, ours until the
                // program ends.
                let spill = unsafe { &mut *spill };
                spill.start_ns = cpu.start_ns;
                spill.nr = cpu.nr;
                spill.fd = cpu.fd;
                spill.state = call_state::ON_CPU;
                if by_state {
                    now = clock();
                    spill.state = switched_out_state(&ctx);
                    // Never before the entry, so no part can exceed the duration.
                    spill.mark_ns = if now > cpu.start_ns {
                        now
                    } else {
                        cpu.start_ns
                    };
                    spill.wait_ns = 0;
                    spill.blocked_ns = 0;
                    spill.unknown_ns = 0;
                    if state_trace() {
                        let pid_tgid = bpf_get_current_pid_tgid();
                        spill.tgid = (pid_tgid >> 32) as u32;
                        spill.tid = pid_tgid as u32;
                    }
                }
            }
        }
        cpu.start_ns = 0;
    } else if by_state && cpu.resumed != 0 && cpu.resumed & !CpuState::UNSURE == current_task() {
        // Switched in mid-call earlier and still in that call: stamp its switch-out. When its
        // switch-in found no storage where a lookup may fail, whether it was in a call then
        // is learnt only now.
        let unsure = cpu.resumed & CpuState::UNSURE != 0;
        let spill = SYSCALL_THREADS.current(false);
        if !spill.is_null() {
            // SAFETY: as above.
            let spill = unsafe { &mut *spill };
            if spill.start_ns != 0 && (unsure || spill.state == call_state::ON_CPU) {
                now = clock();
                let end = if now > spill.mark_ns {
                    now
                } else {
                    spill.mark_ns
                };
                if unsure {
                    // Since the last stamp the task was off CPU, then switched in unseen, then
                    // on CPU: how much of each is not known.
                    spill.unknown_ns += end - spill.mark_ns;
                    if state_trace() {
                        trace_stretch(spill, end, OffCpuEvent::UNKNOWN);
                    }
                }
                spill.mark_ns = end;
                spill.state = switched_out_state(&ctx);
            }
        }
    }
    if !by_state {
        return 0;
    }
    cpu.resumed = 0;
    let next = ctx.arg::<*mut task_struct>(2);
    let spill = SYSCALL_THREADS.of(next, false);
    if spill.is_null() {
        if lookup_may_fail() {
            // No storage, or a lookup that failed (another task-storage helper runs on this
            // CPU): its switch-out will tell.
            // (The verifier allows no arithmetic on the task pointer itself: the flag is set
            // on the value read back from the map, a plain number.)
            // SAFETY: a field of this CPU's value, as `cpu`.
            unsafe {
                core::ptr::write_volatile(&mut cpu.resumed, next as u64);
                let task = core::ptr::read_volatile(&cpu.resumed);
                core::ptr::write_volatile(&mut cpu.resumed, task | CpuState::UNSURE);
            }
        }
        return 0;
    }
    // SAFETY: a non-null task-storage value of the task being switched in: it runs nowhere,
    // and its switch-in is serialized with its wakeup by its runqueue's lock.
    let spill = unsafe { &mut *spill };
    if spill.start_ns == 0 {
        return 0;
    }
    if now == 0 {
        now = clock();
    }
    let end = if now > spill.mark_ns {
        now
    } else {
        spill.mark_ns
    };
    let stretch = end - spill.mark_ns;
    let state = if spill.state == call_state::RUNNABLE {
        spill.wait_ns += stretch;
        call_state::RUNNABLE
    } else {
        // Still marked blocked (its wakeup was not seen), or on CPU (its switch-out was not
        // seen): where it was is not known.
        spill.unknown_ns += stretch;
        OffCpuEvent::UNKNOWN
    };
    if state_trace() {
        trace_stretch(spill, end, state);
    }
    spill.mark_ns = end;
    spill.state = call_state::ON_CPU;
    cpu.resumed = next as u64;
    0
}

/// A task is woken (it is on a runqueue again): if it is blocked in a call, its time blocked
/// ends and its wait for a CPU begins.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    if !time_by_state() {
        return 0;
    }
    // TP_PROTO(struct task_struct *p)
    let task = ctx.arg::<*mut task_struct>(0);
    let spill = SYSCALL_THREADS.of(task, false);
    if spill.is_null() {
        return 0;
    }
    // SAFETY: a non-null task-storage value of the woken task. It is written only when the
    // task is blocked in a call (then it runs nowhere, and the wakeup holds its runqueue's
    // lock or waits until it is off its CPU); another state is only read.
    let spill = unsafe { &mut *spill };
    if spill.start_ns == 0
        || (spill.state != call_state::BLOCKED && spill.state != call_state::UNSURE)
    {
        return 0;
    }
    let now = clock();
    let end = if now > spill.mark_ns {
        now
    } else {
        spill.mark_ns
    };
    let state = if spill.state == call_state::BLOCKED {
        spill.blocked_ns += end - spill.mark_ns;
        call_state::BLOCKED
    } else {
        // Its switch-out could not tell whether it was asleep.
        spill.unknown_ns += end - spill.mark_ns;
        OffCpuEvent::UNKNOWN
    };
    if state_trace() {
        trace_stretch(spill, end, state);
    }
    spill.mark_ns = end;
    spill.state = call_state::RUNNABLE;
    0
}
