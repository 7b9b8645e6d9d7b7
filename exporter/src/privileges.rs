//! Least privilege: once the probes are loaded and attached, sysscope gives up every
//! capability it does not need to keep running, in every thread of the process.
//!
//! What running needs (and why):
//! - reading and deleting map entries and program statistics goes through file descriptors
//!   sysscope already holds, which needs no capability on kernels since 6.5; older kernels
//!   with `kernel.unprivileged_bpf_disabled` set refuse every `bpf()` call without
//!   `CAP_BPF`, so that is checked by experiment ([`bpf_fd_access_needs_cap_bpf`]) and
//!   `CAP_BPF` is kept only when the experiment says so;
//! - `/proc/<pid>/comm`, `/proc/<pid>` and the cgroup tree are world-readable: nothing;
//! - the file a slow call waited on is named by the kernel at the call's exit (the probe reads
//!   its identity and walks its path): nothing;
//! - `/proc/<pid>/fd` answers for a file the kernel could not name (a path longer than the
//!   record holds, a namespace file, a kernel without the struct offsets), and
//!   `/proc/<pid>/exe` gives `process.executable.name`; for other users' processes that needs
//!   `CAP_SYS_PTRACE` (the kernel's ptrace access check on the links) and, for the descriptor
//!   links, `CAP_DAC_READ_SEARCH` (to search `/proc/<pid>/fd`). Both are optional: kept when
//!   the process holds them at start and `slow_calls.proc_fallback` is on (with slow calls and
//!   paths), never asked for, and start-up goes on without them ([`proc_fallback`]).
//!
//! Everything else (CAP_SYS_ADMIN, CAP_PERFMON, CAP_NET_*, CAP_DAC_OVERRIDE, ...) is removed
//! from the effective, permitted, inheritable and ambient sets, and from the bounding set when
//! sysscope holds CAP_SETPCAP; `no_new_privs` is set, so no later `execve` can regain them.
//!
//! Capabilities belong to threads, not processes, and the async runtime and collectors have
//! started threads by the time the probes are attached. The new sets are therefore applied by
//! each thread to itself: the caller does it directly, every other thread in a signal handler
//! (one real-time signal per thread, acknowledged before the next), the way libcap's `psx`
//! does. Threads started later inherit the reduced sets. The result is then read back from
//! `/proc/self/task/*/status` and any thread that kept more is reported.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::atomic::{AtomicU64, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use crate::config::Config;

pub const CAP_DAC_READ_SEARCH: u32 = 2;
pub(crate) const CAP_SETPCAP: u32 = 8;
pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub(crate) const CAP_PERFMON: u32 = 38;
pub(crate) const CAP_BPF: u32 = 39;

/// Names of the capabilities sysscope may keep, for logs and errors.
pub(crate) fn cap_name(cap: u32) -> String {
    match cap {
        CAP_DAC_READ_SEARCH => "CAP_DAC_READ_SEARCH".into(),
        CAP_SETPCAP => "CAP_SETPCAP".into(),
        CAP_SYS_PTRACE => "CAP_SYS_PTRACE".into(),
        CAP_SYS_ADMIN => "CAP_SYS_ADMIN".into(),
        CAP_PERFMON => "CAP_PERFMON".into(),
        CAP_BPF => "CAP_BPF".into(),
        other => format!("capability {other}"),
    }
}

/// Names of the capabilities in `mask`.
pub fn cap_names(mask: u64) -> Vec<String> {
    (0..64)
        .filter(|c| mask & (1 << c) != 0)
        .map(cap_name)
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("capset failed on the main thread")]
    Capset(#[source] std::io::Error),
    #[error("cannot install the signal handler that drops capabilities in other threads")]
    Signal(#[source] std::io::Error),
    #[error(
        "threads {threads:?} still hold capabilities beyond {wanted:?} after the drop \
         (capabilities are per thread; see the log for details)"
    )]
    ThreadsNotDropped {
        threads: Vec<u32>,
        wanted: Vec<String>,
    },
}

/// Set in the environment, makes [`drop_after_start`] fail as a refused `capset` would.
pub const FAULT_DROP_ENV: &str = "SYSSCOPE_FAULT_CAPABILITY_DROP";

/// The capabilities of the `/proc` fallback.
const PROC_FALLBACK_CAPS: u64 = (1 << CAP_DAC_READ_SEARCH) | (1 << CAP_SYS_PTRACE);

