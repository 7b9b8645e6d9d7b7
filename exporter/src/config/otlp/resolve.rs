//! Resolving the OTLP settings: the OpenTelemetry environment variables over the `[otlp]`
//! section, per signal (endpoint, protocol, headers, TLS, compression, timeout).

use super::*;

// ---------------------------------------------------------------------------------------------
// Resolution.

/// Looks a variable up: the environment first, then the config file.
pub(super) type Lookup<'a> = dyn Fn(&str) -> Option<Found> + 'a;

/// What the resolver checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// What the settings in force use (a signal without an endpoint, or turned off, is not
    /// read): at start-up.
    InUse,
    /// Every setting that is set, as if its signal were exported: the `[otlp]` section at load,
    /// before an endpoint may come from the environment.
    EverySetting,
}

impl Settings {
    /// Reads the process environment over the config file's `[otlp]` section. `node_name` is
    /// the configured Kubernetes node name, used for `k8s.node.name` when `NODE_NAME` is not
    /// set.
    pub fn from_env(file: &OtlpConfig, node_name: Option<&str>) -> Result<Self, SettingsError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        Self::resolve(
            file,
            |k| vars.get(k).cloned(),
            node_name,
            &crate::util::pseudo_file::hostname(),
        )
    }

    /// Resolves the settings from a variable lookup (the environment; empty values count as
    /// unset) over the config file's `[otlp]` section.
    pub fn resolve(
        file: &OtlpConfig,
        env: impl Fn(&str) -> Option<String>,
        node_name: Option<&str>,
        host_name: &str,
    ) -> Result<Self, SettingsError> {
        let from_file = file.lookup()?;
        let lookup = |k: &str| -> Option<Found> {
            match env(k).filter(|v| !v.trim().is_empty()) {
                Some(value) => Some(Found {
                    setting: format!("environment variable {k}"),
                    value,
                }),
                None => from_file(k),
            }
        };
        Self::resolve_with(&lookup, node_name, host_name, Check::InUse)
    }

    pub(super) fn resolve_with(
        get: &Lookup<'_>,
        node_name: Option<&str>,
        host_name: &str,
        check: Check,
    ) -> Result<Self, SettingsError> {
        let disabled = match get("OTEL_SDK_DISABLED") {
            Some(f) => parse_bool(&f)?,
            None => false,
        };
        let traces_on = exporter_enabled(get, "OTEL_TRACES_EXPORTER", &["otlp"])?;
        let metrics_on = exporter_enabled(get, "OTEL_METRICS_EXPORTER", &["otlp", "prometheus"])?
            && get("OTEL_METRICS_EXPORTER").map(|f| f.value.trim().to_ascii_lowercase())
                != Some("prometheus".into());
        let every = check == Check::EverySetting;
        let read = |on: bool, s: Signal| -> Result<Option<SignalSettings>, SettingsError> {
            if !every && (disabled || !on) {
                return Ok(None);
            }
            Ok(signal(get, s, every)?.filter(|_| !disabled && on))
        };
        let traces = read(traces_on, TRACES)?;
        let metrics = read(metrics_on, METRICS)?;
        let ms = |name: &str, default: u64, min: u64| -> Result<Duration, SettingsError> {
            match get(name) {
                None => Ok(Duration::from_millis(default)),
                Some(f) => {
                    let n: u64 = f
                        .value
                        .trim()
                        .parse()
                        .map_err(|_| invalid(&f, "expected milliseconds, e.g. 5000"))?;
                    if n < min {
                        return Err(invalid(&f, format!("must be at least {min}")));
                    }
                    Ok(Duration::from_millis(n))
                }
            }
        };
        let schedule_delay = ms("OTEL_BSP_SCHEDULE_DELAY", 5000, 1)?;
        let metric_interval = ms("OTEL_METRIC_EXPORT_INTERVAL", 60_000, 100)?;
        let metric_export_timeout = ms("OTEL_METRIC_EXPORT_TIMEOUT", 30_000, 1)?;
        let metric_temporality = match get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") {
            None => Temporality::default(),
            Some(f) => Temporality::parse(&f.value)
                .ok_or_else(|| invalid(&f, "expected cumulative, delta or lowmemory"))?,
        };
        let metric_histograms =
            match get("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION") {
                None => HistogramAggregation::default(),
                Some(f) => HistogramAggregation::parse(&f.value).ok_or_else(|| {
                    invalid(
                        &f,
                        "expected explicit_bucket_histogram or base2_exponential_bucket_histogram",
                    )
                })?,
            };
        let max_batch = match get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") {
            None => 512,
            Some(f) => match f.value.trim().parse::<usize>() {
                Ok(n) if (1..=100_000).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        &f,
                        "out of range: expected a number of spans from 1 to 100000",
                    ));
                }
            },
        };
        Ok(Self {
            traces,
            metrics,
            resource: resource(get, node_name, host_name)?,
            schedule_delay,
            max_batch,
            metric_interval,
            metric_export_timeout,
            metric_temporality,
            metric_histograms,
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

pub(super) fn parse_bool(f: &Found) -> Result<bool, SettingsError> {
    match f.value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(f, "expected true or false")),
    }
}

