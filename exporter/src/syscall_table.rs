//! Syscall numbers and errno values to names, for the architecture sysscope runs on
//! (x86_64 and aarch64 tables from the `syscalls` crate), and for its 32-bit compat table
//! (i386 on x86_64, AArch32 on arm64), whose calls the probes count at
//! [`sysscope_abi::COMPAT_BASE`] + n.

#[cfg(target_arch = "aarch64")]
use syscalls::aarch64::Sysno;
#[cfg(target_arch = "aarch64")]
use syscalls::arm::Sysno as CompatSysno;
#[cfg(not(target_arch = "aarch64"))]
use syscalls::x86::Sysno as CompatSysno;
#[cfg(not(target_arch = "aarch64"))]
use syscalls::x86_64::Sysno;

use sysscope_abi::{is_compat_nr, COMPAT_BASE};

/// The name of syscall `nr` on this architecture (`None` for unassigned numbers).
pub fn name(nr: u32) -> Option<&'static str> {
    Sysno::new(nr as usize).map(|s| s.name())
}

/// The name of a counted compat number (`COMPAT_BASE + n`): call `n` of the compat table
/// (`None` for unassigned numbers and for numbers that are not compat ones).
pub fn compat_name(nr: u32) -> Option<&'static str> {
    if !is_compat_nr(nr) {
        return None;
    }
    CompatSysno::new((nr - COMPAT_BASE) as usize).map(|s| s.name())
}

/// The number a counted syscall number is exported under: a compat call whose name this
/// architecture has natively (i386 `getppid`, x86_64 `getppid`) is the native call, so a
/// 32-bit process's calls join the same series as a 64-bit one's; a compat call with no
/// native namesake (`socketcall`, `_llseek`) keeps its compat number, and is named from the
/// compat table by [`label`].
pub(crate) fn canonical(nr: u32) -> u32 {
    compat_name(nr).and_then(number).unwrap_or(nr)
}

/// The number of a syscall by name on this architecture.
pub fn number(name: &str) -> Option<u32> {
    name.parse::<Sysno>().ok().map(|s| s.id() as u32)
}

/// Whether `name` is a syscall on any architecture sysscope supports. Config lists (such as
/// the default slow-call exclusions) may name syscalls that only some architectures have.
pub(crate) fn is_known_anywhere(name: &str) -> bool {
    name.parse::<syscalls::x86_64::Sysno>().is_ok()
        || name.parse::<syscalls::aarch64::Sysno>().is_ok()
}

/// Label value for a syscall number: its name, `syscall_<nr>` for numbers the table lacks (a
/// newer kernel than the table), so nothing is ever dropped for want of a name, or `invalid`
/// for the one number the probes count every out-of-range number as
/// ([`sysscope_abi::INVALID_NR`]), so the label has at most `MAX_SYSCALL_NR` values.
pub(crate) fn label(nr: u32) -> std::borrow::Cow<'static, str> {
    if nr == FOLDED_NR {
        return FOLDED.into();
    }
    if nr >= sysscope_abi::INVALID_NR {
        return INVALID.into();
    }
    if is_compat_nr(nr) {
        return match compat_name(nr) {
            Some(n) => n.into(),
            None => format!("compat_syscall_{}", nr - COMPAT_BASE).into(),
        };
    }
    match name(nr) {
        Some(n) => n.into(),
        None => format!("syscall_{nr}").into(),
    }
}

/// The label of out-of-range syscall numbers.
pub(crate) const INVALID: &str = "invalid";

/// The number label control counts every syscall it does not export by name as
/// (`labels.syscalls`, `labels.syscall_families`): labelled `other`.
pub(crate) const FOLDED_NR: u32 = u32::MAX;

/// The label of [`FOLDED_NR`].
pub(crate) const FOLDED: &str = "other";

