//! What turns kernel ids into labels: cgroup ids into cgroup v2 paths (and Kubernetes pod and
//! container identity), tgids into process names. One [`Labeler`] is shared by the collectors
//! so every family labels the same workload the same way.

pub mod cgroups;
pub mod devices;
pub mod processes;

use std::{collections::HashMap, path::PathBuf, sync::Arc};

use crate::series::{CgroupLabels, Workload};

/// Derives extra labels (e.g. `pod_uid`, `container_id`) from a cgroup path.
pub type CgroupLabelDeriver = Box<dyn Fn(&str) -> Vec<(&'static str, Arc<str>)> + Send + Sync>;

pub struct Labeler {
    pub cgroups: cgroups::CgroupResolver,
    pub comms: processes::CommResolver,
    pid_label: bool,
    derive: Option<CgroupLabelDeriver>,
    labels: HashMap<u64, Arc<CgroupLabels>>,
}

impl std::fmt::Debug for Labeler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Labeler")
            .field("cgroups", &self.cgroups)
            .field("pid_label", &self.pid_label)
            .finish_non_exhaustive()
    }
}

impl Labeler {
    pub fn new(cgroup_root: PathBuf, pid_label: bool) -> Self {
        Self {
            cgroups: cgroups::CgroupResolver::new(cgroup_root),
            comms: processes::CommResolver::default(),
            pid_label,
            derive: None,
            labels: HashMap::new(),
        }
    }

    /// Adds labels derived from each cgroup path (applied to cgroups resolved from now on).
    pub fn with_deriver(mut self, derive: CgroupLabelDeriver) -> Self {
        self.derive = Some(derive);
        self.labels.clear();
        self
    }

    /// Starts a collection cycle (unknown cgroup ids may walk the hierarchy once more).
    pub fn new_cycle(&mut self) {
        self.cgroups.new_cycle();
    }

    /// Labels of cgroup `id`.
    pub fn cgroup(&mut self, id: u64) -> Arc<CgroupLabels> {
        if let Some(l) = self.labels.get(&id) {
            return l.clone();
        }
        let path = self.cgroups.resolve(id);
        let extra = match &self.derive {
            Some(derive) => derive(&path),
            None => Vec::new(),
        };
        let labels = Arc::new(CgroupLabels { path, extra });
        // An unresolved id may resolve later: do not cache the placeholder.
        if &*labels.path != cgroups::UNRESOLVED {
            self.labels.insert(id, labels.clone());
        }
        labels
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
    pub fn workload_named(&mut self, cgroup_id: u64, tgid: u32, comm: Arc<str>) -> Workload {
        Workload {
            cgroup: self.cgroup(cgroup_id),
            comm,
            pid: self.pid_label.then_some(tgid),
        }
    }

    /// Drops cached cgroups that `keep` rejects and whose directories are gone.
    pub fn retain_cgroups(&mut self, keep: impl Fn(u64) -> bool) {
        self.cgroups.retain(&keep);
        self.labels.retain(|id, _| keep(*id));
    }
}

/// The labeler shared by collectors.
pub type SharedLabeler = Arc<std::sync::Mutex<Labeler>>;
