//! Helpers shared by the probe families: the drop counters, kernel memory and register access.

use aya_ebpf::{helpers::bpf_probe_read_kernel, macros::map, maps::PerCpuArray};
use sysscope_abi::{counters, NO_FIELD};

/// What the probes could not record, per CPU (indices in `sysscope_abi::counters`).
#[map(name = "PROBE_COUNTERS")]
pub static PROBE_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counters::COUNT, 0);

/// Counts one event that could not be recorded.
#[inline(always)]
pub fn count_drop(index: u32) {
    if let Some(slot) = PROBE_COUNTERS.get_ptr_mut(index) {
        // SAFETY: Per-CPU slot, and programs do not nest on a CPU: a plain add is enough.
        unsafe { *slot += 1 };
    }
}

/// Reads a `T` at `base + off` in kernel memory; `None` for a null base, a missing field
/// (`NO_FIELD`: the member does not exist on the running kernel) or an unreadable address.
#[inline(always)]
pub fn read<T>(base: u64, off: u32) -> Option<T> {
    if base == 0 || off == NO_FIELD {
        return None;
    }
    // SAFETY: the helper checks the address and copies nothing from an unreadable one.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.ok()
}

/// A zero on the stack, for a map value created at 0: `&zero()`, never `&0`. A promoted
/// constant `&0` lives in `.rodata`, and LLVM may merge it with a global of the same value that
/// the loader overrides (`TRACE_CGROUP_ID` under `sysscope trace`), so the "0" the helper
/// copies would be whatever the loader wrote there.
#[inline(always)]
pub fn zero() -> u64 {
    0
}

/// `-EEXIST`, returned by a `BPF_NOEXIST` insert that lost a race with another CPU.
pub const EEXIST: i32 = -17;

/// Byte offsets of the syscall argument registers in the kernel's `struct pt_regs`.
#[cfg(bpf_target_arch = "x86_64")]
const ARG_REG_OFFSETS: [usize; 6] = [14 * 8, 13 * 8, 12 * 8, 7 * 8, 9 * 8, 8 * 8]; // di si dx r10 r8 r9
                                                                                   // arm64: x0 is overwritten by the return value, the original is kept in orig_x0 (after
                                                                                   // regs[31], sp, pc, pstate).
#[cfg(bpf_target_arch = "aarch64")]
const ARG_REG_OFFSETS: [usize; 6] = [34 * 8, 8, 2 * 8, 3 * 8, 4 * 8, 5 * 8];
#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
const ARG_REG_OFFSETS: [usize; 6] = [0; 6];

/// Byte offset in `struct pt_regs` of the syscall number the kernel keeps for the whole call:
/// x86_64 `orig_ax` (the 16th register slot); arm64 `syscallno`, the `s32` after `regs[31]`, `sp`,
/// `pc`, `pstate` and `orig_x0`. Both layouts are the kernel's ptrace ABI (x86_64's is
/// `struct user_regs_struct`; arm64's has been stable since 4.x), so a constant is exact.
#[cfg(bpf_target_arch = "x86_64")]
const NR_REG_OFFSET: usize = 15 * 8;
#[cfg(bpf_target_arch = "aarch64")]
const NR_REG_OFFSET: usize = 35 * 8;
#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
const NR_REG_OFFSET: usize = 0;

/// Reads the number of the call the `pt_regs` of a raw syscall tracepoint belong to, sign-
/// extended (-1, `u64::MAX`, where the kernel or a tracer cancelled the call, as `rt_sigreturn`
/// does once it restored the registers). Read only where `sys_exit` saw no entry: the common
/// path takes the number from `sys_enter`'s argument.
#[inline(always)]
pub fn read_syscall_nr(regs: *const u8) -> u64 {
    if cfg!(not(any(
        bpf_target_arch = "x86_64",
        bpf_target_arch = "aarch64"
    ))) {
        return u64::MAX;
    }
    // SAFETY: an offset within the `struct pt_regs` that `regs` points to, only read through the helper.
    let p = unsafe { regs.add(NR_REG_OFFSET) };
    if cfg!(bpf_target_arch = "aarch64") {
        // SAFETY: the helper checks the address and fails on one it cannot read.
        unsafe { bpf_probe_read_kernel(p as *const i32) }.map_or(u64::MAX, |nr| nr as i64 as u64)
    } else {
        // SAFETY: as above.
        unsafe { bpf_probe_read_kernel(p as *const u64) }.unwrap_or(u64::MAX)
    }
}

/// Reads the first syscall argument (a descriptor, for the calls that take one) from the
/// `pt_regs` the raw syscall tracepoints receive.
#[inline(always)]
pub fn read_syscall_arg0(regs: *const u8) -> u64 {
    if cfg!(not(any(
        bpf_target_arch = "x86_64",
        bpf_target_arch = "aarch64"
    ))) {
        return u64::MAX;
    }
    // SAFETY: an offset within the `struct pt_regs` that `regs` points to, only read through the helper.
    let p = unsafe { regs.add(ARG_REG_OFFSETS[0]) } as *const u64;
    // SAFETY: the helper checks the address and fails on one it cannot read.
    unsafe { bpf_probe_read_kernel(p) }.unwrap_or(u64::MAX)
}

/// Byte offset in `struct pt_regs` of a 32-bit compat call's first argument: x86_64 `bx` (the
/// ia32 arguments are bx, cx, dx, si, di, bp); arm64 `orig_x0`, as for native calls (an AArch32
/// task's r0 is x0).
#[cfg(bpf_target_arch = "x86_64")]
const COMPAT_ARG0_OFFSET: usize = 5 * 8;
#[cfg(not(bpf_target_arch = "x86_64"))]
const COMPAT_ARG0_OFFSET: usize = ARG_REG_OFFSETS[0];

/// Reads the first argument of a 32-bit compat call (a 32-bit value) from the `pt_regs` the
/// raw syscall tracepoints receive.
#[inline(always)]
pub fn read_compat_syscall_arg0(regs: *const u8) -> u64 {
    if cfg!(not(any(
        bpf_target_arch = "x86_64",
        bpf_target_arch = "aarch64"
    ))) {
        return u64::MAX;
    }
    // SAFETY: an offset within the `struct pt_regs` that `regs` points to, only read through the helper.
    let p = unsafe { regs.add(COMPAT_ARG0_OFFSET) } as *const u64;
    // SAFETY: the helper checks the address and fails on one it cannot read.
    unsafe { bpf_probe_read_kernel(p) }.map_or(u64::MAX, |v| v & 0xffff_ffff)
}

/// Reads the six syscall arguments from the `pt_regs` the raw syscall tracepoints receive.
/// At `sys_exit` the argument registers still hold what user space passed in.
#[inline(always)]
pub fn read_syscall_args(regs: *const u8, out: &mut [u64; 6]) {
    if cfg!(not(any(
        bpf_target_arch = "x86_64",
        bpf_target_arch = "aarch64"
    ))) {
        return;
    }
    let mut i = 0;
    while i < 6 {
        // SAFETY: an offset within the `struct pt_regs` that `regs` points to, only read through the helper.
        let p = unsafe { regs.add(ARG_REG_OFFSETS[i]) } as *const u64;
        // SAFETY: the helper checks the address and fails on one it cannot read.
        out[i] = unsafe { bpf_probe_read_kernel(p) }.unwrap_or(0);
        i += 1;
    }
}
