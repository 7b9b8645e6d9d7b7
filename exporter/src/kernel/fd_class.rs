//! Descriptors from user space: the kernel offsets the probes need to classify a descriptor at
//! a call's entry (global `FD_CONFIG`) and to read the file behind a slow call's descriptor at
//! its exit (globals `FILE_CONFIG` and `SLOW_CALL_FDS`, see `ebpf/probes/src/fd_class.rs`),
//! the `fd_kind` and `fs` labels of a class, and the device and name of a file as the slow-call
//! record carries them.
//!
//! The probes put the class in the syscall statistics and error keys and in slow-call records,
//! for the read and write families and the socket calls only ([`fd_class::classified`]).
//! Metrics: the `fd_kind` and `fs` labels of `sysscope_syscalls_total`,
//! `sysscope_syscall_errors_total` and `sysscope_syscall_duration_seconds`; span attributes
//! `sysscope.fd.kind`, `sysscope.fd.fs`, and from the file identity `file.path`,
//! `sysscope.file.inode` and `sysscope.file.device`.

use std::borrow::Cow;

use sysscope_abi::{
    fd_class::{self, file, slow_fd},
    FdClass, FdProbeConfig, FileIdentity, FileProbeConfig, MAX_SYSCALL_NR,
};

use crate::{
    kernel::btf::{Btf, BtfError, MemberKind},
    syscall_table,
};

/// The offsets of the chain `task->files->fdt->{max_fds, fd}`, `file->f_inode`,
/// `inode->{i_mode, i_sb}`, `sb->s_magic` in this kernel.
pub(crate) fn resolve_offsets(btf: &Btf) -> Result<FdProbeConfig, BtfError> {
    use MemberKind::{Int, Pointer};
    Ok(FdProbeConfig {
        ready: 1,
        task_files: btf.field_of_kind("task_struct", "files", Pointer)?,
        files_fdt: btf.field_of_kind("files_struct", "fdt", Pointer)?,
        fdt_max_fds: btf.field_of_kind("fdtable", "max_fds", Int(4))?,
        fdt_fd: btf.field_of_kind("fdtable", "fd", Pointer)?,
        file_inode: btf.field_of_kind("file", "f_inode", Pointer)?,
        inode_mode: btf.field_of_kind("inode", "i_mode", Int(2))?,
        inode_sb: btf.field_of_kind("inode", "i_sb", Pointer)?,
        sb_magic: btf.field_of_kind("super_block", "s_magic", Int(8))?,
    })
}

/// The offsets a slow call's file is read with: the descriptor table and inode of
/// [`resolve_offsets`], the inode's number and device, and with `paths` those of the path walk
/// (`file->f_path`, `dentry->{d_parent, d_name, d_hash}`, `struct mount`, `vfsmount->mnt_root`).
pub(crate) fn resolve_file_offsets(btf: &Btf, paths: bool) -> Result<FileProbeConfig, BtfError> {
    use MemberKind::{Int, Pointer};
    let f_path = btf.struct_field("file", "f_path")?;
    let d_name = btf.struct_field("dentry", "d_name")?;
    let d_hash = btf.struct_field("dentry", "d_hash")?;
    Ok(FileProbeConfig {
        fd: resolve_offsets(btf)?,
        paths: u32::from(paths),
        inode_ino: btf.field_of_kind("inode", "i_ino", Int(8))?,
        sb_dev: btf.field_of_kind("super_block", "s_dev", Int(4))?,
        file_dentry: f_path + btf.field_of_kind("path", "dentry", Pointer)?,
        file_mnt: f_path + btf.field_of_kind("path", "mnt", Pointer)?,
        dentry_parent: btf.field_of_kind("dentry", "d_parent", Pointer)?,
        dentry_name_len: d_name + btf.field_of_kind("qstr", "len", Int(4))?,
        dentry_name: d_name + btf.field_of_kind("qstr", "name", Pointer)?,
        dentry_hash_pprev: d_hash + btf.field_of_kind("hlist_bl_node", "pprev", Pointer)?,
        mount_mnt: btf.struct_field("mount", "mnt")?,
        mount_parent: btf.field_of_kind("mount", "mnt_parent", Pointer)?,
        mount_mountpoint: btf.field_of_kind("mount", "mnt_mountpoint", Pointer)?,
        vfsmount_root: btf.field_of_kind("vfsmount", "mnt_root", Pointer)?,
    })
}

