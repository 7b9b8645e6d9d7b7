//! The cache of this node's pods that names cgroups: pod UID -> namespace, pod name, and
//! container id -> container name. Fed by the pod watch ([`super::watch`]), read by the
//! labeler under a short read lock.
//!
//! Bounded by `kubernetes.max_pods`: a pod that does not fit is not cached and counted. A
//! deleted pod is kept for a short grace period (its last syscalls are often read after the
//! API has forgotten it), then dropped.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, RwLock,
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};

/// How long a deleted pod keeps naming its cgroups.
pub(crate) const DELETED_GRACE: Duration = Duration::from_secs(60);

/// The annotation a static pod's mirror carries: the UID the kubelet (and the cgroup) uses.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Names of a pod and, when known, of one of its containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodNames {
    pub namespace: Arc<str>,
    pub pod: Arc<str>,
    pub container: Option<Arc<str>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PodMeta {
    namespace: Arc<str>,
    name: Arc<str>,
    /// (container id, container name); current and previous instances of every container.
    containers: Vec<(Arc<str>, Arc<str>)>,
}

#[derive(Debug)]
struct Entry {
    meta: PodMeta,
    deleted_at: Option<Instant>,
}

#[derive(Debug)]
struct Inner {
    pods: HashMap<Arc<str>, Entry>,
    /// UIDs seen since the watch (re)started listing, while it lists.
    resync: Option<HashSet<Arc<str>>>,
    rejected: u64,
}

/// This node's pods, shared by the watch (writer) and the labeler (reader).
#[derive(Debug)]
pub(crate) struct PodStore {
    max_pods: usize,
    grace: Duration,
    inner: RwLock<Inner>,
    /// Bumped whenever a lookup may return more than before (a pod or container appeared).
    generation: AtomicU64,
}

impl PodStore {
    pub(crate) fn new(max_pods: usize) -> Self {
        Self::with_grace(max_pods, DELETED_GRACE)
    }

    pub(crate) fn with_grace(max_pods: usize, grace: Duration) -> Self {
        Self {
            max_pods: max_pods.max(1),
            grace,
            inner: RwLock::new(Inner {
                pods: HashMap::new(),
                resync: None,
                rejected: 0,
            }),
            generation: AtomicU64::new(0),
        }
    }

    /// Names for pod `uid` and, if given and known, container `container_id`.
    pub(crate) fn lookup(&self, uid: &str, container_id: Option<&str>) -> Option<PodNames> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let meta = &inner.pods.get(uid)?.meta;
        let container = container_id.and_then(|id| {
            meta.containers
                .iter()
                .find(|(cid, _)| &**cid == id)
                .map(|(_, name)| name.clone())
        });
        Some(PodNames {
            namespace: meta.namespace.clone(),
            pod: meta.name.clone(),
            container,
        })
    }

    /// Changes when a lookup may find more than it did before.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Pods cached (deleted ones still in their grace period included).
    pub(crate) fn len(&self) -> usize {
        self.read().pods.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pod updates not cached because `max_pods` pods were cached already.
    pub(crate) fn rejected(&self) -> u64 {
        self.read().rejected
    }

    /// A pod was added or changed.
    pub(crate) fn apply(&self, pod: &Pod, now: Instant) {
        let Some((uid, meta)) = describe(pod) else {
            return;
        };
        let mut inner = self.write();
        if let Some(seen) = inner.resync.as_mut() {
            seen.insert(uid.clone());
        }
        if let Some(entry) = inner.pods.get_mut(&uid) {
            entry.deleted_at = None;
            if entry.meta != meta {
                entry.meta = meta;
                self.bump();
            }
            return;
        }
        if inner.pods.len() >= self.max_pods {
            purge_expired(&mut inner, now, self.grace);
        }
        if inner.pods.len() >= self.max_pods {
            // A live pod matters more than a deleted one in its grace period.
            let oldest_deleted = inner
                .pods
                .iter()
                .filter_map(|(k, e)| e.deleted_at.map(|at| (at, k.clone())))
                .min();
            match oldest_deleted {
                Some((_, k)) => {
                    inner.pods.remove(&k);
                }
                None => {
                    inner.rejected += 1;
                    return;
                }
            }
        }
        inner.pods.insert(
            uid,
            Entry {
                meta,
                deleted_at: None,
            },
        );
        self.bump();
    }

    /// A pod was deleted: it names its cgroups for the grace period more, then is dropped.
    pub(crate) fn delete(&self, pod: &Pod, now: Instant) {
        let Some((uid, _)) = describe(pod) else {
            return;
        };
        let mut inner = self.write();
        if let Some(entry) = inner.pods.get_mut(&uid) {
            entry.deleted_at.get_or_insert(now);
        }
        purge_expired(&mut inner, now, self.grace);
    }

    /// The watch starts a full list: pods it does not list again were deleted meanwhile.
    pub(crate) fn begin_resync(&self) {
        self.write().resync = Some(HashSet::new());
    }

    /// The full list is complete.
    pub(crate) fn end_resync(&self, now: Instant) {
        let mut inner = self.write();
        let Some(seen) = inner.resync.take() else {
            return;
        };
        for (uid, entry) in inner.pods.iter_mut() {
            if !seen.contains(uid) {
                entry.deleted_at.get_or_insert(now);
            }
        }
        purge_expired(&mut inner, now, self.grace);
    }

    /// Drops deleted pods whose grace period is over.
    pub(crate) fn purge(&self, now: Instant) {
        purge_expired(&mut self.write(), now, self.grace);
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }
}

