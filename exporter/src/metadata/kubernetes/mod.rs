//! Kubernetes identity of cgroups: `pod_uid` and `container_id` parsed from the cgroup path
//! ([`cgroup_path`]), and `namespace`, `pod`, `container` from an optional watch of this node's
//! pods ([`watch`], cached in [`pods`]). [`KubernetesLabels`] plugs both into the shared
//! [`Labeler`](super::Labeler), so every per-cgroup series of every collector carries them.
//!
//! Touches no probe or map; the `kubernetes` collector (`crate::collectors::kubernetes`)
//! reports the watch: `sysscope_collector_up{collector="kubernetes"}` and
//! `sysscope_kubernetes_*` (see docs/metrics.md).

pub(crate) mod cgroup_path;
pub(crate) mod pods;
pub(crate) mod watch;

use std::sync::Arc;

use cgroup_path::parse as parse_cgroup_path;
pub(crate) use pods::PodStore;

use super::{CgroupMetadata, Derived};

// The labels (their names are the series' own, `crate::series`): `pod_uid` and `container_id`
// from the cgroup path (config `labels.kubernetes_ids`), `namespace`, `pod` and `container`
// from the pod watch.
pub(crate) use crate::series::{CONTAINER, CONTAINER_ID, NAMESPACE, POD, POD_UID};

/// Metric label -> OpenTelemetry semantic-convention attribute, for slow-call spans.
const SPAN_ATTRIBUTES: &[(&str, &str)] = &[
    (POD_UID, "k8s.pod.uid"),
    (CONTAINER_ID, "container.id"),
    (NAMESPACE, "k8s.namespace.name"),
    (POD, "k8s.pod.name"),
    (CONTAINER, "k8s.container.name"),
];

/// The span attribute of a Kubernetes label (`pod_uid` is `k8s.pod.uid`, ...); `None` for
/// any other label.
pub(crate) fn span_attribute(label: &str) -> Option<&'static str> {
    SPAN_ATTRIBUTES
        .iter()
        .find(|(l, _)| *l == label)
        .map(|(_, attribute)| *attribute)
}

/// Kubernetes labels of a cgroup: ids from its path, names from the pod cache.
#[derive(Debug, Clone)]
pub(crate) struct KubernetesLabels {
    ids: bool,
    pods: Option<Arc<PodStore>>,
}

impl KubernetesLabels {
    /// `ids`: add `pod_uid` and `container_id`; `pods`: add names from this cache.
    pub(crate) fn new(ids: bool, pods: Option<Arc<PodStore>>) -> Self {
        Self { ids, pods }
    }
}

impl CgroupMetadata for KubernetesLabels {
    fn derive(&self, path: &str) -> Derived {
        let Some(k) = parse_cgroup_path(path) else {
            return Derived {
                labels: Vec::new(),
                complete: true,
            };
        };
        let mut labels = Vec::with_capacity(5);
        let mut complete = true;
        if let Some(pods) = &self.pods {
            match pods.lookup(&k.pod_uid, k.container_id.as_deref()) {
                Some(names) => {
                    labels.push((NAMESPACE, names.namespace));
                    labels.push((POD, names.pod));
                    match names.container {
                        Some(c) => labels.push((CONTAINER, c)),
                        // Container ids reach the pod status a moment after the container
                        // starts (and the sandbox's never does): ask again later.
                        None => complete = k.container_id.is_none(),
                    }
                }
                None => complete = false,
            }
        }
        if self.ids {
            labels.push((POD_UID, k.pod_uid));
            if let Some(id) = k.container_id {
                labels.push((CONTAINER_ID, id));
            }
        }
        Derived { labels, complete }
    }

