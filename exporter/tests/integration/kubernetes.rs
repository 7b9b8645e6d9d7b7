//! Kubernetes identity on the real kernel: a kubelet-like cgroup hierarchy (systemd and
//! cgroupfs drivers) under the cgroup v2 mount, a child running inside the container-like
//! cgroup, and `pod_uid`/`container_id` (and, with a pod watch against a fake API server,
//! `namespace`/`pod`/`container`) on its syscall series from a running exporter.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::*;

const CALLS: u64 = 321;

/// A pod list of one pod, `ml/trainer-0` on `node-test`, whose container `pytorch` runs as
/// `cid`.
pub(crate) fn trainer_pod_list(uid: &str, cid: &str) -> String {
    trainer_pod_list_with(
        uid,
        serde_json::json!({
            "name": "pytorch", "containerID": format!("containerd://{cid}"),
            "image": "img", "imageID": "", "ready": true, "restartCount": 0
        }),
    )
}

/// The same pod list with `status` as its container's status.
pub(crate) fn trainer_pod_list_with(uid: &str, status: serde_json::Value) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"},
        "items": [{
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer-0", "namespace": "ml", "uid": uid, "resourceVersion": "7"},
            "spec": {"nodeName": "node-test", "containers": [{"name": "pytorch"}]},
            "status": {"containerStatuses": [status]}
        }]
    })
    .to_string()
}

/// Waits until `exporter` reports its pod watch up (the pod list arrives in the background).
pub(crate) fn wait_for_pod_watch(exporter: &Exporter) {
    let up = eventually(Duration::from_secs(20), || {
        let samples = parse_samples(&exporter.scrape());
        (sum(
            &samples,
            "sysscope_collector_up",
            &[("collector", "kubernetes")],
        ) == 1.0)
            .then_some(())
    });
    assert!(up.is_some(), "the pod watch never came up");
}

/// A random pod UID (dashed UUID form) and container id (64 hex digits).
pub(crate) fn fresh_ids() -> (String, String) {
    let u: u128 = rand::random();
    let h = format!("{u:032x}");
    let uid = format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    );
    let cid = format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    );
    (uid, cid)
}

/// Nested cgroups created level by level and removed deepest first.
pub(crate) struct Hierarchy {
    levels: Vec<TestCgroup>,
}

impl Hierarchy {
    /// Creates `top/c1/c2/...`. The kubelet's top-level cgroup is used as is when this machine
    /// has none (so paths look exactly like a node's); on a real node, the test hierarchy goes
    /// below a unique parent instead (as a kubelet in a container would), never into the
    /// kubelet's own.
    pub(crate) fn create(top: &str, below: &[&str]) -> Self {
        let mut levels = Vec::new();
        let mut rel = if cgroup_root().join(top).exists() {
            let parent = format!("sysscope-test-k8s-{}-{}", std::process::id(), rand_suffix());
            levels.push(TestCgroup::at(&parent));
            format!("{parent}/{top}")
        } else {
            top.to_string()
        };
        levels.push(TestCgroup::at(&rel));
        for c in below {
            rel = format!("{rel}/{c}");
            levels.push(TestCgroup::at(&rel));
        }
        Self { levels }
    }

    /// The deepest cgroup.
    pub(crate) fn leaf(&self) -> &TestCgroup {
        self.levels.last().unwrap()
    }

    fn level(&self, from_leaf: usize) -> &TestCgroup {
        &self.levels[self.levels.len() - 1 - from_leaf]
    }
}

impl Drop for Hierarchy {
    fn drop(&mut self) {
        while let Some(level) = self.levels.pop() {
            drop(level);
        }
    }
}

fn getppid_series<'a>(samples: &'a [Sample], cg: &TestCgroup) -> Vec<&'a Sample> {
    select(
        samples,
        "sysscope_syscalls_total",
        &[("cgroup", cg.rel.as_str()), ("syscall", "getppid")],
    )
}

