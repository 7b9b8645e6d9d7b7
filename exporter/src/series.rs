//! Label sets of per-workload series, the cardinality budget, and the one table that turns a
//! cumulative kernel map into labelled series.
//!
//! A *workload* is what a series is labelled with: cgroup (with the Kubernetes identity derived
//! from it), process name and, when enabled, pid. Kernel entries are keyed by (cgroup id, tgid):
//! many of them fold into one workload, so series are sums that stay monotonic as processes come
//! and go. The [`Budget`] bounds how many series exist: a label set that does not fit is routed,
//! once and for good, to `comm="other"` in its cgroup, then to `cgroup="other"`, and counted.
//! Routing is sticky so a counter never moves between series.
//!
//! Label control (`[labels]`: `cgroup`, `comm`, `syscalls`, `syscall_families`) reduces a
//! label set before the budget routes it ([`LabelControl`]): the labels it drops are gone from
//! the key, so every entry that differed only by them is routed to one series and their values
//! add up there exactly (counts, sums and buckets), as folding does; no value is picked.
//!
//! A [`SeriesTable`] is that path for one map (the syscall statistics and errors, block bytes
//! and latency, and the command-line tools' totals): each read is *observed* entry by entry
//! ([`crate::kernel::cumulative`] gives each entry's change since what was settled), an entry is
//! *named* (its label set, folded by the budget into the series it counts in) when first seen,
//! or again whenever it changes for tables that follow renames, its change is added to its
//! series and *settled*, the entries whose processes or cgroups are gone are handed back for
//! deletion, and series no entry feeds are *retired* once idle for the retention. The ordering
//! rules live here once: a change is settled only once its entry is named (one that cannot be
//! named yet keeps it for the next read, and is not reclaimed), and an entry is forgotten only
//! once its kernel entry is confirmed deleted. A series is keyed by its label set only, never by
//! a kernel key, and its values are sums: any number of entries may be routed to one series
//! (a coarser label set merges them exactly), and an entry routed elsewhere leaves what it added.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    hash::Hash,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::{
    config::{CgroupLabel, LabelsConfig},
    kernel::cumulative::{Counters, Snapshot, Tracker},
    syscall_table,
};

/// Label value of folded series.
pub(crate) const OTHER: &str = "other";

/// Extra cgroup labels on Kubernetes nodes (see `metadata::kubernetes`): the pod UID and the
/// container id parsed from the cgroup path, and the pod watch's names.
pub(crate) const POD_UID: &str = "pod_uid";
pub(crate) const CONTAINER_ID: &str = "container_id";
pub(crate) const NAMESPACE: &str = "namespace";
pub(crate) const POD: &str = "pod";
pub(crate) const CONTAINER: &str = "container";

/// Labels derived from a cgroup: its path plus, on Kubernetes, pod and container identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupLabels {
    pub(crate) path: Arc<str>,
    /// Extra labels in export order, e.g. `("pod_uid", "...")`, `("container_id", "...")`.
    pub(crate) extra: Vec<(&'static str, Arc<str>)>,
}

impl CgroupLabels {
    pub fn plain(path: impl Into<Arc<str>>) -> Self {
        Self {
            path: path.into(),
            extra: Vec::new(),
        }
    }

    pub(crate) fn other() -> Self {
        Self::plain(OTHER)
    }

    /// The value of extra label `name` (e.g. `pod_uid`, `container_id`), if present.
    #[cfg(test)]
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.extra
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| &**v)
    }
}

/// What a per-process series is labelled with. An empty cgroup path or comm is a label that
/// label control dropped, and is not exported (a cgroup path is never empty: the root is `/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Workload {
    pub cgroup: Arc<CgroupLabels>,
    pub comm: Arc<str>,
    pub pid: Option<u32>,
}

