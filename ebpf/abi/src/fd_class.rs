//! Descriptor classification: what the descriptor of a read or write was at the call's entry
//! (its kind, and for files the filesystem), as the probes of `ebpf/probes/src/fd_class.rs`
//! classify it and as it joins the syscall keys. The global `FD_CONFIG` carries the kernel
//! struct offsets the classification reads (`exporter/src/kernel/fd_class.rs` finds them in
//! the kernel's BTF). No map.

use crate::NO_FIELD;

globals! {
    /// [`crate::FdProbeConfig`]: where the descriptor classification finds what it reads.
    FD_CONFIG: FdProbeConfig,
}

/// What the descriptor of a read or write was at the call's entry: its kind, and for files the
/// filesystem (the superblock's magic, `statfs(2)`'s `f_type`). Classified in the kernel from
/// the task's file table, for the syscalls [`classified`] names only; all zero for
/// every other syscall.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FdClass {
    /// Filesystem magic of a [`FILE`] (0 for the other kinds).
    pub fs_magic: u32,
    /// One of the kinds below ([`NONE`], [`FILE`], ...).
    pub kind: u8,
    pub _pad: [u8; 3],
}

impl FdClass {
    /// Not classified (a syscall without a descriptor to classify).
    pub const NONE: Self = Self {
        fs_magic: 0,
        kind: NONE,
        _pad: [0; 3],
    };

    pub const fn of(kind: u8, fs_magic: u32) -> Self {
        Self {
            fs_magic,
            kind,
            _pad: [0; 3],
        }
    }
}

// Descriptor kinds ([`FdClass::kind`]) and the syscalls whose descriptor is classified.

/// Not classified.
pub const NONE: u8 = 0;
/// A regular file, directory or symlink on a filesystem ([`FdClass::fs_magic`]).
pub const FILE: u8 = 1;
pub const SOCKET: u8 = 2;
/// A pipe or FIFO.
pub const PIPE: u8 = 3;
/// A character device (ttys, `/dev/null`, `/dev/nvidia*`, ...).
pub const CHAR: u8 = 4;
/// An anonymous inode (eventfd, timerfd, signalfd, epoll, io_uring, ...).
pub const ANON: u8 = 5;
/// Anything else: a block device, a descriptor not open at entry, one that could not be read.
pub const OTHER: u8 = 6;

/// The `fd_kind` label of each kind, by index (`NONE` has none).
pub const NAMES: [&str; 7] = ["", "file", "socket", "pipe", "char", "anon", "other"];

/// The `fd_kind` label of `kind`, `None` when it is not classified.
pub fn name(kind: u8) -> Option<&'static str> {
    match kind {
        NONE => None,
        k => Some(NAMES.get(k as usize).copied().unwrap_or("other")),
    }
}

/// `S_IFMT` and the file types of `i_mode` (the same on every architecture).
pub const S_IFMT: u16 = 0o170000;
pub const S_IFSOCK: u16 = 0o140000;
pub const S_IFLNK: u16 = 0o120000;
pub const S_IFREG: u16 = 0o100000;
pub const S_IFBLK: u16 = 0o060000;
pub const S_IFDIR: u16 = 0o040000;
pub const S_IFCHR: u16 = 0o020000;
pub const S_IFIFO: u16 = 0o010000;

/// Superblock magic of the anonymous-inode filesystem (`ANON_INODE_FS_MAGIC`): its inodes
/// are typeless on older kernels and regular files on newer ones, so the magic decides.
pub const ANON_INODE_FS_MAGIC: u32 = 0x0904_1934;

/// The kind of an inode of mode `mode` on a filesystem of magic `magic`.
pub fn kind_of(mode: u16, magic: u32) -> u8 {
    if magic == ANON_INODE_FS_MAGIC {
        return ANON;
    }
    match mode & S_IFMT {
        S_IFREG | S_IFDIR | S_IFLNK => FILE,
        S_IFSOCK => SOCKET,
        S_IFIFO => PIPE,
        S_IFCHR => CHAR,
        0 => ANON,
        _ => OTHER,
    }
}

/// Whether syscall `nr`'s first argument is a descriptor read or written (the read and
/// write families and the socket calls): only these are classified.
#[cfg(any(target_arch = "x86_64", bpf_target_arch = "x86_64"))]
pub fn classified(nr: u32) -> bool {
    // read write pread64 pwrite64 readv writev sendto recvfrom sendmsg recvmsg preadv
    // pwritev preadv2 pwritev2
    matches!(
        nr,
        0 | 1 | 17 | 18 | 19 | 20 | 44 | 45 | 46 | 47 | 295 | 296 | 327 | 328
    )
}
#[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
pub fn classified(nr: u32) -> bool {
    // read write readv writev pread64 pwrite64 preadv pwritev sendto recvfrom sendmsg
    // recvmsg preadv2 pwritev2
    matches!(nr, 63..=70 | 206 | 207 | 211 | 212 | 286 | 287)
}
#[cfg(not(any(
    target_arch = "x86_64",
    bpf_target_arch = "x86_64",
    target_arch = "aarch64",
    bpf_target_arch = "aarch64"
)))]
pub fn classified(_nr: u32) -> bool {
    false
}

/// A thread's last classified descriptor: its `struct file` and inode addresses and its class.
/// The same pair on the next call is not read again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FdCache {
    pub file: u64,
    pub inode: u64,
    pub class: FdClass,
}

/// Kernel struct offsets the descriptor classification reads (global `FD_CONFIG`), looked up in
/// the kernel's BTF before loading; `ready == 0` leaves every call unclassified.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdProbeConfig {
    pub ready: u32,
    /// `task_struct.files`, `files_struct.fdt`, `fdtable.max_fds`, `fdtable.fd`.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    /// `file.f_inode`, `inode.i_mode`, `inode.i_sb`, `super_block.s_magic`.
    pub file_inode: u32,
    pub inode_mode: u32,
    pub inode_sb: u32,
    pub sb_magic: u32,
}

impl FdProbeConfig {
    pub const UNSET: Self = Self {
        ready: 0,
        task_files: NO_FIELD,
        files_fdt: NO_FIELD,
        fdt_max_fds: NO_FIELD,
        fdt_fd: NO_FIELD,
        file_inode: NO_FIELD,
        inode_mode: NO_FIELD,
        inode_sb: NO_FIELD,
        sb_magic: NO_FIELD,
    };
}

pod!(FdClass, FdCache, FdProbeConfig);

const _: () = assert!(core::mem::size_of::<FdClass>() == 8);
const _: () = assert!(core::mem::size_of::<FdCache>() == 24);
const _: () = assert!(core::mem::size_of::<FdProbeConfig>() == 36);
