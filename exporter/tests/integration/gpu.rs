//! The GPU collector through the real NVML path: the `sysscope` binary loads the stand-in
//! `libnvidia-ml.so.1` (built from C by [`crate::nvml_standin`], the real NVML ABI) through
//! `gpu.nvml_library`, and every series must equal what the stand-in reports, per device, per
//! MIG instance and per process. The "GPU process" is a real child in a fresh Kubernetes-like
//! cgroup, so its join to cgroup, process name and pod labels (from a fake API server) is real.
//! Failures are injected through the stand-in: calls that error, a device lost, a device that
//! leaves NVML's list and comes back, NVML that stops answering, a process that exits. The
//! "no NVML library" path runs for real: the exporter is pointed at a file that does not exist.

use std::{
    collections::BTreeMap,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::{
    common::*,
    kubernetes::{fresh_ids, trainer_pod_list, FakeApi, Hierarchy},
    nvml_standin::{library_before_12_2, Gpu, Mig, Proc, StandIn, State},
};

const GIB: u64 = 1 << 30;

/// An exporter whose stderr goes to a file (`log`), loading the stand-in.
struct Logged {
    exporter: Exporter,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Logged {
    fn start(config: &str, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr.log");
        let script = format!("exec \"$0\" \"$@\" 2>>{}", log.display());
        let mut exporter = Exporter::spawn_wrapped(
            free_port(),
            config,
            &[],
            env,
            &["sh", "-c", script.as_str()],
        );
        exporter.wait_ready(Duration::from_secs(30));
        Self {
            exporter,
            log,
            _dir: dir,
        }
    }

    /// The exporter with the test configuration, reading `standin` as its NVML.
    fn with_standin(standin: &StandIn) -> Self {
        Self::start(
            &format!("{TEST_CONFIG}{}", standin.config()),
            &[standin.env()],
        )
    }

    fn scrape(&self) -> Vec<Sample> {
        parse_samples(&self.exporter.scrape())
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A node of two GPUs, GPU-aaaa and GPU-bbbb, that answer every call.
fn two_full_gpus() -> State {
    State {
        devices: vec![Gpu::full("GPU-aaaa"), Gpu::full("GPU-bbbb")],
        ..State::default()
    }
}

fn up(samples: &[Sample], collector: &str) -> f64 {
    let found = select(
        samples,
        "sysscope_collector_up",
        &[("collector", collector)],
    );
    assert_eq!(found.len(), 1, "collector {collector}: {found:?}");
    found[0].value
}

/// The value of the one sample named `name` whose labels are exactly `labels`, failing with
/// every sample of that name when there is not exactly one.
fn exact(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name && s.labels == want)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name} {want:?} among {:#?}",
        select(samples, name, &[])
    );
    found[0].value
}

fn with<'a>(base: &[(&'a str, &'a str)], more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    base.iter().chain(more).copied().collect()
}

/// A real process standing in for a CUDA process, parked until its stdin closes.
fn gpu_process(cg: &TestCgroup) -> Child {
    cg.command(workload_bin())
        .arg("wait-stdin")
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn workload")
}

/// The state of the first test: an A100 with every reading and a process of ours, an A100 in
/// MIG mode with two instances, and a board that supports little.
fn node_state(pid: u32, gone: u32) -> State {
    let mut a = Gpu::full("GPU-aaaa");
    a.processes = vec![
        Proc {
            pid,
            used: Some(GIB),
            sm: 45,
            mem: 12,
            ..Proc::default()
        },
        // The same process with a graphics context: one series, not two.
        Proc {
            pid,
            used: Some(GIB),
            graphics: true,
            ..Proc::default()
        },
        // A process that has exited but still holds its context.
        Proc {
            pid: gone,
            used: Some(256 << 20),
            ..Proc::default()
        },
    ];
    let mut mig = Gpu::full("GPU-bbbb");
    mig.pci_bus_id = Some("00000000:AF:00.0".into());
    // Its state has a utilisation, but NVML (and so the stand-in) reports none for a GPU in
    // MIG mode; processes run on instances.
    mig.util = Some((40, 10));
    mig.mig = Some((1, 1));
    mig.migs = vec![
        Mig {
            uuid: "MIG-1111".into(),
            name: "NVIDIA A100-SXM4-80GB MIG 3g.40gb".into(),
            used: 5 * GIB,
            total: 40 * GIB,
            gi: 1,
            ci: 0,
        },
        Mig {
            uuid: "MIG-2222".into(),
            name: "NVIDIA A100-SXM4-80GB MIG 1g.10gb".into(),
            used: GIB / 2,
            total: 10 * GIB,
            gi: 9,
            ci: 0,
        },
    ];
    mig.processes = vec![Proc {
        pid,
        used: Some(2 * GIB),
        sm: 30,
        mem: 5,
        mig: Some((1, 0)),
        ..Proc::default()
    }];
    // A board without power, clocks, energy, ECC, serial or MIG readings.
    let small = Gpu {
        uuid: "GPU-cccc".into(),
        name: Some("NVIDIA T400".into()),
        util: Some((5, 1)),
        memory: Some((GIB / 4, 2 * GIB)),
        temperature: Some(40),
        ..Gpu::default()
    };
    State {
        driver_version: Some("550.54.15".into()),
        cuda_version: Some(12040),
        devices: vec![a, mig, small],
        ..State::default()
    }
}

#[test]
fn series_equal_what_nvml_reports_per_device_mig_instance_and_process() {
    if !require_root("series_equal_what_nvml_reports_per_device_mig_instance_and_process") {
        return;
    }
    // The pod this process belongs to, named by a fake API server's pod list.
    let (uid, cid) = fresh_ids();
    let pod_list = trainer_pod_list(&uid, &cid);
    let api = FakeApi::start(pod_list);
    let kube_dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(kube_dir.path());
    let pods = Hierarchy::create("kubepods", &["besteffort", &format!("pod{uid}"), &cid]);
    let mut child = gpu_process(pods.leaf());
    let pid = child.id();
    // A pid above pid_max: a process that has already exited.
    let gone = 4_194_304 + 17;

    let standin = StandIn::new(&node_state(pid, gone));
    // gpu.nvml_library names the stand-in by path: the file loaded, as sysscope_gpu_info says.
    let nvml_library = crate::nvml_standin::library().to_str().unwrap();
    let config = format!(
        "{TEST_CONFIG}[kubernetes]\npod_watch = \"on\"\nnode_name = \"node-test\"\n{}",
        standin.config()
    );
    let exporter = Logged::start(
        &config,
        &[standin.env(), ("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    eventually(Duration::from_secs(20), || {
        (up(&exporter.scrape(), "kubernetes") == 1.0).then_some(())
    })
    .expect("the pod watch never came up");
    // NVML samples processes once per period (100 ms in the stand-in): a refresh sooner than
    // that after the previous one finds no new sample, as with the real driver.
    std::thread::sleep(Duration::from_millis(250));
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0, "{}", exporter.logs());

    // Per device: every gauge of the full board, exactly once.
    let a = [("gpu", "0"), ("uuid", "GPU-aaaa")];
    for (name, value) in [
        ("sysscope_gpu_memory_used_bytes", (3 * GIB) as f64),
        ("sysscope_gpu_memory_total_bytes", (80 * GIB) as f64),
        ("sysscope_gpu_power_watts", 251.5),
        ("sysscope_gpu_temperature_celsius", 61.0),
        ("sysscope_gpu_device_up", 1.0),
        ("sysscope_gpu_energy_joules_total", 123_456.789),
    ] {
        assert_eq!(exact(&samples, name, &a), value, "{name}");
    }
    assert_eq!(exact(&samples, "sysscope_gpu_utilization_ratio", &a), 0.87);
    assert_eq!(
        exact(&samples, "sysscope_gpu_memory_utilization_ratio", &a),
        0.17
    );
    for (clock, hz) in [("graphics", 1410e6), ("sm", 1395e6), ("memory", 1593e6)] {
        let l = with(&a, &[("clock", clock)]);
        assert_eq!(exact(&samples, "sysscope_gpu_clock_hertz", &l), hz);
    }
    // Volatile counts, not the aggregate ones.
    for (error, n) in [("corrected", 3.0), ("uncorrected", 1.0)] {
        let l = with(&a, &[("error", error)]);
        assert_eq!(exact(&samples, "sysscope_gpu_ecc_errors_total", &l), n);
    }
    // 0x4: software power cap, and only that.
    let reasons = select(&samples, "sysscope_gpu_clock_event_reason_active", &a);
    assert_eq!(reasons.len(), 10, "{reasons:?}");
    for r in reasons {
        let want = if r.labels["reason"] == "sw_power_cap" {
            1.0
        } else {
            0.0
        };
        assert_eq!(r.value, want, "{r:?}");
    }
    assert_eq!(
        exact(
            &samples,
            "sysscope_gpu_info",
            &with(
                &a,
                &[
                    ("model", "NVIDIA A100-SXM4-80GB"),
                    ("driver_version", "550.54.15"),
                    ("cuda_version", "12.4"),
                    ("nvml_library", nvml_library),
                    ("pci_bus_id", "00000000:3B:00.0"),
                    ("serial", "1320221234567"),
                ]
            )
        ),
        1.0
    );

    // The board in MIG mode: no utilisation to misread, memory per instance.
    let b = [("gpu", "1"), ("uuid", "GPU-bbbb")];
    assert!(select(&samples, "sysscope_gpu_utilization_ratio", &b).is_empty());
    assert!(select(&samples, "sysscope_gpu_memory_utilization_ratio", &b).is_empty());
    assert_eq!(
        exact(&samples, "sysscope_gpu_memory_used_bytes", &b),
        (3 * GIB) as f64
    );
    for (mig, gi, profile, used, total) in [
        ("MIG-1111", "1", "3g.40gb", 5 * GIB, 40 * GIB),
        ("MIG-2222", "9", "1g.10gb", GIB / 2, 10 * GIB),
    ] {
        let l = with(
            &b,
            &[
                ("mig_uuid", mig),
                ("gpu_instance", gi),
                ("compute_instance", "0"),
                ("profile", profile),
            ],
        );
        assert_eq!(
            exact(&samples, "sysscope_gpu_mig_memory_used_bytes", &l),
            used as f64
        );
        assert_eq!(
            exact(&samples, "sysscope_gpu_mig_memory_total_bytes", &l),
            total as f64
        );
    }
    assert_eq!(
        select(&samples, "sysscope_gpu_mig_memory_used_bytes", &[]).len(),
        2
    );

    // The small board: what it does not support has no series.
    let c = [("gpu", "2"), ("uuid", "GPU-cccc")];
    assert_eq!(exact(&samples, "sysscope_gpu_utilization_ratio", &c), 0.05);
    for name in [
        "sysscope_gpu_power_watts",
        "sysscope_gpu_clock_hertz",
        "sysscope_gpu_energy_joules_total",
        "sysscope_gpu_ecc_errors_total",
        "sysscope_gpu_clock_event_reason_active",
    ] {
        assert!(select(&samples, name, &c).is_empty(), "{name}");
    }
    assert_eq!(
        exact(
            &samples,
            "sysscope_gpu_info",
            &with(
                &c,
                &[
                    ("model", "NVIDIA T400"),
                    ("driver_version", "550.54.15"),
                    ("cuda_version", "12.4"),
                    ("nvml_library", nvml_library),
                ]
            )
        ),
        1.0
    );

    // Per process: our child joins its cgroup, its pod and its name.
    let pid_s = pid.to_string();
    let me = [
        ("cgroup", pods.leaf().rel.as_str()),
        ("pod_uid", uid.as_str()),
        ("container_id", cid.as_str()),
        ("namespace", "ml"),
        ("pod", "trainer-0"),
        ("container", "pytorch"),
        ("comm", WORKLOAD_COMM),
        ("pid", pid_s.as_str()),
    ];
    let on_a = with(&a, &me);
    assert_eq!(
        exact(&samples, "sysscope_gpu_process_memory_used_bytes", &on_a),
        GIB as f64
    );
    assert_eq!(
        exact(&samples, "sysscope_gpu_process_sm_utilization_ratio", &on_a),
        0.45
    );
    assert_eq!(
        exact(
            &samples,
            "sysscope_gpu_process_memory_utilization_ratio",
            &on_a
        ),
        0.12
    );
    // On the MIG board: memory with its instance, no utilisation (MIG cannot sample processes).
    let on_b = with(
        &with(&b, &[("gpu_instance", "1"), ("compute_instance", "0")]),
        &me,
    );
    assert_eq!(
        exact(&samples, "sysscope_gpu_process_memory_used_bytes", &on_b),
        (2 * GIB) as f64
    );
    assert!(select(&samples, "sysscope_gpu_process_sm_utilization_ratio", &b).is_empty());
    // The exited process keeps its memory series, labelled as unknown.
    let gone_s = gone.to_string();
    let ghost = with(
        &a,
        &[
            ("cgroup", "(unresolved)"),
            ("comm", "(exited)"),
            ("pid", gone_s.as_str()),
        ],
    );
    assert_eq!(
        exact(&samples, "sysscope_gpu_process_memory_used_bytes", &ghost),
        (256u64 << 20) as f64
    );
    assert_eq!(
        select(&samples, "sysscope_gpu_process_memory_used_bytes", &[]).len(),
        3
    );

    // XID errors from NVML events: once the event thread has registered both whole GPUs, the
    // driver reports three errors on GPU-aaaa and one on GPU-bbbb.
    standin.wait_for_call("nvmlDeviceRegisterEvents GPU-aaaa");
    standin.wait_for_call("nvmlDeviceRegisterEvents GPU-bbbb");
    let mut state = node_state(pid, gone);
    state.devices[0].xids = vec![(1, 79), (2, 13), (3, 79)];
    state.devices[1].xids = vec![(1, 48)];
    standin.set(&state);
    let xids = eventually(Duration::from_secs(10), || {
        let s = exporter.scrape();
        (select(&s, "sysscope_gpu_xid_errors_total", &[]).len() == 3).then_some(s)
    })
    .expect("XID errors never counted");
    for (labels, n) in [
        (with(&a, &[("xid", "79")]), 2.0),
        (with(&a, &[("xid", "13")]), 1.0),
        (with(&b, &[("xid", "48")]), 1.0),
    ] {
        assert_eq!(exact(&xids, "sysscope_gpu_xid_errors_total", &labels), n);
    }

    // Our process exits while NVML still lists it (its context is being torn down): its
    // series continue with the same labels; once NVML drops it, they go.
    drop(child.stdin.take());
    child.wait().unwrap();
    let samples = exporter.scrape();
    assert_eq!(
        exact(&samples, "sysscope_gpu_process_memory_used_bytes", &on_a),
        GIB as f64
    );
    assert_eq!(
        exact(&samples, "sysscope_gpu_process_memory_used_bytes", &on_b),
        (2 * GIB) as f64
    );
    let pid_series = |s: &[Sample]| {
        select(
            s,
            "sysscope_gpu_process_memory_used_bytes",
            &[("pid", pid_s.as_str())],
        )
        .len()
    };
    assert_eq!(pid_series(&samples), 2);
    for d in &mut state.devices {
        d.processes.retain(|p| p.pid != pid);
    }
    standin.set(&state);
    let samples = exporter.scrape();
    assert_eq!(pid_series(&samples), 0);
    // The counters stay.
    assert_eq!(
        select(&samples, "sysscope_gpu_xid_errors_total", &[]).len(),
        3
    );
}

#[test]
fn nvml_errors_and_devices_that_leave_and_return_degrade_only_the_gpu_collector() {
    if !require_root("nvml_errors_and_devices_that_leave_and_return_degrade_only_the_gpu_collector")
    {
        return;
    }
    let state = two_full_gpus();
    let standin = StandIn::new(&state);
    let exporter = Logged::with_standin(&standin);
    let util = |s: &[Sample], gpu: &str, uuid: &str| {
        select(
            s,
            "sysscope_gpu_utilization_ratio",
            &[("gpu", gpu), ("uuid", uuid)],
        )
        .len()
    };
    let device_up =
        |s: &[Sample], uuid: &str| exact_one(s, "sysscope_gpu_device_up", &[("uuid", uuid)]);
    let samples = exporter.scrape();
    assert_eq!((up(&samples, "gpu"), up(&samples, "cpu")), (1.0, 1.0));
    let cpus = select(&samples, "sysscope_cpu_utilization_ratio", &[]).len();
    assert!(cpus >= 8);

    // GPU 1 falls off the bus (NVML_ERROR_GPU_IS_LOST on every call): its series go, GPU 0
    // and the other collectors carry on. The loss is logged once however long it lasts.
    let mut lost = state.clone();
    lost.devices[1].error = Some(15);
    standin.set(&lost);
    exporter.scrape();
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!((up(&samples, "cpu"), up(&samples, "syscalls")), (1.0, 1.0));
    assert_eq!(
        select(&samples, "sysscope_cpu_utilization_ratio", &[]).len(),
        cpus
    );
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 1);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 0);
    assert_eq!(
        (
            device_up(&samples, "GPU-aaaa"),
            device_up(&samples, "GPU-bbbb")
        ),
        (1.0, 0.0)
    );
    let logs = exporter.logs();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("GPU unavailable"))
        .collect();
    assert_eq!(lines.len(), 1, "logs:\n{logs}");
    assert!(lines[0].contains("GPU-bbbb"), "{}", lines[0]);

    // It comes back.
    standin.set(&state);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 1);
    assert_eq!(device_up(&samples, "GPU-bbbb"), 1.0);

    // GPU 0 leaves NVML's list: GPU 1 becomes index 0 and keeps its identity and series.
    let mut one = state.clone();
    one.devices.remove(0);
    standin.set(&one);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(util(&samples, "0", "GPU-bbbb"), 1);
    assert!(select(
        &samples,
        "sysscope_gpu_utilization_ratio",
        &[("uuid", "GPU-aaaa")]
    )
    .is_empty());
    assert_eq!(device_up(&samples, "GPU-aaaa"), 0.0);
    // And comes back.
    standin.set(&state);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 1);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 1);

    // Any call on one device answering GPU_IS_LOST takes that device down, and only it.
    let mut lost_midway = state.clone();
    lost_midway.devices[0]
        .fails
        .push(("nvmlDeviceGetPowerUsage".into(), 15));
    standin.set(&lost_midway);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 0);
    assert_eq!(device_up(&samples, "GPU-aaaa"), 0.0);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 1);
    // A call failing otherwise loses its own readings: the device and collector stay up, and
    // the failure is counted.
    let mut failing = state.clone();
    failing.devices[0]
        .fails
        .push(("nvmlDeviceGetComputeRunningProcesses_v3".into(), 999));
    standin.set(&failing);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 1);
    assert_eq!(device_up(&samples, "GPU-aaaa"), 1.0);
    assert_eq!(
        exact_one(
            &samples,
            "sysscope_gpu_nvml_errors_total",
            &[
                ("uuid", "GPU-aaaa"),
                ("call", "nvmlDeviceGetComputeRunningProcesses_v3"),
                ("error", "unknown"),
            ]
        ),
        1.0
    );
    // A reading the device stops supporting loses its series, not the device.
    let mut unsupported = state.clone();
    unsupported.devices[0]
        .fails
        .push(("nvmlDeviceGetPowerUsage".into(), 3));
    standin.set(&unsupported);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert!(select(
        &samples,
        "sysscope_gpu_power_watts",
        &[("uuid", "GPU-aaaa")]
    )
    .is_empty());
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 1);

    // NVML itself stops answering (the driver unloaded: nvmlDeviceGetCount fails): every GPU
    // series goes, the collector is down with the reason, the rest runs on. It is initialised
    // again every 30 s (unit-tested with a shorter interval).
    let mut unloaded = state.clone();
    unloaded.fails.push(("nvmlDeviceGetCount_v2".into(), 9));
    standin.set(&unloaded);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(up(&samples, "cpu"), 1.0);
    assert!(select(&samples, "sysscope_gpu_utilization_ratio", &[]).is_empty());
    assert_eq!(device_up(&samples, "GPU-aaaa"), 0.0);
    assert!(!select(&samples, "sysscope_syscalls_total", &[]).is_empty());
    // The device count, then the shutdown of the old NVML and its event thread.
    standin.wait_for_call("nvmlShutdown");
}

