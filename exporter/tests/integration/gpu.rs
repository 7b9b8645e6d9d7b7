//! The GPU collector without a GPU: the fake NVML seam drives every metric, device loss and
//! recovery, while the per-process join to cgroup and comm runs against a real child in a
//! fresh cgroup. The "no NVML library" path runs for real: the exporter is pointed at a
//! library that does not exist.

use std::{
    io::Write,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::*;
use sysscope::{
    agent::Agent,
    collectors::{
        cpu::CpuCollector,
        gpu::{
            fake::{FakeDevice, FakeFailure, FakeNvml},
            DeviceReading, GpuCollector, GpuPaths, ProcessMemory, ProcessSample,
        },
    },
    config::Config,
    exposition::{format::Format, scrape::Scraper},
    metadata::{Labeler, SharedLabeler},
    startup,
    util::error::Chain,
};

const GIB: u64 = 1 << 30;

fn reading(uuid: &str, sm: u32) -> DeviceReading {
    DeviceReading {
        uuid: uuid.into(),
        gpu_utilization_percent: Some(sm),
        memory_utilization_percent: Some(17),
        memory_used_bytes: Some(3 * GIB),
        memory_total_bytes: Some(80 * GIB),
        power_milliwatts: Some(251_500),
        temperature_celsius: Some(61),
        graphics_clock_mhz: Some(1410),
        sm_clock_mhz: Some(1395),
        memory_clock_mhz: Some(1593),
    }
}

/// An agent with the given collectors, scraped as the HTTP endpoint does.
struct Harness {
    scraper: Scraper,
}

impl Harness {
    fn new(collectors: Vec<Box<dyn sysscope::collectors::Collector>>) -> Self {
        let mut agent = Agent::new(None);
        for c in collectors {
            agent.add(c);
        }
        Self {
            scraper: Scraper::new(Arc::new(Mutex::new(agent)), Duration::ZERO),
        }
    }

    fn scrape(&self) -> Vec<Sample> {
        let body = self.scraper.scrape(Format::PrometheusText);
        parse_samples(std::str::from_utf8(&body).unwrap())
    }
}

fn one(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let found = select(samples, name, want);
    assert_eq!(found.len(), 1, "{name} {want:?}: {found:?}");
    found[0].value
}

fn up(samples: &[Sample], collector: &str) -> f64 {
    one(
        samples,
        "sysscope_collector_up",
        &[("collector", collector)],
    )
}

fn labeler() -> SharedLabeler {
    startup::labeler(&Config::default()).unwrap()
}

fn gpu_collector(fake: &FakeNvml, labeler: &SharedLabeler) -> GpuCollector {
    GpuCollector::new(fake.connector(), labeler.clone(), GpuPaths::system(labeler))
        .with_retry_interval(Duration::ZERO)
}

/// A real process in a fresh cgroup, standing in for a CUDA process.
fn gpu_process(cg: &TestCgroup) -> Child {
    cg.command(workload_bin())
        .arg("wait-stdin")
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn workload")
}

#[test]
fn fake_nvml_drives_every_metric_and_processes_join_their_cgroup_and_comm() {
    if !require_root("fake_nvml_drives_every_metric_and_processes_join_their_cgroup_and_comm") {
        return;
    }
    let cg = TestCgroup::new("sysscope-test-gpu");
    let mut child = gpu_process(&cg);
    let pid = child.id();
    // A pid above pid_max: a process that has already exited.
    let gone = 4_194_304 + 17;

    let fake = FakeNvml::new();
    fake.with(|s| {
        s.devices.push(FakeDevice {
            reading: reading("GPU-aaaa", 87),
            samples: vec![
                ProcessSample {
                    pid,
                    timestamp_us: 1_000,
                    sm_percent: 30,
                    memory_percent: 10,
                },
                ProcessSample {
                    pid,
                    timestamp_us: 2_000,
                    sm_percent: 45,
                    memory_percent: 12,
                },
            ],
            memory: vec![
                ProcessMemory {
                    pid,
                    used_bytes: Some(GIB),
                },
                // Listed again with its graphics context: one series, not two.
                ProcessMemory {
                    pid,
                    used_bytes: Some(GIB),
                },
                ProcessMemory {
                    pid: gone,
                    used_bytes: Some(256 << 20),
                },
            ],
            ..FakeDevice::default()
        });
        // A board without power readings or clocks.
        let mut r = reading("GPU-bbbb", 5);
        r.power_milliwatts = None;
        r.sm_clock_mhz = None;
        s.devices.push(FakeDevice {
            reading: r,
            ..FakeDevice::default()
        });
    });
    // Labels derived from cgroup paths (as the Kubernetes ids are) reach the process series.
    let root = cgroup_root();
    let labeler: SharedLabeler = Arc::new(Mutex::new(Labeler::new(root, false).with_deriver(
        Box::new(|path: &str| {
            if path.starts_with("/sysscope-test-gpu") {
                vec![("pod_uid", Arc::from("pod-under-test"))]
            } else {
                Vec::new()
            }
        }),
    )));
    let h = Harness::new(vec![Box::new(gpu_collector(&fake, &labeler))]);
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);

    let g0 = [("gpu", "0"), ("uuid", "GPU-aaaa")];
    let g1 = [("gpu", "1"), ("uuid", "GPU-bbbb")];
    for (name, value) in [
        ("sysscope_gpu_utilization_ratio", 0.87),
        ("sysscope_gpu_memory_utilization_ratio", 0.17),
        ("sysscope_gpu_memory_used_bytes", (3 * GIB) as f64),
        ("sysscope_gpu_memory_total_bytes", (80 * GIB) as f64),
        ("sysscope_gpu_power_watts", 251.5),
        ("sysscope_gpu_temperature_celsius", 61.0),
        ("sysscope_gpu_device_up", 1.0),
    ] {
        assert_eq!(one(&samples, name, &g0), value, "{name}");
    }
    for (clock, hz) in [("graphics", 1410e6), ("sm", 1395e6), ("memory", 1593e6)] {
        let mut l = g0.to_vec();
        l.push(("clock", clock));
        assert_eq!(one(&samples, "sysscope_gpu_clock_hertz", &l), hz);
    }
    assert_eq!(one(&samples, "sysscope_gpu_utilization_ratio", &g1), 0.05);
    assert!(select(&samples, "sysscope_gpu_power_watts", &g1).is_empty());
    let mut sm1 = g1.to_vec();
    sm1.push(("clock", "sm"));
    assert!(select(&samples, "sysscope_gpu_clock_hertz", &sm1).is_empty());

    // The process joins its real cgroup and name; the newest sample wins.
    let pid_s = pid.to_string();
    let proc_labels = [
        ("gpu", "0"),
        ("uuid", "GPU-aaaa"),
        ("pid", pid_s.as_str()),
        ("cgroup", cg.rel.as_str()),
        ("pod_uid", "pod-under-test"),
        ("comm", WORKLOAD_COMM),
    ];
    assert_eq!(
        one(
            &samples,
            "sysscope_gpu_process_sm_utilization_ratio",
            &proc_labels
        ),
        0.45
    );
    assert_eq!(
        one(
            &samples,
            "sysscope_gpu_process_memory_utilization_ratio",
            &proc_labels
        ),
        0.12
    );
    assert_eq!(
        one(
            &samples,
            "sysscope_gpu_process_memory_used_bytes",
            &proc_labels
        ),
        GIB as f64
    );
    // An exited process keeps its memory series, labelled as unknown.
    let gone_s = gone.to_string();
    let gone_labels = [
        ("pid", gone_s.as_str()),
        ("cgroup", "(unresolved)"),
        ("comm", "(exited)"),
    ];
    assert_eq!(
        one(
            &samples,
            "sysscope_gpu_process_memory_used_bytes",
            &gone_labels
        ),
        (256u64 << 20) as f64
    );
    assert_eq!(
        one(
            &samples,
            "sysscope_gpu_process_sm_utilization_ratio",
            &gone_labels
        ),
        0.0
    );
    assert!(select(&samples, "sysscope_gpu_process_sm_utilization_ratio", &g1).is_empty());

    // The next refresh asks only for newer samples; without one the process was idle.
    let samples = h.scrape();
    let asked: Vec<u64> = fake.with(|s| {
        s.last_since
            .iter()
            .filter(|(i, _)| *i == 0)
            .map(|(_, t)| *t)
            .collect()
    });
    assert_eq!(asked, [0, 2_000]);
    assert_eq!(
        one(
            &samples,
            "sysscope_gpu_process_sm_utilization_ratio",
            &proc_labels
        ),
        0.0
    );
    // A process that exits and leaves the device loses its series.
    fake.with(|s| {
        s.devices[0].memory.retain(|m| m.pid != pid);
    });
    drop(child.stdin.take());
    child.wait().unwrap();
    let samples = h.scrape();
    assert!(select(
        &samples,
        "sysscope_gpu_process_memory_used_bytes",
        &[("pid", pid_s.as_str())]
    )
    .is_empty());
}

