//! OTLP metrics push: every `OTEL_METRIC_EXPORT_INTERVAL`, the families Prometheus scrapes
//! (typed, as the protobuf exposition builds them: [`Scraper::families`]) are sent as one OTLP
//! request, over gRPC (tonic `MetricsService`) or OTLP/HTTP (`POST /v1/metrics`, protobuf or
//! opentelemetry-proto's serde JSON, which follows the OTLP/JSON mapping), with TLS for
//! `https://` endpoints as `otlp::tls` builds it.
//!
//! Why not the OpenTelemetry SDK's instruments: the kernel aggregates latency into histograms,
//! and the SDK builds histograms only from individual observations (its data types cannot be
//! constructed outside the crate), so the request is built from `opentelemetry-proto` types.
//! Why from the exposition's families: every collector already encodes its families there,
//! with its labels, budget and buckets, as data; reading them keeps one data flow and both
//! outputs equal.
//!
//! The mapping of kinds, names, units, buckets, attributes and temporality is docs/spans.md's
//! ("OTLP metrics"); the points below say how each is built.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        metrics_service_client::MetricsServiceClient, ExportMetricsServiceRequest,
    },
    common::v1::{InstrumentationScope, KeyValue},
    metrics::v1::{
        exemplar, exponential_histogram_data_point::Buckets, metric, number_data_point,
        AggregationTemporality, Exemplar as OtlpExemplar, ExponentialHistogram,
        ExponentialHistogramDataPoint, Gauge, Histogram as OtlpHistogram, HistogramDataPoint,
        Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};
use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
    Exemplar as PromExemplar, Histogram as PromHistogram, Metric as PromMetric, MetricFamily,
    MetricType,
};
use prost::Message;
use tokio::sync::Notify;

use super::{ExportError, Stats};
use crate::{
    config::otlp::{HistogramAggregation, Protocol, Settings, SignalSettings, Temporality},
    exposition::{protobuf::is_native, scrape::Scraper},
    hist::expand_spans,
    metadata::kubernetes,
    openmetrics,
    util::error::Chain,
};

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// An OTLP attribute (through opentelemetry-proto's conversion of API values).
fn kv(key: &str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(value.into().into()),
        ..Default::default()
    }
}

/// A series label as an OTLP attribute. Labels the slow-call spans carry under an
/// OpenTelemetry semantic-convention name (docs/spans.md) take that name and the spans' form
/// of the value, so an OTLP backend joins a pod's metrics and spans; the others keep theirs.
fn attribute(label: &str, value: &str) -> KeyValue {
    match label {
        // The cgroup v2 line of /proc/<pid>/cgroup, as the spans write it; a folded series'
        // `other` is no path.
        "cgroup" if value.starts_with('/') => kv("process.linux.cgroup", format!("0::{value}")),
        "cgroup" => kv("process.linux.cgroup", value.to_string()),
        "comm" => kv("process.executable.name", value.to_string()),
        "pid" => match value.parse::<i64>() {
            Ok(pid) => kv("process.pid", pid),
            Err(_) => kv("process.pid", value.to_string()),
        },
        "errno" => kv("error.type", value.to_string()),
        _ => match kubernetes::span_attribute(label) {
            Some(key) => kv(key, value.to_string()),
            None => kv(label, value.to_string()),
        },
    }
}

/// The OTLP unit of a family: its declared unit, or the one its name ends with.
fn unit_of(family: &MetricFamily, name: &str) -> &'static str {
    let unit = if family.unit.is_empty() {
        name.rsplit('_').next().unwrap_or("")
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

fn otlp_exemplar(e: &PromExemplar) -> OtlpExemplar {
    let mut out = OtlpExemplar {
        value: Some(exemplar::Value::AsDouble(e.value)),
        time_unix_nano: e
            .timestamp
            .as_ref()
            .map_or(0, |t| t.seconds as u64 * 1_000_000_000 + t.nanos as u64),
        ..Default::default()
    };
    for l in &e.label {
        let v = &l.value;
        match l.name.as_str() {
            "trace_id" => {
                out.trace_id = TraceId::from_hex(v).map_or(vec![], |t| t.to_bytes().into())
            }
            "span_id" => out.span_id = SpanId::from_hex(v).map_or(vec![], |s| s.to_bytes().into()),
            _ => out.filtered_attributes.push(kv(&l.name, l.value.clone())),
        }
    }
    out
}

/// How the push turns the families into OTLP metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Conversion {
    pub(crate) temporality: Temporality,
    pub(crate) histograms: HistogramAggregation,
}

