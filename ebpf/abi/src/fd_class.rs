//! Descriptors as the probes of `ebpf/probes/src/fd_class.rs` read them from the task's file
//! table: what the descriptor of a read or write was at the call's entry (its kind, and for
//! files the filesystem), as it joins the syscall keys; and the file behind a slow call's
//! descriptor at the call's exit ([`FileIdentity`]: inode, device, and its path or name), as
//! it goes into the slow-call record. The globals `FD_CONFIG` and `FILE_CONFIG` carry the
//! kernel struct offsets they read (`exporter/src/kernel/fd_class.rs` finds them in the
//! kernel's BTF), `SLOW_CALL_FDS` which descriptor each syscall names. No map.

use crate::NO_FIELD;

globals! {
    /// [`crate::FdProbeConfig`]: where the descriptor classification finds what it reads.
    FD_CONFIG: FdProbeConfig,
    /// [`crate::FileProbeConfig`]: where a slow call's file identity and path are read.
    FILE_CONFIG: FileProbeConfig,
    /// `[u8; MAX_SYSCALL_NR]`: per syscall number, the descriptor a slow call names
    /// ([`slow_fd`]).
    SLOW_CALL_FDS: [u8; crate::MAX_SYSCALL_NR as usize],
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
    // pwritev preadv2 pwritev2; then the same calls of i386 (read write readv writev pread64
    // pwrite64 preadv pwritev sendto sendmsg recvfrom recvmsg preadv2 pwritev2)
    const C: u32 = crate::COMPAT_BASE;
    matches!(
        nr,
        0 | 1 | 17 | 18 | 19 | 20 | 44 | 45 | 46 | 47 | 295 | 296 | 327 | 328
    ) || matches!(
        nr.wrapping_sub(C),
        3 | 4 | 145 | 146 | 180 | 181 | 333 | 334 | 369..=372 | 378 | 379
    )
}
#[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
pub fn classified(nr: u32) -> bool {
    // read write readv writev pread64 pwrite64 preadv pwritev sendto recvfrom sendmsg
    // recvmsg preadv2 pwritev2
    // AArch32 (EABI): read write readv writev pread64 pwrite64 sendto recvfrom sendmsg
    // recvmsg preadv pwritev preadv2 pwritev2
    const C: u32 = crate::COMPAT_BASE;
    matches!(nr, 63..=70 | 206 | 207 | 211 | 212 | 286 | 287)
        || matches!(
            nr.wrapping_sub(C),
            3 | 4 | 145 | 146 | 180 | 181 | 290 | 292 | 296 | 297 | 361 | 362 | 392 | 393
        )
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

/// Superblock magics of the pseudo-filesystems whose files the kernel names from the inode
/// rather than by a path (`include/uapi/linux/magic.h`): `pipe:[INODE]`, `socket:[INODE]`,
/// `anon_inode:[pidfd]`, and namespaces (`net:[INODE]`, ...).
pub const PIPEFS_MAGIC: u32 = 0x5049_5045;
pub const SOCKFS_MAGIC: u32 = 0x534F_434B;
pub const PID_FS_MAGIC: u32 = 0x5049_4446;
pub const NSFS_MAGIC: u32 = 0x6E73_6673;

/// Which descriptor a slow call names, per syscall number (global `SLOW_CALL_FDS`): one of its
/// arguments, its return value (the calls that open one), or none.
pub mod slow_fd {
    /// The call names no descriptor (or one it closes: gone at the call's exit).
    pub const NONE: u8 = 0;
    /// The return value, when it is not an error (`openat`, `accept4`, ...).
    pub const RETURNED: u8 = 7;

    /// Argument `index` (0 to 5).
    pub const fn arg(index: u8) -> u8 {
        index + 1
    }
}

/// The file behind a slow call's descriptor, read in the kernel at the call's exit while the
/// descriptor is still open (the last field of `SlowCallEvent`). With paths on, the record
/// carries the file's name after the event ([`file::NAME_PATH`], [`file::NAME_DENTRY`]);
/// pipes, sockets and the other files the kernel names from their inode need none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileIdentity {
    /// Inode number (`i_ino`).
    pub ino: u64,
    /// The superblock's device (`s_dev`, the kernel's encoding: major << 20 | minor).
    pub dev: u32,
    /// The superblock's magic (`statfs(2)`'s `f_type`).
    pub magic: u32,
    /// The descriptor looked up (-1: the call names none).
    pub fd: i32,
    /// What the lookup found ([`file::NONE`], [`file::OPEN`], ...).
    pub status: u8,
    /// The inode's kind ([`FILE`], [`PIPE`], ...), at the call's exit.
    pub kind: u8,
    /// What the bytes after the event are ([`file::NAME_NONE`], ...).
    pub name: u8,
    /// [`file::TRUNCATED`], [`file::DELETED`].
    pub flags: u8,
}