/// How far `/proc` can stand in for the kernel when naming a slow call's file (and give
/// `process.executable.name`), under a configuration and the capabilities held at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcFallback {
    /// Not used: the setting (`slow_calls.enabled`, `resolve_file_paths` or `proc_fallback`)
    /// that is off.
    Off(&'static str),
    /// For every process: both capabilities held at start, and kept.
    On,
    /// Only for processes of sysscope's own user: the capabilities in `missing` were not held
    /// at start. `CAP_SYS_PTRACE` alone is kept (the executable's name of every process);
    /// `CAP_DAC_READ_SEARCH` alone is not (every link it would reach is behind the ptrace
    /// check).
    OwnUser { missing: u64 },
}

/// The `/proc` fallback under `config` with `held` (a permitted set) at start.
pub fn proc_fallback(config: &Config, held: u64) -> ProcFallback {
    let slow = &config.slow_calls;
    if !slow.enabled {
        ProcFallback::Off("slow_calls.enabled = false")
    } else if !slow.resolve_file_paths {
        ProcFallback::Off("slow_calls.resolve_file_paths = false")
    } else if !slow.proc_fallback {
        ProcFallback::Off("slow_calls.proc_fallback = false")
    } else if held & PROC_FALLBACK_CAPS == PROC_FALLBACK_CAPS {
        ProcFallback::On
    } else {
        ProcFallback::OwnUser {
            missing: PROC_FALLBACK_CAPS & !held,
        }
    }
}

impl ProcFallback {
    /// The capabilities it keeps after start-up.
    pub(crate) fn kept(self) -> u64 {
        match self {
            ProcFallback::Off(_) => 0,
            ProcFallback::On => PROC_FALLBACK_CAPS,
            ProcFallback::OwnUser { missing } if missing & (1 << CAP_SYS_PTRACE) == 0 => {
                1 << CAP_SYS_PTRACE
            }
            ProcFallback::OwnUser { .. } => 0,
        }
    }

    /// One line for `--config.check` and the start-up log.
    pub fn describe(self) -> String {
        match self {
            ProcFallback::Off(why) => format!("off ({why})"),
            ProcFallback::On => {
                "on for every process (CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE held at start, kept)"
                    .into()
            }
            ProcFallback::OwnUser { missing } => format!(
                "off for other users' processes ({} not held at start): a file the kernel cannot \
                 name reads sysscope.file.path_unavailable = permission_denied, or the tail of its \
                 path after \"...\"{}",
                cap_names(missing).join(" and "),
                if missing & (1 << CAP_SYS_PTRACE) != 0 {
                    ", and process.executable.name is the process name"
                } else {
                    ""
                }
            ),
        }
    }
}

/// The permitted set of the calling thread: what sysscope can keep.
pub fn held() -> u64 {
    parse_status(&std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default()).permitted
}

/// What each capability kept after start-up is for, under `config` with `held` (a permitted
/// set) at start (what `--config.check` prints). `CAP_BPF` may be added at run time on
/// kernels that need it for map access.
pub fn kept_for(config: &Config, held: u64) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    let keep = required(config, held);
    if keep & (1 << CAP_DAC_READ_SEARCH) != 0 {
        out.push((
            "CAP_DAC_READ_SEARCH",
            "the /proc fallback of slow-call file names: search /proc/<pid>/fd of other users' processes (slow_calls.proc_fallback)",
        ));
    }
    if keep & (1 << CAP_SYS_PTRACE) != 0 {
        out.push((
            "CAP_SYS_PTRACE",
            "the /proc fallback of slow-call file names and process.executable.name: the ptrace access check on /proc/<pid>/fd links and /proc/<pid>/exe of other users' processes (slow_calls.proc_fallback)",
        ));
    }
    out
}

/// The capabilities sysscope keeps once everything is attached, from its configuration and
/// `held` (a permitted set) at start, before the `CAP_BPF` experiment. Never more than
/// `held`.
pub(crate) fn required(config: &Config, held: u64) -> u64 {
    // Sampled probe statistics are switched by a helper process that keeps CAP_SYS_ADMIN for
    // that alone (kernel/probe_stats.rs); "always" enables them once at start and "off" never does:
    // the exporter keeps it in no mode.
    proc_fallback(config, held).kept() & held
}

/// What the drop did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropReport {
    /// The effective = permitted set now held by every thread.
    pub kept: u64,
    /// Whether `CAP_BPF` had to be kept for map access (old kernel, unprivileged BPF off).
    pub(crate) bpf_fd_access_needs_cap_bpf: bool,
    /// Whether the bounding set could be reduced too (needs CAP_SETPCAP).
    pub bounding_set_reduced: bool,
    /// What the `/proc` fallback can do with what was held at start (`None`: a drop that
    /// does not concern it, the statistics helper's).
    pub proc_fallback: Option<ProcFallback>,
    /// Threads that applied the new sets.
    pub threads: usize,
}