/// Syscall families by name, as the recording rules of deploy/prometheus group syscalls (a
/// unit test holds the two together); names of other architectures (including 32-bit ones,
/// such as `fstatat64`) are listed too, and number nothing here.
/// The rules also count reads and writes of sockets as `net`: that split is by descriptor,
/// not by syscall, and is theirs alone.
pub(crate) const FAMILIES: &[(&str, &[&str])] = &[
    ("read", &["read", "readv", "pread64", "preadv", "preadv2"]),
    (
        "write",
        &["write", "writev", "pwrite64", "pwritev", "pwritev2"],
    ),
    (
        "metadata",
        &[
            "open",
            "openat",
            "openat2",
            "creat",
            "close",
            "close_range",
            "stat",
            "lstat",
            "fstat",
            "newfstatat",
            "fstatat64",
            "statx",
            "statfs",
            "fstatfs",
            "access",
            "faccessat",
            "faccessat2",
            "getdents",
            "getdents64",
            "readlink",
            "readlinkat",
            "lseek",
            "getcwd",
            "chdir",
            "fchdir",
            "mkdir",
            "mkdirat",
            "rmdir",
            "unlink",
            "unlinkat",
            "rename",
            "renameat",
            "renameat2",
            "link",
            "linkat",
            "symlink",
            "symlinkat",
            "chmod",
            "fchmod",
            "fchmodat",
            "chown",
            "fchown",
            "lchown",
            "fchownat",
            "truncate",
            "ftruncate",
            "utime",
            "utimes",
            "utimensat",
            "getxattr",
            "lgetxattr",
            "fgetxattr",
            "listxattr",
            "llistxattr",
            "flistxattr",
            "setxattr",
            "lsetxattr",
            "fsetxattr",
            "removexattr",
            "lremovexattr",
            "fremovexattr",
            "dup",
            "dup2",
            "dup3",
            "fcntl",
            "inotify_add_watch",
            "name_to_handle_at",
            "open_by_handle_at",
        ],
    ),
    (
        "sync",
        &[
            "fsync",
            "fdatasync",
            "sync",
            "syncfs",
            "sync_file_range",
            "msync",
        ],
    ),
    ("lock", &["futex", "futex_waitv", "flock"]),
    (
        "wait",
        &[
            "poll",
            "ppoll",
            "select",
            "pselect6",
            "epoll_wait",
            "epoll_pwait",
            "epoll_pwait2",
            "nanosleep",
            "clock_nanosleep",
            "wait4",
            "waitid",
            "pause",
            "accept",
            "accept4",
            "rt_sigsuspend",
            "rt_sigtimedwait",
        ],
    ),
    (
        "mmap",
        &[
            "mmap",
            "munmap",
            "mprotect",
            "pkey_mprotect",
            "brk",
            "madvise",
            "mremap",
            "mlock",
            "mlock2",
            "munlock",
            "mincore",
        ],
    ),
    (
        "net",
        &[
            "socket",
            "socketpair",
            "connect",
            "bind",
            "listen",
            "shutdown",
            "recvfrom",
            "recvmsg",
            "recvmmsg",
            "sendto",
            "sendmsg",
            "sendmmsg",
            "getsockopt",
            "setsockopt",
            "getsockname",
            "getpeername",
        ],
    ),
];

/// The syscalls of family `name`.
pub(crate) fn family(name: &str) -> Option<&'static [&'static str]> {
    FAMILIES.iter().find(|(f, _)| *f == name).map(|(_, s)| *s)
}

