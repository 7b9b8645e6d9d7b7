//! `--web.config.file`: the Prometheus exporter-toolkit format (the YAML file node_exporter and
//! the other exporters read, so one file can secure every exporter on a node), read into serde
//! types and validated: unknown keys refused, every error naming its key.
//!
//! Supported keys: `tls_server_config` (`cert_file`/`key_file` or inline `cert`/`key`,
//! `client_auth_type`, `client_ca_file` or inline `client_ca`, `min_version`, `max_version`,
//! `prefer_server_cipher_suites` (ignored, as Go does)), `basic_auth_users` (bcrypt hashes) and
//! `http_server_config` (`http2`, `headers`). Refused with an error naming the key:
//! `cipher_suites`, `curve_preferences`, `client_allowed_sans` (rustls picks its own safe
//! suites and groups), TLS 1.0/1.1, and the client-auth types that would accept a client
//! certificate without verifying it. Relative paths are relative to the file's directory.
//!
//! What the file names is checked here; what it points at (certificates, keys and CAs, which
//! may change while the endpoint serves) is loaded and followed by the endpoint
//! (`exposition::web_config`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use hyper::header::{HeaderName, HeaderValue};
use rustls::{
    version::{TLS12, TLS13},
    SupportedProtocolVersion,
};
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error("cannot read web config file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("web config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("web config file {path}: key `{key}`: {problem}")]
    Invalid {
        path: String,
        key: String,
        problem: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWebConfig {
    #[serde(default)]
    tls_server_config: Option<RawTls>,
    #[serde(default)]
    http_server_config: Option<RawHttp>,
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: Option<String>,
    key_file: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    client_ca: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
    client_allowed_sans: Option<Vec<String>>,
}

/// The security headers exporter-toolkit allows in `http_server_config.headers`.
const ALLOWED_HEADERS: &[&str] = &[
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
];

/// The highest bcrypt cost accepted. Each step doubles the work: 16 already takes seconds per
/// check on a server core, and 31 (the format's maximum) days, which would hang every first
/// login (and every login of an unknown user, checked against the costliest hash).
const MAX_BCRYPT_COST: u32 = 16;

/// The file, validated.
#[derive(Debug)]
pub struct WebSettings {
    /// `None` serves plain HTTP (also a TLS section without a certificate, as exporter-toolkit).
    pub tls: Option<TlsServer>,
    /// User name -> bcrypt hash; empty: no basic auth.
    pub users: BTreeMap<String, String>,
    /// Headers added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether HTTP/2 is offered (default true).
    pub http2: bool,
}

/// `tls_server_config` with a certificate.
#[derive(Debug)]
pub struct TlsServer {
    pub cert: Pem,
    pub key: Pem,
    pub versions: Vec<&'static SupportedProtocolVersion>,
    /// The CA client certificates are verified against, and whether one is required.
    pub client_ca: Option<(Pem, bool)>,
}

/// Where PEM data comes from: a file (resolved against the web config file's directory) or
/// the config itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pem {
    File(PathBuf),
    Inline(String),
}

impl Pem {
    /// How errors name it.
    pub fn describe(&self) -> String {
        match self {
            Pem::File(p) => p.display().to_string(),
            Pem::Inline(_) => "inline PEM".into(),
        }
    }
}

/// The files web config text names (`tls_server_config`'s `cert_file`, `key_file` and
/// `client_ca_file`), resolved against `base_dir`; whatever can be found of them in text that
/// is not valid, so that a config refused because one was missing is tried again when it
/// appears.
pub(crate) fn named_files(bytes: &[u8], base_dir: &Path) -> Vec<PathBuf> {
    let Ok(value) = serde_yaml_ng::from_slice::<serde_yaml_ng::Value>(bytes) else {
        return Vec::new();
    };
    let Some(tls) = value.get("tls_server_config") else {
        return Vec::new();
    };
    ["cert_file", "key_file", "client_ca_file"]
        .iter()
        .filter_map(|key| tls.get(*key)?.as_str())
        .filter(|name| !name.trim().is_empty())
        .map(|name| base_dir.join(name))
        .collect()
}

