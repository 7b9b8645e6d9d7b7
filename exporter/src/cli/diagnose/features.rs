//! What `diagnose` measures of a target: its syscall profile (exact counts from the maps) and,
//! from the streamed calls, what counts cannot tell (bytes per transfer, threads, lock
//! addresses, repeated paths, fsync right after write); the syscall groups the rules use.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use sysscope_abi::{trace_flags, TraceEvent};

use crate::cli::{
    measure::CpuUsage,
    profile::Profile,
    progress::thousands,
    render::{strace as format, units::secs},
    sink::EventSink,
};
use crate::{metadata::cpu_bandwidth::CpuBandwidth, syscall_table};

// ---- Syscall groups ----

pub(super) const FUTEX: &[&str] = &["futex", "futex_waitv"];
pub(super) const OPEN: &[&str] = &["open", "openat", "openat2", "creat"];
pub(super) const STAT: &[&str] = &[
    "stat",
    "lstat",
    "fstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "readlink",
    "readlinkat",
];
pub(super) const CLOSE: &[&str] = &["close", "close_range"];
pub(super) const READ: &[&str] = &["read", "pread64", "readv", "preadv", "preadv2"];
pub(super) const WRITE: &[&str] = &["write", "pwrite64", "writev", "pwritev", "pwritev2"];
pub(super) const RECV: &[&str] = &["recvfrom", "recvmsg", "recvmmsg"];
pub(super) const SEND: &[&str] = &["sendto", "sendmsg", "sendmmsg"];
pub(super) const MMAP: &[&str] = &["mmap", "mprotect", "munmap", "mremap", "brk"];
pub(super) const POLL: &[&str] = &[
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "poll",
    "ppoll",
    "select",
    "pselect6",
];
pub(super) const SLEEP: &[&str] = &["nanosleep", "clock_nanosleep"];
pub(super) const SYNC: &[&str] = &["fsync", "fdatasync", "sync_file_range", "syncfs", "sync"];
pub(super) const UNLINK: &[&str] = &["unlink", "unlinkat"];
/// Parents waiting for children: left out of the shares (the children's own calls count).
pub(super) const WAIT_CHILD: &[&str] = &["wait4", "waitid"];

pub(super) fn in_group(group: &[&str], nr: u32) -> bool {
    syscall_table::name(nr).is_some_and(|n| group.contains(&n))
}

// ---- What the per-call stream adds ----

/// Distinct keys kept per table; beyond, calls are only counted.
pub(super) const MAX_DISTINCT: usize = 10_000;

/// Per-call facts the counters cannot give, aggregated as records arrive (bounded memory).
#[derive(Debug, Default, Clone)]
pub(crate) struct Features {
    pub events: u64,
    pub threads: HashSet<u32>,
    /// Successful transfers and their bytes, per syscall number.
    pub bytes: HashMap<u32, (u64, u64)>,
    /// fsync/fdatasync calls whose thread's previous call was a write to the same fd.
    pub(crate) fsync_after_write: u64,
    pub(crate) fsyncs: u64,
    /// How often each path was opened / looked up (stat family), and failed opens' paths.
    pub(crate) open_paths: HashMap<String, u64>,
    pub(crate) lookup_paths: HashMap<String, u64>,
    pub(crate) failed_paths: HashMap<String, u64>,
    /// Distinct futex words waited on.
    pub(crate) futex_addresses: HashSet<u64>,
    pub(crate) futex_waits: u64,
    last_call: HashMap<u32, (u32, u64)>,
}

pub(super) fn bump(map: &mut HashMap<String, u64>, key: String) {
    if let Some(n) = map.get_mut(&key) {
        *n += 1;
    } else if map.len() < MAX_DISTINCT {
        map.insert(key, 1);
    }
}

impl Features {
    /// Bytes and successful calls of a group.
    pub(super) fn transfer(&self, group: &[&str]) -> (u64, u64) {
        self.bytes
            .iter()
            .filter(|(nr, _)| in_group(group, **nr))
            .fold((0, 0), |(c, b), (_, (c2, b2))| (c + c2, b + b2))
    }

    pub(super) fn top(map: &HashMap<String, u64>) -> Option<(&str, u64)> {
        map.iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(k, v)| (k.as_str(), *v))
    }
}

/// FUTEX_WAIT / FUTEX_WAIT_BITSET / FUTEX_LOCK_PI (the op, without the private flag).
pub(super) fn futex_waits(op: u64) -> bool {
    matches!(op & 0x7f, 0 | 9 | 6)
}

