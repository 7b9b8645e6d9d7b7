//! `--web.config.file`: TLS and HTTP basic auth for the HTTP endpoint, in the Prometheus
//! exporter-toolkit format (the YAML file node_exporter and the other exporters read), so one
//! file can secure every exporter on a node.
//!
//! Supported keys: `tls_server_config` (`cert_file`/`key_file` or inline `cert`/`key`,
//! `client_auth_type`, `client_ca_file` or inline `client_ca`, `min_version`, `max_version`,
//! `prefer_server_cipher_suites` (ignored, as Go does)), `basic_auth_users` (bcrypt hashes) and
//! `http_server_config` (`http2`, `headers`). Refused with an error naming the key:
//! `cipher_suites`, `curve_preferences`, `client_allowed_sans` (rustls picks its own safe
//! suites and groups), TLS 1.0/1.1, and the client-auth types that would accept a client
//! certificate without verifying it. Relative paths are relative to the file's directory.
//!
//! TLS is rustls with the ring provider.
//!
//! The file itself and the files it names (certificate, key, client CA) are followed as they
//! change (compared once a second in the background; applied once two checks in a row read the
//! change alike: [`WebConfigFile`]), so a rotated certificate, users, passwords, headers and TLS
//! settings need no restart, as exporter-toolkit re-reads its file on every request. A change
//! that makes the file invalid fails closed, except a certificate and key that do not load as a
//! pair (a key written before its certificate): the previous pair stays in use, logged, until
//! the new one loads.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine;
use hyper::header::{HeaderName, HeaderValue};
use rustls::{
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
    version::{TLS12, TLS13},
    RootCertStore, ServerConfig, SupportedProtocolVersion,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

/// The security headers exporter-toolkit allows in `http_server_config.headers`.
const ALLOWED_HEADERS: &[&str] = &[
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
];

/// The validated file: what the endpoint enforces.
pub struct WebConfig {
    /// TLS server configuration; `None` serves plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    pub basic_auth: Option<Arc<BasicAuth>>,
    /// Headers added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Whether HTTP/2 is offered (default true).
    pub http2: bool,
    /// The certificate and key TLS serves (with `tls`).
    served_cert: Option<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("basic_auth", &self.basic_auth.is_some())
            .field("headers", &self.headers)
            .field("http2", &self.http2)
            .finish()
    }
}

/// Where PEM data comes from: a file (followed by [`WebConfigFile`]) or the config itself.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    File(PathBuf),
    Inline(String),
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Inline(_) => "inline PEM".into(),
        }
    }

    /// The PEM text: a file's as `files` read it when they compared it (a change while
    /// running), or as it is now.
    fn pem<'a>(&'a self, files: Option<&'a Snapshot>) -> Result<Cow<'a, [u8]>, String> {
        match self {
            Source::File(p) => match files.and_then(|f| f.compared(p)) {
                Some(bytes) => Ok(Cow::Borrowed(bytes)),
                None => std::fs::read(p)
                    .map(Cow::Owned)
                    .map_err(|e| format!("{}: {e}", p.display())),
            },
            Source::Inline(text) => Ok(Cow::Borrowed(text.as_bytes())),
        }
    }

    fn certificates(
        &self,
        files: Option<&Snapshot>,
    ) -> Result<Vec<CertificateDer<'static>>, String> {
        let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&self.pem(files)?).collect();
        let certs = certs.map_err(|e| format!("{}: {e}", self.describe()))?;
        if certs.is_empty() {
            return Err(format!(
                "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) found",
                self.describe()
            ));
        }
        Ok(certs)
    }

    fn private_key(&self, files: Option<&Snapshot>) -> Result<PrivateKeyDer<'static>, String> {
        PrivateKeyDer::from_pem_slice(&self.pem(files)?)
            .map_err(|e| format!("{}: no usable PEM private key: {e}", self.describe()))
    }
}

fn load_certified_key(
    cert: &Source,
    key: &Source,
    provider: &CryptoProvider,
    files: Option<&Snapshot>,
) -> Result<CertifiedKey, String> {
    let chain = cert.certificates(files)?;
    let key_der = key.private_key(files)?;
    CertifiedKey::from_der(chain, key_der, provider).map_err(|e| {
        format!(
            "certificate {} and key {} do not form a usable pair: {e}",
            cert.describe(),
            key.describe()
        )
    })
}

/// How often the web config file and the files it names are compared with what was last read.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Serves the one certificate a config was built with. (A rotated certificate is a change of
/// the files the config names, so it arrives as a new config: one mechanism, one set of rules.)
struct ServedCert(Arc<CertifiedKey>);

impl std::fmt::Debug for ServedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedCert").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for ServedCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Password hashes of `basic_auth_users`, checked with bcrypt.
pub struct BasicAuth {
    users: BTreeMap<String, String>,
    /// Checked for unknown users, so a wrong user costs what a wrong password costs.
    dummy_hash: String,
    /// SHA-256 of (user, password, hash) of recent successful checks, and the user: bcrypt
    /// costs tens of milliseconds by design, too much to pay on every scrape.
    cache: Mutex<HashMap<[u8; 32], String>>,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The highest bcrypt cost accepted. Each step doubles the work: 16 already takes seconds per
/// check on a server core, and 31 (the format's maximum) days, which would hang start-up
/// (the dummy hash for unknown users is computed at load) and every first login.
pub(crate) const MAX_BCRYPT_COST: u32 = 16;

/// Successful checks remembered at most (the cache is cleared when full).
const AUTH_CACHE_MAX: usize = 1024;

/// The outcome of the cheap part of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AuthPrecheck {
    /// A recently verified credential.
    Allowed,
    /// No or malformed `Authorization` header.
    Denied,
    /// Needs a bcrypt verification ([`BasicAuth::verify`]).
    Verify { user: String, password: Vec<u8> },
}

impl BasicAuth {
    fn new(users: BTreeMap<String, String>) -> Self {
        let cost = users
            .values()
            .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
            .map(|p| p.get_cost())
            .max()
            .unwrap_or(bcrypt::DEFAULT_COST);
        // Costs are capped at load, but a high one still takes seconds: say why start-up waits.
        tracing::info!(
            cost,
            "preparing basic auth: hashing a dummy password at the users' highest bcrypt cost"
        );
        let dummy_hash = bcrypt::hash("sysscope-no-such-user", cost)
            .unwrap_or_else(|_| users.values().next().cloned().unwrap_or_default());
        Self {
            users,
            dummy_hash,
            cache: Mutex::new(HashMap::new()),
        }
    }

