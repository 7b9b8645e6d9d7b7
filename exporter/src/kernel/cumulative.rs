//! Cumulative kernel maps read as changes: the one reader behind the syscall and block I/O
//! collectors and the command-line tools.
//!
//! The probes only ever add to their map values. Each read takes every entry of a map
//! ([`HashReader`]: in batches where the kernel allows), and a [`Tracker`] turns each value
//! into what changed since the last value the caller settled for that key. Entries are
//! reclaimed by deleting them in the kernel after their final values were read, and a key is
//! forgotten only once its kernel entry is confirmed gone: were the entry to survive a failed
//! delete, forgetting what was read of it would count its values twice. A read that could not
//! walk the whole map forgets nothing either.
//!
//! Maps: any hash map of counters (`SYSCALL_ERRORS`, `BLOCK_STATS`, `BLOCK_LATENCY`); the
//! syscall statistics table is read by `syscall_stats` and tracked here like the others.

use std::{collections::HashMap, hash::Hash, os::fd::AsFd, time::Instant};

use aya::{
    maps::{HashMap as BpfHashMap, IterableMap, MapData, MapError},
    Pod,
};
use sysscope_abi::{BlockStats, LatencyHistogram, StateStats};

use crate::{
    kernel::bpf_batch::{self, BatchError},
    util::error::Chain,
};

/// A map value the probes only add to.
pub(crate) trait Counters: Copy {
    const ZERO: Self;

    /// What this value adds to `prev`, an earlier read of the same key. If any part went
    /// backwards, the entry was deleted and created again in between: all of it is new.
    fn since(&self, prev: &Self) -> Self;

    fn is_zero(&self) -> bool;

    /// Adds `change` (sums of several entries, or of several reads, add up; wrapping, as the
    /// kernel's counters do).
    fn add(&mut self, change: &Self);

    /// Whether the value counts any event (a call, a request, an error): what makes a series
    /// active for its retention.
    fn has_events(&self) -> bool;
}

impl Counters for u64 {
    const ZERO: Self = 0;

    fn since(&self, prev: &Self) -> Self {
        if self < prev {
            *self
        } else {
            self - prev
        }
    }

    fn is_zero(&self) -> bool {
        *self == 0
    }

    fn add(&mut self, change: &Self) {
        *self = self.wrapping_add(*change);
    }

    fn has_events(&self) -> bool {
        *self > 0
    }
}

impl Counters for BlockStats {
    const ZERO: Self = BlockStats {
        bytes: 0,
        requests: 0,
    };

    fn since(&self, prev: &Self) -> Self {
        if self.bytes < prev.bytes || self.requests < prev.requests {
            return *self;
        }
        BlockStats {
            bytes: self.bytes - prev.bytes,
            requests: self.requests - prev.requests,
        }
    }

    fn is_zero(&self) -> bool {
        self.bytes == 0 && self.requests == 0
    }

    fn add(&mut self, change: &Self) {
        self.bytes = self.bytes.wrapping_add(change.bytes);
        self.requests = self.requests.wrapping_add(change.requests);
    }

    fn has_events(&self) -> bool {
        self.requests > 0
    }
}

impl Counters for LatencyHistogram {
    const ZERO: Self = LatencyHistogram::ZERO;

    fn since(&self, prev: &Self) -> Self {
        let went_back = self.sum_ns < prev.sum_ns
            || self
                .buckets
                .iter()
                .zip(prev.buckets.iter())
                .any(|(c, p)| c < p);
        if went_back {
            return *self;
        }
        let mut d = LatencyHistogram::ZERO;
        d.sum_ns = self.sum_ns - prev.sum_ns;
        for (i, b) in d.buckets.iter_mut().enumerate() {
            *b = self.buckets[i] - prev.buckets[i];
        }
        d
    }

    fn is_zero(&self) -> bool {
        self.sum_ns == 0 && self.buckets.iter().all(|b| *b == 0)
    }

    fn add(&mut self, change: &Self) {
        self.sum_ns = self.sum_ns.wrapping_add(change.sum_ns);
        for (t, b) in self.buckets.iter_mut().zip(change.buckets.iter()) {
            *t = t.wrapping_add(*b);
        }
    }

    fn has_events(&self) -> bool {
        self.count() > 0
    }
}

impl Counters for StateStats {
    const ZERO: Self = StateStats::ZERO;

