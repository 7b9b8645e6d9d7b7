//! `--pod NAMESPACE/NAME [--container NAME]`: a pod of this node as a tool's target, resolved
//! to the cgroup the kubelet made for it (or to one container's, below it).
//!
//! The kernel knows cgroups, not pods, and the kubelet names every pod cgroup after the pod's
//! UID (`metadata::kubernetes::cgroup_path` parses each layout): so a pod is found by its UID
//! in a walk of the cgroup v2 hierarchy, and a container by its id in the pod's cgroup. The UID
//! and the container ids come from the Kubernetes API when credentials are there (the pod's
//! service account, as in the DaemonSet, else `KUBECONFIG` or `~/.kube/config`: one `get` of
//! the pod), else from the kubelet's log directories on the node (`/var/log/pods/<namespace>_
//! <name>_<uid>/<container>/`, `/var/log/containers/<name>_<namespace>_<container>-<id>.log`),
//! which name every pod the kubelet runs there. `--pod` also takes the UID itself. A pod
//! without a cgroup here is named with the node it runs on, when the API says.
//!
//! Touches no probe or map: the result is a cgroup directory, which the session measures
//! like `--cgroup` (its descendants included).

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;

use super::CliError;
use crate::{
    config::KubernetesConfig,
    metadata::kubernetes::{cgroup_path, pods, watch},
};

/// Where the kubelet keeps its log directories.
const KUBELET_LOGS: &str = "/var/log";

/// How long the API gets to answer: the tool is interactive, and a pod lookup is one request.
const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const API_READ_TIMEOUT: Duration = Duration::from_secs(15);

/// A pod as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PodRef {
    Named {
        namespace: String,
        name: String,
    },
    /// The UID its cgroups carry (a static pod's is its manifest hash).
    Uid(String),
}

impl PodRef {
    pub(crate) fn parse(text: &str) -> Result<Self, CliError> {
        let text = text.trim();
        if let Some((namespace, name)) = text.split_once('/') {
            if is_name(namespace) && is_name(name) {
                return Ok(Self::Named {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                });
            }
        } else if let Some(uid) = cgroup_path::normalize_uid(text) {
            return Ok(Self::Uid(uid));
        }
        Err(CliError::Usage(format!(
            "--pod `{text}`: give NAMESPACE/NAME (e.g. default/web-0) or the pod's UID \
             (kubectl get pod -n NAMESPACE NAME -o jsonpath='{{.metadata.uid}}')"
        )))
    }
}

/// A Kubernetes object name as namespaces and pods are named (DNS subdomain characters):
/// enough to refuse a path or a typo, never a real name.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// What is known of a pod, from the API or from the kubelet's log directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PodInfo {
    namespace: String,
    name: String,
    /// The UID its cgroups carry.
    uid: String,
    /// The node it is scheduled on (API only).
    node: Option<String>,
    /// `status.phase` (API only).
    phase: Option<String>,
    /// Each container's name and the ids of its instances (current first), as far as known.
    containers: Vec<(String, Vec<String>)>,
    /// From the API (else from the kubelet's log directories, which know no node or phase).
    from_api: bool,
}

impl PodInfo {
    fn from_api(pod: &Pod) -> Option<Self> {
        let (uid, ids) = pods::cgroup_identity(pod)?;
        let md = &pod.metadata;
        let mut containers: Vec<(String, Vec<String>)> = Vec::new();
        if let Some(spec) = &pod.spec {
            let names = spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| &c.name)
                .chain(spec.containers.iter().map(|c| &c.name))
                .chain(spec.ephemeral_containers.iter().flatten().map(|c| &c.name));
            containers.extend(names.map(|n| (n.clone(), Vec::new())));
        }
        for (id, name) in ids {
            match containers.iter_mut().find(|(n, _)| **n == *name) {
                Some((_, known)) => known.push(id.to_string()),
                None => containers.push((name.to_string(), vec![id.to_string()])),
            }
        }
        Some(Self {
            namespace: md.namespace.clone().unwrap_or_default(),
            name: md.name.clone().unwrap_or_default(),
            uid: uid.to_string(),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            containers,
            from_api: true,
        })
    }

    fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A pod of this node (or one of its containers) resolved to its cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodTarget {
    /// Namespace and name, when known (`--pod UID` on a node without the API or the kubelet's
    /// log directories has neither).
    pub(crate) names: Option<(String, String)>,
    pub(crate) uid: String,
    pub(crate) container: Option<String>,
    pub(crate) dir: PathBuf,
    /// The cgroup's path relative to the v2 root.
    pub(crate) rel: String,
}