/// Symbolic name of a positive errno value (`ENOENT`), or `E<n>` when unknown.
pub(crate) fn errno_label(errno: u16) -> std::borrow::Cow<'static, str> {
    match syscalls::Errno::new(errno as i32).name() {
        Some(n) => n.into(),
        None => format!("E{errno}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn x86_64_numbers() {
        assert_eq!(name(0), Some("read"));
        assert_eq!(name(110), Some("getppid"));
        assert_eq!(number("openat"), Some(257));
        assert_eq!(
            number("exit_group"),
            Some(sysscope_abi::noreturn::EXIT_GROUP)
        );
        assert_eq!(number("exit"), Some(sysscope_abi::noreturn::EXIT));
    }

    /// The numbers the probes treat apart at an exit (`sysscope_abi::special`) are this
    /// architecture's: a new task's first return, and the calls that return a restored register.
    #[test]
    fn special_numbers_are_the_tables() {
        use sysscope_abi::special;
        for (name, nr) in [
            ("clone", special::CLONE),
            ("clone3", special::CLONE3),
            ("rt_sigreturn", special::RT_SIGRETURN),
            ("restart_syscall", special::RESTART_SYSCALL),
        ] {
            assert_eq!(number(name), Some(nr), "{name}");
        }
        // arm64 has no fork or vfork: its constants stand for clone there.
        for name in ["fork", "vfork"] {
            let nr = number(name).unwrap_or(special::CLONE);
            assert!(special::starts_task(nr), "{name}");
        }
        for name in ["clone", "clone3"] {
            assert!(special::starts_task(number(name).unwrap()), "{name}");
        }
        for name in ["rt_sigreturn", "restart_syscall"] {
            assert!(special::returns_restored_register(number(name).unwrap()));
        }
        for name in ["getppid", "read", "execve", "exit_group", "pause"] {
            let nr = number(name).unwrap();
            assert!(!special::starts_task(nr) && !special::returns_restored_register(nr));
        }
    }

    /// The arm64 numbers (the generic table) differ from x86_64's; checked on every host so an
    /// x86_64 build cannot hide a wrong arm64 table. The exit numbers are the ones the probes
    /// count at entry on arm64 (`sysscope_abi::noreturn`).
    #[test]
    fn aarch64_numbers() {
        use syscalls::aarch64::Sysno as A;
        let n = |s: &str| s.parse::<A>().ok().map(|s| s.id() as u32);
        assert_eq!(n("read"), Some(63));
        assert_eq!(n("getppid"), Some(173));
        assert_eq!(n("openat"), Some(56));
        assert_eq!(n("exit"), Some(93));
        assert_eq!(n("exit_group"), Some(94));
        // `sysscope_abi::special` on arm64.
        assert_eq!(n("clone"), Some(220));
        assert_eq!(n("clone3"), Some(435));
        assert_eq!(n("rt_sigreturn"), Some(139));
        assert_eq!(n("restart_syscall"), Some(128));
        // No open(2) on arm64: only openat.
        assert_eq!(n("open"), None);
        #[cfg(target_arch = "aarch64")]
        assert_eq!(number("getppid"), Some(173));
    }

    #[test]
    fn round_trip_every_name() {
        for nr in 0..sysscope_abi::MAX_SYSCALL_NR {
            if let Some(n) = name(nr) {
                assert_eq!(number(n), Some(nr), "{n}");
            }
        }
        assert!(number("not_a_syscall").is_none());
        assert!(is_known_anywhere("epoll_wait") && is_known_anywhere("epoll_pwait"));
        assert!(!is_known_anywhere("not_a_syscall"));
    }

    #[test]
    fn unknown_numbers_still_label() {
        assert_eq!(label(500), "syscall_500");
        assert_eq!(label(sysscope_abi::INVALID_NR), "invalid");
        assert_eq!(label(9999), "invalid");
    }

    /// A compat call is named from the compat table and counted under its native namesake;
    /// the numbers the probes special-case name the calls they mean, in both compat tables.
    #[test]
    fn compat_numbers() {
        use sysscope_abi::{fd_class, noreturn, special::compat};
        let c = |n: u32| COMPAT_BASE + n;
        // i386 and AArch32 getppid are both 64: x86_64 semget, aarch64 getppid is 173.
        assert_eq!(compat_name(c(64)), Some("getppid"));
        assert_eq!(canonical(c(64)), number("getppid").unwrap());
        assert_eq!(label(canonical(c(64))), "getppid");
        // No native namesake: its own number and compat name.
        assert_eq!(canonical(c(140)), c(140));
        assert_eq!(label(c(140)), "_llseek");
        assert_eq!(canonical(64), 64);
        assert_eq!(label(c(500)), "compat_syscall_500");
        assert_eq!(compat_name(64), None);
        assert!(sysscope_abi::bounded_compat_nr(u64::MAX) == sysscope_abi::INVALID_NR);
        assert_eq!(sysscope_abi::bounded_compat_nr(64), c(64));
        assert_eq!(sysscope_abi::bounded_nr(64), 64);
        assert_eq!(
            sysscope_abi::bounded_nr(COMPAT_BASE as u64),
            sysscope_abi::INVALID_NR
        );
        let both = |nr: u32, want: &str| {
            let n = (nr - COMPAT_BASE) as usize;
            assert_eq!(syscalls::x86::Sysno::new(n).map(|s| s.name()), Some(want));
            assert_eq!(syscalls::arm::Sysno::new(n).map(|s| s.name()), Some(want));
        };
        both(noreturn::COMPAT_EXIT, "exit");
        both(compat::FORK, "fork");
        both(compat::VFORK, "vfork");
        both(compat::CLONE, "clone");
        both(compat::CLONE3, "clone3");
        both(compat::SIGRETURN, "sigreturn");
        both(compat::RT_SIGRETURN, "rt_sigreturn");
        both(compat::RESTART_SYSCALL, "restart_syscall");
        assert_eq!(compat_name(noreturn::COMPAT_EXIT_GROUP), Some("exit_group"));
        both(compat::EXECVE, "execve");
        assert_eq!(compat_name(compat::EXECVEAT), Some("execveat"));
        assert_eq!(name(sysscope_abi::special::EXECVE), Some("execve"));
        assert_eq!(name(sysscope_abi::special::EXECVEAT), Some("execveat"));
        assert!(noreturn::is_noreturn(noreturn::COMPAT_EXIT_GROUP));
        // The classified compat calls are the native classified calls' namesakes, and no
        // other compat number is classified.
        for nr in COMPAT_BASE..sysscope_abi::INVALID_NR {
            let native = compat_name(nr).and_then(number);
            let want = native.is_some_and(fd_class::classified);
            assert_eq!(fd_class::classified(nr), want, "{:?}", compat_name(nr));
        }
    }

    #[test]
    fn folded_syscalls_are_other() {
        assert_eq!(label(FOLDED_NR), "other");
    }

    /// The families are the recording rules' (`label_replace(..., "family", NAME, "syscall",
    /// REGEX)`), name for name.
    #[test]
    fn families_are_the_recording_rules() {
        let rules = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/prometheus/sysscope-rules.yml"),
        )
        .unwrap();
        let mut in_rules = std::collections::BTreeMap::new();
        for line in rules.lines() {
            let Some(rest) = line.trim().strip_prefix("\"family\", \"") else {
                continue;
            };
            let Some((family, rest)) = rest.split_once('"') else {
                continue;
            };
            let Some(regex) = rest.strip_prefix(", \"syscall\", \"") else {
                continue;
            };
            let regex = regex.split('"').next().unwrap();
            let mut names: Vec<&str> = regex.split('|').collect();
            names.sort_unstable();
            in_rules.insert(family.to_string(), names);
        }
        let mut in_table = std::collections::BTreeMap::new();
        for (family, names) in FAMILIES {
            let mut names = names.to_vec();
            names.sort_unstable();
            in_table.insert(family.to_string(), names);
        }
        assert_eq!(in_table, in_rules);
        assert!(family("sync").unwrap().contains(&"fdatasync"));
        assert!(family("other").is_none());
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_label(2), "ENOENT");
        assert_eq!(errno_label(13), "EACCES");
        assert_eq!(errno_label(11), "EAGAIN");
        assert_eq!(errno_label(4000), "E4000");
        // The kernel's restart codes keep their kernel names (docs/metrics.md).
        assert_eq!(errno_label(512), "ERESTARTSYS");
        assert_eq!(errno_label(514), "ERESTARTNOHAND");
        assert_eq!(errno_label(516), "ERESTART_RESTARTBLOCK");
    }
}
