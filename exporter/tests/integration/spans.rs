//! Slow-call spans and OTLP export against ground truth, on the real kernel with the real
//! probes and a real OTLP receiver in the test (tonic `TraceService`/`MetricsService` on
//! loopback, and an OTLP/HTTP receiver on hyper for protobuf and JSON bodies, both also over
//! TLS with certificates made by the test): children make an exact number of slow and fast
//! calls, and exactly those must arrive, with the right times and attributes.

use std::{
    collections::HashMap,
    convert::Infallible,
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::*;
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
    common::v1::{any_value::Value, AnyValue, KeyValue},
    metrics::v1::{metric::Data, number_data_point, AggregationTemporality},
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
    /// Wall-clock time the receiver got it (ns since the epoch).
    arrived_ns: u64,
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
    /// (path, body bytes) of HTTP requests.
    http_bodies: Arc<Mutex<Vec<(String, usize)>>>,
    /// TLS handshakes the receiver refused (e.g. no client certificate).
    tls_failures: Arc<std::sync::atomic::AtomicU64>,
    /// Signals (`traces`, `metrics`) of requests that came gzip-compressed, one per request.
    gzipped: Arc<Mutex<Vec<&'static str>>>,
    /// (signal, the `x-scope-orgid` header or metadata) of every request.
    tenants: Arc<Mutex<Vec<(&'static str, String)>>>,
}

/// Whether a gRPC request said its message is gzip-compressed.
fn grpc_gzip<T>(request: &tonic::Request<T>) -> bool {
    request
        .metadata()
        .get("grpc-encoding")
        .is_some_and(|v| v == "gzip")
}

impl Received {
    fn tenant(&self, signal: &'static str, value: Option<&[u8]>) {
        let value = String::from_utf8_lossy(value.unwrap_or_default()).into_owned();
        self.tenants.lock().unwrap().push((signal, value));
    }

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
                        arrived_ns: now_unix_ns(),
                        status_code: s.status.map(|st| st.code).unwrap_or(0),
                        attrs: attr_map(&s.attributes),
                        resource: resource.clone(),
                    });
                }
            }
        }
    }

    /// The spans of `ran`: of its pid, and started after it was spawned (a pid used earlier
    /// by another process is not its).
    fn spans_of(&self, ran: &Ran) -> Vec<Span> {
        let mut v: Vec<Span> = self
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| {
                s.int("process.pid") == Some(ran.pid as i64) && s.start_ns >= ran.spawned_ns
            })
            .cloned()
            .collect();
        v.sort_by_key(|s| s.start_ns);
        v
    }

    /// The latest value of counter `name` for the data point whose attributes include `want`.
    fn counter(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let mut last = None;
        for data in self.data_named(name) {
            let Data::Sum(sum) = data else {
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
        last
    }

    /// (bounds, bucket counts, count) of the latest histogram point matching `want`.
    fn histogram(&self, name: &str, want: &[(&str, &str)]) -> Option<(Vec<f64>, Vec<u64>, u64)> {
        let mut last = None;
        for data in self.data_named(name) {
            let Data::Histogram(h) = data else {
                continue;
            };
            for p in h.data_points {
                if matches_attrs(&p.attributes, want) {
                    last = Some((p.explicit_bounds, p.bucket_counts, p.count));
                }
            }
        }
        last
    }

    /// The data of every metric named `name` the receiver got, in arrival order.
    fn data_named(&self, name: &str) -> Vec<Data> {
        let metrics = self.metrics.lock().unwrap();
        metrics
            .iter()
            .flat_map(|r| &r.resource_metrics)
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .filter(|m| m.name == name)
            .filter_map(|m| m.data.clone())
            .collect()
    }
}

impl Received {
    /// "path: n requests, b bytes on average" per path (for the test output).
    fn body_sizes(&self) -> String {
        let bodies = self.http_bodies.lock().unwrap();
        ["/v1/traces", "/v1/metrics"]
            .iter()
            .map(|path| {
                let sizes: Vec<usize> = bodies
                    .iter()
                    .filter(|(p, _)| p == path)
                    .map(|(_, n)| *n)
                    .collect();
                format!(
                    "{path}: {} requests, {} bytes on average",
                    sizes.len(),
                    sizes.iter().sum::<usize>() / sizes.len().max(1)
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// (attributes, value) of the `sysscope_syscalls` getppid points in the latest request
    /// (for failure messages).
    /// Every exponential-histogram point of `name` matching `want`, in arrival order, with
    /// its temporality.
    fn exponential_points(
        &self,
        name: &str,
        want: &[(&str, &str)],
    ) -> Vec<(
        i32,
        opentelemetry_proto::tonic::metrics::v1::ExponentialHistogramDataPoint,
    )> {
        let mut out = Vec::new();
        for data in self.data_named(name) {
            if let Data::ExponentialHistogram(h) = data {
                for p in h.data_points {
                    if matches_attrs(&p.attributes, want) {
                        out.push((h.aggregation_temporality, p));
                    }
                }
            }
        }
        out
    }

    fn getppid_series(&self) -> Vec<(String, f64)> {
        let metrics = self.metrics.lock().unwrap();
        let Some(req) = metrics.last() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for m in req
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .filter(|m| m.name == "sysscope_syscalls")
        {
            let Some(Data::Sum(sum)) = &m.data else {
                continue;
            };
            for p in &sum.data_points {
                if matches_attrs(&p.attributes, &[("syscall", "getppid")]) {
                    if let Some(number_data_point::Value::AsDouble(v)) = p.value {
                        out.push((format!("{:?}", attr_map(&p.attributes)), v));
                    }
                }
            }
        }
        out
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
        if grpc_gzip(&request) {
            self.gzipped.lock().unwrap().push("traces");
        }
        self.tenant(
            "traces",
            request
                .metadata()
                .get("x-scope-orgid")
                .map(|v| v.as_bytes()),
        );
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
        if grpc_gzip(&request) {
            self.gzipped.lock().unwrap().push("metrics");
        }
        self.tenant(
            "metrics",
            request
                .metadata()
                .get("x-scope-orgid")
                .map(|v| v.as_bytes()),
        );
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
        Self::grpc_serving(port, None)
    }

    /// The gRPC receiver, in plain text or behind `tls`.
    fn grpc_serving(port: u16, tls: Option<tonic::transport::ServerTlsConfig>) -> Self {
        let runtime = Self::runtime();
        let data = Received::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", port)))
            .expect("bind gRPC receiver");
        let addr = listener.local_addr().unwrap();
        let svc = data.clone();
        runtime.spawn(async move {
            let mut server = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                server = server.tls_config(tls).unwrap();
            }
            server
                .add_service(
                    TraceServiceServer::new(svc.clone())
                        .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                )
                .add_service(
                    MetricsServiceServer::new(svc)
                        .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
                )
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

    /// An OTLP/HTTP receiver (`POST /v1/traces`, `POST /v1/metrics`, protobuf or JSON bodies).
    fn http() -> Self {
        Self::http_with(None)
    }

    /// [`Receiver::http`] behind TLS when `tls` is given.
    fn http_with(tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let runtime = Self::runtime();
        let data = Received::default();
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .expect("bind HTTP receiver");
        let addr = listener.local_addr().unwrap();
        let svc = data.clone();
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        runtime.spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    a = listener.accept() => a.unwrap(),
                    _ = &mut rx => return,
                };
                let data = svc.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        None => serve_otlp_http(stream, data).await,
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(tls) => serve_otlp_http(tls, data).await,
                            // A refused handshake (a TLS error), not a client that gave up
                            // on a slow one (an I/O error).
                            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                                data.tls_failures
                                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Err(_) => {}
                        },
                    }
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

    /// A gRPC receiver behind TLS (`identity`: the server's certificate and key PEM), asking
    /// for a client certificate signed by `client_ca` when given.
    fn grpc_tls(identity: (&str, &str), client_ca: Option<&str>) -> Self {
        let mut tls = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(identity.0, identity.1));
        if let Some(ca) = client_ca {
            tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        Self::grpc_serving(0, Some(tls))
    }

    fn https_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Serves OTLP/HTTP on one connection: protobuf bodies are decoded with prost, JSON bodies
/// are read field by field as the OTLP/JSON mapping writes them (not with the sender's own
/// serde code, so a wrong mapping cannot go unnoticed).
async fn serve_otlp_http<I>(io: I, data: Received)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let data = data.clone();
        async move {
            let path = req.uri().path().to_string();
            let ctype = req
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let gzipped = req
                .headers()
                .get(hyper::header::CONTENT_ENCODING)
                .is_some_and(|v| v == "gzip");
            let signal = if path == "/v1/traces" {
                "traces"
            } else {
                "metrics"
            };
            let tenant = req.headers().get("x-scope-orgid");
            data.tenant(signal, tenant.map(|v| v.as_bytes()));
            let mut body = req.into_body().collect().await.unwrap().to_bytes();
            if gzipped {
                use std::io::Read;
                let mut plain = Vec::new();
                flate2::read::GzDecoder::new(&body[..])
                    .read_to_end(&mut plain)
                    .expect("a gzip body");
                body = bytes::Bytes::from(plain);
                data.gzipped.lock().unwrap().push(signal);
            }
            data.http_requests
                .lock()
                .unwrap()
                .push((path.clone(), ctype.clone()));
            data.http_bodies
                .lock()
                .unwrap()
                .push((path.clone(), body.len()));
            let json = ctype == "application/json";
            let reply = match (path.as_str(), json) {
                ("/v1/traces", false) => {
                    data.add_traces(ExportTraceServiceRequest::decode(body).unwrap());
                    ExportTraceServiceResponse::default().encode_to_vec()
                }
                ("/v1/metrics", false) => {
                    data.metrics
                        .lock()
                        .unwrap()
                        .push(ExportMetricsServiceRequest::decode(body).unwrap());
                    ExportMetricsServiceResponse::default().encode_to_vec()
                }
                ("/v1/traces", true) => {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    data.spans.lock().unwrap().extend(json_spans(&v));
                    b"{}".to_vec()
                }
                ("/v1/metrics", true) => {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    data.metrics.lock().unwrap().push(json_metrics(&v));
                    b"{}".to_vec()
                }
                _ => Vec::new(),
            };
            let mut resp = hyper::Response::new(Full::new(bytes::Bytes::from(reply)));
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(if json {
                    "application/json"
                } else {
                    "application/x-protobuf"
                }),
            );
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await;
}

/// A 64-bit integer of OTLP/JSON: a decimal string (panics on anything else).
fn json_u64(v: &serde_json::Value, what: &str) -> u64 {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v}"))
        .parse()
        .unwrap_or_else(|_| panic!("{what} is not a decimal: {v}"))
}

fn json_array<'a>(v: &'a serde_json::Value, key: &str) -> &'a [serde_json::Value] {
    v.get(key)
        .and_then(|a| a.as_array())
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn json_attrs(v: &serde_json::Value) -> Vec<KeyValue> {
    json_array(v, "attributes")
        .iter()
        .map(|kv| {
            let key = kv["key"].as_str().expect("attribute key").to_string();
            let value = &kv["value"];
            let value = if let Some(s) = value.get("stringValue") {
                Value::StringValue(s.as_str().expect("stringValue").to_string())
            } else if let Some(i) = value.get("intValue") {
                // A signed 64-bit integer: a failed call's return value is negative.
                Value::IntValue(
                    i.as_str()
                        .and_then(|t| t.parse::<i64>().ok())
                        .unwrap_or_else(|| panic!("{key} is not a decimal string: {i}")),
                )
            } else if let Some(b) = value.get("boolValue") {
                Value::BoolValue(b.as_bool().expect("boolValue"))
            } else if let Some(d) = value.get("doubleValue") {
                Value::DoubleValue(d.as_f64().expect("doubleValue"))
            } else {
                panic!("attribute {key}: unexpected value {value}")
            };
            KeyValue {
                key,
                value: Some(AnyValue { value: Some(value) }),
                ..Default::default()
            }
        })
        .collect()
}

fn hex_id(v: &serde_json::Value, len: usize) -> Vec<u8> {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("id {v} is not a string"));
    assert_eq!(s.len(), 2 * len, "id {s} is not {len} bytes of hex");
    (0..len)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex id"))
        .collect()
}

/// The spans of an OTLP/JSON `ExportTraceServiceRequest`.
fn json_spans(v: &serde_json::Value) -> Vec<Span> {
    let mut out = Vec::new();
    for rs in json_array(v, "resourceSpans") {
        let resource = attr_map(&json_attrs(&rs["resource"]));
        for ss in json_array(rs, "scopeSpans") {
            for s in json_array(ss, "spans") {
                hex_id(&s["spanId"], 8);
                out.push(Span {
                    name: s["name"].as_str().expect("span name").to_string(),
                    trace_id: hex_id(&s["traceId"], 16),
                    start_ns: json_u64(&s["startTimeUnixNano"], "startTimeUnixNano"),
                    end_ns: json_u64(&s["endTimeUnixNano"], "endTimeUnixNano"),
                    arrived_ns: now_unix_ns(),
                    status_code: s
                        .get("status")
                        .and_then(|st| st.get("code"))
                        .and_then(|c| c.as_i64())
                        .unwrap_or(0) as i32,
                    attrs: attr_map(&json_attrs(s)),
                    resource: resource.clone(),
                });
            }
        }
    }
    out
}

/// The sums and histograms of an OTLP/JSON `ExportMetricsServiceRequest`, as protobuf types.
fn json_metrics(v: &serde_json::Value) -> ExportMetricsServiceRequest {
    use opentelemetry_proto::tonic::metrics::v1::{
        Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    };
    let mut metrics = Vec::new();
    for rm in json_array(v, "resourceMetrics") {
        for sm in json_array(rm, "scopeMetrics") {
            for m in json_array(sm, "metrics") {
                let name = m["name"].as_str().expect("metric name").to_string();
                let data = if let Some(sum) = m.get("sum") {
                    Data::Sum(Sum {
                        data_points: json_array(sum, "dataPoints")
                            .iter()
                            .map(|p| NumberDataPoint {
                                attributes: json_attrs(p),
                                time_unix_nano: json_u64(&p["timeUnixNano"], "timeUnixNano"),
                                value: p["asDouble"]
                                    .as_f64()
                                    .map(number_data_point::Value::AsDouble),
                                ..Default::default()
                            })
                            .collect(),
                        aggregation_temporality: sum["aggregationTemporality"]
                            .as_i64()
                            .expect("aggregationTemporality is an integer")
                            as i32,
                        is_monotonic: sum["isMonotonic"].as_bool().unwrap_or(false),
                    })
                } else if let Some(h) = m.get("histogram") {
                    Data::Histogram(Histogram {
                        data_points: json_array(h, "dataPoints")
                            .iter()
                            .map(|p| HistogramDataPoint {
                                attributes: json_attrs(p),
                                count: json_u64(&p["count"], "count"),
                                bucket_counts: json_array(p, "bucketCounts")
                                    .iter()
                                    .map(|c| json_u64(c, "bucketCounts"))
                                    .collect(),
                                explicit_bounds: json_array(p, "explicitBounds")
                                    .iter()
                                    .map(|b| b.as_f64().expect("bound"))
                                    .collect(),
                                ..Default::default()
                            })
                            .collect(),
                        aggregation_temporality: h["aggregationTemporality"]
                            .as_i64()
                            .expect("aggregationTemporality is an integer")
                            as i32,
                    })
                } else {
                    continue;
                };
                metrics.push(Metric {
                    name,
                    data: Some(data),
                    ..Default::default()
                });
            }
        }
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
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
/// The series budget is out of reach: every exporter sees every process of the node, and the
/// tests running meanwhile must not fold this test's series into "other".
const SLOW_READS: &str = "[collection]\nmin_interval = \"0s\"\n[limits]\nmax_series = 10000000\n[slow_calls]\nthreshold = \"1h\"\n[slow_calls.thresholds]\nread = \"20ms\"\n";

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
    /// Wall-clock time just before the spawn (Unix ns).
    spawned_ns: u64,
}

/// Runs the workload with `args` (joining `cg` first when given) and waits for it.
fn run(cg: Option<&TestCgroup>, args: &[&str]) -> Ran {
    let mut cmd = Command::new(workload_bin());
    if let Some(cg) = cg {
        cmd.arg("join-cgroup").arg(&cg.dir);
    }
    cmd.args(args).stdout(Stdio::piped());
    let spawned_ns = now_unix_ns();
    let mut child = cmd.spawn().expect("spawn workload");
    let pid = child.id();
    let stdout: Vec<String> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "workload {args:?} failed: {status}");
    Ran {
        pid,
        stdout,
        spawned_ns,
    }
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

fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// The delay of the `slow-pipe-read-timed` children's writer (their third argument, in ms).
const PIPE_WRITER_DELAY_NS: u64 = 30_000_000;

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
    // The call lies inside the window the workload measured around it (the same monotonic
    // clock; 50 us for the clock reads themselves) and lasts at least the writer's delay. An
    // upper bound tighter than the window would fail on a loaded machine, where the workload
    // may be scheduled out after the call returns, not in it.
    let d = span.duration_ns();
    assert!(
        d <= measured_ns + 50_000,
        "span lasted {d} ns, longer than the {measured_ns} ns the workload measured around it"
    );
    assert!(
        d >= PIPE_WRITER_DELAY_NS * 9 / 10,
        "span lasted {d} ns, shorter than the writer's delay of {PIPE_WRITER_DELAY_NS} ns \
         (the workload measured {measured_ns} ns)"
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
    // looked up in /proc: a descriptor's path (and the executable's name) can only be read
    // while the process lives. 1 s: the span reader can lag by hundreds of milliseconds on a
    // loaded 2-CPU runner, and then the span names the process by its 15-character comm.
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
            "1000",
        ],
    );
    let truth = measured_reads(&ran);
    assert_eq!(truth.len(), 10, "{:?}", ran.stdout);

    let got = eventually(Duration::from_secs(20), || {
        (receiver.data.spans_of(&ran).len() >= 10).then_some(())
    });
    assert!(got.is_some(), "spans: {:?}", receiver.data.spans_of(&ran));
    // Export is first in, first out: once a later child's span is in, every span of the
    // first child is too. Then the count must be exact.
    let marker = slow_reads(1);
    assert!(eventually(Duration::from_secs(20), || {
        (!receiver.data.spans_of(&marker).is_empty()).then_some(())
    })
    .is_some());
    let spans = receiver.data.spans_of(&ran);
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

    // OTLP metrics carry the same catalogue: the exact call counts of the child, under the
    // spans' attribute names (process.linux.cgroup as the spans write it).
    let cgroup_attr = format!("0::{}", cg.rel);
    let series = [
        ("process.linux.cgroup", cgroup_attr.as_str()),
        ("syscall", "getppid"),
    ];
    let pushed = eventually(Duration::from_secs(20), || {
        (receiver.data.counter("sysscope_syscalls", &series) == Some(N_FAST as f64)).then_some(())
    });
    assert!(
        pushed.is_some(),
        "sysscope_syscalls for getppid: {:?}",
        receiver.data.counter("sysscope_syscalls", &series)
    );
    let pushed_reads = [
        ("process.linux.cgroup", cgroup_attr.as_str()),
        ("syscall", "read"),
    ];
    let reads = [("cgroup", cg.rel.as_str()), ("syscall", "read")];
    let (bounds, counts, count) = receiver
        .data
        .histogram("sysscope_syscall_duration_seconds", &pushed_reads)
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
    assert!(otlp_successes(&samples, "traces") >= 1.0);
    assert!(otlp_successes(&samples, "metrics") >= 1.0);
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
            "1000",
        ],
    );
    let truth = measured_reads(&ran);
    let marker = slow_reads(1);
    assert!(eventually(Duration::from_secs(20), || {
        (!receiver.data.spans_of(&marker).is_empty()).then_some(())
    })
    .is_some());
    let spans = receiver.data.spans_of(&ran);
    assert_eq!(spans.len(), 3, "{spans:?}");
    for (span, measured) in spans.iter().zip(&truth) {
        check_pipe_read_span(span, ran.pid, &cg, *measured);
    }
    assert_eq!(spans[0].resource_str("service.name"), Some("sysscope"));
    let cgroup_attr = format!("0::{}", cg.rel);
    let series = [
        ("process.linux.cgroup", cgroup_attr.as_str()),
        ("syscall", "getppid"),
    ];
    assert!(
        eventually(Duration::from_secs(20), || {
            (receiver.data.counter("sysscope_syscalls", &series) == Some(500.0)).then_some(())
        })
        .is_some(),
        "{:?}",
        receiver.data.counter("sysscope_syscalls", &series)
    );
    assert_posts_of_both_signals(&receiver, "application/x-protobuf");
}

