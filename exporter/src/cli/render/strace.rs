//! How one traced call reads: its arguments (as many as the syscall takes, the path argument
//! quoted), its return value and errno, in the style of `strace -f -T`.

use sysscope_abi::{trace_flags, TraceEvent};

use crate::kernel::trace::path_arg;
use crate::{metadata::processes::comm_from_bytes, syscall_table};

/// Argument counts of common syscalls; others show all six registers.
const ARITY: &[(&str, usize)] = &[
    ("read", 3),
    ("write", 3),
    ("open", 3),
    ("close", 1),
    ("stat", 2),
    ("fstat", 2),
    ("lstat", 2),
    ("poll", 3),
    ("lseek", 3),
    ("mmap", 6),
    ("mprotect", 3),
    ("munmap", 2),
    ("brk", 1),
    ("rt_sigaction", 4),
    ("rt_sigprocmask", 4),
    ("rt_sigreturn", 0),
    ("ioctl", 3),
    ("pread64", 4),
    ("pwrite64", 4),
    ("readv", 3),
    ("writev", 3),
    ("access", 2),
    ("pipe", 1),
    ("pipe2", 2),
    ("select", 5),
    ("sched_yield", 0),
    ("mremap", 5),
    ("madvise", 3),
    ("dup", 1),
    ("dup2", 2),
    ("dup3", 3),
    ("pause", 0),
    ("nanosleep", 2),
    ("getpid", 0),
    ("getppid", 0),
    ("gettid", 0),
    ("getuid", 0),
    ("geteuid", 0),
    ("getgid", 0),
    ("getegid", 0),
    ("socket", 3),
    ("connect", 3),
    ("accept", 3),
    ("accept4", 4),
    ("sendto", 6),
    ("recvfrom", 6),
    ("sendmsg", 3),
    ("recvmsg", 3),
    ("shutdown", 2),
    ("bind", 3),
    ("listen", 2),
    ("clone", 5),
    ("clone3", 2),
    ("fork", 0),
    ("vfork", 0),
    ("execve", 3),
    ("exit", 1),
    ("exit_group", 1),
    ("wait4", 4),
    ("kill", 2),
    ("tgkill", 3),
    ("uname", 1),
    ("fcntl", 3),
    ("flock", 2),
    ("fsync", 1),
    ("fdatasync", 1),
    ("truncate", 2),
    ("ftruncate", 2),
    ("getdents64", 3),
    ("getcwd", 2),
    ("chdir", 1),
    ("rename", 2),
    ("mkdir", 2),
    ("rmdir", 1),
    ("unlink", 1),
    ("readlink", 3),
    ("futex", 6),
    ("epoll_wait", 4),
    ("epoll_pwait", 6),
    ("epoll_ctl", 4),
    ("epoll_create1", 1),
    ("openat", 4),
    ("mkdirat", 3),
    ("newfstatat", 4),
    ("unlinkat", 3),
    ("renameat2", 5),
    ("readlinkat", 4),
    ("faccessat", 3),
    ("faccessat2", 4),
    ("statx", 5),
    ("ppoll", 5),
    ("pselect6", 6),
    ("clock_gettime", 2),
    ("clock_nanosleep", 4),
    ("getrandom", 3),
    ("sigaltstack", 2),
    ("arch_prctl", 2),
    ("prctl", 5),
    ("set_tid_address", 1),
    ("set_robust_list", 2),
    ("rseq", 4),
    ("prlimit64", 4),
    ("sched_getaffinity", 3),
    ("eventfd2", 2),
    ("io_uring_enter", 6),
    ("sendfile", 4),
    ("splice", 6),
    ("sync", 0),
];

/// How many arguments syscall `nr` takes (6 when unknown).
pub(crate) fn arity(nr: u32) -> usize {
    syscall_table::name(nr)
        .and_then(|n| ARITY.iter().find(|(name, _)| *name == n))
        .map(|(_, k)| *k)
        .unwrap_or(6)
}

/// One register as strace would roughly show it: small and negative numbers in decimal
/// (`-100` is `AT_FDCWD`), everything else (pointers, flags) in hex.
pub(crate) fn format_register(v: u64) -> String {
    let signed = v as i64;
    if (-4096..=65535).contains(&signed) {
        return signed.to_string();
    }
    // An int argument the caller did not sign-extend.
    if v >> 32 == 0 && (v as u32 as i32) < 0 && (v as u32 as i32) >= -4096 {
        return (v as u32 as i32).to_string();
    }
    format!("{v:#x}")
}

/// The path argument of a record, when the probe copied it.
pub(crate) fn path_of(e: &TraceEvent) -> Option<String> {
    if e.flags & trace_flags::PATH == 0 {
        return None;
    }
    let end = e.path.iter().position(|&b| b == 0).unwrap_or(e.path.len());
    Some(String::from_utf8_lossy(&e.path[..end]).into_owned())
}