    fn cache_key(user: &str, password: &[u8], hash: &str) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for part in [user.as_bytes(), b"\0", password, b"\0", hash.as_bytes()] {
            ctx.update(part);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// Parses an `Authorization` header and answers from the cache when it can. Cheap.
    pub(crate) fn precheck(&self, header: Option<&[u8]>) -> AuthPrecheck {
        let Some((user, password)) = header.and_then(parse_basic) else {
            return AuthPrecheck::Denied;
        };
        if let Some(hash) = self.users.get(&user) {
            let key = Self::cache_key(&user, &password, hash);
            if self.cache.lock().is_ok_and(|c| c.contains_key(&key)) {
                return AuthPrecheck::Allowed;
            }
        }
        AuthPrecheck::Verify { user, password }
    }

    /// The bcrypt check. Blocking and deliberately slow: call from a blocking thread.
    pub(crate) fn verify(&self, user: &str, password: &[u8]) -> bool {
        let (hash, known) = match self.users.get(user) {
            Some(h) => (h.as_str(), true),
            None => (self.dummy_hash.as_str(), false),
        };
        let ok = bcrypt::verify(password, hash).unwrap_or(false) && known;
        if ok {
            if let Ok(mut cache) = self.cache.lock() {
                if cache.len() >= AUTH_CACHE_MAX {
                    cache.clear();
                }
                cache.insert(Self::cache_key(user, password, hash), user.to_string());
            }
        }
        ok
    }

    /// Keeps the credentials `earlier` verified of the users whose hash is unchanged (`self`
    /// being the users after a change): a rotated password or a removed user is checked
    /// afresh, and the others do not pay a bcrypt check again after each change. (An entry
    /// binds user, password and hash, so another user's could never match; they are left out
    /// rather than kept until the cache fills.)
    fn keep_verified(&self, earlier: &BasicAuth) {
        let Ok(verified) = earlier.cache.lock() else {
            return;
        };
        if let Ok(mut cache) = self.cache.lock() {
            let kept = verified
                .iter()
                .filter(|(_, user)| {
                    let hash = self.users.get(*user);
                    hash.is_some() && hash == earlier.users.get(*user)
                })
                .take(AUTH_CACHE_MAX.saturating_sub(cache.len()));
            for (key, user) in kept {
                cache.insert(*key, user.clone());
            }
        }
    }

    /// Both steps at once (blocking).
    pub fn check(&self, header: Option<&[u8]>) -> bool {
        match self.precheck(header) {
            AuthPrecheck::Allowed => true,
            AuthPrecheck::Denied => false,
            AuthPrecheck::Verify { user, password } => self.verify(&user, &password),
        }
    }
}

/// `Basic <base64(user:password)>` -> (user, password).
pub fn parse_basic(header: &[u8]) -> Option<(String, Vec<u8>)> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, rest) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
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
            "`{other}` is not one of TLS12, TLS13 (the exporter-toolkit names); {key} takes \
             e.g. `TLS12`"
        )),
    }
}

impl WebConfig {
    /// Parses and validates web config text; `origin` names it in errors and relative paths
    /// are resolved against `base_dir`.
    pub fn parse(text: &str, origin: &str, base_dir: &Path) -> Result<Self, WebConfigError> {
        Self::parse_change(text, origin, base_dir, None)
    }

    /// [`parse`](Self::parse), or with `reload` a change while running: the files the text
    /// names are taken as the follower compared them, and a certificate and key files that do
    /// not load as a pair (caught mid-rotation, or not written yet) leave the pair in use
    /// serving, logged, while the rest of the change applies. The files are followed, so the
    /// new pair is taken once it loads.
    fn parse_change(
        text: &str,
        origin: &str,
        base_dir: &Path,
        reload: Option<&Reload<'_>>,
    ) -> Result<Self, WebConfigError> {
        let invalid = |key: &str, problem: String| WebConfigError::Invalid {
            path: origin.to_string(),
            key: key.to_string(),
            problem,
        };
        // An empty file is valid and changes nothing (as in exporter-toolkit).
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
        let http2 = http.http2.unwrap_or(true);
        let mut headers = Vec::new();
        for (name, value) in http.headers.unwrap_or_default() {
            let key = format!("http_server_config.headers.{name}");
            let Some(canonical) = ALLOWED_HEADERS
                .iter()
                .find(|h| h.eq_ignore_ascii_case(&name))
            else {
                return Err(invalid(
                    &key,
                    format!(
                        "not an allowed header (allowed: {})",
                        ALLOWED_HEADERS.join(", ")
                    ),
                ));
            };
            match *canonical {
                "X-Content-Type-Options" if !value.eq_ignore_ascii_case("nosniff") => {
                    return Err(invalid(&key, format!("`{value}` must be `nosniff`")))
                }
                "X-Frame-Options"
                    if !(value.eq_ignore_ascii_case("deny")
                        || value.eq_ignore_ascii_case("sameorigin")) =>
                {
                    return Err(invalid(
                        &key,
                        format!("`{value}` must be `deny` or `sameorigin`"),
                    ))
                }
                _ => {}
            }
            let value = HeaderValue::from_str(&value)
                .map_err(|_| invalid(&key, "the value is not a valid header value".into()))?;
            let name = HeaderName::from_bytes(canonical.to_ascii_lowercase().as_bytes())
                .expect("allowed header names are valid");
            headers.push((name, value));
        }

        let basic_auth = match raw.basic_auth_users {
            None => None,
            Some(users) if users.is_empty() => None,
            Some(users) => {
                for (user, hash) in &users {
                    let key = format!("basic_auth_users.{user}");
                    if user.is_empty() || user.contains(':') {
                        return Err(invalid(
                            &key,
                            "a user name must be non-empty and contain no `:`".into(),
                        ));
                    }
                    let parts = hash.parse::<bcrypt::HashParts>().map_err(|_| {
                        invalid(
                            &key,
                            "not a bcrypt hash (expected `$2y$<cost>$...`, e.g. from \
                             `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)"
                                .into(),
                        )
                    })?;
                    if parts.get_cost() > MAX_BCRYPT_COST {
                        return Err(invalid(
                            &key,
                            format!(
                                "bcrypt cost {} of user `{user}` is above {MAX_BCRYPT_COST}: \
                                 each check would take minutes to days (cost 10-12 is usual)",
                                parts.get_cost()
                            ),
                        ));
                    }
                }
                Some(Arc::new(BasicAuth::new(users)))
            }
        };

        let (tls, served_cert) = match raw.tls_server_config {
            None => (None, None),
            Some(t) => match build_tls(t, base_dir, http2, reload, &invalid)? {
                Some((tls, served)) => (Some(tls), Some(served)),
                None => (None, None),
            },
        };
        Ok(Self {
            tls,
            basic_auth,
            headers,
            http2,
            served_cert,
        })
    }
}