/// With `base2_exponential_bucket_histogram` and delta temporality, the pushed latency
/// histogram of a child's known sleeps (100 of 2 ms, 50 of 40 ms) is the kernel's buckets: the
/// deltas of every push add up to the exposition's classic buckets, bucket for bucket, at scale
/// -1 (the default `log4`), OTLP bucket j covering (4^j, 4^(j+1)] s, the kernel's first bucket
/// the zero bucket.
#[test]
fn exponential_delta_histograms_add_up_to_the_kernel_buckets() {
    if !require_root("exponential_delta_histograms_add_up_to_the_kernel_buckets") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::grpc(0);
    let url = receiver.url();
    let exporter = Exporter::start_with_env(
        TEST_CONFIG,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                "base2_exponential_bucket_histogram",
            ),
            ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
        ],
    );
    let cg = TestCgroup::new("sysscope-test-otlp-exponential");
    run(Some(&cg), &["sleep", "100", "2", "sleep", "50", "40"]);
    let cgroup_attr = format!("0::{}", cg.rel);
    let want = [
        ("process.linux.cgroup", cgroup_attr.as_str()),
        ("syscall", "nanosleep"),
    ];
    let name = "sysscope_syscall_duration_seconds";
    let total = |points: &[(i32, _)]| {
        points
            .iter()
            .map(
                |(_, p): &(
                    i32,
                    opentelemetry_proto::tonic::metrics::v1::ExponentialHistogramDataPoint,
                )| p.count,
            )
            .sum::<u64>()
    };
    let arrived = eventually(Duration::from_secs(30), || {
        (total(&receiver.data.exponential_points(name, &want)) == 150).then_some(())
    });
    let points = receiver.data.exponential_points(name, &want);
    assert!(
        arrived.is_some(),
        "{} calls pushed: {points:?}",
        total(&points)
    );
    // Summed deltas, by OTLP bucket index.
    let mut summed: std::collections::BTreeMap<i32, u64> = Default::default();
    let mut zero = 0;
    for (temporality, p) in &points {
        assert_eq!(*temporality, AggregationTemporality::Delta as i32);
        assert_eq!(p.scale, -1);
        assert_eq!(p.zero_threshold, 2f64.powi(-20));
        zero += p.zero_count;
        if let Some(b) = &p.positive {
            for (i, n) in b.bucket_counts.iter().enumerate() {
                *summed.entry(b.offset + i as i32).or_default() += n;
            }
        }
    }
    // The classic buckets of the same series, as differences.
    let samples = parse_samples(&exporter.scrape());
    let labels = [("cgroup", cg.rel.as_str()), ("syscall", "nanosleep")];
    let mut classic: Vec<(f64, f64)> = select(
        &samples,
        "sysscope_syscall_duration_seconds_bucket",
        &labels,
    )
    .iter()
    .map(|s| (s.labels["le"].parse::<f64>().unwrap(), s.value))
    .collect();
    classic.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(classic.last().map(|b| b.1), Some(150.0));
    let mut previous = 0.0;
    for (n, (le, cumulative)) in classic.iter().enumerate() {
        let count = (cumulative - previous) as u64;
        previous = *cumulative;
        let pushed = if n == 0 {
            // The first classic bucket is the zero bucket (le = 2^-20 s).
            zero
        } else if le.is_finite() {
            // (4^j, 4^(j+1)] ends at le = 4^(j+1) = 2^(2j+2).
            let j = (le.log2() as i32 - 2) / 2;
            assert_eq!(4f64.powi(j + 1), *le);
            summed.remove(&j).unwrap_or(0)
        } else {
            // Above 16 s: the bucket just above it, (16, 64].
            summed.remove(&2).unwrap_or(0)
        };
        assert_eq!(pushed, count, "bucket le={le}");
    }
    assert!(
        summed.values().all(|n| *n == 0),
        "pushed buckets the exposition lacks: {summed:?}"
    );
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
    let down = slow_reads(SLOW);
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
        let up = slow_reads(3);
        if eventually(Duration::from_secs(10), || {
            (receiver.data.spans_of(&up).len() == 3).then_some(())
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
    assert!(receiver.data.spans_of(&down).len() as u64 <= QUEUE);
    let samples = parse_samples(&exporter.scrape());
    assert!(otlp_successes(&samples, "traces") >= 1.0);
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

// ---------------------------------------------------------------------------------------------
// TLS, OTLP/JSON and the config file's [otlp] section.

/// Metric push interval of the tests below. A push may take at most one interval, and every
/// process on the machine is in the exposition (up to the series budget): 500 ms is too short
/// for a debug build on a busy machine.
const METRIC_INTERVAL_MS: &str = "1000";

/// A CA, a server certificate for 127.0.0.1/localhost and a client certificate it signed, as
/// PEM text and as files.
struct TestPki {
    dir: tempfile::TempDir,
    ca: String,
    server_cert: String,
    server_key: String,
}

impl TestPki {
    fn new() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "sysscope test collector CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |names: &[&str], usage| {
            let key = KeyPair::generate().unwrap();
            let mut params =
                CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                    .unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, names[0].to_string());
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(&["sysscope"], ExtendedKeyUsagePurpose::ClientAuth);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("client.pem"), client_cert).unwrap();
        std::fs::write(dir.path().join("client.key"), client_key).unwrap();
        Self {
            dir,
            ca: ca.pem(),
            server_cert,
            server_key,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The HTTP receiver's TLS: requiring a client certificate from this CA when asked.
    fn server_config(&self, require_client_cert: bool) -> Arc<rustls::ServerConfig> {
        use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.server_cert.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let key = PrivateKeyDer::from_pem_slice(self.server_key.as_bytes()).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(self.ca.as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(builder.with_single_cert(certs, key).unwrap())
    }
}

/// A child in a fresh cgroup makes `slow` slow reads and `fast` getppid calls: exactly its
/// slow reads must arrive at `receiver` as spans (checked against what the child measured),
/// and its exact getppid count in the pushed metrics. Returns the spans.
fn exact_spans_and_metrics(
    exporter: &Exporter,
    receiver: &Receiver,
    cgroup: &str,
    slow: usize,
    fast: u64,
) -> Vec<Span> {
    let cg = TestCgroup::new(cgroup);
    let ran = run(
        Some(&cg),
        &[
            "slow-pipe-read-timed",
            &slow.to_string(),
            "30",
            "getppid",
            &fast.to_string(),
            "sleep",
            "1",
            "1000",
        ],
    );
    let truth = measured_reads(&ran);
    assert_eq!(truth.len(), slow, "{:?}", ran.stdout);
    // Export is first in, first out: once a later child's span is in, the first child's are.
    let marker = slow_reads(1);
    assert!(
        eventually(Duration::from_secs(20), || {
            (!receiver.data.spans_of(&marker).is_empty()).then_some(())
        })
        .is_some(),
        "no span arrived; receiver has {} spans",
        receiver.data.spans.lock().unwrap().len()
    );
    let spans = receiver.data.spans_of(&ran);
    assert_eq!(spans.len(), slow, "exactly the slow calls: {spans:?}");
    for (span, measured) in spans.iter().zip(&truth) {
        check_pipe_read_span(span, ran.pid, &cg, *measured);
    }
    // The OTLP push carries the child's exact count.
    let series = [("cgroup", cg.rel.as_str()), ("syscall", "getppid")];
    let cgroup_attr = format!("0::{}", cg.rel);
    let pushed = [
        ("process.linux.cgroup", cgroup_attr.as_str()),
        ("syscall", "getppid"),
    ];
    // Generous: on a loaded machine a push can come several intervals late.
    let outcome = eventually(Duration::from_secs(60), || {
        (receiver.data.counter("sysscope_syscalls", &pushed) == Some(fast as f64)).then_some(())
    });
    // Computed first: the failure message must not hold the receiver's lock while it runs.
    let requests = receiver.data.metrics.lock().unwrap().len();
    let pushed_series = receiver.data.getppid_series();
    let Some(()) = outcome else {
        let scraped = sum(
            &parse_samples(&exporter.scrape()),
            "sysscope_syscalls_total",
            &series,
        );
        panic!(
            "sysscope_syscalls for getppid in {}: {:?} after {requests} metric requests \
             ({fast} made, {scraped} scraped; a series folded by the series budget shows \
             in neither); getppid series in the last: {pushed_series:?}",
            cg.rel,
            receiver.data.counter("sysscope_syscalls", &pushed),
        );
    };
    let reads = [
        ("process.linux.cgroup", cgroup_attr.as_str()),
        ("syscall", "read"),
    ];
    let (bounds, counts, count) = receiver
        .data
        .histogram("sysscope_syscall_duration_seconds", &reads)
        .expect("read latency histogram pushed");
    assert!(count >= slow as u64, "{count} reads counted");
    assert_eq!(counts.iter().sum::<u64>(), count);
    assert_eq!(counts.len(), bounds.len() + 1);
    eprintln!(
        "{cgroup}: {} of {slow} slow reads arrived as spans; getppid count {fast} pushed; \
         {requests} metric requests received",
        spans.len()
    );
    spans
}

#[test]
fn grpc_over_tls_with_a_client_certificate_exports_spans_and_metrics() {
    if !require_root("grpc_over_tls_with_a_client_certificate_exports_spans_and_metrics") {
        return;
    }
    let _serial = serial();
    let pki = TestPki::new();
    // The receiver requires a client certificate from the test CA.
    let receiver = Receiver::grpc_tls((&pki.server_cert, &pki.server_key), Some(&pki.ca));
    let url = receiver.https_url();
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let exporter = Exporter::start_with_env(
        SLOW_READS,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", cert.as_str()),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", key.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", METRIC_INTERVAL_MS),
        ],
    );
    exact_spans_and_metrics(&exporter, &receiver, "sysscope-test-spans-grpc-tls", 3, 700);
    let samples = parse_samples(&exporter.scrape());
    for signal in ["traces", "metrics"] {
        assert!(
            sum(
                &samples,
                "sysscope_otlp_requests_total",
                &[("signal", signal), ("result", "success")]
            ) >= 1.0
        );
    }
}

#[test]
fn config_file_alone_exports_over_https_with_a_client_certificate() {
    if !require_root("config_file_alone_exports_over_https_with_a_client_certificate") {
        return;
    }
    let _serial = serial();
    let pki = TestPki::new();
    let receiver = Receiver::http_with(Some(pki.server_config(true)));
    let config = format!(
        "{SLOW_READS}[otlp]\nendpoint = \"{}\"\nprotocol = \"http/protobuf\"\n\
         certificate = \"{}\"\nclient_certificate = \"{}\"\nclient_key = \"{}\"\n\
         span_batch_delay = \"100ms\"\nmetrics_interval = \"{METRIC_INTERVAL_MS}ms\"\n\
         service_name = \"sysscope-from-file\"\n\
         [otlp.resource_attributes]\n\"deployment.environment\" = \"test\"\n",
        receiver.https_url(),
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key"),
    );
    let exporter = Exporter::start(&config, &[]);
    // Nothing reaches the exporter through OTEL_* variables: the file alone configures it.
    let environ = std::fs::read(format!("/proc/{}/environ", exporter.child.id())).unwrap();
    let otel: Vec<String> = environ
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).to_string())
        .filter(|v| v.starts_with("OTEL_"))
        .collect();
    assert!(otel.is_empty(), "the exporter's environment has {otel:?}");

    let spans =
        exact_spans_and_metrics(&exporter, &receiver, "sysscope-test-spans-file-tls", 3, 600);
    assert_eq!(
        spans[0].resource_str("service.name"),
        Some("sysscope-from-file")
    );
    assert_eq!(
        spans[0].resource_str("deployment.environment"),
        Some("test")
    );
    eprintln!(
        "OTLP/protobuf bodies over TLS: {}",
        receiver.data.body_sizes()
    );
    assert_posts_of_both_signals(&receiver, "application/x-protobuf");
    assert_eq!(
        receiver
            .data
            .tls_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn collector_requiring_a_client_certificate_refuses_an_exporter_without_one() {
    if !require_root("collector_requiring_a_client_certificate_refuses_an_exporter_without_one") {
        return;
    }
    let _serial = serial();
    const QUEUE: u64 = 2;
    const SLOW: u64 = 6;
    let pki = TestPki::new();
    let receiver = Receiver::http_with(Some(pki.server_config(true)));
    let url = receiver.https_url();
    let ca = pki.path("ca.pem");
    let exporter = Exporter::start_with_env(
        &slow_reads_with(&format!("export_queue = {QUEUE}")),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", METRIC_INTERVAL_MS),
        ],
    );
    let dropped_of = |samples: &[Sample]| {
        sum(
            samples,
            "sysscope_spans_dropped_total",
            &[("reason", "export_queue_full")],
        ) + sum(
            samples,
            "sysscope_spans_dropped_total",
            &[("reason", "export_failed")],
        )
    };
    slow_reads(SLOW);
    let counted = eventually(Duration::from_secs(20), || {
        let samples = parse_samples(&exporter.scrape());
        let failures = |signal| {
            sum(
                &samples,
                "sysscope_otlp_requests_total",
                &[("signal", signal), ("result", "failure")],
            )
        };
        (dropped_of(&samples) >= (SLOW - QUEUE) as f64
            && failures("traces") >= 1.0
            && failures("metrics") >= 1.0)
            .then_some(())
    });
    assert!(
        counted.is_some(),
        "refused exports were not counted:\n{}",
        exporter.scrape()
    );
    assert!(exporter_alive(&exporter), "sysscope exited");
    let refused = receiver
        .data
        .tls_failures
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(refused >= 2, "{refused} handshakes refused");
    assert!(receiver.data.spans.lock().unwrap().is_empty());
    assert!(receiver.data.metrics.lock().unwrap().is_empty());
    let samples = parse_samples(&exporter.scrape());
    eprintln!(
        "no client certificate: {refused} handshakes refused by the receiver, {} spans dropped, \
         {} trace and {} metric requests failed",
        dropped_of(&samples),
        sum(
            &samples,
            "sysscope_otlp_requests_total",
            &[("signal", "traces"), ("result", "failure")]
        ),
        sum(
            &samples,
            "sysscope_otlp_requests_total",
            &[("signal", "metrics"), ("result", "failure")]
        )
    );
}