impl PodTarget {
    /// "pod ml/trainer-0" or "container pytorch of pod ml/trainer-0".
    pub(crate) fn describe(&self) -> String {
        let pod = match &self.names {
            Some((namespace, name)) => format!("pod {namespace}/{name}"),
            None => format!("pod {}", self.uid),
        };
        match &self.container {
            Some(c) => format!("container {c} of {pod}"),
            None => pod,
        }
    }

    pub(crate) fn describe_json(&self) -> serde_json::Value {
        let (namespace, pod) = match &self.names {
            Some((ns, name)) => (Some(ns.as_str()), Some(name.as_str())),
            None => (None, None),
        };
        serde_json::json!({
            "kind": "pod",
            "namespace": namespace,
            "pod": pod,
            "pod_uid": self.uid,
            "container": self.container,
            "cgroup": self.rel,
        })
    }
}

/// Resolves `--pod` (and `--container`) to a cgroup under the v2 root `root`.
pub(crate) fn resolve(
    pod: &str,
    container: Option<&str>,
    root: &Path,
    config: &KubernetesConfig,
) -> Result<PodTarget, CliError> {
    let pod = PodRef::parse(pod)?;
    let info = lookup(&pod)?;
    let uid = match (&pod, &info) {
        (_, Some(info)) => info.uid.clone(),
        (PodRef::Uid(uid), None) => uid.clone(),
        (PodRef::Named { .. }, None) => unreachable!("a named pod is found or refused"),
    };
    let given = match (&pod, &info) {
        (_, Some(info)) => info.display(),
        (PodRef::Uid(uid), None) => uid.clone(),
        (PodRef::Named { .. }, None) => unreachable!("a named pod is found or refused"),
    };
    let Some(pod_dir) = find_pod_cgroup(root, &uid) else {
        return Err(not_here(&given, &uid, info.as_ref(), root, config));
    };
    let names = info.as_ref().map(|i| (i.namespace.clone(), i.name.clone()));
    let dir = match container {
        None => pod_dir,
        Some(name) => {
            let Some(info) = &info else {
                return Err(CliError::NoSuchPod(format!(
                    "--container {name}: the container names of pod {uid} are not known here \
                     (no Kubernetes API credentials and no kubelet log directories on this node): \
                     give --pod NAMESPACE/NAME with API access, or measure the whole pod"
                )));
            };
            container_cgroup(&pod_dir, root, info, name)?
        }
    };
    let rel = relative(root, &dir);
    Ok(PodTarget {
        names,
        uid,
        container: container.map(str::to_string),
        dir,
        rel,
    })
}

/// The pod's names and ids: from the API for NAMESPACE/NAME (from the kubelet's log
/// directories when there are no credentials), from the log directories for a UID (`None`
/// when they do not know it: the UID is enough to find the cgroup).
fn lookup(pod: &PodRef) -> Result<Option<PodInfo>, CliError> {
    let logs = Path::new(KUBELET_LOGS);
    match pod {
        PodRef::Uid(_) => Ok(from_kubelet_logs(logs, pod)),
        PodRef::Named { namespace, name } => match api_get(namespace, name) {
            Ok((_, Some(info))) => Ok(Some(info)),
            Ok((server, None)) => Err(CliError::NoSuchPod(format!(
                "pod {namespace}/{name} not found (Kubernetes API at {server})"
            ))),
            Err(ApiError::NoConfig(why)) => {
                from_kubelet_logs(logs, pod).map(Some).ok_or_else(|| {
                    CliError::NoSuchPod(format!(
                        "cannot find pod {namespace}/{name}: no Kubernetes API credentials \
                         ({why}), and the kubelet's log directories ({}/pods) name no such pod \
                         on this node; give the pod's UID instead (--pod UID)",
                        logs.display()
                    ))
                })
            }
            Err(ApiError::Request { server, message }) => Err(CliError::Fetch {
                what: format!("looking up pod {namespace}/{name} (Kubernetes API at {server})"),
                message,
            }),
        },
    }
}

