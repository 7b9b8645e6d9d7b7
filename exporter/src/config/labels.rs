//! `[labels]`: which labels the per-process series carry, and label control: what the syscall
//! and block I/O series drop before the series budget (their values merge exactly, see
//! `series::LabelControl`). Serde types and defaults only; validation is in the parent module.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When the per-process series carry the `cgroup` label.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CgroupLabel {
    /// Always (with `container_id` where Kubernetes ids are on).
    #[default]
    Always,
    /// Only where the pod watch does not name the series' pod and container: a container's
    /// series carry `namespace`, `pod` and `container` instead of `cgroup` and `container_id`,
    /// which change whenever the container restarts.
    UnlessPodKnown,
}

/// Which labels the per-process series carry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct LabelsConfig {
    /// Adds a `pid` label (one series per process: unbounded, so off by default).
    pub(crate) pid: bool,
    /// Adds `pod_uid` and `container_id` parsed from Kubernetes cgroup paths.
    pub(crate) kubernetes_ids: bool,
    /// When the `cgroup` label is exported.
    pub(crate) cgroup: CgroupLabel,
    /// Exports the process name (`comm`); without it, a cgroup's processes are one series.
    pub(crate) comm: bool,
    /// Syscalls exported by name; every other one counts under `syscall="other"`. Empty (and
    /// `syscall_families` empty): every syscall.
    #[schemars(extend("x-constraint" = "syscall names of this architecture"))]
    pub(crate) syscalls: Vec<String>,
    /// Syscall families (as the recording rules name them: read, write, metadata, sync,
    /// lock, wait, mmap, net) whose syscalls are exported by name, besides `syscalls`.
    #[schemars(extend("x-constraint" = "read, write, metadata, sync, lock, wait, mmap or net"))]
    pub(crate) syscall_families: Vec<String>,
}

impl Default for LabelsConfig {
    fn default() -> Self {
        Self {
            pid: false,
            kubernetes_ids: true,
            cgroup: CgroupLabel::Always,
            comm: true,
            syscalls: Vec::new(),
            syscall_families: Vec::new(),
        }
    }
}