/// Which descriptor of a syscall its slow-call record names: the file the kernel reads at the
/// call's exit, and the one `sysscope.syscall.fd` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Descriptor {
    /// Argument `i` (0 to 5).
    Arg(u8),
    /// The return value, when it is not an error: the calls that open a descriptor.
    Returned,
    /// Argument `i`, which the call closes: gone at its exit, so its file is not read.
    Closed(u8),
}

/// The syscalls whose slow-call records name a descriptor, by name (so one table serves every
/// architecture; names an architecture lacks are skipped).
const DESCRIPTORS: &[(&[&str], Descriptor)] = &[
    (
        &[
            "read",
            "write",
            "pread64",
            "pwrite64",
            "readv",
            "writev",
            "preadv",
            "pwritev",
            "preadv2",
            "pwritev2",
            "getdents",
            "getdents64",
            "recvfrom",
            "sendto",
            "recvmsg",
            "sendmsg",
            "recvmmsg",
            "sendmmsg",
            "sendfile",
            "splice",
            "copy_file_range",
            "tee",
            "vmsplice",
            "fsync",
            "fdatasync",
            "syncfs",
            "sync_file_range",
            "fallocate",
            "ftruncate",
            "readahead",
            "fadvise64",
            "flock",
            "lseek",
            "ioctl",
            "fcntl",
            "fstat",
            "fstatfs",
            "fgetxattr",
            "fsetxattr",
            "connect",
            "bind",
            "listen",
            "shutdown",
            "getsockopt",
            "setsockopt",
        ],
        Descriptor::Arg(0),
    ),
    // mmap(addr, length, prot, flags, fd, offset)
    (&["mmap"], Descriptor::Arg(4)),
    (&["close"], Descriptor::Closed(0)),
    (
        &[
            "open",
            "openat",
            "openat2",
            "creat",
            "open_by_handle_at",
            "accept",
            "accept4",
        ],
        Descriptor::Returned,
    ),
];

/// The descriptor syscall `name`'s slow-call record names, if any.
pub(crate) fn descriptor_of(name: &str) -> Option<Descriptor> {
    DESCRIPTORS
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, d)| *d)
}

/// `SLOW_CALL_FDS`: per syscall number of this architecture, the descriptor its slow-call
/// record names ([`slow_fd`]).
pub(crate) fn slow_call_fds() -> [u8; MAX_SYSCALL_NR as usize] {
    let mut table = [slow_fd::NONE; MAX_SYSCALL_NR as usize];
    for (names, descriptor) in DESCRIPTORS {
        let role = match descriptor {
            Descriptor::Arg(i) => slow_fd::arg(*i),
            Descriptor::Returned => slow_fd::RETURNED,
            Descriptor::Closed(_) => continue,
        };
        for name in *names {
            if let Some(slot) =
                syscall_table::number(name).and_then(|nr| table.get_mut(nr as usize))
            {
                *slot = role;
            }
        }
    }
    table
}

/// A device as `MAJ:MIN`, from the kernel's encoding (`s_dev`: major << 20 | minor).
pub(crate) fn device_name(dev: u32) -> String {
    format!("{}:{}", dev >> 20, dev & 0xF_FFFF)
}

/// The kernel's encoding of a device as `stat(2)` reports it (`st_dev`).
pub(crate) fn kernel_device(st_dev: u64) -> u32 {
    (libc::major(st_dev) << 20) | (libc::minor(st_dev) & 0xF_FFFF)
}

