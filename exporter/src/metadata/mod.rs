//! What turns kernel ids into labels: cgroup ids into cgroup v2 paths (and Kubernetes pod and
//! container identity), tgids into process names. One [`Labeler`] is shared by the collectors
//! so every family labels the same workload the same way, and knows which processes have
//! exited ([`exits`]) so every collector reclaims their entries by one rule.

pub mod cgroups;
pub mod cpu_bandwidth;
pub(crate) mod devices;
pub(crate) mod exits;
pub(crate) mod kubernetes;
pub mod processes;

use std::{collections::HashMap, path::PathBuf, sync::Arc, time::Instant};

use crate::series::{CgroupLabels, Workload};

/// Derives extra labels (e.g. `pod_uid`, `container_id`) from a cgroup path.
pub(crate) type CgroupLabelDeriver =
    Box<dyn Fn(&str) -> Vec<(&'static str, Arc<str>)> + Send + Sync>;

/// Extra labels derived for one cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Derived {
    pub labels: Vec<(&'static str, Arc<str>)>,
    /// False when metadata that may still arrive would add labels (a pod the pod watch has not
    /// reported yet): the labeler asks again once [`CgroupMetadata::generation`] changes.
    pub complete: bool,
}

/// A source of extra cgroup labels, possibly fed by metadata that arrives later (the pod
/// watch). Labels of a cgroup never change once complete, so series stay put.
pub(crate) trait CgroupMetadata: Send + Sync {
    fn derive(&self, path: &str) -> Derived;

    /// Changes whenever `derive` may return more for a path it called incomplete.
    fn generation(&self) -> u64 {
        0
    }
}

struct FnMetadata(CgroupLabelDeriver);

impl CgroupMetadata for FnMetadata {
    fn derive(&self, path: &str) -> Derived {
        Derived {
            labels: (self.0)(path),
            complete: true,
        }
    }
}

struct CachedLabels {
    labels: Arc<CgroupLabels>,
    /// The metadata generation incomplete labels were derived at.
    pending: Option<u64>,
}

pub struct Labeler {
    pub cgroups: cgroups::CgroupResolver,
    pub comms: processes::CommResolver,
    /// Processes known gone, shared by every collector that keys entries by tgid.
    pub(crate) exits: exits::Exits,
    pid_label: bool,
    derive: Option<Box<dyn CgroupMetadata>>,
    labels: HashMap<u64, CachedLabels>,
}

impl std::fmt::Debug for Labeler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Labeler")
            .field("cgroups", &self.cgroups)
            .field("pid_label", &self.pid_label)
            .finish_non_exhaustive()
    }
}

/// How a reader comes to name a kernel entry ([`Labeler::try_workload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sighting {
    /// Named before: the cached process name stands.
    Again,
    /// Never named: its process may have been renamed (exec) since its name was cached.
    First,
    /// About to be reclaimed: named now, with a placeholder if need be.
    Last,
}

impl Sighting {
    /// The sighting of an entry never named (`first`) whose process is (`reclaimed`) or is
    /// not about to be reclaimed; reclaim wins.
    pub(crate) fn of(first: bool, reclaimed: bool) -> Self {
        match (first, reclaimed) {
            (_, true) => Self::Last,
            (true, false) => Self::First,
            (false, false) => Self::Again,
        }
    }
}

impl Labeler {
    pub fn new(cgroup_root: PathBuf, pid_label: bool) -> Self {
        Self {
            cgroups: cgroups::CgroupResolver::new(cgroup_root),
            comms: processes::CommResolver::default(),
            exits: exits::Exits::default(),
            pid_label,
            derive: None,
            labels: HashMap::new(),
        }
    }

    /// Adds labels derived from each cgroup path (applied to cgroups resolved from now on).
    pub fn with_deriver(self, derive: CgroupLabelDeriver) -> Self {
        self.with_metadata(Box::new(FnMetadata(derive)))
    }

    /// Adds labels from a metadata source (applied to cgroups resolved from now on).
    pub(crate) fn with_metadata(mut self, metadata: Box<dyn CgroupMetadata>) -> Self {
        self.derive = Some(metadata);
        self.labels.clear();
        self
    }

