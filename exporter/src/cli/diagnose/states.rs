//! The verdicts on where calls spend their time: waiting for a CPU (and whether the cgroup's
//! CPU quota throttles it) or blocked on a filesystem. They read the split of each syscall's
//! time the probes keep (`SYSCALL_STATES`, see `ebpf/probes/src/sched.rs`) and the cgroup's
//! `cpu.stat` over the run; every threshold is a named constant, documented in docs/cli.md.

use sysscope_abi::fd_class;

use super::{features::*, rules::*};
use crate::cli::{profile::SyscallRow, render::units::secs};

/// A group of calls "waits for a CPU" when at least this share of its time was spent
/// runnable but not running...
pub(crate) const WAIT_DOMINANT_SHARE: f64 = 0.50;
/// ...and "is blocked" when at least this share was spent asleep.
pub(crate) const BLOCKED_DOMINANT_SHARE: f64 = 0.50;
/// The group must take at least this share of syscall time.
pub(crate) const STATE_MIN_SHARE: f64 = 0.25;
/// All syscalls together "wait for a CPU" when this share of syscall time was waiting.
pub(crate) const ALL_WAIT_MIN_SHARE: f64 = 0.25;
/// The cgroup counts as throttled when at least this share of its enforcement periods were.
pub(crate) const THROTTLED_MIN_RATIO: f64 = 0.05;
/// Score of the throttling verdict per unit of throttled ratio (a cause outside the calls).
pub(crate) const THROTTLE_WEIGHT: f64 = 0.5;

/// Every verdict of this file that holds (the generic "syscalls wait for a CPU" only when the
/// reads' own does not).
pub(crate) fn verdicts(c: &Context) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = [reads_wait_rule(c), reads_blocked_rule(c), throttled_rule(c)]
        .into_iter()
        .flatten()
        .collect();
    if !out.iter().any(|v| v.id == "reads-wait-for-cpu") {
        out.extend(calls_wait_rule(c));
    }
    out
}

/// Parts of a group's time: (total, on CPU, waiting, blocked, unknown) in ns.
fn split(rows: impl Iterator<Item = impl std::ops::Deref<Target = SyscallRow>>) -> [u64; 5] {
    rows.fold([0; 5], |[t, o, w, b, u], r| {
        [
            t + r.total_ns,
            o + r.on_cpu_ns(),
            w + r.wait_ns,
            b + r.blocked_ns,
            u + r.unknown_ns,
        ]
    })
}

fn group_split(c: &Context, group: &[&str]) -> [u64; 5] {
    split(
        c.profile
            .rows
            .values()
            .filter(|r| group.contains(&r.name.as_str())),
    )
}

fn fraction(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 / total as f64
    }
}

/// "on CPU 12.0%, waiting for a CPU 70.0%, blocked 18.0% of 2.1 s" (unknown only if any).
fn describe_split([total, on, wait, blocked, unknown]: [u64; 5]) -> String {
    let mut s = format!(
        "on CPU {}, waiting for a CPU {}, blocked {}",
        pct(fraction(on, total)),
        pct(fraction(wait, total)),
        pct(fraction(blocked, total))
    );
    if unknown > 0 {
        s.push_str(&format!(", unknown {}", pct(fraction(unknown, total))));
    }
    s.push_str(&format!(" of {}", secs(total as f64)));
    s
}

/// The cgroup's throttling over the run, as an evidence line; `None` without a quota.
fn throttling_line(c: &Context) -> Option<String> {
    let t = c.throttling?;
    (t.periods > 0).then(|| {
        format!(
            "the cgroup was throttled in {} of {} CPU quota periods ({}), {} in all (cpu.stat)",
            t.throttled_periods,
            t.periods,
            pct(t.throttled_ratio()),
            secs(t.throttled.as_nanos() as f64)
        )
    })
}

fn throttled(c: &Context) -> bool {
    c.throttling
        .is_some_and(|t| t.throttled_ratio() >= THROTTLED_MIN_RATIO)
}

