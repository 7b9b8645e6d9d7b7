//! The `[otlp]` section of the config file, and the OTLP export settings resolved from it and
//! the standard OpenTelemetry environment variables: one resolver ([`Settings::resolve`]) for
//! both, which also validates the section at load (every key it sets is checked, with the key
//! named, whether or not an endpoint is set yet).
//!
//! A signal (traces, metrics) is exported only when an endpoint is set for it
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`, or
//! `otlp.endpoint` / `otlp.traces_endpoint` / `otlp.metrics_endpoint`), so the default is no
//! network traffic at all. Resolution follows the OTLP exporter specification:
//! signal-specific settings win over the generic ones; with HTTP the generic endpoint gets
//! `/v1/traces` or `/v1/metrics` appended while a signal-specific one is used as is.
//!
//! Precedence is per setting: every `[otlp]` key stands for one `OTEL_*` variable
//! ([`OtlpConfig::variables`]); when that variable is set (non-empty) in the environment it
//! wins, otherwise the file's value is used, otherwise the default. Invalid values are errors
//! naming the variable or the key, not silent defaults. Certificate files are read here, once,
//! at start-up, so a missing or malformed file is an error naming the file and the setting.
//!
//! This file holds the section and its variables; `resolve.rs` the resolver, `values.rs` the
//! parsing of list, header and resource values.

use std::{collections::BTreeMap, collections::HashMap, time::Duration};

use http::header::{HeaderMap, HeaderName, HeaderValue};
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use serde::{Deserialize, Serialize};

mod resolve;
mod values;

use resolve::*;
use values::*;

/// Transport and encoding of one signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
    /// OTLP/HTTP with the JSON encoding of the protobuf messages.
    HttpJson,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
            Protocol::HttpJson => "http/json",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "grpc" => Some(Protocol::Grpc),
            "http/protobuf" => Some(Protocol::HttpProtobuf),
            "http/json" => Some(Protocol::HttpJson),
            _ => None,
        }
    }

    /// Whether requests go over OTLP/HTTP (either encoding).
    pub(crate) fn is_http(self) -> bool {
        self != Protocol::Grpc
    }
}

/// The contents of a PEM file, read at start-up. `Debug` shows the path only: the file may
/// hold a private key.
#[derive(Clone, PartialEq, Eq)]
pub struct PemFile {
    pub path: String,
    pub pem: Vec<u8>,
}

impl std::fmt::Debug for PemFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PemFile({}, {} bytes)", self.path, self.pem.len())
    }
}

/// TLS of an `https://` endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsSettings {
    /// CA certificates trusted instead of the system roots (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
    pub ca: Option<PemFile>,
    /// Client certificate chain and key for mutual TLS.
    pub client: Option<(PemFile, PemFile)>,
}

/// Where and how one signal is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalSettings {
    /// Full URL: for gRPC the server (`http://host:4317`), for HTTP the request URL.
    pub endpoint: String,
    pub protocol: Protocol,
    /// Checked as HTTP headers when read; gRPC sends them as metadata (their names are
    /// lower-case either way).
    pub headers: HeaderMap,
    /// Timeout of one export request.
    pub timeout: Duration,
    /// Set for `https://` endpoints (and scheme-less gRPC ones that are not insecure).
    pub tls: Option<TlsSettings>,
    /// Request bodies gzip-compressed (`OTEL_EXPORTER_OTLP_COMPRESSION=gzip`).
    pub gzip: bool,
}

