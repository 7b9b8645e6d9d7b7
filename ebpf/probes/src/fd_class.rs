//! Descriptors, read in the kernel from the task's file table (`task->files->fdt->fd[fd]`).
//!
//! Classification: what a read or write reads or writes, found at the call's entry: the kind
//! of the inode (file, socket, pipe, char device, anonymous) and, for files, the filesystem's
//! magic (`i_sb->s_magic`). Only the syscalls `fd_class::classified` names pay for it.
//!
//! File identity: for a slow call only (`sample_slow_call` in `syscalls.rs`, after its rate
//! limit), the file of the descriptor the call names (`SLOW_CALL_FDS`), read at the call's
//! exit while the descriptor is still open: inode number, device, magic and kind, and with
//! paths on its path, walked from the file's dentry to the root of its mount namespace
//! (bounded, crossing mounts through `struct mount` as `d_path` does; `bpf_d_path` is not
//! allowed from tracepoints), or for anonymous inodes the dentry's name. Pipes and sockets
//! need neither: user space names them from the inode.
//!
//! Globals: `FD_CONFIG`, `FILE_CONFIG` (struct offsets, looked up by user space in the kernel's
//! BTF before the load, as the block probes' are), `SLOW_CALL_FDS`. No map.

use aya_ebpf::helpers::generated::{
    bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_probe_read_kernel_str,
};
use sysscope_abi::{
    fd_class::{self, file, slow_fd},
    FdCache, FdClass, FdProbeConfig, FileIdentity, FileProbeConfig, SlowCallScratch,
    MAX_SYSCALL_NR,
};

use crate::common::read;

/// Set by the loader from kernel BTF; `ready == 0` (nothing classified) until then.
#[unsafe(no_mangle)]
#[used]
static FD_CONFIG: FdProbeConfig = FdProbeConfig::UNSET;

/// Set by the loader when slow calls are sampled; `fd.ready == 0` (no identity read) until then.
#[unsafe(no_mangle)]
#[used]
static FILE_CONFIG: FileProbeConfig = FileProbeConfig::UNSET;

