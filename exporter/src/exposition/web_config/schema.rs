//! The web config file's keys: the YAML read into serde types (unknown keys refused), the
//! `http_server_config` headers exporter-toolkit allows, the `basic_auth_users` hashes, and
//! the validated [`WebConfig`] the endpoint enforces (TLS built by [`super::tls`]).

use std::{collections::BTreeMap, path::Path, sync::Arc};

use hyper::header::{HeaderName, HeaderValue};
use rustls::{sign::CertifiedKey, ServerConfig};
use serde::Deserialize;

use super::{
    basic_auth::{BasicAuth, MAX_BCRYPT_COST},
    tls::{build_tls, RawTls, Reload},
};

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
    pub(super) served_cert: Option<Arc<CertifiedKey>>,
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
    pub(super) fn parse_change(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::web_config::tests::err;

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
}