/// Readings that fail on a device that answers lose their own series, never the device's:
/// NVML refusing an unprivileged caller the process lists of a GPU in MIG mode
/// (NO_PERMISSION), and the per-process samples of a GPU where processes start between
/// NVML's count and the call that fills the buffer (a transient INSUFFICIENT_SIZE, which
/// sysscope retries with a larger buffer, and when it keeps failing leaves out that refresh).
#[test]
fn failed_readings_lose_their_series_not_the_device() {
    if !require_root("failed_readings_lose_their_series_not_the_device") {
        return;
    }
    let _node = share_node();
    let mut child = Command::new(workload_bin())
        .arg("wait-stdin")
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn workload");
    let pid = child.id();
    let pid_s = pid.to_string();
    let mut mig = Gpu::full("GPU-aaaa");
    mig.util = None;
    mig.mig = Some((1, 1));
    mig.migs = vec![Mig {
        uuid: "MIG-1111".into(),
        name: "NVIDIA A100-SXM4-80GB MIG 7g.80gb".into(),
        used: 2 * GIB,
        total: 80 * GIB,
        gi: 0,
        ci: 0,
    }];
    mig.processes = vec![Proc {
        pid,
        used: Some(2 * GIB),
        mig: Some((0, 0)),
        ..Proc::default()
    }];
    let mut busy = Gpu::full("GPU-bbbb");
    busy.processes = vec![Proc {
        pid,
        used: Some(GIB),
        sm: 70,
        mem: 20,
        ..Proc::default()
    }];
    // One process started between NVML's count and the call that fills the buffer.
    busy.insufficient_size = vec![("nvmlDeviceGetProcessUtilization".into(), 1)];
    let mut state = State {
        devices: vec![mig, busy],
        unprivileged: true,
        ..State::default()
    };
    let standin = StandIn::new(&state);
    let exporter = Logged::with_standin(&standin);
    let errors = |s: &[Sample], uuid: &str, call: &str, error: &str| {
        select(
            s,
            "sysscope_gpu_nvml_errors_total",
            &[("uuid", uuid), ("call", call), ("error", error)],
        )
        .first()
        .map(|s| s.value)
    };
    // The busy GPU's process-utilization calls that found the buffer too small.
    let short_buffers = |s: &[Sample]| {
        errors(
            s,
            "GPU-bbbb",
            "nvmlDeviceGetProcessUtilization",
            "insufficient_size",
        )
    };
    let sm = |s: &[Sample]| {
        select(
            s,
            "sysscope_gpu_process_sm_utilization_ratio",
            &[("uuid", "GPU-bbbb"), ("pid", pid_s.as_str())],
        )
        .first()
        .map(|s| s.value)
    };
    std::thread::sleep(Duration::from_millis(250));
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0, "{}", exporter.logs());
    for uuid in ["GPU-aaaa", "GPU-bbbb"] {
        assert_eq!(
            exact_one(&samples, "sysscope_gpu_device_up", &[("uuid", uuid)]),
            1.0
        );
    }
    // The GPU in MIG mode: its instances, no processes (NVML refused the list), the refusal
    // counted and logged once however often it happens.
    assert_eq!(
        exact_one(
            &samples,
            "sysscope_gpu_mig_memory_used_bytes",
            &[("mig_uuid", "MIG-1111")]
        ),
        (2 * GIB) as f64
    );
    assert!(select(
        &samples,
        "sysscope_gpu_process_memory_used_bytes",
        &[("uuid", "GPU-aaaa")]
    )
    .is_empty());
    assert!(
        errors(
            &samples,
            "GPU-aaaa",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "no_permission"
        )
        .is_some_and(|n| n >= 1.0),
        "{:?}",
        select(&samples, "sysscope_gpu_nvml_errors_total", &[])
    );
    // The other GPU: its samples read at the second try, nothing counted.
    assert_eq!(sm(&samples), Some(0.7));
    assert_eq!(short_buffers(&samples), None);
    assert!(standin.calls().lines().any(|l| l
        .starts_with("nvmlDeviceGetProcessUtilization GPU-bbbb")
        && l.contains(" count=")));

    // Processes keep starting: three tries in a row find the buffer too small. That refresh
    // has no per-process utilisation, the memory series and the device stay, and the next
    // refresh reads the samples again.
    state.devices[1].insufficient_size = vec![("nvmlDeviceGetProcessUtilization".into(), 3)];
    standin.set(&state);
    std::thread::sleep(Duration::from_millis(250));
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(sm(&samples), None);
    assert_eq!(
        exact_one(
            &samples,
            "sysscope_gpu_process_memory_used_bytes",
            &[("uuid", "GPU-bbbb"), ("pid", pid_s.as_str())]
        ),
        GIB as f64
    );
    assert_eq!(short_buffers(&samples), Some(1.0));
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(sm(&exporter.scrape()), Some(0.7));
    let logs = exporter.logs();
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| {
            l.contains("GPU reading failed")
                && l.contains("GPU-aaaa")
                && l.contains("nvmlDeviceGetComputeRunningProcesses_v3")
        })
        .collect();
    assert_eq!(refused.len(), 1, "{logs}");
    drop(child.stdin.take());
    let _ = child.wait();
}

