//! OTLP export settings from the standard OpenTelemetry environment variables.
//!
//! A signal (traces, metrics) is exported only when an endpoint is set for it
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`), so the
//! default is no network traffic at all. Resolution follows the OTLP exporter specification:
//! signal-specific variables win over the generic ones; with HTTP/protobuf the generic
//! endpoint gets `/v1/traces` or `/v1/metrics` appended while a signal-specific one is used as
//! is. Invalid values are errors naming the variable, not silent defaults.

use std::{collections::HashMap, time::Duration};

/// Transport of one signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// Where and how one signal is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalSettings {
    /// Full URL: for gRPC the server (`http://host:4317`), for HTTP the request URL.
    pub endpoint: String,
    pub protocol: Protocol,
    pub headers: Vec<(String, String)>,
    /// Timeout of one export request.
    pub timeout: Duration,
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
    pub schedule_delay: Duration,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`: spans per export request at most.
    pub max_batch: usize,
    /// `OTEL_METRIC_EXPORT_INTERVAL`: time between two metric pushes.
    pub metric_interval: Duration,
    /// `OTEL_METRIC_EXPORT_TIMEOUT`: time one push may take, retries included.
    pub metric_export_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("environment variable {variable}=`{value}`: {problem}")]
    Invalid {
        variable: String,
        value: String,
        problem: String,
    },
}

fn invalid(variable: &str, value: &str, problem: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        variable: variable.to_string(),
        value: value.to_string(),
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

impl Settings {
    /// Reads the process environment. `node_name` is the configured Kubernetes node name,
    /// used for `k8s.node.name` when `NODE_NAME` is not set.
    pub fn from_env(node_name: Option<&str>) -> Result<Self, SettingsError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        Self::from_vars(|k| vars.get(k).cloned(), node_name, &hostname())
    }

    /// Resolves the settings from a variable lookup (empty values count as unset).
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
        node_name: Option<&str>,
        host_name: &str,
    ) -> Result<Self, SettingsError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let disabled = match get("OTEL_SDK_DISABLED") {
            Some(v) => parse_bool("OTEL_SDK_DISABLED", &v)?,
            None => false,
        };
        let traces_on = exporter_enabled(&get, "OTEL_TRACES_EXPORTER", &["otlp"])?;
        let metrics_on = exporter_enabled(&get, "OTEL_METRICS_EXPORTER", &["otlp", "prometheus"])?
            && get("OTEL_METRICS_EXPORTER").as_deref() != Some("prometheus");
        let traces = if disabled || !traces_on {
            None
        } else {
            signal(&get, TRACES)?
        };
        let metrics = if disabled || !metrics_on {
            None
        } else {
            signal(&get, METRICS)?
        };
        let ms = |name: &str, default: u64, min: u64| -> Result<Duration, SettingsError> {
            match get(name) {
                None => Ok(Duration::from_millis(default)),
                Some(v) => {
                    let n: u64 = v
                        .trim()
                        .parse()
                        .map_err(|_| invalid(name, &v, "expected milliseconds, e.g. 5000"))?;
                    if n < min {
                        return Err(invalid(name, &v, format!("must be at least {min}")));
                    }
                    Ok(Duration::from_millis(n))
                }
            }
        };
        let schedule_delay = ms("OTEL_BSP_SCHEDULE_DELAY", 5000, 1)?;
        let metric_interval = ms("OTEL_METRIC_EXPORT_INTERVAL", 60_000, 100)?;
        let metric_export_timeout = ms("OTEL_METRIC_EXPORT_TIMEOUT", 30_000, 1)?;
        let max_batch = match get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            None => 512,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=100_000).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                        &v,
                        "expected a number of spans from 1 to 100000",
                    ))
                }
            },
        };
        Ok(Self {
            traces,
            metrics,
            resource: resource(&get, node_name, host_name)?,
            schedule_delay,
            max_batch,
            metric_interval,
            metric_export_timeout,
        })
    }

    /// Whether anything is sent to an OTLP endpoint.
    pub fn any(&self) -> bool {
        self.traces.is_some() || self.metrics.is_some()
    }

    /// The `service.name` resource attribute.
    pub fn service_name(&self) -> &str {
        self.resource
            .iter()
            .find_map(|(k, v)| (k == "service.name").then_some(v.as_str()))
            .unwrap_or("sysscope")
    }
}

fn parse_bool(variable: &str, v: &str) -> Result<bool, SettingsError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(variable, v, "expected true or false")),
    }
}

fn exporter_enabled(
    get: &impl Fn(&str) -> Option<String>,
    variable: &str,
    accepted: &[&str],
) -> Result<bool, SettingsError> {
    match get(variable) {
        None => Ok(true),
        Some(v) => {
            let v = v.trim().to_ascii_lowercase();
            if v == "none" {
                Ok(false)
            } else if accepted.contains(&v.as_str()) {
                Ok(true)
            } else {
                Err(invalid(
                    variable,
                    &v,
                    format!("sysscope supports {} or none", accepted.join(", ")),
                ))
            }
        }
    }
}

fn signal(
    get: &impl Fn(&str) -> Option<String>,
    signal: Signal,
) -> Result<Option<SignalSettings>, SettingsError> {
    let specific = |suffix: &str| format!("OTEL_EXPORTER_OTLP_{}_{suffix}", signal.upper);
    let pick = |suffix: &str| -> Option<(String, String)> {
        let name = specific(suffix);
        if let Some(v) = get(&name) {
            return Some((name, v));
        }
        let generic = format!("OTEL_EXPORTER_OTLP_{suffix}");
        get(&generic).map(|v| (generic, v))
    };
    let protocol = match pick("PROTOCOL") {
        None => Protocol::HttpProtobuf,
        Some((var, v)) => match v.trim() {
            "grpc" => Protocol::Grpc,
            "http/protobuf" => Protocol::HttpProtobuf,
            "http/json" => {
                return Err(invalid(
                    &var,
                    &v,
                    "http/json is not supported; use grpc or http/protobuf",
                ))
            }
            _ => return Err(invalid(&var, &v, "expected grpc or http/protobuf")),
        },
    };
    let specific_endpoint = specific("ENDPOINT");
    let (endpoint_var, raw, is_specific) = match get(&specific_endpoint) {
        Some(v) => (specific_endpoint, v, true),
        None => match get("OTEL_EXPORTER_OTLP_ENDPOINT") {
            Some(v) => ("OTEL_EXPORTER_OTLP_ENDPOINT".to_string(), v, false),
            None => return Ok(None),
        },
    };
    let raw = raw.trim().to_string();
    let mut endpoint = if raw.contains("://") {
        raw.clone()
    } else if protocol == Protocol::Grpc {
        // A scheme-less gRPC endpoint is secure unless OTEL_EXPORTER_OTLP_INSECURE says not.
        let insecure = match pick("INSECURE") {
            Some((var, v)) => parse_bool(&var, &v)?,
            None => false,
        };
        format!("{}://{raw}", if insecure { "http" } else { "https" })
    } else {
        return Err(invalid(
            &endpoint_var,
            &raw,
            "expected a URL such as http://otel-collector:4318",
        ));
    };
    if endpoint.starts_with("https://") {
        return Err(invalid(
            &endpoint_var,
            &raw,
            "TLS is not built into this sysscope; send to a collector on the node or in the \
             cluster over http:// (it can forward with TLS), or set OTEL_EXPORTER_OTLP_INSECURE=true \
             for a scheme-less gRPC endpoint",
        ));
    }
    if !endpoint.starts_with("http://") {
        return Err(invalid(&endpoint_var, &raw, "the scheme must be http://"));
    }
    let authority = endpoint["http://".len()..]
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("");
    if authority.is_empty() {
        return Err(invalid(&endpoint_var, &raw, "the URL names no host"));
    }
    if protocol == Protocol::HttpProtobuf && !is_specific {
        endpoint = format!("{}{}", endpoint.trim_end_matches('/'), signal.path);
    }
    let headers = match pick("HEADERS") {
        None => Vec::new(),
        Some((var, v)) => parse_key_values(&v).map_err(|p| invalid(&var, &v, p))?,
    };
    let timeout = match pick("TIMEOUT") {
        None => DEFAULT_TIMEOUT,
        Some((var, v)) => match v.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => return Err(invalid(&var, &v, "expected milliseconds, e.g. 10000")),
        },
    };
    Ok(Some(SignalSettings {
        endpoint,
        protocol,
        headers,
        timeout,
    }))
}

/// Parses the W3C-baggage-like lists of `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value,key2=value2`, values percent-encoded.
pub fn parse_key_values(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}` is not key=value"))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("`{item}` has an empty key"));
        }
        out.push((k.to_string(), percent_decode(v.trim())?));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-encoding in `{s}`"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` is not UTF-8 once decoded"))
}