impl WebSettings {
    /// Parses and validates web config text; `origin` names it in errors and relative paths
    /// are resolved against `base_dir`. An empty file is valid and changes nothing (as in
    /// exporter-toolkit).
    pub fn parse(text: &str, origin: &str, base_dir: &Path) -> Result<Self, WebConfigError> {
        let invalid = |key: &str, problem: String| WebConfigError::Invalid {
            path: origin.to_string(),
            key: key.to_string(),
            problem,
        };
        let raw: RawWebConfig = if text.trim().is_empty() {
            RawWebConfig::default()
        } else {
            serde_yaml_ng::from_str::<Option<RawWebConfig>>(text)
                .map_err(|e| WebConfigError::Parse {
                    path: origin.to_string(),
                    message: e.to_string(),
                })?
                .unwrap_or_default()
        };

        let http = raw.http_server_config.unwrap_or_default();
        let mut headers = Vec::new();
        for (name, value) in http.headers.unwrap_or_default() {
            let key = format!("http_server_config.headers.{name}");
            let Some(canonical) = ALLOWED_HEADERS
                .iter()
                .find(|h| h.eq_ignore_ascii_case(&name))
            else {
                let allowed = ALLOWED_HEADERS.join(", ");
                let problem = format!("not an allowed header (allowed: {allowed})");
                return Err(invalid(&key, problem));
            };
            let is = |v: &str| value.eq_ignore_ascii_case(v);
            match *canonical {
                "X-Content-Type-Options" if !is("nosniff") => {
                    return Err(invalid(&key, format!("`{value}` must be `nosniff`")))
                }
                "X-Frame-Options" if !(is("deny") || is("sameorigin")) => {
                    let problem = format!("`{value}` must be `deny` or `sameorigin`");
                    return Err(invalid(&key, problem));
                }
                _ => {}
            }
            let value = HeaderValue::from_str(&value)
                .map_err(|_| invalid(&key, "the value is not a valid header value".into()))?;
            let name = HeaderName::from_bytes(canonical.to_ascii_lowercase().as_bytes())
                .expect("allowed header names are valid");
            headers.push((name, value));
        }

        let users = raw.basic_auth_users.unwrap_or_default();
        for (user, hash) in &users {
            let key = format!("basic_auth_users.{user}");
            if user.is_empty() || user.contains(':') {
                let problem = "a user name must be non-empty and contain no `:`";
                return Err(invalid(&key, problem.into()));
            }
            let parts = hash.parse::<bcrypt::HashParts>().map_err(|_| {
                let problem = "not a bcrypt hash (expected `$2y$<cost>$...`, e.g. from \
                               `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)";
                invalid(&key, problem.into())
            })?;
            if parts.get_cost() > MAX_BCRYPT_COST {
                let problem = format!(
                    "bcrypt cost {} of user `{user}` is above {MAX_BCRYPT_COST}: each check \
                     would take minutes to days (cost 10-12 is usual)",
                    parts.get_cost()
                );
                return Err(invalid(&key, problem));
            }
        }

        let tls = match raw.tls_server_config {
            None => None,
            Some(t) => tls_server(t, base_dir, &|key, problem| {
                invalid(&format!("tls_server_config.{key}"), problem)
            })?,
        };
        Ok(Self {
            tls,
            users,
            headers,
            http2: http.http2.unwrap_or(true),
        })
    }
}

fn tls_version(key: &str, v: &str) -> Result<&'static SupportedProtocolVersion, String> {
    match v {
        "TLS13" => Ok(&TLS13),
        "TLS12" => Ok(&TLS12),
        "TLS10" | "TLS11" => Err(format!(
            "`{v}` is not supported: TLS 1.0 and 1.1 are insecure and rustls implements \
             TLS12 and TLS13 only"
        )),
        other => Err(format!(
            "`{other}` is not one of TLS12, TLS13 (the exporter-toolkit names); \
             tls_server_config.{key} takes e.g. `TLS12`"
        )),
    }
}

