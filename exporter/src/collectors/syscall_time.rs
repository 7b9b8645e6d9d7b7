//! The syscall collector's split of each series' time by state:
//! `sysscope_syscall_time_seconds_total{state="on_cpu|wait_cpu|blocked|unknown"}`.
//!
//! Maps read: `SYSCALL_STATES` (the parts off CPU of switched-out calls, by slot copy),
//! through [`crate::kernel::syscalls::SyscallStatsTable::state_snapshot`], right after the
//! durations of `SYSCALL_STATS`. Probes: `sched_switch` and `sched_wakeup`
//! (`ebpf/probes/src/sched.rs`), which stamp the transitions, and `sys_exit`, which adds them.
//!
//! The parts go through a [`SeriesTable`] of their own whose entries are named with the series
//! their durations count in (label control and the budget already applied there), so a dropped
//! label or a folded series merges the parts exactly as it merges the durations. The kernel
//! keeps only the parts off CPU (waiting, blocked, unknown), so a call that never left its CPU
//! costs nothing more; the on-CPU part of a series is its duration sum less its parts. The
//! probes add a call's parts before its duration and the parts are read after the durations,
//! so that difference can only lag behind the truth (by the parts of calls whose durations
//! were not added yet when `SYSCALL_STATS` was read): it is exported as the largest value
//! seen, which never goes down and is exact as soon as the calls read have all been added,
//! when the four parts add up to `sysscope_syscall_duration_seconds_sum` to the nanosecond.

use std::{collections::HashMap, hash::Hash, time::Instant};

use sysscope_abi::{StateStats, SyscallKey};

use crate::{
    kernel::cumulative::Snapshot,
    series::{Named, SeriesTable},
};

/// The exported states, in export order.
pub(crate) const STATES: [&str; 4] = ["on_cpu", "wait_cpu", "blocked", "unknown"];

/// The time of one series by state, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StateTotals {
    pub(crate) on_cpu_ns: u64,
    pub(crate) wait_ns: u64,
    pub(crate) blocked_ns: u64,
    pub(crate) unknown_ns: u64,
}

impl StateTotals {
    /// The values in [`STATES`] order, in nanoseconds.
    pub(crate) fn by_state(&self) -> [u64; 4] {
        [
            self.on_cpu_ns,
            self.wait_ns,
            self.blocked_ns,
            self.unknown_ns,
        ]
    }
}

/// The parts off CPU of every kernel entry, summed into the series `S` their durations go
/// to, and the on-CPU time each series derives from them.
pub(crate) struct SyscallTime<S> {
    parts: SeriesTable<SyscallKey, StateStats, (), S>,
    /// The on-CPU time of each series as last settled (never goes down).
    on_cpu: HashMap<S, u64>,
}

impl<S> std::fmt::Debug for SyscallTime<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyscallTime")
            .field("parts", &self.parts)
            .field("series", &self.on_cpu.len())
            .finish()
    }
}

impl<S: Clone + Eq + Hash> Default for SyscallTime<S> {
    fn default() -> Self {
        Self {
            // An entry follows its durations' series whenever its parts change (a process
            // renamed by exec counts under its new name from then on, durations and parts).
            parts: SeriesTable::following_renames(),
            on_cpu: HashMap::new(),
        }
    }
}

impl<S: Clone + Eq + Hash> SyscallTime<S> {
    /// Adds what changed in each entry's parts to the series `route` gives its key (the
    /// series its durations count in); an entry `route` cannot place yet (its durations wait
    /// too) keeps its change for the next read. Returns whether the read saw every entry.
    pub(crate) fn read(
        &mut self,
        snapshot: Snapshot<SyscallKey, StateStats>,
        now: Instant,
        route: impl Fn(&SyscallKey) -> Option<S>,
    ) -> bool {
        // Entries are deleted in the kernel with their durations (`SyscallStatsTable::remove`
        // zeroes both), never by this table.
        let folded = self.parts.fold(
            snapshot,
            now,
            |key, _| match route(key) {
                Some(series) => Named::As((), series),
                None => Named::NotYet,
            },
            |_, _| false,
        );
        folded.complete
    }

    /// Forgets the entries whose kernel values are `gone` (reclaimed after their last read)
    /// and, after a `complete` read, those it did not see.
    pub(crate) fn reclaimed(&mut self, gone: impl IntoIterator<Item = SyscallKey>, complete: bool) {
        self.parts.reclaimed(gone, complete);
    }

