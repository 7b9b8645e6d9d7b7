//! Pod and container identity from a cgroup v2 path alone (no API access needed).
//!
//! The kubelet names pod cgroups after the pod UID and the container runtime names container
//! cgroups after the container id, so both are in the path of every task of a pod:
//!
//! | driver | layout |
//! | --- | --- |
//! | systemd | `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid, - as _>.slice/<runtime>-<id>.scope` |
//! | systemd, Guaranteed QoS | `/kubepods.slice/kubepods-pod<uid>.slice/<runtime>-<id>.scope` |
//! | cgroupfs | `/kubepods/<qos>/pod<uid>/<id>` (CRI-O: `crio-<id>`), Guaranteed: `/kubepods/pod<uid>/<id>` |
//!
//! `<runtime>` is `cri-containerd`, `crio` or `docker` (dockershim and cri-dockerd). The pod
//! component may sit below other components (a kubelet in a container, as kind runs it:
//! `/system.slice/docker-<node>.scope/kubelet.slice/kubelet-kubepods.slice/...`); the innermost
//! pod wins, and the container is the component right below it (deeper cgroups a container
//! creates for itself belong to that container). Paths without a pod component, such as systemd
//! services or containers run by docker or podman outside Kubernetes, yield nothing.

use std::sync::Arc;

/// What a cgroup path says about Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubernetesIds {
    /// The pod UID as the kubelet knows it: `metadata.uid` for API pods, the config hash for
    /// static pods (which their mirror pod carries as the `kubernetes.io/config.mirror`
    /// annotation). Dashed form, as the API prints it.
    pub pod_uid: Arc<str>,
    /// The container id without its runtime prefix (what follows `containerd://`, `cri-o://`
    /// or `docker://` in the pod's `containerStatuses[].containerID`); `None` for the pod-level
    /// cgroup and for CRI-O's conmon monitor.
    pub container_id: Option<Arc<str>>,
}

/// Parses a cgroup v2 path relative to the hierarchy root (e.g. `/kubepods.slice/...`).
pub(crate) fn parse(path: &str) -> Option<KubernetesIds> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (index, pod_uid) = parts
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, part)| pod_component(&parts[..i], part).map(|uid| (i, uid)))?;
    let container_id = parts
        .get(index + 1)
        .and_then(|c| container_component(c))
        .map(Arc::from);
    Some(KubernetesIds {
        pod_uid: Arc::from(pod_uid.as_str()),
        container_id,
    })
}

/// The pod UID if `part` is a pod cgroup (`before` are the components above it).
fn pod_component(before: &[&str], part: &str) -> Option<String> {
    if let Some(stem) = part.strip_suffix(".slice") {
        // systemd: the slice name spells out its ancestry, "kubepods-burstable-pod<uid>".
        let (parent, uid) = stem.rsplit_once("-pod")?;
        let known_parent = ["kubepods", "kubepods-besteffort", "kubepods-burstable"]
            .iter()
            .any(|p| parent == *p || parent.ends_with(&format!("-{p}")));
        if !known_parent {
            return None;
        }
        return normalize_uid(&uid.replace('_', "-"));
    }
    // cgroupfs: "pod<uid>" right below "kubepods" or "kubepods/<qos>".
    let uid = part.strip_prefix("pod")?;
    let under_kubepods = matches!(
        before,
        [.., "kubepods"] | [.., "kubepods", "besteffort" | "burstable"]
    );
    if !under_kubepods {
        return None;
    }
    normalize_uid(uid)
}

/// A pod UID in the form the API uses: a dashed UUID, or the 32 hex digits of a static pod's
/// config hash. Anything else is not a pod UID.
pub(crate) fn normalize_uid(uid: &str) -> Option<String> {
    let hex_only: String = uid.chars().filter(|c| *c != '-').collect();
    if hex_only.len() != 32 || !hex_only.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    if uid.contains('-') {
        let groups: Vec<usize> = uid.split('-').map(str::len).collect();
        if groups != [8, 4, 4, 4, 12] {
            return None;
        }
    }
    Some(uid.to_ascii_lowercase())
}