/// One GPU lost does not stop the XID counts of the others (the event set is made again
/// without it), and once it answers again its own are counted too.
#[test]
fn xid_errors_of_other_gpus_are_counted_while_one_is_lost() {
    if !require_root("xid_errors_of_other_gpus_are_counted_while_one_is_lost") {
        return;
    }
    let mut state = two_full_gpus();
    let standin = StandIn::new(&state);
    let exporter = Logged::with_standin(&standin);
    // Each scrape reads the devices, which is how a device that answers again is noticed.
    let registered = |uuid: &str, times: usize| {
        let needle = format!("nvmlDeviceRegisterEvents {uuid}");
        eventually(Duration::from_secs(10), || {
            exporter.scrape();
            (standin.calls().matches(needle.as_str()).count() >= times).then_some(())
        })
        .unwrap_or_else(|| panic!("{uuid} not registered {times} times:\n{}", standin.calls()));
    };
    let xid = |uuid: &str, code: &str| {
        eventually(Duration::from_secs(10), || {
            let s = exporter.scrape();
            select(
                &s,
                "sysscope_gpu_xid_errors_total",
                &[("uuid", uuid), ("xid", code)],
            )
            .first()
            .map(|s| s.value)
        })
    };
    registered("GPU-bbbb", 1);
    // GPU-bbbb falls off the bus: waits on the set answer GPU_IS_LOST, the set is made again
    // with GPU-aaaa alone, whose XID errors go on being counted.
    state.devices[1].error = Some(15);
    standin.set(&state);
    standin.wait_for_call("nvmlEventSetWait_v2 GPU-bbbb -> lost");
    registered("GPU-aaaa", 2);
    state.devices[0].xids = vec![(1, 31)];
    standin.set(&state);
    assert_eq!(xid("GPU-aaaa", "31"), Some(1.0), "{}", exporter.logs());
    // It answers again: added to the set, and its errors counted.
    state.devices[1].error = None;
    standin.set(&state);
    registered("GPU-bbbb", 2);
    state.devices[1].xids = vec![(1, 79)];
    standin.set(&state);
    assert_eq!(xid("GPU-bbbb", "79"), Some(1.0), "{}", exporter.logs());
    assert_eq!(xid("GPU-aaaa", "31"), Some(1.0));
    let logs = exporter.logs();
    assert_eq!(
        logs.lines()
            .filter(|l| l.contains("waiting for GPU XID events failed"))
            .count(),
        1,
        "{logs}"
    );
}

