//! The headline alert end to end: a real Prometheus scrapes a real sysscope that loads the
//! stand-in NVML, with the shipped rules (5m windows shortened to 20s as in
//! [`crate::prometheus_e2e`], and every `for:` to 1s; nothing else changed). Two processes in
//! fresh cgroups spend nearly all their syscall time blocked reading slow pipes; the stand-in
//! lists one on a GPU at 2% utilisation and the other on a GPU at 90%.
//! `SyscallReadTimeDominatesGPUIdle` must fire for the first cgroup and for no other, while the
//! second is read-bound just the same (its `SyscallReadTimeDominates` goes off). Every GPU query
//! of the dashboards must return data from these series too.

use std::{
    collections::BTreeMap,
    process::{Child, Command},
    time::{Duration, Instant},
};

use crate::{
    common::*,
    nvml_standin::{Gpu, Mig, Proc, StandIn, State},
    prometheus_e2e::{dashboard_queries, one_prometheus_at_a_time, result_len, Prometheus},
};

/// Dashboard queries that need labels only Kubernetes gives (pod names from the pod watch).
const NEEDS_POD_LABEL: &str = "pod!=\"\"";

fn state(idle_pid: Option<u32>, busy_pid: Option<u32>) -> State {
    let mut idle = Gpu::full("GPU-idle");
    idle.util = Some((2, 1));
    let mut busy = Gpu::full("GPU-busy");
    busy.util = Some((90, 40));
    busy.pci_bus_id = Some("00000000:AF:00.0".into());
    for (gpu, pid) in [(&mut idle, idle_pid), (&mut busy, busy_pid)] {
        if let Some(pid) = pid {
            gpu.processes.push(Proc {
                pid,
                used: Some(8 << 30),
                sm: gpu.util.unwrap().0,
                mem: 1,
                ..Proc::default()
            });
        }
    }
    // A third board in MIG mode, for the dashboards' MIG panel.
    let mut mig = Gpu::full("GPU-mig");
    mig.pci_bus_id = Some("00000000:C1:00.0".into());
    mig.util = None;
    mig.mig = Some((1, 1));
    mig.migs = vec![Mig {
        uuid: "MIG-aaaa".into(),
        name: "NVIDIA A100-SXM4-80GB MIG 7g.80gb".into(),
        used: 1 << 30,
        total: 80 << 30,
        gi: 0,
        ci: 0,
    }];
    State {
        devices: vec![idle, busy, mig],
        ..State::default()
    }
}

/// The rules with every `for:` duration at 1 s.
fn shorten_for(rules: &str) -> String {
    let mut shortened = 0;
    let out: Vec<String> = rules
        .lines()
        .map(|l| match l.split_once("for: ") {
            Some((indent, _)) if indent.trim().is_empty() => {
                shortened += 1;
                format!("{indent}for: 1s")
            }
            _ => l.to_string(),
        })
        .collect();
    assert!(
        shortened >= 10,
        "only {shortened} `for:` lines in the rules"
    );
    out.join("\n") + "\n"
}

/// A process blocked reading a pipe another thread fills every 200 ms, for up to 60 s.
fn pipe_reader(cg: &TestCgroup) -> Child {
    Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&cg.dir)
        .args(["slow-pipe-read", "300", "200"])
        .spawn()
        .unwrap()
}