#[test]
fn http_json_exports_exact_spans_and_metrics() {
    if !require_root("http_json_exports_exact_spans_and_metrics") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::http();
    let url = receiver.url();
    let exporter = Exporter::start_with_env(
        SLOW_READS,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", METRIC_INTERVAL_MS),
        ],
    );
    let spans = exact_spans_and_metrics(&exporter, &receiver, "sysscope-test-spans-json", 4, 800);
    assert_eq!(spans[0].resource_str("service.name"), Some("sysscope"));
    eprintln!("OTLP/JSON bodies: {}", receiver.data.body_sizes());
    assert_posts_of_both_signals(&receiver, "application/json");
    let requests = receiver.data.http_requests.lock().unwrap().clone();
    assert!(
        requests.iter().all(|(_, ct)| ct == "application/json"),
        "{requests:?}"
    );
}

/// Every slow call with a descriptor carries its path, the first of a fresh process too (its
/// record must not wait for another one's wake-up), and arrives promptly.
#[test]
fn every_slow_read_of_a_fresh_process_has_its_path() {
    if !require_root("every_slow_read_of_a_fresh_process_has_its_path") {
        return;
    }
    let _serial = serial();
    let exporter = Exporter::start(SLOW_READS, &[]);
    for round in 0..3 {
        // Three slow pipe reads, then the process stays a second with the pipe open (its
        // /proc and the descriptor are readable).
        let ran = run(
            None,
            &["slow-pipe-read-timed", "3", "40", "sleep", "1", "1000"],
        );
        let spans = eventually(Duration::from_secs(5), || {
            let (_, _, body) = http_get(exporter.port, "/api/v1/slow-calls", None).ok()?;
            let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
            let reads: Vec<serde_json::Value> = doc["slow_calls"]
                .as_array()?
                .iter()
                .filter(|c| c["attributes"]["process.pid"] == ran.pid && c["name"] == "read")
                .cloned()
                .collect();
            (reads.len() == 3).then_some(reads)
        })
        .unwrap_or_else(|| {
            panic!(
                "round {round}: three slow reads of {} never showed up",
                ran.pid
            )
        });
        let mut spans = spans;
        spans.sort_by_key(|s| s["start_time_unix_nano"].as_u64().unwrap_or(0));
        // The descriptor stays open a second after the last read: a record read within that
        // second (the reader wakes for the first record of a fresh process, it does not wait
        // for another's) finds the path. (A loaded machine can delay the reader by hundreds of
        // milliseconds, so a tighter window would test the machine, not sysscope.)
        for (i, span) in spans.iter().enumerate() {
            // What the descriptor was, classified in the kernel at entry: always known.
            assert_eq!(
                span["attributes"]["sysscope.fd.kind"], "pipe",
                "round {round}: slow read {i}: {span}"
            );
            assert!(span["attributes"]["sysscope.fd.fs"].is_null(), "{span}");
            let path = span["attributes"]["file.path"].as_str().unwrap_or("");
            assert!(
                path.starts_with("pipe:["),
                "round {round}: slow read {i} without its path: {span}"
            );
        }
    }
}