impl FileIdentity {
    /// Not looked up: the call names no descriptor, or identities are off.
    pub const NONE: Self = Self {
        ino: 0,
        dev: 0,
        magic: 0,
        fd: -1,
        status: file::NONE,
        kind: NONE,
        name: file::NAME_NONE,
        flags: 0,
    };
}

/// Values of [`FileIdentity`]'s fields, and the bounds of the kernel's path walk.
pub mod file {
    /// `status`: not looked up.
    pub const NONE: u8 = 0;
    /// `status`: the descriptor was open; `ino`, `dev`, `magic` and `kind` are its file's.
    pub const OPEN: u8 = 1;
    /// `status`: the descriptor was not open at the call's exit (closed meanwhile by another
    /// thread, or never open: the call failed with `EBADF`).
    pub const NOT_OPEN: u8 = 2;
    /// `status`: the kernel's memory could not be read.
    pub const UNREADABLE: u8 = 3;

    /// `name`: no name follows (paths off, or a file named from its inode).
    pub const NAME_NONE: u8 = 0;
    /// `name`: the file's path, walked from its dentry up to the root of its mount namespace,
    /// crossing mounts, as `/proc/<pid>/fd/<n>` shows it.
    pub const NAME_PATH: u8 = 1;
    /// `name`: the dentry's own name (anonymous inodes: `[eventfd]`, `[timerfd]`, ...).
    pub const NAME_DENTRY: u8 = 2;

    /// `flags`: the path lost components on the root side (longer than [`NAME_BYTES`], or
    /// more than [`MAX_STEPS`] levels): it holds the components nearest the file.
    pub const TRUNCATED: u8 = 1;
    /// `flags`: the file was unlinked (the kernel's `(deleted)` suffix).
    pub const DELETED: u8 = 2;

    /// Most bytes of a name in a record (a power of two).
    pub const NAME_BYTES: usize = 512;
    /// Room after the name in [`crate::SlowCallScratch`]'s work area: one component
    /// (`/` and up to `NAME_MAX`, 255, bytes), so a copy at any offset below `NAME_BYTES`
    /// stays inside it whatever its length.
    pub const COMPONENT_BYTES: usize = 256;
    /// Most steps of the walk: a directory level or a mount crossing each.
    pub const MAX_STEPS: u32 = 40;
}

/// Kernel struct offsets a slow call's file identity and path are read with (global
/// `FILE_CONFIG`), looked up in the kernel's BTF before loading; `fd.ready == 0` reads none.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileProbeConfig {
    /// The descriptor table and the inode's mode and superblock, as the classification reads
    /// them.
    pub fd: FdProbeConfig,
    /// Non-zero: walk paths (`slow_calls.resolve_file_paths`).
    pub paths: u32,
    /// `inode.i_ino`, `super_block.s_dev`.
    pub inode_ino: u32,
    pub sb_dev: u32,
    /// `file.f_path.dentry`, `file.f_path.mnt`.
    pub file_dentry: u32,
    pub file_mnt: u32,
    /// `dentry.d_parent`, `dentry.d_name.len`, `dentry.d_name.name`, `dentry.d_hash.pprev`.
    pub dentry_parent: u32,
    pub dentry_name_len: u32,
    pub dentry_name: u32,
    pub dentry_hash_pprev: u32,
    /// `mount.mnt` (the `vfsmount` a `struct path` points to), `mount.mnt_parent`,
    /// `mount.mnt_mountpoint`, `vfsmount.mnt_root`.
    pub mount_mnt: u32,
    pub mount_parent: u32,
    pub mount_mountpoint: u32,
    pub vfsmount_root: u32,
}

impl FileProbeConfig {
    pub const UNSET: Self = Self {
        fd: FdProbeConfig::UNSET,
        paths: 0,
        inode_ino: NO_FIELD,
        sb_dev: NO_FIELD,
        file_dentry: NO_FIELD,
        file_mnt: NO_FIELD,
        dentry_parent: NO_FIELD,
        dentry_name_len: NO_FIELD,
        dentry_name: NO_FIELD,
        dentry_hash_pprev: NO_FIELD,
        mount_mnt: NO_FIELD,
        mount_parent: NO_FIELD,
        mount_mountpoint: NO_FIELD,
        vfsmount_root: NO_FIELD,
    };
}

pod!(
    FdClass,
    FdCache,
    FdProbeConfig,
    FileIdentity,
    FileProbeConfig
);

const _: () = assert!(core::mem::size_of::<FdClass>() == 8);
const _: () = assert!(core::mem::size_of::<FdCache>() == 24);
const _: () = assert!(core::mem::size_of::<FdProbeConfig>() == 36);
const _: () = assert!(core::mem::size_of::<FileIdentity>() == 24);
const _: () = assert!(core::mem::size_of::<FileProbeConfig>() == 36 + 13 * 4);
const _: () = assert!(file::NAME_BYTES.is_power_of_two());
const _: () = assert!(file::COMPONENT_BYTES > 255);