/// The container id if `part` is a container cgroup right below a pod cgroup.
fn container_component(part: &str) -> Option<&str> {
    let stem = part.strip_suffix(".scope").unwrap_or(part);
    // CRI-O's monitor process lives beside the container, not in it.
    if stem.starts_with("crio-conmon-") {
        return None;
    }
    for prefix in ["cri-containerd-", "crio-", "docker-", "cri-o-"] {
        if let Some(id) = stem.strip_prefix(prefix) {
            return is_container_id(id, 12).then_some(id);
        }
    }
    // cgroupfs driver with containerd or docker: the bare id. Without a prefix, insist on a
    // full-length id so that arbitrary names below a pod are not taken for containers.
    is_container_id(stem, 64).then_some(stem)
}

fn is_container_id(id: &str, min_len: usize) -> bool {
    (min_len..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0d1e5f3a-8b2c-4d6e-9f10-1a2b3c4d5e6f";
    const UID_US: &str = "0d1e5f3a_8b2c_4d6e_9f10_1a2b3c4d5e6f";
    const CID: &str = "4c7a9e0d2b1f8e6a3c5d7b9f1e0a2c4b6d8f0e1a3c5b7d9f2e4a6c8b0d1f3e5a";
    /// A static pod's UID: the kubelet's hash of its manifest.
    const STATIC: &str = "3a1f2c6e8d9b4e7f0a1b2c3d4e5f6a7b";

    fn ids(pod: &str, container: Option<&str>) -> Option<KubernetesIds> {
        Some(KubernetesIds {
            pod_uid: Arc::from(pod),
            container_id: container.map(Arc::from),
        })
    }

    #[test]
    fn real_world_paths() {
        let cases: Vec<(String, Option<KubernetesIds>)> = vec![
            // systemd driver, containerd, each QoS class.
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/cri-containerd-{CID}.scope"),
                ids(UID, Some(CID)),
            ),
            (
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice/cri-containerd-{CID}.scope"),
                ids(UID, Some(CID)),
            ),
            // Guaranteed pods have no QoS slice.
            (
                format!("/kubepods.slice/kubepods-pod{UID_US}.slice/cri-containerd-{CID}.scope"),
                ids(UID, Some(CID)),
            ),
            // CRI-O, and its conmon monitor beside the container.
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/crio-{CID}.scope"),
                ids(UID, Some(CID)),
            ),
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice/crio-conmon-{CID}.scope"),
                ids(UID, None),
            ),
            // Docker (dockershim, cri-dockerd).
            (
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_US}.slice/docker-{CID}.scope"),
                ids(UID, Some(CID)),
            ),
            // The pod-level cgroup itself (pod overhead, processes of no container).
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_US}.slice"),
                ids(UID, None),
            ),
            // Cgroups a container made for itself (systemd in a container, crun's "container").
            (
                format!("/kubepods.slice/kubepods-pod{UID_US}.slice/crio-{CID}.scope/container"),
                ids(UID, Some(CID)),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{UID_US}.slice/cri-containerd-{CID}.scope/system.slice/nginx.service"),
                ids(UID, Some(CID)),
            ),
            // cgroupfs driver: containerd/docker (bare id), CRI-O (prefixed), Guaranteed.
            (format!("/kubepods/burstable/pod{UID}/{CID}"), ids(UID, Some(CID))),
            (format!("/kubepods/besteffort/pod{UID}/{CID}"), ids(UID, Some(CID))),
            (format!("/kubepods/pod{UID}/{CID}"), ids(UID, Some(CID))),
            (format!("/kubepods/besteffort/pod{UID}/crio-{CID}"), ids(UID, Some(CID))),
            (format!("/kubepods/burstable/pod{UID}"), ids(UID, None)),
            // Static pods: the UID is the manifest hash, with no dashes.
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/cri-containerd-{CID}.scope"),
                ids(STATIC, Some(CID)),
            ),
            (format!("/kubepods/burstable/pod{STATIC}/{CID}"), ids(STATIC, Some(CID))),
            // Upper-case hex is normalised to the API's lower case.
            (
                format!("/kubepods/pod{}/{CID}", UID.to_ascii_uppercase()),
                ids(UID, Some(CID)),
            ),
            // A kubelet in a container (kind: --cgroup-root=/kubelet, systemd driver) below the
            // node container's own docker scope, which must not be taken for the container.
            (
                format!("/system.slice/docker-{CID}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_US}.slice/cri-containerd-aaaabbbbccccddddeeeeffff00001111222233334444555566667777888899990000.scope"),
                ids(UID, Some("aaaabbbbccccddddeeeeffff00001111222233334444555566667777888899990000")),
            ),
            // ... and with the cgroupfs driver in a docker container (k3d, kind with cgroupfs).
            (
                format!("/docker/{CID}/kubepods/besteffort/pod{UID}/{}", "f".repeat(64)),
                ids(UID, Some(&"f".repeat(64))),
            ),
            // Kubernetes inside a pod: the innermost pod is the workload's.
            (
                format!("/kubepods/burstable/pod{STATIC}/{CID}/kubepods/pod{UID}/{}", "e".repeat(64)),
                ids(UID, Some(&"e".repeat(64))),
            ),
        ];
        for (path, want) in cases {
            assert_eq!(parse(&path), want, "{path}");
        }
    }

    #[test]
    fn non_kubernetes_paths_yield_nothing() {
        let paths = [
            "/".to_string(),
            "/init.scope".into(),
            "/system.slice/sshd.service".into(),
            "/system.slice/containerd.service".into(),
            "/user.slice/user-1000.slice/session-3.scope".into(),
            "/user.slice/user-1000.slice/user@1000.service/app.slice/podman-1234.scope".into(),
            // docker and podman without Kubernetes.
            format!("/system.slice/docker-{CID}.scope"),
            format!("/docker/{CID}"),
            format!("/machine.slice/libpod-{CID}.scope"),
            // The kubelet's own slices, without a pod.
            "/kubepods.slice".into(),
            "/kubepods.slice/kubepods-burstable.slice".into(),
            "/kubepods/besteffort".into(),
            // Look-alikes: "pod" prefixes that are not UIDs or not under kubepods.
            "/system.slice/podman.service".into(),
            format!("/mypods/pod{UID}/{CID}"),
            format!("/kubepods/pod{}/x", "1234"),
            "/kubepods.slice/kubepods-podnotauid.slice".into(),
            format!("/other.slice/other-pod{UID_US}.slice/cri-containerd-{CID}.scope"),
            // Misplaced dashes are not a UUID.
            format!("/kubepods/pod0d1e5f3a8b2c-4d6e9f10-1a2b3c4d5e6f/{CID}"),
            "(unresolved)".into(),
        ];
        for path in paths {
            assert_eq!(parse(&path), None, "{path}");
        }
    }

    #[test]
    fn unknown_children_of_a_pod_have_no_container() {
        // Short or non-hex names under a pod are not containers: the pod is still known.
        for child in ["foo", "abc123", "cri-containerd-xyz.scope", "crio-12.scope"] {
            let path = format!("/kubepods/burstable/pod{UID}/{child}");
            assert_eq!(parse(&path), ids(UID, None), "{path}");
        }
        // Short ids with a runtime prefix are accepted (some runtimes use 12+ hex digits).
        let path = format!("/kubepods.slice/kubepods-pod{UID_US}.slice/docker-0123456789ab.scope");
        assert_eq!(parse(&path), ids(UID, Some("0123456789ab")));
    }
}