/// A driver older than NVML 12.2 (R535) has only `nvmlDeviceGetCurrentClocksThrottleReasons`:
/// its whole mask is read, and a bit sysscope has no name for is `other`, as with newer ones.
#[test]
fn clock_event_reasons_of_a_driver_before_12_2_keep_bits_without_a_name() {
    if !require_root("clock_event_reasons_of_a_driver_before_12_2_keep_bits_without_a_name") {
        return;
    }
    let mut gpu = Gpu::full("GPU-aaaa");
    // Software power cap, and a bit no release of NVML named when this was written.
    gpu.clocks_event_reasons = Some(0x4 | 0x1000_0000);
    let standin = StandIn::new(&State {
        devices: vec![gpu],
        ..State::default()
    });
    let config = format!(
        "{TEST_CONFIG}[gpu]\nnvml_library = \"{}\"\n",
        library_before_12_2().display()
    );
    let exporter = Logged::start(&config, &[standin.env()]);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0, "{}", exporter.logs());
    let reason = |r: &str| {
        exact_one(
            &samples,
            "sysscope_gpu_clock_event_reason_active",
            &[("uuid", "GPU-aaaa"), ("reason", r)],
        )
    };
    assert_eq!(reason("sw_power_cap"), 1.0);
    assert_eq!(reason("other"), 1.0);
    assert_eq!(reason("gpu_idle"), 0.0);
}