#[test]
fn systemd_driver_ids_on_syscall_series() {
    if !require_root("systemd_driver_ids_on_syscall_series") {
        return;
    }
    let exporter = Exporter::start(
        &format!("{TEST_CONFIG}[kubernetes]\npod_watch = \"off\"\n"),
        &[],
    );
    let (uid, cid) = fresh_ids();
    let pod_slice = format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_"));
    let scope = format!("cri-containerd-{cid}.scope");
    let pods = Hierarchy::create(
        "kubepods.slice",
        &["kubepods-burstable.slice", &pod_slice, &scope],
    );
    let plain = TestCgroup::new("sysscope-test-not-k8s");

    // A container process, a pod-level process, and a process outside Kubernetes.
    run_workload_joined(pods.leaf(), &["getppid", &CALLS.to_string()]);
    run_workload_joined(pods.level(1), &["getppid", "7"]);
    run_workload_joined(&plain, &["getppid", "5"]);

    let samples = parse_samples(&exporter.scrape());
    let in_container = getppid_series(&samples, pods.leaf());
    assert_eq!(in_container.len(), 1, "{in_container:?}");
    let s = in_container[0];
    assert_eq!(s.value, CALLS as f64);
    assert_eq!(s.labels.get("pod_uid"), Some(&uid));
    assert_eq!(s.labels.get("container_id"), Some(&cid));
    assert_eq!(
        s.labels.get("comm").map(String::as_str),
        Some(WORKLOAD_COMM)
    );
    // No pod watch: no names.
    assert!(!s.labels.contains_key("pod"), "{s:?}");

    let pod_level = getppid_series(&samples, pods.level(1));
    assert_eq!(pod_level.len(), 1, "{pod_level:?}");
    assert_eq!(pod_level[0].value, 7.0);
    assert_eq!(pod_level[0].labels.get("pod_uid"), Some(&uid));
    assert!(!pod_level[0].labels.contains_key("container_id"));

    let outside = getppid_series(&samples, &plain);
    assert_eq!(outside.len(), 1, "{outside:?}");
    assert_eq!(outside[0].value, 5.0);
    assert!(!outside[0].labels.contains_key("pod_uid"));
    assert!(!outside[0].labels.contains_key("container_id"));
}

/// A minimal Kubernetes API: `GET /api/v1/pods` answers `pods` (a PodList), a watch stays
/// open without events, `GET /api/v1/namespaces/<namespace>/pods/<name>` answers that pod of
/// the list (404 otherwise). Records request paths.
pub(crate) struct FakeApi {
    port: u16,
    pub(crate) requests: Arc<Mutex<Vec<String>>>,
}

impl FakeApi {
    pub(crate) fn start(pod_list: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (list, log) = (pod_list.clone(), log.clone());
                std::thread::spawn(move || serve(stream, &list, &log));
            }
        });
        Self { port, requests }
    }

    pub(crate) fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user:\n    token: test-token\n",
                self.port
            ),
        )
        .unwrap();
        path
    }
}

fn serve(stream: TcpStream, pod_list: &str, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut content_length = 0;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header == "\r\n" {
                break;
            }
            if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                content_length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; content_length];
        let _ = reader.read_exact(&mut body);
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_string();
        log.lock().unwrap().push(path.clone());
        if let Some(rest) = path.strip_prefix("/api/v1/namespaces/") {
            let (status, body) = match one_pod(pod_list, rest.split('?').next().unwrap_or("")) {
                Some(pod) => ("200 OK", pod),
                None => (
                    "404 Not Found",
                    serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "message": format!("pods not found: {rest}"), "reason": "NotFound",
                        "code": 404})
                    .to_string(),
                ),
            };
            let _ = write!(
                out,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            continue;
        }
        if path.contains("watch=true") {
            let _ = out.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            // Keep the watch open, without events, until the exporter goes away.
            let mut buf = [0u8; 64];
            let _ = reader.get_mut().read(&mut buf);
            return;
        }
        let _ = write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            pod_list.len(),
            pod_list
        );
    }
}

/// `<namespace>/pods/<name>` of the list, as JSON.
fn one_pod(pod_list: &str, path: &str) -> Option<String> {
    let (namespace, name) = path.split_once("/pods/")?;
    let list: serde_json::Value = serde_json::from_str(pod_list).ok()?;
    let pod = list["items"]
        .as_array()?
        .iter()
        .find(|p| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == name)?;
    Some(pod.to_string())
}

