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

/// Every query of the dashboards (variables at "All", `$__rate_interval` one minute), as
/// `scripts/checks/queries.py --list-queries` lists them.
pub(crate) fn dashboard_queries() -> Vec<serde_json::Value> {
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
    serde_json::from_str(&stdout_of_success(&out)).unwrap()
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
        Self::start_with_flags(target_port, adapt, &[])
    }

    /// [`Prometheus::start_with`] with more command-line flags (e.g. feature flags).
    pub(crate) fn start_with_flags(
        target_port: u16,
        adapt: impl Fn(&str) -> String,
        flags: &[&str],
    ) -> Self {
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
            .args(flags)
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

/// A read-bound workload in `cg`, under a CPU quota of 90% of a CPU so that the throttling
/// rule and panel have a cgroup to show: a few fsync'd writes (sync latency, block I/O), then
/// reads of a cached 16 MiB file in 1 MiB calls for `seconds`. The quota and the files last
/// as long as the value.
struct ThrottledReader {
    child: Child,
    _quota: Option<CpuQuota>,
    _data: tempfile::NamedTempFile,
    _scratch: tempfile::NamedTempFile,
}

impl ThrottledReader {
    fn start(test: &str, cg: &TestCgroup, seconds: u32) -> Self {
        let quota = CpuQuota::required(test, cg, 90_000, 100_000);
        let data = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(data.path(), vec![7u8; 16 << 20]).unwrap();
        let scratch = tempfile::NamedTempFile::new().unwrap();
        let mut reader = Command::new(workload_bin());
        reader.arg("join-cgroup").arg(&cg.dir);
        if let Some(v1) = quota.as_ref().and_then(|q| q.join.as_ref()) {
            reader.arg("join-cgroup").arg(v1);
        }
        let child = reader
            .args([
                "write-fsync",
                scratch.path().to_str().unwrap(),
                "20",
                "65536",
            ])
            .args([
                "read-loop",
                data.path().to_str().unwrap(),
                &seconds.to_string(),
                "1048576",
            ])
            .spawn()
            .unwrap();
        ThrottledReader {
            child,
            _quota: quota,
            _data: data,
            _scratch: scratch,
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let mut reader = ThrottledReader::start(
        "prometheus_scrapes_rules_evaluate_and_read_alert_goes_pending",
        &cg,
        40,
    );

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
    reader.stop();
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

    let rules_empty = recording_rules_without_data(&prometheus, &[]);
    let failures = dashboard_queries_without_data(&prometheus);
    assert!(
        failures.is_empty() && rules_empty.is_empty(),
        "recording rules without data: {rules_empty:?}\n{} dashboard queries returned no data:\n{}",
        failures.len(),
        failures.into_iter().collect::<Vec<_>>().join("\n")
    );
}

/// The recording rules that return no data, of those over families this machine has and not
/// `skipped` by name (at least five are checked); every rule must be healthy.
fn recording_rules_without_data(prometheus: &Prometheus, skipped: &[&str]) -> Vec<String> {
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
            if NEEDS_POD_NAMES.iter().any(|p| name.starts_with(p)) || skipped.contains(&name) {
                continue;
            }
            checked += 1;
            if result_len(&prometheus.query(name)) == 0 {
                empty.push(name.to_string());
            }
        }
    }
    assert!(checked >= 5, "too few recording rules checked: {checked}");
    empty
}

/// The dashboard queries (variables at "All") that return no data, of those over families
/// this machine has (at least twenty run); every query must be valid.
fn dashboard_queries_without_data(prometheus: &Prometheus) -> BTreeSet<String> {
    let queries = dashboard_queries();
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
    failures
}

/// The kernel bucket (exponent e of (2^(e-1), 2^e] seconds) a quantile lies in.
fn kernel_bucket(seconds: f64) -> i32 {
    seconds.log2().ceil() as i32
}

fn value_of(v: &serde_json::Value) -> Option<f64> {
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// Native histograms end to end: one exporter (log2: the native schema 0, every kernel bucket
/// its own) scraped by a Prometheus with native histograms (protobuf) and one without (text),
/// while a child in a fresh cgroup makes 100 sleeps of 2 ms and 50 of 40 ms. The native series'
/// count and sum are the classic `_count` and `_sum`, both quantiles fall in the same kernel
/// bucket, there is one native series per (cgroup, comm, syscall) and no classic series beside
/// it; and the shipped recording rules and every dashboard query return data from the native
/// histograms alone, as they do from classic ones (`prometheus_scrapes_rules_evaluate_and_
/// read_alert_goes_pending`).
#[test]
fn native_histograms_equal_the_classic_ones_and_rules_read_either_form() {
    if !require_root("native_histograms_equal_the_classic_ones_and_rules_read_either_form") {
        return;
    }
    let _one = one_prometheus_at_a_time();
    let exporter = Exporter::start(
        &format!("{TEST_CONFIG}[syscalls]\nhistogram_resolution = \"log2\"\n"),
        &[],
    );
    let native = Prometheus::start_with_flags(
        exporter.port,
        |rules| rules.to_string(),
        &["--enable-feature=native-histograms"],
    );
    let classic = Prometheus::start_with_flags(exporter.port, |rules| rules.to_string(), &[]);

    // Reads, syncs and block I/O for the rules, as in the classic test, for 15 s, under a CPU
    // quota as there (the throttling rule and panel).
    let reader_cg = TestCgroup::new("sysscope-test-native-reader");
    let mut reader = ThrottledReader::start(
        "native_histograms_equal_the_classic_ones_and_rules_read_either_form",
        &reader_cg,
        15,
    );

    let cg = TestCgroup::new("sysscope-test-native");
    let out = cg
        .command(workload_bin())
        .args(["sleep", "100", "2", "sleep", "50", "40"])
        .output()
        .expect("spawn workload");
    assert!(out.status.success(), "{out:?}");
    let sel = format!("{{cgroup=\"{}\",syscall=\"nanosleep\"}}", cg.rel);
    let name = "sysscope_syscall_duration_seconds";
    let counted = eventually(Duration::from_secs(30), || {
        let n = value_of(&native.query(&format!("histogram_count({name}{sel})")))?;
        let c = value_of(&classic.query(&format!("{name}_count{sel}")))?;
        (n == 150.0 && c == 150.0).then_some(())
    });
    assert!(
        counted.is_some(),
        "native {} classic {}",
        native.query(&format!("histogram_count({name}{sel})")),
        classic.query(&format!("{name}_count{sel}"))
    );
    let native_sum = value_of(&native.query(&format!("histogram_sum({name}{sel})"))).unwrap();
    let classic_sum = value_of(&classic.query(&format!("{name}_sum{sel}"))).unwrap();
    assert!(
        (native_sum - classic_sum).abs() <= 1e-9 * classic_sum,
        "sums: native {native_sum} classic {classic_sum}"
    );
    assert!(classic_sum >= 100.0 * 0.002 + 50.0 * 0.040, "{classic_sum}");
    // The time by state comes through the protobuf exposition too, adding up to the sum.
    let by_state =
        value_of(&native.query(&format!("sum(sysscope_syscall_time_seconds_total{sel})"))).unwrap();
    assert!(
        (by_state - classic_sum).abs() <= 1e-9 * classic_sum,
        "time by state {by_state}, duration sum {classic_sum}"
    );

    for q in [0.5, 0.99] {
        let n = value_of(&native.query(&format!("histogram_quantile({q}, {name}{sel})"))).unwrap();
        let c = value_of(&classic.query(&format!("histogram_quantile({q}, {name}_bucket{sel})")))
            .unwrap();
        assert_eq!(
            kernel_bucket(n),
            kernel_bucket(c),
            "p{q}: native {n} s, classic {c} s"
        );
        // The median is a 2 ms sleep, the 99th percentile a 40 ms one (above 2^-5 s).
        assert_eq!(kernel_bucket(c) > -5, q == 0.99, "p{q} {c} s");
    }

    // One native series per (cgroup, comm, syscall), and no classic series beside them.
    let triples = format!("{{cgroup=\"{}\"}}", cg.rel);
    let n = value_of(&native.query(&format!("count({name}{triples})"))).unwrap();
    let c = value_of(&classic.query(&format!("count({name}_count{triples})"))).unwrap();
    assert_eq!(n, c, "native series per triple");
    assert_eq!(
        result_len(&native.query(
            "count({__name__=~\"sysscope_(syscall|block_io)_duration_seconds_(bucket|sum|count)\"})"
        )),
        0
    );
    assert_eq!(
        result_len(&classic.query(&format!("count({name}{triples})"))),
        0
    );

    // The rules and the dashboards read the native form; the rules that record the rates of
    // classic buckets have none to read.
    let classic_only = [
        "cgroup_family_le:sysscope_syscall_duration_seconds_bucket:rate5m",
        "device_op_le:sysscope_block_io_duration_seconds_bucket:rate5m",
    ];
    let rules = eventually(Duration::from_secs(30), || {
        recording_rules_without_data(&native, &classic_only)
            .is_empty()
            .then_some(())
    });
    let rules_empty = recording_rules_without_data(&native, &classic_only);
    let failures = dashboard_queries_without_data(&native);
    reader.stop();
    assert!(
        rules.is_some() && failures.is_empty(),
        "with native histograms, recording rules without data: {rules_empty:?}\n{} dashboard queries returned no data:\n{}",
        failures.len(),
        failures.into_iter().collect::<Vec<_>>().join("\n")
    );
}