    /// Starts a collection cycle (unknown cgroup ids may walk the hierarchy once more).
    pub(crate) fn new_cycle(&mut self) {
        self.cgroups.new_cycle();
        self.exits.expire(Instant::now());
    }

    /// Labels of cgroup `id`.
    pub fn cgroup(&mut self, id: u64) -> Arc<CgroupLabels> {
        let generation = self.derive.as_ref().map_or(0, |d| d.generation());
        if let Some(c) = self.labels.get(&id) {
            match c.pending {
                // Incomplete labels are derived again once more metadata has arrived.
                Some(at) if at != generation => {}
                _ => return c.labels.clone(),
            }
        }
        // A cgroup's name is chosen by whoever may create it (a delegated subtree, a
        // container runtime): control characters become `?`, as in process names.
        let path: Arc<str> = match self.cgroups.resolve(id) {
            p if p.chars().any(char::is_control) => Arc::from(processes::sanitize(&p).as_str()),
            p => p,
        };
        let derived = match &self.derive {
            Some(derive) => derive.derive(&path),
            None => Derived {
                labels: Vec::new(),
                complete: true,
            },
        };
        let pending = (!derived.complete).then_some(generation);
        let labels = match self.labels.get(&id) {
            Some(c) if c.labels.path == path && c.labels.extra == derived.labels => {
                c.labels.clone()
            }
            _ => Arc::new(CgroupLabels {
                path,
                extra: derived.labels,
            }),
        };
        // An unresolved id may resolve later: do not cache the placeholder.
        if &*labels.path != cgroups::UNRESOLVED {
            self.labels.insert(
                id,
                CachedLabels {
                    labels: labels.clone(),
                    pending,
                },
            );
        }
        labels
    }

    /// The labels of cgroup `id`, which keyed a kernel entry of a map snapshot taken at
    /// `seen_at`: the one policy for cgroup ids of every family. A walk of the hierarchy
    /// started after the snapshot finds every cgroup that still exists, so the id is either
    /// named now or was removed, and is then `(unresolved)`; nothing waits on a timer.
    pub(crate) fn cgroup_seen(&mut self, id: u64, seen_at: Instant) -> Arc<CgroupLabels> {
        self.settle_cgroup(id, seen_at);
        self.cgroup(id)
    }

    /// Resolves (or finds gone) cgroup `id` seen at `seen_at`, so `cgroup()` walks no further.
    fn settle_cgroup(&mut self, id: u64, seen_at: Instant) {
        if !self.labels.contains_key(&id) {
            let _ = self.cgroups.lookup_seen(id, seen_at);
        }
    }

    /// The workload of a kernel (cgroup id, tgid) pair from a map read that ended at `seen_at`,
    /// or `None` while it cannot be named yet: its process exited between the snapshot and now
    /// (its exit record, read next cycle, carries the name). The caller keeps the values and
    /// asks again next cycle rather than attribute them to a placeholder. On the `last_chance`
    /// (the entry is about to be reclaimed) the placeholder is used instead. A cgroup removed
    /// before it could be resolved is `(unresolved)`. An entry seen for the `First` time has
    /// its process name read again unless it was read since `seen_at`: the cached one may
    /// predate an exec.
    pub(crate) fn try_workload(
        &mut self,
        cgroup_id: u64,
        tgid: u32,
        seen_at: Instant,
        sighting: Sighting,
    ) -> Option<Workload> {
        self.settle_cgroup(cgroup_id, seen_at);
        let last_chance = sighting == Sighting::Last;
        let comm = match sighting {
            Sighting::First => self.comms.lookup_since(tgid, seen_at),
            Sighting::Again | Sighting::Last => self.comms.lookup(tgid),
        };
        let comm = match comm {
            Some(comm) => comm,
            // Alive but unreadable: waiting would not help.
            None if last_chance || self.comms.alive(tgid) => Arc::from(processes::UNKNOWN_COMM),
            None => return None,
        };
        Some(self.workload_named(cgroup_id, tgid, comm))
    }