/// Everything the OTLP exporters need.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub traces: Option<SignalSettings>,
    pub metrics: Option<SignalSettings>,
    /// Resource attributes: `service.name`, `service.version`, `host.name`, `k8s.node.name`,
    /// plus `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource: Vec<(String, String)>,
    /// `OTEL_BSP_SCHEDULE_DELAY`: longest wait before a partial batch of spans is sent.
    pub(crate) schedule_delay: Duration,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`: spans per export request at most.
    pub(crate) max_batch: usize,
    /// `OTEL_METRIC_EXPORT_INTERVAL`: time between two metric pushes.
    pub metric_interval: Duration,
    /// `OTEL_METRIC_EXPORT_TIMEOUT`: time one push may take, retries included.
    pub metric_export_timeout: Duration,
    /// `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`.
    pub metric_temporality: Temporality,
    /// `OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`.
    pub metric_histograms: HistogramAggregation,
}

/// The aggregation temporality preference of the metrics push, as the OpenTelemetry exporter
/// specification defines it per instrument kind. sysscope's counters are read from the kernel
/// (observed cumulative values: asynchronous counters) and its histograms are histograms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Temporality {
    /// Everything cumulative.
    #[default]
    Cumulative,
    /// Counters and histograms as deltas since the previous push.
    Delta,
    /// Histograms as deltas, counters (asynchronous) cumulative.
    LowMemory,
}

impl Temporality {
    fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cumulative" => Some(Self::Cumulative),
            "delta" => Some(Self::Delta),
            "lowmemory" => Some(Self::LowMemory),
            _ => None,
        }
    }

    /// Whether monotonic sums are sent as deltas.
    pub fn delta_sums(self) -> bool {
        self == Self::Delta
    }

    /// Whether histograms are sent as deltas.
    pub fn delta_histograms(self) -> bool {
        self != Self::Cumulative
    }
}

/// How the duration histograms are pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HistogramAggregation {
    /// Explicit bounds: the classic buckets.
    #[default]
    ExplicitBucket,
    /// Base-2 exponential buckets: the kernel's, at scale 0 (`log2`) or -1 (`log4`).
    Base2Exponential,
}

impl HistogramAggregation {
    fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "explicit_bucket_histogram" => Some(Self::ExplicitBucket),
            "base2_exponential_bucket_histogram" => Some(Self::Base2Exponential),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// `setting` is "environment variable OTEL_..." or "config key otlp....".
    #[error("{setting}=`{value}`: {problem}")]
    Invalid {
        setting: String,
        value: String,
        problem: String,
    },
    #[error("{setting}: file `{path}`: {problem}")]
    File {
        setting: String,
        path: String,
        problem: String,
    },
}

impl SettingsError {
    /// The setting named without its kind (`otlp.timeout` for "config key otlp.timeout"), and
    /// what is wrong with its value.
    fn key_and_problem(&self) -> (String, String) {
        let (setting, problem) = match self {
            SettingsError::Invalid {
                setting,
                value,
                problem,
            } => (setting, format!("`{value}`: {problem}")),
            SettingsError::File {
                setting,
                path,
                problem,
            } => (setting, format!("file `{path}`: {problem}")),
        };
        let key = setting.strip_prefix("config key ").unwrap_or(setting);
        (key.to_string(), problem)
    }
}

/// A value and the setting it came from (named in errors).
#[derive(Debug, Clone)]
struct Found {
    setting: String,
    value: String,
}

fn invalid(found: &Found, problem: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        setting: found.setting.clone(),
        value: found.value.clone(),
        problem: problem.into(),
    }
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy)]
struct Signal {
    upper: &'static str,
    path: &'static str,
}

const TRACES: Signal = Signal {
    upper: "TRACES",
    path: "/v1/traces",
};
const METRICS: Signal = Signal {
    upper: "METRICS",
    path: "/v1/metrics",
};

// ---------------------------------------------------------------------------------------------
// The `[otlp]` section of the config file.

/// `[otlp]` in the config file: the same settings as the `OTEL_*` variables, which win when
/// set. Durations are written like "10s" or "500ms"; every key is optional, and unset keys take
/// the matching `OTEL_*` variable, or the OTLP default (docs/spans.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpConfig {
    /// Base URL for both signals (`OTEL_EXPORTER_OTLP_ENDPOINT`), e.g.
    /// "https://otel-collector:4318"; with HTTP, `/v1/traces` and `/v1/metrics` are appended.
    #[schemars(example = "http://otel-collector:4318")]
    pub endpoint: Option<String>,
    /// URL of the traces, used as is (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    #[schemars(example = "http://tempo:4318/v1/traces")]
    pub(crate) traces_endpoint: Option<String>,
    /// URL of the metrics, used as is (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`).
    #[schemars(example = "http://otel-collector:4318/v1/metrics")]
    pub(crate) metrics_endpoint: Option<String>,
    /// "grpc", "http/protobuf" (the default) or "http/json" (`OTEL_EXPORTER_OTLP_PROTOCOL`).
    #[schemars(
        example = "http/protobuf",
        extend("enum" = ["grpc", "http/protobuf", "http/json"])
    )]
    pub protocol: Option<String>,
    /// Headers (HTTP) or metadata (gRPC) of every request (`OTEL_EXPORTER_OTLP_HEADERS`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(example = [("authorization", "Bearer ...")].into_iter().collect::<BTreeMap<_, _>>())]
    pub headers: BTreeMap<String, String>,
    /// Timeout of one request (`OTEL_EXPORTER_OTLP_TIMEOUT`), default "10s".
    #[schemars(example = "10s", extend("x-type" = "duration", "x-min" = "1ms"))]
    pub timeout: Option<String>,
    /// A scheme-less gRPC endpoint is plain text when true (`OTEL_EXPORTER_OTLP_INSECURE`).
    #[schemars(example = false)]
    pub(crate) insecure: Option<bool>,
    /// `gzip` or `none` (`OTEL_EXPORTER_OTLP_COMPRESSION`), default none.
    #[schemars(example = &"gzip", extend("enum" = ["gzip", "none"]))]
    pub(crate) compression: Option<String>,
    /// PEM file of the CA certificates that sign the collector's certificate, trusted instead
    /// of the system roots (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
    #[schemars(example = "/etc/sysscope/ca.pem", extend("x-constraint" = "a readable file"))]
    pub certificate: Option<String>,
    /// PEM file of the client certificate chain for mutual TLS
    /// (`OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`).
    #[schemars(
        example = "/etc/sysscope/client.pem",
        extend("x-constraint" = "a readable file; set with otlp.client_key")
    )]
    pub(crate) client_certificate: Option<String>,
    /// PEM file of the client's private key (`OTEL_EXPORTER_OTLP_CLIENT_KEY`).
    #[schemars(
        example = "/etc/sysscope/client-key.pem",
        extend("x-constraint" = "a readable file; set with otlp.client_certificate")
    )]
    pub client_key: Option<String>,
    /// `service.name` (`OTEL_SERVICE_NAME`), default "sysscope".
    #[schemars(example = &"sysscope", length(min = 1))]
    pub service_name: Option<String>,
    /// More resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(
        example = [("deployment.environment", "production")].into_iter().collect::<BTreeMap<_, _>>()
    )]
    pub resource_attributes: BTreeMap<String, String>,
    /// Exports spans when an endpoint is set; false turns them off (`OTEL_TRACES_EXPORTER`).
    #[schemars(example = true)]
    pub traces: Option<bool>,
    /// Pushes metrics when an endpoint is set; false turns them off (`OTEL_METRICS_EXPORTER`).
    #[schemars(example = true)]
    pub metrics: Option<bool>,
    /// Time between two metric pushes (`OTEL_METRIC_EXPORT_INTERVAL`), default "60s".
    #[schemars(example = "60s", extend("x-type" = "duration", "x-min" = "100ms"))]
    pub(crate) metrics_interval: Option<String>,
    /// Time one push may take, retries included (`OTEL_METRIC_EXPORT_TIMEOUT`), default "30s".
    #[schemars(example = "30s", extend("x-type" = "duration", "x-min" = "1ms"))]
    pub(crate) metrics_timeout: Option<String>,
    /// "cumulative" (the default), "delta" or "lowmemory"
    /// (`OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`).
    #[schemars(
        example = &"cumulative",
        extend("enum" = ["cumulative", "delta", "lowmemory"])
    )]
    pub(crate) metrics_temporality: Option<String>,
    /// "explicit_bucket_histogram" (the default) or "base2_exponential_bucket_histogram"
    /// (`OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`).
    #[schemars(
        example = &"explicit_bucket_histogram",
        extend("enum" = ["explicit_bucket_histogram", "base2_exponential_bucket_histogram"])
    )]
    pub(crate) metrics_histogram_aggregation: Option<String>,
    /// Longest wait before a partial batch of spans is sent (`OTEL_BSP_SCHEDULE_DELAY`),
    /// default "5s".
    #[schemars(example = "5s", extend("x-type" = "duration", "x-min" = "1ms"))]
    pub span_batch_delay: Option<String>,
    /// Spans per export request at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`), default 512.
    #[schemars(example = 512, range(min = 1, max = 100_000))]
    pub(crate) span_batch_size: Option<usize>,
}