fn resource(
    get: &impl Fn(&str) -> Option<String>,
    node_name: Option<&str>,
    host_name: &str,
) -> Result<Vec<(String, String)>, SettingsError> {
    let mut attrs: Vec<(String, String)> = match get("OTEL_RESOURCE_ATTRIBUTES") {
        Some(v) => parse_key_values(&v).map_err(|p| invalid("OTEL_RESOURCE_ATTRIBUTES", &v, p))?,
        None => Vec::new(),
    };
    let mut set = |k: &str, v: String, override_existing: bool| match attrs
        .iter_mut()
        .find(|(key, _)| key == k)
    {
        Some(slot) if override_existing => slot.1 = v,
        Some(_) => {}
        None => attrs.push((k.to_string(), v)),
    };
    // OTEL_SERVICE_NAME wins over service.name in OTEL_RESOURCE_ATTRIBUTES (specification).
    match get("OTEL_SERVICE_NAME") {
        Some(name) => set("service.name", name.trim().to_string(), true),
        None => set("service.name", "sysscope".into(), false),
    }
    set("service.version", crate::agent::VERSION.into(), false);
    if !host_name.is_empty() {
        set("host.name", host_name.to_string(), false);
    }
    let node = get("NODE_NAME").or_else(|| node_name.map(str::to_string));
    if let Some(node) = node {
        set("k8s.node.name", node.trim().to_string(), false);
    }
    Ok(attrs)
}

/// This machine's host name (what `uname -n` prints).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_vars(|k| map.get(k).cloned(), None, "node-1")
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
            t.headers,
            vec![
                ("x-a".to_string(), "1".to_string()),
                ("authorization".to_string(), "Bearer t".to_string())
            ]
        );
        assert_eq!(t.timeout, Duration::from_millis(2500));
        let m = s.metrics.unwrap();
        assert_eq!(
            (m.endpoint.as_str(), m.protocol),
            ("http://a:4318", Protocol::Grpc)
        );
        assert_eq!(m.headers, vec![("x-m".to_string(), "2".to_string())]);
    }

    #[test]
    fn grpc_scheme_less_endpoints_follow_insecure() {
        let e = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && e.contains("TLS"),
            "{e}"
        );
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
}