/// Collects log lines written while `f` runs on this thread.
fn with_logs<R>(f: impl FnOnce() -> R) -> (R, String) {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let r = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (r, text)
}

#[test]
fn device_loss_and_recovery_degrade_only_the_gpu_collector() {
    let fake = FakeNvml::new();
    fake.with(|s| {
        for uuid in ["GPU-aaaa", "GPU-bbbb"] {
            s.devices.push(FakeDevice {
                reading: reading(uuid, 50),
                ..FakeDevice::default()
            });
        }
    });
    let labeler = labeler();
    let cpu = CpuCollector::start(&Config::default(), labeler.clone()).unwrap();
    let h = Harness::new(vec![
        Box::new(gpu_collector(&fake, &labeler)),
        Box::new(cpu),
    ]);
    let util = |s: &[Sample], gpu: &str, uuid: &str| {
        select(
            s,
            "sysscope_gpu_utilization_ratio",
            &[("gpu", gpu), ("uuid", uuid)],
        )
        .len()
    };
    let cpu_series = |s: &[Sample]| select(s, "sysscope_cpu_utilization_ratio", &[]).len();
    let samples = h.scrape();
    assert_eq!((up(&samples, "gpu"), up(&samples, "cpu")), (1.0, 1.0));
    let cpus = cpu_series(&samples);
    assert!(cpus >= 8);

    // GPU 1 falls off the bus: its series go, GPU 0 and the CPU collector carry on. The loss
    // is logged once however many refreshes it lasts.
    fake.with(|s| s.devices[1].failure = Some(FakeFailure::GpuLost));
    let (samples, logs) = with_logs(|| {
        h.scrape();
        h.scrape()
    });
    assert_eq!(logs.matches("GPU unavailable").count(), 1, "logs:\n{logs}");
    assert!(
        logs.contains("GPU-bbbb") && logs.contains("fell off the bus"),
        "{logs}"
    );
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(up(&samples, "cpu"), 1.0);
    assert_eq!(cpu_series(&samples), cpus);
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 1);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 0);
    assert_eq!(
        one(&samples, "sysscope_gpu_device_up", &[("uuid", "GPU-bbbb")]),
        0.0
    );
    assert_eq!(
        one(&samples, "sysscope_gpu_device_up", &[("uuid", "GPU-aaaa")]),
        1.0
    );

    // It comes back.
    fake.with(|s| s.devices[1].failure = None);
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 1);
    assert_eq!(
        one(&samples, "sysscope_gpu_device_up", &[("uuid", "GPU-bbbb")]),
        1.0
    );

    // GPU 0 disappears from NVML's list: GPU 1 becomes index 0 and keeps its identity.
    let removed = fake.with(|s| s.devices.remove(0));
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(util(&samples, "0", "GPU-bbbb"), 1);
    assert_eq!(
        select(
            &samples,
            "sysscope_gpu_utilization_ratio",
            &[("uuid", "GPU-aaaa")]
        )
        .len(),
        0
    );
    assert_eq!(
        one(&samples, "sysscope_gpu_device_up", &[("uuid", "GPU-aaaa")]),
        0.0
    );
    fake.with(|s| s.devices.insert(0, removed));
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 1);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 1);

    // A process query failing takes the device down as well.
    fake.with(|s| s.devices[0].process_failure = Some(FakeFailure::Unknown));
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 0);
    fake.with(|s| s.devices[0].process_failure = None);

    // NVML itself stops answering (driver reloaded): every GPU series goes, NVML is
    // initialised again, and everything returns.
    fake.with(|s| s.count_failure = Some(FakeFailure::DriverNotLoaded));
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(up(&samples, "cpu"), 1.0);
    assert!(select(&samples, "sysscope_gpu_utilization_ratio", &[]).is_empty());
    fake.with(|s| {
        s.count_failure = None;
        s.connect_failure = Some(Some(FakeFailure::DriverNotLoaded));
    });
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 0.0, "initialising again fails");
    fake.with(|s| s.connect_failure = None);
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(util(&samples, "0", "GPU-aaaa"), 1);
    assert_eq!(util(&samples, "1", "GPU-bbbb"), 1);
    assert_eq!(fake.with(|s| s.connects), 2);
}