impl Workload {
    /// Appends `cgroup`, the cgroup's extra labels, `comm` and `pid` to `out`.
    pub(crate) fn push_labels<'a>(&'a self, out: &mut Vec<(&'static str, Cow<'a, str>)>) {
        if !self.cgroup.path.is_empty() {
            out.push(("cgroup", Cow::Borrowed(&self.cgroup.path)));
        }
        for (k, v) in &self.cgroup.extra {
            out.push((k, Cow::Borrowed(v)));
        }
        if !self.comm.is_empty() {
            out.push(("comm", Cow::Borrowed(&self.comm)));
        }
        if let Some(pid) = self.pid {
            out.push(("pid", Cow::Owned(pid.to_string())));
        }
    }

    /// The same cgroup with the process folded away (a dropped `comm` stays dropped).
    pub fn fold_comm(&self) -> Self {
        Self {
            cgroup: self.cgroup.clone(),
            comm: if self.comm.is_empty() {
                self.comm.clone()
            } else {
                Arc::from(OTHER)
            },
            pid: None,
        }
    }

    /// Everything folded away.
    pub fn fold_all() -> Self {
        Self {
            cgroup: Arc::new(CgroupLabels::other()),
            comm: Arc::from(OTHER),
            pid: None,
        }
    }
}

/// Label control (config `[labels]`): what a label set keeps before the budget routes it.
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelControl {
    /// Drop `cgroup` and `container_id` where the pod and container are named.
    cgroup_unless_pod_known: bool,
    drop_comm: bool,
    /// Syscall numbers exported by name (`None`: all).
    syscalls: Option<HashSet<u32>>,
}

impl LabelControl {
    pub(crate) fn new(labels: &LabelsConfig) -> Self {
        let mut names: Vec<&str> = labels.syscalls.iter().map(String::as_str).collect();
        for family in &labels.syscall_families {
            names.extend(syscall_table::family(family).unwrap_or_default());
        }
        Self {
            cgroup_unless_pod_known: labels.cgroup == CgroupLabel::UnlessPodKnown,
            drop_comm: !labels.comm,
            // Names this architecture lacks (listed for another) number nothing.
            syscalls: (!names.is_empty()).then(|| {
                names
                    .into_iter()
                    .filter_map(syscall_table::number)
                    .collect()
            }),
        }
    }

    /// Whether it changes any label set.
    pub(crate) fn is_identity(&self) -> bool {
        !self.cgroup_unless_pod_known && !self.drop_comm && self.syscalls.is_none()
    }

    /// The workload with the labels control drops left empty (not exported).
    pub(crate) fn workload(&self, workload: Workload) -> Workload {
        if self.is_identity() {
            return workload;
        }
        Workload {
            cgroup: self.cgroup(&workload.cgroup),
            comm: if self.drop_comm {
                Arc::from("")
            } else {
                workload.comm
            },
            pid: workload.pid,
        }
    }

    /// A cgroup's labels without `cgroup` (left empty) and `container_id` where control drops
    /// them: the pod and container are named.
    pub(crate) fn cgroup(&self, cgroup: &Arc<CgroupLabels>) -> Arc<CgroupLabels> {
        let named = |label: &str| cgroup.extra.iter().any(|(k, _)| *k == label);
        if !(self.cgroup_unless_pod_known && named(POD) && named(CONTAINER)) {
            return cgroup.clone();
        }
        Arc::new(CgroupLabels {
            path: Arc::from(""),
            extra: cgroup
                .extra
                .iter()
                .filter(|(k, _)| *k != CONTAINER_ID)
                .cloned()
                .collect(),
        })
    }

    /// The syscall number a series is labelled with: `nr`, or [`syscall_table::FOLDED_NR`]
    /// (`syscall="other"`) when it is not among those exported by name.
    pub(crate) fn syscall(&self, nr: u32) -> u32 {
        match &self.syscalls {
            Some(kept) if !kept.contains(&nr) => syscall_table::FOLDED_NR,
            _ => nr,
        }
    }
}

/// Sticky routing of series keys under a budget of exported series.
///
/// `K` is a series key (e.g. (workload, syscall)); `fold` gives the coarser keys to try when a
/// key does not fit, the last of which is always admitted (it must be bounded by construction).
#[derive(Debug)]
pub struct Budget<K> {
    max: usize,
    used: usize,
    routes: HashMap<K, K>,
    admitted: HashMap<K, usize>,
    folded: u64,
}

impl<K: Clone + Eq + Hash> Budget<K> {
    /// Changes the budget (a reloaded `limits.max_series`): series already admitted keep their
    /// place, new label sets are admitted or folded against the new size.
    pub(crate) fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    pub fn new(max: usize) -> Self {
        Self {
            max,
            used: 0,
            routes: HashMap::new(),
            admitted: HashMap::new(),
            folded: 0,
        }
    }

