//! Label control (`[labels]`) against ground truth: two exporters run side by side, one with
//! the default labels and one with label control, while children make known calls in a
//! Kubernetes-like container cgroup that restarts (a second cgroup for the same pod and
//! container, as the pod watch of a fake API server names them) and in a plain cgroup. What
//! control drops must merge exactly: the dropped cgroup's count is the sum over the cgroups the
//! container ran in, the syscalls kept by name count what was made, and those folded into
//! `syscall="other"` add up, call for call, to what the default exporter counts for them. The
//! same holds for the time by state of the merged series (its four parts add up to the merged
//! duration to the nanosecond) and for the CPU quota throttling of the container's two cgroups
//! (one series, the sum of what each cgroup's `cpu.stat` counted).

use std::time::Duration;

use crate::{
    common::*,
    kubernetes::{fresh_ids, trainer_pod_list_with, wait_for_pod_watch, FakeApi, Hierarchy},
};

/// Kept by name; every other syscall is `other`.
const KEPT: &[&str] = &["getppid", "fdatasync", "fsync"];

#[test]
fn dropped_labels_and_folded_syscalls_add_up_exactly() {
    if !require_root("dropped_labels_and_folded_syscalls_add_up_exactly") {
        return;
    }
    let (uid, first) = fresh_ids();
    let (_, second) = fresh_ids();
    // The container restarted: its current id, and the one before in its last state.
    let pod_list = trainer_pod_list_with(
        &uid,
        serde_json::json!({
            "name": "pytorch", "containerID": format!("containerd://{second}"),
            "lastState": {"terminated": {"exitCode": 1, "containerID": format!("containerd://{first}")}},
            "image": "img", "imageID": "", "ready": true, "restartCount": 1
        }),
    );
    let api = FakeApi::start(pod_list);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let kept = KEPT
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let controlled = Exporter::start_with_env(
        &format!(
            "{TEST_CONFIG}[kubernetes]\npod_watch = \"on\"\nnode_name = \"node-test\"\n[labels]\ncgroup = \"unless_pod_known\"\ncomm = false\nsyscalls = [{kept}]\n"
        ),
        &[],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let reference = Exporter::start(
        &format!("{TEST_CONFIG}[kubernetes]\npod_watch = \"off\"\n"),
        &[],
    );
    wait_for_pod_watch(&controlled);

    // The container's two cgroups (before and after the restart), and a plain one.
    let pods = Hierarchy::create("kubepods", &["besteffort", &format!("pod{uid}"), &first]);
    let parent = pods.leaf().rel.rsplit_once('/').unwrap().0.to_string();
    let restarted = TestCgroup::at(&format!("{parent}/{second}"));
    let plain = TestCgroup::new("sysscope-test-label-control");
    let scratch = tempfile::NamedTempFile::new().unwrap();
    let path = scratch.path().to_str().unwrap();
    // Each of the container's cgroups under a CPU quota of 10% that a spin exceeds, read by
    // the exporter while it exists; the first is gone before the second runs, as at a restart.
    let mut throttling = Vec::new();
    for (cg, getppid, fsyncs) in [(pods.leaf(), "300", "5"), (&restarted, "200", "3")] {
        let test = "dropped_labels_and_folded_syscalls_add_up_exactly (throttling)";
        let quota = CpuQuota::required(test, cg, 10_000, 100_000);
        let mut args: Vec<&str> = Vec::new();
        if let Some(v1) = quota.as_ref().and_then(|q| q.join.as_ref()) {
            args.extend(["join-cgroup", v1.to_str().unwrap()]);
        }
        args.extend(["getppid", getppid, "write-fsync", path, fsyncs, "4096"]);
        if quota.is_some() {
            args.extend(["spin", "300"]);
        }
        run_workload_joined(cg, &args);
        if let Some(quota) = quota {
            // The period timer may close a last period after the tasks are gone: what the
            // exporter read lies between a read of cpu.stat before its scrape and one after.
            std::thread::sleep(Duration::from_millis(300));
            let before = quota.stat();
            controlled.scrape();
            throttling.push((before, quota.stat()));
        }
    }
    run_workload_joined(&plain, &["getppid", "70"]);

    let got = parse_samples(&controlled.scrape());
    let truth = parse_samples(&reference.scrape());
    let pod = [
        ("namespace", "ml"),
        ("pod", "trainer-0"),
        ("container", "pytorch"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut l = pod.to_vec();
        l.extend_from_slice(extra);
        l
    };

    // The container's calls, in one series without cgroup, container_id or comm: the sum over
    // the cgroups it ran in.
    let getppid = select(
        &got,
        "sysscope_syscalls_total",
        &with(&[("syscall", "getppid")]),
    );
    assert_eq!(getppid.len(), 1, "{getppid:?}");
    assert_eq!(getppid[0].value, 500.0);
    for label in ["cgroup", "container_id", "comm"] {
        assert!(!getppid[0].labels.contains_key(label), "{:?}", getppid[0]);
    }
    assert_eq!(getppid[0].labels.get("pod_uid"), Some(&uid));
    // Outside Kubernetes the cgroup stays; comm goes everywhere.
    let outside = select(
        &got,
        "sysscope_syscalls_total",
        &[("cgroup", plain.rel.as_str()), ("syscall", "getppid")],
    );
    assert_eq!(outside.len(), 1, "{outside:?}");
    assert_eq!(outside[0].value, 70.0);
    assert!(!outside[0].labels.contains_key("comm"));

    // The syscalls kept by name stay exact: 8 fsyncs, as made (not folded, not lost).
    assert_eq!(
        sum(
            &got,
            "sysscope_syscalls_total",
            &with(&[("syscall", "fsync")])
        ),
        8.0
    );
    // Folded syscalls add up to what the reference counts for them in the container's two
    // cgroups, call for call (both exporters count every call; durations they each measure,
    // a few nanoseconds apart, so only counts compare across exporters).
    let cgroups = [pods.leaf().rel.as_str(), restarted.rel.as_str()];
    let folded_in_reference: f64 = truth
        .iter()
        .filter(|s| s.name == "sysscope_syscalls_total")
        .filter(|s| cgroups.contains(&s.labels.get("cgroup").map_or("", String::as_str)))
        .filter(|s| !KEPT.contains(&s.labels.get("syscall").map_or("", String::as_str)))
        .map(|s| s.value)
        .sum();
    let other = with(&[("syscall", "other")]);
    assert!(folded_in_reference > 0.0);
    assert_eq!(
        sum(&got, "sysscope_syscalls_total", &other),
        folded_in_reference
    );
    assert!(select(
        &got,
        "sysscope_syscalls_total",
        &with(&[("syscall", "openat")])
    )
    .is_empty());
    // Each merged histogram holds every call once: its count and its +Inf bucket are the
    // calls, and its buckets only grow.
    for syscall in ["getppid", "fsync", "other"] {
        let l = with(&[("syscall", syscall)]);
        let calls = sum(&got, "sysscope_syscalls_total", &l);
        assert_eq!(
            sum(&got, "sysscope_syscall_duration_seconds_count", &l),
            calls
        );
        let mut buckets: Vec<(f64, f64)> =
            select(&got, "sysscope_syscall_duration_seconds_bucket", &l)
                .iter()
                .map(|s| (s.labels["le"].parse::<f64>().unwrap(), s.value))
                .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(buckets.last().map(|b| b.1), Some(calls), "{syscall}");
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{syscall}: {buckets:?}"
        );
        // Its time by state: each state at most once (none that never had time), and they
        // add up to its duration sum.
        let ns = |seconds: f64| (seconds * 1e9).round() as i128;
        let mut parts = 0;
        for state in ["on_cpu", "wait_cpu", "blocked", "unknown"] {
            let mut s = l.clone();
            s.push(("state", state));
            let found = select(&got, "sysscope_syscall_time_seconds_total", &s);
            assert!(found.len() <= 1, "{syscall} {state}: {found:?}");
            parts += found.iter().map(|f| ns(f.value)).sum::<i128>();
        }
        assert_eq!(
            parts,
            ns(sum(&got, "sysscope_syscall_duration_seconds_sum", &l)),
            "{syscall}: the states do not add up to the duration"
        );
    }

    // The container's CPU quota throttling: one series without cgroup or container_id, the
    // sum of its two cgroups' cpu.stat.
    if throttling.len() == 2 {
        let series = select(&got, "sysscope_cgroup_cpu_throttled_periods_total", &pod);
        assert_eq!(series.len(), 1, "{series:?}");
        for label in ["cgroup", "container_id"] {
            assert!(!series[0].labels.contains_key(label), "{:?}", series[0]);
        }
        for (name, field) in [
            ("sysscope_cgroup_cpu_periods_total", "nr_periods"),
            (
                "sysscope_cgroup_cpu_throttled_periods_total",
                "nr_throttled",
            ),
        ] {
            let low: u64 = throttling.iter().map(|(before, _)| before[field]).sum();
            let high: u64 = throttling.iter().map(|(_, after)| after[field]).sum();
            let exported = sum(&got, name, &pod);
            assert!(
                exported >= low as f64 && exported <= high as f64,
                "{name} {exported}: the cgroups' cpu.stat said {low} before the scrapes, {high} after"
            );
        }
        let first_throttled = throttling[0].1["nr_throttled"];
        assert!(first_throttled > 0, "the first cgroup was never throttled");
        eprintln!(
            "throttled periods: {} exported, cpu.stat {:?}",
            sum(&got, "sysscope_cgroup_cpu_throttled_periods_total", &pod),
            throttling
                .iter()
                .map(|(_, after)| after["nr_throttled"])
                .collect::<Vec<_>>()
        );
    } else {
        eprintln!("SKIPPED the CPU throttling part: no cpu controller to set a quota with");
    }
}