/// A series' cumulative values: a counter's value or a histogram's count, its sum, its zero
/// bucket, and its buckets' counts by index (the classic buckets' positions, or OTLP's
/// exponential indexes). What a delta is taken from, and what tells a reset (a count that went
/// down: the series was re-created).
#[derive(Debug, Clone, Default, PartialEq)]
struct Values {
    count: f64,
    sum: f64,
    zero: u64,
    buckets: BTreeMap<i32, u64>,
}

impl Values {
    /// What was added since `before`.
    fn since(mut self, before: &Values) -> Values {
        self.count -= before.count;
        self.sum -= before.sum;
        self.zero = self.zero.saturating_sub(before.zero);
        for (i, n) in self.buckets.iter_mut() {
            *n = n.saturating_sub(before.buckets.get(i).copied().unwrap_or(0));
        }
        self
    }
}

/// One series as the previous push left it.
#[derive(Debug)]
struct Tracked {
    /// Start of its cumulative values.
    start: u64,
    last: Values,
}

/// Turns the exposition's families into OTLP requests, tracking each series' start time and
/// last values.
#[derive(Debug)]
pub(crate) struct Converter {
    resource: Resource,
    scope: InstrumentationScope,
    conversion: Conversion,
    started_ns: u64,
    previous_push_ns: Option<u64>,
    /// Series key (family and labels) -> the series as the previous push left it.
    series: HashMap<String, Tracked>,
    /// The series seen by the push under way (they replace `series` at its end).
    seen: HashMap<String, Tracked>,
    /// The series and the push time before the last request, until it is delivered.
    before_last: Option<(HashMap<String, Tracked>, Option<u64>)>,
}

/// A point's attributes, start and values (cumulative, or the delta).
type Point = (Vec<KeyValue>, u64, Values);

impl Converter {
    pub(crate) fn new(
        resource: &[(String, String)],
        started: SystemTime,
        conversion: Conversion,
    ) -> Self {
        Self {
            resource: Resource {
                attributes: resource.iter().map(|(k, v)| kv(k, v.to_string())).collect(),
                ..Default::default()
            },
            scope: InstrumentationScope {
                name: "sysscope".into(),
                version: crate::build_info::VERSION.into(),
                ..Default::default()
            },
            conversion,
            started_ns: unix_ns(started),
            previous_push_ns: None,
            series: HashMap::new(),
            seen: HashMap::new(),
            before_last: None,
        }
    }

    /// Records `now` as the values of `m`'s series and returns its point. A cumulative point
    /// starts where the series' values do; a delta point at the previous push, with what
    /// changed since. A series new since the previous push, or whose count went down (it was
    /// re-created), starts at the previous push (or sysscope's start) and counts whole.
    fn point(&mut self, family: &str, m: &PromMetric, now: Values, delta: bool) -> Point {
        let key = format!(
            "{family}{{{}}}",
            openmetrics::label_key(m.label.iter().map(|l| (&*l.name, &*l.value)))
        );
        let fallback = self.previous_push_ns.unwrap_or(self.started_ns);
        let (start, values) = match self.series.get(&key) {
            Some(t) if now.count >= t.last.count && delta => (t.start, now.clone().since(&t.last)),
            Some(t) if now.count >= t.last.count => (t.start, now.clone()),
            _ => (fallback, now.clone()),
        };
        self.seen.insert(key, Tracked { start, last: now });
        let attributes = m
            .label
            .iter()
            .map(|l| attribute(&l.name, &l.value))
            .collect();
        (attributes, if delta { fallback } else { start }, values)
    }