    fn since(&self, prev: &Self) -> Self {
        let went_back = self.wait_ns < prev.wait_ns
            || self.blocked_ns < prev.blocked_ns
            || self.unknown_ns < prev.unknown_ns
            || self.switched < prev.switched;
        if went_back {
            return *self;
        }
        StateStats {
            wait_ns: self.wait_ns - prev.wait_ns,
            blocked_ns: self.blocked_ns - prev.blocked_ns,
            unknown_ns: self.unknown_ns - prev.unknown_ns,
            switched: self.switched - prev.switched,
        }
    }

    fn is_zero(&self) -> bool {
        *self == StateStats::ZERO
    }

    fn add(&mut self, change: &Self) {
        self.wait_ns = self.wait_ns.wrapping_add(change.wait_ns);
        self.blocked_ns = self.blocked_ns.wrapping_add(change.blocked_ns);
        self.unknown_ns = self.unknown_ns.wrapping_add(change.unknown_ns);
        self.switched = self.switched.wrapping_add(change.switched);
    }

    fn has_events(&self) -> bool {
        self.switched > 0
    }
}

/// Every entry of a map, and whether the walk reached them all.
#[derive(Debug)]
pub struct Snapshot<K, V> {
    pub entries: Vec<(K, V)>,
    /// False when the walk ended early: entries not in `entries` may still exist.
    pub(crate) complete: bool,
    /// When the read ended. Every cgroup and process its entries name existed before then: a
    /// walk of the cgroup hierarchy (or a read of a process name) made after it sees them if
    /// they still exist. One made after the read began but before it ended may not: a cgroup
    /// created meanwhile would be taken for gone.
    pub(crate) read_at: Instant,
}

impl<K, V> Snapshot<K, V> {
    /// A read that has just ended.
    pub(crate) fn ended(entries: Vec<(K, V)>, complete: bool) -> Self {
        Self {
            entries,
            complete,
            read_at: Instant::now(),
        }
    }
}

/// A hash map of the probes, read whole and reclaimed key by key.
pub(crate) struct HashReader<K, V> {
    map: BpfHashMap<MapData, K, V>,
    /// Whether the kernel supports batched lookups (cleared on the first refusal).
    batch: bool,
}

impl<K, V> std::fmt::Debug for HashReader<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashReader")
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl<K: Pod, V: Pod> HashReader<K, V> {
    pub(crate) fn new(map: BpfHashMap<MapData, K, V>) -> Self {
        Self { map, batch: true }
    }

    /// Every entry: in batches where the kernel allows, entry by entry otherwise.
    pub(crate) fn read(&mut self) -> Snapshot<K, V> {
        if self.batch {
            match bpf_batch::lookup_all::<K, V>(self.map.map().fd().as_fd()) {
                Ok(entries) => return Snapshot::ended(entries, true),
                Err(BatchError::Unsupported) => self.batch = false,
                Err(e) => {
                    tracing::debug!(error = %Chain(&e), "batched read failed; reading entry by entry")
                }
            }
        }
        let mut entries = Vec::new();
        let mut complete = true;
        for item in self.map.iter() {
            // Entries deleted between listing and lookup are skipped by the iterator; an
            // error ends the walk, and entries not reached must not be taken for gone.
            match item {
                Ok(entry) => entries.push(entry),
                Err(_) => {
                    complete = false;
                    break;
                }
            }
        }
        Snapshot::ended(entries, complete)
    }

    /// Deletes `keys` (whose final values the caller has read) and returns those that are
    /// gone from the kernel; a key whose delete failed keeps its values there and must be
    /// read again, not forgotten.
    pub(crate) fn remove(&mut self, keys: &[K]) -> Vec<K> {
        keys.iter()
            .filter(|key| deleted(self.map.remove(key)))
            .copied()
            .collect()
    }
}

/// Whether a kernel delete left the entry gone (deleted now, or not there at all).
pub(crate) fn deleted(result: Result<(), MapError>) -> bool {
    match result {
        Ok(()) | Err(MapError::KeyNotFound) => true,
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => true,
        Err(e) => {
            tracing::debug!(error = %Chain(&e), "could not delete a kernel entry; reading it again next time");
            false
        }
    }
}

/// What was last settled of one kernel entry, and the caller's own state for it (where its
/// values go).
#[derive(Debug)]
pub(crate) struct Tracked<V, S> {
    last: V,
    seen: u64,
    pub(crate) state: S,
}

impl<V: Counters, S> Tracked<V, S> {
    /// What `cur`, the entry's value now, adds to what was settled.
    pub(crate) fn change(&self, cur: &V) -> V {
        cur.since(&self.last)
    }