/// A TLS server configuration and the certificate and key it serves.
type ServedTls = (Arc<ServerConfig>, Arc<CertifiedKey>);

/// What a change while running is parsed with ([`WebConfig::parse_change`]).
struct Reload<'a> {
    /// The files the change names, as compared.
    files: &'a Snapshot,
    /// The certificate and key in use.
    serving: Option<Arc<CertifiedKey>>,
}

/// The TLS server configuration of a `tls_server_config` section, and the pair it serves
/// (the one in use when a change names files that do not load as a pair:
/// [`WebConfig::parse_change`]).
fn build_tls(
    t: RawTls,
    base_dir: &Path,
    http2: bool,
    reload: Option<&Reload<'_>>,
    invalid: &dyn Fn(&str, String) -> WebConfigError,
) -> Result<Option<ServedTls>, WebConfigError> {
    const K: &str = "tls_server_config";
    let nonempty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let path = |p: String| Source::File(base_dir.join(p));
    let cert = match (nonempty(t.cert_file), nonempty(t.cert)) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                &format!("{K}.cert"),
                "set either cert_file or cert, not both".into(),
            ))
        }
        (Some(f), None) => Some(path(f)),
        (None, Some(c)) => Some(Source::Inline(c)),
        (None, None) => None,
    };
    let key = match (nonempty(t.key_file), nonempty(t.key)) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                &format!("{K}.key"),
                "set either key_file or key, not both".into(),
            ))
        }
        (Some(f), None) => Some(path(f)),
        (None, Some(k)) => Some(Source::Inline(k)),
        (None, None) => None,
    };
    for (key, set) in [
        (
            "cipher_suites",
            t.cipher_suites.is_some_and(|v| !v.is_empty()),
        ),
        (
            "curve_preferences",
            t.curve_preferences.is_some_and(|v| !v.is_empty()),
        ),
        (
            "client_allowed_sans",
            t.client_allowed_sans.is_some_and(|v| !v.is_empty()),
        ),
    ] {
        if set {
            return Err(invalid(
                &format!("{K}.{key}"),
                "not supported by sysscope: rustls uses its own list of safe cipher suites \
                 and groups, and client certificates are verified against client_ca_file"
                    .into(),
            ));
        }
    }
    // Go ignores it since 1.18; so do we.
    let _ = t.prefer_server_cipher_suites;
    let client_auth = t.client_auth_type.unwrap_or_else(|| "NoClientCert".into());
    let client_ca = match (nonempty(t.client_ca_file), nonempty(t.client_ca)) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                &format!("{K}.client_ca"),
                "set either client_ca_file or client_ca, not both".into(),
            ))
        }
        (Some(f), None) => Some(path(f)),
        (None, Some(c)) => Some(Source::Inline(c)),
        (None, None) => None,
    };
    let (cert, key) = match (cert, key) {
        // A TLS section without a certificate serves plain HTTP, as exporter-toolkit does.
        (None, None) => {
            if client_ca.is_some() || client_auth != "NoClientCert" {
                return Err(invalid(
                    &format!("{K}.cert_file"),
                    "client authentication is configured but no server certificate is".into(),
                ));
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(invalid(
                &format!("{K}.key_file"),
                "missing: cert_file is set, so key_file (or key) is required".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                &format!("{K}.cert_file"),
                "missing: key_file is set, so cert_file (or cert) is required".into(),
            ))
        }
        (Some(c), Some(k)) => (c, k),
    };

    let min = tls_version(
        &format!("{K}.min_version"),
        t.min_version.as_deref().unwrap_or("TLS12"),
    )
    .map_err(|p| invalid(&format!("{K}.min_version"), p))?;
    let max = tls_version(
        &format!("{K}.max_version"),
        t.max_version.as_deref().unwrap_or("TLS13"),
    )
    .map_err(|p| invalid(&format!("{K}.max_version"), p))?;
    let versions: Vec<&'static SupportedProtocolVersion> = match (min == &TLS13, max == &TLS13) {
        (true, true) => vec![&TLS13],
        (false, true) => vec![&TLS13, &TLS12],
        (false, false) => vec![&TLS12],
        (true, false) => {
            return Err(invalid(
                &format!("{K}.max_version"),
                "is lower than min_version".into(),
            ))
        }
    };

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| invalid(&format!("{K}.min_version"), e.to_string()))?;

    let verify = |optional: bool| -> Result<_, WebConfigError> {
        let ca_key = format!("{K}.client_ca_file");
        let Some(ca) = &client_ca else {
            return Err(invalid(
                &ca_key,
                format!("required when client_auth_type is {client_auth}"),
            ));
        };
        let mut roots = RootCertStore::empty();
        for cert in ca
            .certificates(reload.map(|r| r.files))
            .map_err(|p| invalid(&ca_key, p))?
        {
            roots
                .add(cert)
                .map_err(|e| invalid(&ca_key, format!("{}: {e}", ca.describe())))?;
        }
        let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        if optional {
            v = v.allow_unauthenticated();
        }
        v.build()
            .map_err(|e| invalid(&ca_key, format!("{}: {e}", ca.describe())))
    };
    let builder = match client_auth.as_str() {
        "NoClientCert" => {
            if client_ca.is_some() {
                return Err(invalid(
                    &format!("{K}.client_ca_file"),
                    "is set but client_auth_type is NoClientCert; set client_auth_type to \
                     RequireAndVerifyClientCert or VerifyClientCertIfGiven"
                        .into(),
                ));
            }
            builder.with_no_client_auth()
        }
        "VerifyClientCertIfGiven" => builder.with_client_cert_verifier(verify(true)?),
        "RequireAndVerifyClientCert" => builder.with_client_cert_verifier(verify(false)?),
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(invalid(
                &format!("{K}.client_auth_type"),
                format!(
                    "`{client_auth}` accepts client certificates without verifying them and is \
                     not supported: use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
                ),
            ))
        }
        other => {
            return Err(invalid(
                &format!("{K}.client_auth_type"),
                format!(
                    "`{other}` is not one of NoClientCert, VerifyClientCertIfGiven, \
                     RequireAndVerifyClientCert"
                ),
            ))
        }
    };
    let cert_key = if matches!(cert, Source::File(_)) {
        format!("{K}.cert_file")
    } else {
        format!("{K}.cert")
    };
    let served = match load_certified_key(&cert, &key, &provider, reload.map(|r| r.files)) {
        Ok(pair) => Arc::new(pair),
        // Files can be caught mid-rotation; inline PEM is part of the text, which is invalid.
        Err(problem) if matches!((&cert, &key), (Source::File(_), Source::File(_))) => {
            let Some(serving) = reload.and_then(|r| r.serving.as_ref()) else {
                return Err(invalid(&cert_key, problem));
            };
            tracing::warn!(
                error = %problem,
                "TLS certificate or key changed but they do not load as a pair; the previous \
                 pair stays in use until they do"
            );
            serving.clone()
        }
        Err(problem) => return Err(invalid(&cert_key, problem)),
    };
    let mut config = builder.with_cert_resolver(Arc::new(ServedCert(served.clone())));
    config.alpn_protocols = alpn(http2);
    Ok(Some((Arc::new(config), served)))
}