pub(super) fn exporter_enabled(
    get: &Lookup<'_>,
    variable: &str,
    accepted: &[&str],
) -> Result<bool, SettingsError> {
    match get(variable) {
        None => Ok(true),
        Some(f) => {
            let v = f.value.trim().to_ascii_lowercase();
            if v == "none" {
                Ok(false)
            } else if accepted.contains(&v.as_str()) {
                Ok(true)
            } else {
                Err(invalid(
                    &f,
                    format!("sysscope supports {} or none", accepted.join(", ")),
                ))
            }
        }
    }
}

/// Reads a PEM file named by a setting and checks it holds what it must (`check`: one of
/// `config::pem`'s readers).
pub(super) fn read_pem<T>(
    f: &Found,
    check: fn(&[u8]) -> Result<T, String>,
) -> Result<PemFile, SettingsError> {
    let path = f.value.trim().to_string();
    let file_error = |problem: String| SettingsError::File {
        setting: f.setting.clone(),
        path: path.clone(),
        problem,
    };
    let pem = std::fs::read(&path).map_err(|e| file_error(format!("cannot read it: {e}")))?;
    check(&pem).map_err(file_error)?;
    Ok(PemFile { path, pem })
}

/// The settings of one signal; `None` without an endpoint. With `every`, the settings that do
/// not depend on the endpoint are checked even without one.
pub(super) fn signal(
    get: &Lookup<'_>,
    signal: Signal,
    every: bool,
) -> Result<Option<SignalSettings>, SettingsError> {
    let specific = |suffix: &str| format!("OTEL_EXPORTER_OTLP_{}_{suffix}", signal.upper);
    let pick = |suffix: &str| -> Option<Found> {
        get(&specific(suffix)).or_else(|| get(&format!("OTEL_EXPORTER_OTLP_{suffix}")))
    };
    let endpoint = match get(&specific("ENDPOINT")) {
        Some(f) => Some((f, true)),
        None => get("OTEL_EXPORTER_OTLP_ENDPOINT").map(|f| (f, false)),
    };
    if endpoint.is_none() && !every {
        return Ok(None);
    }
    let protocol = match pick("PROTOCOL") {
        None => Protocol::HttpProtobuf,
        Some(f) => Protocol::parse(&f.value)
            .ok_or_else(|| invalid(&f, "expected grpc, http/protobuf or http/json"))?,
    };
    let headers = match pick("HEADERS") {
        None => HeaderMap::new(),
        Some(f) => parse_key_values(&f.value)
            .and_then(|pairs| header_map(&pairs))
            .map_err(|p| invalid(&f, p))?,
    };
    let timeout = match pick("TIMEOUT") {
        None => DEFAULT_TIMEOUT,
        Some(f) => match f.value.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => return Err(invalid(&f, "expected milliseconds, e.g. 10000")),
        },
    };
    let gzip = match pick("COMPRESSION") {
        None => false,
        Some(f) => {
            parse_compression(&f.value).ok_or_else(|| invalid(&f, "expected gzip or none"))?
        }
    };
    let Some((found, is_specific)) = endpoint else {
        return Ok(None);
    };
    let insecure = || match pick("INSECURE") {
        Some(f) => parse_bool(&f),
        None => Ok(false),
    };
    let (mut endpoint, secure) = endpoint_url(&found, protocol, insecure)?;
    if protocol.is_http() && !is_specific {
        endpoint = format!("{}{}", endpoint.trim_end_matches('/'), signal.path);
    }
    let certificate = pick("CERTIFICATE");
    let client_certificate = pick("CLIENT_CERTIFICATE");
    let client_key = pick("CLIENT_KEY");
    let tls = if secure {
        let ca = match &certificate {
            Some(f) => Some(read_pem(f, crate::config::pem::certificates)?),
            None => None,
        };
        let client = match (&client_certificate, &client_key) {
            (Some(c), Some(k)) => Some((
                read_pem(c, crate::config::pem::certificates)?,
                read_pem(k, crate::config::pem::private_key)?,
            )),
            (Some(c), None) => {
                return Err(invalid(
                    c,
                    format!(
                        "a client certificate needs its key: set OTEL_EXPORTER_OTLP_{}CLIENT_KEY \
                         (or otlp.client_key)",
                        if c.setting.contains(signal.upper) {
                            format!("{}_", signal.upper)
                        } else {
                            String::new()
                        }
                    ),
                ))
            }
            (None, Some(k)) => return Err(invalid(
                k,
                "a client key needs its certificate: set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE \
                     (or otlp.client_certificate)",
            )),
            (None, None) => None,
        };
        Some(TlsSettings { ca, client })
    } else {
        if let Some(f) = certificate.or(client_certificate).or(client_key) {
            tracing::warn!(setting = %f.setting, endpoint = %endpoint, "certificate settings only apply to https:// endpoints; ignored");
        }
        None
    };
    Ok(Some(SignalSettings {
        endpoint,
        protocol,
        headers,
        timeout,
        tls,
        gzip,
    }))
}