/// The capability sets of one thread, as `/proc/.../status` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CapSets {
    pub(crate) inheritable: u64,
    pub(crate) permitted: u64,
    pub(crate) effective: u64,
    pub(crate) bounding: u64,
    pub(crate) ambient: u64,
}

/// Parses the `Cap*` lines of a `/proc/<pid>/status` file.
pub(crate) fn parse_status(status: &str) -> CapSets {
    let mut sets = CapSets::default();
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let Ok(v) = u64::from_str_radix(value.trim(), 16) else {
            continue;
        };
        match key {
            "CapInh" => sets.inheritable = v,
            "CapPrm" => sets.permitted = v,
            "CapEff" => sets.effective = v,
            "CapBnd" => sets.bounding = v,
            "CapAmb" => sets.ambient = v,
            _ => {}
        }
    }
    sets
}

/// The capability sets of every thread of this process, by thread id.
pub(crate) fn thread_cap_sets() -> Vec<(u32, CapSets)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // A thread that exited between the listing and the read is simply gone.
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            out.push((tid, parse_status(&status)));
        }
    }
    out
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
        .min(63)
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// capset(2) on the calling thread. Async-signal-safe (one raw syscall).
fn capset_current(effective: u64, permitted: u64, inheritable: u64) -> Result<(), i32> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: effective as u32,
            permitted: permitted as u32,
            inheritable: inheritable as u32,
        },
        CapData {
            effective: (effective >> 32) as u32,
            permitted: (permitted >> 32) as u32,
            inheritable: (inheritable >> 32) as u32,
        },
    ];
    // SAFETY: header and data are valid v3 capset arguments (two data elements).
    let r = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        // SAFETY: reading errno of this thread.
        Err(unsafe { *libc::__errno_location() })
    }
}

/// What every thread applies: set by [`drop_after_start`] before any thread is signalled.
static APPLY_KEEP: AtomicU64 = AtomicU64::new(0);
static APPLY_LAST_CAP: AtomicU64 = AtomicU64::new(40);
static APPLY_DONE: AtomicUsize = AtomicUsize::new(0);
static APPLY_BOUNDING_OK: AtomicUsize = AtomicUsize::new(0);

/// Applies the new sets to the calling thread. Async-signal-safe: raw syscalls only.
/// Returns whether the bounding set could be reduced, or capset's errno.
fn apply_current_thread() -> Result<bool, i32> {
    let keep = APPLY_KEEP.load(Ordering::SeqCst);
    let last = APPLY_LAST_CAP.load(Ordering::SeqCst) as u32;
    // The bounding set first: dropping from it needs CAP_SETPCAP, which capset removes.
    let mut bounding_ok = true;
    for cap in 0..=last {
        if keep & (1u64 << cap) == 0 {
            // SAFETY: prctl with integer arguments only.
            let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            if r != 0 {
                bounding_ok = false;
            }
        }
    }
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    capset_current(keep, keep, 0)?;
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    Ok(bounding_ok)
}

extern "C" fn on_drop_signal(_sig: libc::c_int) {
    // SAFETY: saving and restoring this thread's errno around the handler.
    let errno = unsafe { *libc::__errno_location() };
    if let Ok(bounding_ok) = apply_current_thread() {
        if bounding_ok {
            APPLY_BOUNDING_OK.fetch_add(1, Ordering::SeqCst);
        }
        APPLY_DONE.fetch_add(1, Ordering::SeqCst);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

fn thread_ids() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Creates a one-entry BPF array map: an fd to test fd-based access with.
fn create_probe_map() -> Option<OwnedFd> {
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size, max_entries, ...
    let mut attr = [0u8; 128];
    let fields: [u32; 4] = [2 /* BPF_MAP_TYPE_ARRAY */, 4, 8, 1];
    for (i, f) in fields.iter().enumerate() {
        attr[i * 4..i * 4 + 4].copy_from_slice(&f.to_ne_bytes());
    }
    // SAFETY: attr is a zero-padded bpf_attr of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0, /* BPF_MAP_CREATE */
            attr.as_ptr(),
            attr.len(),
        )
    };
    // SAFETY: a new descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// BPF_MAP_LOOKUP_ELEM of key 0: whether fd-based map access works with the current
/// effective capabilities.
fn lookup_works(map: &OwnedFd) -> bool {
    let key: u32 = 0;
    let mut value: u64 = 0;
    // union bpf_attr for BPF_MAP_LOOKUP_ELEM: map_fd (u32), pad, key (u64), value (u64), flags.
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(&key as *const u32 as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(&mut value as *mut u64 as u64).to_ne_bytes());
    // SAFETY: attr points at a live key and value of the map's sizes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            1, /* BPF_MAP_LOOKUP_ELEM */
            attr.as_ptr(),
            attr.len(),
        )
    };
    r == 0
}

