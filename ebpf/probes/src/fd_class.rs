//! Descriptor classification: what a read or write reads or writes, found in the kernel at the
//! call's entry from the task's file table (`task->files->fdt->fd[fd]->f_inode`): the kind of
//! the inode (file, socket, pipe, char device, anonymous) and, for files, the filesystem's
//! magic (`i_sb->s_magic`). Only the syscalls `fd_class::classified` names pay for it.
//!
//! Global: `FD_CONFIG` (struct offsets, looked up by user space in the kernel's BTF before the
//! load, as the block probes' are). No map.

use aya_ebpf::helpers::generated::bpf_get_current_task_btf;
use sysscope_abi::{fd_class, FdCache, FdClass, FdProbeConfig};

use crate::common::read;

/// Set by the loader from kernel BTF; `ready == 0` (nothing classified) until then.
#[unsafe(no_mangle)]
static FD_CONFIG: FdProbeConfig = FdProbeConfig::UNSET;

/// Reads a `T` at `base + off` of a BTF-typed kernel pointer: a plain load, which the verifier
/// checks against the kernel's types and turns into a fault-safe one. `off` comes from the
/// frozen `FD_CONFIG`, so the verifier knows it.
#[inline(always)]
unsafe fn load<T: Copy>(base: *const u8, off: u32) -> T {
    // SAFETY: as the caller promises: `base` is a BTF-typed pointer and `off` a member of its
    // type of type `T`.
    unsafe { core::ptr::read(base.add(off as usize) as *const T) }
}

/// Whether calls are classified at all: `syscalls.descriptor_kinds` is on and the loader found
/// the offsets. When not, a classified call does not even read its descriptor argument.
#[inline(always)]
pub fn enabled() -> bool {
    // SAFETY: a loader-set global.
    unsafe { core::ptr::read_volatile(&FD_CONFIG.ready) != 0 }
}

/// The class of the current task's descriptor `fd`, packed (`kind << 32 | fs_magic`, as BPF
/// functions return one register): 0 until the loader set the offsets, [`fd_class::OTHER`]
/// for a descriptor not open or not readable. A BPF subprogram, so the syscall entry's
/// verification stays small.
///
/// The task's file table is walked through BTF-typed pointers (plain loads); the descriptor's
/// file and inode are read with `bpf_probe_read_kernel`, and the inode's mode and superblock
/// only when the (file, inode) pair differs from the one `cache` holds.
#[inline(never)]
pub fn classify(fd: u64, cache: &mut FdCache) -> u64 {
    // SAFETY: a loader-set global.
    let cfg = unsafe { core::ptr::read_volatile(&FD_CONFIG) };
    if cfg.ready == 0 {
        return 0;
    }
    let other = (fd_class::OTHER as u64) << 32;
    // SAFETY: the helper has no preconditions; it returns the current task, BTF-typed.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    // SAFETY: the offsets are of these members in this kernel's BTF (`FdProbeConfig`).
    let files: *const u8 = unsafe { load(task, cfg.task_files) };
    if files.is_null() {
        return other;
    }
    // SAFETY: as above.
    let fdt: *const u8 = unsafe { load(files, cfg.files_fdt) };
    if fdt.is_null() {
        return other;
    }
    // SAFETY: as above.
    let max_fds: u32 = unsafe { load(fdt, cfg.fdt_max_fds) };
    // A negative or too large descriptor is not open (the call fails with EBADF).
    if fd >= max_fds as u64 {
        return other;
    }
    // SAFETY: as above.
    let table: u64 = unsafe { load(fdt, cfg.fdt_fd) };
    let Some(file) = read::<u64>(table, (fd as u32).wrapping_mul(8)) else {
        return other;
    };
    let Some(inode) = read::<u64>(file, cfg.file_inode) else {
        return other;
    };
    if inode == 0 {
        return other;
    }
    if file == cache.file && inode == cache.inode {
        return pack(&cache.class);
    }
    let Some(mode) = read::<u16>(inode, cfg.inode_mode) else {
        return other;
    };
    let magic = read::<u64>(inode, cfg.inode_sb)
        .and_then(|sb| read::<u64>(sb, cfg.sb_magic))
        .unwrap_or(0) as u32;
    let kind = fd_class::kind_of(mode, magic);
    let fs = if kind == fd_class::FILE { magic } else { 0 };
    *cache = FdCache {
        file,
        inode,
        class: FdClass::of(kind, fs),
    };
    pack(&cache.class)
}

#[inline(always)]
fn pack(class: &FdClass) -> u64 {
    ((class.kind as u64) << 32) | class.fs_magic as u64
}

/// The class [`classify`] packed.
#[inline(always)]
pub fn unpack(packed: u64) -> FdClass {
    FdClass::of((packed >> 32) as u8, packed as u32)
}