/// `tls_server_config`, checked; `None` without a certificate (plain HTTP).
fn tls_server(
    t: RawTls,
    base_dir: &Path,
    bad: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<Option<TlsServer>, WebConfigError> {
    // `<name>_file` or inline `<name>`, at most one of them.
    let source = |name: &str, file: Option<String>, inline: Option<String>| {
        let nonempty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
        match (nonempty(file), nonempty(inline)) {
            (Some(_), Some(_)) => Err(bad(
                name,
                format!("set either {name}_file or {name}, not both"),
            )),
            (Some(f), None) => Ok(Some(Pem::File(base_dir.join(f)))),
            (None, Some(pem)) => Ok(Some(Pem::Inline(pem))),
            (None, None) => Ok(None),
        }
    };
    let cert = source("cert", t.cert_file, t.cert)?;
    let key = source("key", t.key_file, t.key)?;
    for (key, values) in [
        ("cipher_suites", t.cipher_suites),
        ("curve_preferences", t.curve_preferences),
        ("client_allowed_sans", t.client_allowed_sans),
    ] {
        if values.is_some_and(|v| !v.is_empty()) {
            return Err(bad(
                key,
                "not supported by sysscope: rustls uses its own list of safe cipher suites \
                 and groups, and client certificates are verified against client_ca_file"
                    .into(),
            ));
        }
    }
    // Go ignores it since 1.18; so do we.
    let _ = t.prefer_server_cipher_suites;
    let client_auth = t.client_auth_type.unwrap_or_else(|| "NoClientCert".into());
    let client_ca = source("client_ca", t.client_ca_file, t.client_ca)?;
    let (cert, key) = match (cert, key) {
        (None, None) if client_ca.is_some() || client_auth != "NoClientCert" => {
            let problem = "client authentication is configured but no server certificate is";
            return Err(bad("cert_file", problem.into()));
        }
        (None, None) => return Ok(None),
        (Some(_), None) => {
            let problem = "missing: cert_file is set, so key_file (or key) is required";
            return Err(bad("key_file", problem.into()));
        }
        (None, Some(_)) => {
            let problem = "missing: key_file is set, so cert_file (or cert) is required";
            return Err(bad("cert_file", problem.into()));
        }
        (Some(c), Some(k)) => (c, k),
    };

    let version = |key: &str, v: Option<String>, default: &str| {
        tls_version(key, v.as_deref().unwrap_or(default)).map_err(|p| bad(key, p))
    };
    let min = version("min_version", t.min_version, "TLS12")?;
    let max = version("max_version", t.max_version, "TLS13")?;
    let versions: Vec<&'static SupportedProtocolVersion> = match (min == &TLS13, max == &TLS13) {
        (true, true) => vec![&TLS13],
        (false, true) => vec![&TLS13, &TLS12],
        (false, false) => vec![&TLS12],
        (true, false) => return Err(bad("max_version", "is lower than min_version".into())),
    };

    let required = match client_auth.as_str() {
        "NoClientCert" if client_ca.is_some() => {
            return Err(bad(
                "client_ca_file",
                "is set but client_auth_type is NoClientCert; set client_auth_type to \
                 RequireAndVerifyClientCert or VerifyClientCertIfGiven"
                    .into(),
            ))
        }
        "NoClientCert" => None,
        "VerifyClientCertIfGiven" => Some(false),
        "RequireAndVerifyClientCert" => Some(true),
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(bad(
                "client_auth_type",
                format!(
                    "`{client_auth}` accepts client certificates without verifying them and is \
                     not supported: use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
                ),
            ))
        }
        other => {
            return Err(bad(
                "client_auth_type",
                format!(
                    "`{other}` is not one of NoClientCert, VerifyClientCertIfGiven, \
                     RequireAndVerifyClientCert"
                ),
            ))
        }
    };
    let client_ca = match (required, client_ca) {
        (None, _) => None,
        (Some(required), Some(ca)) => Some((ca, required)),
        (Some(_), None) => {
            let problem = format!("required when client_auth_type is {client_auth}");
            return Err(bad("client_ca_file", problem));
        }
    };
    Ok(Some(TlsServer {
        cert,
        key,
        versions,
        client_ca,
    }))
}
