//! The calibration programs of the overhead benchmark (`ebpf/probes/src/empty.rs`), attached
//! only by `sysscope-bench`: empty programs on the syscall tracepoints and on the scheduler hooks of the time split, and the exact-duration
//! floor (the clock read at entry and exit into `CLOCK_FLOOR`).

maps! {
    /// Per-CPU: the entry time, then the call's duration (never read by user space).
    CLOCK_FLOOR: PerCpuArray(u32 => u64),
}

programs! {
    EMPTY_SYS_ENTER = "empty_sys_enter",
    EMPTY_SYS_EXIT = "empty_sys_exit",
    CLOCK_SYS_ENTER = "clock_sys_enter",
    CLOCK_SYS_EXIT = "clock_sys_exit",
    EMPTY_SCHED_SWITCH = "empty_sched_switch",
    EMPTY_SCHED_WAKEUP = "empty_sched_wakeup",
}