    /// Records that everything up to `cur` has been accounted for. An entry not settled
    /// keeps its change for the next read (e.g. while its labels cannot be known yet).
    pub(crate) fn settle(&mut self, cur: V) {
        self.last = cur;
    }
}

/// The kernel entries of one map as last read.
#[derive(Debug)]
pub(crate) struct Tracker<K, V, S> {
    entries: HashMap<K, Tracked<V, S>>,
    generation: u64,
}

impl<K, V, S> Default for Tracker<K, V, S> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            generation: 0,
        }
    }
}

impl<K: Eq + Hash + Copy, V: Counters, S> Tracker<K, V, S> {
    /// Starts a read of the map.
    pub(crate) fn begin(&mut self) {
        self.generation += 1;
    }

    /// The entry of `key`, seen in this read; `state` makes the caller's state of a key seen
    /// for the first time.
    pub(crate) fn observe(&mut self, key: K, state: impl FnOnce() -> S) -> &mut Tracked<V, S> {
        let generation = self.generation;
        let tracked = self.entries.entry(key).or_insert_with(|| Tracked {
            last: V::ZERO,
            seen: generation,
            state: state(),
        });
        tracked.seen = generation;
        tracked
    }

    /// The entry of `key`, if it is tracked.
    pub(crate) fn get(&self, key: &K) -> Option<&Tracked<V, S>> {
        self.entries.get(key)
    }

    /// Forgets keys whose kernel entries are confirmed gone ([`HashReader::remove`]).
    pub(crate) fn forget(&mut self, keys: impl IntoIterator<Item = K>) {
        for key in keys {
            self.entries.remove(&key);
        }
    }

    /// Ends a read: entries this read did not see were deleted in the kernel (none are
    /// expected) and are forgotten, unless the walk was incomplete and that cannot be told.
    pub(crate) fn end(&mut self, complete: bool) {
        if complete {
            let generation = self.generation;
            self.entries.retain(|_, e| e.seen == generation);
        } else {
            tracing::debug!("a map walk ended early; keeping the entries it did not reach");
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &S)> {
        self.entries.iter().map(|(k, t)| (k, &t.state))
    }

    pub(crate) fn states(&self) -> impl Iterator<Item = &S> {
        self.entries.values().map(|t| &t.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(sum_ns: u64, bucket: usize, n: u64) -> LatencyHistogram {
        let mut h = LatencyHistogram::ZERO;
        h.sum_ns = sum_ns;
        h.buckets[bucket] = n;
        h
    }

    #[test]
    fn changes_survive_recreated_entries() {
        let a = hist(100, 3, 5);
        let b = hist(150, 3, 7);
        let d = b.since(&a);
        assert_eq!((d.sum_ns, d.buckets[3]), (50, 2));
        let c = hist(10, 0, 1);
        assert_eq!(c.since(&b), c);
        assert_eq!(7u64.since(&3), 4);
        assert_eq!(2u64.since(&3), 2);
        let s = BlockStats {
            bytes: 4096,
            requests: 1,
        };
        let t = BlockStats {
            bytes: 8192,
            requests: 2,
        };
        assert_eq!(t.since(&s), s);
        assert_eq!(s.since(&t), s);
        assert!(LatencyHistogram::ZERO.is_zero() && !d.is_zero());
    }

    #[test]
    fn unsettled_changes_wait_and_unseen_entries_go_only_after_a_full_walk() {
        let mut tracker: Tracker<u32, u64, &str> = Tracker::default();
        tracker.begin();
        let e = tracker.observe(1, || "one");
        assert_eq!(e.change(&5), 5);
        // Not settled: the next read still sees all of it.
        tracker.begin();
        let e = tracker.observe(1, || unreachable!());
        assert_eq!(e.change(&8), 8);
        e.settle(8);
        tracker.observe(2, || "two").settle(1);
        tracker.end(true);
        assert_eq!(tracker.len(), 2);
        // Key 2 unseen in an incomplete walk: kept; in a complete one: forgotten.
        tracker.begin();
        assert_eq!(tracker.observe(1, || unreachable!()).change(&9), 1);
        tracker.end(false);
        assert_eq!(tracker.len(), 2);
        tracker.begin();
        tracker.observe(1, || unreachable!());
        tracker.end(true);
        assert_eq!(tracker.keys().copied().collect::<Vec<_>>(), [1]);
        tracker.forget([1]);
        assert!(tracker.is_empty());
    }
}