/// What `key=value,...` lists (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_RESOURCE_ATTRIBUTES`)
/// percent-encode in a value: the separators, `%` itself, and what is not printable ASCII.
const VALUE_ESCAPES: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b',');

fn key_values(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{}={}", k.trim(), utf8_percent_encode(v, VALUE_ESCAPES)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A duration key in the milliseconds of its variable; at least `min`.
fn millis(key: &str, value: &str, min: Duration) -> Result<String, SettingsError> {
    let error = |problem: String| SettingsError::Invalid {
        setting: format!("config key {key}"),
        value: value.to_string(),
        problem,
    };
    let d = crate::util::duration::parse(value).map_err(error)?;
    if d < min {
        return Err(error(format!(
            "too short (at least {})",
            crate::util::duration::format(&min)
        )));
    }
    Ok(d.as_millis().to_string())
}

impl OtlpConfig {
    /// Checks every key that is set: the checks only a file can fail (header names, empty
    /// names, certificate files that cannot be opened or come without their pair), then the
    /// resolver over the file alone. The error is (key, problem).
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        for (name, value) in &self.headers {
            let key = format!("otlp.headers.{name}");
            if name.trim().is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b))
            {
                return Err((key, format!("`{name}` is not a valid header name")));
            }
            if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                return Err((key, "the value holds control characters".into()));
            }
        }
        for (key, path) in [
            ("otlp.certificate", &self.certificate),
            ("otlp.client_certificate", &self.client_certificate),
            ("otlp.client_key", &self.client_key),
        ] {
            if let Some(path) = path {
                if path.trim().is_empty() {
                    return Err((key.into(), "must name a PEM file".into()));
                }
                if let Err(e) = std::fs::File::open(path.trim()) {
                    return Err((key.into(), format!("cannot read `{path}`: {e}")));
                }
            }
        }
        match (&self.client_certificate, &self.client_key) {
            (Some(_), None) => {
                return Err((
                    "otlp.client_key".into(),
                    "must be set with otlp.client_certificate".into(),
                ))
            }
            (None, Some(_)) => {
                return Err((
                    "otlp.client_certificate".into(),
                    "must be set with otlp.client_key".into(),
                ))
            }
            _ => {}
        }
        if self
            .service_name
            .as_ref()
            .is_some_and(|s| s.trim().is_empty())
        {
            return Err(("otlp.service_name".into(), "must not be empty".into()));
        }
        let file = self.lookup().map_err(|e| e.key_and_problem())?;
        Settings::resolve_with(&|k| file(k), None, "", Check::EverySetting)
            .map(drop)
            .map_err(|e| e.key_and_problem())
    }

    /// Every key that is set, as (the `OTEL_*` variable it stands for, the key, the value in
    /// the variable's format: durations in milliseconds, maps as `key=value,...`). A duration
    /// that does not parse, or is below its variable's minimum, is an error naming the key.
    pub fn variables(&self) -> Result<Vec<(&'static str, &'static str, String)>, SettingsError> {
        const MS: Duration = Duration::from_millis(1);
        let ms = |key: &'static str, d: &Option<String>, min: Duration| {
            d.as_ref().map(|d| millis(key, d, min)).transpose()
        };
        let exporter = |on: bool| if on { "otlp" } else { "none" }.to_string();
        let all = [
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "otlp.endpoint",
                self.endpoint.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "otlp.traces_endpoint",
                self.traces_endpoint.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                "otlp.metrics_endpoint",
                self.metrics_endpoint.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "otlp.protocol",
                self.protocol.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "otlp.headers",
                (!self.headers.is_empty()).then(|| key_values(&self.headers)),
            ),
            (
                "OTEL_EXPORTER_OTLP_TIMEOUT",
                "otlp.timeout",
                ms("otlp.timeout", &self.timeout, MS)?,
            ),
            (
                "OTEL_EXPORTER_OTLP_COMPRESSION",
                "otlp.compression",
                self.compression.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_INSECURE",
                "otlp.insecure",
                self.insecure.map(|b| b.to_string()),
            ),
            (
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
                "otlp.certificate",
                self.certificate.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                "otlp.client_certificate",
                self.client_certificate.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                "otlp.client_key",
                self.client_key.clone(),
            ),
            (
                "OTEL_SERVICE_NAME",
                "otlp.service_name",
                self.service_name.clone(),
            ),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "otlp.resource_attributes",
                (!self.resource_attributes.is_empty())
                    .then(|| key_values(&self.resource_attributes)),
            ),
            (
                "OTEL_TRACES_EXPORTER",
                "otlp.traces",
                self.traces.map(exporter),
            ),
            (
                "OTEL_METRICS_EXPORTER",
                "otlp.metrics",
                self.metrics.map(exporter),
            ),
            (
                "OTEL_METRIC_EXPORT_INTERVAL",
                "otlp.metrics_interval",
                ms(
                    "otlp.metrics_interval",
                    &self.metrics_interval,
                    Duration::from_millis(100),
                )?,
            ),
            (
                "OTEL_METRIC_EXPORT_TIMEOUT",
                "otlp.metrics_timeout",
                ms("otlp.metrics_timeout", &self.metrics_timeout, MS)?,
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                "otlp.metrics_temporality",
                self.metrics_temporality.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                "otlp.metrics_histogram_aggregation",
                self.metrics_histogram_aggregation.clone(),
            ),
            (
                "OTEL_BSP_SCHEDULE_DELAY",
                "otlp.span_batch_delay",
                ms("otlp.span_batch_delay", &self.span_batch_delay, MS)?,
            ),
            (
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                "otlp.span_batch_size",
                self.span_batch_size.map(|n| n.to_string()),
            ),
        ];
        Ok(all
            .into_iter()
            .filter_map(|(var, key, value)| Some((var, key, value?)))
            .collect())
    }

    /// The file's settings as a variable lookup (each found under its key).
    fn lookup(&self) -> Result<impl Fn(&str) -> Option<Found>, SettingsError> {
        let from_file: HashMap<&'static str, (&'static str, String)> = self
            .variables()?
            .into_iter()
            .map(|(var, key, value)| (var, (key, value)))
            .collect();
        Ok(move |k: &str| {
            from_file.get(k).map(|(key, v)| Found {
                setting: format!("config key {key}"),
                value: v.clone(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The headers as (name, value), sorted by name.
    fn pairs(headers: &HeaderMap) -> Vec<(String, String)> {
        let value = |v: &HeaderValue| v.to_str().unwrap().to_string();
        let mut pairs: Vec<_> = (headers.iter().map(|(k, v)| (k.to_string(), value(v)))).collect();
        pairs.sort();
        pairs
    }

    /// Resolves the settings from environment variables only (empty values count as unset).
    fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::resolve(
            &OtlpConfig::default(),
            |k| map.get(k).cloned(),
            None,
            "node-1",
        )
    }

    #[test]
    fn nothing_configured_means_nothing_sent() {
        let s = settings(&[]).unwrap();
        assert!(!s.any());
        assert_eq!(s.service_name(), "sysscope");
        assert!(s.resource.contains(&("host.name".into(), "node-1".into())));
        assert_eq!(s.schedule_delay, Duration::from_secs(5));
        assert_eq!(s.metric_interval, Duration::from_secs(60));
    }

    #[test]
    fn http_generic_endpoint_gets_signal_paths() {
        let s = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]).unwrap();
        let t = s.traces.unwrap();
        assert_eq!(t.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(t.protocol, Protocol::HttpProtobuf);
        assert_eq!(t.timeout, Duration::from_secs(10));
        assert_eq!(
            s.metrics.unwrap().endpoint,
            "http://collector:4318/v1/metrics"
        );
    }

    #[test]
    fn specific_variables_win_and_are_used_as_is() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:9999/custom"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-a=1,authorization=Bearer%20t",
            ),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-m=2"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap();
        let t = s.traces.unwrap();
        assert_eq!(t.endpoint, "http://b:9999/custom");
        assert_eq!(
            pairs(&t.headers),
            vec![
                ("authorization".to_string(), "Bearer t".to_string()),
                ("x-a".to_string(), "1".to_string())
            ]
        );
        assert_eq!(t.timeout, Duration::from_millis(2500));
        let m = s.metrics.unwrap();
        assert_eq!(
            (m.endpoint.as_str(), m.protocol),
            ("http://a:4318", Protocol::Grpc)
        );
        assert_eq!(
            pairs(&m.headers),
            vec![("x-m".to_string(), "2".to_string())]
        );
    }

    #[test]
    fn grpc_scheme_less_endpoints_follow_insecure() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap();
        let t = s.traces.unwrap();
        assert_eq!(t.endpoint, "https://collector:4317");
        assert_eq!(t.tls, Some(TlsSettings::default()), "system roots");
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_INSECURE", "true"),
        ])
        .unwrap();
        assert_eq!(s.traces.unwrap().endpoint, "http://collector:4317");
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (vars, needle) in [
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
                ],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            // Checked as HTTP headers when read, not when the exporter starts.
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "bad name=1"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
                ],
                "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            ),
            (
                vec![
                    ("OTEL_EXPORTER_OTLP_HEADERS", "x=a%0Ab"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:1"),
                ],
                "not a valid header value",
            ),
            (
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![("OTEL_BSP_SCHEDULE_DELAY", "-1")],
                "OTEL_BSP_SCHEDULE_DELAY",
            ),
            (
                vec![("OTEL_TRACES_EXPORTER", "jaeger")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                vec![("OTEL_RESOURCE_ATTRIBUTES", "a=%zz")],
                "OTEL_RESOURCE_ATTRIBUTES",
            ),
        ] {
            let e = settings(&vars).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn signals_can_be_turned_off() {
        let on = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318")];
        let mut v = on.to_vec();
        v.push(("OTEL_METRICS_EXPORTER", "none"));
        let s = settings(&v).unwrap();
        assert!(s.traces.is_some() && s.metrics.is_none());
        let mut v = on.to_vec();
        v.push(("OTEL_SDK_DISABLED", "true"));
        assert!(!settings(&v).unwrap().any());
    }

    #[test]
    fn resource_attributes() {
        let s = settings(&[
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=from-attrs,deployment.environment=prod",
            ),
            ("NODE_NAME", "worker-7"),
        ])
        .unwrap();
        assert_eq!(s.service_name(), "from-attrs");
        assert!(s
            .resource
            .contains(&("deployment.environment".into(), "prod".into())));
        assert!(s
            .resource
            .contains(&("k8s.node.name".into(), "worker-7".into())));
        let s = settings(&[
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs"),
            ("OTEL_SERVICE_NAME", "explicit"),
        ])
        .unwrap();
        assert_eq!(s.service_name(), "explicit");
    }

    // -----------------------------------------------------------------------------------------
    // The config file's [otlp] section, and how it merges with the environment.

    fn file(text: &str) -> OtlpConfig {
        let c: OtlpConfig = toml::from_str(text).unwrap();
        c.validate().unwrap();
        c
    }

    fn merged(file: &OtlpConfig, env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::resolve(file, |k| map.get(k).cloned(), None, "node-1")
    }

    #[test]
    fn compression_is_gzip_or_none_per_signal() {
        let base = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        let s = merged(&OtlpConfig::default(), &base).unwrap();
        assert!(!s.traces.unwrap().gzip && !s.metrics.unwrap().gzip);
        let s = merged(
            &file("compression = \"gzip\""),
            &[base[0], ("OTEL_EXPORTER_OTLP_METRICS_COMPRESSION", "none")],
        )
        .unwrap();
        assert!(s.traces.unwrap().gzip, "the file's key");
        assert!(!s.metrics.unwrap().gzip, "the per-signal variable wins");
        let e = merged(
            &OtlpConfig::default(),
            &[base[0], ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_COMPRESSION") && e.contains("gzip"),
            "{e}"
        );
        let c: OtlpConfig = toml::from_str("compression = \"brotli\"").unwrap();
        assert_eq!(c.validate().unwrap_err().0, "otlp.compression");
    }

    /// A CA certificate, a client certificate and its key, as PEM files in a temporary dir.
    struct Pems {
        _dir: tempfile::TempDir,
        ca: String,
        cert: String,
        key: String,
        garbage: String,
    }

    fn pems() -> Pems {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        let client = rcgen::generate_simple_self_signed(vec!["client.test".into()]).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        Pems {
            ca: write("ca.pem", &ca.cert.pem()),
            cert: write("client.pem", &client.cert.pem()),
            key: write("client.key", &client.signing_key.serialize_pem()),
            garbage: write("garbage.pem", "not a certificate\n"),
            _dir: dir,
        }
    }

    #[test]
    fn file_alone_configures_everything() {
        let f = file(
            r#"
endpoint = "http://collector:4318/"
protocol = "http/json"
timeout = "2500ms"
service_name = "from-file"
traces = true
metrics = true
metrics_interval = "15s"
metrics_timeout = "5s"
span_batch_delay = "200ms"
span_batch_size = 64
[headers]
authorization = "Bearer a,b%c"
[resource_attributes]
"deployment.environment" = "prod"
"#,
        );
        let s = merged(&f, &[]).unwrap();
        let t = s.traces.clone().unwrap();
        assert_eq!(t.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(t.protocol, Protocol::HttpJson);
        assert_eq!(t.timeout, Duration::from_millis(2500));
        assert_eq!(t.tls, None);
        assert_eq!(
            pairs(&t.headers),
            vec![("authorization".to_string(), "Bearer a,b%c".to_string())],
            "values survive the key=value form"
        );
        assert_eq!(
            s.metrics.as_ref().unwrap().endpoint,
            "http://collector:4318/v1/metrics"
        );
        assert_eq!(s.service_name(), "from-file");
        assert!(s
            .resource
            .contains(&("deployment.environment".into(), "prod".into())));
        assert_eq!(s.metric_interval, Duration::from_secs(15));
        assert_eq!(s.metric_export_timeout, Duration::from_secs(5));
        assert_eq!(s.schedule_delay, Duration::from_millis(200));
        assert_eq!(s.max_batch, 64);
    }

    #[test]
    fn environment_wins_over_the_file_per_setting() {
        let f = file(
            r#"
endpoint = "http://from-file:4318"
protocol = "grpc"
timeout = "3s"
service_name = "from-file"
metrics = false
span_batch_size = 64
[headers]
x-file = "1"
"#,
        );
        let s = merged(
            &f,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://from-env:4317"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-env=2"),
                ("OTEL_SERVICE_NAME", "from-env"),
                // Empty counts as unset: the file's value stays.
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", ""),
            ],
        )
        .unwrap();
        let t = s.traces.clone().unwrap();
        assert_eq!(t.endpoint, "http://from-env:4317");
        assert_eq!(t.protocol, Protocol::Grpc, "the file's protocol");
        assert_eq!(t.timeout, Duration::from_secs(3), "the file's timeout");
        assert_eq!(
            pairs(&t.headers),
            vec![("x-env".to_string(), "2".to_string())]
        );
        assert_eq!(s.service_name(), "from-env");
        assert_eq!(s.max_batch, 64);
        assert!(s.metrics.is_none(), "metrics = false in the file");
        // The environment can turn a signal back on that the file turned off.
        let s = merged(&f, &[("OTEL_METRICS_EXPORTER", "otlp")]).unwrap();
        assert_eq!(s.metrics.unwrap().endpoint, "http://from-file:4318");
        // Defaults stay where neither says anything.
        let s = merged(&OtlpConfig::default(), &[]).unwrap();
        assert!(!s.any());
        assert_eq!(s.max_batch, 512);
    }

    #[test]
    fn signal_specific_settings_win_over_generic_ones_across_layers() {
        // A signal-specific file key is more specific than a generic variable: each key
        // stands for its own variable, and OTEL_EXPORTER_OTLP_TRACES_ENDPOINT wins over
        // OTEL_EXPORTER_OTLP_ENDPOINT whichever layer either comes from.
        let f = file("traces_endpoint = \"http://traces-from-file:4318/t\"\n");
        let s = merged(&f, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318")]).unwrap();
        assert_eq!(s.traces.unwrap().endpoint, "http://traces-from-file:4318/t");
        assert_eq!(s.metrics.unwrap().endpoint, "http://env:4318/v1/metrics");
        let s = merged(
            &f,
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://env:1/x")],
        )
        .unwrap();
        assert_eq!(s.traces.unwrap().endpoint, "http://env:1/x");
        assert!(s.metrics.is_none());
    }

    #[test]
    fn errors_from_the_file_name_the_key() {
        // Only reachable for values validate() cannot judge alone, e.g. http/json with a
        // gRPC-only scheme-less endpoint given by the environment's protocol.
        let f = file("endpoint = \"collector:4317\"\nprotocol = \"grpc\"\n");
        let e = merged(&f, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("config key otlp.endpoint"), "{e}");
        let e = merged(&f, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("environment variable OTEL_EXPORTER_OTLP_PROTOCOL"),
            "{e}"
        );
    }

    #[test]
    fn every_invalid_key_is_named() {
        let p = pems();
        let missing = "/nonexistent/ca.pem";
        for (text, key, needle) in [
            ("protocol = \"udp\"", "otlp.protocol", "udp"),
            ("endpoint = \"ftp://a:1\"", "otlp.endpoint", "scheme"),
            ("endpoint = \"http://\"", "otlp.endpoint", "no host"),
            ("endpoint = \"\"", "otlp.endpoint", "empty"),
            ("endpoint = \"a:4318\"", "otlp.endpoint", "no scheme"),
            (
                "endpoint = \"http://a b:4318\"",
                "otlp.endpoint",
                "not a URL",
            ),
            (
                "traces_endpoint = \"https:///x\"",
                "otlp.traces_endpoint",
                "no host",
            ),
            (
                "metrics_endpoint = \"tcp://a:1\"",
                "otlp.metrics_endpoint",
                "scheme",
            ),
            (
                "headers = { \"bad name\" = \"1\" }",
                "otlp.headers.bad name",
                "header name",
            ),
            ("headers = { x = \"a\\nb\" }", "otlp.headers.x", "control"),
            ("timeout = \"soon\"", "otlp.timeout", "soon"),
            ("timeout = \"0s\"", "otlp.timeout", "too short"),
            (
                &format!("certificate = \"{missing}\""),
                "otlp.certificate",
                missing,
            ),
            ("certificate = \" \"", "otlp.certificate", "PEM file"),
            (
                &format!("client_certificate = \"{}\"", p.cert),
                "otlp.client_key",
                "otlp.client_certificate",
            ),
            (
                &format!("client_key = \"{}\"", p.key),
                "otlp.client_certificate",
                "otlp.client_key",
            ),
            (
                &format!(
                    "client_certificate = \"{}\"\nclient_key = \"{missing}\"",
                    p.cert
                ),
                "otlp.client_key",
                missing,
            ),
            ("service_name = \" \"", "otlp.service_name", "empty"),
            (
                "resource_attributes = { \"\" = \"x\" }",
                "otlp.resource_attributes",
                "empty",
            ),
            (
                "metrics_interval = \"10ms\"",
                "otlp.metrics_interval",
                "too short",
            ),
            ("metrics_timeout = \"5\"", "otlp.metrics_timeout", "unit"),
            ("span_batch_delay = \"1x\"", "otlp.span_batch_delay", "unit"),
            (
                "span_batch_size = 0",
                "otlp.span_batch_size",
                "out of range",
            ),
            (
                "span_batch_size = 100001",
                "otlp.span_batch_size",
                "out of range",
            ),
        ] {
            let c: OtlpConfig = toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let (k, problem) = c.validate().expect_err(text);
            assert_eq!(k, key, "{text}: {problem}");
            assert!(problem.contains(needle), "{text}: {problem}");
        }
        // A scheme-less endpoint is fine for gRPC.
        file("endpoint = \"collector:4317\"\nprotocol = \"grpc\"\n");
        // Every setting is checked at load, with or without an endpoint.
        let c: OtlpConfig = toml::from_str("compression = \"zstd\"\ntraces = false").unwrap();
        assert_eq!(c.validate().unwrap_err().0, "otlp.compression");
        // Unknown keys are refused.
        assert!(toml::from_str::<OtlpConfig>("endpint = \"http://a:1\"").is_err());
    }

    #[test]
    fn tls_settings_come_from_either_layer_and_bad_files_are_named() {
        let p = pems();
        // https with the system roots.
        let s = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]).unwrap();
        assert_eq!(s.traces.unwrap().tls, Some(TlsSettings::default()));
        // CA and client identity from the file.
        let f = file(&format!(
            "endpoint = \"https://c:4318\"\ncertificate = \"{}\"\nclient_certificate = \"{}\"\nclient_key = \"{}\"\n",
            p.ca, p.cert, p.key
        ));
        let s = merged(&f, &[]).unwrap();
        let tls = s.traces.unwrap().tls.unwrap();
        assert_eq!(tls.ca.as_ref().unwrap().path, p.ca);
        let (cert, key) = tls.client.unwrap();
        assert_eq!(
            (cert.path.as_str(), key.path.as_str()),
            (p.cert.as_str(), p.key.as_str())
        );
        assert!(
            !format!("{key:?}").contains("PRIVATE"),
            "keys stay out of logs"
        );
        // A signal-specific variable wins for its signal only.
        let s = merged(
            &f,
            &[("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE", p.cert.as_str())],
        )
        .unwrap();
        assert_eq!(s.metrics.unwrap().tls.unwrap().ca.unwrap().path, p.cert);
        assert_eq!(s.traces.unwrap().tls.unwrap().ca.unwrap().path, p.ca);
        // Plain http: certificates do not apply.
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", p.ca.as_str()),
        ])
        .unwrap();
        assert_eq!(s.traces.unwrap().tls, None);

        let https = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318");
        for (vars, needles) in [
            (
                vec![
                    https,
                    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
                ],
                vec![
                    "OTEL_EXPORTER_OTLP_CERTIFICATE",
                    "/nonexistent/ca.pem",
                    "cannot read",
                ],
            ),
            (
                vec![
                    https,
                    ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", p.garbage.as_str()),
                ],
                vec![
                    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                    p.garbage.as_str(),
                    "no PEM certificate",
                ],
            ),
            (
                vec![
                    https,
                    ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", p.cert.as_str()),
                    ("OTEL_EXPORTER_OTLP_CLIENT_KEY", p.ca.as_str()),
                ],
                vec![
                    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
                    p.ca.as_str(),
                    "private key",
                ],
            ),
            (
                vec![
                    https,
                    ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", p.cert.as_str()),
                ],
                vec!["OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "CLIENT_KEY"],
            ),
            (
                vec![https, ("OTEL_EXPORTER_OTLP_CLIENT_KEY", p.key.as_str())],
                vec!["OTEL_EXPORTER_OTLP_CLIENT_KEY", "CLIENT_CERTIFICATE"],
            ),
        ] {
            let e = settings(&vars).unwrap_err().to_string();
            for n in needles {
                assert!(e.contains(n), "{n} not in: {e}");
            }
        }
        // A file that disappeared between load and start-up is named with its key.
        let f = OtlpConfig {
            endpoint: Some("https://c:4318".into()),
            certificate: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        };
        let e = merged(&f, &[]).unwrap_err().to_string();
        assert!(
            e.contains("config key otlp.certificate") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
    }

    #[test]
    fn temporality_and_histogram_aggregation() {
        let s = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318")]).unwrap();
        assert_eq!(
            (s.metric_temporality, s.metric_histograms),
            (
                Temporality::Cumulative,
                HistogramAggregation::ExplicitBucket
            )
        );
        // Case-insensitive, as the specification's enum values are.
        let s = settings(&[
            (
                "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                "LowMemory",
            ),
            (
                "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                "base2_exponential_bucket_histogram",
            ),
        ])
        .unwrap();
        assert_eq!(s.metric_temporality, Temporality::LowMemory);
        assert!(s.metric_temporality.delta_histograms() && !s.metric_temporality.delta_sums());
        assert_eq!(s.metric_histograms, HistogramAggregation::Base2Exponential);
        let e = settings(&[(
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
            "sometimes",
        )])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE")
                && e.contains("lowmemory"),
            "{e}"
        );
        // The file's keys, and the environment over them.
        let f = file("metrics_temporality = \"delta\"\nmetrics_histogram_aggregation = \"base2_exponential_bucket_histogram\"\n");
        let s = merged(&f, &[]).unwrap();
        assert_eq!(s.metric_temporality, Temporality::Delta);
        assert_eq!(s.metric_histograms, HistogramAggregation::Base2Exponential);
        let s = merged(
            &f,
            &[(
                "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                "cumulative",
            )],
        )
        .unwrap();
        assert_eq!(s.metric_temporality, Temporality::Cumulative);
        let bad: OtlpConfig =
            toml::from_str("metrics_histogram_aggregation = \"exponential\"\n").unwrap();
        let (key, problem) = bad.validate().unwrap_err();
        assert_eq!(key, "otlp.metrics_histogram_aggregation");
        assert!(problem.contains("exponential"), "{problem}");
    }

    #[test]
    fn http_json_is_accepted() {
        let s = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json"),
        ])
        .unwrap();
        let m = s.metrics.unwrap();
        assert_eq!(
            (m.protocol, m.endpoint.as_str()),
            (Protocol::HttpJson, "http://a:4318/v1/metrics")
        );
        assert_eq!(s.traces.unwrap().protocol, Protocol::HttpProtobuf);
    }
}