fn exact_one(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let found = select(samples, name, want);
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}");
    found[0].value
}

#[test]
fn nvml_that_does_not_initialise_is_reported_with_its_cause() {
    if !require_root("nvml_that_does_not_initialise_is_reported_with_its_cause") {
        return;
    }
    let standin = StandIn::new(&State {
        devices: vec![Gpu::full("GPU-aaaa")],
        // NVML_ERROR_DRIVER_NOT_LOADED: the driver is not loaded yet.
        fails: vec![("nvmlInit_v2".into(), 9)],
        ..State::default()
    });
    let exporter = Logged::with_standin(&standin);
    let samples = exporter.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(up(&samples, "syscalls"), 1.0);
    assert!(select(&samples, "sysscope_gpu_utilization_ratio", &[]).is_empty());
    let logs = exporter.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("did not initialise") && l.contains("driver")),
        "logs:\n{logs}"
    );
    assert!(
        standin.calls().contains("nvmlInit_v2 -> 9"),
        "{}",
        standin.calls()
    );
}

/// `sysscope trace` draws its GPU counter tracks through the same NVML source.
#[test]
fn trace_counter_tracks_read_the_same_nvml() {
    if !require_root("trace_counter_tracks_read_the_same_nvml") {
        return;
    }
    let _node = share_node();
    let mut a = Gpu::full("GPU-aaaa");
    a.util = Some((73, 21));
    let standin = StandIn::new(&State {
        devices: vec![a],
        ..State::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sysscope.toml");
    std::fs::write(&config, standin.config()).unwrap();
    let out = dir.path().join("trace.json");
    let status = Command::new(sysscope_bin())
        .arg(format!("--config.file={}", config.display()))
        .args(["trace", "--counter-interval", "100ms", "-o"])
        .arg(&out)
        .args(["--", workload_bin(), "sleep", "3", "100"])
        .env(standin.env().0, standin.env().1)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let gpu: Vec<&serde_json::Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "gpu0 utilization (%)")
        .collect();
    assert!(!gpu.is_empty(), "no GPU counter track");
    for e in gpu {
        assert_eq!(e["args"]["gpu"], 73.0, "{e}");
        assert_eq!(e["args"]["memory"], 21.0, "{e}");
    }
}

/// NVIDIA display controllers on this machine's PCI bus, read by the test itself.
fn nvidia_gpus_on_pci() -> f64 {
    let mut n = 0;
    for e in std::fs::read_dir("/sys/bus/pci/devices").unwrap().flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
        if read("vendor").trim() == "0x10de" && read("class").trim().starts_with("0x03") {
            n += 1;
        }
    }
    n as f64
}