/// `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` (and its per-signal variants): both signals arrive
/// compressed over gRPC and OTLP/HTTP, and the receiver decodes the exact spans and counts.
/// A configured header (a tenant, as Mimir and Tempo take it) comes with every request of both
/// signals, as HTTP headers or gRPC metadata.
#[test]
fn gzip_compression_and_headers_over_grpc_and_http() {
    if !require_root("gzip_compression_and_headers_over_grpc_and_http") {
        return;
    }
    let _serial = serial();
    for (protocol, env) in [
        ("grpc", vec![("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")]),
        (
            "http/protobuf",
            vec![
                ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip"),
                ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "gzip"),
            ],
        ),
    ] {
        let receiver = if protocol == "grpc" {
            Receiver::grpc(0)
        } else {
            Receiver::http()
        };
        let url = receiver.url();
        let mut vars = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
        ];
        vars.extend(env);
        // From the file, which opentelemetry-otlp never reads (it reads the variable itself).
        let config = format!("{SLOW_READS}[otlp.headers]\nX-Scope-OrgID = \"tenant-a\"\n");
        let exporter = Exporter::start_with_env(&config, &[], &vars);
        exact_spans_and_metrics(&exporter, &receiver, "sysscope-test-spans-gzip", 3, 400);
        let gzipped = receiver.data.gzipped.lock().unwrap().clone();
        for signal in ["traces", "metrics"] {
            assert!(
                gzipped.contains(&signal),
                "{protocol}: no gzip {signal} request: {gzipped:?}"
            );
        }
        let tenants = receiver.data.tenants.lock().unwrap().clone();
        for signal in ["traces", "metrics"] {
            let of_signal = tenants.iter().filter(|(s, _)| *s == signal);
            assert!(
                of_signal.clone().count() > 0 && of_signal.clone().all(|(_, t)| t == "tenant-a"),
                "{protocol}: {signal} requests without the configured header: {tenants:?}"
            );
        }
    }
}