/// `"/etc/passwd"` with quotes and escapes, as a C string literal.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The arguments of a record, comma-separated, with the path argument quoted.
pub(crate) fn format_args(e: &TraceEvent) -> String {
    let n = arity(e.nr);
    let path = path_of(e);
    let path_index = path_arg(e.nr);
    (0..n)
        .map(|i| match (&path, path_index) {
            (Some(p), Some(pi)) if pi == i => quote(p),
            _ => format_register(e.args[i]),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The errno of a failed call (`ret` in -4095..=-1).
pub(crate) fn errno_of(ret: i64) -> Option<u16> {
    (-4095..=-1).contains(&ret).then_some((-ret) as u16)
}

/// strerror(errno) without Rust's " (os error N)" suffix.
pub(crate) fn errno_message(errno: u16) -> String {
    let s = std::io::Error::from_raw_os_error(errno as i32).to_string();
    match s.rfind(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// The name of a record's syscall.
pub(crate) fn name_of(e: &TraceEvent) -> String {
    syscall_table::label(e.nr).into_owned()
}

/// A record as one `strace -f -T -ttt`-like line: `tid  seconds name(args) = ret <dur>`,
/// with `seconds` relative to `base_ns`.
pub(crate) fn strace_line(e: &TraceEvent, base_ns: u64) -> String {
    let ts = e.call.start_ns.saturating_sub(base_ns) as f64 / 1e9;
    let call = format!("{}({})", name_of(e), format_args(e));
    let result = if e.flags & trace_flags::NO_RETURN != 0 {
        "= ?".to_string()
    } else if let Some(errno) = errno_of(e.ret) {
        format!(
            "= -1 {} ({}) <{:.6}>",
            syscall_table::errno_label(errno),
            errno_message(errno),
            e.call.end_ns.saturating_sub(e.call.start_ns) as f64 / 1e9
        )
    } else {
        format!(
            "= {} <{:.6}>",
            format_return(e.nr, e.ret),
            e.call.end_ns.saturating_sub(e.call.start_ns) as f64 / 1e9
        )
    };
    format!("{:<7} {ts:>12.6} {call} {result}", e.call.tid)
}

/// Return values that are addresses (`mmap`, `brk`) in hex, others in decimal.
pub(crate) fn format_return(nr: u32, ret: i64) -> String {
    match syscall_table::name(nr) {
        Some("mmap" | "brk" | "mremap" | "shmat") => format!("{ret:#x}"),
        _ => ret.to_string(),
    }
}

/// The thread's comm in a record.
pub(crate) fn comm_of(e: &TraceEvent) -> String {
    comm_from_bytes(&e.comm).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sysscope_abi::CallStamp;

    fn event(name: &str, args: [u64; 6], ret: i64, path: Option<&str>) -> TraceEvent {
        let mut e = TraceEvent {
            nr: syscall_table::number(name).unwrap(),
            args,
            ret,
            call: CallStamp {
                start_ns: 2_000_000_000,
                end_ns: 2_000_017_000,
                tid: 42,
                tgid: 42,
                ..CallStamp::default()
            },
            ..TraceEvent::default()
        };
        if let Some(p) = path {
            e.path[..p.len()].copy_from_slice(p.as_bytes());
            e.flags |= trace_flags::PATH;
        }
        e
    }

    #[test]
    fn registers_read_like_strace() {
        assert_eq!(format_register(3), "3");
        assert_eq!(format_register((-100i64) as u64), "-100");
        assert_eq!(format_register(0xffff_ff9c), "-100");
        assert_eq!(format_register(0x7ffd_1234_5678), "0x7ffd12345678");
    }

    #[test]
    fn lines_show_paths_errors_and_durations() {
        let e = event(
            "openat",
            [(-100i64) as u64, 0x7ff0_0000_0000, 0, 0, 9, 9],
            -2,
            Some("/etc/x"),
        );
        assert_eq!(format_args(&e), "-100, \"/etc/x\", 0, 0");
        let line = strace_line(&e, 1_000_000_000);
        assert!(line.starts_with("42"), "{line}");
        assert!(
            line.contains("1.000000 openat(-100, \"/etc/x\", 0, 0)"),
            "{line}"
        );
        assert!(
            line.ends_with("= -1 ENOENT (No such file or directory) <0.000017>"),
            "{line}"
        );
        let ok = event("getppid", [0; 6], 7, None);
        assert!(strace_line(&ok, 0).ends_with("getppid() = 7 <0.000017>"));
        assert_eq!(quote("a\"b\n"), "\"a\\\"b\\n\"");
    }
}
