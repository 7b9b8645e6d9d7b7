//! TLS and the HTTP client of the OTLP exporters.
//!
//! One TLS stack for everything: rustls with the ring provider (as for `--web.config.file`).
//! gRPC (tonic) gets a `ClientTlsConfig`; HTTP (reqwest, for both the span exporter and the
//! metrics push) is configured through reqwest's own TLS options. Trust is the configured CA
//! file when one is set (`OTEL_EXPORTER_OTLP_CERTIFICATE`: it replaces the system roots, so a
//! private collector cannot be impersonated by any public CA), the system's roots otherwise; a
//! client certificate and key, when set, are presented for mutual TLS. The files were checked
//! when the settings were read (`config::pem`).

use super::ExportError;
use crate::{
    config::otlp::{SignalSettings, TlsSettings},
    util::error::Chain,
};

/// The system's root certificates, which an endpoint without a configured CA is verified
/// against: none is an error now rather than a failed handshake at every export (the problem).
fn system_roots() -> Result<Vec<reqwest::Certificate>, String> {
    let native = rustls_native_certs::load_native_certs();
    let roots: Vec<_> = (native.certs.iter())
        .filter_map(|cert| reqwest::Certificate::from_der(cert).ok())
        .collect();
    if roots.is_empty() {
        let why = native
            .errors
            .first()
            .map_or("none found".into(), |e| e.to_string());
        return Err(format!("no trusted CA: the system has no root certificates ({why}); set OTEL_EXPORTER_OTLP_CERTIFICATE or otlp.certificate"));
    }
    Ok(roots)
}

/// The tonic TLS configuration of an HTTPS gRPC endpoint.
pub(crate) fn tonic_config(tls: &TlsSettings) -> tonic::transport::ClientTlsConfig {
    let config = tonic::transport::ClientTlsConfig::new();
    let mut config = match &tls.ca {
        Some(ca) => config.ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem)),
        None => config.with_native_roots(),
    };
    if let Some((cert, key)) = &tls.client {
        config = config.identity(tonic::transport::Identity::from_pem(&cert.pem, &key.pem));
    }
    config
}

/// The HTTP client of one signal: its headers on every request, the request timeout, and TLS as
/// configured (rustls, with the process's provider): trust in the CA file or the system's roots, the client certificate and
/// key presented for mutual TLS, a key that does not match its certificate refused here. Its
/// requests run on the agent's runtime. opentelemetry-otlp's span exporter takes it as it is
/// (opentelemetry-http implements its `HttpClient` for it, reading at most 4 MiB of a
/// response, as OTLP's are small).
pub(crate) fn http_client(settings: &SignalSettings) -> Result<reqwest::Client, ExportError> {
    let problem = |problem| ExportError::Endpoint {
        endpoint: settings.endpoint.clone(),
        problem,
    };
    let failed = |e: reqwest::Error| problem(format!("HTTP client: {}", Chain(&e)));
    let mut builder = (reqwest::Client::builder())
        .default_headers(settings.headers.clone())
        .timeout(settings.timeout);
    if let Some(tls) = &settings.tls {
        let roots = match &tls.ca {
            Some(ca) => reqwest::Certificate::from_pem_bundle(&ca.pem).map_err(failed)?,
            None => system_roots().map_err(problem)?,
        };
        builder = builder.tls_certs_only(roots);
        if let Some((cert, key)) = &tls.client {
            let pem = [&cert.pem[..], b"\n", &key.pem[..]].concat();
            builder = builder.identity(reqwest::Identity::from_pem(&pem).map_err(failed)?);
        }
    }
    builder.build().map_err(failed)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::otlp::{PemFile, Protocol};

    fn pem(path: &str, text: String) -> PemFile {
        PemFile {
            path: path.into(),
            pem: text.into_bytes(),
        }
    }

    #[test]
    fn builds_with_a_ca_and_a_client_identity() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = rcgen::generate_simple_self_signed(vec!["collector.test".into()]).unwrap();
        let client = rcgen::generate_simple_self_signed(vec!["client.test".into()]).unwrap();
        let settings = |key: String| SignalSettings {
            endpoint: "https://collector.test:4318/v1/traces".into(),
            protocol: Protocol::HttpProtobuf,
            headers: Default::default(),
            timeout: Duration::from_secs(1),
            tls: Some(TlsSettings {
                ca: Some(pem("ca.pem", ca.cert.pem())),
                client: Some((pem("client.pem", client.cert.pem()), pem("client.key", key))),
            }),
            gzip: false,
        };
        assert!(http_client(&settings(client.signing_key.serialize_pem())).is_ok());
        // A key that does not match the certificate is refused now, not at the first request.
        let other = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        assert!(http_client(&settings(other.signing_key.serialize_pem())).is_err());
    }
}