/// Each span of a fresh process reaches the OTLP collector within the batch delay plus one
/// read of the ring buffer (a generous deadline: an availability bound, not a measurement).
#[test]
fn spans_reach_the_collector_within_the_batch_delay() {
    if !require_root("spans_reach_the_collector_within_the_batch_delay") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::grpc(0);
    let url = receiver.url();
    const DELAY_MS: u64 = 500;
    let delay = DELAY_MS.to_string();
    let _exporter = Exporter::start_with_env(
        SLOW_READS,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", delay.as_str()),
        ],
    );
    for round in 0..3 {
        // The child stays alive and holds its pipe (the timed reads leave it open) long after
        // its reads: every path can be read, and arrival times are the exporter's alone.
        let spawned_ns = now_unix_ns();
        let mut child = Command::new(workload_bin())
            .args(["slow-pipe-read-timed", "3", "40", "sleep", "1", "6000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn workload");
        let pid = child.id();
        let ran = Ran {
            pid,
            stdout: Vec::new(),
            spawned_ns,
        };
        let got = eventually(Duration::from_secs(15), || {
            (receiver.data.spans_of(&ran).len() >= 3).then_some(())
        });
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            got.is_some(),
            "spans of {pid}: {:?}",
            receiver.data.spans_of(&ran)
        );
        let spans = receiver.data.spans_of(&ran);
        assert_eq!(spans.len(), 3, "{spans:?}");
        for (i, span) in spans.iter().enumerate() {
            let path = span.str("file.path").unwrap_or("");
            assert!(
                path.starts_with("pipe:[") && path.ends_with(']'),
                "round {round}, read {i}: file.path {path:?} in {span:?}"
            );
            // Call end to arrival: the batch delay, a read of the ring buffer, the export
            // round trip; 3 s more than the delay leaves room for a loaded machine.
            let late_ms = span.arrived_ns.saturating_sub(span.end_ns) / 1_000_000;
            eprintln!("round {round} read {i}: arrived {late_ms} ms after the call ended");
            assert!(
                late_ms <= DELAY_MS + 3_000,
                "span of read {i} arrived {late_ms} ms after the call (batch delay {DELAY_MS} ms)"
            );
        }
    }
}

