//! Syscall numbers and errno values to names, for the architecture sysscope runs on
//! (x86_64 and aarch64 tables from the `syscalls` crate).

#[cfg(target_arch = "aarch64")]
use syscalls::aarch64::Sysno;
#[cfg(not(target_arch = "aarch64"))]
use syscalls::x86_64::Sysno;

/// The name of syscall `nr` on this architecture (`None` for unassigned numbers).
pub fn name(nr: u32) -> Option<&'static str> {
    Sysno::new(nr as usize).map(|s| s.name())
}

/// The number of a syscall by name on this architecture.
pub(crate) fn number(name: &str) -> Option<u32> {
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
    if nr >= sysscope_abi::INVALID_NR {
        return INVALID.into();
    }
    match name(nr) {
        Some(n) => n.into(),
        None => format!("syscall_{nr}").into(),
    }
}

/// The label of out-of-range syscall numbers.
pub(crate) const INVALID: &str = "invalid";

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

    #[test]
    fn errno_names() {
        assert_eq!(errno_label(2), "ENOENT");
        assert_eq!(errno_label(13), "EACCES");
        assert_eq!(errno_label(11), "EAGAIN");
        assert_eq!(errno_label(4000), "E4000");
    }
}