fn purge_expired(inner: &mut Inner, now: Instant, grace: Duration) {
    inner.pods.retain(|_, e| match e.deleted_at {
        Some(at) => now.saturating_duration_since(at) < grace,
        None => true,
    });
}

/// (container id, container name) of every instance of a pod's containers.
pub(crate) type ContainerIds = Vec<(Arc<str>, Arc<str>)>;

/// The UID a pod's cgroups carry (a static pod's is its mirror annotation) and its
/// containers' (id, name), current and previous instances, for the command-line tools'
/// `--pod`.
pub(crate) fn cgroup_identity(pod: &Pod) -> Option<(Arc<str>, ContainerIds)> {
    describe(pod).map(|(uid, meta)| (uid, meta.containers))
}

/// The UID the pod's cgroups carry and what the cache keeps of it.
fn describe(pod: &Pod) -> Option<(Arc<str>, PodMeta)> {
    let md = &pod.metadata;
    let uid = md
        .annotations
        .as_ref()
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .or(md.uid.as_ref())
        .filter(|u| !u.is_empty())?;
    let mut containers = Vec::new();
    if let Some(status) = &pod.status {
        let all = [
            &status.init_container_statuses,
            &status.container_statuses,
            &status.ephemeral_container_statuses,
        ];
        for statuses in all.into_iter().flatten() {
            for s in statuses {
                collect_ids(s, &mut containers);
            }
        }
    }
    Some((
        Arc::from(uid.to_ascii_lowercase().as_str()),
        PodMeta {
            namespace: Arc::from(md.namespace.as_deref().unwrap_or("")),
            name: Arc::from(md.name.as_deref().unwrap_or("")),
            containers,
        },
    ))
}

fn collect_ids(s: &ContainerStatus, out: &mut Vec<(Arc<str>, Arc<str>)>) {
    let name: Arc<str> = Arc::from(s.name.as_str());
    // The previous instance of a restarted container may still be exiting: name it too.
    let previous = s
        .last_state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .and_then(|t| t.container_id.as_deref());
    for id in [s.container_id.as_deref(), previous].into_iter().flatten() {
        if let Some(id) = strip_runtime(id) {
            if !out.iter().any(|(known, _)| &**known == id) {
                out.push((Arc::from(id), name.clone()));
            }
        }
    }
}

