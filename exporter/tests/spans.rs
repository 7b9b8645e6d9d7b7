//! Slow-call spans and OTLP export against ground truth, on the real kernel with the real
//! probes and a real OTLP receiver in the test (tonic `TraceService`/`MetricsService` on
//! loopback, and an HTTP/protobuf receiver on hyper): children make an exact number of slow
//! and fast calls, and exactly those must arrive, with the right times and attributes.

mod common;

use std::{
    collections::HashMap,
    convert::Infallible,
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use common::*;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::{
    collector::{
        metrics::v1::{
            metrics_service_server::{MetricsService, MetricsServiceServer},
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        },
        trace::v1::{
            trace_service_server::{TraceService, TraceServiceServer},
            ExportTraceServiceRequest, ExportTraceServiceResponse,
        },
    },
    common::v1::{any_value::Value, KeyValue},
    metrics::v1::{metric::Data, number_data_point},
};
use prost::Message;

// ---------------------------------------------------------------------------------------------
// A real OTLP receiver.

/// A received span, flattened.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace_id: Vec<u8>,
    start_ns: u64,
    end_ns: u64,
    status_code: i32,
    attrs: HashMap<String, Value>,
    resource: HashMap<String, Value>,
}

impl Span {
    fn int(&self, key: &str) -> Option<i64> {
        match self.attrs.get(key) {
            Some(Value::IntValue(i)) => Some(*i),
            _ => None,
        }
    }

    fn str(&self, key: &str) -> Option<&str> {
        match self.attrs.get(key) {
            Some(Value::StringValue(s)) => Some(s),
            _ => None,
        }
    }

    fn resource_str(&self, key: &str) -> Option<&str> {
        match self.resource.get(key) {
            Some(Value::StringValue(s)) => Some(s),
            _ => None,
        }
    }

    fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}

fn attr_map(kvs: &[KeyValue]) -> HashMap<String, Value> {
    kvs.iter()
        .filter_map(|kv| Some((kv.key.clone(), kv.value.clone()?.value?)))
        .collect()
}

#[derive(Debug, Default, Clone)]
struct Received {
    spans: Arc<Mutex<Vec<Span>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    /// (path, content type) of HTTP requests.
    http_requests: Arc<Mutex<Vec<(String, String)>>>,
}

impl Received {
    fn add_traces(&self, req: ExportTraceServiceRequest) {
        let mut spans = self.spans.lock().unwrap();
        for rs in req.resource_spans {
            let resource = rs
                .resource
                .map(|r| attr_map(&r.attributes))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push(Span {
                        name: s.name,
                        trace_id: s.trace_id,
                        start_ns: s.start_time_unix_nano,
                        end_ns: s.end_time_unix_nano,
                        status_code: s.status.map(|st| st.code).unwrap_or(0),
                        attrs: attr_map(&s.attributes),
                        resource: resource.clone(),
                    });
                }
            }
        }
    }

    fn spans_of(&self, pid: u32) -> Vec<Span> {
        let mut v: Vec<Span> = self
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.int("process.pid") == Some(pid as i64))
            .cloned()
            .collect();
        v.sort_by_key(|s| s.start_ns);
        v
    }

    /// The latest value of counter `name` for the data point whose attributes include `want`.
    fn counter(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let metrics = self.metrics.lock().unwrap();
        let mut last = None;
        for req in metrics.iter() {
            for m in req
                .resource_metrics
                .iter()
                .flat_map(|r| &r.scope_metrics)
                .flat_map(|s| &s.metrics)
                .filter(|m| m.name == name)
            {
                let Some(Data::Sum(sum)) = &m.data else {
                    continue;
                };
                for p in &sum.data_points {
                    if matches_attrs(&p.attributes, want) {
                        if let Some(number_data_point::Value::AsDouble(v)) = p.value {
                            last = Some(v);
                        }
                    }
                }
            }
        }
        last
    }

    /// (bounds, bucket counts, count) of the latest histogram point matching `want`.
    fn histogram(&self, name: &str, want: &[(&str, &str)]) -> Option<(Vec<f64>, Vec<u64>, u64)> {
        let metrics = self.metrics.lock().unwrap();
        let mut last = None;
        for req in metrics.iter() {
            for m in req
                .resource_metrics
                .iter()
                .flat_map(|r| &r.scope_metrics)
                .flat_map(|s| &s.metrics)
                .filter(|m| m.name == name)
            {
                let Some(Data::Histogram(h)) = &m.data else {
                    continue;
                };
                for p in &h.data_points {
                    if matches_attrs(&p.attributes, want) {
                        last = Some((p.explicit_bounds.clone(), p.bucket_counts.clone(), p.count));
                    }
                }
            }
        }
        last
    }
}

