//! The measured syscall profile of a target: calls, errors (by errno), time (and its split into
//! on CPU, waiting for a CPU and blocked) and latency buckets per syscall, read from the
//! syscall probes' maps (`SYSCALL_STATS`, `SYSCALL_STATES`, `SYSCALL_ERRORS`,
//! `PROCESS_EXITS`) through [`SyscallMaps`] and a [`crate::series::SeriesTable`] each, as the
//! syscall collector reads them.
//!
//! The probes count every process of the node; [`ProfileReader::poll`] keeps what matches
//! the target's filter and, like the exporter, reclaims the entries of exited processes once
//! read (their values stay in the totals), so a long run over many short-lived processes
//! never fills the kernel map. Drops the probes counted are read from `PROBE_COUNTERS`
//! through [`crate::kernel::counters`].

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use serde::Serialize;
use sysscope_abi::{counters, hist, ErrnoKey, FdClass, StateStats, SyscallKey, SyscallStats};

use super::CliError;
use crate::{
    kernel::counters::ProbeCounters,
    kernel::cumulative::Counters,
    kernel::syscalls::SyscallMaps,
    kernel::Probes,
    series::{Named, Series, SeriesTable},
    syscall_table,
};

/// Totals of one syscall.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SyscallRow {
    pub nr: u32,
    pub name: String,
    pub calls: u64,
    pub errors: u64,
    /// Wall time spent inside the call (entry to exit), summed over calls.
    pub total_ns: u64,
    /// Of `total_ns`: runnable but not running (waiting for a CPU), asleep (blocked), and off
    /// CPU with no wakeup seen (unknown); the rest was on CPU. All 0 when the split is off.
    pub wait_ns: u64,
    pub blocked_ns: u64,
    pub unknown_ns: u64,
    /// Calls that left their CPU at least once.
    pub switched: u64,
    /// Calls per kernel latency bucket (see `sysscope_abi::hist`).
    #[serde(skip)]
    pub buckets: [u64; hist::HIST_BUCKETS],
    /// Errors by errno name.
    pub errnos: BTreeMap<String, u64>,
}

impl SyscallRow {
    pub fn new(nr: u32) -> Self {
        Self {
            nr,
            name: syscall_table::label(nr).into_owned(),
            calls: 0,
            errors: 0,
            total_ns: 0,
            wait_ns: 0,
            blocked_ns: 0,
            unknown_ns: 0,
            switched: 0,
            buckets: [0; hist::HIST_BUCKETS],
            errnos: BTreeMap::new(),
        }
    }

    /// Time on CPU inside the call: the duration less the parts off CPU.
    pub fn on_cpu_ns(&self) -> u64 {
        self.total_ns
            .saturating_sub(self.wait_ns + self.blocked_ns + self.unknown_ns)
    }

    /// Mean duration in ns (0 without calls).
    pub fn avg_ns(&self) -> f64 {
        if self.calls == 0 {
            0.0
        } else {
            self.total_ns as f64 / self.calls as f64
        }
    }

    /// Upper bound (ns) of the bucket holding the `q` quantile of the calls, `None` without
    /// calls or when it lies in the unbounded last bucket.
    pub fn quantile_upper_ns(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (k, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return hist::upper_bound_ns(k);
            }
        }
        None
    }
}

/// The profile of a target: one row per syscall seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    pub rows: BTreeMap<u32, SyscallRow>,
    /// The same calls of the read and write families and the socket calls, split by what their
    /// descriptor was (the kernel's classification at entry); their sums are in `rows`.
    pub by_fd: BTreeMap<(u32, FdClass), SyscallRow>,
    /// Processes (tgids) seen making syscalls.
    pub processes: HashSet<u32>,
    /// Whether the probes split each call's time by state (the rows' parts off CPU are then
    /// measured, not absent).
    pub by_state: bool,
}

impl Profile {
    pub fn row_mut(&mut self, nr: u32) -> &mut SyscallRow {
        self.rows.entry(nr).or_insert_with(|| SyscallRow::new(nr))
    }

    /// Adds a stats delta of `nr` on a descriptor of class `fd`.
    pub fn add_stats(&mut self, tgid: u32, nr: u32, fd: FdClass, d: &SyscallStats) {
        let n = d.count();
        if n == 0 && d.sum_ns == 0 {
            return;
        }
        self.processes.insert(tgid);
        let add = |row: &mut SyscallRow| {
            row.calls += n;
            row.total_ns += d.sum_ns;
            for (t, b) in row.buckets.iter_mut().zip(d.buckets.iter()) {
                *t += *b;
            }
        };
        add(self.row_mut(nr));
        if fd != FdClass::NONE {
            add(self.fd_row_mut(nr, fd));
        }
    }

    /// Adds a delta of the parts off CPU of `nr` on a descriptor of class `fd`.
    pub fn add_states(&mut self, nr: u32, fd: FdClass, d: &StateStats) {
        let add = |row: &mut SyscallRow| {
            row.wait_ns += d.wait_ns;
            row.blocked_ns += d.blocked_ns;
            row.unknown_ns += d.unknown_ns;
            row.switched += d.switched;
        };
        add(self.row_mut(nr));
        if fd != FdClass::NONE {
            add(self.fd_row_mut(nr, fd));
        }
    }