/// The protocols a TLS handshake offers: they must be what the listener serves.
fn alpn(http2: bool) -> Vec<Vec<u8>> {
    if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    }
}

/// The files web config text names (`tls_server_config`'s `cert_file`, `key_file` and
/// `client_ca_file`), resolved against `base_dir`; whatever can be found of them in text that
/// is not valid. A change to one of them is a change of the config, and a config refused
/// because one was missing or unreadable is tried again when it changes.
fn named_files(bytes: &[u8], base_dir: &Path) -> Vec<PathBuf> {
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

/// The web config file as the endpoint enforces it: read at start, then followed by
/// [`WebConfigFile::follow`], which compares the file and the files it names (certificate,
/// key, client CA) with what was last read, once a second ([`RELOAD_CHECK`]), off the request
/// path. A change is applied once the files read the same at two checks in a row, and what is
/// parsed is the bytes compared, so a file caught half written (a writer that truncates, then
/// writes) is not applied unless it stays so; an empty file, which is what such a writer
/// leaves while it stalls, is refused.
///
/// A change that makes the file invalid fails closed: [`WebConfigFile::current`] is an error
/// (every request is refused) until the file is valid again, because the change may be the
/// revocation of a leaked password, which keeping the previous users would undo. What the
/// listener was started with stays: turning TLS on or off needs a restart (a file that does is
/// refused the same way: serving plain HTTP when the file asks for TLS would send credentials
/// in clear), and a change of `http2` is logged and applied at the next start. Connections
/// already open keep the TLS session they negotiated.
pub struct WebConfigFile {
    path: PathBuf,
    started_tls: bool,
    started_http2: bool,
    state: Mutex<FileState>,
}

impl std::fmt::Debug for WebConfigFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfigFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The files a config is made from (the web config file first, then the files it names) and
/// their bytes (`None`: unreadable).
#[derive(Clone, PartialEq, Eq)]
struct Snapshot {
    paths: Vec<PathBuf>,
    contents: Vec<Option<Vec<u8>>>,
}

impl Snapshot {
    fn read(paths: Vec<PathBuf>) -> Self {
        let contents = paths.iter().map(|p| std::fs::read(p).ok()).collect();
        Self { paths, contents }
    }

    /// The web config file at `path` as `bytes`, and the files those bytes name as they are
    /// now. Taken before the bytes are parsed: a named file that changes meanwhile differs at
    /// the next check and is read again, never taken for read when it was not.
    fn of(path: &Path, bytes: Option<Vec<u8>>) -> Self {
        let mut snapshot = Self::read(Self::named(path, bytes.as_deref()));
        snapshot.paths.insert(0, path.to_path_buf());
        snapshot.contents.insert(0, bytes);
        snapshot
    }

    /// This snapshot, or a new one if its web config file now names other files.
    fn renamed(self, path: &Path) -> Self {
        if Self::named(path, self.contents[0].as_deref())[..] == self.paths[1..] {
            self
        } else {
            Self::of(path, self.contents[0].clone())
        }
    }

    /// The files the web config file at `path` names when it reads `bytes`.
    fn named(path: &Path, bytes: Option<&[u8]>) -> Vec<PathBuf> {
        let base_dir = path.parent().unwrap_or(Path::new("."));
        bytes.map(|b| named_files(b, base_dir)).unwrap_or_default()
    }

    /// The bytes of `path` as this snapshot read them; `None` if it did not (or could not).
    fn compared(&self, path: &Path) -> Option<&[u8]> {
        let i = self.paths.iter().position(|p| p == path)?;
        self.contents.get(i)?.as_deref()
    }

    /// A snapshot no read of the files equals: the next two checks apply them again.
    fn forget(&mut self) {
        self.contents.clear();
    }
}

struct FileState {
    /// What the config in force (or the refusal) was made from.
    applied: Snapshot,
    /// A change seen at the last check, applied if the next check reads it again.
    pending: Option<Snapshot>,
    current: Result<Arc<WebConfig>, String>,
    /// The last valid config: new TLS connections use its certificate while the file is
    /// invalid, so that clients get the refusal as an HTTP status, not a failed handshake.
    last_valid: Arc<WebConfig>,
    /// Changes applied (valid or refused), for tests.
    changes: u64,
}

impl WebConfigFile {
    /// Reads and validates the file; an error here stops the start-up.
    pub fn load(path: &Path) -> Result<Self, WebConfigError> {
        // The bytes parsed are the bytes remembered: a change made meanwhile is seen as one.
        let bytes = std::fs::read(path).map_err(|source| WebConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let applied = Snapshot::of(path, Some(bytes.clone()));
        let config = Arc::new(Self::parse(path, &bytes, None)?);
        Ok(Self {
            path: path.to_path_buf(),
            started_tls: config.tls.is_some(),
            started_http2: config.http2,
            state: Mutex::new(FileState {
                applied,
                pending: None,
                current: Ok(config.clone()),
                last_valid: config,
                changes: 0,
            }),
        })
    }

    /// Whether the listener offers HTTP/2: as started.
    pub fn http2(&self) -> bool {
        self.started_http2
    }

    /// What a request is checked against now; the reason while the file is invalid.
    pub fn current(&self) -> Result<Arc<WebConfig>, String> {
        self.lock().current.clone()
    }

    /// The TLS configuration of a new connection (`None`: plain HTTP): the current file's, or
    /// the last valid one's while the file is invalid.
    pub fn tls(&self) -> Option<Arc<ServerConfig>> {
        let state = self.lock();
        match &state.current {
            Ok(config) => config.tls.clone(),
            Err(_) => state.last_valid.tls.clone(),
        }
    }

    /// Checks the files every [`RELOAD_CHECK`] on a thread of its own until `self` is dropped
    /// elsewhere. Reading and validating a file (bcrypt, certificates) never runs on a thread
    /// that serves requests, never waits behind them in the blocking pool, and never under
    /// the lock requests take.
    pub fn follow(self: &Arc<Self>) -> std::io::Result<()> {
        let file = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("web-config".into())
            .spawn(move || loop {
                std::thread::sleep(RELOAD_CHECK);
                let Some(file) = file.upgrade() else {
                    return;
                };
                let checked =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| file.check()));
                if checked.is_err() {
                    // Fail closed: a file nobody follows any more would keep revoked users.
                    tracing::error!("checking the web config file failed; refusing requests");
                    file.check_failed();
                }
            })
            .map(drop)
    }

    /// After a check that could not finish: requests are refused until the files are checked
    /// again from scratch (at the next two checks, even if they do not change).
    fn check_failed(&self) {
        let mut state = self.lock();
        state.current = Err("the web config file could not be checked".into());
        state.applied.forget();
    }

    /// One check: reads the files, and applies a change that two checks in a row read alike.
    pub(crate) fn check(&self) {
        let (applied, pending) = {
            let state = self.lock();
            (state.applied.clone(), state.pending.clone())
        };
        let seen = Snapshot::read(applied.paths.clone());
        if seen == applied {
            self.lock().pending = None;
            return;
        }
        if pending.as_ref() != Some(&seen) {
            // First sight of this change: it may be a file still being written.
            self.lock().pending = Some(seen);
            return;
        }
        // The exact bytes compared are parsed, so what is in force is what was compared. If
        // they name other files than before (a new certificate or CA), those are followed
        // from now on, whether the config is valid or refused (a refusal for a file not yet
        // written is tried again when it is).
        let applied = seen.renamed(&self.path);
        let loaded = match applied.contents.first().and_then(Option::as_ref) {
            None => Err(format!(
                "cannot read web config file {}",
                self.path.display()
            )),
            // Empty is valid at start (no TLS, no users), but while running it is what a
            // writer that truncates the file and stalls leaves behind: refused, not applied.
            Some(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Err(format!(
                "web config file {} is empty: refused while running (to serve without TLS and \
                 users, restart sysscope with it empty)",
                self.path.display()
            )),
            Some(bytes) => {
                let reload = Reload {
                    files: &applied,
                    serving: self.lock().last_valid.served_cert.clone(),
                };
                Self::parse(&self.path, bytes, Some(&reload))
                    .map_err(|e| e.to_string())
                    .and_then(|config| self.applicable(config))
            }
        };
        match &loaded {
            Ok(_) => tracing::info!(path = %self.path.display(), "web config file reloaded"),
            Err(reason) => tracing::error!(
                error = %reason,
                "web config file changed and cannot be applied: every request is refused \
                 (500) until it is fixed"
            ),
        }
        let mut state = self.lock();
        state.applied = applied;
        state.pending = None;
        state.changes += 1;
        match loaded {
            Ok(config) => {
                if let (Some(now), Some(before)) =
                    (&config.basic_auth, &state.last_valid.basic_auth)
                {
                    now.keep_verified(before);
                }
                let config = Arc::new(config);
                state.last_valid = config.clone();
                state.current = Ok(config);
            }
            Err(reason) => state.current = Err(reason),
        }
    }

    fn parse(
        path: &Path,
        bytes: &[u8],
        reload: Option<&Reload<'_>>,
    ) -> Result<WebConfig, WebConfigError> {
        WebConfig::parse_change(
            &String::from_utf8_lossy(bytes),
            &path.display().to_string(),
            path.parent().unwrap_or(Path::new(".")),
            reload,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FileState> {
        // Every update of the state is a few assignments made together: a panic elsewhere
        // cannot leave it half written.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `config` if the running listener can enforce it.
    fn applicable(&self, mut config: WebConfig) -> Result<WebConfig, String> {
        let path = self.path.display();
        match (self.started_tls, config.tls.is_some()) {
            (false, true) => {
                return Err(format!(
                    "web config file {path}: tls_server_config now configures TLS, but the \
                     endpoint was started serving plain HTTP: restart sysscope to serve TLS"
                ))
            }
            (true, false) => {
                return Err(format!(
                    "web config file {path}: tls_server_config no longer configures TLS, but \
                     the endpoint was started serving TLS: restart sysscope to serve plain HTTP"
                ))
            }
            _ => {}
        }
        // Users gone from a file that had them is also what a writer stalled after
        // `basic_auth_users:` leaves: serving everyone without credentials waits for a restart.
        if config.basic_auth.is_none() && self.lock().last_valid.basic_auth.is_some() {
            return Err(format!(
                "web config file {path}: basic_auth_users no longer lists any user, but the \
                 endpoint requires credentials: restart sysscope to serve without them"
            ));
        }
        if config.http2 != self.started_http2 {
            tracing::warn!(
                path = %path,
                http2 = config.http2,
                "http_server_config.http2 changed: it takes effect at the next start"
            );
            // The listener serves what it was started with, so new handshakes must offer
            // exactly that: a client that negotiated `h2` with an HTTP/1-only server fails.
            config.http2 = self.started_http2;
            if let Some(tls) = config.tls.as_mut().and_then(Arc::get_mut) {
                tls.alpn_protocols = alpn(self.started_http2);
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn err(text: &str) -> String {
        WebConfig::parse(text, "web.yml", Path::new("/nonexistent"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn empty_and_null_files_change_nothing() {
        for text in ["", "\n", "---\n", "# only a comment\n", "{}"] {
            let c = WebConfig::parse(text, "x", Path::new(".")).unwrap();
            assert!(c.tls.is_none() && c.basic_auth.is_none() && c.headers.is_empty());
            assert!(c.http2);
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = err("tls_server_config:\n  cert_fil: a.pem\n");
        assert!(e.contains("cert_fil"), "{e}");
        let e = err("basic_auth:\n  a: b\n");
        assert!(e.contains("basic_auth"), "{e}");
    }

    #[test]
    fn wrong_types_are_explained() {
        let e = err("basic_auth_users: [a, b]\n");
        assert!(e.contains("basic_auth_users"), "{e}");
        let e = err("http_server_config:\n  http2: maybe\n");
        assert!(e.contains("http2"), "{e}");
    }

    #[test]
    fn missing_halves_of_a_pair_are_named() {
        let e = err("tls_server_config:\n  cert_file: a.pem\n");
        assert!(e.contains("tls_server_config.key_file"), "{e}");
        let e = err("tls_server_config:\n  key_file: a.key\n");
        assert!(e.contains("tls_server_config.cert_file"), "{e}");
        let e = err(
            "tls_server_config:\n  cert_file: /nonexistent/a.pem\n  key_file: /nonexistent/a.key\n",
        );
        assert!(
            e.contains("tls_server_config.cert_file") && e.contains("/nonexistent/a.pem"),
            "{e}"
        );
    }

    #[test]
    fn tls_section_without_certificate_is_plain_http() {
        let c = WebConfig::parse("tls_server_config: {}\n", "x", Path::new(".")).unwrap();
        assert!(c.tls.is_none());
        let e = err("tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n");
        assert!(e.contains("no server certificate"), "{e}");
    }

    #[test]
    fn unsupported_and_unknown_values_are_named() {
        let pair = "tls_server_config:\n  cert_file: a.pem\n  key_file: a.key\n";
        let e = err(&format!("{pair}  min_version: TLS11\n"));
        assert!(e.contains("min_version") && e.contains("TLS11"), "{e}");
        let e = err(&format!("{pair}  min_version: tls1.2\n"));
        assert!(e.contains("min_version") && e.contains("tls1.2"), "{e}");
        let e = err(&format!(
            "{pair}  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"
        ));
        assert!(e.contains("cipher_suites"), "{e}");
        let e = err(&format!("{pair}  client_allowed_sans: [a]\n"));
        assert!(e.contains("client_allowed_sans"), "{e}");
    }

    #[test]
    fn headers_are_checked() {
        let c = WebConfig::parse(
            "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n",
            "x",
            Path::new("."),
        )
        .unwrap();
        assert!(!c.http2);
        assert_eq!(c.headers.len(), 2);
        let e = err("http_server_config:\n  headers:\n    X-Powered-By: me\n");
        assert!(e.contains("http_server_config.headers.X-Powered-By"), "{e}");
        let e = err("http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n");
        assert!(e.contains("nosniff"), "{e}");
    }

    /// A web config of one user, `ops`, with `password` (bcrypt cost 4, the fastest).
    pub(crate) fn ops_with(password: &str) -> String {
        let hash = bcrypt::hash(password, 4).unwrap();
        format!("basic_auth_users:\n  ops: '{hash}'\n")
    }

    #[test]
    fn a_changed_file_applies_without_restart_and_an_invalid_one_fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let users = ops_with;
        std::fs::write(&path, users("old")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        let allows = |password: &str| {
            let auth = file.current().unwrap().basic_auth.clone().unwrap();
            auth.verify("ops", password.as_bytes())
        };
        assert!(allows("old"));

        std::fs::write(&path, users("new")).unwrap();
        file.check();
        assert!(
            allows("old"),
            "a change seen once may be a file still being written"
        );
        file.check();
        assert!(allows("new"));
        assert!(
            !allows("old"),
            "a rotated password must stop working at once"
        );

        // Caught half written (truncated), then complete: the empty file is never applied.
        std::fs::write(&path, "").unwrap();
        file.check();
        std::fs::write(&path, users("newer")).unwrap();
        file.check();
        assert!(allows("new"));
        file.check();
        assert!(allows("newer"));

        // Truncated and left so (a writer that stalls): refused, not applied as "no users".
        std::fs::write(&path, "").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("empty"), "{e}");

        std::fs::write(&path, "basic_auth_users: [\n").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("web.yml"), "{e}");
        // Still refused at the next checks, and not applied again: the previous users are
        // not taken back.
        let changes = file.lock().changes;
        settle(&file);
        assert!(file.current().is_err());
        assert_eq!(file.lock().changes, changes);

        std::fs::write(&path, users("fixed")).unwrap();
        settle(&file);
        assert!(allows("fixed"));
        assert!(!allows("newer"));
    }

    /// Two checks: enough for a change to be applied.
    /// An `Authorization` header value for `user` and `password`.
    fn basic_header(user: &str, password: &str) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
    }

    fn settle(file: &WebConfigFile) {
        file.check();
        file.check();
    }

    #[test]
    fn turning_tls_on_or_off_needs_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "s");
        let tls = "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
        let path = dir.path().join("web.yml");

        std::fs::write(&path, "").unwrap();
        let plain = WebConfigFile::load(&path).unwrap();
        assert!(plain.tls().is_none());
        std::fs::write(&path, tls).unwrap();
        settle(&plain);
        let e = plain.current().unwrap_err();
        assert!(e.contains("restart"), "{e}");
        assert!(plain.tls().is_none(), "a plain listener stays plain");

        // With a client CA (the usual mutual-TLS set-up), turning TLS off is refused once,
        // not again at every check although the refused file names no CA.
        std::fs::copy(dir.path().join("s.crt"), dir.path().join("ca.crt")).unwrap();
        let mutual = format!(
            "{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        );
        std::fs::write(&path, &mutual).unwrap();
        let secured = WebConfigFile::load(&path).unwrap();
        assert!(secured.tls().is_some());
        std::fs::write(&path, "").unwrap();
        settle(&secured);
        assert!(secured.current().is_err());
        assert_eq!(secured.lock().changes, 1);
        settle(&secured);
        assert_eq!(
            secured.lock().changes,
            1,
            "a refused change was applied again"
        );
        // New connections still handshake (with the last valid certificate) to be refused
        // with a status, not a broken handshake.
        assert!(secured.tls().is_some());
        std::fs::write(&path, format!("{mutual}basic_auth_users: {{}}\n")).unwrap();
        settle(&secured);
        assert!(secured.current().is_ok());
        assert_eq!(secured.lock().changes, 2);
    }

    /// Writes a self-signed certificate for localhost and its key as `<name>.crt` and
    /// `<name>.key` in `dir`.
    fn write_cert(dir: &Path, name: &str) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }

    #[test]
    fn a_changed_http2_setting_keeps_the_protocols_the_listener_serves() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "s");
        let path = dir.path().join("web.yml");
        let tls = "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
        std::fs::write(&path, format!("{tls}http_server_config:\n  http2: false\n")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        assert_eq!(file.tls().unwrap().alpn_protocols, alpn(false));

        // http2 back to its default (true), and a header so that the change is applied.
        std::fs::write(
            &path,
            format!("{tls}http_server_config:\n  headers:\n    X-Frame-Options: deny\n"),
        )
        .unwrap();
        settle(&file);
        let config = file.current().unwrap();
        assert_eq!(config.headers.len(), 1, "the change was not applied");
        assert!(!config.http2);
        assert_eq!(
            file.tls().unwrap().alpn_protocols,
            alpn(false),
            "new handshakes would offer h2 to an HTTP/1-only listener"
        );
    }

    /// The certificate `config` serves, and the one in the file `name`.crt.
    fn serves(config: &WebConfig, dir: &Path, name: &str) -> bool {
        let served = config.served_cert.as_ref().expect("TLS configured");
        let in_file = CertificateDer::pem_file_iter(dir.join(format!("{name}.crt")))
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        served.end_entity_cert().unwrap() == &in_file
    }

    #[test]
    fn a_certificate_pair_that_does_not_load_keeps_the_previous_pair_until_it_does() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "old");
        let path = dir.path().join("web.yml");
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: old.crt\n  key_file: old.key\n",
        )
        .unwrap();
        let file = WebConfigFile::load(&path).unwrap();

        // The file names a certificate its writer has not written yet, and adds a header: the
        // header applies, the previous pair stays in use.
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: new.crt\n  key_file: new.key\n\
             http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
        )
        .unwrap();
        settle(&file);
        let config = file
            .current()
            .expect("a pair that does not load refused the change");
        assert_eq!(
            config.headers.len(),
            1,
            "the rest of the change was not applied"
        );
        assert!(serves(&config, dir.path(), "old"));

        // Written, but the key first: still no pair, still the very pair in use.
        let in_use = config.served_cert.clone().unwrap();
        let old_crt = dir.path().join("old.crt");
        write_cert(dir.path(), "new");
        let new_crt = std::fs::read(dir.path().join("new.crt")).unwrap();
        std::fs::copy(&old_crt, dir.path().join("new.crt")).unwrap();
        settle(&file);
        let config = file.current().unwrap();
        assert!(Arc::ptr_eq(config.served_cert.as_ref().unwrap(), &in_use));

        // The certificate follows: the new pair is served.
        std::fs::write(dir.path().join("new.crt"), new_crt).unwrap();
        settle(&file);
        assert!(
            serves(&file.current().unwrap(), dir.path(), "new"),
            "the new pair was not taken once it loaded"
        );
    }

    #[test]
    fn a_change_is_parsed_from_the_files_as_compared_not_as_read_again() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "a");
        write_cert(dir.path(), "b");
        let text = "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n";
        let web = dir.path().join("web.yml");
        std::fs::write(&web, text).unwrap();
        // The follower compared a.crt and a.key holding b's pair; on disk they hold a's now.
        let mut compared = Snapshot::of(&web, Some(text.as_bytes().to_vec()));
        for (i, name) in ["b.crt", "b.key"].iter().enumerate() {
            compared.contents[i + 1] = Some(std::fs::read(dir.path().join(name)).unwrap());
        }
        let reload = Reload {
            files: &compared,
            serving: None,
        };
        let config = WebConfig::parse_change(text, "web.yml", dir.path(), Some(&reload)).unwrap();
        assert!(
            serves(&config, dir.path(), "b"),
            "the files were read again"
        );
        // At start, the files as they are.
        let config = WebConfig::parse(text, "web.yml", dir.path()).unwrap();
        assert!(serves(&config, dir.path(), "a"));
    }

    #[test]
    fn a_change_refused_for_a_missing_client_ca_applies_once_the_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        write_cert(dir.path(), "s");
        let path = dir.path().join("web.yml");
        let tls = "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n";
        std::fs::write(&path, tls).unwrap();
        let file = WebConfigFile::load(&path).unwrap();

        // The file names a client CA its writer has not written yet: refused (a CA is who may
        // connect, so none is assumed), and tried again when the CA appears.
        std::fs::write(
            &path,
            format!(
                "{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
            ),
        )
        .unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("ca.crt"), "{e}");
        settle(&file);
        assert!(file.current().is_err());

        write_cert(dir.path(), "ca");
        settle(&file);
        assert!(
            file.current().is_ok(),
            "the refusal was not tried again when the named CA appeared"
        );
    }

    #[test]
    fn users_removed_while_running_are_refused_until_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, ops_with("pw")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        // What a writer that stalled after the key leaves: a valid file with no users.
        std::fs::write(&path, "basic_auth_users:\n").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("restart"), "{e}");
        std::fs::write(&path, ops_with("pw2")).unwrap();
        settle(&file);
        assert!(file.current().is_ok());
        // At start, a file without users is what the operator asked for.
        std::fs::write(&path, "basic_auth_users:\n").unwrap();
        assert!(WebConfigFile::load(&path)
            .unwrap()
            .current()
            .unwrap()
            .basic_auth
            .is_none());
    }

    #[test]
    fn verified_users_stay_verified_across_a_change_unless_their_hash_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        let hash = |password: &str| bcrypt::hash(password, 4).unwrap();
        let (ops, dev) = (hash("ops-pw"), hash("dev-pw"));
        std::fs::write(
            &path,
            format!("basic_auth_users:\n  ops: '{ops}'\n  dev: '{dev}'\n"),
        )
        .unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        let header = basic_header;
        let precheck = |user: &str, password: &str| {
            let auth = file.current().unwrap().basic_auth.clone().unwrap();
            auth.precheck(Some(header(user, password).as_bytes()))
        };
        let auth = file.current().unwrap().basic_auth.clone().unwrap();
        assert!(auth.check(Some(header("ops", "ops-pw").as_bytes())));
        assert!(auth.check(Some(header("dev", "dev-pw").as_bytes())));
        // dev's password rotates and a user joins; ops is untouched.
        let dev2 = hash("dev-pw2");
        let new = hash("new-pw");
        std::fs::write(
            &path,
            format!("basic_auth_users:\n  ops: '{ops}'\n  dev: '{dev2}'\n  new: '{new}'\n"),
        )
        .unwrap();
        settle(&file);
        assert_eq!(file.lock().changes, 1);
        assert_eq!(precheck("ops", "ops-pw"), AuthPrecheck::Allowed);
        assert!(matches!(
            precheck("dev", "dev-pw"),
            AuthPrecheck::Verify { .. }
        ));
        let auth = file.current().unwrap().basic_auth.clone().unwrap();
        // Only ops's entry came along: dev's old one could never match again.
        assert_eq!(auth.cache.lock().unwrap().len(), 1);
        assert!(!auth.check(Some(header("dev", "dev-pw").as_bytes())));
        assert!(auth.check(Some(header("dev", "dev-pw2").as_bytes())));
        // A user removed and added back with another hash is not taken as verified either.
        std::fs::write(&path, format!("basic_auth_users:\n  dev: '{dev2}'\n")).unwrap();
        settle(&file);
        std::fs::write(
            &path,
            format!(
                "basic_auth_users:\n  dev: '{dev2}'\n  ops: '{}'\n",
                hash("ops-pw")
            ),
        )
        .unwrap();
        settle(&file);
        assert_eq!(file.lock().changes, 3);
        assert!(matches!(
            precheck("ops", "ops-pw"),
            AuthPrecheck::Verify { .. }
        ));
        assert_eq!(precheck("dev", "dev-pw2"), AuthPrecheck::Allowed);
    }

    #[test]
    fn a_check_that_failed_is_made_again_although_nothing_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, ops_with("pw")).unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        // What the follower does when a check panics.
        file.check_failed();
        assert!(file.current().is_err());
        settle(&file);
        assert!(
            file.current().is_ok(),
            "refused for good after one failed check"
        );
    }

    #[test]
    fn a_changed_client_ca_file_reloads_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let self_signed = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec![name.into()])
                .unwrap()
                .self_signed(&key)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (cert, key) = self_signed("localhost");
        std::fs::write(dir.path().join("s.crt"), cert).unwrap();
        std::fs::write(dir.path().join("s.key"), key).unwrap();
        std::fs::write(dir.path().join("ca.crt"), self_signed("first CA").0).unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(
            &path,
            "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
        )
        .unwrap();
        let file = WebConfigFile::load(&path).unwrap();
        let first = file.current().unwrap();
        settle(&file);
        assert!(Arc::ptr_eq(&first, &file.current().unwrap()), "unchanged");

        std::fs::write(dir.path().join("ca.crt"), self_signed("second CA").0).unwrap();
        settle(&file);
        let second = file.current().unwrap();
        assert!(
            !Arc::ptr_eq(&first, &second),
            "a new client CA was not read"
        );

        std::fs::write(dir.path().join("ca.crt"), "not a certificate").unwrap();
        settle(&file);
        let e = file.current().unwrap_err();
        assert!(e.contains("client_ca_file"), "{e}");
    }

    #[test]
    fn basic_auth_hashes_are_validated_and_checked() {
        let e = err("basic_auth_users:\n  alice: plaintext\n");
        assert!(
            e.contains("basic_auth_users.alice") && e.contains("bcrypt"),
            "{e}"
        );
        let e = err("basic_auth_users:\n  \"a:b\": x\n");
        assert!(e.contains("basic_auth_users.a:b"), "{e}");

        // Cost 4, the minimum, keeps the test fast.
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let c = WebConfig::parse(
            &format!("basic_auth_users:\n  alice: '{hash}'\n"),
            "x",
            Path::new("."),
        )
        .unwrap();
        let auth = c.basic_auth.unwrap();
        let header = basic_header;
        assert!(auth.check(Some(header("alice", "s3cret").as_bytes())));
        // The second check of the same credentials comes from the cache.
        assert_eq!(
            auth.precheck(Some(header("alice", "s3cret").as_bytes())),
            AuthPrecheck::Allowed
        );
        assert!(!auth.check(Some(header("alice", "wrong").as_bytes())));
        assert!(!auth.check(Some(header("bob", "s3cret").as_bytes())));
        assert!(!auth.check(None));
        assert!(!auth.check(Some(b"Bearer abc")));
        assert!(!auth.check(Some(b"Basic !!!not-base64")));
        assert!(!auth.check(Some(b"Basic")));
        // A password containing ':' is fine: only the first ':' separates the user.
        let hash2 = bcrypt::hash("a:b", 4).unwrap();
        let c = WebConfig::parse(
            &format!("basic_auth_users:\n  carol: '{hash2}'\n"),
            "x",
            Path::new("."),
        )
        .unwrap();
        assert!(c
            .basic_auth
            .unwrap()
            .check(Some(header("carol", "a:b").as_bytes())));
    }

    /// The example in docs/operations.md is valid as written.
    #[test]
    fn the_documented_example_is_valid() {
        let doc = include_str!("../../../docs/operations.md");
        let start = doc.find("```yaml\n").expect("yaml example") + "```yaml\n".len();
        let yaml = &doc[start..start + doc[start..].find("```").unwrap()];
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&key).unwrap();
        let server = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.path().join("sysscope.crt"), server.cert.pem()).unwrap();
        std::fs::write(
            dir.path().join("sysscope.key"),
            server.signing_key.serialize_pem(),
        )
        .unwrap();
        std::fs::write(dir.path().join("prometheus-ca.crt"), ca.pem()).unwrap();
        let c = WebConfig::parse(yaml, "docs/operations.md", dir.path()).unwrap();
        assert!(c.tls.is_some() && c.basic_auth.is_some() && c.http2);
        assert_eq!(c.headers.len(), 2);
    }

    #[test]
    fn basic_header_parsing() {
        assert_eq!(
            parse_basic(b"basic YTpi"),
            Some(("a".to_string(), b"b".to_vec()))
        );
        assert_eq!(parse_basic(b"Basic Og=="), Some((String::new(), vec![])));
        assert_eq!(parse_basic(b"Basic YWI="), None, "no colon");
        assert_eq!(parse_basic(b"\xff\xfe"), None);
    }
}