fn wait_fix(c: &Context) -> String {
    if throttled(c) {
        "The cgroup's CPU quota (cpu.max; a pod's CPU limit) stops it: raise the limit, or run \
         fewer threads or workers so the quota lasts the period (a quota is shared by all the \
         threads of the cgroup)."
            .to_string()
    } else {
        "The CPUs are busy with other work: run fewer threads or processes than CPUs (data \
         loader workers, thread pools), give this work its own CPUs (cpuset, a guaranteed \
         pod), or raise its priority; more I/O bandwidth would not help."
            .to_string()
    }
}

/// "reads wait for a CPU": most of the read time was runnable but not running.
pub(super) fn reads_wait_rule(c: &Context) -> Option<Verdict> {
    if !c.profile.by_state {
        return None;
    }
    let parts = group_split(c, READ);
    let share = c.share(READ);
    let waiting = fraction(parts[2], parts[0]);
    if share < STATE_MIN_SHARE || waiting < WAIT_DOMINANT_SHARE {
        return None;
    }
    let mut evidence = vec![format!(
        "reads take {} of syscall time: {}",
        pct(share),
        describe_split(parts)
    )];
    evidence.extend(throttling_line(c));
    let title = match c.throttling.filter(|_| throttled(c)) {
        Some(t) => format!(
            "reads wait for a CPU: the cgroup is throttled {} of the time (cpu.max)",
            pct(t.throttled_ratio())
        ),
        None => format!(
            "reads wait for a CPU: {} of their time runnable but not running (the CPUs are busy)",
            pct(waiting)
        ),
    };
    Some(Verdict {
        id: "reads-wait-for-cpu",
        title,
        score: share * SPECIFIC_WEIGHT,
        evidence,
        fix: wait_fix(c),
    })
}

/// "reads are blocked on <fs>": most of the read time was asleep, mostly on files of one
/// filesystem. (Reads blocked on pipes and sockets are the read verdict's own.)
pub(super) fn reads_blocked_rule(c: &Context) -> Option<Verdict> {
    if !c.profile.by_state {
        return None;
    }
    let parts = group_split(c, READ);
    let share = c.share(READ);
    if share < STATE_MIN_SHARE || fraction(parts[3], parts[0]) < BLOCKED_DOMINANT_SHARE {
        return None;
    }
    let by = read_time_by_descriptor(c, |r| r.blocked_ns);
    let (fd, ns) = by
        .first()
        .filter(|(fd, ns)| fd.kind == fd_class::FILE && ns * 2 > parts[3])?;
    let fs = crate::kernel::fd_class::fs_name(fd.fs_magic);
    let remote = REMOTE_FILESYSTEMS.contains(&fs.as_ref());
    let evidence = vec![
        format!(
            "reads take {} of syscall time: {}",
            pct(share),
            describe_split(parts)
        ),
        format!(
            "{} of the time reads were blocked was on {}",
            pct(fraction(*ns, parts[3])),
            describe_fd(fd)
        ),
    ];
    let fix = if remote {
        "The reads sleep waiting for a network or FUSE filesystem: stage the data on local \
         disk, read fewer and larger files, keep more reads in flight (more workers, \
         prefetching), raise the mount's readahead and read size."
    } else {
        "The reads sleep waiting for the disk: the data is not in the page cache. Read \
         sequentially in larger blocks, keep more reads in flight (more workers, io_uring, \
         prefetching), warm the cache or give the node more memory, or use faster storage; \
         more CPU would not help."
    };
    Some(Verdict {
        id: "reads-blocked-on-fs",
        title: format!(
            "reads are blocked on {fs}: {} of read time asleep waiting for the filesystem",
            pct(fraction(parts[3], parts[0]))
        ),
        score: share * SPECIFIC_WEIGHT,
        evidence,
        fix: fix.to_string(),
    })
}

