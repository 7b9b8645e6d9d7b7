//! What the arguments of a syscall mean, for the span attributes: which argument is a file
//! descriptor (from the kernel layer's table, `kernel::fd_class::descriptor_of`), which a byte
//! count or flags, and whether the return value counts bytes or is a new descriptor. Keyed by
//! syscall name, so one table serves every architecture.

use crate::kernel::fd_class::{descriptor_of, Descriptor};

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

const fn spec(size: Option<usize>, flags: Option<usize>, ret_bytes: bool) -> ArgSpec {
    ArgSpec {
        fd: None,
        size,
        flags,
        ret_bytes,
        ret_fd: false,
        consumes_fd: false,
    }
}

/// Argument roles by syscall name, but for the descriptor (the kernel layer's table).
const SPECS: &[(&[&str], ArgSpec)] = &[
    (
        &[
            "read",
            "write",
            "pread64",
            "pwrite64",
            "getdents",
            "getdents64",
        ],
        spec(Some(2), None, true),
    ),
    (
        &["readv", "writev", "preadv", "pwritev"],
        spec(None, None, true),
    ),
    // preadv2(fd, iov, iovcnt, pos_l, pos_h, flags)
    (&["preadv2", "pwritev2"], spec(None, Some(5), true)),
    (&["recvfrom", "sendto"], spec(Some(2), Some(3), true)),
    (&["recvmsg", "sendmsg"], spec(None, Some(2), true)),
    (&["recvmmsg", "sendmmsg"], spec(None, Some(3), false)),
    (&["sendfile"], spec(Some(3), None, true)),
    (&["splice", "copy_file_range"], spec(Some(4), Some(5), true)),
    (&["tee", "vmsplice"], spec(Some(2), Some(3), true)),
    (&["sync_file_range"], spec(Some(2), Some(3), false)),
    (&["fallocate"], spec(Some(3), Some(1), false)),
    (&["ftruncate"], spec(Some(1), None, false)),
    (&["readahead", "fadvise64"], spec(Some(2), None, false)),
    (&["flock"], spec(None, Some(1), false)),
    (&["fgetxattr", "fsetxattr"], spec(Some(3), None, false)),
    (&["mmap"], spec(Some(1), Some(3), false)),
    (&["msync"], spec(Some(1), Some(2), false)),
    (&["munmap"], spec(Some(1), None, false)),
    (&["accept4"], spec(None, Some(3), false)),
    (&["open"], spec(None, Some(1), false)),
    (&["openat"], spec(None, Some(2), false)),
    (&["renameat2"], spec(None, Some(4), false)),
    (&["unlinkat"], spec(None, Some(2), false)),
];

/// The argument roles of syscall `name`; unknown syscalls have none. Which descriptor a call
/// names is the kernel layer's table (the probe reads that descriptor's file at the call's
/// exit): both sides name the same one.
pub(crate) fn spec_of(name: &str) -> ArgSpec {
    let mut spec = SPECS
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map_or(ArgSpec::default(), |(_, spec)| *spec);
    match descriptor_of(name) {
        Some(Descriptor::Arg(i)) => spec.fd = Some(usize::from(i)),
        Some(Descriptor::Returned) => spec.ret_fd = true,
        Some(Descriptor::Closed(i)) => {
            spec.fd = Some(usize::from(i));
            spec.consumes_fd = true;
        }
        None => {}
    }
    spec
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
        for name in SPECS.iter().flat_map(|(names, _)| names.iter()) {
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