fn matches_attrs(attrs: &[KeyValue], want: &[(&str, &str)]) -> bool {
    let map = attr_map(attrs);
    want.iter()
        .all(|(k, v)| matches!(map.get(*k), Some(Value::StringValue(s)) if s == v))
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.add_traces(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP receiver on loopback, stopped on drop.
struct Receiver {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    data: Received,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A gRPC receiver (TraceService + MetricsService) on `port` (0: any free port).
    fn grpc(port: u16) -> Self {
        let runtime = Self::runtime();
        let data = Received::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("bind gRPC receiver");
        let addr = listener.local_addr().unwrap();
        let svc = data.clone();
        runtime.spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(svc.clone()))
                .add_service(MetricsServiceServer::new(svc))
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener),
                    async {
                        let _ = rx.await;
                    },
                )
                .await
                .unwrap();
        });
        Self {
            runtime: Some(runtime),
            addr,
            data,
            stop: Some(tx),
        }
    }

    /// An OTLP/HTTP receiver (`POST /v1/traces`, `POST /v1/metrics`, protobuf bodies).
    fn http() -> Self {
        let runtime = Self::runtime();
        let data = Received::default();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .expect("bind HTTP receiver");
        let addr = listener.local_addr().unwrap();
        let svc = data.clone();
        runtime.spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    a = listener.accept() => a.unwrap(),
                    _ = &mut rx => return,
                };
                let data = svc.clone();
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let data = data.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let ctype = req
                                .headers()
                                .get(hyper::header::CONTENT_TYPE)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            data.http_requests
                                .lock()
                                .unwrap()
                                .push((path.clone(), ctype));
                            let reply = match path.as_str() {
                                "/v1/traces" => {
                                    data.add_traces(
                                        ExportTraceServiceRequest::decode(body).unwrap(),
                                    );
                                    ExportTraceServiceResponse::default().encode_to_vec()
                                }
                                "/v1/metrics" => {
                                    data.metrics
                                        .lock()
                                        .unwrap()
                                        .push(ExportMetricsServiceRequest::decode(body).unwrap());
                                    ExportMetricsServiceResponse::default().encode_to_vec()
                                }
                                _ => Vec::new(),
                            };
                            let mut resp =
                                hyper::Response::new(Full::new(bytes::Bytes::from(reply)));
                            resp.headers_mut().insert(
                                hyper::header::CONTENT_TYPE,
                                hyper::header::HeaderValue::from_static("application/x-protobuf"),
                            );
                            Ok::<_, Infallible>(resp)
                        }
                    },
                );
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            runtime: Some(runtime),
            addr,
            data,
            stop: Some(tx),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        // Do not wait for open connections (the exporter keeps one): stop the server now.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Every exporter samples every process's slow reads: these tests run one at a time so one
/// test's slow calls do not fill another's queue or rate budget.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Only reads of 20 ms or more are sampled: nothing else can make a span in these tests.
const SLOW_READS: &str = "[collection]\nmin_interval = \"0s\"\n[slow_calls]\nthreshold = \"1h\"\n[slow_calls.thresholds]\nread = \"20ms\"\n";

/// [`SLOW_READS`] with more `[slow_calls]` keys.
fn slow_reads_with(extra: &str) -> String {
    SLOW_READS.replace(
        "threshold = \"1h\"\n",
        &format!("threshold = \"1h\"\n{extra}\n"),
    )
}

/// A finished workload: its pid and what it printed.
struct Ran {
    pid: u32,
    stdout: Vec<String>,
}

/// Runs the workload with `args` (joining `cg` first when given) and waits for it.
fn run(cg: Option<&TestCgroup>, args: &[&str]) -> Ran {
    let mut cmd = Command::new(workload_bin());
    if let Some(cg) = cg {
        cmd.arg("join-cgroup").arg(&cg.dir);
    }
    let mut child = cmd
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn workload");
    let pid = child.id();
    let stdout: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "workload {args:?} failed: {status}");
    Ran { pid, stdout }
}

/// Durations the workload measured for its reads (`read_ns=` lines).
fn measured_reads(ran: &Ran) -> Vec<u64> {
    ran.stdout
        .iter()
        .filter_map(|l| l.strip_prefix("read_ns=")?.parse().ok())
        .collect()
}

