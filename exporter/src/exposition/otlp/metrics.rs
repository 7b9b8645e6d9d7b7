//! OTLP metrics push: every `OTEL_METRIC_EXPORT_INTERVAL`, the exposition Prometheus scrapes
//! (OpenMetrics, from [`Scraper::scrape`]) is read back and sent as one OTLP request, over gRPC
//! (tonic `MetricsService`) or OTLP/HTTP (`POST /v1/metrics`, protobuf or JSON body), with TLS
//! for `https://` endpoints as `otlp::tls` builds it.
//!
//! JSON bodies are opentelemetry-proto's serde encoding of the same request, which follows the
//! OTLP/JSON mapping: lowerCamelCase field names, trace and span ids as hex strings, 64-bit
//! integers (times, counts, bucket counts) as decimal strings, enums as integers (checked by
//! the unit tests below).
//!
//! Why not the OpenTelemetry SDK's instruments: the kernel aggregates latency into histograms,
//! and the SDK can only build histograms from individual observations (its data types cannot
//! be constructed outside the crate), so the request is built from `opentelemetry-proto`
//! types. Why from the exposition rather than from the collectors: it is the one place every
//! collector (present and future) already encodes its families, with its labels, cardinality
//! budget and bucket bounds; reading it back keeps one data flow (probe → map → collector →
//! exposition → Prometheus and OTLP) and guarantees both outputs agree.
//!
//! Mapping: counters become monotonic cumulative sums named like the OpenMetrics family (so
//! `sysscope_syscalls`, which OTLP-to-Prometheus bridges export as `sysscope_syscalls_total`),
//! gauges become gauges, histograms become cumulative explicit-bucket histograms with exactly
//! the exported bounds, and bucket exemplars become OTLP exemplars with trace and span ids.
//! Cumulative start times are sysscope's start for series present from the first push, and
//! the previous push for series that appeared (or went backwards, i.e. were re-created) since.

use std::{
    collections::{HashMap, HashSet},
    sync::{mpsc, Arc},
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        metrics_service_client::MetricsServiceClient, ExportMetricsServiceRequest,
    },
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{
        exemplar, metric, number_data_point, AggregationTemporality, Exemplar as OtlpExemplar,
        Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
        ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};
use prost::Message;

use super::{grpc_metadata, http_headers, HeaderError, Stats};
use crate::{
    config::otlp::{Protocol, SignalSettings},
    exposition::{format::Format, scrape::Scraper},
    openmetrics::{self, Family, Kind, Sample},
    util::error::Chain,
};

