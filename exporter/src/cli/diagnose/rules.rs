//! The verdicts: each rule looks at the measured [`Context`] and, when its pattern holds,
//! says what it is, with evidence and a fix; [`diagnose`] ranks them. Every threshold is a named
//! constant, documented in docs/cli.md.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use sysscope_abi::{fd_class, FdClass};

use super::features::*;
use crate::cli::{
    profile::SyscallRow,
    progress::thousands,
    render::{strace as format, units::secs},
};

// ---- Thresholds (documented in docs/cli.md) ----

/// futex must take at least this share of syscall time to be called dominant.
pub(crate) const FUTEX_DOMINANT_SHARE: f64 = 0.50;
/// At least this many futex calls (a few waits at exit are normal).
pub(crate) const FUTEX_MIN_CALLS: u64 = 10;
/// futex time at least this many times the wall time means threads waited at once:
/// lock amplification (time is summed over threads, like `strace -f -c`).
pub(crate) const LOCK_AMPLIFICATION_FACTOR: f64 = 2.0;
/// A filesystem call slower than this on average is "slow" (e.g. network storage).
pub(crate) const SLOW_FS_CALL_NS: f64 = 100_000.0;
/// openat + stat-family calls needed for a metadata storm...
pub(crate) const METADATA_MIN_CALLS: u64 = 1000;
/// ...and the share of syscall time they must take.
pub(crate) const METADATA_MIN_SHARE: f64 = 0.25;
/// Failed lookups above this ratio point at search paths.
pub(crate) const METADATA_FAILED_RATIO: f64 = 0.5;
/// read-family share of syscall time above which reads dominate.
pub(crate) const READ_DOMINANT_SHARE: f64 = 0.50;
/// mmap/mprotect/munmap/mremap/brk calls needed for mmap-heavy start-up...
pub(crate) const MMAP_MIN_CALLS: u64 = 100;
/// ...and their share of syscall time.
pub(crate) const MMAP_MIN_SHARE: f64 = 0.25;
/// epoll_wait/poll/select share of syscall time above which the target is mostly idle.
pub(crate) const POLL_IDLE_SHARE: f64 = 0.50;
/// nanosleep/clock_nanosleep calls needed for a sleep loop...
pub(crate) const SLEEP_MIN_CALLS: u64 = 10;
/// ...and their share of syscall time.
pub(crate) const SLEEP_MIN_SHARE: f64 = 0.25;
/// Successful opens needed for open/close churn...
pub(crate) const CHURN_MIN_OPENS: u64 = 500;
/// ...closes per successful open...
pub(crate) const CHURN_CLOSE_RATIO: f64 = 0.8;
/// ...and at most this many reads + writes per open (little work per file).
pub(crate) const CHURN_MAX_IO_PER_OPEN: f64 = 4.0;
/// fsync/fdatasync calls needed for fsync-per-write...
pub(crate) const FSYNC_MIN_CALLS: u64 = 50;
/// ...syncs per write...
pub(crate) const FSYNC_PER_WRITE_RATIO: f64 = 0.5;
/// ...and the share of syscall time the syncs take.
pub(crate) const FSYNC_MIN_SHARE: f64 = 0.10;
/// Transfers averaging fewer bytes than this are tiny...
pub(crate) const TINY_TRANSFER_BYTES: f64 = 512.0;
/// ...when there are at least this many...
pub(crate) const TINY_MIN_CALLS: u64 = 1000;
/// ...and they take this share of syscall time.
pub(crate) const TRANSFER_MIN_SHARE: f64 = 0.25;
/// Transfers averaging more bytes than this are huge...
pub(crate) const HUGE_TRANSFER_BYTES: f64 = 64.0 * 1024.0 * 1024.0;
/// ...when each takes at least this long on average.
pub(crate) const HUGE_MIN_CALL_NS: f64 = 10_000_000.0;
/// A syscall failing at least this many times...
pub(crate) const ERROR_MIN_CALLS: u64 = 100;
/// ...and at least this often is reported as failing.
pub(crate) const ERROR_MIN_RATIO: f64 = 0.5;
/// CPU-bound: syscall time below this share of the cgroup's CPU time...
pub(crate) const CPU_BOUND_MAX_SYSCALL_SHARE: f64 = 0.10;
/// ...while the cgroup used at least this much CPU per second of wall time.
pub(crate) const CPU_BOUND_MIN_CPU_PER_WALL: f64 = 0.5;
/// Weight of patterns that are usually expected (an idle event loop).
pub(crate) const EXPECTED_WEIGHT: f64 = 0.5;
/// Weight of patterns that explain another one more precisely (tiny transfers explain
/// read-dominated time), so they come first on equal shares.
pub(crate) const SPECIFIC_WEIGHT: f64 = 1.05;
/// Weight of failing calls (a symptom more often than a cause).
pub(crate) const ERROR_WEIGHT: f64 = 0.5;
/// Score of the CPU-bound verdict (informational; any real pattern above 20% beats it).
pub(crate) const CPU_BOUND_SCORE: f64 = 0.2;