#[derive(Debug)]
enum ApiError {
    /// Neither an in-cluster service account nor a kubeconfig.
    NoConfig(String),
    Request {
        server: String,
        message: String,
    },
}

/// `GET /api/v1/namespaces/<namespace>/pods/<name>`: the API server's address and the pod,
/// `None` when it does not exist.
fn api_get(namespace: &str, name: &str) -> Result<(String, Option<PodInfo>), ApiError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ApiError::NoConfig(format!("starting the async runtime: {e}")))?;
    runtime.block_on(async {
        let mut config = kube::Config::infer()
            .await
            .map_err(|e| ApiError::NoConfig(e.to_string()))?;
        config.connect_timeout = Some(API_CONNECT_TIMEOUT);
        config.read_timeout = Some(API_READ_TIMEOUT);
        let server = config.cluster_url.to_string();
        let request = |message: String| ApiError::Request {
            server: server.clone(),
            message,
        };
        let client = kube::Client::try_from(config)
            .map_err(|e| request(crate::util::error::Chain(&e).to_string()))?;
        let api: kube::Api<Pod> = kube::Api::namespaced(client, namespace);
        let pod = api.get_opt(name).await.map_err(|e| match e {
            kube::Error::Api(status) => request(format!(
                "HTTP {}: {}",
                status.code,
                if status.message.is_empty() {
                    status.reason.as_str()
                } else {
                    status.message.as_str()
                }
            )),
            other => request(crate::util::error::Chain(&other).to_string()),
        })?;
        Ok((server.clone(), pod.as_ref().and_then(PodInfo::from_api)))
    })
}

/// A pod as the kubelet's log directories under `logs` know it: `pods/<namespace>_<name>_<uid>`
/// names the pod, the links `containers/<name>_<namespace>_<container>-<id>.log` its
/// containers' ids (namespaces, pod and container names never hold `_`).
fn from_kubelet_logs(logs: &Path, pod: &PodRef) -> Option<PodInfo> {
    let entries = std::fs::read_dir(logs.join("pods")).ok()?;
    let mut info = entries.flatten().find_map(|e| {
        let file = e.file_name();
        let mut parts = file.to_str()?.splitn(3, '_');
        let (namespace, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
        let uid = cgroup_path::normalize_uid(uid)?;
        let wanted = match pod {
            PodRef::Named {
                namespace: ns,
                name: n,
            } => ns == namespace && n == name,
            PodRef::Uid(u) => *u == uid,
        };
        wanted.then(|| PodInfo {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid,
            ..PodInfo::default()
        })
    })?;
    if let Ok(dirs) = std::fs::read_dir(
        logs.join("pods")
            .join(format!("{}_{}_{}", info.namespace, info.name, info.uid)),
    ) {
        let mut names: Vec<String> = dirs
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        names.sort();
        info.containers = names.into_iter().map(|n| (n, Vec::new())).collect();
    }
    let prefix = format!("{}_{}_", info.name, info.namespace);
    for e in std::fs::read_dir(logs.join("containers"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let file = e.file_name();
        let Some(rest) = file
            .to_str()
            .and_then(|f| f.strip_suffix(".log"))
            .and_then(|f| f.strip_prefix(&prefix))
        else {
            continue;
        };
        let Some((container, id)) = rest.rsplit_once('-') else {
            continue;
        };
        match info.containers.iter_mut().find(|(n, _)| n == container) {
            Some((_, ids)) => ids.push(id.to_string()),
            None => info
                .containers
                .push((container.to_string(), vec![id.to_string()])),
        }
    }
    Some(info)
}

/// The shallowest cgroup under `root` whose path names pod `uid` and no container: the pod's
/// own (breadth first, so a container's nested cgroups never come first).
fn find_pod_cgroup(root: &Path, uid: &str) -> Option<PathBuf> {
    let mut queue = VecDeque::from([root.to_path_buf()]);
    while let Some(dir) = queue.pop_front() {
        let ids = cgroup_path::parse(&relative(root, &dir));
        if ids
            .as_ref()
            .is_some_and(|k| &*k.pod_uid == uid && k.container_id.is_none())
        {
            return Some(dir);
        }
        // Below a container nothing else is this pod's own cgroup.
        if ids.is_some_and(|k| k.container_id.is_some()) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                queue.push_back(e.path());
            }
        }
    }
    None
}