#[derive(Debug, thiserror::Error)]
pub enum MetricPushError {
    #[error("OTLP metrics endpoint `{endpoint}`: {problem}")]
    Endpoint { endpoint: String, problem: String },
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("OTLP gRPC export needs a tokio runtime")]
    NoRuntime,
    #[error("OTLP metrics endpoint `{endpoint}`")]
    Tls {
        endpoint: String,
        #[source]
        source: super::tls::TlsError,
    },
    #[error("starting the metrics push thread")]
    Thread(#[source] std::io::Error),
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

/// The OTLP unit of a family: its declared unit, or the one its name ends with.
fn unit_of(family: &Family) -> &'static str {
    let unit = if family.unit.is_empty() {
        family.name.rsplit('_').next().unwrap_or("")
    } else {
        family.unit.as_str()
    };
    match unit {
        "seconds" => "s",
        "bytes" => "By",
        "ratio" => "1",
        "celsius" => "Cel",
        "watts" => "W",
        "hertz" => "Hz",
        "percent" => "%",
        _ => "",
    }
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn otlp_exemplar(e: &openmetrics::Exemplar) -> OtlpExemplar {
    let mut out = OtlpExemplar {
        value: Some(exemplar::Value::AsDouble(e.value)),
        time_unix_nano: e.timestamp.map_or(0, |t| (t * 1e9) as u64),
        ..Default::default()
    };
    for (k, v) in &e.labels {
        match k.as_str() {
            "trace_id" => out.trace_id = hex_bytes(v),
            "span_id" => out.span_id = hex_bytes(v),
            _ => out.filtered_attributes.push(kv(k, v)),
        }
    }
    out
}

/// Turns expositions into OTLP requests, tracking cumulative start times per series.
#[derive(Debug)]
pub(crate) struct Converter {
    resource: Resource,
    scope: InstrumentationScope,
    started_ns: u64,
    previous_push_ns: Option<u64>,
    /// Series key -> (start time, last cumulative value).
    series: HashMap<String, (u64, f64)>,
}

impl Converter {
    pub(crate) fn new(resource: &[(String, String)], started: SystemTime) -> Self {
        Self {
            resource: Resource {
                attributes: resource.iter().map(|(k, v)| kv(k, v)).collect(),
                ..Default::default()
            },
            scope: InstrumentationScope {
                name: "sysscope".into(),
                version: crate::build_info::VERSION.into(),
                ..Default::default()
            },
            started_ns: unix_ns(started),
            previous_push_ns: None,
            series: HashMap::new(),
        }
    }

    /// Series tracked for start times (bounded by what the exposition holds).
    #[cfg(test)]
    fn tracked_series(&self) -> usize {
        self.series.len()
    }

    fn start_time(&mut self, seen: &mut HashSet<String>, key: String, value: f64) -> u64 {
        let fallback = self.previous_push_ns.unwrap_or(self.started_ns);
        let start = match self.series.get(&key) {
            Some((start, last)) if value >= *last => *start,
            // Went backwards: the series was re-created after the previous push.
            Some(_) => fallback,
            None => fallback,
        };
        self.series.insert(key.clone(), (start, value));
        seen.insert(key);
        start
    }

    /// One OTLP request for the families of an OpenMetrics exposition, as of `now`.
    pub(crate) fn convert(&mut self, text: &str, now: SystemTime) -> ExportMetricsServiceRequest {
        let now_ns = unix_ns(now);
        let families = openmetrics::parse_families(text);
        let mut seen = HashSet::new();
        let mut metrics = Vec::with_capacity(families.len());
        for family in &families {
            let data = match family.kind {
                Kind::Counter => self.sum(family, now_ns, &mut seen),
                Kind::Histogram => self.histogram(family, now_ns, &mut seen),
                Kind::Gauge | Kind::Info | Kind::Unknown => Self::gauge(family, now_ns),
            };
            let Some(data) = data else { continue };
            let name = if family.kind == Kind::Info {
                format!("{}_info", family.name)
            } else {
                family.name.clone()
            };
            metrics.push(Metric {
                name,
                description: family.help.clone(),
                unit: unit_of(family).to_string(),
                data: Some(data),
                ..Default::default()
            });
        }
        // Series that disappeared start afresh if they come back.
        self.series.retain(|k, _| seen.contains(k));
        self.previous_push_ns = Some(now_ns);
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(self.resource.clone()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(self.scope.clone()),
                    metrics,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn attributes(sample: &Sample, skip: &str) -> Vec<KeyValue> {
        sample
            .labels
            .iter()
            .filter(|(k, _)| k != skip)
            .map(|(k, v)| kv(k, v))
            .collect()
    }

    fn series_key(family: &str, sample: &Sample) -> String {
        let key = openmetrics::label_key(
            sample
                .labels
                .iter()
                .filter(|(k, _)| k != "le")
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        format!("{family}{{{key}}}")
    }

    fn sum(
        &mut self,
        family: &Family,
        now_ns: u64,
        seen: &mut HashSet<String>,
    ) -> Option<metric::Data> {
        let total = format!("{}_total", family.name);
        let mut points = Vec::new();
        for s in family.samples.iter().filter(|s| s.name == total) {
            let start = self.start_time(seen, Self::series_key(&family.name, s), s.value);
            points.push(NumberDataPoint {
                attributes: Self::attributes(s, ""),
                start_time_unix_nano: start,
                time_unix_nano: now_ns,
                exemplars: s.exemplar.iter().map(otlp_exemplar).collect(),
                value: Some(number_data_point::Value::AsDouble(s.value)),
                ..Default::default()
            });
        }
        Some(metric::Data::Sum(Sum {
            data_points: points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }))
    }

    fn gauge(family: &Family, now_ns: u64) -> Option<metric::Data> {
        let points = family
            .samples
            .iter()
            .map(|s| NumberDataPoint {
                attributes: Self::attributes(s, ""),
                time_unix_nano: now_ns,
                value: Some(number_data_point::Value::AsDouble(s.value)),
                ..Default::default()
            })
            .collect();
        Some(metric::Data::Gauge(Gauge {
            data_points: points,
        }))
    }

    fn histogram(
        &mut self,
        family: &Family,
        now_ns: u64,
        seen: &mut HashSet<String>,
    ) -> Option<metric::Data> {
        #[derive(Default)]
        struct Acc<'a> {
            first: Option<&'a Sample>,
            sum: f64,
            count: Option<f64>,
            buckets: Vec<(f64, f64, Option<&'a openmetrics::Exemplar>)>,
        }
        let (sum_name, count_name, bucket_name) = (
            format!("{}_sum", family.name),
            format!("{}_count", family.name),
            format!("{}_bucket", family.name),
        );
        let mut order: Vec<String> = Vec::new();
        let mut groups: HashMap<String, Acc<'_>> = HashMap::new();
        for s in &family.samples {
            let key = Self::series_key(&family.name, s);
            let acc = groups.entry(key.clone()).or_insert_with(|| {
                order.push(key);
                Acc::default()
            });
            acc.first.get_or_insert(s);
            if s.name == sum_name {
                acc.sum = s.value;
            } else if s.name == count_name {
                acc.count = Some(s.value);
            } else if s.name == bucket_name {
                let le = match s.label("le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(v) => match v.parse() {
                        Ok(le) => le,
                        Err(_) => continue,
                    },
                    None => continue,
                };
                acc.buckets.push((le, s.value, s.exemplar.as_ref()));
            }
        }
        let mut points = Vec::with_capacity(order.len());
        for key in order {
            let Some(acc) = groups.remove(&key) else {
                continue;
            };
            let Some(first) = acc.first else { continue };
            let mut buckets = acc.buckets;
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let count = acc
                .count
                .or_else(|| buckets.last().map(|b| b.1))
                .unwrap_or(0.0);
            let mut bounds = Vec::with_capacity(buckets.len());
            let mut counts = Vec::with_capacity(buckets.len() + 1);
            let mut previous = 0.0;
            let mut exemplars = Vec::new();
            for (le, cumulative, ex) in &buckets {
                if le.is_finite() {
                    bounds.push(*le);
                }
                counts.push((cumulative - previous).max(0.0) as u64);
                previous = *cumulative;
                if let Some(ex) = ex {
                    exemplars.push(otlp_exemplar(ex));
                }
            }
            if buckets.last().is_none_or(|b| b.0.is_finite()) {
                // No +Inf bucket line: the overflow bucket holds what the bounds do not.
                counts.push((count - previous).max(0.0) as u64);
            }
            let start = self.start_time(seen, key, count);
            points.push(HistogramDataPoint {
                attributes: Self::attributes(first, "le"),
                start_time_unix_nano: start,
                time_unix_nano: now_ns,
                count: count as u64,
                sum: Some(acc.sum),
                bucket_counts: counts,
                explicit_bounds: bounds,
                exemplars,
                ..Default::default()
            });
        }
        Some(metric::Data::Histogram(Histogram {
            data_points: points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }))
    }
}

/// How requests are sent.
enum Client {
    Grpc {
        runtime: tokio::runtime::Handle,
        client: MetricsServiceClient<tonic::transport::Channel>,
        metadata: tonic::metadata::MetadataMap,
    },
    Http {
        client: reqwest::blocking::Client,
        url: String,
        headers: reqwest::header::HeaderMap,
        /// OTLP/JSON bodies instead of protobuf.
        json: bool,
        /// Bodies gzip-compressed (`Content-Encoding: gzip`).
        gzip: bool,
    },
}

/// `body` gzip-compressed. Writing to a `Vec` cannot fail, so neither can this.
fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let _ = enc.write_all(body);
    enc.finish().unwrap_or_default()
}

/// The body and content type of an OTLP/HTTP request.
fn http_body(request: &ExportMetricsServiceRequest, json: bool) -> (Vec<u8>, &'static str) {
    if json {
        // Serializing plain data to a Vec cannot fail (no maps with non-string keys).
        let body = serde_json::to_vec(request).unwrap_or_default();
        (body, "application/json")
    } else {
        (request.encode_to_vec(), "application/x-protobuf")
    }
}

/// Whether a failed request may succeed if repeated.
#[derive(Debug)]
struct SendError {
    message: String,
    retryable: bool,
}

impl Client {
    fn send(
        &mut self,
        request: &ExportMetricsServiceRequest,
        timeout: Duration,
    ) -> Result<(), SendError> {
        match self {
            Client::Grpc {
                runtime,
                client,
                metadata,
            } => {
                let mut req = tonic::Request::new(request.clone());
                *req.metadata_mut() = metadata.clone();
                req.set_timeout(timeout);
                match runtime.block_on(client.export(req)) {
                    Ok(_) => Ok(()),
                    Err(status) => {
                        use tonic::Code::*;
                        let retryable = matches!(
                            status.code(),
                            Cancelled
                                | DeadlineExceeded
                                | ResourceExhausted
                                | Aborted
                                | OutOfRange
                                | Unavailable
                                | DataLoss
                        );
                        Err(SendError {
                            message: format!("gRPC {:?}: {}", status.code(), status.message()),
                            retryable,
                        })
                    }
                }
            }
            Client::Http {
                client,
                url,
                headers,
                json,
                gzip: compress,
            } => {
                let (body, content_type) = http_body(request, *json);
                let mut req = client
                    .post(url.as_str())
                    .headers(headers.clone())
                    .header(reqwest::header::CONTENT_TYPE, content_type);
                let body = if *compress {
                    req = req.header(reqwest::header::CONTENT_ENCODING, "gzip");
                    gzip(&body)
                } else {
                    body
                };
                let result = req.timeout(timeout).body(body).send();
                match result {
                    Ok(resp) if resp.status().is_success() => Ok(()),
                    Ok(resp) => {
                        let code = resp.status().as_u16();
                        Err(SendError {
                            message: format!("HTTP status {code}"),
                            retryable: matches!(code, 429 | 502 | 503 | 504),
                        })
                    }
                    // reqwest's own message hides the cause (refused, TLS, timeout).
                    Err(e) => Err(SendError {
                        message: format!("HTTP request failed: {}", Chain(&e)),
                        retryable: true,
                    }),
                }
            }
        }
    }
}

fn build_client(
    settings: &SignalSettings,
    runtime: Option<&tokio::runtime::Handle>,
) -> Result<Client, MetricPushError> {
    match settings.protocol {
        Protocol::Grpc => {
            let runtime = runtime.ok_or(MetricPushError::NoRuntime)?.clone();
            let endpoint = tonic::transport::Endpoint::from_shared(settings.endpoint.clone())
                .map_err(|e| MetricPushError::Endpoint {
                    endpoint: settings.endpoint.clone(),
                    problem: e.to_string(),
                })?
                .connect_timeout(settings.timeout)
                .timeout(settings.timeout);
            let endpoint = match &settings.tls {
                Some(tls) => endpoint
                    .tls_config(super::tls::tonic_config(tls))
                    .map_err(|e| MetricPushError::Endpoint {
                        endpoint: settings.endpoint.clone(),
                        problem: format!("TLS: {e}"),
                    })?,
                None => endpoint,
            };
            let channel = {
                let _guard = runtime.enter();
                endpoint.connect_lazy()
            };
            let metadata = grpc_metadata(&settings.headers)?;
            let mut client = MetricsServiceClient::new(channel);
            if settings.gzip {
                client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
            }
            Ok(Client::Grpc {
                runtime,
                client,
                metadata,
            })
        }
        Protocol::HttpProtobuf | Protocol::HttpJson => {
            let headers = http_headers(&settings.headers)?;
            let client =
                super::tls::http_client(settings).map_err(|source| MetricPushError::Tls {
                    endpoint: settings.endpoint.clone(),
                    source,
                })?;
            Ok(Client::Http {
                client,
                url: settings.endpoint.clone(),
                headers,
                json: settings.protocol == Protocol::HttpJson,
                gzip: settings.gzip,
            })
        }
    }
}

/// The running metrics push.
#[derive(Debug)]
pub struct MetricPush {
    stop: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

/// Everything the push thread needs.
pub struct PushOptions {
    pub settings: SignalSettings,
    pub resource: Vec<(String, String)>,
    pub interval: Duration,
    pub export_timeout: Duration,
    pub started: SystemTime,
}

impl MetricPush {
    /// Starts pushing every `options.interval`. For gRPC, `runtime` must be the agent's.
    pub fn start(
        options: PushOptions,
        scraper: Arc<Scraper>,
        stats: Arc<Stats>,
        runtime: Option<tokio::runtime::Handle>,
    ) -> Result<Self, MetricPushError> {
        if options.settings.protocol == Protocol::Grpc && runtime.is_none() {
            return Err(MetricPushError::NoRuntime);
        }
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("otlp-metrics".into())
            .spawn(move || {
                // Built here: the blocking HTTP client must live outside the runtime.
                let mut client = match build_client(&options.settings, runtime.as_ref()) {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                tracing::info!(endpoint = %options.settings.endpoint, protocol = options.settings.protocol.as_str(), tls = options.settings.tls.is_some(), interval = ?options.interval, "pushing metrics over OTLP");
                let mut converter = Converter::new(&options.resource, options.started);
                let mut failing = false;
                // Each interval, unless told to stop (or the agent is gone).
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(options.interval)
                {
                    let text = scraper.scrape(Format::OpenMetrics);
                    let text = String::from_utf8_lossy(&text);
                    let request = converter.convert(&text, SystemTime::now());
                    let ok = push_with_retry(&mut client, &request, &options, &stats, &mut failing);
                    if ok && failing {
                        tracing::info!("OTLP metrics push recovered");
                    }
                    failing = !ok;
                }
                drop(client);
                let _ = done_tx.send(());
            })
            .map_err(MetricPushError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(MetricPushError::Thread(std::io::Error::other(
                    "metrics push thread ended during start-up",
                )))
            }
        }
        Ok(Self {
            stop: stop_tx,
            done: done_rx,
            thread: Some(thread),
        })
    }

    /// Stops the push (waiting at most `grace` for a request in flight).
    pub fn shutdown(mut self, grace: Duration) {
        let _ = self.stop.send(());
        if self.done.recv_timeout(grace).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

/// Sends one request, retrying retryable failures with a doubling pause, all within the
/// export timeout (and the interval, so pushes never pile up). Returns whether it succeeded.
fn push_with_retry(
    client: &mut Client,
    request: &ExportMetricsServiceRequest,
    options: &PushOptions,
    stats: &Stats,
    failing: &mut bool,
) -> bool {
    let deadline = Instant::now() + options.export_timeout.min(options.interval);
    let mut pause = Duration::from_millis(200);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = options
            .settings
            .timeout
            .min(left.max(Duration::from_millis(100)));
        match client.send(request, timeout) {
            Ok(()) => {
                stats.request("metrics", true);
                return true;
            }
            Err(e) => {
                stats.request("metrics", false);
                let again = e.retryable && Instant::now() + pause < deadline;
                if !again {
                    if *failing {
                        tracing::debug!(error = %e.message, "OTLP metrics push failed again");
                    } else {
                        tracing::warn!(endpoint = %options.settings.endpoint, error = %e.message, "OTLP metrics push failed; the next push carries the cumulative values");
                    }
                    return false;
                }
                std::thread::sleep(pause);
                pause *= 2;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP sysscope_syscalls Syscalls.\n\
# TYPE sysscope_syscalls counter\n\
sysscope_syscalls_total{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 12\n\
# HELP sysscope_syscall_duration_seconds Latency.\n\
# TYPE sysscope_syscall_duration_seconds histogram\n\
sysscope_syscall_duration_seconds_sum{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 0.5\n\
sysscope_syscall_duration_seconds_count{cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 12\n\
sysscope_syscall_duration_seconds_bucket{le=\"0.001\",cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 2\n\
sysscope_syscall_duration_seconds_bucket{le=\"0.067108864\",cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 12 # {trace_id=\"0102030405060708090a0b0c0d0e0f10\",span_id=\"0102030405060708\"} 0.03 1700000000.5\n\
sysscope_syscall_duration_seconds_bucket{le=\"+Inf\",cgroup=\"/a\",comm=\"x\",syscall=\"read\"} 12\n\
# HELP sysscope_collector_up Up.\n\
# TYPE sysscope_collector_up gauge\n\
sysscope_collector_up{collector=\"syscalls\"} 1\n\
# EOF\n";

    fn metric<'a>(r: &'a ExportMetricsServiceRequest, name: &str) -> &'a Metric {
        r.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    }

    #[test]
    fn counters_histograms_gauges_and_exemplars() {
        let started = UNIX_EPOCH + Duration::from_secs(100);
        let mut c = Converter::new(&[("service.name".into(), "sysscope".into())], started);
        let now = UNIX_EPOCH + Duration::from_secs(200);
        let r = c.convert(TEXT, now);
        let Some(metric::Data::Sum(sum)) = &metric(&r, "sysscope_syscalls").data else {
            panic!("not a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let p = &sum.data_points[0];
        assert_eq!(p.value, Some(number_data_point::Value::AsDouble(12.0)));
        assert_eq!(p.start_time_unix_nano, 100_000_000_000);
        assert_eq!(p.time_unix_nano, 200_000_000_000);
        assert_eq!(p.attributes.len(), 3);

        let h = metric(&r, "sysscope_syscall_duration_seconds");
        assert_eq!(h.unit, "s");
        let Some(metric::Data::Histogram(h)) = &h.data else {
            panic!("not a histogram")
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, vec![0.001, 0.067108864]);
        assert_eq!(p.bucket_counts, vec![2, 10, 0]);
        assert_eq!((p.count, p.sum), (12, Some(0.5)));
        assert!(p.attributes.iter().all(|a| a.key != "le"));
        assert_eq!(p.exemplars.len(), 1);
        assert_eq!(p.exemplars[0].trace_id, (1..=16).collect::<Vec<u8>>());
        assert_eq!(p.exemplars[0].span_id, (1..=8).collect::<Vec<u8>>());
        assert_eq!(p.exemplars[0].time_unix_nano, 1_700_000_000_500_000_000);

        let Some(metric::Data::Gauge(g)) = &metric(&r, "sysscope_collector_up").data else {
            panic!("not a gauge")
        };
        assert_eq!(g.data_points.len(), 1);
        // Round trip through protobuf.
        let bytes = r.encode_to_vec();
        assert_eq!(
            ExportMetricsServiceRequest::decode(bytes.as_slice()).unwrap(),
            r
        );
    }

    #[test]
    fn start_times_follow_resets_and_new_series() {
        let started = UNIX_EPOCH + Duration::from_secs(100);
        let mut c = Converter::new(&[], started);
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        let start_of = |r: &ExportMetricsServiceRequest| {
            let Some(metric::Data::Sum(sum)) = &metric(r, "sysscope_syscalls").data else {
                panic!()
            };
            sum.data_points[0].start_time_unix_nano
        };
        assert_eq!(start_of(&c.convert(TEXT, t(200))), 100_000_000_000);
        assert_eq!(start_of(&c.convert(TEXT, t(300))), 100_000_000_000);
        // Went backwards: re-created after the previous push.
        let lower = TEXT.replace("\"read\"} 12\n", "\"read\"} 3\n");
        assert_eq!(start_of(&c.convert(&lower, t(400))), 300_000_000_000);
        // Gone, then back: starts at the push before it came back.
        c.convert("# EOF\n", t(500));
        assert_eq!(c.tracked_series(), 0);
        assert_eq!(start_of(&c.convert(TEXT, t(600))), 500_000_000_000);
    }

    #[test]
    fn json_bodies_follow_the_otlp_json_mapping() {
        let started = UNIX_EPOCH + Duration::from_secs(100);
        let mut c = Converter::new(&[("service.name".into(), "sysscope".into())], started);
        let r = c.convert(TEXT, UNIX_EPOCH + Duration::from_secs(200));
        let (body, content_type) = http_body(&r, true);
        assert_eq!(content_type, "application/json");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let rm = &v["resourceMetrics"][0];
        assert_eq!(
            rm["resource"]["attributes"][0],
            serde_json::json!({"key": "service.name", "value": {"stringValue": "sysscope"}})
        );
        let metrics = rm["scopeMetrics"][0]["metrics"].as_array().unwrap();
        let by_name = |n: &str| metrics.iter().find(|m| m["name"] == n).unwrap();
        let sum = &by_name("sysscope_syscalls")["sum"];
        assert_eq!(sum["isMonotonic"], true);
        // Enums are integers in OTLP/JSON (2: cumulative).
        assert_eq!(sum["aggregationTemporality"], 2);
        let p = &sum["dataPoints"][0];
        // 64-bit integers are decimal strings; doubles are numbers.
        assert_eq!(p["startTimeUnixNano"], "100000000000");
        assert_eq!(p["timeUnixNano"], "200000000000");
        assert_eq!(p["asDouble"], 12.0);
        let h = &by_name("sysscope_syscall_duration_seconds")["histogram"]["dataPoints"][0];
        assert_eq!(h["count"], "12");
        assert_eq!(h["bucketCounts"], serde_json::json!(["2", "10", "0"]));
        assert_eq!(h["explicitBounds"], serde_json::json!([0.001, 0.067108864]));
        assert_eq!(h["sum"], 0.5);
        // Ids are lowercase hex, not base64.
        let e = &h["exemplars"][0];
        assert_eq!(e["traceId"], "0102030405060708090a0b0c0d0e0f10");
        assert_eq!(e["spanId"], "0102030405060708");
        assert_eq!(e["timeUnixNano"], "1700000000500000000");
        assert!(by_name("sysscope_collector_up")["gauge"]["dataPoints"][0]["asDouble"] == 1.0);
        // And it reads back into the same request.
        let back: ExportMetricsServiceRequest = serde_json::from_slice(&body).unwrap();
        assert_eq!(back, r);
    }
}