/// Whether reading maps through held file descriptors needs `CAP_BPF` on this kernel: lowers
/// the calling thread's effective set to `keep` for one lookup, then restores it.
pub(crate) fn bpf_fd_access_needs_cap_bpf(keep: u64) -> bool {
    let Some(map) = create_probe_map() else {
        // Cannot even create a map: we are not privileged; nothing to learn.
        return false;
    };
    let before =
        parse_status(&std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default());
    if capset_current(
        keep & before.permitted,
        before.permitted,
        before.inheritable,
    )
    .is_err()
    {
        return false;
    }
    let works = lookup_works(&map);
    let _ = capset_current(before.effective, before.permitted, before.inheritable);
    !works
}

/// Drops every capability beyond those `config` needs, in every thread (see the module
/// docs). Call once, after every probe is attached and before serving.
pub fn drop_after_start(config: &Config) -> Result<DropReport, PrivilegeError> {
    if std::env::var_os(FAULT_DROP_ENV).is_some() {
        // The test suite's way to reach the failure path for real (the exporter must exit).
        return Err(PrivilegeError::Capset(std::io::Error::from_raw_os_error(
            libc::EPERM,
        )));
    }
    let held = held();
    let mut keep = required(config, held);
    let needs_bpf = bpf_fd_access_needs_cap_bpf(keep);
    if needs_bpf {
        keep |= 1 << CAP_BPF;
    }
    // Never ask for what we do not hold.
    keep &= held;
    drop_to(keep).map(|mut r| {
        r.bpf_fd_access_needs_cap_bpf = needs_bpf;
        r.proc_fallback = Some(proc_fallback(config, held));
        r
    })
}