/// How the kernel names a file it names from its inode (pipes, sockets, pidfds, anonymous
/// inodes), as `/proc/<pid>/fd/<n>` shows it; `None` for files named by their path, or
/// pseudo-files whose name the record cannot give (namespaces).
pub(crate) fn inode_name(id: &FileIdentity, name: &[u8]) -> Option<String> {
    match id.magic {
        fd_class::PIPEFS_MAGIC => Some(format!("pipe:[{}]", id.ino)),
        fd_class::SOCKFS_MAGIC => Some(format!("socket:[{}]", id.ino)),
        fd_class::PID_FS_MAGIC => Some("anon_inode:[pidfd]".to_string()),
        fd_class::ANON_INODE_FS_MAGIC if id.name == file::NAME_DENTRY => {
            Some(format!("anon_inode:{}", String::from_utf8_lossy(name)))
        }
        _ => None,
    }
}

/// Filesystem names by superblock magic (`include/uapi/linux/magic.h`), as `/proc/mounts`
/// names them. One magic can stand for several drivers: ext2, ext3 and ext4 share one
/// (`ext4`), and NFS versions 2 to 4 another (`nfs`).
const FILESYSTEMS: &[(u32, &str)] = &[
    (0xEF53, "ext4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58F6, "ramfs"),
    (0x6969, "nfs"),
    (0x6573_5546, "fuse"),
    (0x794C_7630, "overlay"),
    (0x7371_7368, "squashfs"),
    (0xE0F5_E1E2, "erofs"),
    (0xF2F5_2010, "f2fs"),
    (0x2FC1_2FC1, "zfs"),
    (0x00C3_6400, "ceph"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x0BD0_0BD0, "lustre"),
    (0x4750_4653, "gpfs"),
    (0x0102_1997, "9p"),
    (0x9660, "iso9660"),
    (0x4D44, "vfat"),
    (0x2011_BAB0, "exfat"),
    (0x5346_544E, "ntfs"),
    (0x9FA0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x6367_7270, "cgroup2"),
    (0x0027_E0EB, "cgroup"),
    (0x1CD1, "devpts"),
    (0x9584_58F6, "hugetlbfs"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0xCAFE_4A11, "bpf"),
    (0x7363_6673, "securityfs"),
    (0x6265_6570, "configfs"),
    (0x0187, "autofs"),
    (0xDE5E_81E4, "efivarfs"),
    (0x6165_676C, "pstore"),
    (0x1980_0202, "mqueue"),
    (0x6E73_6673, "nsfs"),
    (0x5049_4446, "pidfs"),
    (0x6E66_7364, "nfsd"),
    (0x4244, "hfs"),
    (0x482B, "hfsplus"),
    (0x5265_4973, "reiserfs"),
    (0x1573_3003, "zonefs"),
];

/// The `fs` label of a filesystem magic: its name, or the magic in hex for one not in the
/// table (still one value per filesystem type, so the label stays bounded).
pub fn fs_name(magic: u32) -> Cow<'static, str> {
    match FILESYSTEMS.iter().find(|(m, _)| *m == magic) {
        Some((_, name)) => Cow::Borrowed(name),
        None => Cow::Owned(format!("0x{magic:08x}")),
    }
}