fn metric(exporter: &Exporter, name: &str, want: &[(&str, &str)]) -> f64 {
    sum(&parse_samples(&exporter.scrape()), name, want)
}

/// Number of CPUs the kernel splits the slow-call budget over (as the loader counts them).
fn possible_cpus() -> u32 {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    text.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<u32>().unwrap() - a.parse::<u32>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// Checks a span of a `slow-pipe-read-timed` child in `cg` against the truth.
fn check_pipe_read_span(span: &Span, pid: u32, cg: &TestCgroup, measured_ns: u64) {
    assert_eq!(span.name, "read");
    assert_eq!(span.int("process.pid"), Some(pid as i64));
    // The main thread reads (the peer thread writes).
    assert_eq!(span.int("thread.id"), Some(pid as i64));
    assert_eq!(
        span.str("process.linux.cgroup"),
        Some(format!("0::{}", cg.rel).as_str())
    );
    assert_eq!(
        span.str("process.executable.name"),
        Some("sysscope-workload")
    );
    let path = span.str("file.path").unwrap_or("");
    assert!(
        path.starts_with("pipe:[") && path.ends_with(']'),
        "file.path {path:?} of {span:?}"
    );
    assert_eq!(span.int("sysscope.syscall.bytes"), Some(1));
    assert_eq!(span.int("sysscope.syscall.requested_bytes"), Some(1));
    assert_eq!(span.int("sysscope.syscall.nr"), Some(libc::SYS_read));
    assert!(span.int("sysscope.syscall.fd").is_some_and(|fd| fd >= 3));
    assert!(!span.attrs.contains_key("error.type"));
    assert_eq!(span.status_code, 0, "unset status");
    // Duration within 10% of the truth: what the workload measured around the call.
    let d = span.duration_ns() as f64;
    let truth = measured_ns as f64;
    assert!(
        (d - truth).abs() <= truth * 0.10,
        "span lasted {d} ns, the workload measured {truth} ns"
    );
    // Wall-clock times: within a minute of now (the kernel clock is monotonic).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(span.end_ns <= now && now - span.end_ns < 60_000_000_000);
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn slow_reads_become_exact_spans_over_grpc_with_metrics_and_exemplars() {
    if !require_root("slow_reads_become_exact_spans_over_grpc_with_metrics_and_exemplars") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::grpc(0);
    let url = receiver.url();
    let exporter = Exporter::start_with_env(
        SLOW_READS,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
            ("OTEL_SERVICE_NAME", "sysscope-test"),
            ("NODE_NAME", "test-node"),
        ],
    );
    let cg = TestCgroup::new("sysscope-test-spans");
    const N_FAST: u64 = 10_000;
    // The pipe stays open and the trailing sleep keeps the child alive while its last read is
    // looked up in /proc: a descriptor's path can only be read while the process holds it.
    let ran = run(
        Some(&cg),
        &[
            "slow-pipe-read-timed",
            "10",
            "30",
            "getppid",
            &N_FAST.to_string(),
            "sleep",
            "1",
            "200",
        ],
    );
    let truth = measured_reads(&ran);
    assert_eq!(truth.len(), 10, "{:?}", ran.stdout);

    let got = eventually(Duration::from_secs(20), || {
        (receiver.data.spans_of(ran.pid).len() >= 10).then_some(())
    });
    assert!(
        got.is_some(),
        "spans: {:?}",
        receiver.data.spans_of(ran.pid)
    );
    // Export is first in, first out: once a later child's span is in, every span of the
    // first child is too. Then the count must be exact.
    let marker = run(None, &["slow-pipe-read", "1", "25", "sleep", "1", "200"]);
    assert!(eventually(Duration::from_secs(20), || {
        (!receiver.data.spans_of(marker.pid).is_empty()).then_some(())
    })
    .is_some());
    let spans = receiver.data.spans_of(ran.pid);
    assert_eq!(spans.len(), 10, "exactly the slow calls: {spans:?}");
    eprintln!(
        "span durations (ms): {:?}; measured by the workload: {:?}",
        spans
            .iter()
            .map(|s| s.duration_ns() as f64 / 1e6)
            .collect::<Vec<_>>(),
        truth.iter().map(|t| *t as f64 / 1e6).collect::<Vec<_>>()
    );
    for (span, measured) in spans.iter().zip(&truth) {
        check_pipe_read_span(span, ran.pid, &cg, *measured);
    }
    let s = &spans[0];
    assert_eq!(s.resource_str("service.name"), Some("sysscope-test"));
    assert_eq!(s.resource_str("k8s.node.name"), Some("test-node"));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(s.resource_str("host.name"), Some(host.trim()));

    // OTLP metrics carry the same catalogue: the exact call counts of the child.
    let series = [("cgroup", cg.rel.as_str()), ("syscall", "getppid")];
    let pushed = eventually(Duration::from_secs(20), || {
        (receiver.data.counter("sysscope_syscalls", &series) == Some(N_FAST as f64)).then_some(())
    });
    assert!(
        pushed.is_some(),
        "sysscope_syscalls for getppid: {:?}",
        receiver.data.counter("sysscope_syscalls", &series)
    );
    let reads = [("cgroup", cg.rel.as_str()), ("syscall", "read")];
    let (bounds, counts, count) = receiver
        .data
        .histogram("sysscope_syscall_duration_seconds", &reads)
        .expect("read latency histogram pushed");
    assert_eq!(count, 10);
    assert_eq!(counts.iter().sum::<u64>(), 10);
    assert_eq!(counts.len(), bounds.len() + 1);
    // Same bucket bounds as the Prometheus exposition.
    let samples = parse_samples(&exporter.scrape());
    let mut les: Vec<f64> = select(&samples, "sysscope_syscall_duration_seconds_bucket", &reads)
        .iter()
        .map(|s| s.labels["le"].parse::<f64>().unwrap())
        .filter(|le| le.is_finite())
        .collect();
    les.sort_by(f64::total_cmp);
    assert_eq!(bounds, les);

    // Exemplars: a read bucket of this cgroup points at one of the spans, and the reference
    // OpenMetrics parser accepts the exposition with it.
    let om = exporter.scrape_openmetrics();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.om");
    std::fs::write(&path, &om).unwrap();
    let script = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
cgroup = sys.argv[2]
for f in text_string_to_metric_families(open(sys.argv[1]).read()):
    for s in f.samples:
        if s.name == "sysscope_syscall_duration_seconds_bucket" and s.exemplar and s.labels.get("cgroup") == cgroup and s.labels.get("syscall") == "read":
            print(s.exemplar.labels["trace_id"], s.exemplar.value, s.labels["le"])
"#;
    let out = Command::new("python3")
        .args(["-c", script, path.to_str().unwrap(), &cg.rel])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "the OpenMetrics parser rejected the exposition:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no exemplar for the reads:\n{om}"));
    let mut parts = line.split_whitespace();
    let trace_id = parts.next().unwrap();
    let value: f64 = parts.next().unwrap().parse().unwrap();
    let le: f64 = parts.next().unwrap().parse().unwrap();
    assert!(
        spans.iter().any(|s| s
            .trace_id
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            == trace_id),
        "exemplar trace id {trace_id} is not one of the child's spans"
    );
    assert!(
        value < le && value >= 0.02,
        "exemplar {value} s in bucket le={le}"
    );

    // Self-metrics.
    let samples = parse_samples(&exporter.scrape());
    assert!(
        sum(
            &samples,
            "sysscope_spans_exported_total",
            &[("destination", "otlp")]
        ) >= 11.0
    );
    assert!(
        sum(
            &samples,
            "sysscope_otlp_requests_total",
            &[("signal", "traces"), ("result", "success")]
        ) >= 1.0
    );
    assert!(
        sum(
            &samples,
            "sysscope_otlp_requests_total",
            &[("signal", "metrics"), ("result", "success")]
        ) >= 1.0
    );
}

