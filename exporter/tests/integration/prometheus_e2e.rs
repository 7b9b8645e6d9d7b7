//! End to end with a real Prometheus server: it scrapes a running sysscope on loopback with
//! the project's rules loaded, while a read-bound workload runs in its own cgroup. The
//! read-dominance alert must go pending for that cgroup (and not for others), and every
//! dashboard query and recording rule must return data, except those over families this
//! machine cannot produce (GPUs: none here).

use std::{
    collections::BTreeSet,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::common::*;

/// Metric families a GPU-less machine cannot produce; queries over them are skipped, by name.
const ABSENT_HERE: &[&str] = &["sysscope_gpu_"];

/// Dashboard queries restricted to series with a pod name (`pod!=""`), which only the
/// Kubernetes pod watcher provides: skipped off-cluster.
const NEEDS_POD_LABEL: &str = "pod!=\"\"";

/// Recording rules that need labels only a Kubernetes API server provides (pod names come from
/// the pod watcher): skipped off-cluster, by name prefix.
const NEEDS_POD_NAMES: &[&str] = &["namespace_pod", "namespace_family"];

pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Held by each test that runs a Prometheus: two at once, with their exporters and workloads,
/// starve each other on a 2-CPU machine and their timings fail.
pub(crate) fn one_prometheus_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target_port: u16) -> Self {
        Self::start_with(target_port, |rules| rules.to_string())
    }

    /// A Prometheus scraping `target_port` every second with the shipped rules, their 5m
    /// windows shortened to 20s, then passed through `adapt` (a test may shorten `for:`).
    pub(crate) fn start_with(target_port: u16, adapt: impl Fn(&str) -> String) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // The shipped rules use 5m rate windows, and Prometheus divides a rate by the whole
        // window: a series seconds old reads ~30x low for minutes. Shorten the windows to 20s so
        // the test runs in seconds; thresholds and logic are the shipped ones (and the 5m rules
        // themselves are unit-tested by promtool in scripts/checks/prometheus-rules.sh).
        let shipped =
            std::fs::read_to_string(repo_root().join("deploy/prometheus/sysscope-rules.yml"))
                .unwrap();
        let rules = dir.path().join("sysscope-rules.yml");
        std::fs::write(&rules, adapt(&shipped.replace("[5m]", "[20s]"))).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: sysscope\n    static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n",
            rules.display()
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package prometheus) must be installed");
        let p = Self {
            child,
            port,
            _dir: dir,
        };
        let ready = eventually(Duration::from_secs(30), || {
            matches!(http_get(p.port, "/-/ready", None), Ok((200, _, _))).then_some(())
        });
        assert!(ready.is_some(), "prometheus did not become ready");
        p
    }

    pub(crate) fn api(&self, path: &str) -> serde_json::Value {
        let (status, _, body) = http_get(self.port, path, None).expect("prometheus api");
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    pub(crate) fn query(&self, expr: &str) -> serde_json::Value {
        let q = url_encode(expr);
        self.api(&format!("/api/v1/query?query={q}"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn result_len(v: &serde_json::Value) -> usize {
    v["data"]["result"].as_array().map_or(0, |a| a.len())
}

#[test]
fn prometheus_scrapes_rules_evaluate_and_read_alert_goes_pending() {
    if !require_root("prometheus_scrapes_rules_evaluate_and_read_alert_goes_pending") {
        return;
    }
    let _one = one_prometheus_at_a_time();
    let exporter = Exporter::start(TEST_CONFIG, &[]);
    let prometheus = Prometheus::start(exporter.port);

    // A read-bound workload: after a few fsync'd writes (sync latency, block I/O), it reads a
    // cached file in 1 MiB calls for 40 s, in its own cgroup.
    let cg = TestCgroup::new("sysscope-test-reader");
    let data = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(data.path(), vec![7u8; 16 << 20]).unwrap();
    let scratch = tempfile::NamedTempFile::new().unwrap();
    let mut reader = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&cg.dir)
        .args([
            "write-fsync",
            scratch.path().to_str().unwrap(),
            "20",
            "65536",
        ])
        .args(["read-loop", data.path().to_str().unwrap(), "40", "1048576"])
        .spawn()
        .unwrap();

    // A control: an idle server, parked in sleeps (the wait family), in a cgroup of its own.
    let idle_cg = TestCgroup::new("sysscope-test-idle");
    let mut idle = Command::new(workload_bin())
        .arg("join-cgroup")
        .arg(&idle_cg.dir)
        .args(["sleep", "400", "100", "getppid", "10"])
        .spawn()
        .unwrap();

    // The alert goes pending (its `for` is 10m) for the reader's cgroup.
    let alert = eventually(Duration::from_secs(35), || {
        let v = prometheus.api("/api/v1/alerts");
        v["data"]["alerts"].as_array()?.iter().find_map(|a| {
            (a["labels"]["alertname"] == "SyscallReadTimeDominates"
                && a["labels"]["cgroup"] == cg.rel.as_str())
            .then(|| a["state"].as_str().unwrap_or("").to_string())
        })
    });
    let alerts = prometheus.api("/api/v1/alerts");
    let _ = reader.kill();
    let _ = reader.wait();
    let _ = idle.kill();
    let _ = idle.wait();
    let state = alert.unwrap_or_else(|| {
        panic!(
            "SyscallReadTimeDominates never went pending for {}: {alerts}",
            cg.rel
        )
    });
    assert!(state == "pending" || state == "firing", "state {state}");
    // Not for the idle server (other cgroups of this machine may be busy: they are not ours).
    for a in alerts["data"]["alerts"].as_array().unwrap() {
        assert_ne!(
            a["labels"]["cgroup"],
            idle_cg.rel.as_str(),
            "alert for the idle control: {a}"
        );
    }
    let idle_series = prometheus.query(&format!(
        "sysscope_syscalls_total{{cgroup=\"{}\"}}",
        idle_cg.rel
    ));
    assert!(
        result_len(&idle_series) > 0,
        "the idle control was not scraped"
    );

    // Every recording rule returns data, unless it is over a family this machine lacks.
    let rules = prometheus.api("/api/v1/rules");
    let mut empty = Vec::new();
    let mut checked = 0;
    for group in rules["data"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            if rule["type"] != "recording" {
                continue;
            }
            assert_eq!(rule["health"], "ok", "rule {rule}");
            let query = rule["query"].as_str().unwrap();
            if ABSENT_HERE.iter().any(|p| query.contains(p)) {
                continue;
            }
            let name = rule["name"].as_str().unwrap();
            if NEEDS_POD_NAMES.iter().any(|p| name.starts_with(p)) {
                continue;
            }
            checked += 1;
            if result_len(&prometheus.query(name)) == 0 {
                empty.push(name.to_string());
            }
        }
    }
    assert!(checked >= 5, "too few recording rules checked: {checked}");
    let rules_empty = empty;

    // Every dashboard query returns data, with the variables at "All".
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/checks/queries.py"))
        .args([
            "--list-queries",
            "--format",
            "json",
            "--var",
            "__rate_interval=1m",
        ])
        .current_dir(repo_root())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let queries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut failures = BTreeSet::new();
    let mut ran = 0;
    for q in &queries {
        let expr = q["expr"].as_str().unwrap();
        if ABSENT_HERE.iter().any(|p| expr.contains(p)) || expr.contains(NEEDS_POD_LABEL) {
            continue;
        }
        ran += 1;
        let v = prometheus.query(expr);
        assert_eq!(v["status"], "success", "{expr}: {v}");
        if result_len(&v) == 0 {
            failures.insert(format!("{} / {}: {expr}", q["dashboard"], q["panel"]));
        }
    }
    assert!(ran >= 20, "too few dashboard queries ran: {ran}");
    assert!(
        failures.is_empty() && rules_empty.is_empty(),
        "recording rules without data: {rules_empty:?}\n{} dashboard queries returned no data:\n{}",
        failures.len(),
        failures.into_iter().collect::<Vec<_>>().join("\n")
    );
}