/// The labels of a class: `fd_kind` for every classified call, and `fs` for files.
pub(crate) fn push_labels(class: &FdClass, labels: &mut Vec<(&'static str, Cow<'_, str>)>) {
    let Some(kind) = fd_class::name(class.kind) else {
        return;
    };
    labels.push(("fd_kind", Cow::Borrowed(kind)));
    if class.kind == fd_class::FILE {
        labels.push(("fs", fs_name(class.fs_magic)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert_eq!(fs_name(0xEF53), "ext4");
        assert_eq!(fs_name(0x6573_5546), "fuse");
        assert_eq!(fs_name(0x1234_5678), "0x12345678");
        let mut labels = Vec::new();
        push_labels(&FdClass::NONE, &mut labels);
        assert!(labels.is_empty());
        push_labels(&FdClass::of(fd_class::FILE, 0x0102_1994), &mut labels);
        assert_eq!(
            labels,
            [
                ("fd_kind", Cow::Borrowed("file")),
                ("fs", Cow::Borrowed("tmpfs"))
            ]
        );
        labels.clear();
        push_labels(&FdClass::of(fd_class::PIPE, 0), &mut labels);
        assert_eq!(labels, [("fd_kind", Cow::Borrowed("pipe"))]);
    }

    #[test]
    fn kinds_from_mode_and_magic() {
        use fd_class::*;
        assert_eq!(kind_of(S_IFREG | 0o644, 0xEF53), FILE);
        assert_eq!(kind_of(S_IFDIR | 0o755, 0xEF53), FILE);
        assert_eq!(kind_of(S_IFSOCK | 0o777, 0x534F_434B), SOCKET);
        assert_eq!(kind_of(S_IFIFO | 0o600, 0x5049_5045), PIPE);
        assert_eq!(kind_of(S_IFCHR | 0o666, 0x0102_1994), CHAR);
        assert_eq!(kind_of(S_IFBLK | 0o660, 0x0102_1994), OTHER);
        // Anonymous inodes: typeless before 6.x, regular since; the magic decides.
        assert_eq!(kind_of(0o600, ANON_INODE_FS_MAGIC), ANON);
        assert_eq!(kind_of(S_IFREG | 0o600, ANON_INODE_FS_MAGIC), ANON);
        assert_eq!(kind_of(0o600, 0x1234), ANON);
    }

    #[test]
    fn slow_calls_name_the_descriptor_the_spans_show() {
        use sysscope_abi::fd_class::slow_fd;
        let fds = slow_call_fds();
        let at = |name: &str| fds[syscall_table::number(name).unwrap() as usize];
        assert_eq!(at("read"), slow_fd::arg(0));
        assert_eq!(at("fsync"), slow_fd::arg(0));
        assert_eq!(at("mmap"), slow_fd::arg(4));
        assert_eq!(at("openat"), slow_fd::RETURNED);
        assert_eq!(at("accept4"), slow_fd::RETURNED);
        // Closed by the call: nothing left to read at its exit.
        assert_eq!(at("close"), slow_fd::NONE);
        assert_eq!(at("getppid"), slow_fd::NONE);
        assert_eq!(descriptor_of("close"), Some(Descriptor::Closed(0)));
        // Every name of the table is a syscall somewhere.
        for (names, _) in DESCRIPTORS {
            for name in *names {
                assert!(syscall_table::is_known_anywhere(name), "{name}");
            }
        }
    }

    #[test]
    fn devices_in_both_encodings() {
        assert_eq!(device_name((259 << 20) | 3), "259:3");
        assert_eq!(device_name(45), "0:45");
        // stat(2)'s encoding (glibc's makedev) to the kernel's.
        assert_eq!(kernel_device(libc::makedev(259, 3)), (259 << 20) | 3);
        assert_eq!(kernel_device(libc::makedev(0, 300)), 300);
    }

    #[test]
    fn file_offsets_resolve_on_this_kernel() {
        let Some(btf) = crate::kernel::btf::for_test("file_offsets_resolve_on_this_kernel") else {
            return;
        };
        let c = resolve_file_offsets(&btf, true).unwrap();
        assert_eq!((c.fd.ready, c.paths), (1, 1));
        // d_name.len is the high half of the qstr's first word, d_name.name the next word.
        assert_eq!(c.dentry_name, c.dentry_name_len + 4);
        assert_eq!(resolve_file_offsets(&btf, false).unwrap().paths, 0);
    }

    #[test]
    fn offsets_resolve_on_this_kernel() {
        let Some(btf) = crate::kernel::btf::for_test("offsets_resolve_on_this_kernel") else {
            return;
        };
        let c = resolve_offsets(&btf).unwrap();
        assert_eq!(c.ready, 1);
        assert_ne!(c.task_files, sysscope_abi::NO_FIELD);
    }
}