/// Both signals reached the HTTP receiver with bodies of `content_type`.
fn assert_posts_of_both_signals(receiver: &Receiver, content_type: &str) {
    let requests = receiver.data.http_requests.lock().unwrap().clone();
    for path in ["/v1/traces", "/v1/metrics"] {
        assert!(
            requests
                .iter()
                .any(|(p, ct)| p == path && ct == content_type),
            "{requests:?}"
        );
    }
}

/// The exporter's count of successful OTLP requests of `signal` (`traces` or `metrics`).
fn otlp_successes(samples: &[Sample], signal: &str) -> f64 {
    sum(
        samples,
        "sysscope_otlp_requests_total",
        &[("signal", signal), ("result", "success")],
    )
}

/// A fresh child making `n` reads of a pipe that is filled 25 ms after each read blocks, then
/// sleeping 200 ms so its last spans are read while it still lives.
fn slow_reads(n: u64) -> Ran {
    run(
        None,
        &["slow-pipe-read", &n.to_string(), "25", "sleep", "1", "200"],
    )
}

/// An exporter whose spans go to a fresh gRPC receiver within 100 ms of their calls.
fn exporter_to(receiver: &Receiver) -> Exporter {
    let url = receiver.url();
    Exporter::start_with_env(
        SLOW_READS,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
}

/// Waits until `count` spans of `ran` have arrived, then requires exactly that many.
fn exactly_spans_of(receiver: &Receiver, ran: &Ran, count: usize) -> Vec<Span> {
    let got = eventually(Duration::from_secs(20), || {
        (receiver.data.spans_of(ran).len() >= count).then_some(())
    });
    assert!(got.is_some(), "spans: {:?}", receiver.data.spans_of(ran));
    let spans = receiver.data.spans_of(ran);
    assert_eq!(spans.len(), count, "{spans:?}");
    spans
}

/// `key=value` from the workload's output.
fn printed<'a>(ran: &'a Ran, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    ran.stdout
        .iter()
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {key}= in {:?}", ran.stdout))
}

// ---------------------------------------------------------------------------------------------
// The file a slow call waited on, named from what the kernel read at the call's exit.

/// Device (`MAJ:MIN`) and inode of `path`, as stat(2) sees them.
fn stat_identity(path: &std::path::Path) -> (String, i64) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    let dev = meta.dev();
    (
        format!("{}:{}", libc::major(dev), libc::minor(dev)),
        meta.ino() as i64,
    )
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        r,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// A tmpfs mounted for the test, unmounted (lazily: a reader may still hold it) on drop.
struct TmpfsMount(std::path::PathBuf);