/// The endpoint URL `found` names, and whether it is TLS: `http://` or `https://` with a host.
/// A gRPC endpoint may leave the scheme out: `https` unless `insecure` says otherwise.
pub(super) fn endpoint_url(
    found: &Found,
    protocol: Protocol,
    insecure: impl FnOnce() -> Result<bool, SettingsError>,
) -> Result<(String, bool), SettingsError> {
    let raw = found.value.trim();
    if raw.is_empty() {
        return Err(invalid(
            found,
            "must not be empty (leave the key out instead)",
        ));
    }
    let endpoint = if raw.contains("://") {
        raw.to_string()
    } else if protocol == Protocol::Grpc {
        format!("{}://{raw}", if insecure()? { "http" } else { "https" })
    } else {
        return Err(invalid(
            found,
            "has no scheme: write a URL such as http://otel-collector:4318 or \
             https://otel-collector:4318 (a scheme-less endpoint is only for the grpc protocol)",
        ));
    };
    // The URL standard reads `https:///x` as host `x`: an empty authority is refused as written.
    let authority = endpoint.split_once("://").map_or("", |(_, rest)| rest);
    if authority.is_empty() || authority.starts_with(['/', '?', '#']) {
        return Err(invalid(found, "the URL names no host"));
    }
    let url = url::Url::parse(&endpoint).map_err(|e| invalid(found, format!("not a URL: {e}")))?;
    let secure = match url.scheme() {
        "http" => false,
        "https" => true,
        _ => return Err(invalid(found, "the scheme must be http:// or https://")),
    };
    Ok((endpoint, secure))
}

/// `gzip` -> true, `none` (or empty) -> false, anything else is not supported.
pub(super) fn parse_compression(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "gzip" => Some(true),
        "none" | "" => Some(false),
        _ => None,
    }
}