    /// Labels of cgroup `id` whose path (relative to the v2 root) the caller already knows,
    /// e.g. from its own walk of the hierarchy: no walk of the labeler's own.
    pub(crate) fn cgroup_at(&mut self, id: u64, path: &str) -> Arc<CgroupLabels> {
        if !self.labels.contains_key(&id) {
            self.cgroups.learn(id, path);
        }
        self.cgroup(id)
    }

    /// The workload a kernel (cgroup id, tgid) pair belongs to.
    pub fn workload(&mut self, cgroup_id: u64, tgid: u32) -> Workload {
        Workload {
            cgroup: self.cgroup(cgroup_id),
            comm: self.comms.resolve(tgid),
            pid: self.pid_label.then_some(tgid),
        }
    }

    /// The workload of a kernel (cgroup id, tgid) pair whose process name the probe recorded
    /// itself (no /proc lookup, so it is right even after the process exited).
    pub(crate) fn workload_named(&mut self, cgroup_id: u64, tgid: u32, comm: Arc<str>) -> Workload {
        Workload {
            cgroup: self.cgroup(cgroup_id),
            comm,
            pid: self.pid_label.then_some(tgid),
        }
    }

    /// Drops cached cgroups that `keep` rejects and whose directories are gone.
    pub(crate) fn retain_cgroups(&mut self, keep: impl Fn(u64) -> bool) {
        self.cgroups.retain(&keep);
        self.labels.retain(|id, _| keep(*id));
    }
}

/// The labeler shared by collectors.
pub type SharedLabeler = Arc<std::sync::Mutex<Labeler>>;

/// The cgroup v2 mount the shared labeler walks.
pub(crate) fn cgroup_root(labeler: &SharedLabeler) -> std::path::PathBuf {
    labeler
        .lock()
        .expect("labeler lock")
        .cgroups
        .root()
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{os::unix::fs::MetadataExt, time::Duration};

    /// A process that exits between the map read and the labelling has no readable name: its
    /// values wait for the exit record (which names it) instead of going to a placeholder,
    /// unless this is the last chance before its entries are reclaimed.
    #[test]
    fn exited_process_is_deferred_until_its_exit_record_names_it() {
        let cgroup_root = tempfile::tempdir().unwrap();
        let proc_root = tempfile::tempdir().unwrap();
        let root_id = std::fs::metadata(cgroup_root.path()).unwrap().ino();
        let mut labeler = Labeler::new(cgroup_root.path().into(), false);
        labeler.comms =
            processes::CommResolver::new(proc_root.path().into(), Duration::from_secs(5));
        labeler.new_cycle();

        std::fs::create_dir(proc_root.path().join("42")).unwrap();
        std::fs::write(proc_root.path().join("42/comm"), "trainer\n").unwrap();
        let live = labeler
            .try_workload(root_id, 42, Instant::now(), Sighting::Again)
            .expect("named");
        assert_eq!((&*live.cgroup.path, &*live.comm), ("/", "trainer"));

        // Gone before its name was ever read.
        assert!(labeler
            .try_workload(root_id, 43, Instant::now(), Sighting::Again)
            .is_none());
        let last = labeler
            .try_workload(root_id, 43, Instant::now(), Sighting::Last)
            .expect("placeholder");
        assert_eq!(&*last.comm, processes::UNKNOWN_COMM);
        // The exit record arrives: named from then on.
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"loader");
        labeler.comms.set_exited(43, &comm);
        let named = labeler
            .try_workload(root_id, 43, Instant::now(), Sighting::Again)
            .expect("named");
        assert_eq!(&*named.comm, "loader");

        // Alive but unreadable: waiting would not help, the placeholder is used at once.
        std::fs::create_dir(proc_root.path().join("44")).unwrap();
        let unreadable = labeler
            .try_workload(root_id, 44, Instant::now(), Sighting::Again)
            .expect("placeholder");
        assert_eq!(&*unreadable.comm, processes::UNKNOWN_COMM);
    }
}