/// Reduces every thread to `keep` (effective = permitted = `keep`, no inheritable or ambient,
/// bounding set `keep` when possible, no_new_privs).
pub(crate) fn drop_to(keep: u64) -> Result<DropReport, PrivilegeError> {
    APPLY_KEEP.store(keep, Ordering::SeqCst);
    APPLY_LAST_CAP.store(last_cap() as u64, Ordering::SeqCst);
    APPLY_DONE.store(0, Ordering::SeqCst);
    APPLY_BOUNDING_OK.store(0, Ordering::SeqCst);

    let signal = libc::SIGRTMIN() + 7;
    // SAFETY: installing a handler that only makes raw syscalls and touches atomics.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: all-zero is a valid sigaction (no handler, empty mask).
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_drop_signal as *const () as usize;
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: a valid sigaction; the old one is saved and restored below.
    if unsafe { libc::sigaction(signal, &action, &mut old) } != 0 {
        return Err(PrivilegeError::Signal(std::io::Error::last_os_error()));
    }

    let me = gettid();
    let mut done: std::collections::HashSet<u32> = std::collections::HashSet::new();
    let bounding_self = apply_current_thread().map_err(|e| {
        // SAFETY: restoring the saved disposition.
        unsafe { libc::sigaction(signal, &old, std::ptr::null_mut()) };
        PrivilegeError::Capset(std::io::Error::from_raw_os_error(e))
    })?;
    done.insert(me);
    let mut bounding_ok = bounding_self;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // Threads started by a thread not yet reduced are found by the next pass.
    for _pass in 0..16 {
        let pending: Vec<u32> = thread_ids()
            .into_iter()
            .filter(|t| !done.contains(t))
            .collect();
        if pending.is_empty() {
            break;
        }
        for tid in pending {
            let before = APPLY_DONE.load(Ordering::SeqCst);
            let before_bounding = APPLY_BOUNDING_OK.load(Ordering::SeqCst);
            // SAFETY: signalling a thread of our own process.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid as libc::c_int, signal) };
            done.insert(tid);
            if r != 0 {
                // ESRCH: the thread exited in between.
                continue;
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while APPLY_DONE.load(Ordering::SeqCst) == before && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(200));
            }
            if APPLY_BOUNDING_OK.load(Ordering::SeqCst) == before_bounding {
                bounding_ok = false;
            }
        }
    }
    // A thread that had the signal blocked may still receive it later: the default action of
    // a real-time signal would end the process, so ignore it rather than restore the default.
    let mut after = old;
    if after.sa_sigaction == libc::SIG_DFL {
        after.sa_sigaction = libc::SIG_IGN;
    }
    // SAFETY: a valid disposition for our signal.
    unsafe { libc::sigaction(signal, &after, std::ptr::null_mut()) };

    // Read back what every thread now holds.
    let over: Vec<u32> = thread_cap_sets()
        .into_iter()
        .filter(|(_, s)| s.effective & !keep != 0 || s.permitted & !keep != 0 || s.ambient != 0)
        .map(|(tid, s)| {
            tracing::error!(
                tid,
                effective = format!("{:#x}", s.effective),
                permitted = format!("{:#x}", s.permitted),
                "thread kept capabilities after the drop"
            );
            tid
        })
        .collect();
    if !over.is_empty() {
        return Err(PrivilegeError::ThreadsNotDropped {
            threads: over,
            wanted: cap_names(keep),
        });
    }
    Ok(DropReport {
        kept: keep,
        bpf_fd_access_needs_cap_bpf: false,
        bounding_set_reduced: bounding_ok,
        proc_fallback: None,
        threads: done.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_capability_lines() {
        let status = "Name:\tsysscope\nCapInh:\t0000000000000000\nCapPrm:\t000000c000080004\n\
                      CapEff:\t000000c000080004\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n";
        let s = parse_status(status);
        assert_eq!(
            s.effective,
            (1 << CAP_BPF)
                | (1 << CAP_PERFMON)
                | (1 << CAP_SYS_PTRACE)
                | (1 << CAP_DAC_READ_SEARCH)
        );
        assert_eq!(s.bounding, 0x1ff_ffff_ffff);
        assert_eq!(parse_status("garbage\nCapEff: zz\n"), CapSets::default());
    }

    #[test]
    fn the_proc_fallback_keeps_what_is_held_and_asks_for_nothing() {
        let both = PROC_FALLBACK_CAPS;
        let root = (1u64 << 41) - 1;
        let daemonset = (1u64 << CAP_BPF) | (1 << CAP_PERFMON);
        let mut c = Config::default();
        // Held at start (root, or granted): both kept, and said why.
        assert_eq!(proc_fallback(&c, root), ProcFallback::On);
        assert_eq!(
            cap_names(required(&c, root)),
            ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"]
        );
        assert_eq!(kept_for(&c, root).len(), 2);
        assert_eq!(required(&c, both), both);
        // Not held (the DaemonSet, the unit): nothing kept, nothing asked for, and the
        // fallback is off for other users' processes.
        assert_eq!(
            proc_fallback(&c, daemonset),
            ProcFallback::OwnUser { missing: both }
        );
        assert_eq!(required(&c, daemonset), 0);
        assert!(kept_for(&c, daemonset).is_empty());
        let line = proc_fallback(&c, daemonset).describe();
        assert!(line.starts_with("off for other users' processes (CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE not held at start)"), "{line}");
        assert!(
            line.contains("permission_denied") && line.contains("process.executable.name"),
            "{line}"
        );
        // CAP_SYS_PTRACE alone still names every executable; CAP_DAC_READ_SEARCH alone opens
        // no link (each is behind the ptrace check): not kept.
        let ptrace = daemonset | (1 << CAP_SYS_PTRACE);
        assert_eq!(cap_names(required(&c, ptrace)), ["CAP_SYS_PTRACE"]);
        assert!(!proc_fallback(&c, ptrace)
            .describe()
            .contains("process.executable.name"));
        assert_eq!(required(&c, daemonset | (1 << CAP_DAC_READ_SEARCH)), 0);
        // No statistics mode keeps CAP_SYS_ADMIN (sampled statistics use a helper process).
        for mode in [
            crate::config::ProbeStatsMode::Always,
            crate::config::ProbeStatsMode::Sampled,
            crate::config::ProbeStatsMode::Off,
        ] {
            c.collection.probe_stats = mode;
            assert_eq!(required(&c, root) & (1 << CAP_SYS_ADMIN), 0);
        }
        // Each setting that turns the fallback off drops both, even from root, and is named.
        type TurnOff = fn(&mut Config);
        let turned_off: [(&str, TurnOff); 3] = [
            ("slow_calls.proc_fallback = false", |c| {
                c.slow_calls.proc_fallback = false
            }),
            ("slow_calls.resolve_file_paths = false", |c| {
                c.slow_calls.resolve_file_paths = false
            }),
            ("slow_calls.enabled = false", |c| {
                c.slow_calls.enabled = false
            }),
        ];
        for (key, set) in turned_off {
            let mut off = Config::default();
            set(&mut off);
            assert_eq!(proc_fallback(&off, root), ProcFallback::Off(key));
            assert_eq!(required(&off, root), 0, "{key}");
            assert_eq!(proc_fallback(&off, root).describe(), format!("off ({key})"));
        }
    }
}
