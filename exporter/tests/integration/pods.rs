//! The command-line tools aimed at a pod (`--pod NAMESPACE/NAME [--container NAME]`, `top --by
//! pod`): a kubelet-like cgroup tree (cgroupfs driver) with live processes in two containers,
//! the pod's UID and container ids from the test's fake Kubernetes API, exact counts per pod and
//! per container; a pod on another node named with that node; and the same tools run the way
//! `kubectl exec` runs them in the DaemonSet's pod (CAP_BPF and CAP_PERFMON only, a cgroup
//! namespace of its own, the host's cgroup hierarchy read-only), where `-- CMD` is refused
//! with a message saying what works instead.

use std::{
    io::{BufReader, Write},
    process::{Child, Command, Stdio},
};

use crate::{
    common::*,
    kubernetes::{fresh_ids, FakeApi, Hierarchy},
};

const NODE: &str = "node-test";

/// A pod `ml/trainer-0` on [`NODE`] with containers `pytorch` and `sidecar`, as the API
/// lists it, in a kubepods tree below a cgroup of the test's own.
struct Pod {
    api: FakeApi,
    kubeconfig: std::path::PathBuf,
    uid: String,
    // Dropped first: the containers, then the pod's levels, then the test's own parent.
    pytorch: TestCgroup,
    sidecar: TestCgroup,
    _pods: Hierarchy,
    _parent: TestCgroup,
    _dir: tempfile::TempDir,
}

/// The API's list of pods: `ml/trainer-0` with UID `uid` on `node`, containers `pytorch` and
/// `sidecar` with these ids.
fn pod_list(uid: &str, node: &str, pytorch_id: &str, sidecar_id: &str) -> String {
    let status = |name: &str, id: &str| {
        serde_json::json!({
            "name": name, "containerID": format!("containerd://{id}"),
            "image": "img", "imageID": "", "ready": true, "restartCount": 0
        })
    };
    serde_json::json!({
        "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"},
        "items": [{
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "trainer-0", "namespace": "ml", "uid": uid,
                         "resourceVersion": "7"},
            "spec": {"nodeName": node,
                     "containers": [{"name": "pytorch"}, {"name": "sidecar"}]},
            "status": {"phase": "Running", "containerStatuses": [
                status("pytorch", pytorch_id), status("sidecar", sidecar_id)
            ]}
        }]
    })
    .to_string()
}

fn env(kubeconfig: &std::path::Path, node: &str) -> Vec<(String, String)> {
    vec![
        ("KUBECONFIG".into(), kubeconfig.to_str().unwrap().into()),
        ("NODE_NAME".into(), node.into()),
    ]
}

impl Pod {
    fn start(node: &str) -> Self {
        let (uid, pytorch_id) = fresh_ids();
        let (_, sidecar_id) = fresh_ids();
        let api = FakeApi::start(pod_list(&uid, node, &pytorch_id, &sidecar_id));
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = api.kubeconfig(dir.path());
        let parent = TestCgroup::new("sysscope-test-pods");
        let top = format!("{}/kubepods", parent.rel.trim_start_matches('/'));
        let pods = Hierarchy::create(&top, &["besteffort", &format!("pod{uid}")]);
        let pod_rel = pods.leaf().rel.trim_start_matches('/').to_string();
        Self {
            api,
            kubeconfig,
            uid,
            pytorch: TestCgroup::at(&format!("{pod_rel}/{pytorch_id}")),
            sidecar: TestCgroup::at(&format!("{pod_rel}/{sidecar_id}")),
            _pods: pods,
            _parent: parent,
            _dir: dir,
        }
    }

    /// The environment a tool finds the API and its node by.
    fn env(&self, node: &str) -> Vec<(String, String)> {
        env(&self.kubeconfig, node)
    }
}

/// sysscope `args`, run through `wrapper` (which execs its arguments) with `env`.
fn tool(wrapper: &[&str], args: &[&str], env: &[(String, String)]) -> Command {
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(sysscope_bin());
            c
        }
        None => Command::new(sysscope_bin()),
    };
    cmd.args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    cmd
}

/// Starts a measuring tool and returns once it measures (its progress line says so).
fn measuring(mut cmd: Command) -> (Child, BufReader<std::process::ChildStderr>) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sysscope");
    until_measuring(child)
}