#[test]
fn cgroupfs_driver_ids_and_names_from_the_pod_watch() {
    if !require_root("cgroupfs_driver_ids_and_names_from_the_pod_watch") {
        return;
    }
    let (uid, cid) = fresh_ids();
    let pod_list = trainer_pod_list(&uid, &cid);
    let api = FakeApi::start(pod_list);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let exporter = Exporter::start_with_env(
        &format!("{TEST_CONFIG}[kubernetes]\npod_watch = \"on\"\nnode_name = \"node-test\"\n"),
        &[],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    // The pod list arrives in the background; the collector reports it.
    wait_for_pod_watch(&exporter);
    let list = api
        .requests
        .lock()
        .unwrap()
        .iter()
        .find(|r| !r.contains("watch=true"))
        .cloned()
        .unwrap();
    assert!(
        list.contains("fieldSelector=spec.nodeName%3Dnode-test"),
        "{list}"
    );

    let pods = Hierarchy::create("kubepods", &["besteffort", &format!("pod{uid}"), &cid]);
    run_workload_joined(pods.leaf(), &["getppid", &CALLS.to_string()]);

    let samples = parse_samples(&exporter.scrape());
    let series = getppid_series(&samples, pods.leaf());
    assert_eq!(series.len(), 1, "{series:?}");
    let s = series[0];
    assert_eq!(s.value, CALLS as f64);
    let label = |k: &str| s.labels.get(k).map(String::as_str);
    assert_eq!(label("pod_uid"), Some(uid.as_str()));
    assert_eq!(label("container_id"), Some(cid.as_str()));
    assert_eq!(label("namespace"), Some("ml"));
    assert_eq!(label("pod"), Some("trainer-0"));
    assert_eq!(label("container"), Some("pytorch"));
    assert_eq!(
        sum(&samples, "sysscope_kubernetes_pods", &[]),
        1.0,
        "pods cached"
    );
}

/// sysscope in a container: its own cgroup namespace, where its cgroup2 mount's root shows as
/// `/..` in mountinfo. It must still find the hierarchy and label cgroups with their paths
/// from the real root, so that pod and container ids parse.
#[test]
fn inside_a_cgroup_namespace_paths_stay_global() {
    if !require_root("inside_a_cgroup_namespace_paths_stay_global") {
        return;
    }
    if std::process::Command::new("unshare")
        .arg("--help")
        .output()
        .is_err()
    {
        panic!("unshare (util-linux) is needed: apt-get install util-linux");
    }
    let home = TestCgroup::new("sysscope-test-cgns");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sysscope.toml");
    std::fs::write(
        &config,
        format!("{TEST_CONFIG}[kubernetes]\npod_watch = \"off\"\n"),
    )
    .unwrap();
    let port = free_port();
    // Joins `home` first, so that the new cgroup namespace is rooted there, not at the root.
    let mut child = home
        .command("unshare")
        .args(["--cgroup", "--"])
        .arg(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--config.file={}", config.display()))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn unshare");
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let ready = eventually(Duration::from_secs(30), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("sysscope exited in a cgroup namespace: {status}");
        }
        matches!(http_get(port, "/-/ready", None), Ok((200, _, _))).then_some(())
    });
    let child = Stop(child);
    assert!(ready.is_some(), "sysscope not ready in a cgroup namespace");
    // It really is in a cgroup namespace of its own (rooted at `home`).
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/cgroup")).unwrap();
    assert_ne!(ns(&child.0.id().to_string()), ns("self"));

    let (uid, cid) = fresh_ids();
    // Below sysscope's own cgroup (a kubelet in a container, as kind runs it): the label is the
    // whole path from the real root, which the parser reads the ids from.
    let top = format!("{}/kubepods", home.rel.trim_start_matches('/'));
    let pods = Hierarchy::create(&top, &[&format!("pod{uid}"), &cid]);
    assert!(pods.leaf().rel.starts_with(&home.rel));
    run_workload_joined(pods.leaf(), &["getppid", &CALLS.to_string()]);
    let (_, _, body) = http_get(port, "/metrics", None).expect("scrape");
    let samples = parse_samples(&body);
    let series = getppid_series(&samples, pods.leaf());
    assert_eq!(series.len(), 1, "{series:?}");
    assert_eq!(series[0].value, CALLS as f64);
    assert_eq!(series[0].labels.get("pod_uid"), Some(&uid));
    assert_eq!(series[0].labels.get("container_id"), Some(&cid));
}