    /// The key `key`'s values are recorded under. `cost` is the number of exported series a
    /// new key adds; `fold` lists coarser keys, most specific first.
    pub fn route(&mut self, key: &K, cost: usize, fold: impl FnOnce(&K) -> Vec<K>) -> K {
        if let Some(target) = self.routes.get(key) {
            return target.clone();
        }
        // Original label sets may use 90% of the budget; the rest is kept for the per-cgroup
        // "other" series they fold into, so a busy cgroup still shows up as itself.
        let soft_max = self.max - self.max / 10;
        let target = if self.admitted.contains_key(key) || self.used + cost <= soft_max {
            key.clone()
        } else {
            self.folded += 1;
            let candidates = fold(key);
            let last = candidates.len().saturating_sub(1);
            candidates
                .into_iter()
                .enumerate()
                .find(|(i, c)| {
                    *i == last || self.admitted.contains_key(c) || self.used + cost <= self.max
                })
                .map(|(_, c)| c)
                .unwrap_or_else(|| key.clone())
        };
        if !self.admitted.contains_key(&target) {
            self.used += cost;
            self.admitted.insert(target.clone(), cost);
        }
        self.routes.insert(key.clone(), target.clone());
        target
    }

    /// Drops keys (and routes to them) that `keep` rejects, returning their budget.
    pub fn retain(&mut self, keep: impl Fn(&K) -> bool) {
        let mut freed = 0;
        self.admitted.retain(|k, cost| {
            let kept = keep(k);
            if !kept {
                freed += *cost;
            }
            kept
        });
        self.used -= freed;
        let admitted = &self.admitted;
        self.routes.retain(|_, to| admitted.contains_key(to));
    }

    /// Forgets the routes of source keys `live` rejects (no process feeds them any more), so
    /// routing state stays proportional to live label sets. A key admitted as its own series
    /// keeps it while the series exists; a folded key that comes back is routed (and counted
    /// as folded) again.
    pub fn retain_routes(&mut self, live: impl Fn(&K) -> bool) {
        self.routes.retain(|k, _| live(k));
    }

    /// Source keys with a remembered route.
    #[cfg(test)]
    pub(crate) fn routes(&self) -> usize {
        self.routes.len()
    }

    /// Exported series currently charged to the budget.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Distinct label sets folded away so far.
    pub(crate) fn folded(&self) -> u64 {
        self.folded
    }
}

/// One exported series: the sum of the changes of every kernel entry routed to it, and when it
/// last counted an event (for retiring idle series).
#[derive(Debug, Clone)]
pub(crate) struct Series<V> {
    pub(crate) sum: V,
    pub(crate) last_change: Instant,
}

impl<V: Counters> Series<V> {
    fn new(now: Instant) -> Self {
        Self {
            sum: V::ZERO,
            last_change: now,
        }
    }

    fn add(&mut self, change: &V, now: Instant) {
        self.sum.add(change);
        if change.has_events() {
            self.last_change = now;
        }
    }
}

/// Where one kernel entry's values go: the label set it was named with (before the budget
/// folded it) and the series it counts in; both `None` until it could be named.
#[derive(Debug)]
pub(crate) struct Route<L, S> {
    pub(crate) labels: Option<L>,
    pub(crate) series: Option<S>,
}

/// What naming an entry found.
pub(crate) enum Named<L, S> {
    /// Labelled `labels`, counted in `series` (the labels, or what the budget folded them to).
    As(L, S),
    /// Not nameable yet (a process that exited since the read): its change waits for the next
    /// read, and it is not reclaimed.
    NotYet,
    /// Not counted by this table (not the command-line tool's target): left unread, reclaimed
    /// like any other entry.
    Ignored,
}

/// What one read of a map left to do: the entries to delete in the kernel (their values are
/// in their series now), and whether the read saw every entry.
#[derive(Debug)]
pub(crate) struct Folded<K> {
    pub(crate) reclaim: Vec<K>,
    pub(crate) complete: bool,
}

/// One cumulative kernel map (kernel key `K`, value `V`) as labelled series `S`, each entry
/// named `L` (see the module documentation).
pub(crate) struct SeriesTable<K, V, L, S> {
    entries: Tracker<K, V, Route<L, S>>,
    series: HashMap<S, Series<V>>,
    /// Whether an entry is named again whenever it changed (a process renamed by `exec` or
    /// `prctl` counts under its new name from then on), or once for good.
    renames: bool,
}

