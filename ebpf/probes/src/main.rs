//! sysscope's kernel side: every eBPF program and map, in one object file.
//!
//! One module per probe family; each owns its maps and documents its tracepoints.
//! Names of programs and maps are shared with user space through `sysscope-abi`.
//!
//! Every global the loader sets (`#[unsafe(no_mangle)] static`) is also `#[used]`: LLVM may
//! otherwise merge an anonymous constant of the same bytes into it (a promoted `&0`, a zeroed
//! struct initializer), and the program would then read whatever the loader wrote there as
//! that constant. `#[used]` keeps such globals out of constant merging.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Atomic read-modify-write: core exposes only atomic loads and stores for the BPF target, but
// LLVM lowers the intrinsic to the BPF atomic add instruction.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod block_io;
#[cfg(target_arch = "bpf")]
mod common;
#[cfg(target_arch = "bpf")]
mod empty;
#[cfg(target_arch = "bpf")]
mod fd_class;
#[cfg(target_arch = "bpf")]
mod sched;
#[cfg(target_arch = "bpf")]
mod syscalls;
#[cfg(target_arch = "bpf")]
mod trace;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: Programs are written without panicking paths; the verifier rejects any that remain.
    unsafe { core::hint::unreachable_unchecked() }
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

/// The probes only exist for the BPF target; on the host this crate is an empty binary so that
/// workspace-wide commands still build.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