#[test]
fn without_the_nvml_library_the_agent_runs_and_reports_gpu_down() {
    if !require_root("without_the_nvml_library_the_agent_runs_and_reports_gpu_down") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{TEST_CONFIG}[gpu]\nnvml_library = \"{}/libnvidia-ml.so.1\"\n",
        dir.path().join("missing").display()
    );
    let exporter = Logged::start(&config, &[]);
    let mut samples = Vec::new();
    for _ in 0..3 {
        samples = exporter.scrape();
    }
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(up(&samples, "cpu"), 1.0);
    assert_eq!(up(&samples, "syscalls"), 1.0);
    assert!(!select(&samples, "sysscope_cpu_utilization_ratio", &[]).is_empty());
    assert!(!select(&samples, "sysscope_syscalls_total", &[]).is_empty());
    assert_eq!(
        exact_one(&samples, "sysscope_gpu_devices", &[]),
        nvidia_gpus_on_pci()
    );
    assert!(select(&samples, "sysscope_gpu_utilization_ratio", &[]).is_empty());

    let logs = exporter.logs();
    let gpu_lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("collector=\"gpu\"") || l.contains("collector=gpu"))
        .collect();
    assert_eq!(gpu_lines.len(), 1, "GPU log lines:\n{logs}");
    assert!(
        gpu_lines[0].contains("GPU collector off")
            && gpu_lines[0].contains("missing/libnvidia-ml.so.1"),
        "{}",
        gpu_lines[0]
    );
}