/// Stops a measuring tool with Ctrl-C and returns its JSON summary.
fn interrupt(child: Child, mut err: BufReader<std::process::ChildStderr>) -> serde_json::Value {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    assert_eq!(out.status.code(), Some(0), "{rest}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn calls(summary: &serde_json::Value, name: &str) -> Option<u64> {
    summary["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["syscall"] == name)
        .map(|r| r["calls"].as_u64().unwrap())
}

/// A workload in `cg` that makes `n` getppid calls once a line arrives on its stdin.
fn held_workload(cg: &TestCgroup, n: u64) -> Child {
    cg.command(workload_bin())
        .args(["wait-stdin", "getppid", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn release(mut work: Child) {
    let mut stdin = work.stdin.take().unwrap();
    writeln!(stdin).unwrap();
    drop(stdin);
    assert!(work.wait().unwrap().success());
}

#[test]
fn summary_of_a_pod_and_of_one_of_its_containers() {
    if !require_root("summary_of_a_pod_and_of_one_of_its_containers") {
        return;
    }
    let pod = Pod::start(NODE);
    let env = pod.env(NODE);
    let a = held_workload(&pod.pytorch, 3000);
    let b = held_workload(&pod.sidecar, 700);
    let whole = measuring(tool(
        &[],
        &["summary", "--json", "--pod", "ml/trainer-0"],
        &env,
    ));
    let one = measuring(tool(
        &[],
        &[
            "summary",
            "--json",
            "--pod",
            "ml/trainer-0",
            "--container",
            "pytorch",
        ],
        &env,
    ));
    release(a);
    release(b);
    let whole = interrupt(whole.0, whole.1);
    let one = interrupt(one.0, one.1);
    assert_eq!(calls(&whole, "getppid"), Some(3700), "{whole}");
    assert_eq!(calls(&one, "getppid"), Some(3000), "{one}");
    let target = &whole["target"];
    assert_eq!(target["kind"], "pod");
    assert_eq!(target["namespace"], "ml");
    assert_eq!(target["pod"], "trainer-0");
    assert_eq!(target["pod_uid"], pod.uid.as_str());
    assert_eq!(one["target"]["container"], "pytorch");
    assert_eq!(one["target"]["cgroup"], pod.pytorch.rel.as_str());
    // Both asked the API for the pod by name.
    let asked = pod.api.requests.lock().unwrap().clone();
    assert_eq!(
        asked
            .iter()
            .filter(|p| p.starts_with("/api/v1/namespaces/ml/pods/trainer-0"))
            .count(),
        2,
        "{asked:?}"
    );
}

#[test]
fn a_pod_elsewhere_is_named_with_its_node() {
    if !require_root("a_pod_elsewhere_is_named_with_its_node") {
        return;
    }
    // The API schedules the pod on node-b; this node is node-a and has no cgroup of it.
    let (uid, pytorch_id) = fresh_ids();
    let api = FakeApi::start(pod_list(&uid, "node-b", &pytorch_id, &pytorch_id));
    let dir = tempfile::tempdir().unwrap();
    let env = env(&api.kubeconfig(dir.path()), "node-a");
    let run = |args: &[&str]| {
        let out = tool(&[], args, &env).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["summary", "--pod", "ml/trainer-0", "-d", "1s"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("pod ml/trainer-0 runs on node node-b, not on this node (node-a)"),
        "{err}"
    );
    let (code, err) = run(&["diagnose", "--pod", "ml/nope", "-d", "1s"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("pod ml/nope not found"), "{err}");
    let (code, err) = run(&[
        "trace",
        "--pod",
        "ml/trainer-0",
        "--container",
        "x",
        "-o",
        "-",
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("node-b"), "{err}");
}

/// `kubectl exec -n sysscope <pod> -- sysscope ...` as the DaemonSet's pod runs it: root with
/// CAP_BPF and CAP_PERFMON only and no_new_privs, in a cgroup namespace of its own (rooted at
/// a cgroup of the test's), with the cgroup v2 hierarchy mounted read-only, and NODE_NAME and
/// API credentials in the environment.
#[test]
fn tools_inside_the_daemonset_pod() {
    if !require_root("tools_inside_the_daemonset_pod") {
        return;
    }
    if !require(
        "tools_inside_the_daemonset_pod",
        "unshare and setpriv (util-linux)",
        Command::new("setpriv").arg("--help").output().is_ok()
            && Command::new("unshare").arg("--help").output().is_ok(),
    ) {
        return;
    }
    let pod = Pod::start(NODE);
    let env = pod.env(NODE);
    let home = TestCgroup::new("sysscope-test-agent-pod");
    let root = cgroup_root();
    let script = format!(
        "mount -o remount,bind,ro {} && exec setpriv --no-new-privs --inh-caps=-all \
         --bounding-set=-all,+bpf,+perfmon \"$0\" \"$@\"",
        root.display()
    );
    let in_pod = |args: &[&str]| {
        let mut cmd = home.command("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--cgroup",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .arg(sysscope_bin())
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
        cmd
    };

    // --pod measures exactly, with nothing but what the pod holds.
    let a = held_workload(&pod.pytorch, 1234);
    let (child, err) = measuring(in_pod(&["summary", "--json", "--pod", "ml/trainer-0"]));
    release(a);
    let summary = interrupt(child, err);
    assert_eq!(calls(&summary, "getppid"), Some(1234), "{summary}");
    assert_eq!(summary["target"]["pod_uid"], pod.uid.as_str());

    // top by pod names the pod from the API (the watch of this node's pods).
    let mut busy = pod
        .sidecar
        .command(workload_bin())
        .args(["loop-getppid", "60", "1"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = in_pod(&[
        "top", "--by", "pod", "--count", "3", "-i", "700ms", "-n", "500",
    ])
    .output()
    .unwrap();
    let _ = busy.kill();
    let _ = busy.wait();
    let text = stdout_of_success(&out);
    let row = text
        .lines()
        .rev()
        .find(|l| l.contains("ml/trainer-0"))
        .unwrap_or_else(|| panic!("no row for ml/trainer-0:\n{text}"));
    assert!(row.contains("getppid"), "{row}");

    // -- CMD needs a cgroup of its own, which a read-only hierarchy cannot give: refused, and
    // the message says what works.
    let out = in_pod(&["summary", "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("read-only") && err.contains("--pod NAMESPACE/NAME"),
        "{err}"
    );
}