impl TmpfsMount {
    fn at(dir: std::path::PathBuf) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let target = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated strings; no data argument.
        let r = unsafe {
            libc::mount(
                c"sysscope-test".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        assert_eq!(
            r,
            0,
            "mount tmpfs on {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
        Self(dir)
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.0.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path this test mounted.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// The case of a short-lived process: 10 slow reads of a pipe, each filled by its child 40 ms
/// later, and the exit right after the last. Every span names the pipe by the inode the
/// process saw (fstat), the last one too, although /proc no longer has the process when its
/// record is read.
#[test]
fn every_slow_read_of_a_process_that_exits_at_once_names_its_pipe() {
    if !require_root("every_slow_read_of_a_process_that_exits_at_once_names_its_pipe") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::grpc(0);
    let _exporter = exporter_to(&receiver);
    let cg = TestCgroup::new("sysscope-test-spans-exit");
    let ran = run(Some(&cg), &["pipe-reads-then-exit", "10", "40"]);
    let ino: i64 = printed(&ran, "pipe_ino").parse().unwrap();
    let dev = printed(&ran, "pipe_dev");
    let spans = exactly_spans_of(&receiver, &ran, 10);
    let want = format!("pipe:[{ino}]");
    for (i, span) in spans.iter().enumerate() {
        assert_eq!(span.name, "read");
        assert_eq!(
            span.str("process.linux.cgroup"),
            Some(format!("0::{}", cg.rel).as_str())
        );
        assert_eq!(
            span.str("file.path"),
            Some(want.as_str()),
            "read {i}: {span:?}"
        );
        assert_eq!(
            span.int("sysscope.file.inode"),
            Some(ino),
            "read {i}: {span:?}"
        );
        assert_eq!(
            span.str("sysscope.file.device"),
            Some(dev),
            "read {i}: {span:?}"
        );
        assert!(
            !span.attrs.contains_key("sysscope.file.path_unavailable"),
            "read {i}: {span:?}"
        );
        assert_eq!(span.str("sysscope.fd.kind"), Some("pipe"));
        assert!(
            span.duration_ns() >= 36_000_000,
            "read {i} lasted {} ns, less than its writer's 40 ms delay",
            span.duration_ns()
        );
    }
}

/// A process opens a FIFO in a nested directory of a tmpfs mounted for the test, makes one
/// slow read of it (the test writes 50 ms after it blocked) and exits at once: the span names
/// the FIFO by its full path, walked in the kernel across the mount.
#[test]
fn a_slow_read_names_its_fifo_by_its_full_path_across_a_mount() {
    if !require_root("a_slow_read_names_its_fifo_by_its_full_path_across_a_mount") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::grpc(0);
    let _exporter = exporter_to(&receiver);
    let dir = tempfile::tempdir().unwrap();
    let mount = TmpfsMount::at(dir.path().canonicalize().unwrap().join("mnt"));
    let nested = mount.0.join("datasets").join("shard-0007");
    std::fs::create_dir_all(&nested).unwrap();
    let fifo = nested.join("input.fifo");
    mkfifo(&fifo);
    let (dev, ino) = stat_identity(&fifo);

    let spawned_ns = now_unix_ns();
    let mut child = Command::new(workload_bin())
        .arg("fifo-read")
        .arg(&fifo)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn workload");
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let fd = first.strip_prefix("fifo_fd=").expect("fifo_fd= line");
    // Blocked in read(fd, ...) now: /proc/<pid>/syscall shows the call and its descriptor.
    let blocked = format!("{} {:#x} ", libc::SYS_read, fd.parse::<u32>().unwrap());
    eventually(Duration::from_secs(10), || {
        let now = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
        now.starts_with(&blocked).then_some(())
    })
    .expect("the workload never blocked in its read");
    std::thread::sleep(Duration::from_millis(50));
    {
        use std::{io::Write, os::unix::fs::OpenOptionsExt};
        let mut writer = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        writer.write_all(b"x").unwrap();
    }
    assert!(child.wait().unwrap().success());
    let ran = Ran {
        pid,
        stdout: vec![first],
        spawned_ns,
    };
    let spans = exactly_spans_of(&receiver, &ran, 1);
    let span = &spans[0];
    assert_eq!(span.name, "read");
    assert_eq!(span.str("file.path"), fifo.to_str(), "{span:?}");
    assert_eq!(span.int("sysscope.file.inode"), Some(ino), "{span:?}");
    assert_eq!(
        span.str("sysscope.file.device"),
        Some(dev.as_str()),
        "{span:?}"
    );
    assert_eq!(span.str("sysscope.fd.kind"), Some("pipe"), "{span:?}");
    assert!(span.duration_ns() >= 45_000_000, "{span:?}");
}

/// One descriptor number names a pipe, then a FIFO moved onto it (dup2), each read slowly, and
/// the process exits right after: each span names its own file.
#[test]
fn a_reused_descriptor_number_names_each_file_in_its_own_span() {
    if !require_root("a_reused_descriptor_number_names_each_file_in_its_own_span") {
        return;
    }
    let _serial = serial();
    let receiver = Receiver::grpc(0);
    let _exporter = exporter_to(&receiver);
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().canonicalize().unwrap().join("second.fifo");
    mkfifo(&fifo);
    let ran = run(None, &["reused-fd-reads", fifo.to_str().unwrap(), "40"]);
    let fd: i64 = printed(&ran, "fd").parse().unwrap();
    let first: i64 = printed(&ran, "first_ino").parse().unwrap();
    let second: i64 = printed(&ran, "second_ino").parse().unwrap();
    assert_eq!(stat_identity(&fifo).1, second);
    let spans = exactly_spans_of(&receiver, &ran, 2);
    for span in &spans {
        assert_eq!(span.int("sysscope.syscall.fd"), Some(fd), "{span:?}");
    }
    let pipe = format!("pipe:[{first}]");
    assert_eq!(
        spans[0].str("file.path"),
        Some(pipe.as_str()),
        "{:?}",
        spans[0]
    );
    assert_eq!(spans[0].int("sysscope.file.inode"), Some(first));
    assert_eq!(spans[1].str("file.path"), fifo.to_str(), "{:?}", spans[1]);
    assert_eq!(spans[1].int("sysscope.file.inode"), Some(second));
}

/// The slow calls of process `pid` the local endpoint of `exporter` lists, once `count` have
/// arrived (exactly that many).
fn local_slow_calls(exporter: &Exporter, pid: u32, count: usize) -> Vec<serde_json::Value> {
    let calls = eventually(Duration::from_secs(10), || {
        let (_, _, body) = http_get(exporter.port, "/api/v1/slow-calls", None).ok()?;
        let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
        let calls: Vec<serde_json::Value> = doc["slow_calls"]
            .as_array()?
            .iter()
            .filter(|c| c["attributes"]["process.pid"] == pid)
            .cloned()
            .collect();
        (calls.len() >= count).then_some(calls)
    })
    .unwrap_or_else(|| panic!("{count} slow calls of {pid} never showed up"));
    assert_eq!(calls.len(), count, "{calls:#?}");
    calls
}

/// The name sysscope gives a path longer than a record holds when `/proc` cannot complete it:
/// the whole components nearest the file that fit in `NAME_BYTES`, after `...`.
fn kernel_tail(path: &std::path::Path) -> String {
    let mut tail = String::new();
    for component in path.components().rev() {
        let name = component.as_os_str().to_str().unwrap();
        if name == "/" || tail.len() + name.len() + 1 > sysscope_abi::fd_class::file::NAME_BYTES {
            break;
        }
        tail = format!("/{name}{tail}");
    }
    format!("...{tail}")
}

/// An exporter holding only CAP_BPF and CAP_PERFMON, as the DaemonSet and the systemd unit run
/// it, names another user's files from the kernel: a FIFO in a directory only `nobody` may
/// search (sysscope could not even stat it), read slowly by a process running as `nobody`.
/// Beside it a root exporter, whose /proc fallback keeps CAP_DAC_READ_SEARCH and
/// CAP_SYS_PTRACE, shows exactly what the two capabilities add: a path longer than the record
/// holds is completed through /proc (without them: its tail after `...`), and
/// process.executable.name is the executable's name (without them: the process name).
#[test]
fn without_the_proc_capabilities_the_kernel_names_another_users_files() {
    if !require_root("without_the_proc_capabilities_the_kernel_names_another_users_files") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let _serial = serial();
    const NOBODY: u32 = 65534;
    let mut unprivileged = Exporter::spawn_wrapped(
        free_port(),
        SLOW_READS,
        &[],
        &[],
        &[
            "setpriv",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all,+bpf,+perfmon",
        ],
    );
    unprivileged.wait_ready(Duration::from_secs(30));
    let root = Exporter::start(SLOW_READS, &[]);
    // After start-up: nothing that reads another user's /proc/<pid>/fd or /proc/<pid>/exe
    // (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE) in any thread; the root exporter
    // keeps exactly the fallback's two.
    use sysscope::privileges::{CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE};
    const CAP_DAC_OVERRIDE: u32 = 1;
    let fallback = (1u64 << CAP_DAC_READ_SEARCH) | (1 << CAP_SYS_PTRACE);
    for (exporter, want) in [(&unprivileged, 0), (&root, fallback)] {
        let pid = exporter.child.id();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
            for field in ["CapEff:", "CapPrm:"] {
                let caps = status
                    .lines()
                    .find_map(|l| l.strip_prefix(field))
                    .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                    .unwrap();
                assert_eq!(
                    caps & (fallback | 1 << CAP_DAC_OVERRIDE),
                    want,
                    "{pid} {field} {caps:#x}"
                );
            }
        }
    }

    // /tmp/.tmpXXXX (searchable) / private (nobody's, 0700) / input.fifo, and a FIFO under
    // three levels of 200 bytes there: more than the 512 bytes a record holds.
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = base.join("private");
    let deep_dir = ["a", "b", "c"]
        .iter()
        .fold(private.clone(), |d, c| d.join(c.repeat(200)));
    std::fs::create_dir_all(&deep_dir).unwrap();
    let fifo = private.join("input.fifo");
    let deep = deep_dir.join("deep.fifo");
    for path in [&fifo, &deep] {
        mkfifo(path);
        std::os::unix::fs::chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::os::unix::fs::chown(&private, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (_, fifo_ino) = stat_identity(&fifo);
    let (_, deep_ino) = stat_identity(&deep);
    assert!(deep.as_os_str().len() > 512, "{}", deep.display());

    // As nobody: one slow read of each (filled 40 ms after it blocked), the second FIFO held
    // open (up to 20 s, until both exporters have both calls) so that /proc still has it when
    // the root exporter asks.
    /// Killed when the test is done with it, or fails.
    struct Holder(std::process::Child);
    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let nobody = NOBODY.to_string();
    let mut child = Holder(
        Command::new("setpriv")
            .args([
                "--reuid",
                &nobody,
                "--regid",
                &nobody,
                "--clear-groups",
                "--",
            ])
            .arg(workload_bin())
            .arg("fifo-slow-read")
            .arg(&fifo)
            .args(["40", "0", "fifo-slow-read"])
            .arg(&deep)
            .args(["40", "20000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("setpriv (util-linux)"),
    );
    let pid = child.0.id();
    let by_inode = |exporter: &Exporter| {
        let calls = local_slow_calls(exporter, pid, 2);
        let of = |ino: i64| {
            calls
                .iter()
                .find(|c| c["attributes"]["sysscope.file.inode"] == ino)
                .unwrap_or_else(|| panic!("no slow call on inode {ino}: {calls:#?}"))
                .clone()
        };
        (of(fifo_ino), of(deep_ino))
    };
    let (root_fifo, root_deep) = by_inode(&root);
    let (fifo_call, deep_call) = by_inode(&unprivileged);
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the workload ended early"
    );

    let attr = |c: &serde_json::Value, key: &str| c["attributes"][key].clone();
    for call in [&fifo_call, &deep_call, &root_fifo, &root_deep] {
        assert_eq!(call["name"], "read", "{call:#}");
        assert!(
            attr(call, "sysscope.file.path_unavailable").is_null(),
            "{call:#}"
        );
    }
    // The kernel's names, the same with or without the capabilities.
    assert_eq!(attr(&fifo_call, "file.path"), fifo.to_str().unwrap());
    assert_eq!(attr(&root_fifo, "file.path"), fifo.to_str().unwrap());
    // What /proc adds for another user's process, and what is left without it.
    assert_eq!(attr(&root_deep, "file.path"), deep.to_str().unwrap());
    assert_eq!(attr(&deep_call, "file.path"), kernel_tail(&deep).as_str());
    assert_eq!(
        attr(&root_fifo, "process.executable.name"),
        "sysscope-workload"
    );
    assert_eq!(attr(&fifo_call, "process.executable.name"), WORKLOAD_COMM);
}

/// A shell that makes a slow read, then execs a program whose first slow calls follow at once:
/// every span names the program that made its call, though the pid's name was read (and
/// kept) while it was the shell's. The processes are another user's and the exporter runs
/// without the `/proc` fallback, so `/proc/<pid>/exe` cannot be read: the name must come
/// from the kernel, at the call.
#[test]
fn spans_name_the_program_that_made_the_call_across_an_exec() {
    if !require_root("spans_name_the_program_that_made_the_call_across_an_exec") {
        return;
    }
    use std::io::Write;
    let _serial = serial();
    const NOBODY: &str = "65534";
    let exporter = Exporter::start(&slow_reads_with("proc_fallback = false"), &[]);
    // The shell's `read` blocks on its stdin (a slow read of the shell), then the shell execs
    // the workload, which makes two slow reads of its own pipe (filled 50 ms after each read
    // has blocked) on its main thread.
    let mut child = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups", "--"])
        .args(["sh", "-c", "read line; exec \"$0\" slow-pipe-read 2 50"])
        .arg(workload_bin())
        .stdin(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(200));
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());

    let attr = |c: &serde_json::Value, key: &str| c["attributes"][key].as_str().map(String::from);
    // The reads of pipes: a read of a file can be slow too (the program's first load from a
    // cold page cache), and names its program as well, but is not what was scripted.
    let is_pipe =
        |c: &serde_json::Value| attr(c, "file.path").is_some_and(|p| p.starts_with("pipe:["));
    let all = eventually(Duration::from_secs(10), || {
        let (_, _, body) = http_get(exporter.port, "/api/v1/slow-calls", None).ok()?;
        let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
        let calls: Vec<serde_json::Value> = doc["slow_calls"]
            .as_array()?
            .iter()
            .filter(|c| c["attributes"]["process.pid"] == pid)
            .cloned()
            .collect();
        (calls.iter().filter(|c| is_pipe(c)).count() >= 3).then_some(calls)
    })
    .expect("3 slow pipe reads");
    for call in &all {
        assert_eq!(
            attr(call, "process.executable.name"),
            attr(call, "thread.name"),
            "{call:#}"
        );
    }
    let calls: Vec<&serde_json::Value> = all.iter().filter(|c| is_pipe(c)).collect();
    let mut names: Vec<String> = Vec::new();
    for call in &calls {
        assert_eq!(call["name"], "read", "{call:#}");
        // The main thread made each call: its name at the call is the process's.
        let at_call = attr(call, "thread.name").expect("thread.name");
        assert_eq!(
            attr(call, "process.executable.name").as_deref(),
            Some(at_call.as_str()),
            "{call:#}"
        );
        names.push(at_call);
    }
    assert_eq!(calls.len(), 3, "{calls:#?}");
    names.sort();
    eprintln!("spans across the exec: {names:?}");
    assert_eq!(names, ["sh", WORKLOAD_COMM, WORKLOAD_COMM]);
}