impl<K, V, L, S> std::fmt::Debug for SeriesTable<K, V, L, S>
where
    K: Eq + Hash + Copy,
    V: Counters,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeriesTable")
            .field("entries", &self.entries.len())
            .field("series", &self.series.len())
            .field("renames", &self.renames)
            .finish()
    }
}

impl<K, V, L, S> SeriesTable<K, V, L, S>
where
    K: Eq + Hash + Copy,
    V: Counters,
    S: Eq + Hash + Clone,
{
    /// A table whose entries are named once, when first seen.
    pub(crate) fn named_once() -> Self {
        Self {
            entries: Tracker::default(),
            series: HashMap::new(),
            renames: false,
        }
    }

    /// A table whose entries are named again whenever they changed.
    pub(crate) fn following_renames() -> Self {
        Self {
            renames: true,
            ..Self::named_once()
        }
    }

    /// Adds what changed in every entry of `read` to its series. `name` names an entry not
    /// named yet (`true`), or one that changed in a table following renames (`false`);
    /// `reclaim` picks, from an entry and its change, the entries to delete in the kernel once
    /// their values are in. Delete those, then hand back the ones gone to [`Self::reclaimed`].
    pub(crate) fn fold(
        &mut self,
        read: Snapshot<K, V>,
        now: Instant,
        mut name: impl FnMut(&K, bool) -> Named<L, S>,
        reclaim: impl Fn(&K, &V) -> bool,
    ) -> Folded<K> {
        let mut to_reclaim = Vec::new();
        self.entries.begin();
        for (key, cur) in read.entries {
            let (change, unnamed) = match self.entries.get(&key) {
                Some(tracked) => (tracked.change(&cur), tracked.state.series.is_none()),
                None => (cur.since(&V::ZERO), true),
            };
            let changed = !change.is_zero();
            let mut named = None;
            if unnamed || (self.renames && changed) {
                match name(&key, unnamed) {
                    Named::As(labels, series) => named = Some((labels, series)),
                    Named::NotYet => {
                        self.entries.observe(key, Self::unrouted);
                        continue;
                    }
                    Named::Ignored => {
                        if reclaim(&key, &change) {
                            to_reclaim.push(key);
                        }
                        continue;
                    }
                }
            }
            let entry = self.entries.observe(key, Self::unrouted);
            if let Some((labels, series)) = named {
                entry.state = Route {
                    labels: Some(labels),
                    series: Some(series),
                };
            }
            if unnamed || changed {
                let target = entry
                    .state
                    .series
                    .clone()
                    .expect("a named entry has a series");
                self.series
                    .entry(target)
                    .or_insert_with(|| Series::new(now))
                    .add(&change, now);
            }
            entry.settle(cur);
            if reclaim(&key, &change) {
                to_reclaim.push(key);
            }
        }
        Folded {
            reclaim: to_reclaim,
            complete: read.complete,
        }
    }

    fn unrouted() -> Route<L, S> {
        Route {
            labels: None,
            series: None,
        }
    }

    /// Ends a read: forgets the entries whose kernel entries are confirmed `gone` and, after a
    /// `complete` read, those it did not see.
    pub(crate) fn reclaimed(&mut self, gone: impl IntoIterator<Item = K>, complete: bool) {
        self.entries.forget(gone);
        self.entries.end(complete);
    }

    /// Drops the series no entry is routed to that counted nothing for `retention`; returns
    /// whether any went.
    pub(crate) fn retire(&mut self, now: Instant, retention: Duration) -> bool {
        let live: HashSet<&S> = self
            .entries
            .states()
            .filter_map(|r| r.series.as_ref())
            .collect();
        let before = self.series.len();
        self.series
            .retain(|k, s| live.contains(k) || now.duration_since(s.last_change) < retention);
        self.series.len() != before
    }

    /// Every series, to encode.
    pub(crate) fn series(&self) -> impl Iterator<Item = (&S, &Series<V>)> {
        self.series.iter()
    }

    /// Series `series`, if it exists.
    pub(crate) fn get(&self, series: &S) -> Option<&Series<V>> {
        self.series.get(series)
    }

    pub(crate) fn has_series(&self, series: &S) -> bool {
        self.series.contains_key(series)
    }

    /// Takes every series out (a tool that wants what changed since it last asked).
    pub(crate) fn take_series(&mut self) -> HashMap<S, Series<V>> {
        std::mem::take(&mut self.series)
    }

    /// Drops the series `keep` rejects (a table whose series follow another table's).
    pub(crate) fn retain_series(&mut self, keep: impl Fn(&S) -> bool) {
        self.series.retain(|k, _| keep(k));
    }

    /// The series entry `key` counts in, once it is named.
    pub(crate) fn series_of(&self, key: &K) -> Option<&S> {
        self.entries.get(key)?.state.series.as_ref()
    }

    /// Each named entry with the series it counts in.
    pub(crate) fn routes(&self) -> impl Iterator<Item = (&K, &S)> {
        self.entries
            .iter()
            .filter_map(|(k, r)| r.series.as_ref().map(|s| (k, s)))
    }

    /// The kernel keys of the entries tracked.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    /// The label sets of the entries named so far.
    pub(crate) fn labels(&self) -> impl Iterator<Item = (&K, &L)> {
        self.entries
            .iter()
            .filter_map(|(k, r)| r.labels.as_ref().map(|l| (k, l)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(cg: &str, comm: &str) -> Workload {
        Workload {
            cgroup: Arc::new(CgroupLabels::plain(cg)),
            comm: Arc::from(comm),
            pid: None,
        }
    }

    fn fold(k: &(Workload, u32)) -> Vec<(Workload, u32)> {
        vec![(k.0.fold_comm(), k.1), (Workload::fold_all(), k.1)]
    }

    #[test]
    fn admits_until_budget_then_folds_stickily() {
        let mut b = Budget::new(30);
        let a = (w("/a", "x"), 0);
        assert_eq!(b.route(&a, 10, fold), a);
        assert_eq!(b.route(&(w("/a", "y"), 0), 10, fold), (w("/a", "y"), 0));
        // 20 used of 30, originals may use 27: the next folds into its cgroup's "other".
        let z = (w("/a", "z"), 0);
        assert_eq!(b.route(&z, 10, fold), (w("/a", "other"), 0));
        // Budget exhausted: a different cgroup folds all the way.
        let q = (w("/b", "q"), 0);
        assert_eq!(b.route(&q, 10, fold), (Workload::fold_all(), 0));
        // A second comm in /a reuses the existing /a other series.
        assert_eq!(b.route(&(w("/a", "v"), 0), 10, fold), (w("/a", "other"), 0));
        // Sticky: asking again gives the same answer even when budget is freed.
        b.retain(|k| k.0.comm.as_ref() != "y");
        assert_eq!(b.route(&z, 10, fold), (w("/a", "other"), 0));
        assert_eq!(b.folded(), 3);
        // Original keys keep their own series.
        assert_eq!(b.route(&a, 10, fold), a);
    }

    #[test]
    fn budget_bounds_series_count() {
        let mut b = Budget::new(1000);
        for i in 0..10_000u32 {
            let k = (w(&format!("/cg{}", i % 100), &format!("p{i}")), i % 40);
            b.route(&k, 17, fold);
        }
        // At most the budget plus the bounded catch-all (one per syscall).
        assert!(b.used() <= 1000 + 40 * 17, "{}", b.used());
        assert!(b.folded() > 9000);
    }

    #[test]
    fn routes_of_gone_label_sets_are_forgotten_but_admitted_series_stay() {
        let mut b = Budget::new(30);
        let a = (w("/a", "x"), 0);
        b.route(&a, 10, fold);
        b.route(&(w("/a", "y"), 0), 10, fold);
        let folded: Vec<_> = (0..100).map(|i| (w("/a", &format!("p{i}")), 0)).collect();
        for k in &folded {
            assert_eq!(b.route(k, 10, fold), (w("/a", "other"), 0));
        }
        assert_eq!(b.routes(), 102);
        // Only `a` is still fed.
        b.retain_routes(|k| *k == a);
        assert_eq!(b.routes(), 1);
        assert_eq!(b.used(), 30, "admitted series keep their budget");
        // `y` is still admitted as its own series: it gets it back.
        assert_eq!(b.route(&(w("/a", "y"), 0), 10, fold), (w("/a", "y"), 0));
        // A folded label set that comes back folds the same way, and is counted again.
        let before = b.folded();
        assert_eq!(b.route(&folded[0], 10, fold), (w("/a", "other"), 0));
        assert_eq!(b.folded(), before + 1);
    }

    /// One read of a map of `u64` counters keyed by `u32`.
    fn read(entries: &[(u32, u64)]) -> Snapshot<u32, u64> {
        Snapshot::ended(entries.to_vec(), true)
    }

    fn sum(table: &SeriesTable<u32, u64, u32, &'static str>, series: &'static str) -> u64 {
        table
            .series()
            .find(|(s, _)| **s == series)
            .map_or(0, |(_, s)| s.sum)
    }

    #[test]
    fn entries_merge_into_their_series_and_wait_until_they_can_be_named() {
        let mut table: SeriesTable<u32, u64, u32, &str> = SeriesTable::named_once();
        let now = Instant::now();
        // Entries 1 and 2 count in one series; 3 cannot be named yet.
        let name = |key: &u32, _| match key {
            3 => Named::NotYet,
            k => Named::As(*k, "a"),
        };
        // 3's process is gone, but its values are not in yet: it is not reclaimed.
        let folded = table.fold(read(&[(1, 5), (2, 7), (3, 4)]), now, name, |k, _| *k == 3);
        assert!(folded.reclaim.is_empty());
        table.reclaimed(Vec::new(), folded.complete);
        assert_eq!(sum(&table, "a"), 12);
        // 3 is still waiting: its whole value comes once it is named.
        let folded = table.fold(
            read(&[(1, 6), (2, 7), (3, 9)]),
            now,
            |k, first| {
                assert!(first == (*k == 3), "only the unnamed entry is named again");
                Named::As(*k, "a")
            },
            |_, _| false,
        );
        table.reclaimed(Vec::new(), folded.complete);
        assert_eq!(sum(&table, "a"), 12 + 1 + 9);
    }

    #[test]
    fn an_entry_is_forgotten_only_once_its_kernel_entry_is_gone() {
        let mut table: SeriesTable<u32, u64, u32, &str> = SeriesTable::named_once();
        let now = Instant::now();
        let name = |k: &u32, _| Named::As(*k, "a");
        let reclaim = |k: &u32, _: &u64| *k == 1;
        let folded = table.fold(read(&[(1, 5)]), now, name, reclaim);
        assert_eq!(folded.reclaim, [1]);
        // The delete failed: the entry stays, and its next read adds only what is new.
        table.reclaimed(Vec::new(), folded.complete);
        let folded = table.fold(read(&[(1, 8)]), now, name, reclaim);
        assert_eq!(sum(&table, "a"), 8);
        // Deleted now: forgotten, and an entry created again under the key counts whole.
        table.reclaimed(folded.reclaim, folded.complete);
        assert_eq!(table.keys().count(), 0);
        let folded = table.fold(read(&[(1, 2)]), now, name, |_, _| false);
        table.reclaimed(Vec::new(), folded.complete);
        assert_eq!(sum(&table, "a"), 10);
    }

    #[test]
    fn renamed_entries_move_on_and_leave_what_they_counted() {
        let mut table: SeriesTable<u32, u64, u32, &str> = SeriesTable::following_renames();
        let now = Instant::now();
        table.fold(
            read(&[(1, 5)]),
            now,
            |k, _| Named::As(*k, "old"),
            |_, _| false,
        );
        // Unchanged: not named again. Changed: named again.
        let mut named = 0;
        table.fold(
            read(&[(1, 5)]),
            now,
            |k, _| {
                named += 1;
                Named::As(*k, "new")
            },
            |_, _| false,
        );
        assert_eq!(named, 0);
        table.fold(
            read(&[(1, 9)]),
            now,
            |k, _| Named::As(*k, "new"),
            |_, _| false,
        );
        assert_eq!((sum(&table, "old"), sum(&table, "new")), (5, 4));
    }

    #[test]
    fn ignored_entries_are_not_read_but_are_reclaimed() {
        let mut table: SeriesTable<u32, u64, u32, &str> = SeriesTable::named_once();
        let folded = table.fold(
            read(&[(1, 5), (2, 3)]),
            Instant::now(),
            |k, _| {
                if *k == 1 {
                    Named::Ignored
                } else {
                    Named::As(*k, "a")
                }
            },
            |k, _| *k == 1,
        );
        assert_eq!(folded.reclaim, [1]);
        assert_eq!(table.keys().copied().collect::<Vec<_>>(), [2]);
        assert_eq!(table.take_series().len(), 1);
        assert_eq!(table.series().count(), 0);
    }

    #[test]
    fn only_series_no_entry_feeds_retire_once_idle() {
        let mut table: SeriesTable<u32, u64, u32, &str> = SeriesTable::named_once();
        let start = Instant::now();
        let folded = table.fold(
            read(&[(1, 5), (2, 3)]),
            start,
            |k, _| Named::As(*k, if *k == 1 { "kept" } else { "gone" }),
            |k, _| *k == 2,
        );
        table.reclaimed(folded.reclaim, folded.complete);
        let retention = Duration::from_secs(60);
        assert!(!table.retire(start + Duration::from_secs(30), retention));
        assert!(table.retire(start + Duration::from_secs(61), retention));
        assert!(table.has_series(&"kept") && !table.has_series(&"gone"));
    }

    fn named(cg: &str, comm: &str, pod: bool) -> Workload {
        let mut labels = CgroupLabels::plain(cg);
        labels.extra.push((POD_UID, Arc::from("u1")));
        labels.extra.push((CONTAINER_ID, Arc::from(cg)));
        if pod {
            labels.extra.push((NAMESPACE, Arc::from("ns")));
            labels.extra.push((POD, Arc::from("p")));
            labels.extra.push((CONTAINER, Arc::from("c")));
        }
        Workload {
            cgroup: Arc::new(labels),
            comm: Arc::from(comm),
            pid: None,
        }
    }

    fn exported(w: &Workload) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        w.push_labels(&mut out);
        out.into_iter().map(|(k, v)| (k, v.into_owned())).collect()
    }

    #[test]
    fn label_control_drops_cgroup_only_where_the_pod_is_named() {
        let control = LabelControl::new(&LabelsConfig {
            cgroup: CgroupLabel::UnlessPodKnown,
            ..LabelsConfig::default()
        });
        // Two restarts of one container: two cgroups, one label set.
        let a = control.workload(named("/kubepods/pod1/aaa", "python", true));
        let b = control.workload(named("/kubepods/pod1/bbb", "python", true));
        assert_eq!(a, b);
        assert_eq!(
            exported(&a),
            [
                ("pod_uid", "u1".to_string()),
                ("namespace", "ns".to_string()),
                ("pod", "p".to_string()),
                ("container", "c".to_string()),
                ("comm", "python".to_string())
            ]
        );
        // Not named by the pod watch: the cgroup stays.
        let plain = control.workload(named("/system.slice/x", "x", false));
        assert_eq!(
            exported(&plain)[0],
            ("cgroup", "/system.slice/x".to_string())
        );
        assert!(LabelControl::new(&LabelsConfig::default()).is_identity());
    }

    #[test]
    fn label_control_drops_comm_and_folds_syscalls() {
        let control = LabelControl::new(&LabelsConfig {
            comm: false,
            syscalls: vec!["getppid".into()],
            syscall_families: vec!["sync".into()],
            ..LabelsConfig::default()
        });
        let a = control.workload(named("/a", "x", false));
        assert_eq!(a, control.workload(named("/a", "y", false)));
        assert!(exported(&a).iter().all(|(k, _)| *k != "comm"));
        // A dropped comm is not folded back into one.
        assert!(a.fold_comm().comm.is_empty());
        let nr = |n| syscall_table::number(n).unwrap();
        assert_eq!(control.syscall(nr("getppid")), nr("getppid"));
        assert_eq!(control.syscall(nr("fdatasync")), nr("fdatasync"));
        assert_eq!(control.syscall(nr("read")), syscall_table::FOLDED_NR);
    }

    #[test]
    fn labels_in_order() {
        let mut cg = CgroupLabels::plain("/kubepods/pod1/abc");
        cg.extra.push(("pod_uid", Arc::from("1")));
        let wl = Workload {
            cgroup: Arc::new(cg),
            comm: Arc::from("python"),
            pid: Some(42),
        };
        let mut out = Vec::new();
        wl.push_labels(&mut out);
        let keys: Vec<_> = out.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["cgroup", "pod_uid", "comm", "pid"]);
        assert_eq!(out[3].1, "42");
    }
}