    /// Brings the on-CPU time of each series (`series`: each with its duration sum) up to its
    /// duration less its parts off CPU, never down; drops the series not listed.
    pub(crate) fn settle<'a>(&mut self, series: impl IntoIterator<Item = (&'a S, u64)>)
    where
        S: 'a,
    {
        let mut on_cpu = HashMap::with_capacity(self.on_cpu.len());
        for (key, sum_ns) in series {
            let off = self
                .parts
                .get(key)
                .map_or(0, |parts| parts.sum.off_cpu_ns());
            let settled = self.on_cpu.get(key).copied().unwrap_or(0);
            on_cpu.insert(key.clone(), settled.max(sum_ns.saturating_sub(off)));
        }
        self.parts.retain_series(|k| on_cpu.contains_key(k));
        self.on_cpu = on_cpu;
    }

    /// The time of series `key` by state (zero for a series none of whose calls was read).
    pub(crate) fn get(&self, key: &S) -> StateTotals {
        let parts = self.parts.get(key).map(|p| p.sum).unwrap_or_default();
        StateTotals {
            on_cpu_ns: self.on_cpu.get(key).copied().unwrap_or(0),
            wait_ns: parts.wait_ns,
            blocked_ns: parts.blocked_ns,
            unknown_ns: parts.unknown_ns,
        }
    }

    /// Kernel entries tracked.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> usize {
        self.parts.keys().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32) -> SyscallKey {
        SyscallKey {
            cgroup_id: 1,
            tgid,
            nr: 0,
            fd: sysscope_abi::FdClass::NONE,
        }
    }

    fn parts(wait_ns: u64, blocked_ns: u64, unknown_ns: u64) -> StateStats {
        StateStats {
            wait_ns,
            blocked_ns,
            unknown_ns,
            switched: 1,
        }
    }

    fn read(time: &mut SyscallTime<&'static str>, entries: Vec<(SyscallKey, StateStats)>) {
        let complete = time.read(Snapshot::ended(entries, true), Instant::now(), |k| {
            (k.tgid != 99).then_some(if k.tgid == 1 { "a" } else { "b" })
        });
        time.reclaimed([], complete);
    }

    #[test]
    fn parts_follow_the_durations_and_on_cpu_never_goes_down() {
        let mut time = SyscallTime::default();
        // Series "a" and "b"; tgid 99 cannot be placed yet.
        read(
            &mut time,
            vec![
                (key(1), parts(10, 100, 0)),
                (key(2), parts(1, 0, 5)),
                (key(99), parts(7, 7, 7)),
            ],
        );
        time.settle([(&"a", 1000), (&"b", 6)]);
        let a = time.get(&"a");
        assert_eq!(
            (a.wait_ns, a.blocked_ns, a.unknown_ns, a.on_cpu_ns),
            (10, 100, 0, 890)
        );
        assert_eq!(time.get(&"b").by_state(), [0, 1, 0, 5]);
        // A read that holds parts of a call whose duration it lacks: on CPU holds still, and
        // catches up, exactly, once the duration is read.
        read(
            &mut time,
            vec![
                (key(1), parts(10, 600, 0)),
                (key(2), parts(1, 0, 5)),
                (key(99), parts(7, 7, 7)),
            ],
        );
        time.settle([(&"a", 1000), (&"b", 6)]);
        assert_eq!(time.get(&"a").on_cpu_ns, 890);
        time.settle([(&"a", 1520), (&"b", 6)]);
        let a = time.get(&"a");
        assert_eq!(a.by_state(), [910, 10, 600, 0]);
        assert_eq!(a.by_state().iter().sum::<u64>(), 1520);
        // The deferred entry is placed once it can be: all of its change arrives then.
        let complete = time.read(
            Snapshot::ended(vec![(key(99), parts(7, 7, 7))], true),
            Instant::now(),
            |_| Some("a"),
        );
        time.reclaimed([], complete);
        time.settle([(&"a", 1520 + 21 + 9)]);
        assert_eq!(time.get(&"a").by_state(), [919, 17, 607, 7]);
        // Series not listed are dropped; a complete read forgets the entries it did not see.
        assert_eq!(time.get(&"b"), StateTotals::default());
        assert_eq!(time.entries(), 1);
        time.reclaimed([key(99)], true);
        assert_eq!(time.entries(), 0);
    }

    /// Entries routed to one series (label control dropped what told them apart) add up
    /// exactly there, parts and on-CPU time alike.
    #[test]
    fn entries_merged_into_one_series_add_up() {
        let mut time = SyscallTime::default();
        let complete = time.read(
            Snapshot::ended(
                vec![
                    (key(1), parts(10, 100, 0)),
                    (key(2), parts(20, 0, 3)),
                    (key(3), StateStats::ZERO),
                ],
                true,
            ),
            Instant::now(),
            |_| Some("merged"),
        );
        time.reclaimed([], complete);
        time.settle([(&"merged", 1000)]);
        assert_eq!(time.get(&"merged").by_state(), [867, 30, 100, 3]);
    }
}