#[test]
fn http_protobuf_exports_spans_and_metrics() {
    if !require_root("http_protobuf_exports_spans_and_metrics") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::http();
    let url = receiver.url();
    let _exporter = Exporter::start_with_env(
        SLOW_READS,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
        ],
    );
    let cg = TestCgroup::new("sysscope-test-spans-http");
    let ran = run(
        Some(&cg),
        &[
            "slow-pipe-read-timed",
            "3",
            "30",
            "getppid",
            "500",
            "sleep",
            "1",
            "200",
        ],
    );
    let truth = measured_reads(&ran);
    let marker = run(None, &["slow-pipe-read", "1", "25", "sleep", "1", "200"]);
    assert!(eventually(Duration::from_secs(20), || {
        (!receiver.data.spans_of(marker.pid).is_empty()).then_some(())
    })
    .is_some());
    let spans = receiver.data.spans_of(ran.pid);
    assert_eq!(spans.len(), 3, "{spans:?}");
    for (span, measured) in spans.iter().zip(&truth) {
        check_pipe_read_span(span, ran.pid, &cg, *measured);
    }
    assert_eq!(spans[0].resource_str("service.name"), Some("sysscope"));
    let series = [("cgroup", cg.rel.as_str()), ("syscall", "getppid")];
    assert!(
        eventually(Duration::from_secs(20), || {
            (receiver.data.counter("sysscope_syscalls", &series) == Some(500.0)).then_some(())
        })
        .is_some(),
        "{:?}",
        receiver.data.counter("sysscope_syscalls", &series)
    );
    let requests = receiver.data.http_requests.lock().unwrap().clone();
    for path in ["/v1/traces", "/v1/metrics"] {
        assert!(
            requests
                .iter()
                .any(|(p, ct)| p == path && ct == "application/x-protobuf"),
            "{requests:?}"
        );
    }
}

