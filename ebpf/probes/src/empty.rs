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