    fn fd_row_mut(&mut self, nr: u32, fd: FdClass) -> &mut SyscallRow {
        self.by_fd
            .entry((nr, fd))
            .or_insert_with(|| SyscallRow::new(nr))
    }

    /// Adds `n` errors `errno` of `nr` on a descriptor of class `fd`.
    pub fn add_errors(&mut self, nr: u32, fd: FdClass, errno: u16, n: u64) {
        if n == 0 {
            return;
        }
        let errno = syscall_table::errno_label(errno).into_owned();
        let add = |row: &mut SyscallRow| {
            row.errors += n;
            *row.errnos.entry(errno.clone()).or_default() += n;
        };
        add(self.row_mut(nr));
        if fd != FdClass::NONE {
            add(self.fd_row_mut(nr, fd));
        }
    }

    pub fn total_calls(&self) -> u64 {
        self.rows.values().map(|r| r.calls).sum()
    }

    pub fn total_errors(&self) -> u64 {
        self.rows.values().map(|r| r.errors).sum()
    }

    pub fn total_ns(&self) -> u64 {
        self.rows.values().map(|r| r.total_ns).sum()
    }

    /// The row of syscall `name`, if it was seen.
    pub fn get(&self, name: &str) -> Option<&SyscallRow> {
        let nr = syscall_table::number(name)?;
        self.rows.get(&nr)
    }

    /// Builds a profile from (name, calls, errors, total ns) rows: synthetic profiles for tests.
    pub fn from_rows(rows: &[(&str, u64, u64, u64)]) -> Self {
        let mut p = Self::default();
        for &(name, calls, errors, total_ns) in rows {
            let nr = syscall_table::number(name).unwrap_or_else(|| panic!("syscall {name}"));
            let row = p.row_mut(nr);
            row.calls = calls;
            row.errors = errors;
            row.total_ns = total_ns;
            if calls > 0 {
                row.buckets[hist::bucket_index(total_ns / calls)] = calls;
            }
        }
        p.processes.insert(1);
        p
    }
}

/// What changed since the previous poll, per kernel key, for keys the filter kept.
#[derive(Debug, Default)]
pub(crate) struct Deltas {
    pub stats: Vec<(SyscallKey, SyscallStats)>,
    /// Parts off CPU, read after `stats`.
    pub states: Vec<(SyscallKey, StateStats)>,
    pub errors: Vec<(ErrnoKey, u64)>,
    /// Processes that exited since the previous poll, with their comm at exit.
    pub exited: Vec<(u32, [u8; 16])>,
}

/// Drops the probes counted while the tool ran (node-wide: the maps are shared by all).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProbeDrops {
    /// Syscalls not counted: the stats or errors map was full.
    pub map_full: u64,
    /// Calls whose entry time could not be kept: the thread map was full.
    pub threads_full: u64,
    /// Trace records lost: the ring buffer was full.
    pub trace_ring_buffer_full: u64,
    /// Block requests of the target not streamed: their ring buffer was full.
    pub block_ring_buffer_full: u64,
    /// Stretches off CPU of the target's calls not streamed: their ring buffer was full.
    pub off_cpu_ring_buffer_full: u64,
}

/// The drops of [`ProbeDrops`], from `PROBE_COUNTERS` (what the probes could not record).
#[derive(Debug)]
pub(crate) struct DropCounters {
    counters: ProbeCounters,
}

impl DropCounters {
    pub(crate) fn take(probes: &mut Probes) -> Result<Self, CliError> {
        Ok(Self {
            counters: ProbeCounters::take(probes)?,
        })
    }

    fn get(&self, index: u32) -> u64 {
        self.counters.get(index).unwrap_or(0)
    }

    pub(crate) fn read(&self) -> ProbeDrops {
        ProbeDrops {
            map_full: self.get(counters::SYSCALL_STATS_FULL)
                + self.get(counters::SYSCALL_ERRORS_FULL),
            threads_full: self.get(counters::SYSCALL_THREADS_FULL),
            trace_ring_buffer_full: self.get(counters::TRACE_RINGBUF_FULL),
            block_ring_buffer_full: self.get(counters::TRACE_BLOCK_RINGBUF_FULL),
            off_cpu_ring_buffer_full: self.get(counters::TRACE_STATE_RINGBUF_FULL),
        }
    }
}

/// Incremental reader of the syscall maps: each entry of the target is its own series, taken
/// out at every poll as what changed since the previous one.
pub(crate) struct ProfileReader {
    maps: SyscallMaps,
    stats: SeriesTable<SyscallKey, SyscallStats, (), SyscallKey>,
    /// The parts off CPU, read after `stats`.
    states: SeriesTable<SyscallKey, StateStats, (), SyscallKey>,
    errors: SeriesTable<ErrnoKey, u64, (), ErrnoKey>,
}

