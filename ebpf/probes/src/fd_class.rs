//! Descriptor classification: what a read or write reads or writes, found in the kernel at the
//! call's entry from the task's file table (`task->files->fdt->fd[fd]->f_inode`): the kind of
//! the inode (file, socket, pipe, char device, anonymous) and, for files, the filesystem's
//! magic (`i_sb->s_magic`). Only the syscalls `fd_class::classified` names pay for it.
//!
//! Global: `FD_CONFIG` (struct offsets, looked up by user space in the kernel's BTF before the
//! load, as the block probes' are). No map.

use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
use sysscope_abi::{fd_class, FdClass, FdProbeConfig, NO_FIELD};

/// Set by the loader from kernel BTF; `ready == 0` (nothing classified) until then.
#[unsafe(no_mangle)]
static FD_CONFIG: FdProbeConfig = FdProbeConfig::UNSET;

/// Reads a `T` at `base + off` in kernel memory; `None` for a null base, a missing field or an
/// unreadable address.
#[inline(always)]
fn read<T>(base: u64, off: u32) -> Option<T> {
    if base == 0 || off == NO_FIELD {
        return None;
    }
    // SAFETY: the helper checks the address and copies nothing from an unreadable one.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.ok()
}

/// The class of descriptor `fd` of the current task: [`FdClass::NONE`] until the loader set
/// the offsets, [`fd_class::OTHER`] for a descriptor not open or not readable. A BPF
/// subprogram, so the syscall entry's verification stays small; returns the class packed
/// (`kind << 32 | fs_magic`), as BPF functions return one register.
#[inline(never)]
pub fn classify(fd: u64) -> u64 {
    // SAFETY: a loader-set global.
    let cfg = unsafe { core::ptr::read_volatile(&FD_CONFIG) };
    if cfg.ready == 0 {
        return 0;
    }
    let other = (fd_class::OTHER as u64) << 32;
    // SAFETY: the helper has no preconditions; the pointer is only read through the helper.
    let task = unsafe { bpf_get_current_task() };
    let Some(files) = read::<u64>(task, cfg.task_files) else {
        return other;
    };
    let Some(fdt) = read::<u64>(files, cfg.files_fdt) else {
        return other;
    };
    let Some(max_fds) = read::<u32>(fdt, cfg.fdt_max_fds) else {
        return other;
    };
    // A negative or too large descriptor is not open (the call fails with EBADF).
    if fd >= max_fds as u64 {
        return other;
    }
    let Some(table) = read::<u64>(fdt, cfg.fdt_fd) else {
        return other;
    };
    let Some(file) = read::<u64>(table, (fd as u32).wrapping_mul(8)) else {
        return other;
    };
    let Some(inode) = read::<u64>(file, cfg.file_inode) else {
        return other;
    };
    let Some(mode) = read::<u16>(inode, cfg.inode_mode) else {
        return other;
    };
    let magic = read::<u64>(inode, cfg.inode_sb)
        .and_then(|sb| read::<u64>(sb, cfg.sb_magic))
        .unwrap_or(0) as u32;
    let kind = fd_class::kind_of(mode, magic);
    let fs = if kind == fd_class::FILE { magic } else { 0 };
    ((kind as u64) << 32) | fs as u64
}

/// The class [`classify`] packed.
#[inline(always)]
pub fn unpack(packed: u64) -> FdClass {
    FdClass::of((packed >> 32) as u8, packed as u32)
}