/// Set by the loader: per syscall number, the descriptor a slow call names (`slow_fd`).
#[unsafe(no_mangle)]
#[used]
static SLOW_CALL_FDS: [u8; MAX_SYSCALL_NR as usize] = [0; MAX_SYSCALL_NR as usize];

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
    let Ok(file) = file_at(&cfg, fd) else {
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

/// The `struct file` of the current task's descriptor `fd` (0 when the slot is empty), or the
/// [`file`] status saying why there is none. The file table is walked through BTF-typed
/// pointers (plain loads), the slot read with `bpf_probe_read_kernel`.
#[inline(always)]
fn file_at(cfg: &FdProbeConfig, fd: u64) -> Result<u64, u8> {
    // SAFETY: the helper has no preconditions; it returns the current task, BTF-typed.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    // SAFETY: the offsets are of these members in this kernel's BTF (`FdProbeConfig`).
    let files: *const u8 = unsafe { load(task, cfg.task_files) };
    if files.is_null() {
        return Err(file::UNREADABLE);
    }
    // SAFETY: as above.
    let fdt: *const u8 = unsafe { load(files, cfg.files_fdt) };
    if fdt.is_null() {
        return Err(file::UNREADABLE);
    }
    // SAFETY: as above.
    let max_fds: u32 = unsafe { load(fdt, cfg.fdt_max_fds) };
    // A negative or too large descriptor is not open (the call fails with EBADF).
    if fd >= max_fds as u64 {
        return Err(file::NOT_OPEN);
    }
    // SAFETY: as above.
    let table: u64 = unsafe { load(fdt, cfg.fdt_fd) };
    read::<u64>(table, (fd as u32).wrapping_mul(8)).ok_or(file::UNREADABLE)
}

/// A loader-set global's value. (Read volatile: the compiler would otherwise fold the value
/// the object was built with.)
#[inline(always)]
fn global<T: Copy>(value: &T) -> T {
    // SAFETY: a global of the object, valid for the program's life.
    unsafe { core::ptr::read_volatile(value) }
}

/// The descriptor slow call `nr` names, from its arguments or its return value; `None` when
/// it names none, or the value is not a descriptor (a C `int`: `AT_FDCWD`, -1 and errors are
/// negative).
#[inline(always)]
pub fn slow_call_fd(nr: u32, args: &[u64; 6], ret: i64) -> Option<u64> {
    // SAFETY: an index below the array's length (a power of two).
    let role = global(unsafe {
        &*SLOW_CALL_FDS
            .as_ptr()
            .add((nr & (MAX_SYSCALL_NR - 1)) as usize)
    });
    let raw = match role {
        slow_fd::NONE => return None,
        slow_fd::RETURNED => ret as u64,
        arg => *args.get(arg.wrapping_sub(1) as usize)?,
    };
    let fd = raw as u32 as i32;
    (fd >= 0).then_some(fd as u64)
}

/// Writes the identity of the current task's descriptor `fd` to `record.event.file` and, with
/// paths on, its name to `record.name`; returns the name's length (0: none). A BPF subprogram:
/// it runs only for slow calls, and keeps `sys_exit`'s own verification small.
#[inline(never)]
pub fn describe_file(fd: u64, record: &mut SlowCallScratch) -> u32 {
    let id = &mut record.event.file;
    *id = FileIdentity {
        fd: fd as i32,
        ..FileIdentity::NONE
    };
    let c = &FILE_CONFIG;
    if global(&c.fd.ready) == 0 {
        return 0;
    }
    let fdc = global(&c.fd);
    let file = match file_at(&fdc, fd) {
        Ok(0) => {
            id.status = file::NOT_OPEN;
            return 0;
        }
        Ok(file) => file,
        Err(status) => {
            id.status = status;
            return 0;
        }
    };
    let Some(inode) = read::<u64>(file, fdc.file_inode).filter(|inode| *inode != 0) else {
        id.status = file::UNREADABLE;
        return 0;
    };
    let sb = read::<u64>(inode, fdc.inode_sb).unwrap_or(0);
    let magic = read::<u64>(sb, fdc.sb_magic).unwrap_or(0) as u32;
    let mode = read::<u16>(inode, fdc.inode_mode).unwrap_or(0);
    id.ino = read::<u64>(inode, global(&c.inode_ino)).unwrap_or(0);
    id.dev = read::<u32>(sb, global(&c.sb_dev)).unwrap_or(0);
    id.magic = magic;
    id.kind = fd_class::kind_of(mode, magic);
    id.status = file::OPEN;
    if global(&c.paths) == 0 {
        return 0;
    }
    match magic {
        // Named from the inode by user space, as the kernel names them.
        fd_class::PIPEFS_MAGIC
        | fd_class::SOCKFS_MAGIC
        | fd_class::PID_FS_MAGIC
        | fd_class::NSFS_MAGIC => 0,
        _ => {
            let Some(dentry) = read::<u64>(file, global(&c.file_dentry)) else {
                return 0;
            };
            if magic == fd_class::ANON_INODE_FS_MAGIC {
                return dentry_name(c, dentry, record);
            }
            let mnt = read::<u64>(file, global(&c.file_mnt)).unwrap_or(0);
            walk_path(c, dentry, mnt, record)
        }
    }
}

/// Copies `dentry`'s own name to `record.name` (anonymous inodes: the kernel names them
/// `anon_inode:` and this); 0 when it cannot be read whole (see [`name_of`]).
#[inline(always)]
fn dentry_name(c: &FileProbeConfig, dentry: u64, record: &mut SlowCallScratch) -> u32 {
    match name_of(c, dentry, record.name.as_mut_ptr()) {
        Some(len) => {
            record.event.file.name = file::NAME_DENTRY;
            len
        }
        None => 0,
    }
}

/// A component's length is at most `NAME_MAX`.
const NAME_MAX: u32 = 255;
const NAME_BYTES: u32 = file::NAME_BYTES as u32;
const COMPONENT_BYTES: u32 = file::COMPONENT_BYTES as u32;

/// Copies `dentry`'s name to `to` (room for `COMPONENT_BYTES`) and returns its length, or
/// `None` when the name and its length do not agree. A rename changes `d_name.name` and
/// `d_name.len` with separate stores, so the two read here may belong to the old and the new
/// name: copying `len` bytes would then run past a short name into whatever follows it (the
/// rest of `struct dentry`, kernel pointers). As the kernel's `prepend_name` does, the pointer
/// is read first and the copy stops at the name's NUL: it never holds a byte that is not part
/// of a name. The copy is allowed one byte more than the length, so a name longer than the
/// length read (a long new name with an old short length) is told apart from one of that
/// length: the name is taken only when its NUL is exactly where the length says.
#[inline(always)]
fn name_of(c: &FileProbeConfig, dentry: u64, to: *mut u8) -> Option<u32> {
    let name = read::<u64>(dentry, global(&c.dentry_name))?;
    let len = read::<u32>(dentry, global(&c.dentry_name_len))?;
    // Clamped, not masked: a length above NAME_MAX (a torn read) must not wrap to a short one.
    let len = if len > NAME_MAX { NAME_MAX } else { len };
    let size = if len + 2 > COMPONENT_BYTES {
        COMPONENT_BYTES
    } else {
        len + 2
    };
    // SAFETY: at most `size` (<= COMPONENT_BYTES) bytes into `to`, which holds that many; the
    // helper stops at the NUL, writes one, and reads nothing from an address it cannot read.
    let copied = unsafe { bpf_probe_read_kernel_str(to.cast(), size, name as *const _) };
    // The bytes copied, the NUL included: the name's length is one less.
    if copied != len as i64 + 1 {
        return None;
    }
    Some(len)
}

/// Walks from `dentry` (of vfsmount `mnt`) up to the root of its mount namespace, as the
/// kernel's `d_path` does: at the root of a mount, on to the mountpoint in the parent mount;
/// at a mount that is its own parent, done. The path is written backwards at the end of
/// `record.work`, at most `NAME_BYTES` bytes and `MAX_STEPS` steps (beyond, the components
/// nearest the root are left out and the path marked truncated), then copied to
/// `record.name`; returns its length.
///
/// The position in `work` and the outcome live in the scratch value, not in registers: the
/// verifier then sees the same state at the top of every step, whatever lengths the names
/// had, and checks each step once instead of once per combination of the paths before it.
#[inline(always)]
fn walk_path(c: &FileProbeConfig, dentry: u64, mnt: u64, record: &mut SlowCallScratch) -> u32 {
    let dentry_parent = global(&c.dentry_parent);
    let mount_mnt = global(&c.mount_mnt) as u64;
    let mount_parent = global(&c.mount_parent);
    let mount_mountpoint = global(&c.mount_mountpoint);
    let vfsmount_root = global(&c.vfsmount_root);

    // Unlinked: unhashed, and not a root (`d_unlinked`). Truncated until the root is reached.
    let hashed = read::<u64>(dentry, global(&c.dentry_hash_pprev)).unwrap_or(1) != 0;
    let deleted = !hashed && read::<u64>(dentry, dentry_parent) != Some(dentry);
    let flags: *mut u8 = &mut record.event.file.flags;
    let pos: *mut u32 = &mut record.walk_pos;
    // SAFETY: fields of this CPU's scratch value, valid while the program runs.
    unsafe {
        flags.write_volatile(file::TRUNCATED | if deleted { file::DELETED } else { 0 });
        pos.write_volatile(NAME_BYTES);
    }
    let work = record.work.as_mut_ptr();
    let mut dentry = dentry;
    let mut mount = mnt.wrapping_sub(mount_mnt);
    let mut root = read::<u64>(mnt, vfsmount_root).unwrap_or(0);
    let mut step = 0;
    while step < file::MAX_STEPS {
        step += 1;
        if dentry == root {
            let parent = read::<u64>(mount, mount_parent).unwrap_or(0);
            if parent == mount || parent == 0 {
                // SAFETY: as above.
                unsafe { flags.write_volatile(flags.read_volatile() & !file::TRUNCATED) };
                break;
            }
            dentry = read::<u64>(mount, mount_mountpoint).unwrap_or(0);
            mount = parent;
            root = read::<u64>(mount.wrapping_add(mount_mnt), vfsmount_root).unwrap_or(0);
            continue;
        }
        let Some(parent) = read::<u64>(dentry, dentry_parent) else {
            break;
        };
        // The name goes first to the component room after the path (`work[NAME_BYTES..]`),
        // NUL-bounded; a name torn by a rename ends the walk, the path marked truncated (it
        // holds the components nearest the file, each whole).
        // SAFETY: NAME_BYTES is inside `work`, which holds COMPONENT_BYTES more.
        let component = unsafe { work.add(NAME_BYTES as usize) };
        let Some(len) = name_of(c, dentry, component) else {
            break;
        };
        // SAFETY: as above.
        let at = unsafe { pos.read_volatile() };
        if len + 1 > at {
            break;
        }
        let at = at - (len + 1);
        // SAFETY: as above.
        unsafe { pos.write_volatile(at) };
        let at = (at & (NAME_BYTES - 1)) as usize;
        // The compiler knows `len` is at most NAME_MAX and keeps only a signed bound, which
        // 6.12's verifier does not take for a helper's size ("unbounded memory access"): the
        // length goes through the stack and is masked, a no-op the verifier can read.
        // SAFETY: a local's own address.
        let len = unsafe { core::ptr::read_volatile(&len) } & NAME_MAX;
        // SAFETY: `at` is below NAME_BYTES and `len` at most NAME_MAX, and `at + 1 + len` is
        // at most NAME_BYTES: the copy stays before the component room it copies from.
        unsafe {
            *work.add(at) = b'/';
            if bpf_probe_read_kernel(work.add(at + 1).cast(), len, component as *const _) != 0 {
                break;
            }
        }
        if parent == dentry {
            // A root that is not its mount's: a pseudo-filesystem's file (memfd, ...), named
            // by this one component, as the kernel names it.
            // SAFETY: as above.
            unsafe { flags.write_volatile(flags.read_volatile() & !file::TRUNCATED) };
            break;
        }
        dentry = parent;
    }
    // SAFETY: as above.
    let mut at = unsafe { pos.read_volatile() } & (2 * NAME_BYTES - 1);
    if at >= NAME_BYTES {
        // Nothing written: the root of the namespace itself.
        at = NAME_BYTES - 1;
        // SAFETY: below NAME_BYTES.
        unsafe { *work.add(at as usize) = b'/' };
    }
    let len = NAME_BYTES - at;
    // SAFETY: `len` bytes from `work[at..]` to `name`, which holds NAME_BYTES.
    let copied = unsafe {
        bpf_probe_read_kernel(
            record.name.as_mut_ptr().cast(),
            len,
            work.add(at as usize) as *const _,
        )
    };
    if copied != 0 {
        return 0;
    }
    record.event.file.name = file::NAME_PATH;
    len
}
