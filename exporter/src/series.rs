//! Label sets of per-workload series and the cardinality budget.
//!
//! A *workload* is what a series is labelled with: cgroup (with the Kubernetes identity derived
//! from it), process name and, when enabled, pid. Kernel entries are keyed by (cgroup id, tgid):
//! many of them fold into one workload, so series are sums that stay monotonic as processes come
//! and go. The [`Budget`] bounds how many series exist: a label set that does not fit is routed,
//! once and for good, to `comm="other"` in its cgroup, then to `cgroup="other"`, and counted.
//! Routing is sticky so a counter never moves between series.

use std::{borrow::Cow, collections::HashMap, hash::Hash, sync::Arc};

/// Label value of folded series.
pub(crate) const OTHER: &str = "other";

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

/// What a per-process series is labelled with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Workload {
    pub cgroup: Arc<CgroupLabels>,
    pub comm: Arc<str>,
    pub pid: Option<u32>,
}

impl Workload {
    /// Appends `cgroup`, the cgroup's extra labels, `comm` and `pid` to `out`.
    pub(crate) fn push_labels<'a>(&'a self, out: &mut Vec<(&'static str, Cow<'a, str>)>) {
        out.push(("cgroup", Cow::Borrowed(&self.cgroup.path)));
        for (k, v) in &self.cgroup.extra {
            out.push((k, Cow::Borrowed(v)));
        }
        out.push(("comm", Cow::Borrowed(&self.comm)));
        if let Some(pid) = self.pid {
            out.push(("pid", Cow::Owned(pid.to_string())));
        }
    }

    /// The same cgroup with the process folded away.
    pub fn fold_comm(&self) -> Self {
        Self {
            cgroup: self.cgroup.clone(),
            comm: Arc::from(OTHER),
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