impl EventSink for Features {
    fn event(&mut self, e: &TraceEvent) {
        self.events += 1;
        if self.threads.len() < MAX_DISTINCT {
            self.threads.insert(e.call.tid);
        }
        let nr = e.nr;
        let ok = e.flags & trace_flags::NO_RETURN == 0 && e.ret >= 0;
        if ok
            && (in_group(READ, nr)
                || in_group(WRITE, nr)
                || in_group(RECV, nr)
                || in_group(SEND, nr))
        {
            let slot = self.bytes.entry(nr).or_default();
            slot.0 += 1;
            slot.1 += e.ret as u64;
        }
        if in_group(SYNC, nr) {
            self.fsyncs += 1;
            if let Some((prev, fd)) = self.last_call.get(&e.call.tid) {
                if in_group(WRITE, *prev) && *fd == e.args[0] {
                    self.fsync_after_write += 1;
                }
            }
        }
        if in_group(FUTEX, nr) && futex_waits(e.args[1]) {
            self.futex_waits += 1;
            if self.futex_addresses.len() < MAX_DISTINCT {
                self.futex_addresses.insert(e.args[0]);
            }
        }
        if let Some(path) = format::path_of(e) {
            if in_group(OPEN, nr) {
                if ok {
                    bump(&mut self.open_paths, path);
                } else {
                    bump(&mut self.failed_paths, path);
                }
            } else if in_group(STAT, nr) && !path.is_empty() {
                bump(&mut self.lookup_paths, path);
            }
        }
        if self.last_call.len() < MAX_DISTINCT || self.last_call.contains_key(&e.call.tid) {
            self.last_call.insert(e.call.tid, (nr, e.args[0]));
        }
    }
}

// ---- Verdicts ----

/// What the rules look at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    pub(crate) profile: &'a Profile,
    pub features: Option<&'a Features>,
    pub wall: Duration,
    pub cpu: Option<CpuUsage>,
    /// The target cgroup's CPU quota throttling during the run, when it has a quota.
    pub(crate) throttling: Option<CpuBandwidth>,
}

impl Context<'_> {
    pub(super) fn sum(
        &self,
        group: &[&str],
        f: impl Fn(&crate::cli::profile::SyscallRow) -> u64,
    ) -> u64 {
        self.profile
            .rows
            .values()
            .filter(|r| group.contains(&r.name.as_str()))
            .map(f)
            .sum()
    }

    pub(crate) fn time_ns(&self, group: &[&str]) -> u64 {
        self.sum(group, |r| r.total_ns)
    }

    pub(super) fn calls(&self, group: &[&str]) -> u64 {
        self.sum(group, |r| r.calls)
    }

    pub(super) fn errors(&self, group: &[&str]) -> u64 {
        self.sum(group, |r| r.errors)
    }

    /// Syscall time the shares are relative to: everything but parents waiting on children.
    pub(crate) fn active_ns(&self) -> u64 {
        self.profile
            .total_ns()
            .saturating_sub(self.time_ns(WAIT_CHILD))
    }

    pub(super) fn share(&self, group: &[&str]) -> f64 {
        let active = self.active_ns();
        if active == 0 {
            0.0
        } else {
            self.time_ns(group) as f64 / active as f64
        }
    }

    pub(super) fn avg_ns(&self, group: &[&str]) -> f64 {
        let c = self.calls(group);
        if c == 0 {
            0.0
        } else {
            self.time_ns(group) as f64 / c as f64
        }
    }

    /// "openat 1.2 s in 3,456 calls (347 µs/call)" for each syscall of the group seen.
    pub(super) fn describe(&self, group: &[&str]) -> Vec<String> {
        let mut rows: Vec<_> = self
            .profile
            .rows
            .values()
            .filter(|r| group.contains(&r.name.as_str()) && r.calls > 0)
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.total_ns));
        rows.iter()
            .map(|r| {
                let mut s = format!(
                    "{}: {} in {} calls ({}/call)",
                    r.name,
                    secs(r.total_ns as f64),
                    thousands(r.calls),
                    secs(r.avg_ns())
                );
                if r.errors > 0 {
                    let errnos: Vec<String> = r
                        .errnos
                        .iter()
                        .map(|(e, n)| format!("{e} {}", thousands(*n)))
                        .collect();
                    s.push_str(&format!(
                        ", {} failed ({})",
                        thousands(r.errors),
                        errnos.join(", ")
                    ));
                }
                s
            })
            .collect()
    }
}