#[test]
fn nvml_that_does_not_initialise_at_start_is_retried() {
    let fake = FakeNvml::new();
    fake.with(|s| {
        s.connect_failure = Some(Some(FakeFailure::DriverNotLoaded));
        s.devices.push(FakeDevice {
            reading: reading("GPU-aaaa", 10),
            ..FakeDevice::default()
        });
    });
    let labeler = labeler();
    let c = gpu_collector(&fake, &labeler);
    // The cause (the driver) is in the error's chain, as every log line and reason shows it.
    let why = Chain(c.connect_error().unwrap()).to_string();
    assert!(why.contains("driver"), "{why}");
    let h = Harness::new(vec![Box::new(c)]);
    assert_eq!(up(&h.scrape(), "gpu"), 0.0);
    fake.with(|s| s.connect_failure = None);
    let samples = h.scrape();
    assert_eq!(up(&samples, "gpu"), 1.0);
    assert_eq!(
        one(
            &samples,
            "sysscope_gpu_utilization_ratio",
            &[("uuid", "GPU-aaaa")]
        ),
        0.1
    );
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
    let config = dir.path().join("sysscope.toml");
    std::fs::write(
        &config,
        format!(
            "{TEST_CONFIG}[gpu]\nnvml_library = \"{}/libnvidia-ml.so.1\"\n",
            dir.path().join("missing").display()
        ),
    )
    .unwrap();
    let log = dir.path().join("stderr.log");
    let port = free_port();
    let mut child = Command::new(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--config.file={}", config.display()))
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn sysscope");
    let ready = eventually(Duration::from_secs(30), || {
        matches!(http_get(port, "/-/ready", None), Ok((200, _, _))).then_some(())
    });
    assert!(ready.is_some(), "sysscope not ready");
    let mut samples = Vec::new();
    for _ in 0..3 {
        let (status, _, body) = http_get(port, "/metrics", None).unwrap();
        assert_eq!(status, 200);
        samples = parse_samples(&body);
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());

    assert_eq!(up(&samples, "gpu"), 0.0);
    assert_eq!(up(&samples, "cpu"), 1.0);
    assert_eq!(up(&samples, "syscalls"), 1.0);
    assert!(!select(&samples, "sysscope_cpu_utilization_ratio", &[]).is_empty());
    assert!(!select(&samples, "sysscope_syscalls_total", &[]).is_empty());
    assert_eq!(
        one(&samples, "sysscope_gpu_devices", &[]),
        nvidia_gpus_on_pci()
    );
    assert!(select(&samples, "sysscope_gpu_utilization_ratio", &[]).is_empty());

    let logs = std::fs::read_to_string(&log).unwrap();
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