/// One diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Verdict {
    /// Stable identifier of the rule (`futex-contention`, `metadata-storm`, ...).
    pub id: &'static str,
    pub(crate) title: String,
    /// Importance: the share of syscall time explained, weighted.
    pub(crate) score: f64,
    pub evidence: Vec<String>,
    pub fix: String,
}

pub(super) fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

pub(super) fn bytes(b: f64) -> String {
    if b < 1024.0 {
        format!("{b:.0} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    }
}

pub(super) fn futex_rule(c: &Context) -> Option<Verdict> {
    let share = c.share(FUTEX);
    if share < FUTEX_DOMINANT_SHARE || c.calls(FUTEX) < FUTEX_MIN_CALLS {
        return None;
    }
    let futex_ns = c.time_ns(FUTEX) as f64;
    let wall_ns = c.wall.as_nanos() as f64;
    let amplification = if wall_ns > 0.0 {
        futex_ns / wall_ns
    } else {
        0.0
    };
    let mut evidence = vec![format!("futex takes {} of syscall time", pct(share))];
    evidence.extend(c.describe(FUTEX));
    let amplified = amplification >= LOCK_AMPLIFICATION_FACTOR;
    if amplified {
        evidence.push(format!(
            "futex time is {amplification:.1}x the wall time ({}): about {:.0} threads were \
             waiting at any moment (time is summed over threads)",
            secs(wall_ns),
            amplification
        ));
    }
    if let Some(f) = c.features {
        evidence.push(format!(
            "{} threads made syscalls; {} futex waits on {} distinct lock word(s)",
            thousands(f.threads.len() as u64),
            thousands(f.futex_waits),
            thousands(f.futex_addresses.len() as u64)
        ));
    }
    let fs: Vec<&str> = OPEN.iter().chain(STAT).chain(READ).copied().collect();
    let fs_calls = c.calls(&fs);
    let fs_avg = c.avg_ns(&fs);
    let slow_fs = fs_calls > 0 && fs_avg >= SLOW_FS_CALL_NS;
    if fs_calls > 0 {
        evidence.push(format!(
            "filesystem calls (open/stat/read): {} of syscall time, {} calls averaging {}{}",
            pct(c.share(&fs)),
            thousands(fs_calls),
            secs(fs_avg),
            if slow_fs { ": slow" } else { ": fast" }
        ));
    }
    let title = if slow_fs {
        "futex dominates while filesystem calls are slow: lock contention amplified by slow I/O \
         (e.g. import-lock amplification)"
            .to_string()
    } else if amplified {
        "futex dominates: lock contention amplified across threads".to_string()
    } else {
        "futex dominates: threads wait on each other (lock contention or synchronisation)"
            .to_string()
    };
    let fix = if slow_fs {
        "The lock holder is slow because of the filesystem: the futex time is a symptom. Make \
         the files fast (copy the venv/data to local storage, warm the page cache) and re-measure; \
         if wall time drops, the filesystem was the cause."
    } else {
        "Find what the lock holder does while others wait (`sysscope trace` shows each thread's \
         calls between futex waits). Reduce contention: fewer threads on the same lock, \
         finer-grained or sharded locks, per-thread queues; for start-up (Python/CUDA \
         imports), import once before starting threads."
    };
    Some(Verdict {
        id: "futex-contention",
        title,
        score: share,
        evidence,
        fix: fix.to_string(),
    })
}

pub(super) fn metadata_rule(c: &Context) -> Option<Verdict> {
    let group: Vec<&str> = OPEN.iter().chain(STAT).copied().collect();
    let calls = c.calls(&group);
    let share = c.share(&group);
    if calls < METADATA_MIN_CALLS || share < METADATA_MIN_SHARE {
        return None;
    }
    let failed = c.errors(&group);
    let mut evidence = vec![format!(
        "{} open/stat-family calls take {} of syscall time, {} each on average",
        thousands(calls),
        pct(share),
        secs(c.avg_ns(&group))
    )];
    evidence.extend(c.describe(&group));
    let failed_ratio = failed as f64 / calls as f64;
    if failed_ratio >= METADATA_FAILED_RATIO {
        evidence.push(format!(
            "{} of lookups fail: a search path is probed entry by entry",
            pct(failed_ratio)
        ));
    }
    if let Some(f) = c.features {
        for (what, map) in [
            ("failed open", &f.failed_paths),
            ("stat", &f.lookup_paths),
            ("open", &f.open_paths),
        ] {
            if let Some((path, n)) = Features::top(map) {
                if n > 1 {
                    evidence.push(format!(
                        "most repeated {what}: {} ({} times)",
                        format::quote(path),
                        thousands(n)
                    ));
                }
            }
        }
    }
    let slow = c.avg_ns(&group) >= SLOW_FS_CALL_NS;
    let title = if slow {
        "openat/stat storm on a slow filesystem: metadata lookups dominate".to_string()
    } else {
        "openat/stat storm: many filesystem metadata lookups".to_string()
    };
    Some(Verdict {
        id: "metadata-storm",
        title,
        score: share,
        evidence,
        fix: "Cache metadata instead of asking again (reuse stat results, fstat an open fd), \
              open relative to a directory fd (openat(dirfd, name)) instead of resolving full \
              paths, and shorten search paths (sys.path, PYTHONPATH, LD_LIBRARY_PATH) so fewer \
              lookups fail. On network filesystems, copy the files to local storage or raise \
              attribute caching."
            .to_string(),
    })
}

pub(super) fn churn_rule(c: &Context) -> Option<Verdict> {
    let opens = c.calls(OPEN).saturating_sub(c.errors(OPEN));
    let closes = c.calls(CLOSE);
    if opens < CHURN_MIN_OPENS || (closes as f64) < CHURN_CLOSE_RATIO * opens as f64 {
        return None;
    }
    let io = c.calls(READ) + c.calls(WRITE);
    let io_per_open = io as f64 / opens as f64;
    if io_per_open > CHURN_MAX_IO_PER_OPEN {
        return None;
    }
    let group: Vec<&str> = OPEN
        .iter()
        .chain(CLOSE)
        .chain(READ)
        .chain(WRITE)
        .chain(UNLINK)
        .copied()
        .collect();
    let share = c.share(&group);
    let mut evidence = vec![format!(
        "{} successful opens and {} closes with {:.1} reads/writes per open; open/close and \
         their I/O take {} of syscall time",
        thousands(opens),
        thousands(closes),
        io_per_open,
        pct(share)
    )];
    evidence.extend(c.describe(&[OPEN, CLOSE, UNLINK].concat()));
    if let Some((path, n)) = c.features.and_then(|f| Features::top(&f.open_paths)) {
        if n > 1 {
            evidence.push(format!(
                "the same file was opened {} times: {}",
                thousands(n),
                format::quote(path)
            ));
        }
    }
    Some(Verdict {
        id: "open-close-churn",
        title: "open/close churn: files are opened and closed over and over".to_string(),
        score: share,
        evidence,
        fix: "Keep files open and reuse the descriptor, write into one file in batches instead \
              of open-append-close per record, and pack many small files into one (tar, \
              recordio, webdataset) when reading datasets."
            .to_string(),
    })
}

/// Filesystems whose reads are round trips to a server or to a user-space daemon (the `fs`
/// names of `crate::kernel::fd_class`).
pub(super) const REMOTE_FILESYSTEMS: &[&str] = &[
    "nfs", "fuse", "ceph", "cifs", "smb2", "lustre", "gpfs", "9p",
];

/// Time in the read family by what was read (`file (ext4)`, `pipe`, ...), most first, from
/// the kernel's classification of each call's descriptor; `part` is the time of a row counted
/// (its whole time, or a part of it such as the time blocked).
pub(super) fn read_time_by_descriptor(
    c: &Context,
    part: impl Fn(&SyscallRow) -> u64,
) -> Vec<(FdClass, u64)> {
    let mut by: HashMap<FdClass, u64> = HashMap::new();
    for ((_, fd), row) in &c.profile.by_fd {
        if READ.contains(&row.name.as_str()) {
            *by.entry(*fd).or_default() += part(row);
        }
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

pub(super) fn describe_fd(fd: &FdClass) -> String {
    let kind = fd_class::name(fd.kind).unwrap_or("other");
    if fd.kind == fd_class::FILE {
        format!("{kind} ({})", crate::kernel::fd_class::fs_name(fd.fs_magic))
    } else {
        kind.to_string()
    }
}

/// The read verdict for a dominant kind of read: what the time waits on decides the fix.
pub(super) fn read_verdict_for(fd: &FdClass) -> (&'static str, String, &'static str) {
    match fd.kind {
        fd_class::PIPE => (
            "waiting-on-pipe",
            "waiting on a pipe: the processes that write it (data loader workers, a pipeline's \
             producer) are the bottleneck"
                .to_string(),
            "The reader is fast; its producers are not. Give the producers more parallelism \
             (more DataLoader workers, prefetch_factor), profile them rather than this process \
             (py-spy dump on the workers), and look at what they read.",
        ),
        fd_class::SOCKET => (
            "waiting-on-socket",
            "read time is waiting on sockets: the peer or the network is the bottleneck"
                .to_string(),
            "The data comes over the network. Check the peer's latency and the bandwidth per \
             read above, keep more requests in flight (parallel connections, larger \
             responses), and cache what is read again.",
        ),
        fd_class::FILE => {
            let fs = crate::kernel::fd_class::fs_name(fd.fs_magic);
            if REMOTE_FILESYSTEMS.contains(&fs.as_ref()) {
                (
                    "read-dominated-remote-fs",
                    format!(
                        "read-dominated: time goes into reading files on {fs}, a network or \
                         FUSE filesystem (each read is a round trip)"
                    ),
                    "Reads of a remote or FUSE filesystem wait for round trips. Stage the data \
                     on local disk first, read fewer and larger files or shards (tar, \
                     webdataset, recordio), raise readahead and the read size of the mount, and \
                     keep more reads in flight (more loader workers).",
                )
            } else {
                (
                    "read-dominated",
                    format!(
                        "read-dominated: time goes into reading files on {fs} (storage or \
                         page-cache misses)"
                    ),
                    READ_FIX,
                )
            }
        }
        _ => (
            "read-dominated",
            format!(
                "read-dominated: time goes into reading {} descriptors",
                describe_fd(fd)
            ),
            READ_FIX,
        ),
    }
}

pub(super) const READ_FIX: &str =
    "Data loading is the bottleneck. Check the storage's latency and \
     throughput against the per-read numbers above, keep hot data in the page cache (or local \
     disk), read larger blocks, and overlap I/O with compute (more loader workers, prefetching).";

pub(super) fn read_rule(c: &Context) -> Option<Verdict> {
    let share = c.share(READ);
    if share < READ_DOMINANT_SHARE {
        return None;
    }
    let mut evidence = vec![format!("reads take {} of syscall time", pct(share))];
    evidence.extend(c.describe(READ));
    // What was read, as the kernel classified each call's descriptor.
    let kinds = read_time_by_descriptor(c, |r| r.total_ns);
    let read_ns = c.time_ns(READ).max(1);
    if !kinds.is_empty() {
        let parts: Vec<String> = kinds
            .iter()
            .take(4)
            .map(|(fd, ns)| format!("{} {}", pct(*ns as f64 / read_ns as f64), describe_fd(fd)))
            .collect();
        evidence.push(format!("read time by descriptor: {}", parts.join(", ")));
    }
    let dominant = kinds.first().filter(|(_, ns)| ns * 2 > read_ns);
    if let Some(f) = c.features {
        let (n, b) = f.transfer(READ);
        if n > 0 {
            let read_s = c.time_ns(READ) as f64 / 1e9;
            evidence.push(format!(
                "{} read in {} successful calls ({} per call, {}/s while inside read)",
                bytes(b as f64),
                thousands(n),
                bytes(b as f64 / n as f64),
                bytes(if read_s > 0.0 { b as f64 / read_s } else { 0.0 })
            ));
        }
    }
    let p99 = c
        .profile
        .rows
        .values()
        .filter(|r| READ.contains(&r.name.as_str()))
        .filter_map(|r| r.quantile_upper_ns(0.99))
        .max();
    if let Some(p99) = p99 {
        evidence.push(format!("99% of reads finish within {}", secs(p99 as f64)));
    }
    let (id, title, fix) = match dominant {
        Some((fd, _)) => read_verdict_for(fd),
        None => (
            "read-dominated",
            "read-dominated: time goes into reading data (storage or page-cache misses)"
                .to_string(),
            READ_FIX,
        ),
    };
    Some(Verdict {
        id,
        title,
        score: share,
        evidence,
        fix: fix.to_string(),
    })
}

pub(super) fn mmap_rule(c: &Context) -> Option<Verdict> {
    let calls = c.calls(MMAP);
    let share = c.share(MMAP);
    if calls < MMAP_MIN_CALLS || share < MMAP_MIN_SHARE {
        return None;
    }
    let mut evidence = vec![format!(
        "{} memory-mapping calls take {} of syscall time",
        thousands(calls),
        pct(share)
    )];
    evidence.extend(c.describe(MMAP));
    Some(Verdict {
        id: "mmap-heavy",
        title: "mmap/mprotect-heavy: shared-library loading or allocation churn".to_string(),
        score: share,
        evidence,
        fix: "At start-up this is shared objects being mapped (many .so files, e.g. CUDA or ML \
              frameworks), not filesystem latency: load fewer libraries, keep them on local \
              storage, start once and reuse the process. During steady state it is allocation \
              churn: reuse buffers, or raise the allocator's mmap threshold (M_MMAP_THRESHOLD, \
              jemalloc/tcmalloc)."
            .to_string(),
    })
}

pub(super) fn poll_rule(c: &Context) -> Option<Verdict> {
    let share = c.share(POLL);
    if share < POLL_IDLE_SHARE {
        return None;
    }
    let mut evidence = vec![format!(
        "waiting for events takes {} of syscall time",
        pct(share)
    )];
    evidence.extend(c.describe(POLL));
    Some(Verdict {
        id: "epoll-idle",
        title: "mostly idle: waiting in epoll/poll for I/O events (usually expected)".to_string(),
        score: share * EXPECTED_WEIGHT,
        evidence,
        fix: "Nothing to fix if the service is simply idle. If requests are slow anyway, the \
              cause is elsewhere: look at the next verdicts, the time outside epoll, and CPU \
              (perf)."
            .to_string(),
    })
}

pub(super) fn sleep_rule(c: &Context) -> Option<Verdict> {
    let calls = c.calls(SLEEP);
    let share = c.share(SLEEP);
    if calls < SLEEP_MIN_CALLS || share < SLEEP_MIN_SHARE {
        return None;
    }
    let mut evidence = vec![format!(
        "{} sleeps take {} of syscall time, {} each on average",
        thousands(calls),
        pct(share),
        secs(c.avg_ns(SLEEP))
    )];
    evidence.extend(c.describe(SLEEP));
    let wall_ns = c.wall.as_nanos() as f64;
    if wall_ns > 0.0 {
        evidence.push(format!(
            "time asleep is {:.0}% of the wall time",
            c.time_ns(SLEEP) as f64 * 100.0 / wall_ns
        ));
    }
    Some(Verdict {
        id: "sleep-loop",
        title: "nanosleep loop: the program sleeps and retries (polling, backoff or throttling)"
            .to_string(),
        score: share,
        evidence,
        fix: "Replace sleep-and-retry polling with blocking waits that wake on the event \
              (condition variables, epoll, inotify, futures); if it is a retry backoff, find what \
              keeps failing; if it is deliberate throttling, check its rate."
            .to_string(),
    })
}

pub(super) fn fsync_rule(c: &Context) -> Option<Verdict> {
    let syncs = c.calls(SYNC);
    let writes = c.calls(WRITE);
    let sync_share = c.share(SYNC);
    if syncs < FSYNC_MIN_CALLS
        || (syncs as f64) < FSYNC_PER_WRITE_RATIO * writes as f64
        || sync_share < FSYNC_MIN_SHARE
    {
        return None;
    }
    let share = c.share(&[SYNC, WRITE].concat());
    let mut evidence = vec![format!(
        "{} syncs for {} writes ({:.2} per write); syncs take {} of syscall time, {} each",
        thousands(syncs),
        thousands(writes),
        syncs as f64 / writes.max(1) as f64,
        pct(sync_share),
        secs(c.avg_ns(SYNC))
    )];
    evidence.extend(c.describe(&[SYNC, WRITE].concat()));
    if let Some(f) = c.features {
        if f.fsyncs > 0 {
            evidence.push(format!(
                "{} of {} syncs came right after a write to the same file descriptor",
                thousands(f.fsync_after_write),
                thousands(f.fsyncs)
            ));
        }
    }
    Some(Verdict {
        id: "fsync-per-write",
        title: "fsync after (almost) every write: durability paid per write".to_string(),
        score: share,
        evidence,
        fix: "Batch: write a group of records, then fsync once (group commit, checkpoints), or \
              sync on a timer. If every write must be durable, put the file on storage with fast \
              flushes (NVMe with power-loss protection) or use fdatasync."
            .to_string(),
    })
}

pub(super) fn transfer_rules(c: &Context) -> Vec<Verdict> {
    let Some(f) = c.features else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (what, group) in [
        ("reads", READ),
        ("writes", WRITE),
        ("socket receives", RECV),
        ("socket sends", SEND),
    ] {
        let (n, b) = f.transfer(group);
        let share = c.share(group);
        if n == 0 || share < TRANSFER_MIN_SHARE {
            continue;
        }
        let avg = b as f64 / n as f64;
        let avg_ns = c.avg_ns(group);
        if n >= TINY_MIN_CALLS && avg < TINY_TRANSFER_BYTES {
            let mut evidence = vec![format!(
                "{} {what} average {} each and take {} of syscall time",
                thousands(n),
                bytes(avg),
                pct(share)
            )];
            evidence.extend(c.describe(group));
            out.push(Verdict {
                id: "tiny-transfers",
                title: format!("tiny {what}: many calls moving a few bytes each"),
                score: share * SPECIFIC_WEIGHT,
                evidence,
                fix: "Buffer: move data in larger blocks (64 KiB to 1 MiB), use buffered \
                      readers/writers (BufReader/BufWriter, stdio buffering), gather with \
                      writev/readv."
                    .to_string(),
            });
        } else if avg >= HUGE_TRANSFER_BYTES && avg_ns >= HUGE_MIN_CALL_NS {
            let mut evidence = vec![format!(
                "{} {what} average {} and {} each",
                thousands(n),
                bytes(avg),
                secs(avg_ns)
            )];
            evidence.extend(c.describe(group));
            out.push(Verdict {
                id: "huge-transfers",
                title: format!("huge {what}: each call blocks the thread for long"),
                score: share,
                evidence,
                fix: "Split very large transfers into chunks (1 to 8 MiB) so I/O overlaps with \
                      compute and latency stays bounded, or use asynchronous I/O (io_uring, a \
                      loader thread)."
                    .to_string(),
            });
        }
    }
    out
}

pub(super) fn error_rules(c: &Context, already: &HashSet<&'static str>) -> Vec<Verdict> {
    let mut out = Vec::new();
    let explained: Vec<&str> = if already.contains("metadata-storm") {
        OPEN.iter().chain(STAT).copied().collect()
    } else {
        Vec::new()
    };
    for r in c.profile.rows.values() {
        if r.errors < ERROR_MIN_CALLS
            || (r.errors as f64) < ERROR_MIN_RATIO * r.calls as f64
            || explained.contains(&r.name.as_str())
        {
            continue;
        }
        let top = r
            .errnos
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(e, _)| e.clone())
            .unwrap_or_default();
        let share = c.share(&[r.name.as_str()]);
        let busy = top == "EAGAIN";
        out.push(Verdict {
            id: "failing-calls",
            title: if busy {
                format!("{} returns EAGAIN over and over: busy polling", r.name)
            } else {
                format!("{} fails most of the time ({top})", r.name)
            },
            score: share * ERROR_WEIGHT,
            evidence: c.describe(&[r.name.as_str()]),
            fix: if busy {
                "Wait for readiness (epoll/poll, blocking mode) instead of retrying a \
                 non-blocking call in a loop."
                    .to_string()
            } else {
                "Find out why it fails: `sysscope trace` shows each call's arguments, path and \
                 errno. Retrying a call that cannot succeed only costs time."
                    .to_string()
            },
        });
    }
    out
}

pub(super) fn cpu_rule(c: &Context) -> Option<Verdict> {
    let cpu = c.cpu?;
    let cpu_ns = (cpu.user + cpu.system).as_nanos() as f64;
    let wall_ns = c.wall.as_nanos() as f64;
    if wall_ns <= 0.0 || cpu_ns / wall_ns < CPU_BOUND_MIN_CPU_PER_WALL {
        return None;
    }
    let sys_share = c.active_ns() as f64 / cpu_ns;
    if sys_share > CPU_BOUND_MAX_SYSCALL_SHARE {
        return None;
    }
    Some(Verdict {
        id: "cpu-bound",
        title: "CPU-bound: syscalls are not where the time goes".to_string(),
        score: CPU_BOUND_SCORE,
        evidence: vec![format!(
            "the cgroup used {} of CPU ({} user, {} system) in {} of wall time; syscalls \
             account for {} of that",
            secs(cpu_ns),
            secs(cpu.user.as_nanos() as f64),
            secs(cpu.system.as_nanos() as f64),
            secs(wall_ns),
            pct(sys_share)
        )],
        fix: "Profile the CPU instead (perf record -g, py-spy, a flame graph).".to_string(),
    })
}

/// Applies every rule; verdicts sorted most important first.
#[cfg(test)]
pub(crate) fn diagnose(c: &Context) -> Vec<Verdict> {
    diagnose_with(c, Vec::new())
}

/// Applies every rule of this file and ranks their verdicts with `more` (the verdicts on
/// where calls spend their time, `states.rs`), most important first.
pub(crate) fn diagnose_with(c: &Context, more: Vec<Verdict>) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = [
        futex_rule(c),
        metadata_rule(c),
        churn_rule(c),
        read_rule(c),
        mmap_rule(c),
        poll_rule(c),
        sleep_rule(c),
        fsync_rule(c),
        cpu_rule(c),
    ]
    .into_iter()
    .flatten()
    .collect();
    out.extend(transfer_rules(c));
    out.extend(more);
    let ids: HashSet<&'static str> = out.iter().map(|v| v.id).collect();
    out.extend(error_rules(c, &ids));
    // Stable: equal scores keep the rule order above.
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sysscope_abi::{trace_flags, CallStamp, TraceEvent};

    use super::*;
    use crate::{
        cli::{measure::CpuUsage, profile::Profile, sink::EventSink},
        syscall_table,
    };

    const MS: u64 = 1_000_000;

    fn ctx(profile: &Profile, wall_ms: u64) -> Context<'_> {
        Context {
            profile,
            features: None,
            wall: Duration::from_millis(wall_ms),
            cpu: None,
            throttling: None,
        }
    }

    fn first(c: &Context) -> Option<&'static str> {
        diagnose(c).first().map(|v| v.id)
    }

    #[test]
    fn futex_dominance_and_amplification() {
        // strace's example: 98.7% futex, fast filesystem calls.
        let p = Profile::from_rows(&[
            ("futex", 254_012, 0, 376_000 * MS),
            ("openat", 289_450, 0, 3_470 * MS),
            ("read", 290_000, 0, 1_450 * MS),
        ]);
        let c = ctx(&p, 20_000);
        let v = diagnose(&c);
        assert_eq!(v[0].id, "futex-contention");
        assert!(v[0].title.contains("amplified"), "{}", v[0].title);
        assert!(
            v[0].evidence
                .iter()
                .any(|e| e.contains("18.8x the wall time")),
            "{:?}",
            v[0].evidence
        );
        // Below the share threshold: no futex verdict.
        let p = Profile::from_rows(&[("futex", 100, 0, 40 * MS), ("write", 100, 0, 60 * MS)]);
        assert!(futex_rule(&ctx(&p, 1000)).is_none());
        // Too few calls.
        let p = Profile::from_rows(&[("futex", 3, 0, 900 * MS)]);
        assert!(futex_rule(&ctx(&p, 1000)).is_none());
    }

    #[test]
    fn futex_with_slow_filesystem_blames_the_filesystem() {
        let p = Profile::from_rows(&[
            ("futex", 1000, 0, 9_000 * MS),
            ("openat", 1000, 0, 500 * MS),
            ("read", 1000, 0, 400 * MS),
        ]);
        let v = futex_rule(&ctx(&p, 3000)).unwrap();
        assert!(v.title.contains("slow I/O"), "{}", v.title);
    }

    #[test]
    fn metadata_storm_thresholds() {
        let p = Profile::from_rows(&[
            ("openat", 3000, 2900, 30 * MS),
            ("newfstatat", 2000, 0, 10 * MS),
            ("read", 100, 0, 5 * MS),
        ]);
        let c = ctx(&p, 100);
        assert_eq!(first(&c), Some("metadata-storm"));
        let v = metadata_rule(&c).unwrap();
        assert!(
            v.evidence.iter().any(|e| e.contains("fail")),
            "{:?}",
            v.evidence
        );
        // Failing opens are explained by the storm, not reported twice.
        assert!(diagnose(&c).iter().all(|v| v.id != "failing-calls"));
        // Below the call floor.
        let p = Profile::from_rows(&[("newfstatat", METADATA_MIN_CALLS - 1, 0, 100 * MS)]);
        assert!(metadata_rule(&ctx(&p, 100)).is_none());
    }

    #[test]
    fn churn_beats_metadata_when_files_are_opened_and_closed() {
        let p = Profile::from_rows(&[
            ("openat", 2000, 0, 8 * MS),
            ("close", 2000, 0, 2 * MS),
            ("write", 2000, 0, 6 * MS),
        ]);
        let c = ctx(&p, 50);
        assert_eq!(first(&c), Some("open-close-churn"));
        // Lots of I/O per open is not churn.
        let p = Profile::from_rows(&[
            ("openat", 600, 0, 8 * MS),
            ("close", 600, 0, 2 * MS),
            ("read", 6000, 0, 6 * MS),
        ]);
        assert!(churn_rule(&ctx(&p, 50)).is_none());
    }

    #[test]
    fn read_dominated() {
        let p = Profile::from_rows(&[("read", 1000, 0, 900 * MS), ("openat", 10, 0, MS)]);
        assert_eq!(first(&ctx(&p, 1000)), Some("read-dominated"));
        let p = Profile::from_rows(&[("read", 1000, 0, 40 * MS), ("write", 10, 0, 60 * MS)]);
        assert!(read_rule(&ctx(&p, 1000)).is_none());
    }

    /// The kind of read that takes most of the read time decides the verdict.
    #[test]
    fn read_verdicts_by_descriptor_kind() {
        let read = syscall_table::number("read").unwrap();
        let verdict = |classes: &[(FdClass, u64)]| {
            let mut p = Profile::from_rows(&[("openat", 10, 0, MS)]);
            for (fd, ms) in classes {
                let mut s = sysscope_abi::SyscallStats::ZERO;
                s.sum_ns = ms * MS;
                s.buckets[5] = 100;
                p.add_stats(1, read, *fd, &s);
            }
            read_rule(&ctx(&p, 1000)).unwrap()
        };
        let fuse = FdClass::of(fd_class::FILE, 0x6573_5546);
        let ext4 = FdClass::of(fd_class::FILE, 0xEF53);
        let pipe = FdClass::of(fd_class::PIPE, 0);
        let v = verdict(&[(fuse, 800), (pipe, 100)]);
        assert_eq!(v.id, "read-dominated-remote-fs");
        assert!(v.title.contains("fuse"), "{}", v.title);
        assert!(
            v.evidence.iter().any(|e| e.contains("88.9% file (fuse)")),
            "{:?}",
            v.evidence
        );
        assert_eq!(verdict(&[(pipe, 700), (ext4, 200)]).id, "waiting-on-pipe");
        let local = verdict(&[(ext4, 900)]);
        assert_eq!(local.id, "read-dominated");
        assert!(local.title.contains("ext4"));
        assert_eq!(
            verdict(&[(FdClass::of(fd_class::SOCKET, 0), 900)]).id,
            "waiting-on-socket"
        );
        // No kind over half of the read time: the general verdict.
        assert_eq!(
            verdict(&[(pipe, 400), (ext4, 400), (fuse, 100)]).id,
            "read-dominated"
        );
    }

    #[test]
    fn mmap_epoll_sleep_fsync() {
        let p = Profile::from_rows(&[
            ("mmap", 500, 0, 30 * MS),
            ("mprotect", 300, 0, 20 * MS),
            ("openat", 50, 0, 5 * MS),
        ]);
        assert_eq!(first(&ctx(&p, 100)), Some("mmap-heavy"));
        let p = Profile::from_rows(&[("mmap", 50, 0, 30 * MS)]);
        assert!(mmap_rule(&ctx(&p, 100)).is_none());

        let p = Profile::from_rows(&[("epoll_wait", 20, 0, 950 * MS), ("read", 10, 0, MS)]);
        let v = diagnose(&ctx(&p, 1000));
        assert_eq!(v[0].id, "epoll-idle");
        assert!((v[0].score - 0.5 * 950.0 / 951.0).abs() < 1e-9);

        let p = Profile::from_rows(&[("nanosleep", 100, 0, 500 * MS), ("getppid", 10, 0, MS)]);
        assert_eq!(first(&ctx(&p, 600)), Some("sleep-loop"));
        let p = Profile::from_rows(&[("nanosleep", SLEEP_MIN_CALLS - 1, 0, 500 * MS)]);
        assert!(sleep_rule(&ctx(&p, 600)).is_none());

        let p = Profile::from_rows(&[("write", 100, 0, 2 * MS), ("fsync", 100, 0, 300 * MS)]);
        assert_eq!(first(&ctx(&p, 400)), Some("fsync-per-write"));
        // One fsync per 10 writes is batching, not fsync per write.
        let p = Profile::from_rows(&[("write", 1000, 0, 20 * MS), ("fsync", 100, 0, 300 * MS)]);
        assert!(fsync_rule(&ctx(&p, 400)).is_none());
    }

    #[test]
    fn transfers_need_the_stream() {
        let p = Profile::from_rows(&[("read", 20_000, 0, 20 * MS), ("openat", 5, 0, MS / 10)]);
        let mut f = Features::default();
        f.bytes.insert(
            syscall_table::number("read").unwrap(),
            (20_000, 20_000 * 16),
        );
        let mut c = ctx(&p, 100);
        assert_eq!(first(&c), Some("read-dominated"));
        c.features = Some(&f);
        assert_eq!(first(&c), Some("tiny-transfers"));
        // Big reads are not tiny.
        let mut f = Features::default();
        f.bytes.insert(
            syscall_table::number("read").unwrap(),
            (20_000, 20_000 * 65536),
        );
        c.features = Some(&f);
        assert_eq!(first(&c), Some("read-dominated"));
        // Huge and slow reads.
        let p = Profile::from_rows(&[("read", 10, 0, 2_000 * MS)]);
        let mut f = Features::default();
        f.bytes.insert(
            syscall_table::number("read").unwrap(),
            (10, 10 * (256 << 20)),
        );
        let c = Context {
            features: Some(&f),
            ..ctx(&p, 2500)
        };
        assert!(diagnose(&c).iter().any(|v| v.id == "huge-transfers"));
    }

    #[test]
    fn failing_calls_and_cpu_bound() {
        let p = Profile::from_rows(&[("connect", 500, 500, 50 * MS), ("write", 10, 0, MS)]);
        let v = diagnose(&ctx(&p, 100));
        assert_eq!(v[0].id, "failing-calls");
        let p = Profile::from_rows(&[("getppid", 100, 0, MS)]);
        let c = Context {
            cpu: Some(CpuUsage {
                user: Duration::from_millis(900),
                system: Duration::from_millis(50),
            }),
            ..ctx(&p, 1000)
        };
        assert_eq!(first(&c), Some("cpu-bound"));
        assert!(first(&ctx(&p, 1000)).is_none());
    }

    #[test]
    fn child_waits_are_left_out_of_shares() {
        let p = Profile::from_rows(&[("wait4", 1, 0, 10_000 * MS), ("nanosleep", 20, 0, 100 * MS)]);
        let c = ctx(&p, 10_000);
        assert!((c.share(SLEEP) - 1.0).abs() < 1e-9);
        assert_eq!(first(&c), Some("sleep-loop"));
    }

    #[test]
    fn features_from_records() {
        let mut f = Features::default();
        let mk = |name: &str, tid: u32, a0: u64, ret: i64| TraceEvent {
            nr: syscall_table::number(name).unwrap(),
            call: CallStamp {
                tid,
                tgid: 1,
                ..CallStamp::default()
            },
            args: [a0, 0, 0, 0, 0, 0],
            ret,
            ..TraceEvent::default()
        };
        f.event(&mk("write", 5, 3, 100));
        f.event(&mk("fsync", 5, 3, 0));
        f.event(&mk("write", 6, 4, 10));
        f.event(&mk("fsync", 6, 9, 0));
        f.event(&mk("read", 6, 4, -11));
        assert_eq!((f.fsyncs, f.fsync_after_write), (2, 1));
        assert_eq!(f.transfer(WRITE), (2, 110));
        assert_eq!(f.transfer(READ), (0, 0));
        assert_eq!(f.threads.len(), 2);
        let mut open = mk("openat", 5, 0, -2);
        open.path[..4].copy_from_slice(b"/x/y");
        open.flags |= trace_flags::PATH;
        f.event(&open);
        f.event(&open);
        assert_eq!(Features::top(&f.failed_paths), Some(("/x/y", 2)));
    }
}