/// The shipped DaemonSets run sysscope in a cgroup namespace of its own (an unprivileged pod
/// on cgroup v2), where `/proc/<pid>/cgroup` of another pod's process reads
/// `/../../../burstable/pod.../...`. A GPU process's series must carry the same `cgroup` and
/// pod labels as its syscall series all the same: with the cgroup2 mount a container runtime
/// gives the container (rooted at the namespace's root), and with `unshare -C` alone (no such
/// mount). The agent sits in a Kubernetes-like container cgroup, the GPU process in a sibling
/// pod's.
#[test]
fn from_a_cgroup_namespace_gpu_series_carry_the_cgroup_of_the_syscall_series() {
    if !require_root("from_a_cgroup_namespace_gpu_series_carry_the_cgroup_of_the_syscall_series") {
        return;
    }
    let top = TestCgroup::new("sysscope-test-cgns");
    let (uid_a, cid_a) = fresh_ids();
    let (uid_b, cid_b) = fresh_ids();
    let agent = TestCgroup::at(&format!(
        "{}/kubepods/besteffort/pod{uid_a}/{cid_a}",
        top.rel
    ));
    let pod = TestCgroup::at(&format!(
        "{}/kubepods/burstable/pod{uid_b}/{cid_b}",
        top.rel
    ));
    // The GPU process makes syscalls while it runs, so that it has syscall series too.
    let mut child = pod
        .command(workload_bin())
        .args(["rate-getppid", "200", "60"])
        .spawn()
        .expect("spawn workload");
    let pid = child.id();
    let pid_s = pid.to_string();
    let mut gpu = Gpu::full("GPU-aaaa");
    gpu.processes = vec![Proc {
        pid,
        used: Some(GIB),
        sm: 40,
        mem: 10,
        ..Proc::default()
    }];
    let standin = StandIn::new(&State {
        devices: vec![gpu],
        ..State::default()
    });
    let mnt = tempfile::tempdir().unwrap();
    let procs = agent.dir.join("cgroup.procs");
    let cases = [
        (
            "a runtime's cgroup2 mount",
            format!(
                "echo $$ > {procs} && exec unshare --cgroup --mount -- sh -c 'mount -t cgroup2 none {mnt} && exec \"$0\" \"$@\"' \"$0\" \"$@\"",
                procs = procs.display(),
                mnt = mnt.path().display()
            ),
        ),
        (
            "unshare -C alone",
            format!(
                "echo $$ > {} && exec unshare --cgroup -- \"$0\" \"$@\"",
                procs.display()
            ),
        ),
    ];
    for (case, script) in cases {
        let config = format!("{TEST_CONFIG}{}", standin.config());
        let mut exporter = Exporter::spawn_wrapped(
            free_port(),
            &config,
            &[],
            &[standin.env()],
            &["sh", "-c", script.as_str()],
        );
        exporter.wait_ready(Duration::from_secs(30));
        // The set-up holds: sysscope runs in a namespace rooted at the agent's cgroup, from
        // where the GPU process's cgroup leads up and out.
        let sysscope = exporter.child.id();
        let own = std::fs::read_to_string(format!("/proc/{sysscope}/cgroup")).unwrap();
        assert!(
            own.lines().any(|l| l == format!("0::{}", agent.rel)),
            "{case}: {own}"
        );
        let seen = Command::new("nsenter")
            .arg(format!("--cgroup=/proc/{sysscope}/ns/cgroup"))
            .args(["cat", &format!("/proc/{pid}/cgroup")])
            .output()
            .expect("nsenter (util-linux)");
        let seen = String::from_utf8_lossy(&seen.stdout);
        assert!(seen.contains("0::/../../../"), "{case}: {seen}");

        let (gpu_labels, syscall_labels) = eventually(Duration::from_secs(20), || {
            let s = parse_samples(&exporter.scrape());
            let g = select(
                &s,
                "sysscope_gpu_process_memory_used_bytes",
                &[("pid", pid_s.as_str())],
            );
            let calls = select(
                &s,
                "sysscope_syscalls_total",
                &[("cgroup", pod.rel.as_str()), ("syscall", "getppid")],
            );
            match (g.as_slice(), calls.first()) {
                ([g], Some(c)) => Some((g.labels.clone(), c.labels.clone())),
                _ => None,
            }
        })
        .unwrap_or_else(|| {
            panic!(
                "{case}: no GPU series of pid {pid} and syscall series of {}:\n{}",
                pod.rel,
                exporter.scrape()
            )
        });
        for key in ["cgroup", "pod_uid", "container_id"] {
            assert_eq!(
                gpu_labels.get(key),
                syscall_labels.get(key),
                "{case}: {key}: GPU {gpu_labels:?}, syscalls {syscall_labels:?}"
            );
        }
        assert_eq!(gpu_labels["cgroup"], pod.rel, "{case}");
        assert_eq!(gpu_labels["pod_uid"], uid_b, "{case}");
        assert_eq!(gpu_labels["container_id"], cid_b, "{case}");
        exporter.stop();
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The driver's multiarch directory on this architecture (Debian, Ubuntu).
const MULTIARCH_LIB: &str = if cfg!(target_arch = "aarch64") {
    "/usr/lib/aarch64-linux-gnu"
} else {
    "/usr/lib/x86_64-linux-gnu"
};

/// A FROM-scratch image has no loader cache: with `gpu.nvml_library` left at its bare
/// default, NVML is found in the well-known directories a driver installs it in. The stand-in
/// is placed in two of them in turn, under a root given by `SYSSCOPE_NVML_ROOT` (the same
/// directories, prefixed: the test cannot write to the machine's own), and the exporter runs
/// without `LD_LIBRARY_PATH`; each time it loads that file, says so in its log and in
/// `sysscope_gpu_info{nvml_library}`, and reads the stand-in's GPUs.
#[test]
fn nvml_is_found_in_well_known_directories_without_a_loader_cache() {
    if !require_root("nvml_is_found_in_well_known_directories_without_a_loader_cache") {
        return;
    }
    let cached = Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libnvidia-ml.so.1"))
        .unwrap_or(false);
    assert!(
        !cached,
        "this machine's loader finds a real libnvidia-ml.so.1: the search could not be told apart"
    );
    let standin = StandIn::new(&two_full_gpus());
    for dir in ["/usr/lib64", MULTIARCH_LIB] {
        let root = tempfile::tempdir().unwrap();
        let installed = format!("{}{dir}/libnvidia-ml.so.1", root.path().display());
        std::fs::create_dir_all(std::path::Path::new(&installed).parent().unwrap()).unwrap();
        std::fs::copy(crate::nvml_standin::library(), &installed).unwrap();
        let logs = tempfile::tempdir().unwrap();
        let log = logs.path().join("stderr.log");
        let script = format!("exec \"$0\" \"$@\" 2>>{}", log.display());
        let root_env = root.path().to_str().unwrap();
        let mut exporter = Exporter::spawn_wrapped(
            free_port(),
            // gpu.nvml_library at its default, the bare soname.
            TEST_CONFIG,
            &[],
            &[standin.env(), ("SYSSCOPE_NVML_ROOT", root_env)],
            &["env", "-u", "LD_LIBRARY_PATH", "sh", "-c", script.as_str()],
        );
        exporter.wait_ready(Duration::from_secs(30));
        let samples = parse_samples(&exporter.scrape());
        assert_eq!(up(&samples, "gpu"), 1.0, "{dir}");
        for uuid in ["GPU-aaaa", "GPU-bbbb"] {
            let info = select(
                &samples,
                "sysscope_gpu_info",
                &[("uuid", uuid), ("nvml_library", installed.as_str())],
            );
            assert_eq!(
                info.len(),
                1,
                "{dir}: {uuid}: {:#?}",
                select(&samples, "sysscope_gpu_info", &[])
            );
        }
        exporter.stop();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            text.lines()
                .any(|l| l.contains("NVML loaded") && l.contains(installed.as_str())),
            "{dir}: no log line naming {installed}:\n{text}"
        );
    }
}
