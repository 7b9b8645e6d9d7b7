//! What the arguments of a syscall mean, for the span attributes: which argument is a file
//! descriptor, which a byte count or flags, and whether the return value counts bytes or is a
//! new descriptor. Keyed by syscall name, so one table serves every architecture.

/// Argument roles of one syscall (indices into the six raw arguments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ArgSpec {
    /// The argument that is a file descriptor the call works on.
    pub(crate) fd: Option<usize>,
    /// The argument that is the requested size in bytes.
    pub(crate) size: Option<usize>,
    /// The argument that holds flags (or a mode) worth showing.
    pub(crate) flags: Option<usize>,
    /// A non-negative return value is the number of bytes transferred.
    pub(crate) ret_bytes: bool,
    /// A non-negative return value is a new file descriptor (open, accept).
    pub(crate) ret_fd: bool,
    /// The descriptor is gone once the call returns (close): do not resolve its path.
    pub(crate) consumes_fd: bool,
}

const fn spec(
    fd: Option<usize>,
    size: Option<usize>,
    flags: Option<usize>,
    ret_bytes: bool,
) -> ArgSpec {
    ArgSpec {
        fd,
        size,
        flags,
        ret_bytes,
        ret_fd: false,
        consumes_fd: false,
    }
}

/// The argument roles of syscall `name`; unknown syscalls have none.
pub(crate) fn spec_of(name: &str) -> ArgSpec {
    match name {
        "read" | "write" | "pread64" | "pwrite64" | "getdents" | "getdents64" => {
            spec(Some(0), Some(2), None, true)
        }
        "readv" | "writev" | "preadv" | "pwritev" => spec(Some(0), None, None, true),
        // preadv2(fd, iov, iovcnt, pos_l, pos_h, flags)
        "preadv2" | "pwritev2" => spec(Some(0), None, Some(5), true),
        "recvfrom" | "sendto" => spec(Some(0), Some(2), Some(3), true),
        "recvmsg" | "sendmsg" => spec(Some(0), None, Some(2), true),
        "recvmmsg" | "sendmmsg" => spec(Some(0), None, Some(3), false),
        "sendfile" => spec(Some(0), Some(3), None, true),
        "splice" | "copy_file_range" => spec(Some(0), Some(4), Some(5), true),
        "tee" | "vmsplice" => spec(Some(0), Some(2), Some(3), true),
        "fsync" | "fdatasync" | "syncfs" | "lseek" | "ioctl" | "fcntl" | "fstat" | "fstatfs"
        | "connect" | "bind" | "listen" | "shutdown" | "getsockopt" | "setsockopt" => {
            spec(Some(0), None, None, false)
        }
        "sync_file_range" => spec(Some(0), Some(2), Some(3), false),
        "fallocate" => spec(Some(0), Some(3), Some(1), false),
        "ftruncate" => spec(Some(0), Some(1), None, false),
        "readahead" => spec(Some(0), Some(2), None, false),
        "fadvise64" => spec(Some(0), Some(2), None, false),
        "flock" => spec(Some(0), None, Some(1), false),
        "fgetxattr" | "fsetxattr" => spec(Some(0), Some(3), None, false),
        "mmap" => spec(Some(4), Some(1), Some(3), false),
        "msync" => spec(None, Some(1), Some(2), false),
        "munmap" => spec(None, Some(1), None, false),
        "close" => ArgSpec {
            consumes_fd: true,
            ..spec(Some(0), None, None, false)
        },
        "accept" => ArgSpec {
            ret_fd: true,
            ..spec(Some(0), None, None, false)
        },
        "accept4" => ArgSpec {
            ret_fd: true,
            ..spec(Some(0), None, Some(3), false)
        },
        "open" => ArgSpec {
            ret_fd: true,
            ..spec(None, None, Some(1), false)
        },
        "openat" => ArgSpec {
            ret_fd: true,
            ..spec(None, None, Some(2), false)
        },
        "creat" | "openat2" | "open_by_handle_at" => ArgSpec {
            ret_fd: true,
            ..ArgSpec::default()
        },
        "renameat2" => spec(None, None, Some(4), false),
        "unlinkat" => spec(None, None, Some(2), false),
        _ => ArgSpec::default(),
    }
}

/// A raw argument as a file descriptor (C `int`), if it is one.
pub(crate) fn as_fd(raw: u64) -> Option<i32> {
    let fd = raw as u32 as i32;
    (fd >= 0).then_some(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_family() {
        let r = spec_of("read");
        assert_eq!((r.fd, r.size, r.ret_bytes), (Some(0), Some(2), true));
        assert_eq!(spec_of("pwritev2").flags, Some(5));
        assert!(spec_of("openat").ret_fd && spec_of("openat").fd.is_none());
        assert!(spec_of("close").consumes_fd);
        assert_eq!(spec_of("not_a_syscall"), ArgSpec::default());
    }

    #[test]
    fn every_named_syscall_exists_somewhere() {
        for name in [
            "read",
            "pwritev2",
            "recvmmsg",
            "sendfile",
            "splice",
            "tee",
            "vmsplice",
            "fsync",
            "syncfs",
            "sync_file_range",
            "fallocate",
            "ftruncate",
            "readahead",
            "fadvise64",
            "flock",
            "fgetxattr",
            "mmap",
            "msync",
            "close",
            "accept4",
            "openat",
            "openat2",
            "renameat2",
            "unlinkat",
            "getdents64",
        ] {
            assert!(crate::syscall_table::is_known_anywhere(name), "{name}");
        }
    }

    #[test]
    fn fds_are_c_ints() {
        assert_eq!(as_fd(3), Some(3));
        assert_eq!(as_fd(u64::MAX), None, "-1 is not a descriptor");
        // AT_FDCWD (-100) sign-extended in a 64-bit register.
        assert_eq!(as_fd((-100i64) as u64), None);
        assert_eq!(
            as_fd(0xffff_ffff_0000_0004),
            Some(4),
            "upper half is ignored"
        );
    }
}