    /// One OTLP request for `families` (typed, with both forms of the duration histograms),
    /// as of `now`.
    pub(crate) fn convert(
        &mut self,
        families: &[MetricFamily],
        now: SystemTime,
    ) -> ExportMetricsServiceRequest {
        let now_ns = unix_ns(now);
        let mut metrics = Vec::with_capacity(families.len());
        for family in families {
            let kind = MetricType::try_from(family.r#type).unwrap_or(MetricType::Untyped);
            let data = match kind {
                MetricType::Counter => self.sum(family, now_ns),
                MetricType::Histogram => self.histogram(family, now_ns),
                _ => gauge(family, now_ns),
            };
            // Counters keep their OpenMetrics family name (`sysscope_syscalls`), which
            // OTLP-to-Prometheus bridges export with `_total` again.
            let name = match kind {
                MetricType::Counter => family.name.strip_suffix("_total"),
                _ => None,
            };
            let name = name.unwrap_or(&family.name).to_string();
            metrics.push(Metric {
                unit: unit_of(family, &name).to_string(),
                name,
                description: family.help.clone(),
                data: Some(data),
                ..Default::default()
            });
        }
        // Series that disappeared start afresh if they come back.
        let series = std::mem::replace(&mut self.series, std::mem::take(&mut self.seen));
        self.before_last = Some((series, self.previous_push_ns.replace(now_ns)));
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

    /// Whether the last request was delivered. If not, the next one is taken from where the
    /// last delivered one left the series: its deltas carry what the lost one did.
    pub(crate) fn delivered(&mut self, delivered: bool) {
        let before = self.before_last.take();
        if let (false, Some((series, previous))) = (delivered, before) {
            self.series = series;
            self.previous_push_ns = previous;
        }
    }

    fn sum(&mut self, family: &MetricFamily, now_ns: u64) -> metric::Data {
        let delta = self.conversion.temporality.delta_sums();
        let data_points = family.metric.iter().filter_map(|m| {
            let counter = m.counter.as_ref()?;
            let now = Values {
                count: counter.value,
                ..Values::default()
            };
            let (attributes, start, values) = self.point(&family.name, m, now, delta);
            Some(NumberDataPoint {
                attributes,
                start_time_unix_nano: start,
                time_unix_nano: now_ns,
                exemplars: counter.exemplar.iter().map(otlp_exemplar).collect(),
                value: Some(number_data_point::Value::AsDouble(values.count)),
                ..Default::default()
            })
        });
        metric::Data::Sum(Sum {
            data_points: data_points.collect(),
            aggregation_temporality: temporality(delta),
            is_monotonic: true,
        })
    }

    fn histogram(&mut self, family: &MetricFamily, now_ns: u64) -> metric::Data {
        let delta = self.conversion.temporality.delta_histograms();
        let aggregation_temporality = temporality(delta);
        let histograms = family
            .metric
            .iter()
            .filter_map(|m| Some((m, m.histogram.as_ref()?)));
        // Exponential only where every series has its native form (the kernel's histograms
        // do); a family is one kind of data in OTLP.
        if self.conversion.histograms == HistogramAggregation::Base2Exponential
            && histograms.clone().all(|(_, h)| is_native(h))
        {
            let data_points = histograms
                .map(|(m, h)| {
                    let point = self.point(&family.name, m, exponential_values(h), delta);
                    exponential_point(h, point, now_ns)
                })
                .collect();
            return metric::Data::ExponentialHistogram(ExponentialHistogram {
                data_points,
                aggregation_temporality,
            });
        }
        let data_points = histograms
            .map(|(m, h)| {
                let point = self.point(&family.name, m, explicit_values(h), delta);
                explicit_point(h, point, now_ns)
            })
            .collect();
        metric::Data::Histogram(OtlpHistogram {
            data_points,
            aggregation_temporality,
        })
    }
}

/// The classic buckets' counts (each bucket's own, not cumulative), count and sum.
fn explicit_values(h: &PromHistogram) -> Values {
    let mut now = Values {
        count: h.sample_count as f64,
        sum: h.sample_sum,
        ..Values::default()
    };
    let mut previous = 0u64;
    for (i, b) in h.bucket.iter().enumerate() {
        now.buckets
            .insert(i as i32, b.cumulative_count.saturating_sub(previous));
        previous = b.cumulative_count;
    }
    if h.bucket.last().is_none_or(|b| b.upper_bound.is_finite()) {
        // No +Inf bucket: the overflow bucket holds what the bounds do not.
        let overflow = h.sample_count.saturating_sub(previous);
        now.buckets.insert(h.bucket.len() as i32, overflow);
    }
    now
}

/// A point with the classic buckets' bounds and counts.
fn explicit_point(
    h: &PromHistogram,
    (attributes, start, values): Point,
    now_ns: u64,
) -> HistogramDataPoint {
    HistogramDataPoint {
        attributes,
        start_time_unix_nano: start,
        time_unix_nano: now_ns,
        count: values.count as u64,
        sum: Some(values.sum),
        bucket_counts: values.buckets.into_values().collect(),
        explicit_bounds: h
            .bucket
            .iter()
            .map(|b| b.upper_bound)
            .filter(|b| b.is_finite())
            .collect(),
        exemplars: h
            .bucket
            .iter()
            .filter_map(|b| b.exemplar.as_ref())
            .map(otlp_exemplar)
            .collect(),
        ..Default::default()
    }
}

/// The native histogram's buckets in OTLP's numbering: OTLP's scale is the native schema (both
/// name a bucket width of 2^(2^-scale)), and OTLP's bucket `j` covers (base^j, base^(j+1)]
/// where the native bucket `i` covers (base^(i-1), base^i]: `j = i - 1`.
fn exponential_values(h: &PromHistogram) -> Values {
    let spans: Vec<(i32, u32)> = h
        .positive_span
        .iter()
        .map(|s| (s.offset, s.length))
        .collect();
    Values {
        count: h.sample_count as f64,
        sum: h.sample_sum,
        zero: h.zero_count,
        buckets: expand_spans(&spans, &h.positive_delta)
            .into_iter()
            .map(|(i, n)| (i - 1, n))
            .collect(),
    }
}

/// A point with the native histogram's buckets, as [`exponential_values`] numbers them.
fn exponential_point(
    h: &PromHistogram,
    (attributes, start, values): Point,
    now_ns: u64,
) -> ExponentialHistogramDataPoint {
    let indexes = values.buckets.keys();
    let positive = match (indexes.clone().next(), indexes.last()) {
        (Some(&first), Some(&last)) => Some(Buckets {
            offset: first,
            bucket_counts: (first..=last)
                .map(|j| values.buckets.get(&j).copied().unwrap_or(0))
                .collect(),
        }),
        _ => None,
    };
    ExponentialHistogramDataPoint {
        attributes,
        start_time_unix_nano: start,
        time_unix_nano: now_ns,
        count: values.count as u64,
        sum: Some(values.sum),
        scale: h.schema,
        zero_count: values.zero,
        zero_threshold: h.zero_threshold,
        positive,
        exemplars: h.exemplars.iter().map(otlp_exemplar).collect(),
        ..Default::default()
    }
}

fn temporality(delta: bool) -> i32 {
    if delta {
        AggregationTemporality::Delta as i32
    } else {
        AggregationTemporality::Cumulative as i32
    }
}

fn gauge(family: &MetricFamily, now_ns: u64) -> metric::Data {
    let data_points = family
        .metric
        .iter()
        .map(|m| {
            let value = m
                .gauge
                .as_ref()
                .map(|g| g.value)
                .or_else(|| m.untyped.as_ref().map(|u| u.value))
                .unwrap_or(0.0);
            NumberDataPoint {
                attributes: m
                    .label
                    .iter()
                    .map(|l| attribute(&l.name, &l.value))
                    .collect(),
                time_unix_nano: now_ns,
                value: Some(number_data_point::Value::AsDouble(value)),
                ..Default::default()
            }
        })
        .collect();
    metric::Data::Gauge(Gauge { data_points })
}

/// How requests are sent: both clients are async, on the agent's runtime.
#[allow(clippy::large_enum_variant, reason = "one per process")]
enum Client {
    Grpc {
        client: MetricsServiceClient<tonic::transport::Channel>,
        metadata: tonic::metadata::MetadataMap,
    },
    Http {
        client: reqwest::Client,
        url: String,
    },
}

/// What one push sends, made once (off the runtime) whatever its retries: the gRPC message, or
/// the OTLP/HTTP body (protobuf or JSON, gzip-compressed or not).
enum Ready {
    Grpc(ExportMetricsServiceRequest),
    Http {
        body: bytes::Bytes,
        content_type: &'static str,
        gzip: bool,
    },
}

impl Ready {
    /// `request` as `protocol` sends it.
    fn new(request: ExportMetricsServiceRequest, protocol: Protocol, gzip: bool) -> Self {
        // Serializing plain data to a Vec cannot fail (no maps with non-string keys).
        let (body, content_type) = match protocol {
            Protocol::Grpc => return Ready::Grpc(request),
            Protocol::HttpJson => (serde_json::to_vec(&request), "application/json"),
            Protocol::HttpProtobuf => (Ok(request.encode_to_vec()), "application/x-protobuf"),
        };
        let mut body = body.unwrap_or_default();
        if gzip {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            // Writing to a Vec cannot fail.
            let _ = enc.write_all(&body);
            body = enc.finish().unwrap_or_default();
        }
        let body = body.into();
        Ready::Http {
            body,
            content_type,
            gzip,
        }
    }
}

/// A failed request: why, and whether it may succeed if repeated.
struct SendError(String, bool);

impl Client {
    /// The client of `settings`; built on the runtime (gRPC's channel lives there).
    fn new(settings: &SignalSettings) -> Result<Self, ExportError> {
        let endpoint = &settings.endpoint;
        if settings.protocol != Protocol::Grpc {
            let client = super::tls::http_client(settings)?;
            let url = endpoint.clone();
            return Ok(Client::Http { client, url });
        }
        let bad = |e: tonic::transport::Error| ExportError::Endpoint {
            endpoint: endpoint.clone(),
            problem: Chain(&e).to_string(),
        };
        let mut channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
            .map_err(bad)?
            .connect_timeout(settings.timeout)
            .timeout(settings.timeout);
        if let Some(tls) = &settings.tls {
            channel = channel
                .tls_config(super::tls::tonic_config(tls))
                .map_err(bad)?;
        }
        let mut client = MetricsServiceClient::new(channel.connect_lazy());
        if settings.gzip {
            client = client.send_compressed(tonic::codec::CompressionEncoding::Gzip);
        }
        let metadata = tonic::metadata::MetadataMap::from_headers(settings.headers.clone());
        Ok(Client::Grpc { client, metadata })
    }

    async fn send(&mut self, ready: &Ready, timeout: Duration) -> Result<(), SendError> {
        match (self, ready) {
            (Client::Grpc { client, metadata }, Ready::Grpc(request)) => {
                let mut req = tonic::Request::new(request.clone());
                *req.metadata_mut() = metadata.clone();
                req.set_timeout(timeout);
                let Err(status) = client.export(req).await else {
                    return Ok(());
                };
                use tonic::Code as C;
                let retryable = matches!(
                    status.code(),
                    C::Cancelled
                        | C::DeadlineExceeded
                        | C::ResourceExhausted
                        | C::Aborted
                        | C::OutOfRange
                        | C::Unavailable
                        | C::DataLoss
                );
                let message = format!("gRPC {:?}: {}", status.code(), status.message());
                Err(SendError(message, retryable))
            }
            (
                Client::Http { client, url },
                Ready::Http {
                    body,
                    content_type,
                    gzip,
                },
            ) => {
                let mut req = client
                    .post(url.as_str())
                    .header(reqwest::header::CONTENT_TYPE, *content_type)
                    .timeout(timeout);
                if *gzip {
                    req = req.header(reqwest::header::CONTENT_ENCODING, "gzip");
                }
                match req.body(body.clone()).send().await {
                    Ok(resp) if resp.status().is_success() => Ok(()),
                    Ok(resp) => {
                        let code = resp.status().as_u16();
                        let retryable = matches!(code, 429 | 502 | 503 | 504);
                        Err(SendError(format!("HTTP status {code}"), retryable))
                    }
                    // reqwest's own message hides the cause (refused, TLS, timeout).
                    Err(e) => Err(SendError(
                        format!("HTTP request failed: {}", Chain(&e)),
                        true,
                    )),
                }
            }
            _ => Err(SendError("made ready for the other protocol".into(), false)),
        }
    }
}

/// The running metrics push: a task on the agent's runtime, ended when dropped.
#[derive(Debug)]
pub struct MetricPush {
    stop: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl MetricPush {
    /// Starts pushing every `OTEL_METRIC_EXPORT_INTERVAL` when `otlp` has a metrics endpoint.
    /// Must be called on the agent's runtime.
    pub fn start(
        otlp: &Settings,
        scraper: Arc<Scraper>,
        stats: Arc<Stats>,
    ) -> Result<Option<Self>, ExportError> {
        let Some(signal) = otlp.metrics.clone() else {
            return Ok(None);
        };
        let mut client = Client::new(&signal)?;
        let conversion = Conversion {
            temporality: otlp.metric_temporality,
            histograms: otlp.metric_histograms,
        };
        let mut converter = Converter::new(&otlp.resource, SystemTime::now(), conversion);
        let interval = otlp.metric_interval;
        // Within the export timeout and the interval, so pushes never pile up.
        let budget = otlp.metric_export_timeout.min(interval);
        let stop = Arc::new(Notify::new());
        let stopped = stop.clone();
        tracing::info!(endpoint = %signal.endpoint, protocol = signal.protocol.as_str(), tls = signal.tls.is_some(), ?interval, "pushing metrics over OTLP");
        let task = tokio::spawn(async move {
            let mut failing = false;
            // A full interval after each push ends, however long it took.
            while tokio::select! {
                biased;
                _ = stopped.notified() => false,
                _ = tokio::time::sleep(interval) => true,
            } {
                // Reading the maps blocks, as a scrape does; converting and encoding are CPU
                // work: off the runtime's workers, once whatever the retries (tonic encodes a
                // gRPC message itself, at each attempt).
                let (scraper, protocol, gzip) = (scraper.clone(), signal.protocol, signal.gzip);
                let made = tokio::task::spawn_blocking(move || {
                    let request = converter.convert(&scraper.families(), SystemTime::now());
                    (converter, Ready::new(request, protocol, gzip))
                });
                let Ok((made_by, ready)) = made.await else {
                    return;
                };
                converter = made_by;
                let ok =
                    push_with_retry(&mut client, &ready, &signal, budget, &stats, failing).await;
                if ok && failing {
                    tracing::info!("OTLP metrics push recovered");
                }
                converter.delivered(ok);
                failing = !ok;
            }
        });
        Ok(Some(Self { stop, task }))
    }

    /// Stops the push, waiting at most `grace` for a request in flight.
    pub async fn shutdown(mut self, grace: Duration) {
        self.stop.notify_one();
        let _ = tokio::time::timeout(grace, &mut self.task).await;
    }
}

impl Drop for MetricPush {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends one request, retrying retryable failures with a doubling pause, all within `budget`.
/// Returns whether it succeeded.
async fn push_with_retry(
    client: &mut Client,
    request: &Ready,
    signal: &SignalSettings,
    budget: Duration,
    stats: &Stats,
    failing: bool,
) -> bool {
    let deadline = Instant::now() + budget;
    let mut pause = Duration::from_millis(200);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = signal.timeout.min(left.max(Duration::from_millis(100)));
        let result = client.send(request, timeout).await;
        stats.request("metrics", result.is_ok());
        let Err(SendError(error, retryable)) = result else {
            return true;
        };
        if !retryable || Instant::now() + pause >= deadline {
            if failing {
                tracing::debug!(%error, "OTLP metrics push failed again");
            } else {
                tracing::warn!(endpoint = %signal.endpoint, %error, "OTLP metrics push failed; the next push carries what this one did");
            }
            return false;
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
        Bucket, BucketSpan, Counter, Gauge as PromGauge, LabelPair,
    };

    use opentelemetry_proto::tonic::common::v1::any_value;

    use super::*;

    impl Converter {
        /// Series tracked for start times (bounded by what the exposition holds).
        fn tracked_series(&self) -> usize {
            self.series.len()
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<LabelPair> {
        pairs
            .iter()
            .map(|(k, v)| LabelPair {
                name: k.to_string(),
                value: v.to_string(),
            })
            .collect()
    }

    const SERIES: &[(&str, &str)] = &[("cgroup", "/a"), ("comm", "x"), ("syscall", "read")];

    fn counter(value: f64) -> MetricFamily {
        MetricFamily {
            name: "sysscope_syscalls_total".into(),
            help: "Syscalls.".into(),
            r#type: MetricType::Counter as i32,
            metric: vec![PromMetric {
                label: labels(SERIES),
                counter: Some(Counter {
                    value,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// 12 calls: 2 at or below 1 ms (native schema -1 bucket (4^-6, 4^-5]), 10 in
    /// (4^-3, 4^-2] s, one of them an exemplar; both forms, as the exposition builds them.
    fn histogram(scale: u64) -> MetricFamily {
        let exemplar = PromExemplar {
            label: labels(&[
                ("trace_id", "0102030405060708090a0b0c0d0e0f10"),
                ("span_id", "0102030405060708"),
            ]),
            value: 0.03,
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 500_000_000,
            }),
        };
        let bucket = |le: f64, n: u64, exemplar: Option<PromExemplar>| Bucket {
            cumulative_count: n * scale,
            upper_bound: le,
            exemplar,
            ..Default::default()
        };
        MetricFamily {
            name: "sysscope_syscall_duration_seconds".into(),
            help: "Latency.".into(),
            r#type: MetricType::Histogram as i32,
            metric: vec![PromMetric {
                label: labels(SERIES),
                histogram: Some(PromHistogram {
                    sample_count: 12 * scale,
                    sample_sum: 0.5 * scale as f64,
                    bucket: vec![
                        bucket(2f64.powi(-10), 2, None),
                        bucket(0.0625, 12, Some(exemplar.clone())),
                        bucket(f64::INFINITY, 12, None),
                    ],
                    schema: -1,
                    zero_threshold: 2f64.powi(-20),
                    positive_span: vec![BucketSpan {
                        offset: -5,
                        length: 4,
                    }],
                    positive_delta: vec![2 * scale as i64, -2 * scale as i64, 0, 10 * scale as i64],
                    exemplars: vec![exemplar],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn gauge() -> MetricFamily {
        MetricFamily {
            name: "sysscope_collector_up".into(),
            help: "Up.".into(),
            r#type: MetricType::Gauge as i32,
            metric: vec![PromMetric {
                label: labels(&[("collector", "syscalls")]),
                gauge: Some(PromGauge { value: 1.0 }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn families(scale: u64) -> Vec<MetricFamily> {
        vec![counter(12.0 * scale as f64), histogram(scale), gauge()]
    }

    fn metric<'a>(r: &'a ExportMetricsServiceRequest, name: &str) -> &'a Metric {
        r.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    }

    fn attribute_of<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
        attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.as_ref()?.value.as_ref())
    }

    fn text(s: &str) -> any_value::Value {
        any_value::Value::StringValue(s.into())
    }

    /// A converter for the `sysscope` service, started at 100 s, with the default conversion.
    fn sysscope_converter() -> Converter {
        let started = UNIX_EPOCH + Duration::from_secs(100);
        let resource = [("service.name".to_string(), "sysscope".to_string())];
        Converter::new(&resource, started, Conversion::default())
    }

    #[test]
    fn counters_histograms_gauges_and_exemplars() {
        let mut c = sysscope_converter();
        let now = UNIX_EPOCH + Duration::from_secs(200);
        let r = c.convert(&families(1), now);
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
        // The spans' attribute names and forms.
        assert_eq!(p.attributes.len(), 3);
        assert_eq!(
            attribute_of(&p.attributes, "process.linux.cgroup"),
            Some(&text("0::/a"))
        );
        assert_eq!(
            attribute_of(&p.attributes, "process.executable.name"),
            Some(&text("x"))
        );
        assert_eq!(attribute_of(&p.attributes, "syscall"), Some(&text("read")));

        let h = metric(&r, "sysscope_syscall_duration_seconds");
        assert_eq!(h.unit, "s");
        let Some(metric::Data::Histogram(h)) = &h.data else {
            panic!("not a histogram")
        };
        let p = &h.data_points[0];
        assert_eq!(p.explicit_bounds, vec![2f64.powi(-10), 0.0625]);
        assert_eq!(p.bucket_counts, vec![2, 10, 0]);
        assert_eq!((p.count, p.sum), (12, Some(0.5)));
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
    fn semantic_convention_attributes() {
        let a = |label: &str, value: &str| {
            let kv = attribute(label, value);
            (kv.key, kv.value.unwrap().value.unwrap())
        };
        assert_eq!(a("pod", "web-1"), ("k8s.pod.name".into(), text("web-1")));
        assert_eq!(
            a("namespace", "prod"),
            ("k8s.namespace.name".into(), text("prod"))
        );
        assert_eq!(
            a("container", "app"),
            ("k8s.container.name".into(), text("app"))
        );
        assert_eq!(a("pod_uid", "u"), ("k8s.pod.uid".into(), text("u")));
        assert_eq!(a("container_id", "c"), ("container.id".into(), text("c")));
        assert_eq!(
            a("pid", "42"),
            ("process.pid".into(), any_value::Value::IntValue(42))
        );
        assert_eq!(a("errno", "ENOENT"), ("error.type".into(), text("ENOENT")));
        assert_eq!(
            a("cgroup", "other"),
            ("process.linux.cgroup".into(), text("other"))
        );
        assert_eq!(a("device", "sda"), ("device".into(), text("sda")));
    }

    /// The kernel's buckets as an exponential histogram: scale -1 (the native schema), OTLP
    /// index = native index - 1, counts per bucket equal to the classic buckets' differences.
    #[test]
    fn exponential_histograms_are_the_native_buckets() {
        let mut c = Converter::new(
            &[],
            UNIX_EPOCH,
            Conversion {
                histograms: HistogramAggregation::Base2Exponential,
                ..Conversion::default()
            },
        );
        let r = c.convert(&families(1), UNIX_EPOCH + Duration::from_secs(1));
        let Some(metric::Data::ExponentialHistogram(h)) =
            &metric(&r, "sysscope_syscall_duration_seconds").data
        else {
            panic!("not an exponential histogram")
        };
        let p = &h.data_points[0];
        assert_eq!(
            (p.scale, p.zero_count, p.count, p.sum),
            (-1, 0, 12, Some(0.5))
        );
        assert_eq!(p.zero_threshold, 2f64.powi(-20));
        let b = p.positive.as_ref().unwrap();
        // Native -5 is (4^-6, 4^-5]: OTLP's (4^-6, 4^-5] is index -6.
        assert_eq!(b.offset, -6);
        assert_eq!(b.bucket_counts, vec![2, 0, 0, 10]);
        assert_eq!(p.exemplars.len(), 1);
    }

    #[test]
    fn delta_and_lowmemory_temporality() {
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        for (temporality, delta_sums) in
            [(Temporality::Delta, true), (Temporality::LowMemory, false)]
        {
            for histograms in [
                HistogramAggregation::ExplicitBucket,
                HistogramAggregation::Base2Exponential,
            ] {
                let mut c = Converter::new(
                    &[],
                    t(100),
                    Conversion {
                        temporality,
                        histograms,
                    },
                );
                c.convert(&families(1), t(200));
                // Three times the counts at the next push: the delta is twice the first.
                let r = c.convert(&families(3), t(300));
                let Some(metric::Data::Sum(sum)) = &metric(&r, "sysscope_syscalls").data else {
                    panic!()
                };
                let p = &sum.data_points[0];
                let (value, start, kind) = if delta_sums {
                    (24.0, 200, AggregationTemporality::Delta)
                } else {
                    (36.0, 100, AggregationTemporality::Cumulative)
                };
                assert_eq!(p.value, Some(number_data_point::Value::AsDouble(value)));
                assert_eq!(p.start_time_unix_nano, start * 1_000_000_000);
                assert_eq!(sum.aggregation_temporality, kind as i32);
                // Histograms are delta in both delta and lowmemory: (temporality, count, sum,
                // bucket counts, start) of either form.
                let (temporality, count, sum, buckets, start) =
                    match &metric(&r, "sysscope_syscall_duration_seconds").data {
                        Some(metric::Data::Histogram(h)) => {
                            let p = &h.data_points[0];
                            let start = Some(p.start_time_unix_nano);
                            (
                                h.aggregation_temporality,
                                p.count,
                                p.sum,
                                p.bucket_counts.clone(),
                                start,
                            )
                        }
                        Some(metric::Data::ExponentialHistogram(h)) => {
                            let p = &h.data_points[0];
                            let buckets = p.positive.as_ref().unwrap().bucket_counts.clone();
                            (h.aggregation_temporality, p.count, p.sum, buckets, None)
                        }
                        other => panic!("{other:?}"),
                    };
                assert_eq!(temporality, AggregationTemporality::Delta as i32);
                assert_eq!((count, sum), (24, Some(1.0)));
                if histograms == HistogramAggregation::ExplicitBucket {
                    assert_eq!(buckets, vec![4, 20, 0]);
                    assert_eq!(start, Some(200_000_000_000));
                } else {
                    assert_eq!(buckets, vec![4, 0, 0, 20]);
                }
                // Reset (fewer counts): the delta is the whole new value, from the last push.
                let r = c.convert(&families(1), t(400));
                let Some(metric::Data::Sum(sum)) = &metric(&r, "sysscope_syscalls").data else {
                    panic!()
                };
                assert_eq!(
                    sum.data_points[0].value,
                    Some(number_data_point::Value::AsDouble(12.0))
                );
                assert_eq!(sum.data_points[0].start_time_unix_nano, 300_000_000_000);
            }
        }
    }

    /// A push that did not arrive is carried by the next one: its delta starts where the last
    /// delivered push ended.
    #[test]
    fn an_undelivered_delta_is_carried_by_the_next_push() {
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        let conversion = Conversion {
            temporality: Temporality::Delta,
            ..Conversion::default()
        };
        let mut c = Converter::new(&[], t(100), conversion);
        // The sum a push carries and the second its delta starts at.
        let sum = |r: &ExportMetricsServiceRequest| {
            let Some(metric::Data::Sum(sum)) = &metric(r, "sysscope_syscalls").data else {
                panic!()
            };
            let p = &sum.data_points[0];
            match p.value {
                Some(number_data_point::Value::AsDouble(v)) => {
                    (v, p.start_time_unix_nano / 1_000_000_000)
                }
                other => panic!("{other:?}"),
            }
        };
        c.convert(&[counter(12.0)], t(200));
        c.delivered(true);
        c.convert(&[counter(36.0)], t(300));
        c.delivered(false);
        assert_eq!(sum(&c.convert(&[counter(48.0)], t(400))), (36.0, 200));
        c.delivered(true);
        assert_eq!(sum(&c.convert(&[counter(50.0)], t(500))), (2.0, 400));
    }

    #[test]
    fn start_times_follow_resets_and_new_series() {
        let started = UNIX_EPOCH + Duration::from_secs(100);
        let mut c = Converter::new(&[], started, Conversion::default());
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        let start_of = |r: &ExportMetricsServiceRequest| {
            let Some(metric::Data::Sum(sum)) = &metric(r, "sysscope_syscalls").data else {
                panic!()
            };
            sum.data_points[0].start_time_unix_nano
        };
        assert_eq!(
            start_of(&c.convert(&[counter(12.0)], t(200))),
            100_000_000_000
        );
        assert_eq!(
            start_of(&c.convert(&[counter(12.0)], t(300))),
            100_000_000_000
        );
        // Went backwards: re-created after the previous push.
        assert_eq!(
            start_of(&c.convert(&[counter(3.0)], t(400))),
            300_000_000_000
        );
        // Gone, then back: starts at the push before it came back.
        c.convert(&[], t(500));
        assert_eq!(c.tracked_series(), 0);
        assert_eq!(
            start_of(&c.convert(&[counter(12.0)], t(600))),
            500_000_000_000
        );
    }

    #[test]
    fn json_bodies_follow_the_otlp_json_mapping() {
        let mut c = sysscope_converter();
        let r = c.convert(&families(1), UNIX_EPOCH + Duration::from_secs(200));
        let Ready::Http {
            body, content_type, ..
        } = Ready::new(r.clone(), Protocol::HttpJson, false)
        else {
            panic!("an OTLP/HTTP request made ready as gRPC")
        };
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
        assert_eq!(
            h["explicitBounds"],
            serde_json::json!([2f64.powi(-10), 0.0625])
        );
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
