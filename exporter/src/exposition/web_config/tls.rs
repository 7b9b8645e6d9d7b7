//! `tls_server_config`: the TLS server configuration (rustls with the ring provider) and the
//! certificate and key it serves, from files or inline PEM. Refused with the key named:
//! cipher suites, curves and SANs (rustls picks its own), TLS 1.0/1.1, and client-auth types
//! that accept a client certificate without verifying it.

use std::{
    borrow::Cow,
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    crypto::CryptoProvider,
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
    version::{TLS12, TLS13},
    RootCertStore, ServerConfig, SupportedProtocolVersion,
};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use serde::Deserialize;

/// `tls_server_config` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
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

/// The bytes of the files a change names, as the follower compared them (so what is parsed is
/// what was compared, never a file read again meanwhile).
pub(super) trait Compared {
    fn compared(&self, path: &Path) -> Option<&[u8]>;
}

/// Where PEM data comes from: a file (followed by [`super::WebConfigFile`]) or the config
/// itself.
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
    fn pem<'a>(&'a self, files: Option<&'a dyn Compared>) -> Result<Cow<'a, [u8]>, String> {
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
        files: Option<&dyn Compared>,
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

    fn private_key(&self, files: Option<&dyn Compared>) -> Result<PrivateKeyDer<'static>, String> {
        PrivateKeyDer::from_pem_slice(&self.pem(files)?)
            .map_err(|e| format!("{}: no usable PEM private key: {e}", self.describe()))
    }
}

fn load_certified_key(
    cert: &Source,
    key: &Source,
    provider: &CryptoProvider,
    files: Option<&dyn Compared>,
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

/// A TLS server configuration and the certificate and key it serves.
type ServedTls = (Arc<ServerConfig>, Arc<CertifiedKey>);

/// What a change while running is parsed with (`WebConfig::parse_change`).
pub(super) struct Reload<'a> {
    /// The files the change names, as compared.
    pub(super) files: &'a dyn Compared,
    /// The certificate and key in use.
    pub(super) serving: Option<Arc<CertifiedKey>>,
}

/// The TLS server configuration of a `tls_server_config` section, and the pair it serves
/// (the one in use when a change names files that do not load as a pair:
/// [`super::WebConfig`]'s `parse_change`).
pub(super) fn build_tls<E>(
    t: RawTls,
    base_dir: &Path,
    http2: bool,
    reload: Option<&Reload<'_>>,
    invalid: &dyn Fn(&str, String) -> E,
) -> Result<Option<ServedTls>, E> {
    const K: &str = "tls_server_config";
    let bad = |key: &str, problem: String| invalid(&format!("{K}.{key}"), problem);
    // `<name>_file` or inline `<name>`, at most one of them.
    let source = |name: &str, file: Option<String>, inline: Option<String>| {
        let nonempty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
        match (nonempty(file), nonempty(inline)) {
            (Some(_), Some(_)) => Err(bad(
                name,
                format!("set either {name}_file or {name}, not both"),
            )),
            (Some(f), None) => Ok(Some(Source::File(base_dir.join(f)))),
            (None, Some(pem)) => Ok(Some(Source::Inline(pem))),
            (None, None) => Ok(None),
        }
    };
    let cert = source("cert", t.cert_file, t.cert)?;
    let key = source("key", t.key_file, t.key)?;
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
        // A TLS section without a certificate serves plain HTTP, as exporter-toolkit does.
        (None, None) => {
            if client_ca.is_some() || client_auth != "NoClientCert" {
                return Err(bad(
                    "cert_file",
                    "client authentication is configured but no server certificate is".into(),
                ));
            }
            return Ok(None);
        }
        (Some(_), None) => {
            return Err(bad(
                "key_file",
                "missing: cert_file is set, so key_file (or key) is required".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(bad(
                "cert_file",
                "missing: key_file is set, so cert_file (or cert) is required".into(),
            ))
        }
        (Some(c), Some(k)) => (c, k),
    };

    let min = tls_version(
        &format!("{K}.min_version"),
        t.min_version.as_deref().unwrap_or("TLS12"),
    )
    .map_err(|p| bad("min_version", p))?;
    let max = tls_version(
        &format!("{K}.max_version"),
        t.max_version.as_deref().unwrap_or("TLS13"),
    )
    .map_err(|p| bad("max_version", p))?;
    let versions: Vec<&'static SupportedProtocolVersion> = match (min == &TLS13, max == &TLS13) {
        (true, true) => vec![&TLS13],
        (false, true) => vec![&TLS13, &TLS12],
        (false, false) => vec![&TLS12],
        (true, false) => return Err(bad("max_version", "is lower than min_version".into())),
    };

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| bad("min_version", e.to_string()))?;

    let verify = |optional: bool| -> Result<_, E> {
        let ca_bad = |problem| bad("client_ca_file", problem);
        let Some(ca) = &client_ca else {
            return Err(ca_bad(format!(
                "required when client_auth_type is {client_auth}"
            )));
        };
        let mut roots = RootCertStore::empty();
        for cert in ca.certificates(reload.map(|r| r.files)).map_err(ca_bad)? {
            roots
                .add(cert)
                .map_err(|e| ca_bad(format!("{}: {e}", ca.describe())))?;
        }
        let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        if optional {
            v = v.allow_unauthenticated();
        }
        v.build()
            .map_err(|e| ca_bad(format!("{}: {e}", ca.describe())))
    };
    let builder = match client_auth.as_str() {
        "NoClientCert" => {
            if client_ca.is_some() {
                return Err(bad(
                    "client_ca_file",
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
    let cert_key = if matches!(cert, Source::File(_)) {
        "cert_file"
    } else {
        "cert"
    };
    let served = match load_certified_key(&cert, &key, &provider, reload.map(|r| r.files)) {
        Ok(pair) => Arc::new(pair),
        // Files can be caught mid-rotation; inline PEM is part of the text, which is invalid.
        Err(problem) if matches!((&cert, &key), (Source::File(_), Source::File(_))) => {
            let Some(serving) = reload.and_then(|r| r.serving.as_ref()) else {
                return Err(bad(cert_key, problem));
            };
            tracing::warn!(
                error = %problem,
                "TLS certificate or key changed but they do not load as a pair; the previous \
                 pair stays in use until they do"
            );
            serving.clone()
        }
        Err(problem) => return Err(bad(cert_key, problem)),
    };
    let mut config = builder.with_cert_resolver(Arc::new(ServedCert(served.clone())));
    config.alpn_protocols = alpn(http2);
    Ok(Some((Arc::new(config), served)))
}

/// The protocols a TLS handshake offers: they must be what the listener serves.
pub(super) fn alpn(http2: bool) -> Vec<Vec<u8>> {
    if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::web_config::{tests::err, WebConfig};

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
}