#[test]
fn rate_limit_bounds_exported_spans_and_counts_the_rest() {
    if !require_root("rate_limit_bounds_exported_spans_and_counts_the_rest") {
        return;
    }
    let _serial = serial();
    const LIMIT: u32 = 20;
    const BURST: u32 = 60;
    // No OTLP endpoint: spans go to the local JSON endpoint.
    let config = slow_reads_with(&format!("max_events_per_second = {LIMIT}"));
    let exporter = Exporter::start(&config, &[]);
    let cpus = possible_cpus();
    // The loader splits the budget per CPU, rounding up; the kernel counts whole seconds.
    let bound = LIMIT.div_ceil(cpus) * cpus;
    let dropped_before = metric(
        &exporter,
        "sysscope_spans_dropped_total",
        &[("reason", "rate_limited")],
    );

    // BURST slow reads that all end within one second of the kernel's clock.
    let ran = run(
        None,
        &[
            "slow-pipe-burst",
            &BURST.to_string(),
            "30",
            "sleep",
            "1",
            "200",
        ],
    );
    // A marker in a later second: once its span is there, the burst has been processed.
    let marker = run(
        None,
        &[
            "sleep",
            "1",
            "1000",
            "slow-pipe-read",
            "1",
            "25",
            "sleep",
            "1",
            "200",
        ],
    );
    let get = || -> serde_json::Value {
        let (status, _, body) = http_get(exporter.port, "/api/v1/slow-calls", None).unwrap();
        assert_eq!(status, 200);
        serde_json::from_str(&body).unwrap()
    };
    let of = |doc: &serde_json::Value, pid: u32| -> Vec<serde_json::Value> {
        doc["slow_calls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["attributes"]["process.pid"] == pid)
            .cloned()
            .collect()
    };
    let doc = eventually(Duration::from_secs(20), || {
        let doc = get();
        (!of(&doc, marker.pid).is_empty()).then_some(doc)
    })
    .expect("the marker's slow call never showed up at /api/v1/slow-calls");
    assert_eq!(doc["enabled"], true);
    let sampled = of(&doc, ran.pid);
    let k = sampled.len() as u32;
    assert!(k >= 1, "nothing of the burst was sampled");
    assert!(
        k <= bound,
        "{k} spans of a {BURST}-call burst exported, limit {bound}/s"
    );
    for call in &sampled {
        assert_eq!(call["name"], "read");
        assert_eq!(call["trace_id"].as_str().unwrap().len(), 32);
        assert!(call["duration_seconds"].as_f64().unwrap() >= 0.02);
        assert!(call["attributes"]["file.path"]
            .as_str()
            .is_some_and(|p| p.starts_with("pipe:[")));
    }
    // Everything of the burst that was not exported was counted as rate-limited (plus
    // whatever other processes' slow reads the same window refused).
    let dropped = metric(
        &exporter,
        "sysscope_spans_dropped_total",
        &[("reason", "rate_limited")],
    ) - dropped_before;
    eprintln!(
        "burst of {BURST}: {k} exported (limit {bound}/s), {dropped} counted as rate-limited"
    );
    assert!(
        dropped >= (BURST - k) as f64,
        "{dropped} counted as rate-limited, expected at least {}",
        BURST - k
    );
    assert!(
        metric(
            &exporter,
            "sysscope_spans_exported_total",
            &[("destination", "local")]
        ) >= (k + 1) as f64
    );
}

#[test]
fn collector_outage_keeps_memory_bounded_counts_drops_and_resumes() {
    if !require_root("collector_outage_keeps_memory_bounded_counts_drops_and_resumes") {
        return;
    }
    let _serial = serial();
    const QUEUE: u64 = 8;
    const SLOW: u64 = 20;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let config = slow_reads_with(&format!("export_queue = {QUEUE}"));
    let exporter = Exporter::start_with_env(
        &config,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    );
    let pid = exporter.child.id();
    let rss_before = rss_kib(pid);

    // Nobody listens: every span beyond the queue is dropped and counted.
    let down = run(
        None,
        &[
            "slow-pipe-read",
            &SLOW.to_string(),
            "25",
            "sleep",
            "1",
            "200",
        ],
    );
    let counted = eventually(Duration::from_secs(20), || {
        let samples = parse_samples(&exporter.scrape());
        let queued = sum(&samples, "sysscope_spans_queued", &[]);
        assert!(
            queued <= QUEUE as f64,
            "{queued} spans queued, capacity {QUEUE}"
        );
        let full = sum(
            &samples,
            "sysscope_spans_dropped_total",
            &[("reason", "export_queue_full")],
        );
        let failures = sum(
            &samples,
            "sysscope_otlp_requests_total",
            &[("signal", "traces"), ("result", "failure")],
        );
        (full >= (SLOW - QUEUE) as f64 && failures >= 1.0).then_some(())
    });
    assert!(
        counted.is_some(),
        "drops were not counted:\n{}",
        exporter.scrape()
    );
    assert!(
        exporter_alive(&exporter),
        "sysscope exited during the outage"
    );
    let rss_after = rss_kib(pid);
    eprintln!(
        "outage: RSS {rss_before} -> {rss_after} KiB; {}",
        parse_samples(&exporter.scrape())
            .iter()
            .filter(|s| s.name.starts_with("sysscope_spans_dropped")
                || s.name.starts_with("sysscope_otlp"))
            .map(|s| format!("{}{:?}={}", s.name, s.labels, s.value))
            .collect::<Vec<_>>()
            .join(" ")
    );
    assert!(
        rss_after < rss_before + 64 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB during the outage"
    );

    // The collector comes up on the same port: export resumes (within the longest backoff).
    let ok_before = metric(
        &exporter,
        "sysscope_otlp_requests_total",
        &[("signal", "traces"), ("result", "success")],
    );
    let receiver = Receiver::grpc(port);
    let resumed = eventually(Duration::from_secs(30), || {
        let ok = metric(
            &exporter,
            "sysscope_otlp_requests_total",
            &[("signal", "traces"), ("result", "success")],
        );
        (ok > ok_before && !receiver.data.spans.lock().unwrap().is_empty()).then_some(())
    });
    assert!(
        resumed.is_some(),
        "export did not resume:\n{}",
        exporter.scrape()
    );
    // And slow calls made from now on arrive. (A child's spans can still be refused by the
    // small queue if other processes' slow reads crowd it, which is counted: try a few.)
    let mut arrived = false;
    for _ in 0..3 {
        let up = run(None, &["slow-pipe-read", "3", "25", "sleep", "1", "200"]);
        if eventually(Duration::from_secs(10), || {
            (receiver.data.spans_of(up.pid).len() == 3).then_some(())
        })
        .is_some()
        {
            arrived = true;
            break;
        }
    }
    assert!(
        arrived,
        "slow calls after the outage were not exported:\n{}",
        exporter.scrape()
    );
    // What was queued during the outage (at most the queue) went out first.
    assert!(receiver.data.spans_of(down.pid).len() as u64 <= QUEUE);
    let samples = parse_samples(&exporter.scrape());
    assert!(
        sum(
            &samples,
            "sysscope_otlp_requests_total",
            &[("signal", "traces"), ("result", "success")]
        ) >= 1.0
    );
    assert!(
        sum(
            &samples,
            "sysscope_spans_exported_total",
            &[("destination", "otlp")]
        ) >= 3.0
    );
}

fn exporter_alive(e: &Exporter) -> bool {
    std::path::Path::new(&format!("/proc/{}", e.child.id())).exists()
        && !std::fs::read_to_string(format!("/proc/{}/stat", e.child.id()))
            .unwrap_or_default()
            .contains(") Z ")
}

// Needs no privileges: the settings are checked before anything is loaded.
#[test]
fn bad_otel_variable_is_named_and_exits_nonzero() {
    let port = free_port();
    let out = Command::new(sysscope_bin())
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && stderr.contains("udp"),
        "{stderr}"
    );
}