impl ProfileReader {
    /// Attaches the syscall probes and takes their maps.
    pub(crate) fn attach(probes: &mut Probes, tool: &'static str) -> Result<Self, CliError> {
        Ok(Self {
            maps: SyscallMaps::attach(probes, tool)?,
            stats: SeriesTable::named_once(),
            states: SeriesTable::named_once(),
            errors: SeriesTable::named_once(),
        })
    }

    /// Reads every entry; returns what changed for the entries `keep` accepts, and reclaims
    /// the entries of processes that have exited.
    pub(crate) fn poll(&mut self, keep: impl Fn(u64, u32) -> bool) -> Deltas {
        // Exits first: an entry read after its process's exit record holds its final values.
        let mut out = Deltas::default();
        for (tgid, exit) in self.maps.exits.read() {
            out.exited.push((tgid, exit.comm));
        }
        let exited: HashSet<u32> = out.exited.iter().map(|(t, _)| *t).collect();
        let now = Instant::now();
        let stats = self.stats.fold(
            self.maps.stats.snapshot(),
            now,
            |key, _| target(&keep, key.cgroup_id, key.tgid, *key),
            |key, _| exited.contains(&key.tgid),
        );
        // The entries are deleted in the kernel with their durations, never by this table.
        let states = self.states.fold(
            self.maps.stats.state_snapshot(),
            now,
            |key, _| target(&keep, key.cgroup_id, key.tgid, *key),
            |_, _| false,
        );
        let errors = self.errors.fold(
            self.maps.errors.read(),
            now,
            |key, _| target(&keep, key.cgroup_id, key.tgid, *key),
            |key, _| exited.contains(&key.tgid),
        );
        // Forgotten only once the kernel's entry is gone.
        let gone = self.maps.stats.remove(&stats.reclaim);
        self.states.reclaimed(gone.iter().copied(), states.complete);
        self.stats.reclaimed(gone, stats.complete);
        let gone = self.maps.errors.remove(&errors.reclaim);
        self.errors.reclaimed(gone, errors.complete);
        self.maps.exits.forget(&exited);
        out.stats = changed(self.stats.take_series());
        out.states = changed(self.states.take_series());
        out.errors = changed(self.errors.take_series());
        out
    }

    /// Polls and adds the target's deltas to `profile`; returns the calls added.
    pub(crate) fn poll_into(
        &mut self,
        profile: &mut Profile,
        keep: impl Fn(u64, u32) -> bool,
    ) -> u64 {
        let d = self.poll(keep);
        let mut calls = 0;
        for (key, s) in &d.stats {
            calls += s.count();
            profile.add_stats(key.tgid, key.nr, key.fd, s);
        }
        for (key, parts) in &d.states {
            profile.add_states(key.nr, key.fd, parts);
        }
        for (key, n) in &d.errors {
            profile.add_errors(key.nr as u32, key.fd, key.errno, *n);
        }
        calls
    }
}

/// An entry of the target counts as its own series; the others are not read.
fn target<K>(keep: impl Fn(u64, u32) -> bool, cgroup_id: u64, tgid: u32, key: K) -> Named<(), K> {
    if keep(cgroup_id, tgid) {
        Named::As((), key)
    } else {
        Named::Ignored
    }
}

/// The entries whose series grew.
fn changed<K, V: Counters>(series: HashMap<K, Series<V>>) -> Vec<(K, V)> {
    series
        .into_iter()
        .filter(|(_, s)| !s.sum.is_zero())
        .map(|(k, s)| (k, s.sum))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_accumulates_deltas_and_errors() {
        let mut p = Profile::default();
        let mut s = SyscallStats::ZERO;
        s.sum_ns = 3000;
        s.buckets[1] = 2;
        s.buckets[2] = 1;
        let openat = syscall_table::number("openat").unwrap();
        p.add_stats(10, openat, FdClass::NONE, &s);
        p.add_stats(11, openat, FdClass::NONE, &s);
        p.add_errors(openat, FdClass::NONE, 2, 4);
        assert!(p.by_fd.is_empty());
        let row = p.get("openat").unwrap();
        assert_eq!((row.calls, row.total_ns, row.errors), (6, 6000, 4));
        assert_eq!(row.errnos["ENOENT"], 4);
        assert_eq!(row.avg_ns(), 1000.0);
        assert_eq!(p.processes.len(), 2);
        // 4 of 6 calls in bucket 1 (< 2.048 µs): the median's bound is bucket 1's.
        assert_eq!(row.quantile_upper_ns(0.5), hist::upper_bound_ns(1));
        assert_eq!(row.quantile_upper_ns(1.0), hist::upper_bound_ns(2));
    }

    #[test]
    fn synthetic_profiles() {
        let p = Profile::from_rows(&[("read", 10, 1, 5000), ("futex", 2, 0, 1000)]);
        assert_eq!(p.total_calls(), 12);
        assert_eq!(p.total_ns(), 6000);
        assert_eq!(p.total_errors(), 1);
    }
}