/// The alerts named `name` Prometheus has now: (cgroup, state).
fn alerts(prometheus: &Prometheus, name: &str) -> Vec<(String, String)> {
    let v = prometheus.api("/api/v1/alerts");
    v["data"]["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["labels"]["alertname"] == name)
        .map(|a| {
            (
                a["labels"]["cgroup"].as_str().unwrap_or("").to_string(),
                a["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn gpu_idle_alert_fires_for_the_read_bound_cgroup_on_an_idle_gpu_only() {
    if !require_root("gpu_idle_alert_fires_for_the_read_bound_cgroup_on_an_idle_gpu_only") {
        return;
    }
    let _one = one_prometheus_at_a_time();
    let started = Instant::now();
    let standin = StandIn::new(&state(None, None));
    let exporter = Exporter::start_with_env(
        &format!("{TEST_CONFIG}{}", standin.config()),
        &[],
        &[standin.env()],
    );
    let prometheus = Prometheus::start_with(exporter.port, shorten_for);

    let idle_cg = TestCgroup::new("sysscope-test-gpu-idle");
    let busy_cg = TestCgroup::new("sysscope-test-gpu-busy");
    let mut idle = pipe_reader(&idle_cg);
    let mut busy = pipe_reader(&busy_cg);
    standin.set(&state(Some(idle.id()), Some(busy.id())));
    // An XID error once the event thread watches, for the dashboards' XID panel.
    standin.wait_for_call("nvmlDeviceRegisterEvents GPU-idle");
    let mut with_xid = state(Some(idle.id()), Some(busy.id()));
    with_xid.devices[0].xids = vec![(1, 31)];
    standin.set(&with_xid);

    let fired = eventually(Duration::from_secs(60), || {
        alerts(&prometheus, "SyscallReadTimeDominatesGPUIdle")
            .contains(&(idle_cg.rel.clone(), "firing".to_string()))
            .then_some(())
    });
    let fired_after = started.elapsed();
    // The busy GPU's reader is as read-bound: the alert without the GPU condition is on for it.
    let busy_read_bound = eventually(Duration::from_secs(20), || {
        alerts(&prometheus, "SyscallReadTimeDominates")
            .iter()
            .any(|(cg, _)| cg == &busy_cg.rel)
            .then_some(())
    });
    let gpu_idle = alerts(&prometheus, "SyscallReadTimeDominatesGPUIdle");
    let held = prometheus.query("cgroup:sysscope_gpu_held_utilization_ratio:avg5m");
    let _ = idle.kill();
    let _ = busy.kill();
    let _ = idle.wait();
    let _ = busy.wait();
    assert!(
        fired.is_some(),
        "SyscallReadTimeDominatesGPUIdle never fired for {}: {gpu_idle:?}\n{}",
        idle_cg.rel,
        prometheus.api("/api/v1/alerts")
    );
    assert!(
        busy_read_bound.is_some(),
        "the busy GPU's reader was never read-bound: {:?}",
        alerts(&prometheus, "SyscallReadTimeDominates")
    );
    assert_eq!(
        gpu_idle,
        [(idle_cg.rel.clone(), "firing".to_string())],
        "the GPU-idle alert is for the idle GPU's cgroup only"
    );
    // The GPUs each cgroup's process holds, as the stand-in reports them.
    let held: BTreeMap<String, f64> = held["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metric"]["cgroup"].as_str().unwrap().to_string(),
                r["value"][1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        held.keys().collect::<Vec<_>>(),
        {
            let mut want = vec![&busy_cg.rel, &idle_cg.rel];
            want.sort();
            want
        },
        "{held:?}"
    );
    assert!((held[&idle_cg.rel] - 0.02).abs() < 1e-9, "{held:?}");
    assert!((held[&busy_cg.rel] - 0.9).abs() < 1e-9, "{held:?}");
    eprintln!(
        "SyscallReadTimeDominatesGPUIdle fired {:.1} s after the test started",
        fired_after.as_secs_f64()
    );

    // Every dashboard query over GPU series returns data (those needing pod names aside).
    let queries = dashboard_queries();
    let mut empty = Vec::new();
    let mut ran = 0;
    for q in &queries {
        let expr = q["expr"].as_str().unwrap();
        if !expr.contains("sysscope_gpu_") || expr.contains(NEEDS_POD_LABEL) {
            continue;
        }
        ran += 1;
        // A counter's first samples may still be arriving (increase() needs two).
        let data = eventually(Duration::from_secs(10), || {
            let v = prometheus.query(expr);
            assert_eq!(v["status"], "success", "{expr}: {v}");
            (result_len(&v) > 0).then_some(())
        });
        if data.is_none() {
            empty.push(format!("{} / {}: {expr}", q["dashboard"], q["panel"]));
        }
    }
    assert!(ran >= 15, "too few GPU dashboard queries ran: {ran}");
    assert!(
        empty.is_empty(),
        "GPU dashboard queries without data:\n{}",
        empty.join("\n")
    );
    eprintln!(
        "{ran} GPU dashboard queries returned data; {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
}
