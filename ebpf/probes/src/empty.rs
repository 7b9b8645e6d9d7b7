//! Empty programs on the syscall tracepoints: the calibration floor of the overhead benchmark.
//! They cost exactly what attaching anything to `raw_syscalls` costs, so the benchmark can
//! report sysscope's own cost as a ratio to them. Never attached by the exporter.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn empty_sys_enter(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn empty_sys_exit(_ctx: RawTracePointContext) -> i32 {
    0
}

/// The floor of any tracer that measures every call's duration exactly: the clock read at
/// entry, stored per CPU, and read again at exit. sysscope's hot path is benchmarked against it
/// (`bench/overhead.sh`, configuration `clock`).
#[aya_ebpf::macros::map(name = "CLOCK_FLOOR")]
static CLOCK_FLOOR: aya_ebpf::maps::PerCpuArray<u64> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn clock_sys_enter(_ctx: RawTracePointContext) -> i32 {
    if let Some(slot) = CLOCK_FLOOR.get_ptr_mut(0) {
        // SAFETY: this CPU's value of a one-entry array; the helper has no preconditions.
        unsafe { *slot = aya_ebpf::helpers::bpf_ktime_get_ns() };
    }
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn clock_sys_exit(_ctx: RawTracePointContext) -> i32 {
    if let Some(slot) = CLOCK_FLOOR.get_ptr_mut(0) {
        // SAFETY: as above; the difference is stored so the clock read is not optimised away.
        unsafe { *slot = aya_ebpf::helpers::bpf_ktime_get_ns().wrapping_sub(*slot) };
    }
    0
}

/// Empty programs on the scheduler hooks the time split uses (`sched_switch`, `sched_wakeup`,
/// tp_btf as sysscope's): with `empty_sys_enter`/`empty_sys_exit` beside them, the floor any
/// design of the split pays per context switch (configuration `empty-sched` of
/// `bench/overhead.sh`).
#[aya_ebpf::macros::btf_tracepoint(function = "sched_switch")]
pub fn empty_sched_switch(_ctx: aya_ebpf::programs::BtfTracePointContext) -> i32 {
    0
}

#[aya_ebpf::macros::btf_tracepoint(function = "sched_wakeup")]
pub fn empty_sched_wakeup(_ctx: aya_ebpf::programs::BtfTracePointContext) -> i32 {
    0
}