/// The cgroup of container `name` right below the pod's.
fn container_cgroup(
    pod_dir: &Path,
    root: &Path,
    info: &PodInfo,
    name: &str,
) -> Result<PathBuf, CliError> {
    let Some((_, ids)) = info.containers.iter().find(|(n, _)| n == name) else {
        let known: Vec<&str> = info.containers.iter().map(|(n, _)| n.as_str()).collect();
        return Err(CliError::NoSuchPod(format!(
            "pod {} has no container {name} (its containers: {})",
            info.display(),
            if known.is_empty() {
                "none known".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    let children: Vec<PathBuf> = std::fs::read_dir(pod_dir)
        .map_err(|e| CliError::io(format!("reading {}", pod_dir.display()), e))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    // The current instance first: a restarted container's previous one may still be exiting.
    for id in ids {
        let found = children.iter().find(|dir| {
            cgroup_path::parse(&relative(root, dir))
                .and_then(|k| k.container_id)
                .is_some_and(|c| *c == **id)
        });
        if let Some(dir) = found {
            return Ok(dir.clone());
        }
    }
    Err(CliError::NoSuchPod(format!(
        "container {name} of pod {} has no cgroup under {}: {}",
        info.display(),
        pod_dir.display(),
        if ids.is_empty() {
            "it has not started (no container id yet)"
        } else {
            "it is not running"
        }
    )))
}

/// Why a pod has no cgroup here, naming the node it runs on when the API says.
fn not_here(
    given: &str,
    uid: &str,
    info: Option<&PodInfo>,
    root: &Path,
    config: &KubernetesConfig,
) -> CliError {
    let this = this_node(config);
    let this_text = this.as_deref().unwrap_or("unknown: set NODE_NAME");
    let phase = info
        .and_then(|i| i.phase.as_deref())
        .map(|p| format!(" (phase {p})"))
        .unwrap_or_default();
    let message = match info {
        Some(i) if i.from_api => match (&i.node, &this) {
            (Some(node), Some(me)) if node == me => format!(
                "pod {given} (UID {uid}) is on this node ({node}) but has no cgroup under {}: \
                 it is not running{phase}",
                root.display()
            ),
            (Some(node), _) => format!(
                "pod {given} runs on node {node}, not on this node ({this_text}): run sysscope \
                 there (in the cluster, `kubectl exec` into the sysscope pod of node {node}: \
                 kubectl get pods -n sysscope -o name --field-selector spec.nodeName={node})"
            ),
            (None, _) => format!("pod {given} is not scheduled on a node yet{phase}"),
        },
        // Known to this node's kubelet, which keeps the log directories of ended pods a while.
        Some(_) => format!(
            "pod {given} (UID {uid}) has no cgroup under {} on this node ({this_text}): it has \
             ended",
            root.display()
        ),
        None => format!(
            "pod {given} (UID {uid}) has no cgroup under {} on this node ({this_text}): it runs \
             on another node, or has ended",
            root.display()
        ),
    };
    CliError::NoSuchPod(message)
}

/// This node's name: `kubernetes.node_name`, `$NODE_NAME`, else the host name (the kubelet's
/// default node name).
pub(crate) fn this_node(config: &KubernetesConfig) -> Option<String> {
    watch::node_name(config).or_else(|| {
        Some(crate::util::pseudo_file::hostname().to_ascii_lowercase()).filter(|h| !h.is_empty())
    })
}

fn relative(root: &Path, dir: &Path) -> String {
    match dir.strip_prefix(root) {
        Ok(rel) if rel.as_os_str().is_empty() => "/".to_string(),
        Ok(rel) => format!("/{}", rel.to_string_lossy()),
        Err(_) => dir.to_string_lossy().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0d1e5f3a-8b2c-4d6e-9f10-1a2b3c4d5e6f";
    const CID: &str = "4c7a9e0d2b1f8e6a3c5d7b9f1e0a2c4b6d8f0e1a3c5b7d9f2e4a6c8b0d1f3e5a";
    const OLD: &str = "aaaa9e0d2b1f8e6a3c5d7b9f1e0a2c4b6d8f0e1a3c5b7d9f2e4a6c8b0d1f3e5a";

    #[test]
    fn pod_references() {
        assert_eq!(
            PodRef::parse("ml/trainer-0").unwrap(),
            PodRef::Named {
                namespace: "ml".into(),
                name: "trainer-0".into()
            }
        );
        assert_eq!(
            PodRef::parse(&UID.to_ascii_uppercase()).unwrap(),
            PodRef::Uid(UID.into())
        );
        for bad in ["trainer-0", "ml/", "/x", "a/b/c", "ML/x", "ml/x y", ""] {
            let e = PodRef::parse(bad).unwrap_err().to_string();
            assert!(e.contains("NAMESPACE/NAME"), "{bad}: {e}");
        }
    }

    fn mkdirs(root: &Path, rel: &str) -> PathBuf {
        let d = root.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn finds_the_pod_cgroup_and_its_containers_in_every_layout() {
        let uid_ = UID.replace('-', "_");
        for (pod, container) in [
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
                ),
                format!("cri-containerd-{CID}.scope"),
            ),
            (
                format!("/kubepods.slice/kubepods-pod{uid_}.slice"),
                format!("crio-{CID}.scope"),
            ),
            (format!("/kubepods/besteffort/pod{UID}"), CID.to_string()),
            (
                format!("/system.slice/docker-{CID}.scope/kubepods/pod{UID}"),
                CID.to_string(),
            ),
        ] {
            let root = tempfile::tempdir().unwrap();
            let pod_dir = mkdirs(root.path(), &pod);
            let c = mkdirs(&pod_dir, &container);
            // A container's own cgroups and another pod's come to nothing.
            mkdirs(&c, "init.scope");
            mkdirs(
                root.path(),
                "/kubepods/pod11111111-2222-3333-4444-555555555555/x",
            );
            assert_eq!(
                find_pod_cgroup(root.path(), UID),
                Some(pod_dir.clone()),
                "{pod}"
            );
            let info = PodInfo {
                namespace: "ml".into(),
                name: "trainer-0".into(),
                uid: UID.into(),
                containers: vec![
                    ("pytorch".into(), vec![CID.into(), OLD.into()]),
                    ("sidecar".into(), vec![]),
                ],
                ..PodInfo::default()
            };
            assert_eq!(
                container_cgroup(&pod_dir, root.path(), &info, "pytorch").unwrap(),
                c
            );
            let e = container_cgroup(&pod_dir, root.path(), &info, "sidecar").unwrap_err();
            assert!(e.to_string().contains("has not started"), "{e}");
            let e = container_cgroup(&pod_dir, root.path(), &info, "nope").unwrap_err();
            assert!(
                e.to_string().contains("its containers: pytorch, sidecar"),
                "{e}"
            );
        }
        let root = tempfile::tempdir().unwrap();
        mkdirs(root.path(), "/kubepods/burstable");
        assert_eq!(find_pod_cgroup(root.path(), UID), None);
    }

    #[test]
    fn kubelet_log_directories_name_pods_and_containers() {
        let logs = tempfile::tempdir().unwrap();
        mkdirs(logs.path(), &format!("pods/ml_trainer-0_{UID}/pytorch"));
        mkdirs(logs.path(), &format!("pods/ml_trainer-0_{UID}/init-data"));
        mkdirs(
            logs.path(),
            "pods/ml_other_11111111-2222-3333-4444-555555555555/x",
        );
        let containers = logs.path().join("containers");
        std::fs::create_dir_all(&containers).unwrap();
        for f in [
            format!("trainer-0_ml_pytorch-{CID}.log"),
            format!("trainer-0_ml_init-data-{OLD}.log"),
            format!("other_ml_x-{OLD}.log"),
        ] {
            std::fs::write(containers.join(f), "").unwrap();
        }
        let by_name = PodRef::Named {
            namespace: "ml".into(),
            name: "trainer-0".into(),
        };
        let info = from_kubelet_logs(logs.path(), &by_name).unwrap();
        assert_eq!(info.uid, UID);
        assert_eq!(
            info.containers,
            vec![
                ("init-data".to_string(), vec![OLD.to_string()]),
                ("pytorch".to_string(), vec![CID.to_string()]),
            ]
        );
        let by_uid = from_kubelet_logs(logs.path(), &PodRef::Uid(UID.into())).unwrap();
        assert_eq!(by_uid, info);
        let missing = PodRef::Named {
            namespace: "ml".into(),
            name: "trainer-1".into(),
        };
        assert_eq!(from_kubelet_logs(logs.path(), &missing), None);
        assert_eq!(from_kubelet_logs(Path::new("/nonexistent"), &by_name), None);
    }

    #[test]
    fn a_pod_elsewhere_is_named_with_its_node() {
        let config = KubernetesConfig {
            node_name: Some("node-a".into()),
            ..KubernetesConfig::default()
        };
        let mut info = PodInfo {
            namespace: "ml".into(),
            name: "trainer-0".into(),
            uid: UID.into(),
            node: Some("node-b".into()),
            phase: Some("Running".into()),
            from_api: true,
            ..PodInfo::default()
        };
        let root = Path::new("/sys/fs/cgroup");
        let e = not_here("ml/trainer-0", UID, Some(&info), root, &config).to_string();
        assert!(
            e.contains("runs on node node-b, not on this node (node-a)")
                && e.contains("spec.nodeName=node-b"),
            "{e}"
        );
        info.node = Some("node-a".into());
        let e = not_here("ml/trainer-0", UID, Some(&info), root, &config).to_string();
        assert!(
            e.contains("is on this node (node-a) but has no cgroup"),
            "{e}"
        );
        info.node = None;
        info.phase = Some("Pending".into());
        let e = not_here("ml/trainer-0", UID, Some(&info), root, &config).to_string();
        assert!(
            e.contains("not scheduled on a node yet (phase Pending)"),
            "{e}"
        );
        let e = not_here(UID, UID, None, root, &config).to_string();
        assert!(
            e.contains("on this node (node-a): it runs on another node"),
            "{e}"
        );
        info.from_api = false;
        let e = not_here("ml/trainer-0", UID, Some(&info), root, &config).to_string();
        assert!(e.contains("on this node (node-a): it has ended"), "{e}");
    }

    #[test]
    fn targets_describe_themselves() {
        let t = PodTarget {
            names: Some(("ml".into(), "trainer-0".into())),
            uid: UID.into(),
            container: Some("pytorch".into()),
            dir: PathBuf::from("/sys/fs/cgroup/kubepods/x"),
            rel: "/kubepods/x".into(),
        };
        assert_eq!(t.describe(), "container pytorch of pod ml/trainer-0");
        assert_eq!(t.describe_json()["pod_uid"], UID);
        let t = PodTarget {
            names: None,
            container: None,
            ..t
        };
        assert_eq!(t.describe(), format!("pod {UID}"));
        assert_eq!(t.describe_json()["namespace"], serde_json::Value::Null);
    }
}