/// "syscalls wait for a CPU": a large share of all syscall time was runnable but not
/// running, whichever calls it was in (reads have their own verdict).
pub(super) fn calls_wait_rule(c: &Context) -> Option<Verdict> {
    if !c.profile.by_state {
        return None;
    }
    let rows = || {
        c.profile
            .rows
            .values()
            .filter(|r| !WAIT_CHILD.contains(&r.name.as_str()))
    };
    let parts = split(rows());
    let waiting = fraction(parts[2], parts[0]);
    if waiting < ALL_WAIT_MIN_SHARE {
        return None;
    }
    let mut most: Vec<_> = rows().filter(|r| r.wait_ns > 0).collect();
    most.sort_by_key(|r| std::cmp::Reverse(r.wait_ns));
    let mut evidence = vec![format!("syscall time: {}", describe_split(parts))];
    evidence.push(format!(
        "waiting for a CPU in: {}",
        most.iter()
            .take(4)
            .map(|r| format!("{} {}", r.name, secs(r.wait_ns as f64)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    evidence.extend(throttling_line(c));
    let title = match c.throttling.filter(|_| throttled(c)) {
        Some(t) => format!(
            "syscalls wait for a CPU: the cgroup is throttled {} of the time (cpu.max)",
            pct(t.throttled_ratio())
        ),
        None => format!(
            "syscalls wait for a CPU: {} of their time runnable but not running",
            pct(waiting)
        ),
    };
    Some(Verdict {
        id: "waiting-for-cpu",
        title,
        score: waiting,
        evidence,
        fix: wait_fix(c),
    })
}

/// "the cgroup is throttled": its CPU quota stopped it in many periods. On kernels that hold
/// throttled tasks on their way back to user space (Linux 6.18+), that time lies between
/// calls, not in them: said when the calls show little waiting.
pub(super) fn throttled_rule(c: &Context) -> Option<Verdict> {
    let t = c.throttling?;
    if !throttled(c) {
        return None;
    }
    let mut evidence: Vec<String> = throttling_line(c).into_iter().collect();
    let parts = split(c.profile.rows.values());
    if c.profile.by_state && parts[0] > 0 {
        evidence.push(format!("syscall time: {}", describe_split(parts)));
        if fraction(parts[2], parts[0]) < ALL_WAIT_MIN_SHARE {
            evidence.push(
                "the calls themselves waited little: this kernel holds a throttled task on its \
                 way back to user space, so the throttled time lies between calls (in the \
                 program's own code), not inside them"
                    .to_string(),
            );
        }
    }
    Some(Verdict {
        id: "cpu-throttled",
        title: format!(
            "the cgroup is throttled {} of the time by its CPU quota (cpu.max)",
            pct(t.throttled_ratio())
        ),
        score: t.throttled_ratio() * THROTTLE_WEIGHT,
        evidence,
        fix: wait_fix(c),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sysscope_abi::{FdClass, StateStats};

    use super::*;
    use crate::{cli::profile::Profile, metadata::cpu_bandwidth::CpuBandwidth, syscall_table};

    const MS: u64 = 1_000_000;

    fn with_parts(p: &mut Profile, name: &str, fd: FdClass, wait_ns: u64, blocked_ns: u64) {
        p.by_state = true;
        let nr = syscall_table::number(name).unwrap();
        if fd != FdClass::NONE {
            // The split rows mirror the main row, as the probes' keys do.
            let row = p.rows[&nr].clone();
            p.by_fd.insert((nr, fd), row);
        }
        p.add_states(
            nr,
            fd,
            &StateStats {
                wait_ns,
                blocked_ns,
                unknown_ns: 0,
                switched: 1,
            },
        );
    }

    fn ctx(p: &Profile, throttling: Option<CpuBandwidth>) -> Context<'_> {
        Context {
            profile: p,
            features: None,
            wall: Duration::from_secs(10),
            cpu: None,
            throttling,
        }
    }

    fn quota(periods: u64, throttled: u64) -> CpuBandwidth {
        CpuBandwidth {
            periods,
            throttled_periods: throttled,
            throttled: Duration::from_millis(throttled * 90),
        }
    }

    #[test]
    fn reads_waiting_for_a_throttled_cpu() {
        let mut p = Profile::from_rows(&[("read", 100, 0, 1000 * MS), ("openat", 10, 0, 100 * MS)]);
        with_parts(&mut p, "read", FdClass::NONE, 700 * MS, 100 * MS);
        let v = reads_wait_rule(&ctx(&p, Some(quota(100, 40)))).unwrap();
        assert_eq!(
            v.title,
            "reads wait for a CPU: the cgroup is throttled 40.0% of the time (cpu.max)"
        );
        assert!(
            v.evidence[0].contains("waiting for a CPU 70.0%"),
            "{:?}",
            v.evidence
        );
        assert!(v.evidence[1].contains("40 of 100"), "{:?}", v.evidence);
        assert!(v.fix.contains("cpu.max"));
        // Without a quota the busy CPUs are the cause.
        let v = reads_wait_rule(&ctx(&p, None)).unwrap();
        assert!(v.title.contains("the CPUs are busy"), "{}", v.title);
        // The same numbers when the probes did not split the time: no verdict.
        p.by_state = false;
        assert!(reads_wait_rule(&ctx(&p, None)).is_none());
    }

    #[test]
    fn reads_blocked_on_a_filesystem() {
        let nfs = FdClass::of(fd_class::FILE, 0x6969);
        let mut p = Profile::from_rows(&[("read", 100, 0, 1000 * MS)]);
        with_parts(&mut p, "read", nfs, 50 * MS, 900 * MS);
        let v = reads_blocked_rule(&ctx(&p, None)).unwrap();
        assert_eq!(v.id, "reads-blocked-on-fs");
        assert_eq!(
            v.title,
            "reads are blocked on nfs: 90.0% of read time asleep waiting for the filesystem"
        );
        assert!(v.fix.contains("network"));
        assert!(reads_wait_rule(&ctx(&p, None)).is_none());
        // Blocked on a pipe: the read verdict's own, not this one.
        let mut p = Profile::from_rows(&[("read", 100, 0, 1000 * MS)]);
        with_parts(&mut p, "read", FdClass::of(fd_class::PIPE, 0), 0, 900 * MS);
        assert!(reads_blocked_rule(&ctx(&p, None)).is_none());
    }

    #[test]
    fn throttling_outside_the_calls_is_said() {
        let mut p = Profile::from_rows(&[("read", 100, 0, 1000 * MS)]);
        with_parts(&mut p, "read", FdClass::NONE, 10 * MS, 900 * MS);
        let v = throttled_rule(&ctx(&p, Some(quota(50, 30)))).unwrap();
        assert_eq!(v.id, "cpu-throttled");
        assert!((v.score - 0.6 * THROTTLE_WEIGHT).abs() < 1e-9);
        assert!(
            v.evidence.iter().any(|e| e.contains("between calls")),
            "{:?}",
            v.evidence
        );
        assert!(throttled_rule(&ctx(&p, Some(quota(50, 1)))).is_none());
        assert!(throttled_rule(&ctx(&p, None)).is_none());
        assert!(calls_wait_rule(&ctx(&p, None)).is_none());
        // Calls that wait a lot: the generic verdict names them.
        let mut p = Profile::from_rows(&[("read", 100, 0, 1000 * MS), ("futex", 9, 0, 500 * MS)]);
        with_parts(&mut p, "futex", FdClass::NONE, 400 * MS, 0);
        let v = calls_wait_rule(&ctx(&p, None)).unwrap();
        assert!(
            v.evidence[1].contains("futex 400.00 ms"),
            "{:?}",
            v.evidence
        );
        assert!(v.title.contains("26.7%"), "{}", v.title);
    }
}