    fn generation(&self) -> u64 {
        self.pods.as_ref().map_or(0, |p| p.generation())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::metadata::{cgroups::id_of, Labeler};

    const UID: &str = "0d1e5f3a-8b2c-4d6e-9f10-1a2b3c4d5e6f";
    const CID: &str = "4c7a9e0d2b1f8e6a3c5d7b9f1e0a2c4b6d8f0e1a3c5b7d9f2e4a6c8b0d1f3e5a";

    fn container_path() -> String {
        format!("/kubepods/burstable/pod{UID}/{CID}")
    }

    #[test]
    fn shipped_daemonset_config_is_valid() {
        let text = include_str!("../../../../deploy/kubernetes/config.toml");
        let c = crate::config::Config::parse(text, "deploy/kubernetes/config.toml").unwrap();
        assert_eq!(c.kubernetes.pod_watch, "on");
        assert!(c.labels.kubernetes_ids);
        // Lean by default: a container's restarts stay one series.
        assert_eq!(c.labels.cgroup, crate::config::CgroupLabel::UnlessPodKnown);
    }

    #[test]
    fn ids_only_without_pod_watch() {
        let d = KubernetesLabels::new(true, None).derive(&container_path());
        assert!(d.complete);
        assert_eq!(
            d.labels,
            vec![(POD_UID, Arc::from(UID)), (CONTAINER_ID, Arc::from(CID))]
        );
        let d = KubernetesLabels::new(true, None).derive("/system.slice/cron.service");
        assert_eq!(
            d,
            Derived {
                labels: vec![],
                complete: true
            }
        );
    }

    #[test]
    fn names_from_the_pod_cache() {
        let store = Arc::new(PodStore::new(8));
        let k = KubernetesLabels::new(true, Some(store.clone()));
        // Not known yet: ids only, incomplete.
        let d = k.derive(&container_path());
        assert!(!d.complete);
        assert_eq!(d.labels.len(), 2);
        // Pod known, container not yet in its status: still incomplete.
        store.apply(
            &pods::tests::pod("shop", "cart-0", UID, &[]),
            Instant::now(),
        );
        let d = k.derive(&container_path());
        assert!(!d.complete);
        assert_eq!(
            d.labels[..2],
            [(NAMESPACE, Arc::from("shop")), (POD, Arc::from("cart-0"))]
        );
        // Container known: complete.
        let id = format!("containerd://{CID}");
        store.apply(
            &pods::tests::pod("shop", "cart-0", UID, &[("app", &id)]),
            Instant::now(),
        );
        let d = k.derive(&container_path());
        assert!(d.complete);
        let keys: Vec<_> = d.labels.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [NAMESPACE, POD, CONTAINER, POD_UID, CONTAINER_ID]);
        // Names without ids when labels.kubernetes_ids is off.
        let d = KubernetesLabels::new(false, Some(store)).derive(&container_path());
        let keys: Vec<_> = d.labels.iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, [NAMESPACE, POD, CONTAINER]);
        // The pod-level cgroup is complete with the pod's names alone.
    }

    #[test]
    fn labeler_upgrades_incomplete_labels_once_and_keeps_complete_ones() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(container_path().trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        let id = id_of(&dir).unwrap();
        let store = Arc::new(PodStore::with_grace(8, std::time::Duration::ZERO));
        let mut labeler = Labeler::new(root.path().to_path_buf(), false)
            .with_metadata(Box::new(KubernetesLabels::new(true, Some(store.clone()))));
        let first = labeler.cgroup(id);
        assert_eq!(first.path.as_ref(), container_path());
        assert_eq!(first.get(POD_UID), Some(UID));
        assert_eq!(first.get(POD), None);
        // Same generation: the cached labels are returned as they are.
        assert!(Arc::ptr_eq(&first, &labeler.cgroup(id)));

        let cid = format!("containerd://{CID}");
        let p = pods::tests::pod("shop", "cart-0", UID, &[("app", &cid)]);
        store.apply(&p, Instant::now());
        let named = labeler.cgroup(id);
        assert_eq!(named.get(NAMESPACE), Some("shop"));
        assert_eq!(named.get(POD), Some("cart-0"));
        assert_eq!(named.get(CONTAINER), Some("app"));
        assert_eq!(named.get(CONTAINER_ID), Some(CID));

        // Complete labels never change: the pod going away does not relabel its series.
        store.delete(&p, Instant::now());
        store.apply(
            &pods::tests::pod("x", "y", "11111111-1111-1111-1111-111111111111", &[]),
            Instant::now(),
        );
        assert!(store.lookup(UID, None).is_none());
        assert!(Arc::ptr_eq(&named, &labeler.cgroup(id)));

        let mut attributes: Vec<_> = named
            .extra
            .iter()
            .filter_map(|(label, value)| Some((span_attribute(label)?, &**value)))
            .collect();
        attributes.sort();
        assert_eq!(
            attributes,
            [
                ("container.id", CID),
                ("k8s.container.name", "app"),
                ("k8s.namespace.name", "shop"),
                ("k8s.pod.name", "cart-0"),
                ("k8s.pod.uid", UID),
            ]
        );
    }
}