/// "containerd://<id>" -> "<id>" (also cri-o://, docker://).
pub(crate) fn strip_runtime(container_id: &str) -> Option<&str> {
    let id = match container_id.split_once("://") {
        Some((_, id)) => id,
        None => container_id,
    };
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A pod as the API serves it (JSON), with `(name, containerID)` statuses.
    pub(crate) fn pod_json(
        ns: &str,
        name: &str,
        uid: &str,
        containers: &[(&str, &str)],
    ) -> serde_json::Value {
        let statuses: Vec<_> = containers
            .iter()
            .map(|(n, id)| {
                serde_json::json!({
                    "name": n, "containerID": id, "image": "img", "imageID": "",
                    "ready": true, "restartCount": 0
                })
            })
            .collect();
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid, "resourceVersion": "1"},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"containerStatuses": statuses}
        })
    }

    pub(crate) fn pod(ns: &str, name: &str, uid: &str, containers: &[(&str, &str)]) -> Pod {
        serde_json::from_value(pod_json(ns, name, uid, containers)).unwrap()
    }

    const U1: &str = "11111111-1111-1111-1111-111111111111";
    const U2: &str = "22222222-2222-2222-2222-222222222222";
    const U3: &str = "33333333-3333-3333-3333-333333333333";

    #[test]
    fn names_pods_and_containers() {
        let store = PodStore::new(10);
        let g0 = store.generation();
        let cart = pod(
            "shop",
            "cart-0",
            U1,
            &[("app", "containerd://aaa"), ("sidecar", "cri-o://bbb")],
        );
        store.apply(&cart, Instant::now());
        assert!(store.generation() > g0);
        let n = store.lookup(U1, Some("aaa")).unwrap();
        assert_eq!(
            (&*n.namespace, &*n.pod, n.container.as_deref()),
            ("shop", "cart-0", Some("app"))
        );
        assert_eq!(
            store.lookup(U1, Some("bbb")).unwrap().container.as_deref(),
            Some("sidecar")
        );
        assert_eq!(store.lookup(U1, Some("zzz")).unwrap().container, None);
        assert_eq!(store.lookup(U1, None).unwrap().container, None);
        assert_eq!(store.lookup(U2, None), None);
        // The same pod again changes nothing, so labels cached from it stay valid.
        let g1 = store.generation();
        store.apply(&cart, Instant::now());
        assert_eq!(store.generation(), g1);
    }

    #[test]
    fn restarted_container_keeps_its_previous_id() {
        let mut p: serde_json::Value = pod_json("ns", "p", U1, &[("app", "containerd://new")]);
        p["status"]["containerStatuses"][0]["lastState"] =
            serde_json::json!({"terminated": {"exitCode": 1, "containerID": "containerd://old"}});
        let store = PodStore::new(10);
        store.apply(&serde_json::from_value(p).unwrap(), Instant::now());
        for id in ["new", "old"] {
            assert_eq!(
                store.lookup(U1, Some(id)).unwrap().container.as_deref(),
                Some("app")
            );
        }
    }

    #[test]
    fn static_pods_are_found_by_their_config_hash() {
        let mut p = pod_json(
            "kube-system",
            "etcd-node-a",
            U1,
            &[("etcd", "containerd://e")],
        );
        p["metadata"]["annotations"] =
            serde_json::json!({"kubernetes.io/config.mirror": "3A1F2C6E8D9B4E7F0A1B2C3D4E5F6A7B"});
        let store = PodStore::new(10);
        store.apply(&serde_json::from_value(p).unwrap(), Instant::now());
        let n = store
            .lookup("3a1f2c6e8d9b4e7f0a1b2c3d4e5f6a7b", Some("e"))
            .unwrap();
        assert_eq!(&*n.pod, "etcd-node-a");
        assert_eq!(store.lookup(U1, None), None);
    }

    #[test]
    fn deleted_pods_are_dropped_after_the_grace_period() {
        let store = PodStore::with_grace(10, Duration::from_secs(60));
        let t0 = Instant::now();
        let p = pod("ns", "p", U1, &[]);
        store.apply(&p, t0);
        store.delete(&p, t0);
        // Still named during the grace period ...
        store.purge(t0 + Duration::from_secs(59));
        assert!(store.lookup(U1, None).is_some());
        // ... and gone after it.
        store.purge(t0 + Duration::from_secs(60));
        assert!(store.lookup(U1, None).is_none());
        assert!(store.is_empty());
    }

    #[test]
    fn resync_drops_pods_the_new_list_lacks() {
        let store = PodStore::with_grace(10, Duration::ZERO);
        let t = Instant::now();
        store.apply(&pod("ns", "a", U1, &[]), t);
        store.apply(&pod("ns", "b", U2, &[]), t);
        store.begin_resync();
        store.apply(&pod("ns", "a", U1, &[]), t);
        store.apply(&pod("ns", "c", U3, &[]), t);
        store.end_resync(t);
        assert!(store.lookup(U1, None).is_some());
        assert!(
            store.lookup(U2, None).is_none(),
            "b was deleted while not watching"
        );
        assert!(store.lookup(U3, None).is_some());
    }

    #[test]
    fn bounded_by_max_pods_and_counted() {
        let store = PodStore::with_grace(2, Duration::from_secs(60));
        let t = Instant::now();
        store.apply(&pod("ns", "a", U1, &[]), t);
        store.apply(&pod("ns", "b", U2, &[]), t);
        store.apply(&pod("ns", "c", U3, &[]), t);
        assert_eq!(store.len(), 2);
        assert_eq!(store.rejected(), 1);
        assert!(store.lookup(U3, None).is_none());
        // A deleted pod in its grace period gives way to a live one.
        store.delete(&pod("ns", "a", U1, &[]), t);
        store.apply(&pod("ns", "c", U3, &[]), t);
        assert_eq!(store.len(), 2);
        assert!(store.lookup(U3, None).is_some());
        assert!(store.lookup(U1, None).is_none());
        assert_eq!(store.rejected(), 1);
    }

    #[test]
    fn runtime_prefixes_are_stripped() {
        assert_eq!(strip_runtime("containerd://abc"), Some("abc"));
        assert_eq!(strip_runtime("cri-o://abc"), Some("abc"));
        assert_eq!(strip_runtime("docker://abc"), Some("abc"));
        assert_eq!(strip_runtime("abc"), Some("abc"));
        assert_eq!(strip_runtime("containerd://"), None);
    }
}
