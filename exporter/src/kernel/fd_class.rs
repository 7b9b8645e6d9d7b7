//! Descriptor classes of reads and writes: the kernel offsets the probes need to classify a
//! descriptor at entry (global `FD_CONFIG`, see `ebpf/probes/src/fd_class.rs`), and the
//! `fd_kind` and `fs` labels of a class.
//!
//! The probes put the class in the syscall statistics and error keys and in slow-call records,
//! for the read and write families and the socket calls only ([`fd_class::classified`]).
//! Metrics: the `fd_kind` and `fs` labels of `sysscope_syscalls_total`,
//! `sysscope_syscall_errors_total` and `sysscope_syscall_duration_seconds`; span attributes
//! `sysscope.fd.kind` and `sysscope.fd.fs`.

use std::borrow::Cow;

use sysscope_abi::{fd_class, FdClass, FdProbeConfig};

use crate::kernel::btf::{Btf, BtfError, MemberKind};

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
    fn offsets_resolve_on_this_kernel() {
        let Some(btf) = crate::kernel::btf::for_test("offsets_resolve_on_this_kernel") else {
            return;
        };
        let c = resolve_offsets(&btf).unwrap();
        assert_eq!(c.ready, 1);
        assert_ne!(c.task_files, sysscope_abi::NO_FIELD);
    }
}
